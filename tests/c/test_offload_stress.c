/*
 * test_offload_stress.c -- offload under threads on the host backend: every
 * byte that comes back is checked.
 *
 * Four owner threads, one per tag, keep blocks of their tag filled with a
 * per-block pattern (patterns.h).  Only the owner writes its tag's memory,
 * and only while it holds the tag: its `hold` lock taken (no other thread
 * offloads or queues a background offload of the tag then), the tag busy
 * (gp_offload_use(tag, 1): no pressure offload takes it), and
 * gp_restore_tags(tag) returned GP_OK after both (every offload queued
 * before has run and none is offloaded: the tag stays resident until the
 * owner lets go).  Holding it, the owner checks every byte of every block,
 * frees some, allocates and fills new ones, rewrites others; not holding
 * it, it sometimes frees a block whatever its state.
 * Beside them: two offloader threads offload random sets of the tags they
 * can take the holds of (now, or queued in the background; raw or auto
 * codec, rarely dropping the contents, which the owner then learns), one
 * thread prefetches and restores random tags and changes their
 * registration (priorities 0..1: offloadable under pressure), and two
 * allocator threads take memory at high priority on a small device, so
 * that the pressure callback offloads idle registered tags.
 * Every few hundred milliseconds the threads park and the offloader's and
 * the pool's checks run (gp_offload_check, gp_pool_check, backend misuse),
 * around a swap of the whole pool out and back in (a parked tenant's),
 * over whatever records the others left (faults armed, in that mode).
 *
 * "deferred" mode: the backend's streams run their work as late as a GPU's
 * may (backend_host.h), so a return that the offloader's copies had not
 * finished by hands the owner old bytes.
 *
 * "faults" mode: a thread also arms injected backend failures at random
 * (copy, map, unmap, event record/query, host_alloc, checksum).  An
 * operation that fails must fail cleanly: the owner's bytes stay right,
 * except after an offload that says it lost bytes -- then a restore without
 * accept_loss must fail, and with it the bytes that differ must be no more
 * than it reports lost (unless another thread's restore accepted the loss
 * first: the restorer, which accepts only after a refusal, or an owner
 * whose record held other owners' blocks too -- see maybe_lost).  At the end the faults stop, the allocators let go,
 * and every owner restores and checks its tag a last time.
 *
 * Usage: test_offload_stress [seconds (3)] [faults]
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "codec.h"
#include "offload.h"
#include "patterns.h"
#include "pool_check.h"

enum { OWNERS = 4, OFFLOADERS = 2, ALLOCATORS = 2, BLOCKS = 8, HUNGRY = 6 };

static gp_pool *pool;
static gp_backend *be;
static gp_offloader *off;
static gp_tag tags[OWNERS], hungry_tag;
static int faults_mode;
static double deadline;
static atomic_int stop, parked, pause_req, running;
static atomic_long n_bad, n_verified_bytes, n_offload, n_offload_fail, n_restore, n_restore_fail, n_prefetch,
    n_background, n_lost_restores, n_pressure_allocs, n_checks, n_swaps, n_swap_fail;
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t hold[OWNERS];
/* Set (under hold) when an offload of the tag may have dropped its
 * contents: the owner refills instead of checking. */
static int dropped[OWNERS];
/* Set before a restore that accepts lost bytes: its records may hold other
 * owners' blocks too (an offload of several tags), which come back with
 * the loss accepted, and those owners' own restores then report none.
 * Each owner takes its flag after its restore returned (every restore of
 * its records has finished then, each having set the flag before it
 * began) and refills what differs instead of counting it wrong.  An
 * owner sets its own flag too when its accepting restore failed after
 * bringing back some records with their losses (res.lost counts them: each
 * record comes back whole or not at all, and those restored before the
 * failure stay restored), so that its next take refills them. */
static atomic_int maybe_lost[OWNERS];

/* Swap outs that failed and could not be undone, whose record was then
 * restored accepting the loss: the allocators' blocks filled before one
 * may differ. */
static atomic_long lost_swaps;

/* A restore is about to accept lost bytes on behalf of `except`'s
 * (-1: nobody's) fellow owners. */
static void accepting_for_others(int except)
{
    for (int t = 0; t < OWNERS; t++)
        if (t != except) atomic_store(&maybe_lost[t], 1);
}

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void bad(const char *fmt, ...)
{
    if (atomic_fetch_add(&n_bad, 1) >= 20) return;
    pthread_mutex_lock(&report_lock);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&report_lock);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t xs(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void nap(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Quiet points: the main thread asks every worker to park, runs the
 * checks, lets them go. */
static void maybe_park(void)
{
    if (!atomic_load(&pause_req)) return;
    atomic_fetch_add(&parked, 1);
    while (atomic_load(&pause_req)) nap(200);
    atomic_fetch_sub(&parked, 1);
}

static int stopping(void) { return atomic_load(&stop) != 0; }

static int state_of(void *ptr)
{
    gp_block_info b;
    return gp_pool_lookup(pool, ptr, &b) == GP_OK ? b.state : -1;
}

/* The failures an operation may meet: room, the host limit, and (faults
 * mode) injected ones -- those passed on by the next restore too. */
static int may_fail(gp_status st)
{
    if (st == GP_ERR_OOM || st == GP_ERR_LIMIT) return 1;
    return faults_mode && strstr(gp_last_error(), "injected") != NULL;
}

/* ----------------------------------------------------------------- owner */

typedef struct oblock {
    char *ptr;
    uint64_t size, seed;
    int kind;
    long lost; /* (an allocator's block: lost_swaps when it was filled) */
} oblock;

typedef struct owner {
    int t;
    uint64_t x, seq;
    oblock b[BLOCKS];
} owner;

static void fill(owner *w, oblock *b)
{
    b->seed = ((uint64_t)w->t << 56) | ++w->seq;
    pat_fill(b->ptr, b->size, b->seed, b->kind);
}

/* Take the tag: hold, busy, restored.  Returns 0 (let go again) when the
 * restore failed as it may; on a lost-bytes failure it restores again
 * accepting the loss and refills what differs, after checking that no more
 * bytes differ than reported lost. */
static int take(owner *w, int final)
{
    int t = w->t;
    pthread_mutex_lock(&hold[t]);
    gp_offload_use(off, tags[t], 1);
    gp_offload_result res;
    gp_error_clear();
    gp_status st = gp_restore_tags(off, &tags[t], 1, 0, &res);
    atomic_fetch_add(&n_restore, 1);
    int accept = 0;
    if (st == GP_ERR_BACKEND && strstr(gp_last_error(), "lost")) {
        /* (a failed offload lost bytes: only an accepting restore brings
         * them back) */
        gp_error_clear();
        accepting_for_others(t);
        st = gp_restore_tags(off, &tags[t], 1, 1, &res);
        accept = 1;
        atomic_fetch_add(&n_lost_restores, 1);
    }
    if (st != GP_OK) {
        /* (an accepting restore that failed may have restored some records
         * first, lost bytes and all: the next take must not count those
         * wrong) */
        if (accept && res.lost) atomic_store(&maybe_lost[t], 1);
        atomic_fetch_add(&n_restore_fail, 1);
        if (final || !may_fail(st))
            bad("owner %d: %srestore of its tag failed with %s: %s", t, final ? "the final " : "",
                gp_status_str(st), gp_last_error());
        gp_offload_use(off, tags[t], 0);
        pthread_mutex_unlock(&hold[t]);
        return 0;
    }
    /* (after the restore: see maybe_lost) */
    int others_accepted = atomic_exchange(&maybe_lost[t], 0);
    if (res.lost && !accept)
        bad("owner %d: a restore without accept_loss returned OK bringing back %llu lost bytes", t,
            (unsigned long long)res.lost);
    if (gp_offload_is_offloaded(off, tags[t]))
        bad("owner %d: the restore returned OK, the tag is still offloaded", t);
    uint64_t differ = 0;
    int offloaded = 0;
    for (int i = 0; i < BLOCKS; i++) {
        oblock *b = &w->b[i];
        if (!b->ptr) continue;
        int s = state_of(b->ptr);
        if (s != GP_BLOCK_USED) {
            bad("owner %d: after a restore that returned OK the block %p is in state %d", t, (void *)b->ptr, s);
            offloaded = 1;
            continue;
        }
        if (dropped[t]) {
            fill(w, b);
            continue;
        }
        uint64_t d = pat_diff(b->ptr, b->size, b->seed, b->kind, 0);
        atomic_fetch_add(&n_verified_bytes, (long)b->size);
        if (d && !res.lost && !others_accepted)
            bad("owner %d: the block %p of %llu bytes has %llu bytes wrong", t, (void *)b->ptr,
                (unsigned long long)b->size, (unsigned long long)d);
        differ += d;
        if (d) fill(w, b);
    }
    if (differ > res.lost && !others_accepted)
        bad("owner %d: %llu bytes differ, the restore reported %llu lost", t, (unsigned long long)differ,
            (unsigned long long)res.lost);
    if (offloaded) { /* (not writable: found wrong, let go) */
        gp_offload_use(off, tags[t], 0);
        pthread_mutex_unlock(&hold[t]);
        return 0;
    }
    dropped[t] = 0;
    return 1;
}

static void let_go(owner *w)
{
    gp_offload_use(off, tags[w->t], 0);
    pthread_mutex_unlock(&hold[w->t]);
}

static void *owner_main(void *arg)
{
    owner *w = arg;
    while (!stopping()) {
        maybe_park();
        uint64_t r = xs(&w->x);
        if (r % 8 == 0) {
            /* Free a block whatever its state (offloaded memory may be
             * freed); under the hold so that no offload of the tag runs. */
            oblock *b = &w->b[(r >> 8) % BLOCKS];
            pthread_mutex_lock(&hold[w->t]);
            if (b->ptr && gp_free(pool, b->ptr) != GP_OK && !may_fail(GP_ERR_BACKEND))
                bad("owner %d: free: %s", w->t, gp_last_error());
            b->ptr = NULL;
            pthread_mutex_unlock(&hold[w->t]);
            continue;
        }
        if (!take(w, 0)) {
            nap(500);
            continue;
        }
        for (int k = 0; k < 3; k++) {
            r = xs(&w->x);
            oblock *b = &w->b[r % BLOCKS];
            if (b->ptr && r >> 8 & 1) {
                if (gp_free(pool, b->ptr) != GP_OK && !may_fail(GP_ERR_BACKEND))
                    bad("owner %d: free: %s", w->t, gp_last_error());
                b->ptr = NULL;
            }
            if (!b->ptr) {
                uint64_t size = (64 * KiB << (r >> 12) % 5) + (r >> 20) % 4096;
                gp_status st;
                b->ptr = gp_alloc(pool, size, NULL, tags[w->t], GP_PRIO_LOW + (int)((r >> 30) % 2), &st);
                if (!b->ptr) {
                    if (!may_fail(st)) bad("owner %d: alloc: %s", w->t, gp_last_error());
                    continue;
                }
                b->size = size;
                b->kind = (int)((r >> 40) % PAT_KINDS);
            } else {
                b->kind = (int)((r >> 40) % PAT_KINDS);
            }
            fill(w, b);
        }
        let_go(w);
        nap((long)(xs(&w->x) % 300));
    }
    return NULL;
}

/* ------------------------------------------------------------ offloaders */

static void *offloader_main(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 7;
    while (!stopping()) {
        maybe_park();
        uint64_t r = xs(&x);
        gp_tag tv[OWNERS];
        int took[OWNERS], n = 0;
        for (int t = 0; t < OWNERS; t++) {
            took[t] = (r >> t & 1) && pthread_mutex_trylock(&hold[t]) == 0;
            if (took[t]) tv[n++] = tags[t];
        }
        if (n) {
            gp_offload_opts opts = {.keep = (r >> 8) % 16 != 0, .codec = (r >> 12) & 1 ? GP_CODEC_AUTO : GP_CODEC_RAW,
                                    .elem_size = (r >> 13) & 1 ? 2 : 4, .refill = (r >> 14) & 1};
            gp_error_clear();
            gp_status st;
            if ((r >> 16) % 3 == 0) {
                st = gp_offload_tags_background(off, tv, (size_t)n, &opts);
                atomic_fetch_add(&n_background, 1);
                if (st != GP_OK) bad("background offload: %s", gp_last_error());
            } else {
                gp_offload_result res;
                st = gp_offload_tags(off, tv, (size_t)n, &opts, &res);
                atomic_fetch_add(&n_offload, 1);
                if (st != GP_OK) {
                    atomic_fetch_add(&n_offload_fail, 1);
                    if (!may_fail(st)) bad("offload: %s", gp_last_error());
                }
            }
            for (int t = 0; t < OWNERS; t++)
                if (took[t] && !opts.keep) dropped[t] = 1;
        }
        for (int t = 0; t < OWNERS; t++)
            if (took[t]) pthread_mutex_unlock(&hold[t]);
        nap((long)(xs(&x) % 500));
    }
    return NULL;
}

/* Prefetches, restores of any tag (no hold: a restore only brings memory
 * back), registration changes. */
static void *restorer_main(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 3;
    while (!stopping()) {
        maybe_park();
        uint64_t r = xs(&x);
        gp_tag tv[OWNERS];
        size_t n = 0;
        for (int t = 0; t < OWNERS; t++)
            if (r >> t & 1) tv[n++] = tags[t];
        if (!n) tv[n++] = tags[(r >> 4) % OWNERS];
        gp_error_clear();
        gp_status st;
        switch ((r >> 8) % 4) {
        case 0:
        case 1:
            st = gp_prefetch_tags(off, tv, n);
            atomic_fetch_add(&n_prefetch, 1);
            if (st != GP_OK) bad("prefetch: %s", gp_last_error());
            break;
        case 2: {
            gp_offload_result res;
            st = gp_restore_tags(off, tv, n, 0, &res);
            atomic_fetch_add(&n_restore, 1);
            if (st == GP_ERR_BACKEND && strstr(gp_last_error(), "lost") && (r >> 10) & 1) {
                /* (accepting, for the owners: they must know, see
                 * maybe_lost) */
                gp_error_clear();
                accepting_for_others(-1);
                st = gp_restore_tags(off, tv, n, 1, &res);
                atomic_fetch_add(&n_lost_restores, 1);
            }
            /* (a lost record without accept_loss, or an owner's dropped
             * bytes: its owner finds out) */
            if (st != GP_OK && !may_fail(st) && !(st == GP_ERR_BACKEND && strstr(gp_last_error(), "lost")))
                bad("restore: %s", gp_last_error());
            break;
        }
        default: {
            int t = (int)((r >> 12) % OWNERS);
            gp_offload_register(off, tags[t], (int)((r >> 16) % 2), 2);
        }
        }
        nap((long)(xs(&x) % 400));
    }
    return NULL;
}

/* ------------------------------------------------------------ allocators */

static void *allocator_main(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 11;
    oblock b[HUNGRY] = {{0}};
    uint64_t seq = 0;
    while (!stopping()) {
        maybe_park();
        uint64_t r = xs(&x);
        oblock *s = &b[r % HUNGRY];
        if (s->ptr) {
            uint64_t d = pat_diff(s->ptr, s->size, s->seed, PAT_SPARSE, 1);
            if (d && s->lost == atomic_load(&lost_swaps))
                bad("allocator: its block %p changed (%llu bytes)", (void *)s->ptr, (unsigned long long)d);
            gp_free(pool, s->ptr);
            s->ptr = NULL;
        } else {
            s->size = (1 + (r >> 8) % 4) * MiB;
            gp_status st;
            s->ptr = gp_alloc(pool, s->size, NULL, hungry_tag, GP_PRIO_HIGH, &st);
            atomic_fetch_add(&n_pressure_allocs, 1);
            if (!s->ptr) {
                if (!may_fail(st)) bad("allocator: %s", gp_last_error());
                continue;
            }
            s->seed = ++seq;
            s->lost = atomic_load(&lost_swaps);
            pat_fill(s->ptr, s->size, s->seed, PAT_SPARSE);
        }
        nap((long)(xs(&x) % 800));
    }
    for (int i = 0; i < HUNGRY; i++)
        if (b[i].ptr) gp_free(pool, b[i].ptr);
    return NULL;
}

/* ---------------------------------------------------------------- faults */

static void *faults_main(void *arg)
{
    static const gp_host_fn fns[] = {GP_HOST_COPY,        GP_HOST_MAP,        GP_HOST_UNMAP,   GP_HOST_EVENT_RECORD,
                                     GP_HOST_EVENT_QUERY, GP_HOST_HOST_ALLOC, GP_HOST_CHECKSUM,
                                     GP_HOST_HOST_POPULATE, GP_HOST_HOST_REGISTER};
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 5;
    while (!stopping()) {
        maybe_park();
        uint64_t r = xs(&x);
        gp_host_fn fn = fns[r % (sizeof fns / sizeof fns[0])];
        gp_host_fail(be, fn, 1 + (r >> 8) % 40, (r >> 16) & 1 ? GP_ERR_OOM : GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
        nap(1000 + (long)(xs(&x) % 4000));
    }
    return NULL;
}

/* ------------------------------------------------------------------- run */

/* A swap out and in, every other thread parked (as a tenant's is), over
 * whatever records the others left.  Out, no live bytes stay on the device
 * but the offloader's own and those it says it kept (their chunks hold
 * some of its own): a prefetch queued before the park has run first; in,
 * every byte it took is back before the threads go
 * on, as a tenant's must be.  A swap out that fails is undone, or says its
 * record stayed (its undo failed too, with the swap's id and the bytes
 * away, as a swap's): then that record comes back
 * accepting the loss, which the owners and the allocators are told of.  A swap
 * in that fails is asked again, the faults disarmed after three tries. */
static void swap_round(void)
{
    uint32_t id;
    gp_offload_result out, in, r;
    gp_error_clear();
    gp_status st = gp_offload_swap_out(off, NULL, &id, &out);
    atomic_fetch_add(&n_swaps, 1);
    if (st != GP_OK) {
        atomic_fetch_add(&n_swap_fail, 1);
        if (!may_fail(st)) bad("a swap out failed with %s: %s", gp_status_str(st), gp_last_error());
        int stayed = strstr(gp_last_error(), "restoring what it had taken failed too") != NULL;
        if (stayed != (id != 0) || stayed != (out.released != 0))
            bad("a swap out that failed %s gave the id %u and %llu bytes away: %s", stayed ? "and stayed" : "undone",
                id, (unsigned long long)out.released, gp_last_error());
        if (!stayed) return;
        /* The allocators' tag is in no other record: its restore brings
         * back the swap's (which fits: it was on the device).  Without
         * the allocators' blocks the record has only the owners', which
         * their own restores find. */
        accepting_for_others(-1);
        atomic_fetch_add(&lost_swaps, 1);
        gp_host_fail_none(be);
        /* (A first restore may pass on a background offload's injected
         * failure instead, restoring nothing: then the next one restores.) */
        gp_status rs = gp_restore_tags(off, &hungry_tag, 1, 1, &r);
        if (rs != GP_OK && may_fail(rs)) rs = gp_restore_tags(off, &hungry_tag, 1, 1, &r);
        if (rs != GP_OK)
            bad("after a swap out that stayed, the restore accepting its loss failed: %s", gp_last_error());
        return;
    }
    static gp_figures f;
    gp_pool_figures(pool, &f, 0);
    gp_tag own;
    CHECK(gp_tag_intern("gpupool", &own) == GP_OK);
    uint64_t on_device = 0;
    for (unsigned t = 0; t < f.n_tags; t++)
        if (t != own && f.tags[t].allocated > f.tags[t].offloaded)
            on_device += f.tags[t].allocated - f.tags[t].offloaded;
    if (on_device > out.kept)
        bad("a swap out returned OK, %llu bytes of its tags are on the device, %llu kept (sharing chunks with "
            "the offloader's own)", (unsigned long long)on_device, (unsigned long long)out.kept);
    memset(&in, 0, sizeof in);
    for (int k = 0; k < 10; k++) {
        if (k == 3) gp_host_fail_none(be);
        gp_error_clear();
        st = gp_offload_swap_in(off, id, &r);
        in.bytes += r.bytes;
        if (st == GP_OK) break;
        atomic_fetch_add(&n_swap_fail, 1);
        if (!may_fail(st)) bad("a swap in failed with %s: %s", gp_status_str(st), gp_last_error());
    }
    if (st != GP_OK) bad("a swap in failed 10 times, the last with no fault armed: %s", gp_last_error());
    else if (in.bytes != out.bytes)
        bad("a swap out took %llu bytes, its swap in brought back %llu", (unsigned long long)out.bytes,
            (unsigned long long)in.bytes);
}

static void quiet_check(void)
{
    atomic_store(&pause_req, 1);
    while (atomic_load(&parked) < atomic_load(&running)) nap(200);
    gp_offload_reclaim(off, 0, 0); /* (waits for the background offloads) */
    char msg[512];
    size_t v = gp_offload_check(off, msg, sizeof msg);
    if (v) bad("gp_offload_check: %zu problems, the first: %s", v, msg);
    v = gp_pool_check(pool, msg, sizeof msg);
    if (v) bad("gp_pool_check: %zu problems, the first: %s", v, msg);
    static uint64_t misuse0;
    static int first = 1;
    uint64_t m = gp_host_misuse(msg, sizeof msg);
    if (first) misuse0 = m, first = 0;
    else if (m != misuse0) bad("backend misuse: %s", msg);
    if (atomic_load(&running)) { /* (not before the threads start, nor at the end) */
        swap_round();
        if ((v = gp_offload_check(off, msg, sizeof msg)))
            bad("after a swap: gp_offload_check: %zu problems, the first: %s", v, msg);
        if ((v = gp_pool_check(pool, msg, sizeof msg)))
            bad("after a swap: gp_pool_check: %zu problems, the first: %s", v, msg);
    }
    atomic_fetch_add(&n_checks, 1);
    atomic_store(&pause_req, 0);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 3;
    int deferred = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "faults") == 0) faults_mode = 1;
        else if (strcmp(argv[i], "deferred") == 0) deferred = 1;
        else {
            fprintf(stderr, "test_offload_stress: unknown mode '%s' (faults, deferred)\n", argv[i]);
            return 2;
        }
    }
    gp_host_misuse(NULL, 0);
    CHECK(gp_backend_host_create(48 * MiB, &be) == GP_OK);
    if (deferred) gp_host_set_deferred(be, 1);
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 256 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.large_chunk = 1 * MiB;
    cfg.cache_slack = -1;
    CHECK(gp_pool_create(be, &cfg, &pool) == GP_OK);
    CHECK(gp_offloader_create(pool, 0, 3, NULL, &off) == GP_OK);
    static const char *names[OWNERS] = {"own0", "own1", "own2", "own3"};
    for (int t = 0; t < OWNERS; t++) {
        CHECK(gp_tag_intern(names[t], &tags[t]) == GP_OK);
        CHECK(gp_offload_register(off, tags[t], t % 2, 2) == GP_OK);
        pthread_mutex_init(&hold[t], NULL);
    }
    CHECK(gp_tag_intern("hungry", &hungry_tag) == GP_OK);
    quiet_check(); /* (the misuse count before) */

    static owner owners[OWNERS];
    pthread_t th[OWNERS + OFFLOADERS + ALLOCATORS + 2];
    int nth = 0;
    for (int t = 0; t < OWNERS; t++) {
        owners[t] = (owner){.t = t, .x = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1) + 1};
        pthread_create(&th[nth++], NULL, owner_main, &owners[t]);
    }
    for (uintptr_t i = 0; i < OFFLOADERS; i++) pthread_create(&th[nth++], NULL, offloader_main, (void *)(i + 1));
    for (uintptr_t i = 0; i < ALLOCATORS; i++) pthread_create(&th[nth++], NULL, allocator_main, (void *)(i + 1));
    pthread_create(&th[nth++], NULL, restorer_main, (void *)1);
    if (faults_mode) pthread_create(&th[nth++], NULL, faults_main, (void *)1);
    atomic_store(&running, nth);
    deadline = now() + seconds;
    while (now() < deadline && atomic_load(&n_bad) == 0) {
        nap(300 * 1000);
        quiet_check();
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
    atomic_store(&running, 0);

    /* The end: no faults, the allocators gone; every owner takes its tag a
     * last time (every byte checked), then frees. */
    gp_host_fail_none(be);
    gp_offload_reclaim(off, 0, 0);
    for (int t = 0; t < OWNERS; t++) {
        owner *w = &owners[t];
        int ok = 0;
        for (int k = 0; k < 3 && !ok; k++) ok = take(w, k == 2); /* (a failure reported late may come first) */
        if (ok) {
            for (int i = 0; i < BLOCKS; i++)
                if (w->b[i].ptr) CHECK(gp_free(pool, w->b[i].ptr) == GP_OK);
            let_go(w);
        }
    }
    quiet_check();
    gp_offload_stats os;
    gp_offload_stats_get(off, &os);
    printf("offload stress%s: %.1f s, %ld offloads (%ld failed), %ld background, %ld restores (%ld failed, %ld "
           "accepting losses), %ld prefetches, %ld high-priority allocations, %llu under pressure, %ld MiB "
           "checked, %ld quiet checks, %ld swaps (%ld swap outs or ins failed)\n",
           faults_mode ? " with faults" : "", seconds, atomic_load(&n_offload), atomic_load(&n_offload_fail),
           atomic_load(&n_background), atomic_load(&n_restore), atomic_load(&n_restore_fail),
           atomic_load(&n_lost_restores), atomic_load(&n_prefetch), atomic_load(&n_pressure_allocs),
           (unsigned long long)os.n_pressure, atomic_load(&n_verified_bytes) >> 20, atomic_load(&n_checks),
           atomic_load(&n_swaps), atomic_load(&n_swap_fail));
    CHECK(atomic_load(&n_bad) == 0);
    CHECK(os.n_offload > 0 && os.n_restore > 0 && atomic_load(&n_swaps) > 0);
    gp_offloader_destroy(off);
    CHECK(pool_consistent(pool, be) == 0);
    gp_pool_destroy(pool);
    char msg[256];
    uint64_t m = gp_host_misuse(msg, sizeof msg);
    (void)m;
    for (int t = 0; t < OWNERS; t++) pthread_mutex_destroy(&hold[t]);
    return check_done();
}
