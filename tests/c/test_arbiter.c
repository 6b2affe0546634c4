/*
 * test_arbiter.c -- the tenant registry and the reclaim protocol with real
 * processes (fork) on the host backend: registration churn from many
 * processes, a tenant killed while holding the registry's lock, the order
 * of reclaims, the timeout, a high priority that never fails while a lower
 * one can give, equal priorities that both progress, and the group's
 * device limit across processes, and the tenant's reclaim policy (trim,
 * then offload idle offloadable tags) as its stack runs it.  Every wait is bounded (an alarm ends a
 * stuck run), registry names carry this run's pid, and every registry is
 * removed at the end.  Run under ASan and UBSan by the test suite.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arbiter.h"
#include "backend_host.h"
#include "arbiter_impl.h" /* the registry's layout: tests write into it */
#include "codec.h"
#include "offload.h"
#include "pool_check.h"
#include "rng.h"
#include "stack.h"

/* The end of a tenant: its stack consistent (pool and offloader), then gone. */
#undef done
static int stack_consistent(gp_stack *s)
{
    char msg[512];
    size_t n = gp_stack_check(s, msg, sizeof msg);
    if (n) fprintf(stderr, "stack inconsistent: %zu problems, the first: %s\n", n, msg);
    return n == 0;
}
#define done(s)                                                                \
    do {                                                                       \
        CHECK(stack_consistent(s));                                            \
        gp_stack_destroy(s);                                                   \
    } while (0)

enum { LOW = GP_PRIO_LOW, NORMAL = GP_PRIO_NORMAL, HIGH = GP_PRIO_HIGH };

static char g_group[64];
static int g_n;

/* A group of this run, new for each test. */
static const char *new_group(void)
{
    snprintf(g_group, sizeof g_group, "test-%d-%d", (int)getpid(), ++g_n);
    return g_group;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* GPUPOOL_TENANT_TURN of the tenants made next (0: equal priorities
 * alternate at every yield point). */
static unsigned g_turn_ms;
/* GPUPOOL_TENANT_SWAP of the tenants made next: off but in the tests of
 * swaps, so that the others see the protocol below them (and the exact
 * bytes a tenant holds, without its offloader's). */
static int g_swap;

/* A tenant: the stack of a host pool of `group` with 1 MiB chunks under
 * the arbiter. */
static gp_stack *tenant(const char *group, int prio, const char *limit, unsigned timeout_ms)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.tenant_turn_ms = g_turn_ms;
    cfg.tenant_swap = g_swap;
    cfg.chunk = cfg.large_chunk = 1 * MiB;
    cfg.small_size = 64 * KiB;
    cfg.cache_slack = -1; /* keep cache: what the reclaims must take */
    cfg.priority = prio;
    cfg.reclaim_timeout_ms = timeout_ms;
    snprintf(cfg.tenant, sizeof cfg.tenant, "%s", group);
    if (limit && gp_config_set(&cfg, "device_limit", limit) != GP_OK) exit(3);
    gp_backend *be;
    gp_stack *p;
    if (gp_backend_host_create(1024 * MiB, &be) != GP_OK || gp_stack_create(be, "host", &cfg, &p) != GP_OK) {
        fprintf(stderr, "tenant of %s: %s\n", group, gp_last_error());
        exit(2);
    }
    return p;
}

static void *A(gp_stack *p, uint64_t n, gp_status *st)
{
    return gp_stack_alloc(p, n, NULL, GP_TAG_UNTAGGED, GP_PRIO_DEFAULT, st);
}

/* A free of the pool alone (gp_stack_free also answers asks). */
static gp_status F(gp_stack *p, void *x) { return gp_free(gp_stack_pool(p), x); }

static int read_group(gp_group_info *g, gp_tenant_info *t, size_t max)
{
    return gp_arbiter_read(g_group, "host", g, t, max) == GP_OK;
}

static const gp_tenant_info *find_pid(const gp_tenant_info *t, size_t n, int pid)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].pid == pid) return &t[i];
    return NULL;
}

static int registry_exists(void)
{
    char name[160];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0) close(fd);
    return fd >= 0;
}

/* Wait for a child, `ms` at most (then kill it); its exit status, or -1. */
static int reap(pid_t pid, unsigned ms)
{
    uint64_t end = now_ms() + ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_ms() > end) {
            fprintf(stderr, "child %d still runs after %u ms: killed\n", (int)pid, ms);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        nap_ms(1);
    }
}

/* A child that runs fn(arg) and exits with its result; `ctl` is its end of
 * a pipe the parent closes to say "stop". */
typedef int (*child_fn)(int ctl, int out, void *arg);
typedef struct child {
    pid_t pid;
    int ctl;  /* parent's end: close to stop the child */
    int out;  /* parent's end: what the child writes   */
} child;

/* The parent's ends of the pipes of live children: a later child must
 * not keep them open, or closing ctl would not reach the earlier one. */
static int g_ends[64], g_n_ends;

static child spawn(child_fn fn, void *arg)
{
    int c[2], o[2];
    if (pipe(c) != 0 || pipe(o) != 0 || g_n_ends + 2 > 64) exit(4);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) exit(4);
    if (pid == 0) {
        for (int i = 0; i < g_n_ends; i++) close(g_ends[i]);
        close(c[1]);
        close(o[0]);
        alarm(60);
        int rc = fn(c[0], o[1], arg);
        exit(rc);
    }
    close(c[0]);
    close(o[1]);
    g_ends[g_n_ends++] = c[1];
    g_ends[g_n_ends++] = o[0];
    return (child){pid, c[1], o[0]};
}

/* Whether the parent said stop (closed ctl); waits up to `ms`. */
static int stopped(int ctl, int ms)
{
    struct pollfd pf = {ctl, POLLIN, 0};
    return poll(&pf, 1, ms) > 0;
}

static void say(int out, uint64_t v)
{
    if (write(out, &v, sizeof v) != sizeof v) exit(5);
}

/* The next word the child said, `ms` at most; UINT64_MAX on none. */
static uint64_t hear(child *c, int ms)
{
    struct pollfd pf = {c->out, POLLIN, 0};
    uint64_t v;
    if (poll(&pf, 1, ms) <= 0 || read(c->out, &v, sizeof v) != sizeof v) return UINT64_MAX;
    return v;
}

static void close_end(int fd)
{
    for (int i = 0; i < g_n_ends; i++)
        if (g_ends[i] == fd) g_ends[i--] = g_ends[--g_n_ends];
    close(fd);
}

/* Say stop (the child may still talk). */
static void stop(child *c)
{
    close_end(c->ctl);
    c->ctl = -1;
}

static int finish(child *c, unsigned ms)
{
    if (c->ctl >= 0) stop(c);
    int rc = reap(c->pid, ms);
    close_end(c->out);
    return rc;
}

/* ------------------------------------------------------------------ tests */

static void test_one_tenant(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "8MiB", 0);
    gp_arbiter *a = gp_stack_arbiter(p);
    CHECK(a != NULL);
    CHECK(registry_exists());
    gp_stats s;
    gp_pool_stats(gp_stack_pool(p), &s, 0);
    CHECK(s.device_total == 8 * MiB); /* the group's device */
    gp_status st;
    void *x = A(p, 6 * MiB, &st);
    CHECK(x != NULL);
    void *y = A(p, 4 * MiB, &st);
    CHECK(y == NULL && st == GP_ERR_OOM);
    CHECK(strstr(gp_last_error(), g_group) != NULL);
    CHECK(strstr(gp_last_error(), "waited") != NULL);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && g.n_tenants == 1 && g.limit == 8 * MiB);
    CHECK(t[0].pid == getpid() && t[0].self && t[0].held == 6 * MiB && t[0].priority == NORMAL);
    CHECK(t[0].n_waits == 1 && t[0].n_wait_fail == 1 && t[0].wanted == 0);
    CHECK(F(p, x) == GP_OK);
    done(p);
    /* A stack without a group has no arbiter, and costs nothing. */
    gp_config cfg;
    gp_config_default(&cfg);
    gp_backend *be;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK && gp_stack_create(be, "host", &cfg, &p) == GP_OK);
    CHECK(gp_stack_arbiter(p) == NULL);
    gp_stack_destroy(p);
    CHECK(!registry_exists()); /* the last tenant out removed it */
    CHECK(gp_arbiter_read(g_group, "host", &g, t, 4) == GP_ERR_FOREIGN);
}

static void test_bad_input(void)
{
    gp_arbiter *a;
    gp_arbiter_params pr = {.group = "ok", .device = "host", .priority = 1, .total = 64 * MiB};
    pr.group = "a/b";
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "'a/b'"));
    pr.group = "";
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID);
    pr.group = new_group();
    pr.device = "GPU.1";
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "device id"));
    pr.device = "host";
    pr.priority = 256;
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "priority"));
    pr.priority = 1;
    /* The group's limit is its first tenant's; another must agree. */
    pr.limit = 16 * MiB;
    gp_arbiter *first;
    CHECK(gp_arbiter_open(&pr, &first) == GP_OK);
    pr.limit = 32 * MiB;
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "GPUPOOL_DEVICE_LIMIT"));
    pr.limit = 0; /* none given: the group's */
    CHECK(gp_arbiter_open(&pr, &a) == GP_OK);
    gp_arbiter_close(a);
    gp_arbiter_close(first);
    CHECK(!registry_exists());
    /* An object of that name that is no registry (another version). */
    char name[160];
    gp_arbiter_shm_name(new_group(), "host", name, sizeof name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    close(fd);
    pr.group = g_group;
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_BACKEND && strstr(gp_last_error(), name));
    CHECK(gp_arbiter_unlink(g_group, "host") == GP_OK);
    CHECK(gp_arbiter_unlink(g_group, "host") == GP_ERR_FOREIGN);
}

/* Register, allocate, free, unregister, `rounds` times. */
static int churn(int ctl, int out, void *arg)
{
    (void)ctl, (void)out;
    int rounds = *(int *)arg, bad = 0;
    for (int i = 0; i < rounds; i++) {
        gp_stack *p = tenant(g_group, NORMAL, "256MiB", 1000);
        gp_status st;
        void *x = A(p, 1 * MiB, &st);
        bad += x == NULL;
        gp_group_info g;
        gp_tenant_info t[GP_ARB_SLOTS];
        /* It sees itself, holding what it mapped. */
        const gp_tenant_info *me = read_group(&g, t, GP_ARB_SLOTS) ? find_pid(t, g.n_tenants, getpid()) : NULL;
        bad += !me || me->held != 1 * MiB;
        F(p, x);
        gp_stack_destroy(p);
    }
    return bad ? 1 : 0;
}

static void test_churn(void)
{
    enum { N = 6, ROUNDS = 40 };
    int rounds = ROUNDS;
    /* With a tenant that stays: one registry throughout. */
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "256MiB", 1000);
    child c[N];
    for (int i = 0; i < N; i++) c[i] = spawn(churn, &rounds);
    for (int i = 0; i < N; i++) CHECK(finish(&c[i], 30000) == 0);
    gp_group_info g;
    gp_tenant_info t[GP_ARB_SLOTS];
    CHECK(read_group(&g, t, GP_ARB_SLOTS));
    CHECK(g.n_tenants == 1 && t[0].pid == getpid() && t[0].held == 0);
    CHECK(g.n_registered == 1 + N * ROUNDS && g.n_reaped == 0);
    done(p);
    CHECK(!registry_exists());
    /* Without: the registry comes and goes; whoever joins a removed one
     * starts a new one, and none is left behind. */
    new_group();
    for (int i = 0; i < N; i++) c[i] = spawn(churn, &rounds);
    for (int i = 0; i < N; i++) CHECK(finish(&c[i], 30000) == 0);
    CHECK(!registry_exists());
}

/* Map 16 MiB, then hold the registry's lock until killed. */
static int hold_lock(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, NORMAL, "32MiB", 0);
    if (!A(p, 16 * MiB, NULL) || gp_arbiter_debug_lock(gp_stack_arbiter(p)) != GP_OK) return 1;
    say(out, 1);
    stopped(ctl, 30000);
    return 0;
}

static void test_killed_holding_lock(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "32MiB", 2000);
    child c = spawn(hold_lock, NULL);
    CHECK(hear(&c, 10000) == 1);
    kill(c.pid, SIGKILL);
    /* Not waited for yet: a zombie, whose memory is gone all the same. */
    uint64_t t0 = now_ms();
    gp_status st;
    void *x = A(p, 32 * MiB, &st); /* the dead one's 16 MiB included */
    CHECK(x != NULL);
    CHECK(now_ms() - t0 < 2000);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && g.n_tenants == 1 && g.n_reaped == 1 && t[0].held == 32 * MiB);
    CHECK(finish(&c, 5000) == 128 + SIGKILL);
    F(p, x);
    done(p);
    CHECK(!registry_exists());
}

/* A tenant of priority *arg that allocates `MB` MiB, frees it (cache) and
 * answers asks until told to stop; says 1 when ready, then its cache. */
typedef struct holder {
    int prio;
    uint64_t mib;
    int keep;         /* keep the memory live (nothing to give) */
    int gated;        /* join when the parent says go */
} holder;

/* Let a gated child go.  A child forked while the parent's threads run
 * may inherit a lock of the sanitizer's allocator taken (no atfork in
 * it): a parent with a stack forks its children first, gated. */
static void go(child *c)
{
    if (write(c->ctl, "g", 1) != 1) exit(5);
}

static int hold(int ctl, int out, void *arg)
{
    holder *h = arg;
    char g;
    if (h->gated && read(ctl, &g, 1) != 1) return 1;
    gp_stack *p = tenant(g_group, h->prio, "48MiB", 2000);
    void *x = A(p, h->mib * MiB, NULL);
    if (!x) return 1;
    if (!h->keep) F(p, x);
    say(out, 1);
    gp_arbiter *a = gp_stack_arbiter(p);
    while (!stopped(ctl, 1)) gp_arbiter_poll(a); /* a training loop's yield points */
    gp_stats s;
    gp_pool_stats(gp_stack_pool(p), &s, 0);
    say(out, s.reserved);
    if (h->keep) F(p, x);
    gp_stack_destroy(p);
    return 0;
}

static void test_lowest_first(void)
{
    new_group();
    holder lo = {LOW, 16, 0}, mid = {NORMAL, 16, 0};
    child l = spawn(hold, &lo);
    CHECK(hear(&l, 10000) == 1);
    child n = spawn(hold, &mid);
    CHECK(hear(&n, 10000) == 1);
    gp_stack *p = tenant(g_group, HIGH, "48MiB", 5000);
    gp_status st;
    void *x = A(p, 32 * MiB, &st); /* 16 free: 16 more from someone */
    if (!x) fprintf(stderr, "lowest_first: %s\n", gp_last_error());
    CHECK(x != NULL);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && g.n_tenants == 3);
    const gp_tenant_info *tl = find_pid(t, 3, l.pid), *tn = find_pid(t, 3, n.pid), *me = find_pid(t, 3, getpid());
    CHECK(tl && tl->n_given == 1 && tl->bytes_given == 16 * MiB && tl->held == 0);
    CHECK(tn && tn->n_given == 0 && tn->held == 16 * MiB);
    CHECK(me && me->n_waits == 1 && me->n_received == 1 && me->bytes_received == 16 * MiB);
    CHECK(tl && tl->n_lat == 1 && tl->lat_max_ns > 0 && tl->lat_median_ns <= tl->lat_max_ns);
    stop(&l);
    stop(&n);
    CHECK(hear(&l, 10000) == 0);        /* its cache went back */
    CHECK(hear(&n, 10000) == 16 * MiB); /* its cache stayed */
    CHECK(finish(&l, 10000) == 0 && finish(&n, 10000) == 0);
    F(p, x);
    done(p);
}

static void test_timeout(void)
{
    new_group();
    /* A lower tenant whose memory is all live: it answers, giving nothing. */
    holder lo = {LOW, 48, 1};
    child l = spawn(hold, &lo);
    CHECK(hear(&l, 10000) == 1);
    gp_stack *p = tenant(g_group, HIGH, "48MiB", 300);
    uint64_t t0 = now_ms();
    gp_status st;
    void *x = A(p, 16 * MiB, &st);
    uint64_t dt = now_ms() - t0;
    CHECK(x == NULL && st == GP_ERR_OOM);
    CHECK(dt >= 300 && dt < 2000);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d '", (int)l.pid);
    CHECK(strstr(gp_last_error(), pid) != NULL);                 /* who holds what */
    CHECK(strstr(gp_last_error(), "held 48.00 MiB") != NULL);
    CHECK(strstr(gp_last_error(), "GPUPOOL_RECLAIM_TIMEOUT") != NULL);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4));
    const gp_tenant_info *tl = find_pid(t, g.n_tenants, l.pid), *me = find_pid(t, g.n_tenants, getpid());
    CHECK(tl && tl->n_given >= 1 && tl->bytes_given == 0);
    CHECK(me && me->n_wait_fail == 1 && me->wanted == 0 && me->waiting_ns == 0);
    CHECK(finish(&l, 10000) == 0);
    done(p);
}

/* A low tenant waits in line while a higher one holds the memory, and gets
 * it once that one lets go (here: exits). */
static int hold_briefly(int ctl, int out, void *arg)
{
    (void)ctl, (void)arg;
    gp_stack *p = tenant(g_group, HIGH, "32MiB", 0);
    void *x = A(p, 32 * MiB, NULL);
    say(out, x != NULL);
    nap_ms(200);
    F(p, x);
    gp_stack_destroy(p);
    return 0;
}

static void test_low_queues(void)
{
    new_group();
    child h = spawn(hold_briefly, NULL);
    CHECK(hear(&h, 10000) == 1);
    gp_stack *p = tenant(g_group, LOW, "32MiB", 5000);
    uint64_t t0 = now_ms();
    gp_status st;
    void *x = A(p, 16 * MiB, &st);
    CHECK(x != NULL);
    CHECK(now_ms() - t0 >= 100);
    CHECK(finish(&h, 10000) == 0);
    F(p, x);
    done(p);
}

/* A busy low tenant whose live memory is offloadable (a tag registered at
 * its own priority, so that its own allocations never offload it): asked
 * by the high one, its stack runs the tenant's reclaim policy -- trim,
 * then offload the idle tag -- and says what it offloaded. */
static int busy_low(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *s = tenant(g_group, LOW, "64MiB", 50);
    gp_offloader *o = gp_stack_offloader(s, 1);
    gp_tag t;
    if (!o || gp_tag_intern("busy_low", &t) != GP_OK || gp_offload_register(o, t, LOW, 0) != GP_OK) return 1;
    void *live[16];
    int n = 0;
    unsigned seed = 7;
    static gp_offload_stats st; /* (8 KiB) */
    uint64_t seen = 0, checked = 0, wrong = 0;
    say(out, 1);
    while (!stopped(ctl, 0)) {
        /* After each offload of a reclaim, the registry says what the pool
         * has offloaded (nothing freed since). */
        gp_offload_stats_get(o, &st);
        if (st.n_pressure != seen) {
            gp_group_info g;
            gp_tenant_info ti[4];
            const gp_tenant_info *me = read_group(&g, ti, 4) ? find_pid(ti, g.n_tenants, getpid()) : NULL;
            gp_stats ps;
            gp_pool_stats(gp_stack_pool(s), &ps, 0);
            seen = st.n_pressure;
            checked++;
            wrong += !me || me->offloaded != ps.offloaded || !ps.offloaded;
        }
        if (n == 16 || (n && rand_r(&seed) % 2)) {
            F(s, live[--n]);
            continue;
        }
        /* may wait, may fail: it is low */
        void *x = gp_stack_alloc(s, (1 + rand_r(&seed) % 4) * MiB, NULL, t, GP_PRIO_DEFAULT, NULL);
        if (x) live[n++] = x;
    }
    say(out, checked);
    say(out, wrong);
    while (n) F(s, live[--n]);
    int bad = !stack_consistent(s);
    gp_stack_destroy(s);
    return bad;
}

static void test_high_never_fails(void)
{
    new_group();
    child l = spawn(busy_low, NULL);
    CHECK(hear(&l, 10000) == 1);
    gp_stack *p = tenant(g_group, HIGH, "64MiB", 5000);
    void *live[16];
    int failures = 0;
    unsigned seed = 3;
    for (int round = 0; round < 40; round++) {
        int n = 0;
        for (uint64_t total = 0; total < 48 * MiB;) {
            uint64_t sz = (4 + rand_r(&seed) % 5) * MiB;
            gp_status st;
            void *x = A(p, sz, &st);
            if (!x) {
                failures++;
                fprintf(stderr, "high failed: %s\n", gp_last_error());
                break;
            }
            live[n++] = x;
            total += sz;
        }
        while (n) F(p, live[--n]);
        gp_pool_trim(gp_stack_pool(p), UINT64_MAX); /* hand it back: the low one takes it again */
        nap_ms(2);
    }
    CHECK(failures == 0);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4));
    const gp_tenant_info *tl = find_pid(t, g.n_tenants, l.pid);
    CHECK(tl && tl->n_given > 0 && tl->bytes_given > 0);
    stop(&l);
    /* It offloaded (the policy's second step), and the registry says what
     * is offloaded now, as its pool does. */
    uint64_t offloads = hear(&l, 10000), wrong = hear(&l, 1000);
    CHECK(offloads > 0 && offloads != UINT64_MAX);
    CHECK(wrong == 0);
    CHECK(finish(&l, 10000) == 0);
    done(p);
}

/* Two tenants taking turns: the end of one, which says how often it waited
 * and how often it failed. */
static int turns_done(int out, gp_stack *p, int fails)
{
    gp_group_info g;
    gp_tenant_info t[4];
    const gp_tenant_info *me = read_group(&g, t, 4) ? find_pid(t, g.n_tenants, getpid()) : NULL;
    say(out, me ? me->n_waits : UINT64_MAX);
    say(out, (uint64_t)fails);
    gp_stack_destroy(p);
    return 0;
}

/* Run two `fn` tenants from the same start: neither may fail, and both
 * must have waited (they did contend).  The most waits of one. */
static uint64_t take_turns(child_fn fn, int rounds)
{
    uint64_t most = 0;
    new_group();
    child c[2];
    for (int i = 0; i < 2; i++) c[i] = spawn(fn, &rounds);
    for (int i = 0; i < 2; i++) CHECK(hear(&c[i], 10000) == 1);
    for (int i = 0; i < 2; i++) CHECK(write(c[i].ctl, "g", 1) == 1);
    for (int i = 0; i < 2; i++) {
        uint64_t waits = hear(&c[i], 60000), fails = hear(&c[i], 1000);
        CHECK(fails == 0);
        CHECK(waits > 0 && waits != UINT64_MAX);
        CHECK(finish(&c[i], 10000) == 0);
        if (waits > most) most = waits;
    }
    CHECK(!registry_exists());
    return most;
}

/* Equal priorities: each alternately needs 16 MiB of a 24 MiB group. */
static int equal_worker(int ctl, int out, void *arg)
{
    (void)ctl;
    int rounds = *(int *)arg, fails = 0;
    /* Far shorter a wait than the other's whole run: only turns help. */
    gp_stack *p = tenant(g_group, NORMAL, "24MiB", 600);
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1; /* both start together */
    for (int i = 0; i < rounds; i++) {
        void *x = A(p, 16 * MiB, NULL);
        if (!x) {
            fails++;
            continue;
        }
        nap_ms(20);
        F(p, x); /* into the cache: kept unless asked */
    }
    return turns_done(out, p, fails);
}

static void test_equal_share(void) { (void)take_turns(equal_worker, 60); }

/* What each step of two_halves says it needs (0: 20 MiB for the first,
 * then what the last one held). */
static uint64_t g_need;

/* Steps of two allocations: alone, two such tenants can both hold their
 * first half and wait for each other's second; a lease at each yield point
 * makes them take turns. */
static int two_halves(int ctl, int out, void *arg)
{
    int rounds = *(int *)arg, fails = 0;
    gp_stack *p = tenant(g_group, NORMAL, "24MiB", 2000);
    gp_arbiter *a = gp_stack_arbiter(p);
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    for (int i = 0; i < rounds; i++) {
        /* The first step says what it will hold at its peak; later ones
         * lease what the last one held. */
        gp_arbiter_yield(a, g_need ? g_need : i == 0 ? 20 * MiB : 0);
        void *x = A(p, 10 * MiB, NULL);
        nap_ms(3);
        void *y = x ? A(p, 10 * MiB, NULL) : NULL;
        nap_ms(3);
        if (!x || !y) fprintf(stderr, "two_halves %d failed: %s\n", (int)getpid(), gp_last_error());
        fails += !x || !y;
        if (y) F(p, y);
        if (x) F(p, x);
    }
    return turns_done(out, p, fails);
}

static void test_leases(void) { (void)take_turns(two_halves, 20); }

/* With a turn of 150 ms, steps of 6 ms or more go in runs (60 steps: two
 * turns each at least): a handover (one wait of the other) every several
 * steps, not at every step. */
static void test_turns(void)
{
    g_turn_ms = 150;
    CHECK(take_turns(two_halves, 60) < 20);
    /* Each step leases a little more than it holds: the tenant in its turn
     * waits for that at each yield point, and must not meanwhile hand its
     * cache to the other, whose want is older (on the H100, two LoRA jobs
     * that needed 10.59 GiB and held 10.47 took turns at every step). */
    g_need = 21 * MiB;
    CHECK(take_turns(two_halves, 60) < 20);
    g_need = 0;
    g_turn_ms = 0;
}

/* Leases are room no other tenant maps into, whatever its priority, and
 * a level of held that unmaps do not spend.  A high tenant leases 8 MiB,
 * maps it, frees it and trims (its step's pool unmapping to fit a block),
 * then a low one leases 16 MiB of the 24; the high one then wants 12 MiB,
 * 4 more than its lease: it waits for the low step's end, and the low step
 * maps its 16 MiB at once.  (Seen on the H100: a lease spent by such
 * churn, and a higher priority mapping into a lower one's lease, left two
 * LoRA steps stalled half way.) */
static int lease_high(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, HIGH, "24MiB", 5000);
    gp_arbiter *a = gp_stack_arbiter(p);
    gp_arbiter_yield(a, 8 * MiB);
    void *x = A(p, 8 * MiB, NULL);
    if (x) F(p, x);
    gp_pool_trim(gp_stack_pool(p), UINT64_MAX);
    say(out, x != NULL);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    uint64_t t0 = now_ms();
    void *y = A(p, 12 * MiB, NULL);
    say(out, y != NULL);
    say(out, now_ms() - t0);
    if (y) F(p, y);
    gp_stack_destroy(p);
    return 0;
}

static int lease_low(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, LOW, "24MiB", 5000);
    gp_arbiter *a = gp_stack_arbiter(p);
    gp_arbiter_yield(a, 16 * MiB);
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    uint64_t t0 = now_ms();
    void *x = A(p, 16 * MiB, NULL);
    say(out, x != NULL);
    say(out, now_ms() - t0);
    nap_ms(200); /* the step goes on */
    if (x) F(p, x);
    gp_arbiter_yield(a, 0); /* its end: the cache goes to the high one */
    stopped(ctl, 10000);
    gp_stack_destroy(p);
    return 0;
}

static void test_lease_is_kept(void)
{
    new_group();
    child h = spawn(lease_high, NULL);
    CHECK(hear(&h, 10000) == 1);
    child l = spawn(lease_low, NULL);
    CHECK(hear(&l, 10000) == 1);
    CHECK(write(h.ctl, "g", 1) == 1);
    nap_ms(100);
    CHECK(write(l.ctl, "g", 1) == 1);
    CHECK(hear(&l, 8000) == 1);
    uint64_t low_ms = hear(&l, 1000);
    CHECK(low_ms < 1000);
    CHECK(hear(&h, 8000) == 1);
    uint64_t high_ms = hear(&h, 1000);
    CHECK(high_ms >= 250 && high_ms != UINT64_MAX);
    CHECK(finish(&l, 10000) == 0);
    CHECK(finish(&h, 10000) == 0);
    CHECK(!registry_exists());
}

/* A step stuck mid-way comes before any step's start, and gets the cache
 * of a higher tenant at that one's yield point: a server of high priority
 * keeps 12 MiB of cache between its requests (its lease needs no more); a
 * low step leases 8 MiB and then wants 8 more.  No one asks a higher
 * priority, so only the server's yield point can end that wait. */
static int cache_server(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, HIGH, "24MiB", 5000);
    gp_arbiter *a = gp_stack_arbiter(p);
    int fails = 0;
    for (int i = 0; !stopped(ctl, 0); i++) {
        gp_arbiter_yield(a, 12 * MiB);
        void *x = A(p, 12 * MiB, NULL);
        fails += !x;
        if (i == 0) say(out, 1);
        nap_ms(20);
        if (x) F(p, x);
    }
    say(out, (uint64_t)fails);
    gp_stack_destroy(p);
    return 0;
}

static int overrun_low(int ctl, int out, void *arg)
{
    (void)ctl, (void)arg;
    gp_stack *p = tenant(g_group, LOW, "24MiB", 3000);
    gp_arbiter *a = gp_stack_arbiter(p);
    gp_arbiter_yield(a, 8 * MiB);
    void *x = A(p, 8 * MiB, NULL);
    uint64_t t0 = now_ms();
    void *y = x ? A(p, 8 * MiB, NULL) : NULL;
    say(out, y != NULL);
    say(out, now_ms() - t0);
    if (y) F(p, y);
    if (x) F(p, x);
    gp_arbiter_yield(a, 0);
    gp_stack_destroy(p);
    return 0;
}

static void test_stuck_step_first(void)
{
    new_group();
    child s = spawn(cache_server, NULL);
    CHECK(hear(&s, 10000) == 1);
    child l = spawn(overrun_low, NULL);
    CHECK(hear(&l, 8000) == 1);
    uint64_t ms = hear(&l, 1000);
    CHECK(ms < 1500);
    CHECK(finish(&l, 10000) == 0);
    stop(&s);
    CHECK(hear(&s, 8000) == 0);
    CHECK(finish(&s, 10000) == 0);
    CHECK(!registry_exists());
}

/* Four tenants (low, normal, normal, high) of a 24 MiB group run steps of
 * random peaks (4-12 MiB, said at the yield point before each), made of
 * blocks of 1-3 MiB that they free and map again mid-step, trimming their
 * cache now and then (as a pool does to fit a block).  No allocation may
 * fail: two steps stalled half way would each fail at the timeout (the
 * H100 runs of examples/multi_tenant.py stalled so twice). */
static int random_steps(int ctl, int out, void *arg)
{
    int prio = *(int *)arg, fails = 0;
    gp_stack *p = tenant(g_group, prio, "24MiB", 4000);
    gp_arbiter *a = gp_stack_arbiter(p);
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    uint64_t peak = 4 + rnd() % 9; /* MiB, of the coming step */
    for (int i = 0; i < 30; i++) {
        gp_arbiter_yield(a, peak * MiB);
        void *x[16];
        uint64_t size[16], held = 0;
        int n = 0;
        while (held < peak && n < 16) {
            if (n && rnd() % 4 == 0) {
                int k = (int)(rnd() % (uint64_t)n);
                F(p, x[k]);
                held -= size[k];
                x[k] = x[n - 1], size[k] = size[n - 1], n--;
                if (rnd() % 2) gp_pool_trim(gp_stack_pool(p), UINT64_MAX);
                continue;
            }
            uint64_t s = 1 + rnd() % 3;
            if (s > peak - held) s = peak - held;
            if (!(x[n] = A(p, s * MiB, NULL))) {
                fails++;
                break;
            }
            size[n++] = s;
            held += s;
        }
        nap_ms(1 + (unsigned)(rnd() % 3));
        while (n) F(p, x[--n]);
        peak = 4 + rnd() % 9;
    }
    return turns_done(out, p, fails);
}

static void test_random_steps(void)
{
    static int prios[4] = {LOW, NORMAL, NORMAL, HIGH};
    new_group();
    child c[4];
    for (int i = 0; i < 4; i++) c[i] = spawn(random_steps, &prios[i]);
    for (int i = 0; i < 4; i++) CHECK(hear(&c[i], 10000) == 1);
    for (int i = 0; i < 4; i++) CHECK(write(c[i].ctl, "g", 1) == 1);
    uint64_t waits = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t w = hear(&c[i], 60000), fails = hear(&c[i], 1000);
        CHECK(fails == 0);
        CHECK(w != UINT64_MAX);
        waits += w;
        CHECK(finish(&c[i], 10000) == 0);
    }
    CHECK(waits > 0); /* they did contend */
    CHECK(!registry_exists());
}

/* Take 1 MiB blocks until the group says no; say how many; hold them. */
static int greedy(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, NORMAL, "40MiB", 0);
    void *x[64];
    int n = 0;
    while (n < 64 && (x[n] = A(p, 1 * MiB, NULL))) n++;
    say(out, (uint64_t)n);
    stopped(ctl, 30000);
    while (n) F(p, x[--n]);
    gp_stack_destroy(p);
    return 0;
}

static void test_device_limit(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "40MiB", 0); /* keeps one registry */
    child c[4];
    for (int i = 0; i < 4; i++) c[i] = spawn(greedy, NULL);
    uint64_t sum = 0;
    for (int i = 0; i < 4; i++) sum += hear(&c[i], 20000);
    CHECK(sum == 40); /* all of the limit, and not a byte more */
    gp_group_info g;
    gp_tenant_info t[8];
    CHECK(read_group(&g, t, 8) && g.n_tenants == 5);
    uint64_t held = 0;
    for (size_t i = 0; i < g.n_tenants; i++) held += t[i].held;
    CHECK(held == 40 * MiB);
    uint64_t limit, avail;
    gp_arbiter_view(gp_stack_arbiter(p), &limit, &avail);
    CHECK(limit == 40 * MiB && avail == 0);
    CHECK(A(p, 1 * MiB, NULL) == NULL);
    for (int i = 0; i < 4; i++) CHECK(finish(&c[i], 10000) == 0);
    gp_arbiter_view(gp_stack_arbiter(p), &limit, &avail);
    CHECK(avail == 40 * MiB);
    done(p);
}

/* test_arbiter ask GROUP PRIORITY LIMIT MiB TIMEOUT_MS: a tenant that asks
 * for MiB and exits 0 when it got them (tests/test_arbiter.py). */
static int ask_main(char **argv)
{
    snprintf(g_group, sizeof g_group, "%s", argv[2]);
    gp_stack *p = tenant(g_group, atoi(argv[3]), argv[4], (unsigned)atoi(argv[6]));
    gp_status st;
    void *x = A(p, (uint64_t)atoi(argv[5]) * MiB, &st);
    if (!x) fprintf(stderr, "%s\n", gp_last_error());
    else F(p, x);
    gp_stack_destroy(p);
    return x ? 0 : 1;
}

/* In a child forked from a tenant: the parent's pool and arbiter are not
 * the child's (nothing the child does changes the parent's entry), and the
 * child can be a tenant of its own. */
static gp_stack *g_parent_pool;
static gp_arbiter *g_parent_arb;

static int forked_child(int ctl, int out, void *arg)
{
    (void)ctl, (void)out, (void)arg;
    /* The list of stacks starts empty: no yield of the parent's tenant. */
    int bad = gp_stack_yield_all(64 * MiB) != 0;
    gp_status st;
    void *x = A(g_parent_pool, 1 * MiB, &st); /* the pool refuses it */
    bad += x != NULL || st != GP_ERR_INVALID;
    bad += gp_arbiter_poll(g_parent_arb) != 0 || gp_arbiter_yield(g_parent_arb, 64 * MiB) != 0;
    gp_arbiter_close(g_parent_arb); /* frees the child's copy only */
    gp_stack *mine = tenant(g_group, LOW, "32MiB", 0);
    bad += A(mine, 2 * MiB, NULL) == NULL;
    gp_group_info g;
    gp_tenant_info t[4];
    bad += !read_group(&g, t, 4) || g.n_tenants != 2 || !find_pid(t, 2, getppid());
    gp_stack_destroy(mine);
    return bad;
}

static void test_fork(void)
{
    new_group();
    g_parent_pool = tenant(g_group, NORMAL, "32MiB", 0);
    gp_arbiter *a = g_parent_arb = gp_stack_arbiter(g_parent_pool);
    void *x = A(g_parent_pool, 8 * MiB, NULL);
    child c = spawn(forked_child, NULL);
    CHECK(finish(&c, 20000) == 0);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && g.n_tenants == 1 && t[0].pid == getpid() && t[0].held == 8 * MiB);
    CHECK(gp_stack_arbiter(g_parent_pool) == a);
    F(g_parent_pool, x);
    done(g_parent_pool);
    CHECK(!registry_exists());
}

/* A tenant's pool offloads as any other: its backend (the arbiter's
 * adaptor) forwards every function of the device's -- checksum, gather and
 * in_context were NULL once, and an offload in a group crashed. */
static void test_offload_in_a_group(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "512MiB", 0);
    gp_tag t;
    CHECK(gp_tag_intern("tenant_offload", &t) == GP_OK);
    enum { N = 6 };
    unsigned char *x[N];
    for (int i = 0; i < N; i++) {
        x[i] = gp_stack_alloc(p, 3 * MiB, NULL, t, GP_PRIO_DEFAULT, NULL);
        CHECK(x[i] != NULL);
        for (size_t k = 0; k < 3 * MiB; k++) x[i][k] = (unsigned char)(k % 251 < 40 ? 0 : k * 7 + i);
    }
    gp_offloader *o = gp_stack_offloader(p, 1);
    CHECK(o != NULL);
    gp_group_info g;
    gp_tenant_info ti[4];
    gp_stats st;
    for (int codec = GP_CODEC_RAW; codec <= GP_CODEC_AUTO; codec++) {
        gp_offload_opts opts = {.keep = 1, .codec = codec, .elem_size = 2};
        gp_offload_result r;
        CHECK(gp_offload_tags(o, &t, 1, &opts, &r) == GP_OK && r.released >= (N - 1) * 3 * MiB);
        gp_pool_stats(gp_stack_pool(p), &st, 0);
        CHECK(read_group(&g, ti, 4) && ti[0].held == st.reserved); /* given back to the group */
        CHECK(gp_restore_tags(o, &t, 1, 0, &r) == GP_OK && r.lost == 0);
        for (int i = 0; i < N; i++)
            for (size_t k = 0; k < 3 * MiB; k += 4099)
                CHECK(x[i][k] == (unsigned char)(k % 251 < 40 ? 0 : k * 7 + i));
    }
    for (int i = 0; i < N; i++) CHECK(F(p, x[i]) == GP_OK);
    done(p); /* (with its offloader) */
}

/* An offload the pool's pressure callback makes (an allocation of a higher
 * priority than an idle offloadable tag's finds the group full) is told to
 * the registry, as `top` shows it: offloadable before, offloaded after. */
static void test_pressure_publishes(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "16MiB", 0);
    gp_offloader *o = gp_stack_offloader(p, 1);
    gp_tag t;
    CHECK(o && gp_tag_intern("pressure_low", &t) == GP_OK && gp_offload_register(o, t, LOW, 0) == GP_OK);
    void *x[3];
    for (int i = 0; i < 3; i++) CHECK((x[i] = gp_stack_alloc(p, 3 * MiB, NULL, t, LOW, NULL)) != NULL);
    gp_stack_publish(p);
    gp_group_info g;
    gp_tenant_info ti[4];
    CHECK(read_group(&g, ti, 4) && ti[0].offloadable == 9 * MiB && ti[0].offloaded == 0);
    gp_status st;
    void *y = gp_stack_alloc(p, 12 * MiB, NULL, GP_TAG_UNTAGGED, HIGH, &st);
    CHECK(y != NULL);
    gp_offload_stats os;
    gp_offload_stats_get(o, &os);
    CHECK(os.n_pressure == 1);
    CHECK(read_group(&g, ti, 4) && ti[0].offloaded == 9 * MiB && ti[0].offloadable == 0);
    CHECK(F(p, y) == GP_OK);
    for (int i = 0; i < 3; i++) CHECK(F(p, x[i]) == GP_OK);
    done(p);
}

/* ------------------------------------------------------------------ swaps */

/* Fill x (n bytes) with a pattern of `seed`; check it. */
static void stamp(void *x, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i += 4096) ((unsigned char *)x)[i] = (unsigned char)(seed * 31 + i / 4096);
}

static int stamped(const void *x, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i += 4096)
        if (((const unsigned char *)x)[i] != (unsigned char)(seed * 31 + i / 4096)) return 0;
    return 1;
}

/* The end of a swapping tenant: its figures, failures and wrong bytes. */
static int swap_done(int out, gp_stack *p, int fails, int wrong)
{
    gp_group_info g;
    gp_tenant_info t[4];
    const gp_tenant_info *me = read_group(&g, t, 4) ? find_pid(t, g.n_tenants, getpid()) : NULL;
    say(out, me ? me->n_swap_out : UINT64_MAX);
    say(out, me ? me->n_swap_in : UINT64_MAX);
    say(out, (uint64_t)fails);
    say(out, (uint64_t)wrong);
    int bad = !stack_consistent(p);
    gp_stack_destroy(p);
    return bad;
}

/* A job that knows nothing of the arbiter (no yield point): steps whose
 * peaks are random, 8..20 MiB of a 24 MiB group, holding what they made
 * (stamped) until the step ends; `arg`: its priority. */
static int plain_job(int ctl, int out, void *arg)
{
    int prio = *(int *)arg, fails = 0, wrong = 0;
    gp_stack *p = tenant(g_group, prio, "24MiB", 20000);
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    unsigned seed = (unsigned)getpid();
    for (int step = 0; step < 40; step++) {
        void *live[10];
        uint64_t size[10];
        /* At most 16 MiB: with its offloader's 4 MiB it fits beside what
         * a tenant swapped out keeps (its offloader's last 1 MiB).  A step
         * that needs more than the group less that waits until the
         * timeout (docs/architecture.md, "Swaps"). */
        int n = 0, parts = 3 + (int)(rand_r(&seed) % 2);
        for (int i = 0; i < parts; i++) {
            size[n] = (2 + rand_r(&seed) % 3) * MiB;
            if (!(live[n] = A(p, size[n], NULL))) {
                fprintf(stderr, "plain_job %d failed: %s\n", (int)getpid(), gp_last_error());
                fails++;
                break;
            }
            stamp(live[n], size[n], (unsigned)(step * 16 + n));
            n++;
            nap_ms(1);
        }
        for (int i = 0; i < n; i++) wrong += !stamped(live[i], size[i], (unsigned)(step * 16 + i));
        while (n) F(p, live[--n]);
    }
    return swap_done(out, p, fails, wrong);
}

/* Two or three jobs without yield points whose peaks add up to more than
 * the group: each step that outgrows what is left waits, and one parked
 * behind the other is swapped out whole and back; nobody fails, no byte
 * changes.  Without swaps two such steps each held half and waited for
 * each other until the timeout (20 s: under a sanitizer on a loaded
 * machine a swap of 20 MiB compressed takes up to a few hundred ms, and a
 * tenant keeps its room for five times the costliest). */
static void test_overruns_swap(void)
{
    int prios[3] = {NORMAL, NORMAL, LOW};
    for (int k = 2; k <= 3; k++) {
        new_group();
        child c[3];
        for (int i = 0; i < k; i++) c[i] = spawn(plain_job, &prios[i]);
        for (int i = 0; i < k; i++) CHECK(hear(&c[i], 10000) == 1);
        for (int i = 0; i < k; i++) CHECK(write(c[i].ctl, "g", 1) == 1);
        uint64_t swaps = 0;
        for (int i = 0; i < k; i++) {
            uint64_t out = hear(&c[i], 60000), in = hear(&c[i], 1000);
            CHECK(hear(&c[i], 1000) == 0); /* failures */
            CHECK(hear(&c[i], 1000) == 0); /* wrong bytes */
            CHECK(out == in);              /* every swap out came back */
            CHECK(finish(&c[i], 10000) == 0);
            swaps += out;
        }
        CHECK(swaps > 0); /* (they did contend) */
        CHECK(!registry_exists());
    }
}

/* Whether tenant `pid` is seen swapped out within 2 s (it records its
 * swap once its memory has gone, after the asker may have gone on): its
 * figures then. */
static int swapped_out(int pid, gp_tenant_info *out)
{
    for (uint64_t end = now_ms() + 2000; now_ms() < end; nap_ms(5)) {
        gp_group_info g;
        gp_tenant_info t[4];
        const gp_tenant_info *ti = read_group(&g, t, 4) ? find_pid(t, g.n_tenants, pid) : NULL;
        if (ti && ti->swapped) {
            *out = *ti;
            return 1;
        }
    }
    return 0;
}

/* How a swap victim's swap out goes (swap_victim's `arg`). */
enum {
    SWAP_WHOLE,   /* it goes and comes back whole                      */
    SWAP_UNDONE,  /* every copy fails from the first: undone, it stays  */
    SWAP_AWAY,    /* an unmap fails once it has given memory back, and
                     the device refuses maps from then on: the undo
                     fails, what it took stays away                    */
};

/* A low tenant holding 20 MiB of stamped live memory, allocating now and
 * then: swapped out for a high one, back at its next allocation with
 * every byte.  SWAP_UNDONE: it stays whole, and the high one times out
 * naming it.  SWAP_AWAY: it is swapped out all the same; its allocations
 * fail saying it could not come back while the device refuses maps, and
 * once the device takes them again it comes back with every byte.  No
 * allocation of it returns with any of its memory away. */
static int swap_victim(int ctl, int out, void *arg)
{
    int how = *(int *)arg, wrong = 0, fails = 0;
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = cfg.large_chunk = 1 * MiB;
    cfg.small_size = 64 * KiB;
    cfg.priority = LOW;
    cfg.reclaim_timeout_ms = 5000;
    snprintf(cfg.tenant, sizeof cfg.tenant, "%s", g_group);
    if (gp_config_set(&cfg, "device_limit", "32MiB") != GP_OK) return 3;
    gp_backend *be;
    gp_stack *p;
    if (gp_backend_host_create(1024 * MiB, &be) != GP_OK || gp_stack_create(be, "host", &cfg, &p) != GP_OK) return 2;
    void *x[4];
    for (int i = 0; i < 4; i++) {
        if (!(x[i] = A(p, 5 * MiB, NULL))) return 4;
        stamp(x[i], 5 * MiB, (unsigned)i);
    }
    void *y = A(p, 64 * KiB, NULL); /* (its loop's block cached: it maps nothing) */
    if (!y) return 4;
    F(p, y);
    if (how == SWAP_UNDONE) gp_host_fail(be, GP_HOST_COPY, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    if (how == SWAP_AWAY) {
        gp_host_fail(be, GP_HOST_UNMAP, 2, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
        gp_host_fail(be, GP_HOST_MAP, 1, GP_ERR_BACKEND, GP_HOST_FAIL_FROM);
    }
    say(out, 1);
    int away_seen = 0;
    while (!stopped(ctl, 5)) {
        gp_status st;
        y = A(p, 64 * KiB, &st); /* its allocations are where it parks */
        gp_stats s;
        gp_pool_stats(gp_stack_pool(p), &s, 0);
        if (y) {
            away_seen += s.offloaded != 0;
            F(p, y);
        } else if (how == SWAP_AWAY && strstr(gp_last_error(), "could not come back") && s.offloaded) {
            /* Said, and true: the device takes maps again. */
            fails++;
            gp_host_fail_none(be);
        } else {
            fprintf(stderr, "swap_victim: %s\n", gp_last_error());
            wrong++;
        }
    }
    gp_host_fail_none(be);
    if ((y = A(p, 64 * KiB, NULL))) F(p, y); /* (the call after the last failed one: back) */
    else wrong++;
    for (int i = 0; i < 4; i++) wrong += !stamped(x[i], 5 * MiB, (unsigned)i);
    gp_stats s;
    gp_pool_stats(gp_stack_pool(p), &s, 0);
    wrong += s.offloaded != 0;
    if (away_seen) fprintf(stderr, "swap_victim: %d allocations returned with memory away\n", away_seen);
    wrong += away_seen;
    for (int i = 0; i < 4; i++) F(p, x[i]);
    return swap_done(out, p, fails, wrong);
}

static void test_swap_for_higher(void)
{
    for (int how = SWAP_WHOLE; how <= SWAP_AWAY; how++) {
        new_group();
        child l = spawn(swap_victim, &how);
        CHECK(hear(&l, 10000) == 1);
        gp_stack *h = tenant(g_group, HIGH, "32MiB", how == SWAP_UNDONE ? 1000 : 5000);
        gp_status st;
        void *x = A(h, 24 * MiB, &st); /* 12 free: the low one must go whole */
        if (!x) fprintf(stderr, "swap_for_higher %d: %s\n", how, gp_last_error());
        if (how != SWAP_UNDONE) {
            CHECK(x != NULL);
            gp_tenant_info tl;
            CHECK(swapped_out(l.pid, &tl) && tl.n_swap_out == 1 && tl.swapped >= 20 * MiB && tl.held < 4 * MiB);
        } else {
            /* Its swap out failed and was undone: it holds its memory, the
             * high one says why it timed out. */
            CHECK(x == NULL && st == GP_ERR_OOM);
            CHECK(strstr(gp_last_error(), "its last swap out failed") != NULL);
        }
        nap_ms(50); /* (SWAP_AWAY: its swap in waits for the room, failing once there) */
        if (x) F(h, x);
        gp_pool_trim(gp_stack_pool(h), UINT64_MAX);
        nap_ms(how == SWAP_AWAY ? 500 : 0);
        stop(&l);
        uint64_t out = hear(&l, 10000), in = hear(&l, 1000), fails = hear(&l, 1000);
        CHECK(out == (how == SWAP_UNDONE ? 0 : 1) && in == out);
        CHECK(fails == (how == SWAP_AWAY)); /* an allocation said it could not come back */
        CHECK(hear(&l, 1000) == 0); /* wrong bytes: none, and nothing left offloaded */
        CHECK(finish(&l, 10000) == 0);
        done(h);
        CHECK(!registry_exists());
    }
}

/* A tenant killed while swapped out: its slot goes (the others take all
 * the group's memory), its host memory went with its process. */
static void test_killed_while_swapped(void)
{
    new_group();
    int how = SWAP_WHOLE;
    child l = spawn(swap_victim, &how);
    CHECK(hear(&l, 10000) == 1);
    gp_stack *h = tenant(g_group, HIGH, "32MiB", 5000);
    void *x = A(h, 24 * MiB, NULL);
    CHECK(x != NULL);
    gp_tenant_info tl;
    CHECK(swapped_out(l.pid, &tl));
    kill(l.pid, SIGKILL);
    CHECK(reap(l.pid, 5000) == 128 + SIGKILL);
    void *y = A(h, 6 * MiB, NULL); /* 31 of 32: the dead one's slot was reclaimed */
    CHECK(y != NULL);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && g.n_tenants == 1);
    if (y) F(h, y);
    F(h, x);
    done(h);
    CHECK(!registry_exists());
}

/* The thread rule: while one thread of a tenant is swapped out, another
 * thread's allocation waits at the gate, and returns only once the memory
 * is back (nothing of the pool offloaded when it returns). */
typedef struct gate_arg {
    gp_stack *p;
    int offloaded_seen; /* the pool had memory offloaded when it returned */
    int got;
} gate_arg;

static void *gate_thread(void *arg)
{
    gate_arg *g = arg;
    for (int i = 0; i < 400; i++) {
        void *y = A(g->p, 64 * KiB, NULL);
        gp_stats s;
        gp_pool_stats(gp_stack_pool(g->p), &s, 0);
        g->offloaded_seen += s.offloaded != 0;
        if (y) {
            g->got++;
            F(g->p, y);
        }
        nap_ms(1);
    }
    return NULL;
}

static int two_threads(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, LOW, "32MiB", 5000);
    void *x = A(p, 20 * MiB, NULL);
    if (!x) return 4;
    stamp(x, 20 * MiB, 9);
    gate_arg g = {p, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, gate_thread, &g);
    say(out, 1);
    while (!stopped(ctl, 2)) {
        void *y = A(p, 64 * KiB, NULL);
        if (y) F(p, y);
    }
    pthread_join(th, NULL);
    say(out, (uint64_t)g.offloaded_seen);
    say(out, (uint64_t)g.got);
    int wrong = !stamped(x, 20 * MiB, 9);
    F(p, x);
    return swap_done(out, p, 0, wrong);
}

static void test_swap_threads(void)
{
    new_group();
    child l = spawn(two_threads, NULL);
    CHECK(hear(&l, 10000) == 1);
    gp_stack *h = tenant(g_group, HIGH, "32MiB", 5000);
    for (int round = 0; round < 3; round++) {
        void *x = A(h, 24 * MiB, NULL);
        CHECK(x != NULL);
        nap_ms(50);
        if (x) F(h, x);
        gp_pool_trim(gp_stack_pool(h), UINT64_MAX);
        nap_ms(50);
    }
    stop(&l);
    /* The other thread got memory while some was away at most where a
     * swap began right after its allocation had returned (the window
     * between its return and its look: the rule covers allocations, not
     * what a thread does after one), once a swap at most: its next
     * allocation waits at the gate.  Without the gate, at every
     * allocation while away (tens a swap). */
    uint64_t seen = hear(&l, 20000);
    CHECK(hear(&l, 1000) == 400);  /* and every allocation of it succeeded */
    uint64_t out = hear(&l, 1000), in = hear(&l, 1000);
    CHECK(out >= 1 && in == out);
    CHECK(seen <= out);
    if (seen > out) fprintf(stderr, "swap_threads: %llu allocations saw memory away, %llu swaps\n",
                            (unsigned long long)seen, (unsigned long long)out);
    CHECK(hear(&l, 1000) == 0 && hear(&l, 1000) == 0);
    CHECK(finish(&l, 10000) == 0);
    done(h);
    CHECK(!registry_exists());
}

/* A swap in asked while the swap out is under way (another thread of the
 * process at the gate) waits for it and brings the memory back: it does
 * not return with the memory away.  (Before, the tenant was marked away
 * only once its swap out had returned: a thread at the gate in between
 * found it not away and ran on without its memory.) */
typedef struct mid_swap {
    _Atomic int gone;     /* the memory is away                          */
    _Atomic int asked;    /* the other thread has asked for it back      */
} mid_swap;

static gp_status mid_swap_out(void *arg, uint64_t *released, uint64_t *back)
{
    mid_swap *m = arg;
    atomic_store(&m->gone, 1);
    for (uint64_t end = now_ms() + 2000; !atomic_load(&m->asked) && now_ms() < end;) nap_ms(1);
    nap_ms(100); /* (the other thread's swap in runs meanwhile, or waits) */
    *released = *back = 1 * MiB;
    return GP_OK;
}

static gp_status mid_swap_in(void *arg)
{
    atomic_store(&((mid_swap *)arg)->gone, 0);
    return GP_OK;
}

typedef struct gate_ask {
    gp_arbiter *a;
    mid_swap *m;
    int away_after; /* the memory was away when its swap in returned */
    gp_status st;
} gate_ask;

static void *gate_ask_thread(void *arg)
{
    gate_ask *g = arg;
    while (!atomic_load(&g->m->gone)) nap_ms(1);
    atomic_store(&g->m->asked, 1);
    g->st = gp_arbiter_swap_in(g->a);
    g->away_after = atomic_load(&g->m->gone);
    return NULL;
}

static void test_swap_in_during_swap_out(void)
{
    gp_arbiter_params pr = {.group = new_group(), .device = "host", .priority = LOW, .total = 64 * MiB};
    gp_arbiter *a;
    CHECK(gp_arbiter_open(&pr, &a) == GP_OK);
    mid_swap m = {0, 0};
    gp_arbiter_set_swap(a, mid_swap_out, mid_swap_in, &m);
    gate_ask g = {a, &m, -1, GP_ERR_INVALID};
    pthread_t th;
    pthread_create(&th, NULL, gate_ask_thread, &g);
    uint64_t released = 0;
    pthread_mutex_lock(&a->answering);
    CHECK(gp_arb_swap_out(a, &released) == GP_OK && released == 1 * MiB);
    pthread_mutex_unlock(&a->answering);
    pthread_join(th, NULL);
    CHECK(g.st == GP_OK && g.away_after == 0);
    CHECK(gp_arbiter_swap_in(a) == GP_OK && !atomic_load(&m.gone) && !atomic_load(&a->away));
    gp_group_info gi;
    gp_tenant_info t[4];
    CHECK(read_group(&gi, t, 4) && gi.n_tenants == 1 && t[0].n_swap_out == 1 && t[0].n_swap_in == 1);
    gp_arbiter_close(a);
    CHECK(!registry_exists());
}

/* ----------------------------------------------- a registry nobody else uses */

/* The registry of g_group, mapped as any process of this user could. */
static gp_arb_shm *map_registry(void)
{
    char name[160];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return NULL;
    void *m = mmap(NULL, sizeof(gp_arb_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

static mode_t registry_mode(uid_t *uid)
{
    char path[200], name[160];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (uid) *uid = st.st_uid;
    return st.st_mode & 07777;
}

static int registry_fchmod(mode_t mode)
{
    char name[160];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    int fd = shm_open(name, O_RDONLY, 0);
    int ok = fd >= 0 && fchmod(fd, mode) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/* Only a registry of this user with mode 0600 is joined or read: anyone
 * else who could open it could read its tenants, hold its lock or write
 * figures that refuse every ask.  (Before: one made 0666 by another user
 * was joined without a word.) */
static void test_registry_is_ours(void)
{
    gp_arbiter_params pr = {.group = new_group(), .device = "host", .priority = 1, .total = 64 * MiB};
    char name[160], msg[1024];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    /* Made 0600 whatever the umask (0277 would leave 0400). */
    mode_t old = umask(0277);
    gp_arbiter *first, *a;
    CHECK(gp_arbiter_open(&pr, &first) == GP_OK);
    umask(old);
    uid_t uid = (uid_t)-1;
    CHECK(registry_mode(&uid) == 0600 && uid == geteuid());
    /* Opened up to everyone: refused to a joiner and to a reader, naming
     * the object, its owner and mode, what is accepted and the way out. */
    CHECK(registry_fchmod(0666));
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID);
    snprintf(msg, sizeof msg, "%s", gp_last_error());
    CHECK(strstr(msg, name) && strstr(msg, "mode 0666") && strstr(msg, "mode 0600 is accepted") &&
          strstr(msg, "rm /dev/shm"));
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(gp_arbiter_read(g_group, "host", &g, t, 4) == GP_ERR_INVALID && strstr(gp_last_error(), "mode 0666"));
    CHECK(registry_fchmod(0640));
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "mode 0640"));
    CHECK(registry_fchmod(0600));
    CHECK(gp_arbiter_open(&pr, &a) == GP_OK);
    gp_arbiter_close(a);
    /* Another user's: as if this process were another uid... */
    char theirs[64];
    snprintf(theirs, sizeof theirs, "owned by uid %lu", (unsigned long)geteuid());
    gp_arbiter_debug_owner((long)geteuid() + 1000);
    CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), theirs) &&
          strstr(gp_last_error(), name));
    CHECK(gp_arbiter_read(g_group, "host", &g, t, 4) == GP_ERR_INVALID && strstr(gp_last_error(), theirs));
    gp_arbiter_debug_owner(-1);
    /* ... and, as root, really another uid's. */
    if (geteuid() == 0) {
        int fd = shm_open(name, O_RDWR, 0);
        CHECK(fd >= 0 && fchown(fd, 4242, (gid_t)-1) == 0);
        CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_INVALID && strstr(gp_last_error(), "owned by uid 4242"));
        CHECK(gp_arbiter_read(g_group, "host", &g, t, 4) == GP_ERR_INVALID);
        CHECK(fchown(fd, 0, (gid_t)-1) == 0);
        close(fd);
    }
    CHECK(read_group(&g, t, 4) && g.n_tenants == 1);
    gp_arbiter_close(first);
    CHECK(!registry_exists());
}

/* Hold 4 MiB until told to stop. */
static int hold4(int ctl, int out, void *arg)
{
    (void)arg;
    gp_stack *p = tenant(g_group, LOW, "32MiB", 0);
    void *x = A(p, 4 * MiB, NULL);
    say(out, x != NULL);
    stopped(ctl, 30000);
    F(p, x);
    gp_stack_destroy(p);
    return 0;
}

/* A figure that cannot be is a corrupt registry: a joiner, a reader and a
 * running tenant's next map get an error naming the object, the slot and
 * the field, at once -- never a sum of it, never a wait.  (Before: a slot
 * holding 1 TiB in a 32 MiB group was summed: every ask waited out its
 * timeout and failed, `top` showed the sum.) */
static void test_corrupt_registry(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "32MiB", 2000);
    child c = spawn(hold4, NULL);
    CHECK(hear(&c, 10000) == 1);
    gp_arb_shm *r = map_registry();
    CHECK(r != NULL);
    if (!r) return;
    int k = -1;
    for (int i = 0; i < GP_ARB_SLOTS; i++)
        if (r->slots[i].pid == c.pid) k = i;
    CHECK(k >= 0);
    if (k < 0) return;
    gp_arb_slot *s = &r->slots[k];
    char name[160], where[64];
    gp_arbiter_shm_name(g_group, "host", name, sizeof name);
    snprintf(where, sizeof where, "slot %d (pid %d)", k, (int)c.pid);
    gp_arbiter_params pr = {.group = g_group, .device = "host", .priority = 1, .total = 1024 * MiB};
    gp_group_info g;
    gp_tenant_info t[4];
    gp_arbiter *a;
    gp_status st;
    /* What each spoiling of the slot below puts in the message. */
    const char *cases[] = {"held = 1099511627776 bytes (1.00 TiB), above the group's limit of 32.00 MiB",
                           "pid = -5", "priority = 999", "wanted = 18446744073709551615 bytes"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gp_arb_slot keep = *s; /* (its lock-free words stay as they are) */
        if (i == 0) s->held = 1ull << 40;
        if (i == 1) s->pid = -5;
        if (i == 2) s->priority = 999;
        if (i == 3) s->wanted = UINT64_MAX;
        if (i == 1) snprintf(where, sizeof where, "slot %d (pid -5)", k);
        else snprintf(where, sizeof where, "slot %d (pid %d)", k, (int)c.pid);
        uint64_t t0 = now_ms();
        CHECK(gp_arbiter_open(&pr, &a) == GP_ERR_BACKEND);
        CHECK(strstr(gp_last_error(), name) && strstr(gp_last_error(), "is corrupt") &&
              strstr(gp_last_error(), where) && strstr(gp_last_error(), cases[i]) &&
              strstr(gp_last_error(), "rm /dev/shm"));
        CHECK(gp_arbiter_read(g_group, "host", &g, t, 4) == GP_ERR_BACKEND && strstr(gp_last_error(), where) &&
              strstr(gp_last_error(), cases[i]));
        /* A running tenant: a map fails with it, not after the timeout. */
        void *x = A(p, 8 * MiB, &st);
        CHECK(x == NULL && st == GP_ERR_BACKEND && strstr(gp_last_error(), "is corrupt") &&
              strstr(gp_last_error(), cases[i]));
        CHECK(now_ms() - t0 < 1000);
        s->pid = keep.pid, s->held = keep.held, s->priority = keep.priority, s->wanted = keep.wanted;
        /* Repaired: all is as before. */
        CHECK((x = A(p, 8 * MiB, &st)) != NULL);
        const gp_tenant_info *theirs = read_group(&g, t, 4) ? find_pid(t, g.n_tenants, c.pid) : NULL;
        CHECK(g.n_tenants == 2 && theirs && theirs->held == 4 * MiB);
        CHECK(F(p, x) == GP_OK);
        gp_pool_trim(gp_stack_pool(p), UINT64_MAX); /* the next round's map is a map */
    }
    munmap(r, sizeof *r);
    CHECK(finish(&c, 10000) == 0);
    done(p);
    CHECK(!registry_exists());
}

/* A want beyond the group's memory is published as the group's memory: a
 * figure the check accepts (a hopeless request is no corrupt registry). */
static void test_huge_want(void)
{
    new_group();
    gp_stack *p = tenant(g_group, NORMAL, "32MiB", 300);
    gp_status st;
    CHECK(A(p, 64 * MiB, &st) == NULL && st == GP_ERR_OOM);
    gp_group_info g;
    gp_tenant_info t[4];
    CHECK(read_group(&g, t, 4) && t[0].n_wait_fail == 1);
    CHECK(gp_arbiter_yield(gp_stack_arbiter(p), 1ull << 62) == 0);
    CHECK(read_group(&g, t, 4) && t[0].lease == 0);
    done(p);
}

/* test_arbiter poke GROUP PID HELD: write HELD into the held figure of
 * PID's slot of the host registry of GROUP, as a stray write would
 * (tests/test_arbiter.py); prints what was there. */
static int poke_main(char **argv)
{
    snprintf(g_group, sizeof g_group, "%s", argv[2]);
    gp_arb_shm *r = map_registry();
    if (!r) return 2;
    for (int i = 0; i < GP_ARB_SLOTS; i++)
        if (r->slots[i].pid == atoi(argv[3])) {
            printf("%llu\n", (unsigned long long)r->slots[i].held);
            r->slots[i].held = strtoull(argv[4], NULL, 10);
            return 0;
        }
    return 3;
}

/* ------------------------------------------------------ compute share */

/* A high tenant with yield points, in steps for `arg` ms. */
static int busy_high(int ctl, int out, void *arg)
{
    int ms = *(int *)arg;
    gp_stack *p = tenant(g_group, HIGH, "64MiB", 5000);
    gp_arbiter *a = gp_stack_arbiter(p);
    say(out, 1);
    char go;
    if (!stopped(ctl, 10000) || read(ctl, &go, 1) != 1) return 1;
    for (uint64_t end = now_ms() + (uint64_t)ms; now_ms() < end;) {
        gp_arbiter_yield(a, 0);
        void *x = A(p, 4 * MiB, NULL);
        nap_ms(20); /* its step */
        if (x) F(p, x);
    }
    say(out, 0);
    gp_stack_destroy(p);
    return 0;
}

/* A tenant without yield points below a busy higher one pauses at its
 * allocations (its compute share, 25% by default): here it allocates all
 * the time for 1.5 s and is paused for most of it; with no higher tenant
 * busy it is never paused.  Before, only tenants with yield points paused,
 * and a plain script ran beside the high one at full speed. */
static void test_plain_pauses(void)
{
    for (int with_high = 0; with_high <= 1; with_high++) {
        new_group();
        int ms = 2500;
        child h = {0};
        if (with_high) {
            h = spawn(busy_high, &ms);
            CHECK(hear(&h, 10000) == 1);
            CHECK(write(h.ctl, "g", 1) == 1);
            nap_ms(200);
        }
        gp_stack *p = tenant(g_group, LOW, "64MiB", 5000);
        uint64_t n = 0;
        for (uint64_t end = now_ms() + 1500; now_ms() < end; n++) {
            void *x = A(p, 64 * KiB, NULL);
            if (x) gp_stack_free(p, x);
        }
        gp_group_info g;
        gp_tenant_info t[4];
        const gp_tenant_info *me = read_group(&g, t, 4) ? find_pid(t, g.n_tenants, getpid()) : NULL;
        CHECK(me != NULL);
        if (me && with_high) CHECK(me->pause_ns > 700000000ull);
        if (me && !with_high) CHECK(me->pause_ns == 0);
        done(p);
        if (with_high) {
            CHECK(hear(&h, 10000) == 0);
            CHECK(finish(&h, 10000) == 0);
        }
        CHECK(!registry_exists());
        (void)n;
    }
}

/* A tenant that may be swapped makes its swap's host memory ready as it
 * grows, alone too (the tenant that joins next may ask at once), so that
 * its first swap pins nothing in the call; the highest one, with only
 * lower ones beside it, pins nothing. */
static void test_swap_room_ready(void)
{
    new_group();
    gp_stack *p = tenant(g_group, LOW, "160MiB", 5000);
    void *x = A(p, 80 * MiB, NULL); /* (told a large chunk at a time) */
    CHECK(x != NULL);
    static gp_offload_stats st;
    uint64_t ready = 0;
    for (uint64_t end = now_ms() + 3000; now_ms() < end && ready < 64 * MiB; nap_ms(10)) {
        gp_offload_stats_get(gp_stack_offloader(p, 0), &st);
        ready = st.host_slabs;
    }
    CHECK(ready >= 64 * MiB); /* (the first large chunk) */
    F(p, x);
    done(p);
    CHECK(!registry_exists());

    /* With a lower tenant beside it, the highest pins nothing: nobody can
     * swap it, and its pinning would take the CPU from its own work. */
    new_group();
    holder lo = {LOW, 4, 1, 1};
    child l = spawn(hold, &lo);
    gp_stack *q = tenant(g_group, HIGH, "48MiB", 5000);
    go(&l);
    CHECK(hear(&l, 10000) == 1);
    void *u = A(q, 20 * MiB, NULL);
    CHECK(u != NULL);
    nap_ms(300);
    gp_offload_stats_get(gp_stack_offloader(q, 0), &st);
    CHECK(st.host_slabs + st.host_pinning < 20 * MiB);
    stop(&l);
    CHECK(hear(&l, 10000) != UINT64_MAX);
    CHECK(finish(&l, 10000) == 0);
    if (u) F(q, u);
    done(q);
    CHECK(!registry_exists());
}

int main(int argc, char **argv)
{
    alarm(300); /* a stuck protocol fails the run rather than hanging it */
    if (argc == 7 && strcmp(argv[1], "ask") == 0) return ask_main(argv);
    if (argc == 5 && strcmp(argv[1], "poke") == 0) return poke_main(argv);
    const char *only = getenv("GP_TEST_ONLY"); /* (one test, by name, while debugging) */
#define RUN(t) if (!only || strcmp(only, #t) == 0) t()
    RUN(test_one_tenant);
    RUN(test_bad_input);
    RUN(test_churn);
    RUN(test_killed_holding_lock);
    RUN(test_lowest_first);
    RUN(test_timeout);
    RUN(test_low_queues);
    RUN(test_high_never_fails);
    RUN(test_equal_share);
    RUN(test_leases);
    RUN(test_turns);
    RUN(test_lease_is_kept);
    RUN(test_stuck_step_first);
    RUN(test_random_steps);
    RUN(test_device_limit);
    RUN(test_fork);
    RUN(test_offload_in_a_group);
    RUN(test_pressure_publishes);
    RUN(test_plain_pauses);
    g_swap = 1;
    RUN(test_overruns_swap);
    RUN(test_swap_for_higher);
    RUN(test_killed_while_swapped);
    RUN(test_swap_threads);
    RUN(test_swap_in_during_swap_out);
    RUN(test_swap_room_ready);
    g_swap = 0;
    RUN(test_registry_is_ours);
    RUN(test_corrupt_registry);
    RUN(test_huge_want);
    return check_done();
}
