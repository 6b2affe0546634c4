/*
 * arbiter.c -- the tenant registry in POSIX shared memory and the reclaim
 * protocol between the processes of a group (arbiter.h says what each call
 * promises; docs/architecture.md why it is built so).
 *
 * The registry is one fixed-size struct, the same in every process (its
 * size and a version are checked on joining).  Every field but the ask
 * sequence words is read and written under the robust mutex; figures of
 * the group (held, wanted) are sums over the slots, never kept apart, so a
 * tenant that dies in the middle of an update leaves nothing to repair but
 * its own slot, which the next locker reclaims.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "arbiter.h"
#include "error.h"

#define GP_ARB_MAGIC 0x3174696272617067ull /* "gparbit1" */
#define GP_ARB_VERSION 4
#define GP_ARB_LOCK_WAIT_S 10              /* a live holder longer: an error     */
#define GP_ARB_INIT_WAIT_NS 2000000000ull  /* a creator still initialising       */
#define GP_ARB_REAP_NS 100000000ull        /* dead tenants looked for, waiting   */
#define GP_ARB_NAP_NS 50000000ull          /* longest sleep between checks       */
#define GP_ARB_RETRY_NS 100000000ull       /* retry the pool even if short       */
#define GP_ARB_BACKOFF_NS 200000000ull     /* re-ask a tenant that gave nothing  */
#define GP_ARB_BUSY_NS 1000000000ull       /* a step this much past twice the last
                                              one: its tenant went idle          */
#define GP_ARB_PAUSE_MAX_NS 5000000000ull  /* the most one step adds to a pause  */
#define MS 1000000ull

typedef struct gp_arb_slot {
    int32_t pid;                /* 0: free                                 */
    int32_t priority;
    uint64_t start_time;        /* /proc/<pid>/stat starttime, 0: unknown  */
    char name[GP_ARB_NAME_MAX];
    uint64_t quota, held, cached, offloadable, offloaded;
    uint64_t wanted, want_since; /* bytes waited for, since (0: none)      */
    int32_t want_step;          /* the wait is a step's, mid-way: ahead of
                                   every wait for a step to begin           */
    int32_t in_turn;            /* within its turn: ahead of the waits of
                                   its priority (GPUPOOL_TENANT_TURN)       */
    uint64_t lease;             /* what it may hold in its current step:
                                   lease - held is room no other tenant
                                   takes, whatever its priority (0: none)   */
    uint64_t heartbeat;
    /* Steps between yield points: the current one's start (0: none), the
     * last one's length, and the time paused for higher priorities. */
    uint64_t step_start, step_ns, pause_ns;
    /* Asks to this tenant: askers raise ask_bytes/ask_level and bump
     * ask_seq; the tenant sees ask_seq move on its hot path and answers
     * (answer_seq = the ask_seq it answered). */
    _Atomic uint32_t ask_seq;
    uint32_t answer_seq;
    int32_t ask_level, ask_from;
    uint64_t ask_bytes, ask_time, answer_bytes;
    uint64_t n_waits, n_wait_fail, wait_ns, wait_max_ns;
    uint64_t n_given, bytes_given, n_received, bytes_received, lat_max_ns;
    uint32_t n_lat, lat_us[GP_ARB_LAT]; /* ring of answer latencies        */
} gp_arb_slot;

typedef struct gp_arb_shm {
    _Atomic uint64_t magic;     /* set last by the creator                 */
    uint32_t version, size;
    pthread_mutex_t lock;       /* robust, process-shared                  */
    _Atomic uint32_t gen;       /* futex word: bumped on every change      */
    _Atomic uint32_t sleepers;  /* processes sleeping on gen               */
    int32_t owner;              /* pid holding the lock (for messages)     */
    int32_t dead;               /* unlinked: whoever maps it starts over   */
    uint64_t limit, total, n_registered, n_reaped;
    /* Tenants below a busy higher priority start no step before this: the
     * time their steps owe it (GPUPOOL_TENANT_SHARE). */
    uint64_t quiet_until;
    char group[64], device[GP_ARB_DEVICE_MAX];
    gp_arb_slot slots[GP_ARB_SLOTS];
} gp_arb_shm;

struct gp_arbiter {
    gp_arb_shm *r;
    int slot;
    char shm[160];
    uint64_t timeout_ns, turn_ns;
    double share;
    uint64_t turn_start;        /* this tenant's turn began (0: none); under the lock */
    _Atomic int turns;          /* it has yield points: asks wait for the next one,
                                   an equal priority's for the end of its turn      */
    _Atomic uint32_t deferred;  /* the ask_seq left for the next yield point        */
    _Atomic int step_due;       /* a yield point passed: the next allocation
                                   begins a step                                   */
    _Atomic uint64_t unit;      /* the largest map size seen: wants round to it */
    _Atomic uint32_t answered;  /* the ask_seq answered last                */
    pthread_mutex_t answering;  /* one thread of the process answers        */
    gp_reclaim_fn reclaim;
    void *reclaim_arg;
    _Atomic(gp_pool *) pool;
    uint64_t next_reap;
    uint64_t step_peak;         /* the most held since the last yield (under the lock) */
    unsigned fork_gen;          /* g_fork_gen when made: another one is a forked child's */
};

/* Bumped in every forked child: an arbiter made before the fork belongs to
 * the parent (its slot, its pool); in the child it answers nothing, waits
 * for nothing, and closing it frees host memory only. */
static atomic_uint g_fork_gen;

static int gp_forked(const gp_arbiter *a)
{
    return a->fork_gen != atomic_load_explicit(&g_fork_gen, memory_order_relaxed);
}

/* ------------------------------------------------------------- helpers */

static uint64_t gp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* system-wide: comparable across processes */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void gp_nap(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* "1.50 GiB" */
static const char *gp_fmt(uint64_t b, char *buf, size_t n)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", v, u[i]);
    return buf;
}

static int gp_id_ok(const char *s, int dot, size_t *len)
{
    size_t k = s ? strlen(s) : 0;
    if (k == 0 || k > 63) return 0;
    for (size_t i = 0; i < k; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              c == '-' || (dot && c == '.')))
            return 0;
    }
    *len = k;
    return 1;
}

gp_status gp_arbiter_shm_name(const char *group, const char *device, char *buf, size_t len)
{
    size_t kg, kd;
    if (!gp_id_ok(group, 1, &kg))
        return gp_error_set(GP_ERR_INVALID, "gpupool: tenant group '%.80s' is not valid: 1 to 63 "
                            "characters of A-Z, a-z, 0-9, '_', '.' and '-'", group ? group : "(null)");
    if (!gp_id_ok(device, 0, &kd))
        return gp_error_set(GP_ERR_INVALID, "gpupool: device id '%.80s' is not valid: 1 to 63 "
                            "characters of A-Z, a-z, 0-9, '_' and '-'", device ? device : "(null)");
    /* The device first: its id has no '.', so the name splits back. */
    if ((size_t)snprintf(buf, len, "/gpupool.%s.%s", device, group) >= len)
        return gp_error_set(GP_ERR_INVALID, "gpupool: registry name buffer too small");
    return GP_OK;
}

/* starttime (clock ticks after boot) and state of `pid` from
 * /proc/<pid>/stat; 0 when it cannot be read. */
static uint64_t gp_start_time(int pid, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command may hold spaces and ')' */
    if (!p || p[1] != ' ') return 0;
    p += 2;
    *state = *p;
    /* Fields after the command: state is the 3rd of the line, starttime
     * the 22nd. */
    for (int field = 3; field < 22 && *p; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* Whether the process of slot s still runs (and is the one that
 * registered: a reused pid has another start time).  A zombie counts as
 * dead: its memory is gone, only its exit status waits. */
static int gp_alive(const gp_arb_slot *s)
{
    char state = 0;
    uint64_t t = gp_start_time(s->pid, &state);
    if (t) return state != 'Z' && state != 'X' && (!s->start_time || s->start_time == t);
    return kill(s->pid, 0) == 0 || errno == EPERM;
}

/* --------------------------------------------------------- lock, waking */

static void gp_changed(gp_arb_shm *r)
{
    atomic_fetch_add_explicit(&r->gen, 1, memory_order_release);
#ifdef __linux__
    if (atomic_load_explicit(&r->sleepers, memory_order_acquire))
        syscall(SYS_futex, &r->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Sleep until gen moves from `seen` or `ns` pass. */
static void gp_sleep(gp_arb_shm *r, uint32_t seen, uint64_t ns)
{
#ifdef __linux__
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    atomic_fetch_add(&r->sleepers, 1);
    if (atomic_load(&r->gen) == seen) syscall(SYS_futex, &r->gen, FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_fetch_sub(&r->sleepers, 1);
#else
    (void)seen;
    gp_nap(ns < MS ? ns : MS);
#endif
}

static void gp_slot_clear(gp_arb_slot *s)
{
    uint32_t seq = atomic_load(&s->ask_seq);
    memset(s, 0, sizeof *s);
    /* The next owner answers from here on: an ask to the dead one is void. */
    atomic_store(&s->ask_seq, seq);
    s->answer_seq = seq;
}

/* Reclaim the slots of dead processes (their memory is free once the
 * driver has torn their context down: the adaptor's map then succeeds). */
static int gp_reap(gp_arb_shm *r)
{
    int n = 0;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        gp_arb_slot *s = &r->slots[i];
        if (s->pid && !gp_alive(s)) {
            gp_slot_clear(s);
            r->n_reaped++;
            n++;
        }
    }
    return n;
}

static gp_status gp_lock_within(gp_arb_shm *r, int seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += seconds;
    int rc = pthread_mutex_timedlock(&r->lock, &ts);
    if (rc == EOWNERDEAD) {
        /* Its holder died inside: the sums are over slots, so the dead
         * tenant's slot is all there is to repair. */
        pthread_mutex_consistent(&r->lock);
        if (gp_reap(r)) gp_changed(r);
        rc = 0;
    }
    if (rc == 0) {
        r->owner = (int32_t)getpid();
        return GP_OK;
    }
    if (rc == ETIMEDOUT) {
        int owner = r->owner, alive = owner > 0 && (kill(owner, 0) == 0 || errno == EPERM);
        return gp_error_set(GP_ERR_BACKEND, "gpupool: the tenant registry of group '%s' on %s has been "
                            "locked for %d s by process %d, %s", r->group, r->device, seconds, owner,
                            alive ? "which is alive (stopped? stuck?)"
                                  : "which is gone without releasing it: remove the registry (python -m "
                                    "gpupool top lists it) once its tenants have stopped");
    }
    return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot lock the tenant registry of group '%s': %s",
                        r->group, strerror(rc));
}

static gp_status gp_lock(gp_arb_shm *r) { return gp_lock_within(r, GP_ARB_LOCK_WAIT_S); }

static void gp_unlock(gp_arb_shm *r)
{
    r->owner = 0;
    pthread_mutex_unlock(&r->lock);
}

/* ------------------------------------------------------ joining, leaving */

static gp_status gp_map_shm(int fd, const char *name, int created, gp_arb_shm **out)
{
    struct stat st;
    uint64_t t0 = gp_now();
    if (created && ftruncate(fd, sizeof(gp_arb_shm)) != 0)
        return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot size the tenant registry %s: %s", name,
                            strerror(errno));
    /* Its creator may not have sized it yet. */
    while (fstat(fd, &st) == 0 && st.st_size == 0 && gp_now() - t0 < GP_ARB_INIT_WAIT_NS) gp_nap(MS);
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != sizeof(gp_arb_shm))
        return gp_error_set(GP_ERR_BACKEND,
                            "gpupool: the tenant registry %s has %lld bytes, not the %zu of this gpupool "
                            "(another version in the group, or a stale object: remove it when no "
                            "tenant runs, e.g. rm /dev/shm%s)", name, (long long)st.st_size,
                            sizeof(gp_arb_shm), name);
    void *m = mmap(NULL, sizeof(gp_arb_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot map the tenant registry %s: %s", name,
                            strerror(errno));
    gp_arb_shm *r = m;
    if (created) {
        pthread_mutexattr_t at;
        pthread_mutexattr_init(&at);
        pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
        int rc = pthread_mutex_init(&r->lock, &at);
        pthread_mutexattr_destroy(&at);
        if (rc != 0) {
            munmap(m, sizeof *r);
            return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot make the registry's lock: %s", strerror(rc));
        }
        r->version = GP_ARB_VERSION;
        r->size = (uint32_t)sizeof *r;
        atomic_store_explicit(&r->magic, GP_ARB_MAGIC, memory_order_release);
    }
    while (atomic_load_explicit(&r->magic, memory_order_acquire) != GP_ARB_MAGIC &&
           gp_now() - t0 < GP_ARB_INIT_WAIT_NS)
        gp_nap(MS);
    if (atomic_load_explicit(&r->magic, memory_order_acquire) != GP_ARB_MAGIC ||
        r->version != GP_ARB_VERSION || r->size != sizeof *r) {
        munmap(m, sizeof *r);
        return gp_error_set(GP_ERR_BACKEND,
                            "gpupool: %s is not a tenant registry of this gpupool version (or its "
                            "creator died making it): remove it when no tenant runs, e.g. rm /dev/shm%s",
                            name, name);
    }
    *out = r;
    return GP_OK;
}

/* Map the registry `name`, made if absent (when `create`), and lock it;
 * one that its last tenant removed meanwhile is left for a new one. */
static gp_status gp_attach(const char *name, int create, int lock_s, gp_arb_shm **out)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        int created = 0;
        int fd = create ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
        if (fd >= 0) created = 1;
        else if (create && errno != EEXIST)
            return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot create the tenant registry %s: %s", name,
                                strerror(errno));
        else if ((fd = shm_open(name, O_RDWR | O_CLOEXEC, 0)) < 0) {
            if (errno == ENOENT && create) continue; /* removed between the two opens */
            if (errno == ENOENT)
                return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s", name);
            return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot open the tenant registry %s: %s", name,
                                strerror(errno));
        }
        gp_arb_shm *r = NULL;
        gp_status st = gp_map_shm(fd, name, created, &r);
        close(fd);
        if (st != GP_OK) return st;
        if ((st = gp_lock_within(r, lock_s)) != GP_OK) {
            munmap(r, sizeof *r);
            return st;
        }
        if (!r->dead) {
            *out = r;
            return GP_OK;
        }
        gp_unlock(r);
        munmap(r, sizeof *r);
        if (!create) return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s", name);
    }
    return gp_error_set(GP_ERR_BACKEND, "gpupool: the tenant registry %s kept being removed", name);
}

/* The program's command line, as `top` names a tenant by default. */
static void gp_default_name(char *buf, size_t n)
{
    char cmd[256];
    buf[0] = '\0';
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, cmd, sizeof cmd - 1) : -1;
    if (fd >= 0) close(fd);
    if (k <= 0) return;
    cmd[k] = '\0';
    const char *base = strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd;
    size_t at = (size_t)snprintf(buf, n, "%s", base);
    for (ssize_t i = (ssize_t)strlen(cmd) + 1; i < k && at + 1 < n; i += (ssize_t)strlen(cmd + i) + 1)
        at += (size_t)snprintf(buf + at, n - at, " %s", cmd + i);
    for (char *c = buf; *c; c++)
        if ((unsigned char)*c < ' ') *c = ' '; /* one line in a table */
}

gp_status gp_arbiter_open(const gp_arbiter_params *pr, gp_arbiter **out)
{
    *out = NULL;
    char name[160];
    gp_status st = gp_arbiter_shm_name(pr->group, pr->device, name, sizeof name);
    if (st != GP_OK) return st;
    if (pr->priority < 0 || pr->priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: tenant priority %d is not in 0..%d", pr->priority,
                            GP_PRIO_MAX);
    gp_arbiter_atfork_install();
    gp_arbiter *a = calloc(1, sizeof *a);
    if (!a) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the arbiter");
    a->fork_gen = atomic_load(&g_fork_gen);
    snprintf(a->shm, sizeof a->shm, "%s", name);
    a->timeout_ns = pr->timeout_ms * MS;
    a->turn_ns = pr->turn_ms * MS;
    a->share = pr->share > 0 && pr->share <= 1 ? pr->share : 1;
    pthread_mutex_init(&a->answering, NULL);
    gp_arb_shm *r = NULL;
    if ((st = gp_attach(name, 1, GP_ARB_LOCK_WAIT_S, &r)) != GP_OK) {
        pthread_mutex_destroy(&a->answering);
        free(a);
        return st;
    }
    gp_reap(r);
    int live = 0, slot = -1;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        if (r->slots[i].pid) live++;
        else if (slot < 0) slot = i;
    }
    char b1[32], b2[32];
    if (live && pr->limit && pr->limit != r->limit)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: GPUPOOL_DEVICE_LIMIT of %s differs from the %s that "
                          "group '%s' on %s has (set by its first tenant; give the same or none)",
                          gp_fmt(pr->limit, b1, sizeof b1), r->limit ? gp_fmt(r->limit, b2, sizeof b2) : "none",
                          pr->group, pr->device);
    else if (slot < 0)
        st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: group '%s' on %s has %d tenants already, the most "
                          "a registry holds", pr->group, pr->device, GP_ARB_SLOTS);
    if (st != GP_OK) {
        gp_unlock(r);
        munmap(r, sizeof *r);
        pthread_mutex_destroy(&a->answering);
        free(a);
        return st;
    }
    if (!live) {
        r->limit = pr->limit;
        r->total = pr->total;
        snprintf(r->group, sizeof r->group, "%s", pr->group);
        snprintf(r->device, sizeof r->device, "%s", pr->device);
    }
    gp_arb_slot *s = &r->slots[slot];
    gp_slot_clear(s);
    char state;
    s->pid = (int32_t)getpid();
    s->start_time = gp_start_time(s->pid, &state);
    s->priority = pr->priority;
    s->quota = pr->quota;
    s->heartbeat = gp_now();
    if (pr->name) snprintf(s->name, sizeof s->name, "%s", pr->name);
    else gp_default_name(s->name, sizeof s->name);
    r->n_registered++;
    a->r = r;
    a->slot = slot;
    atomic_store(&a->answered, atomic_load(&s->ask_seq));
    gp_unlock(r);
    gp_changed(r);
    *out = a;
    return GP_OK;
}

void gp_arbiter_close(gp_arbiter *a)
{
    if (!a) return;
    gp_arb_shm *r = a->r;
    if (gp_forked(a)) { /* the parent's tenant: not ours to end */
        munmap(r, sizeof *r);
        free(a);
        return;
    }
    gp_arbiter_bind(a, NULL);
    if (gp_lock(r) == GP_OK) {
        gp_slot_clear(&r->slots[a->slot]);
        gp_reap(r);
        int live = 0;
        for (int i = 0; i < GP_ARB_SLOTS; i++) live += r->slots[i].pid != 0;
        if (!live) {
            /* Under the lock: whoever maps it later sees `dead` and starts
             * a new one, so no two registries of a group ever live. */
            r->dead = 1;
            shm_unlink(a->shm);
        }
        gp_unlock(r);
        gp_changed(r);
    }
    munmap(r, sizeof *r);
    pthread_mutex_destroy(&a->answering);
    free(a);
}

/* --------------------------------------------------------- accounting */

/* Whether the want of slot j comes before slot i's: a step stuck mid-way
 * first (it holds memory that others wait for; a step not begun holds
 * none), then, between equal priorities, one within its turn, then higher
 * priority, then the older want; a tenant that waits for nothing is
 * behind every want of its priority, so it cannot take what an equal
 * waits for. */
static int gp_ahead(const gp_arb_shm *r, int j, int i)
{
    const gp_arb_slot *a = &r->slots[j], *b = &r->slots[i];
    if (j == i || !a->pid || !a->wanted) return 0;
    if (a->want_step != b->want_step) return a->want_step;
    if (a->priority == b->priority && a->in_turn != b->in_turn) return a->in_turn;
    if (a->priority != b->priority) return a->priority > b->priority;
    if (!b->want_since) return 1;
    if (a->want_since != b->want_since) return a->want_since < b->want_since;
    return j < i;
}

static uint64_t gp_cap(const gp_arb_shm *r) { return r->limit ? r->limit : r->total; }

/* The room a step's lease still keeps. */
static uint64_t gp_leased(const gp_arb_slot *s) { return s->lease > s->held ? s->lease - s->held : 0; }

/* The room no lease keeps. */
static uint64_t gp_free_room(const gp_arb_shm *r)
{
    uint64_t used = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++)
        if (r->slots[j].pid) used += r->slots[j].held + gp_leased(&r->slots[j]);
    return used >= gp_cap(r) ? 0 : gp_cap(r) - used;
}

/* What slot i may map now: its own lease's room, and of the room no lease
 * keeps, what the wants ahead of it leave (*ahead: the bytes leased to
 * others or wanted ahead).  A lease is a level of held, not a count spent
 * by maps: a step that unmaps and maps again (its pool trims to fit a
 * block) keeps its room. */
static uint64_t gp_avail(const gp_arb_shm *r, int i, uint64_t *ahead, uint64_t *held_all)
{
    uint64_t held = 0, leased = 0, w = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (!s->pid) continue;
        uint64_t l = gp_leased(s);
        held += s->held;
        leased += l;
        if (gp_ahead(r, j, i)) w += s->wanted > l ? s->wanted - l : 0; /* beyond its own lease */
    }
    uint64_t mine = gp_leased(&r->slots[i]), free_b = gp_free_room(r);
    if (ahead) *ahead = leased - mine + w;
    if (held_all) *held_all = held;
    return mine + (free_b > w ? free_b - w : 0);
}

gp_status gp_arbiter_take(gp_arbiter *a, uint64_t size, gp_backend *inner)
{
    gp_arb_shm *r = a->r;
    uint64_t unit = atomic_load_explicit(&a->unit, memory_order_relaxed);
    if (size > unit) atomic_store_explicit(&a->unit, size, memory_order_relaxed);
    gp_status st = gp_lock(r);
    if (st != GP_OK) return st;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t ahead, held, avail = gp_avail(r, a->slot, &ahead, &held);
    uint64_t dev_free = UINT64_MAX, dev_total;
    /* Wants ahead must also fit the device as its driver sees it (memory
     * outside the group counts there). */
    if (ahead && size <= avail && inner->mem_info(inner, &dev_free, &dev_total) != GP_OK) dev_free = UINT64_MAX;
    if (size > avail || (dev_free != UINT64_MAX && dev_free < ahead + size)) {
        char b[4][32];
        st = gp_error_set(GP_ERR_OOM, "gpupool: tenant group '%s' on %s cannot give %s now: %s %s, %s held "
                          "by its tenants, %s leased to or wanted by tenants ahead of this one%s",
                          r->group, r->device, gp_fmt(size, b[0], sizeof b[0]),
                          r->limit ? "limit" : "device", gp_fmt(gp_cap(r), b[1], sizeof b[1]),
                          gp_fmt(held, b[2], sizeof b[2]), gp_fmt(ahead, b[3], sizeof b[3]),
                          size <= avail ? " (the device itself is short)" : "");
    } else {
        /* (Its want stays whole until its wait ends: a map of part of it
         * may yet be rolled back.) */
        me->held += size;
        if (me->held > a->step_peak) a->step_peak = me->held;
        me->heartbeat = gp_now();
    }
    gp_unlock(r);
    return st;
}

void gp_arbiter_give(gp_arbiter *a, uint64_t size)
{
    gp_arb_shm *r = a->r;
    if (gp_lock(r) != GP_OK) return; /* (the message stays for the caller) */
    gp_arb_slot *me = &r->slots[a->slot];
    me->held -= me->held < size ? me->held : size;
    me->heartbeat = gp_now();
    gp_unlock(r);
    gp_changed(r);
}

void gp_arbiter_view(gp_arbiter *a, uint64_t *limit, uint64_t *avail)
{
    gp_arb_shm *r = a->r;
    *limit = r->limit;
    *avail = 0;
    if (gp_lock(r) != GP_OK) return;
    *avail = gp_avail(r, a->slot, NULL, NULL);
    gp_unlock(r);
}

void gp_arbiter_set_reclaim(gp_arbiter *a, gp_reclaim_fn fn, void *arg)
{
    if (gp_forked(a)) return; /* (its lock may have been held at the fork) */
    pthread_mutex_lock(&a->answering);
    a->reclaim = fn;
    a->reclaim_arg = arg;
    pthread_mutex_unlock(&a->answering);
}

void gp_arbiter_bind(gp_arbiter *a, gp_pool *pool) { atomic_store(&a->pool, pool); }

void gp_arbiter_publish(gp_arbiter *a, uint64_t offloadable, uint64_t offloaded)
{
    if (gp_forked(a) || gp_lock(a->r) != GP_OK) return;
    a->r->slots[a->slot].offloadable = offloadable;
    a->r->slots[a->slot].offloaded = offloaded;
    gp_unlock(a->r);
}

/* ------------------------------------------------------------ answering */

static void gp_lat_add(gp_arb_slot *s, uint64_t ns)
{
    uint64_t us = ns / 1000;
    s->lat_us[s->n_lat % GP_ARB_LAT] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    s->n_lat++;
    if (ns > s->lat_max_ns) s->lat_max_ns = ns;
}

/* When a tenant with yield points answers: at once, at its next yield
 * point (mid-step), or at once unless the ask is an equal priority's (its
 * turn goes on). */
enum { GP_ANSWER_NOW, GP_DEFER_ALL, GP_DEFER_EQUAL };

/* The asks pending for this tenant, answered: the callback runs with no
 * lock held; one thread of the process answers at a time (the others go on).
 * With a `gift` (a yield point behind waiting tenants: what they wait for)
 * it gives that much of its cache too, asked or not, and that gift answers
 * every ask made up to its end:
 * counted once, from `since` (when the first waiter ahead began) when no ask
 * was pending.  Answering an ask made during the gift again would count a
 * second reclaim of nothing.  A tenant with yield points leaves every ask
 * to its next yield point (`defer`): its step's lease counted the cache it
 * held then, and a step that gave that cache away mid-way outgrew its lease
 * and stalled half way, holding memory, beside others that took what it
 * gave (on the H100, three LoRA jobs stalled so until killed).  An equal
 * priority's ask waits there for the end of its turn.  Not while it waits
 * itself (GP_ANSWER_NOW): two steps could each wait for the other's cache;
 * but between steps within its turn, an equal priority's ask still waits
 * (GP_DEFER_EQUAL: else the wait for its next lease gave the turn away). */
static uint64_t gp_answer(gp_arbiter *a, uint64_t gift, int defer, uint64_t since)
{
    gp_arb_shm *r = a->r;
    if (pthread_mutex_trylock(&a->answering) != 0) return 0;
    if (gp_lock(r) != GP_OK) {
        pthread_mutex_unlock(&a->answering);
        return 0;
    }
    gp_arb_slot *me = &r->slots[a->slot];
    uint32_t seq = atomic_load(&me->ask_seq);
    uint64_t bytes = me->ask_bytes, asked_at = me->ask_time;
    int level = me->ask_level;
    gp_unlock(r);
    if (defer && !gift && bytes && atomic_load(&a->turns) && (defer == GP_DEFER_ALL || level == GP_RECLAIM_CACHE)) {
        atomic_store(&a->deferred, seq);
        pthread_mutex_unlock(&a->answering);
        return 0;
    }
    gp_pool *pool = atomic_load(&a->pool);
    uint64_t given = 0;
    if (bytes && a->reclaim) given = a->reclaim(a->reclaim_arg, bytes, level);
    else if (bytes && pool) given = gp_pool_trim(pool, bytes);
    if (gift > given && pool) given += gp_pool_trim(pool, gift - given);
    uint64_t cached = 0;
    if (pool) {
        gp_stats s;
        gp_pool_stats(pool, &s, 0);
        cached = s.reserved - s.allocated;
    }
    if (gp_lock(r) == GP_OK) {
        if (gift) seq = atomic_load(&me->ask_seq);
        me->answer_seq = seq;
        me->answer_bytes = given;
        me->cached = cached;
        me->heartbeat = gp_now();
        if (bytes || given) {
            me->n_given++;
            me->bytes_given += given;
            gp_lat_add(me, me->heartbeat - (bytes ? asked_at : since));
        }
        if (atomic_load(&me->ask_seq) == seq) me->ask_bytes = 0, me->ask_time = 0, me->ask_level = 0;
        gp_unlock(r);
        gp_changed(r);
    }
    atomic_store(&a->answered, seq);
    pthread_mutex_unlock(&a->answering);
    return given;
}

static uint64_t gp_poll(gp_arbiter *a, int defer)
{
    if (!a || gp_forked(a)) return 0;
    uint32_t seq = atomic_load_explicit(&a->r->slots[a->slot].ask_seq, memory_order_relaxed);
    if (seq == atomic_load_explicit(&a->answered, memory_order_relaxed) ||
        (defer && seq == atomic_load_explicit(&a->deferred, memory_order_relaxed)))
        return 0;
    return gp_answer(a, 0, defer, 0);
}

uint64_t gp_arbiter_poll(gp_arbiter *a) { return gp_poll(a, GP_DEFER_ALL); }

/* ------------------------------------------------------------- waiting */

/* What one wait knows of each tenant it asked. */
typedef struct gp_asked {
    int32_t pid;
    int pending;
    uint32_t seq;            /* the ask_seq its ask made               */
    uint64_t bytes;          /* asked                                  */
    uint64_t not_before;     /* do not ask again before               */
} gp_asked;

/* Take in the answers to this wait's asks (under the lock). */
static void gp_collect(gp_arb_shm *r, gp_arb_slot *me, gp_asked *v, uint64_t now)
{
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        gp_arb_slot *s = &r->slots[i];
        if (!v[i].pending) continue;
        if (s->pid != v[i].pid) { v[i].pending = 0; continue; } /* gone */
        if ((int32_t)(s->answer_seq - v[i].seq) < 0) continue;
        v[i].pending = 0;
        me->n_received++;
        me->bytes_received += s->answer_bytes;
        v[i].not_before = now + (s->answer_bytes ? 0 : GP_ARB_BACKOFF_NS);
    }
}

/* Ask others for `short_b` bytes (under the lock): lower priorities give
 * cache and idle offloadable memory, the lowest first and then the largest
 * holder; equal priorities give their cache after them; higher priorities
 * are never asked.  What earlier asks of this wait still owe counts. */
static void gp_ask(gp_arb_shm *r, int me_i, gp_asked *v, uint64_t short_b, uint64_t now)
{
    const gp_arb_slot *me = &r->slots[me_i];
    int order[GP_ARB_SLOTS], n = 0;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (v[i].pending && s->pid == v[i].pid) {
            short_b -= short_b < v[i].bytes ? short_b : v[i].bytes;
            continue;
        }
        if (s->pid != v[i].pid) v[i] = (gp_asked){.pid = s->pid};
        if (i == me_i || !s->pid || !s->held || s->priority > me->priority || now < v[i].not_before) continue;
        int k = n++;
        for (; k > 0; k--) {
            const gp_arb_slot *o = &r->slots[order[k - 1]];
            if (o->priority < s->priority || (o->priority == s->priority && o->held >= s->held)) break;
            order[k] = order[k - 1];
        }
        order[k] = i;
    }
    for (int k = 0; k < n && short_b; k++) {
        gp_arb_slot *s = &r->slots[order[k]];
        uint64_t ask = short_b < s->held ? short_b : s->held;
        int level = s->priority < me->priority ? GP_RECLAIM_OFFLOAD : GP_RECLAIM_CACHE;
        if (s->ask_bytes < ask) s->ask_bytes = ask;
        if (s->ask_level < level) s->ask_level = level;
        if (!s->ask_time) s->ask_time = now;
        s->ask_from = me_i;
        uint32_t seq = atomic_fetch_add_explicit(&s->ask_seq, 1, memory_order_release) + 1;
        v[order[k]] = (gp_asked){.pid = s->pid, .pending = 1, .seq = seq, .bytes = ask};
        short_b -= ask;
    }
}

size_t gp_arbiter_report(gp_arbiter *a, char *buf, size_t len)
{
    gp_arb_shm *r = a->r;
    size_t at = 0;
    if (len) buf[0] = '\0';
    if (gp_lock(r) != GP_OK) return 0;
    char b[5][32];
    uint64_t held;
    gp_avail(r, a->slot, NULL, &held);
    at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
                           "tenant group '%s' on %s: %s %s, %s held:", r->group, r->device,
                           r->limit ? "limit" : "device", gp_fmt(gp_cap(r), b[0], sizeof b[0]),
                           gp_fmt(held, b[1], sizeof b[1]));
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (!s->pid) continue;
        at += (size_t)snprintf(buf + at, at < len ? len - at : 0,
                               "\n    pid %d%s '%s' priority %d: held %s, cached %s, offloadable %s, "
                               "wants %s", (int)s->pid, i == a->slot ? " (this one)" : "", s->name,
                               (int)s->priority, gp_fmt(s->held, b[1], sizeof b[1]),
                               gp_fmt(s->cached, b[2], sizeof b[2]), gp_fmt(s->offloadable, b[3], sizeof b[3]),
                               gp_fmt(s->wanted, b[4], sizeof b[4]));
    }
    gp_unlock(r);
    return at;
}

/* One wait for room in the group: an allocation's, or a step's lease. */
typedef struct gp_wait {
    gp_asked v[GP_ARB_SLOTS];
    uint64_t t0, deadline, want;
    uint64_t lease;          /* a lease's wait: the held level it waits for
                                (the want follows held: answers trim it)  */
    int counted;             /* a wait in the tenant's counters            */
    int defer;               /* the asks it leaves for later meanwhile     */
} gp_wait;

/* Post the want of `want` bytes, or (lease) of the room to hold `lease`:
 * queued behind every earlier one of its kind and priority.  `step`: the
 * tenant is mid-way in a step. */
static gp_status gp_wait_begin(gp_arbiter *a, gp_wait *w, uint64_t want, uint64_t lease, int step,
                               int counted)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    memset(w->v, 0, sizeof w->v);
    w->t0 = gp_now();
    w->deadline = w->t0 + a->timeout_ns;
    w->lease = lease;
    w->counted = counted;
    w->defer = GP_ANSWER_NOW;
    gp_status st = gp_lock(r);
    if (st != GP_OK) return st;
    if (lease) want = lease > me->held ? lease - me->held : 0;
    me->wanted = w->want = want;
    me->want_step = step;
    if (!me->want_since) me->want_since = w->t0;
    me->n_waits += (uint64_t)counted;
    gp_unlock(r);
    gp_changed(r);
    return GP_OK;
}

/* One look: answer the asks to this tenant, reclaim dead ones, take in the
 * answers to this wait's asks and ask for what is still short.  *short_b:
 * the bytes neither the group nor the tenant's own cache (`have`, which
 * its pool keeps when it fails from the figures) can give now; *gen: to
 * sleep on. */
static gp_status gp_wait_look(gp_arbiter *a, gp_wait *w, uint64_t have, uint64_t *short_b, uint32_t *gen)
{
    gp_arb_shm *r = a->r;
    gp_poll(a, w->defer); /* asked meanwhile */
    uint64_t now = gp_now();
    gp_status st = gp_lock(r);
    if (st != GP_OK) return st;
    if (now >= a->next_reap) {
        if (gp_reap(r)) gp_changed(r);
        a->next_reap = now + GP_ARB_REAP_NS;
    }
    *gen = atomic_load(&r->gen);
    gp_arb_slot *me = &r->slots[a->slot];
    if (w->lease) me->wanted = w->want = w->lease > me->held ? w->lease - me->held : 0;
    uint64_t avail = gp_avail(r, a->slot, NULL, NULL) + have;
    *short_b = w->want > avail ? w->want - avail : 0;
    gp_collect(r, me, w->v, now);
    if (*short_b) gp_ask(r, a->slot, w->v, *short_b, now);
    gp_unlock(r);
    if (*short_b) gp_changed(r); /* an asked tenant may sleep in its own wait */
    return GP_OK;
}

static void gp_wait_sleep(gp_arbiter *a, gp_wait *w, uint32_t gen, uint64_t until)
{
    uint64_t now = gp_now();
    if (now + GP_ARB_NAP_NS < until) until = now + GP_ARB_NAP_NS;
    if (w->deadline < until) until = w->deadline;
    if (until > now) gp_sleep(a->r, gen, until - now);
}

/* The wait is over; a lease's, if `ok`, begins the lease. */
static void gp_wait_end(gp_arbiter *a, gp_wait *w, int ok)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    uint64_t dt = gp_now() - w->t0;
    if (gp_lock(r) != GP_OK) return;
    gp_collect(r, me, w->v, w->t0 + dt);
    if (ok && w->lease) me->lease = w->lease;
    me->wanted = 0, me->want_since = 0, me->want_step = 0;
    if (w->counted) {
        me->wait_ns += dt;
        if (dt > me->wait_max_ns) me->wait_max_ns = dt;
        if (!ok) me->n_wait_fail++;
    }
    gp_unlock(r);
    gp_changed(r);
}

/* The slow path of gp_arbiter_alloc: post the want, ask, wait, retry. */
static void *gp_wait_alloc(gp_arbiter *a, gp_pool *pool, size_t size, gp_stream stream, gp_tag tag,
                           int priority, gp_status *st)
{
    uint64_t unit = atomic_load(&a->unit);
    if (!unit) unit = 2 * 1024 * 1024;
    gp_wait w;
    /* With yield points, every allocation is in a step. */
    if ((*st = gp_wait_begin(a, &w, (size + unit - 1) / unit * unit, 0, atomic_load(&a->turns), 1)) != GP_OK)
        return NULL;
    void *p = NULL;
    int was_short = 1, count_cache = 1;
    uint64_t next_try = w.t0;
    for (;;) {
        uint64_t short_b;
        uint32_t gen;
        gp_stats s;
        gp_pool_stats(pool, &s, 0);
        uint64_t have = count_cache ? s.reserved - s.allocated : 0;
        if ((*st = gp_wait_look(a, &w, have, &short_b, &gen)) != GP_OK) break;
        uint64_t now = gp_now();
        /* Retry as soon as the registry has room, else now and then (the
         * device, or this process's own frees, may have made some). */
        if (!short_b && was_short) next_try = now;
        was_short = short_b != 0;
        int last = now >= w.deadline;
        if (last || now >= next_try) {
            p = gp_alloc(pool, size, stream, tag, priority, st);
            if (p || *st != GP_ERR_OOM || last) break;
            /* Its cache was not enough (some of it is another priority's):
             * from now on ask for all of it. */
            if (!short_b) count_cache = 0;
            next_try = gp_now() + GP_ARB_RETRY_NS;
            continue;
        }
        gp_wait_sleep(a, &w, gen, next_try);
    }
    gp_wait_end(a, &w, p != NULL);
    if (!p && *st == GP_ERR_OOM) {
        char report[2048], tenants[2048];
        gp_pool_last_oom(pool, report, sizeof report);
        gp_arbiter_report(a, tenants, sizeof tenants);
        gp_error_set(GP_ERR_OOM, "%s\n  waited %.2f s for other tenants (GPUPOOL_RECLAIM_TIMEOUT); %s",
                     report, (double)(gp_now() - w.t0) / 1e9, tenants);
    }
    return p;
}

/* Whether a tenant above `me` is in a step: it allocated since its last
 * yield point (a server between requests does not) and has not come back,
 * for less than twice its last step and a second (longer: it went idle
 * without a yield point). */
static int gp_busy_above(const gp_arb_shm *r, const gp_arb_slot *me, uint64_t now)
{
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (s == me || !s->pid || s->priority <= me->priority || !s->step_start) continue;
        if (now - s->step_start < 2 * s->step_ns + GP_ARB_BUSY_NS) return 1;
    }
    return 0;
}

/* While a higher priority computes, the tenants below it compute at most
 * GPUPOOL_TENANT_SHARE of the time, together: each step they end adds
 * its length times (1/share - 1) to the group's quiet time, and none of
 * them starts a step before it is over.  Memory arbitration cannot do
 * this: the GPU time-slices between processes, so a low step running
 * beside a high one slows it whatever memory each holds.  Asks are
 * answered meanwhile as `defer` says (the lease is taken after the
 * pause); the pause ends as soon as no higher one is busy. */
static void gp_pause(gp_arbiter *a, int defer)
{
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    if (a->share >= 1 || gp_lock(r) != GP_OK) return;
    uint64_t now = gp_now(), t0 = now;
    if (gp_busy_above(r, me, now)) {
        uint64_t owe = (uint64_t)((double)me->step_ns * (1 / a->share - 1));
        r->quiet_until = (r->quiet_until > now ? r->quiet_until : now) +
                         (owe < GP_ARB_PAUSE_MAX_NS ? owe : GP_ARB_PAUSE_MAX_NS);
    }
    while (now < r->quiet_until && gp_busy_above(r, me, now)) {
        uint64_t nap = r->quiet_until - now < GP_ARB_NAP_NS ? r->quiet_until - now : GP_ARB_NAP_NS;
        uint32_t gen = atomic_load(&r->gen);
        gp_unlock(r);
        gp_poll(a, defer); /* between steps: its lease is not taken yet */
        gp_sleep(r, gen, nap);
        if (gp_lock(r) != GP_OK) return;
        now = gp_now();
    }
    me->pause_ns += now - t0;
    gp_unlock(r);
}

/* A yield point passed: the turn begins if it was over, and the step with
 * the next allocation (gp_step_mark). */
static void gp_step_due(gp_arbiter *a)
{
    if (gp_lock(a->r) != GP_OK) return;
    if (!a->turn_start) a->turn_start = gp_now();
    gp_unlock(a->r);
    atomic_store(&a->step_due, 1);
}

static void gp_step_mark(gp_arbiter *a)
{
    if (gp_forked(a) || !atomic_exchange(&a->step_due, 0) || gp_lock(a->r) != GP_OK) return;
    a->r->slots[a->slot].step_start = gp_now();
    gp_unlock(a->r);
}

uint64_t gp_arbiter_yield(gp_arbiter *a, uint64_t need)
{
    if (!a || gp_forked(a)) return 0;
    gp_arb_shm *r = a->r;
    gp_arb_slot *me = &r->slots[a->slot];
    atomic_store(&a->turns, 1);
    atomic_store(&a->step_due, 0);
    if (gp_lock(r) != GP_OK) return 0;
    /* The last step's lease ends here, and the step. */
    uint64_t now = gp_now();
    me->wanted = 0, me->want_since = 0, me->want_step = 0, me->lease = 0;
    if (me->step_start) me->step_ns = now - me->step_start;
    me->step_start = 0;
    me->heartbeat = now;
    /* Within its turn, tenants of its own priority wait on (gp_ahead). */
    me->in_turn = a->turn_start && now - a->turn_start < a->turn_ns;
    uint64_t peak = a->step_peak, since = UINT64_MAX, gift = 0;
    for (int j = 0; j < GP_ARB_SLOTS; j++) {
        const gp_arb_slot *s = &r->slots[j];
        if (!gp_ahead(r, j, a->slot)) continue;
        uint64_t t = s->want_since ? s->want_since : now, l = gp_leased(s);
        if (t < since) since = t;
        gift += s->wanted > l ? s->wanted - l : 0;
    }
    /* What they wait for and the room no lease keeps does not cover: not
     * all its cache (a step stuck mid-way may want 128 MiB). */
    uint64_t room = gp_free_room(r);
    gift = gift > room ? gift - room : 0;
    if (gift) a->turn_start = 0, me->in_turn = 0; /* it gives: its turn is over */
    int defer = me->in_turn ? GP_DEFER_EQUAL : GP_ANSWER_NOW;
    gp_unlock(r);
    gp_changed(r);
    /* Someone waits ahead of this tenant: its cache goes to them now, at
     * a point where it holds no step's memory. */
    uint64_t given = gift ? gp_answer(a, gift, GP_DEFER_ALL, since) : gp_arbiter_poll(a);
    gp_pause(a, defer);
    if (gp_lock(r) != GP_OK) return given;
    uint64_t lease = need > peak ? need : peak;
    a->step_peak = me->held;
    int enough = lease <= me->held;
    if (enough) me->lease = lease; /* its own, if its pool unmaps some mid-step */
    gp_unlock(r);
    /* Wait for the step's memory, in line, before the step takes any. */
    gp_wait w;
    if (!enough && gp_wait_begin(a, &w, 0, lease, 0, 0) == GP_OK) {
        int granted = 0;
        w.defer = defer;
        for (;;) {
            uint64_t short_b;
            uint32_t gen;
            if (gp_wait_look(a, &w, 0, &short_b, &gen) != GP_OK) break;
            if (!short_b) {
                granted = 1;
                break;
            }
            if (!w.counted && gp_lock(r) == GP_OK) { /* it does wait: a wait */
                me->n_waits++;
                w.counted = 1;
                gp_unlock(r);
            }
            if (gp_now() >= w.deadline) break;
            gp_wait_sleep(a, &w, gen, w.deadline);
        }
        gp_wait_end(a, &w, granted);
    }
    gp_step_due(a);
    return given;
}

/* Fork: the child starts a new generation (its parent's arbiters are not
 * its own). */
static void gp_arb_child(void) { atomic_fetch_add(&g_fork_gen, 1); }

static void gp_arb_atfork(void)
{
    gp_pool_atfork_install();
    pthread_atfork(NULL, NULL, gp_arb_child);
}

void gp_arbiter_atfork_install(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, gp_arb_atfork);
}

void *gp_arbiter_alloc(gp_arbiter *a, gp_pool *pool, size_t size, gp_stream stream, gp_tag tag,
                       int priority, gp_status *status)
{
    gp_status dummy;
    if (!status) status = &dummy;
    gp_arbiter_poll(a);
    if (a && atomic_load_explicit(&a->step_due, memory_order_relaxed)) gp_step_mark(a);
    void *p = gp_alloc(pool, size, stream, tag, priority, status);
    if (p || *status != GP_ERR_OOM || !a || gp_forked(a)) return p;
    return gp_wait_alloc(a, pool, size, stream, tag, priority, status);
}

/* -------------------------------------------------------------- reading */

gp_status gp_arbiter_read(const char *group, const char *device, gp_group_info *g, gp_tenant_info *t,
                          size_t max)
{
    char name[160];
    gp_status st = gp_arbiter_shm_name(group, device, name, sizeof name);
    if (st != GP_OK) return st;
    gp_arb_shm *r = NULL;
    if ((st = gp_attach(name, 0, 1, &r)) != GP_OK) return st; /* a reader does not wait long */
    if (gp_reap(r)) gp_changed(r);
    int live = 0;
    for (int i = 0; i < GP_ARB_SLOTS; i++) live += r->slots[i].pid != 0;
    if (!live) {
        /* Its tenants all died: nobody else would remove it. */
        r->dead = 1;
        shm_unlink(name);
        gp_unlock(r);
        munmap(r, sizeof *r);
        return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s (its tenants had died)", name);
    }
    uint64_t now = gp_now();
    memset(g, 0, sizeof *g);
    snprintf(g->group, sizeof g->group, "%s", r->group);
    snprintf(g->device, sizeof g->device, "%s", r->device);
    g->limit = r->limit;
    g->total = r->total;
    g->n_registered = r->n_registered;
    g->n_reaped = r->n_reaped;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (!s->pid) continue;
        if (g->n_tenants < max) {
            gp_tenant_info *o = &t[g->n_tenants];
            memset(o, 0, sizeof *o);
            o->pid = s->pid;
            o->priority = s->priority;
            o->slot = i;
            o->self = s->pid == (int32_t)getpid();
            memcpy(o->name, s->name, sizeof o->name);
            o->quota = s->quota, o->held = s->held, o->cached = s->cached;
            o->offloadable = s->offloadable, o->offloaded = s->offloaded, o->wanted = s->wanted;
            o->lease = s->lease;
            o->waiting_ns = s->want_since ? now - s->want_since : 0;
            o->seen_ns = now > s->heartbeat ? now - s->heartbeat : 0;
            o->asked = s->answer_seq != atomic_load(&s->ask_seq) ? s->ask_bytes : 0;
            o->n_waits = s->n_waits, o->n_wait_fail = s->n_wait_fail;
            o->wait_ns = s->wait_ns, o->wait_max_ns = s->wait_max_ns;
            o->pause_ns = s->pause_ns, o->step_ns = s->step_ns;
            o->n_given = s->n_given, o->bytes_given = s->bytes_given;
            o->n_received = s->n_received, o->bytes_received = s->bytes_received;
            o->lat_max_ns = s->lat_max_ns;
            o->n_lat = s->n_lat < GP_ARB_LAT ? s->n_lat : GP_ARB_LAT;
            uint32_t sorted[GP_ARB_LAT];
            for (uint32_t k = 0; k < o->n_lat; k++) {
                /* oldest first */
                o->lat_us[k] = s->lat_us[(s->n_lat - o->n_lat + k) % GP_ARB_LAT];
                uint32_t x = o->lat_us[k], j = k;
                for (; j > 0 && sorted[j - 1] > x; j--) sorted[j] = sorted[j - 1];
                sorted[j] = x;
            }
            if (o->n_lat) o->lat_median_ns = (uint64_t)sorted[o->n_lat / 2] * 1000;
        }
        g->n_tenants++;
    }
    gp_unlock(r);
    munmap(r, sizeof *r);
    return GP_OK;
}

gp_status gp_arbiter_unlink(const char *group, const char *device)
{
    char name[160];
    gp_status st = gp_arbiter_shm_name(group, device, name, sizeof name);
    if (st != GP_OK) return st;
    if (shm_unlink(name) != 0)
        return gp_error_set(errno == ENOENT ? GP_ERR_FOREIGN : GP_ERR_BACKEND,
                            "gpupool: cannot remove the tenant registry %s: %s", name, strerror(errno));
    return GP_OK;
}

/* ------------------------------------------------------------ test hooks */

gp_status gp_arbiter_debug_lock(gp_arbiter *a) { return gp_lock(a->r); }

void gp_arbiter_debug_unlock(gp_arbiter *a) { gp_unlock(a->r); }
