/*
 * arbiter.c -- the tenant registry in POSIX shared memory (arbiter.h says
 * what each call promises; docs/architecture.md why it is built so): its
 * name and layout, the robust lock and the wake-ups, joining and leaving,
 * fork.  The protocol is in arbiter_queue.c (accounting, asks, waits) and
 * arbiter_turns.c (yield points); arbiter_impl.h is what they share.
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
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "arbiter_impl.h"
#include "error.h"

atomic_uint gp_arb_fork_gen;

/* ------------------------------------------------------------- helpers */

/* "1.50 GiB" */
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
    /* Not a process: kill(-n, 0) would ask about a process group, and a
     * slot that says so is corrupt, which gp_arb_check names (a reap that
     * cleared it would hide it). */
    if (s->pid < 0) return 1;
    uint64_t t = gp_start_time(s->pid, &state);
    if (t) return state != 'Z' && state != 'X' && (!s->start_time || s->start_time == t);
    return kill(s->pid, 0) == 0 || errno == EPERM;
}

/* --------------------------------------------------------- lock, waking */

void gp_arb_changed(gp_arb_shm *r)
{
    atomic_fetch_add_explicit(&r->gen, 1, memory_order_release);
#ifdef __linux__
    if (atomic_load_explicit(&r->sleepers, memory_order_acquire))
        syscall(SYS_futex, &r->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
}

/* Sleep until gen moves from `seen` or `ns` pass. */
void gp_arb_sleep(gp_arb_shm *r, uint32_t seen, uint64_t ns)
{
#ifdef __linux__
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    atomic_fetch_add(&r->sleepers, 1);
    if (atomic_load(&r->gen) == seen) syscall(SYS_futex, &r->gen, FUTEX_WAIT, seen, &ts, NULL, 0);
    atomic_fetch_sub(&r->sleepers, 1);
#else
    (void)seen;
    gp_arb_nap(ns < MS ? ns : MS);
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
int gp_arb_reap(gp_arb_shm *r)
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

/* ------------------------------------------------------- trusting it */

/* The user a registry must belong to: this process's effective uid, or
 * the one a test set (gp_arbiter_debug_owner). */
static long gp_arb_uid_override = -1;

static unsigned long gp_arb_uid(void)
{
    return gp_arb_uid_override >= 0 ? (unsigned long)gp_arb_uid_override : (unsigned long)geteuid();
}

/* Whether the object open on `fd` is this user's alone: owned by our
 * effective uid, mode exactly 0600.  Checked on the open descriptor, after
 * opening (a check of the name before opening could be of another object
 * than the one opened).  Anyone else who can open it can read every
 * tenant's slot, hold its lock (every join waits, then fails) or write
 * figures that refuse every ask; and once ours and 0600, nobody but this
 * user (and root) can do any of that. */
static gp_status gp_owner_check(int fd, const char *name)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot look at the tenant registry %s: %s", name,
                            strerror(errno));
    if ((unsigned long)st.st_uid == gp_arb_uid() && (st.st_mode & 07777) == 0600) return GP_OK;
    return gp_error_set(GP_ERR_INVALID,
                        "gpupool: the tenant registry %s is owned by uid %lu with mode %04o; only one owned "
                        "by this user (uid %lu) with mode 0600 is accepted, since anyone else who can open "
                        "it could read its tenants or stall and starve them: remove it (rm /dev/shm%s, as "
                        "its owner or root) once no tenant of it runs, or use another GPUPOOL_TENANT group",
                        name, (unsigned long)st.st_uid, (unsigned)(st.st_mode & 07777), gp_arb_uid(), name);
}

/* The bytes a slot's figure may hold: the group's memory (its limit, else
 * the device), and never above GP_DEVICE_MAX, so that a sum over every
 * slot stays far below 2^64. */
uint64_t gp_arb_bound(const gp_arb_shm *r)
{
    uint64_t cap = gp_arb_cap(r);
    return cap && cap < GP_DEVICE_MAX ? cap : GP_DEVICE_MAX;
}

static int gp_has_nul(const char *s, size_t n) { return memchr(s, '\0', n) != NULL; }

/* Whether every figure of the registry can be: under its lock, before
 * anything sums or shows the slots.  Every locker goes through here
 * (gp_arb_lock, and joining and reading in gp_arb_attach), so a slot that
 * a bug or a stray write filled with nonsense (held = 1 TiB in a 32 MiB
 * group refused every ask; `top` summed it into millions of TiB) is an
 * error naming the slot and the field, never a sum.  Not the hot path:
 * gp_arbiter_poll takes no lock.  `name`: the object (NULL: made from the
 * registry's group and device). */
gp_status gp_arb_check(const gp_arb_shm *r, const char *name)
{
    char obj[160], why[256] = "", b[2][32];
    int bad = -1; /* the slot, or GP_ARB_SLOTS for the group's own fields */
    uint64_t bound = gp_arb_bound(r);
    if (!gp_has_nul(r->group, sizeof r->group) || !gp_has_nul(r->device, sizeof r->device)) {
        bad = GP_ARB_SLOTS;
        snprintf(why, sizeof why, "its group or device name has no end");
    } else if (r->n_reaped > r->n_registered) {
        bad = GP_ARB_SLOTS;
        snprintf(why, sizeof why, "it reaped %llu tenants of %llu ever registered",
                 (unsigned long long)r->n_reaped, (unsigned long long)r->n_registered);
    }
    uint64_t live = 0;
    for (int i = 0; i < GP_ARB_SLOTS && bad < 0; i++) {
        const gp_arb_slot *s = &r->slots[i];
        if (!s->pid) continue;
        live++;
        /* One line a figure: its value, and whether it can be. */
        struct {
            const char *field;
            uint64_t v, max;
        } f[] = {
            {"held", s->held, bound},        {"cached", s->cached, bound},
            {"offloadable", s->offloadable, bound}, {"lease", s->lease, bound},
            {"wanted", s->wanted, bound},    {"ask_bytes", s->ask_bytes, bound},
            {"offloaded", s->offloaded, GP_DEVICE_MAX},
        };
        if (s->pid < 0)
            snprintf(why, sizeof why, "pid = %d (a used slot's pid is above 0)", (int)s->pid);
        else if (s->priority < 0 || s->priority > GP_PRIO_MAX)
            snprintf(why, sizeof why, "priority = %d (accepted: 0..%d)", (int)s->priority, GP_PRIO_MAX);
        else if ((uint32_t)s->want_step > 1 || (uint32_t)s->in_turn > 1 || (uint32_t)s->can_swap > 1 ||
                 (uint32_t)s->ask_level > GP_RECLAIM_SWAP)
            snprintf(why, sizeof why, "want_step = %d, in_turn = %d, can_swap = %d (each 0 or 1), ask_level = %d "
                     "(0..%d)", (int)s->want_step, (int)s->in_turn, (int)s->can_swap, (int)s->ask_level,
                     GP_RECLAIM_SWAP);
        else if (s->n_wait_fail > s->n_waits)
            snprintf(why, sizeof why, "%llu failed waits of %llu waits", (unsigned long long)s->n_wait_fail,
                     (unsigned long long)s->n_waits);
        else if (!gp_has_nul(s->name, sizeof s->name))
            snprintf(why, sizeof why, "a name with no end");
        for (size_t k = 0; !why[0] && k < sizeof f / sizeof f[0]; k++)
            if (f[k].v > f[k].max)
                snprintf(why, sizeof why, "%s = %llu bytes (%s), above the %s of %s", f[k].field,
                         (unsigned long long)f[k].v, gp_fmt_bytes(f[k].v, b[0], sizeof b[0]),
                         f[k].max == bound && bound == gp_arb_cap(r) ? (r->limit ? "group's limit" : "device's memory")
                                                                     : "most a device has",
                         gp_fmt_bytes(f[k].max, b[1], sizeof b[1]));
        if (why[0]) bad = i;
    }
    if (bad < 0 && live > r->n_registered) {
        bad = GP_ARB_SLOTS;
        snprintf(why, sizeof why, "%llu tenants live of %llu ever registered", (unsigned long long)live,
                 (unsigned long long)r->n_registered);
    }
    if (bad < 0) return GP_OK;
    if (!name) {
        if (gp_has_nul(r->group, sizeof r->group) && gp_has_nul(r->device, sizeof r->device))
            snprintf(obj, sizeof obj, "/gpupool.%s.%s", r->device, r->group);
        else snprintf(obj, sizeof obj, "(its names are unreadable: see ls /dev/shm/gpupool.*)");
        name = obj;
    }
    char where[64];
    if (bad == GP_ARB_SLOTS) snprintf(where, sizeof where, "the group's figures");
    else snprintf(where, sizeof where, "slot %d (pid %d)", bad, (int)r->slots[bad].pid);
    return gp_error_set(GP_ERR_BACKEND,
                        "gpupool: the tenant registry %s is corrupt: %s: %s; no tenant joins it, allocates "
                        "through it or reads it while it is: stop the group's tenants and remove it "
                        "(rm /dev/shm%s)", name, where, why, name);
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
        if (gp_arb_reap(r)) gp_arb_changed(r);
        rc = 0;
    }
    if (rc == 0) {
        r->owner = (int32_t)getpid();
        return GP_OK;
    }
    if (rc == ETIMEDOUT) {
        int owner = r->owner, alive = owner > 0 && (kill(owner, 0) == 0 || errno == EPERM);
        return gp_error_set(GP_ERR_BACKEND, "gpupool: the tenant registry of group '%.63s' on %.63s has been "
                            "locked for %d s by process %d, %s", r->group, r->device, seconds, owner,
                            alive ? "which is alive (stopped? stuck?)"
                                  : "which is gone without releasing it: remove the registry (python -m "
                                    "gpupool top lists it) once its tenants have stopped");
    }
    return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot lock the tenant registry of group '%.63s': %s",
                        r->group, strerror(rc));
}

gp_status gp_arb_lock(gp_arb_shm *r)
{
    gp_status st = gp_lock_within(r, GP_ARB_LOCK_WAIT_S);
    if (st == GP_OK && (st = gp_arb_check(r, NULL)) != GP_OK) gp_arb_unlock(r);
    return st;
}

void gp_arb_unlock(gp_arb_shm *r)
{
    r->owner = 0;
    pthread_mutex_unlock(&r->lock);
}

/* ------------------------------------------------------ joining, leaving */

static gp_status gp_map_shm(int fd, const char *name, int created, gp_arb_shm **out)
{
    struct stat st;
    uint64_t t0 = gp_now_ns();
    if (created && ftruncate(fd, sizeof(gp_arb_shm)) != 0)
        return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot size the tenant registry %s: %s", name,
                            strerror(errno));
    /* Its creator may not have sized it yet. */
    while (fstat(fd, &st) == 0 && st.st_size == 0 && gp_now_ns() - t0 < GP_ARB_INIT_WAIT_NS) gp_arb_nap(MS);
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
           gp_now_ns() - t0 < GP_ARB_INIT_WAIT_NS)
        gp_arb_nap(MS);
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
gp_status gp_arb_attach(const char *name, int create, int lock_s, gp_arb_shm **out)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        int created = 0;
        int fd = create ? shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
        if (fd >= 0) {
            created = 1;
            /* 0600 whatever the umask: a joiner accepts nothing else. */
            if (fchmod(fd, 0600) != 0) {
                gp_status st = gp_error_set(GP_ERR_BACKEND, "gpupool: cannot set the mode of the tenant "
                                            "registry %s to 0600: %s", name, strerror(errno));
                close(fd);
                shm_unlink(name);
                return st;
            }
        } else if (create && errno != EEXIST)
            return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot create the tenant registry %s: %s", name,
                                strerror(errno));
        else if ((fd = shm_open(name, O_RDWR | O_CLOEXEC, 0)) < 0) {
            if (errno == ENOENT && create) continue; /* removed between the two opens */
            if (errno == ENOENT)
                return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s", name);
            if (errno == EACCES)
                return gp_error_set(GP_ERR_INVALID, "gpupool: the tenant registry %s is not this user's "
                                    "(uid %lu): only one owned by this user with mode 0600 is accepted; "
                                    "use another GPUPOOL_TENANT group, or have its owner remove it "
                                    "(rm /dev/shm%s) once no tenant of it runs", name, gp_arb_uid(), name);
            return gp_error_set(GP_ERR_BACKEND, "gpupool: cannot open the tenant registry %s: %s", name,
                                strerror(errno));
        }
        gp_arb_shm *r = NULL;
        gp_status st = gp_owner_check(fd, name);
        if (st == GP_OK) st = gp_map_shm(fd, name, created, &r);
        close(fd);
        if (st != GP_OK) return st;
        if ((st = gp_lock_within(r, lock_s)) != GP_OK) {
            munmap(r, sizeof *r);
            return st;
        }
        if (!r->dead) {
            if ((st = gp_arb_check(r, name)) != GP_OK) {
                gp_arb_unlock(r);
                munmap(r, sizeof *r);
                return st;
            }
            *out = r;
            return GP_OK;
        }
        gp_arb_unlock(r);
        munmap(r, sizeof *r);
        if (!create) return gp_error_set(GP_ERR_FOREIGN, "gpupool: no tenant registry %s", name);
    }
    return gp_error_set(GP_ERR_BACKEND, "gpupool: the tenant registry %s kept being removed", name);
}

/* A name as `top` shows it: one line of a table, without control
 * characters (a terminal would act on them). */
static void gp_name_set(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
    for (char *c = dst; *c; c++)
        if ((unsigned char)*c < ' ' || *c == 0x7f) *c = ' ';
}

/* The program's name (the base of argv[0]), as `top` names a tenant by
 * default: never its arguments, which anyone who may read the registry
 * would see (a --token=... among them). */
static void gp_default_name(char *buf, size_t n)
{
    char cmd[256];
    buf[0] = '\0';
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, cmd, sizeof cmd - 1) : -1;
    if (fd >= 0) close(fd);
    if (k <= 0) return;
    cmd[k] = '\0'; /* argv[0] ends at its NUL, or here when longer than cmd */
    gp_name_set(buf, n, strrchr(cmd, '/') ? strrchr(cmd, '/') + 1 : cmd);
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
    a->fork_gen = atomic_load(&gp_arb_fork_gen);
    snprintf(a->shm, sizeof a->shm, "%s", name);
    a->timeout_ns = pr->timeout_ms * MS;
    a->turn_ns = pr->turn_ms * MS;
    a->share = pr->share > 0 && pr->share <= 1 ? pr->share : 1;
    pthread_mutex_init(&a->answering, NULL);
    pthread_mutex_init(&a->swapping, NULL);
    gp_arb_shm *r = NULL;
    if ((st = gp_arb_attach(name, 1, GP_ARB_LOCK_WAIT_S, &r)) != GP_OK) {
        pthread_mutex_destroy(&a->answering);
        pthread_mutex_destroy(&a->swapping);
        free(a);
        return st;
    }
    gp_arb_reap(r);
    int live = 0, slot = -1;
    for (int i = 0; i < GP_ARB_SLOTS; i++) {
        if (r->slots[i].pid) live++;
        else if (slot < 0) slot = i;
    }
    char b1[32], b2[32];
    if (live && pr->limit && pr->limit != r->limit)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: GPUPOOL_DEVICE_LIMIT of %s differs from the %s that "
                          "group '%s' on %s has (set by its first tenant; give the same or none)",
                          gp_fmt_bytes(pr->limit, b1, sizeof b1), r->limit ? gp_fmt_bytes(r->limit, b2, sizeof b2) : "none",
                          pr->group, pr->device);
    else if (slot < 0)
        st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: group '%s' on %s has %d tenants already, the most "
                          "a registry holds", pr->group, pr->device, GP_ARB_SLOTS);
    if (st != GP_OK) {
        gp_arb_unlock(r);
        munmap(r, sizeof *r);
        pthread_mutex_destroy(&a->answering);
        pthread_mutex_destroy(&a->swapping);
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
    s->heartbeat = gp_now_ns();
    if (pr->name) gp_name_set(s->name, sizeof s->name, pr->name);
    else gp_default_name(s->name, sizeof s->name);
    r->n_registered++;
    a->r = r;
    a->slot = slot;
    a->prio1 = pr->priority + 1;
    atomic_store(&a->answered, atomic_load(&s->ask_seq));
    /* The others now share the group: those that may be swapped make their
     * swap's host memory ready (their next allocator call looks: an ask of
     * nothing). */
    for (int j = 0; j < GP_ARB_SLOTS; j++)
        if (j != slot && r->slots[j].pid && r->slots[j].can_swap)
            atomic_fetch_add_explicit(&r->slots[j].ask_seq, 1, memory_order_release);
    gp_arb_unlock(r);
    gp_arb_changed(r);
    *out = a;
    return GP_OK;
}

void gp_arbiter_close(gp_arbiter *a)
{
    if (!a) return;
    gp_arb_shm *r = a->r;
    if (gp_arb_forked(a)) { /* the parent's tenant: not ours to end */
        munmap(r, sizeof *r);
        free(a);
        return;
    }
    gp_arbiter_bind(a, NULL);
    /* Without gp_arb_check: a tenant leaves even a corrupt registry, and
     * the last one out removes it. */
    if (gp_lock_within(r, GP_ARB_LOCK_WAIT_S) == GP_OK) {
        gp_slot_clear(&r->slots[a->slot]);
        gp_arb_reap(r);
        int live = 0;
        for (int i = 0; i < GP_ARB_SLOTS; i++) live += r->slots[i].pid != 0;
        if (!live) {
            /* Under the lock: whoever maps it later sees `dead` and starts
             * a new one, so no two registries of a group ever live. */
            r->dead = 1;
            shm_unlink(a->shm);
        }
        gp_arb_unlock(r);
        gp_arb_changed(r);
    }
    munmap(r, sizeof *r);
    pthread_mutex_destroy(&a->answering);
    pthread_mutex_destroy(&a->swapping);
    free(a);
}

/* Fork: the child starts a new generation (its parent's arbiters are not
 * its own). */
static void gp_arb_child(void) { atomic_fetch_add(&gp_arb_fork_gen, 1); }

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

gp_status gp_arbiter_debug_lock(gp_arbiter *a) { return gp_arb_lock(a->r); }

void gp_arbiter_debug_owner(long uid) { gp_arb_uid_override = uid; }

void gp_arbiter_debug_unlock(gp_arbiter *a) { gp_arb_unlock(a->r); }
