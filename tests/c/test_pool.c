/*
 * test_pool.c -- unit tests of the pool on the host backend: bins, split and
 * merge, alignment, streams, limits, OOM, bad pointers, injected failures,
 * trimming and reserve mode.  Run under ASan and UBSan by the test suite.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend_forward.h"
#include "pool.h" /* test_debug corrupts a pool on purpose */
#include "pool_check.h"

static void *A(gp_pool *p, size_t n) { return gp_alloc(p, n, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL); }

static void test_basic(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *a = A(p, 1), *b = A(p, 1000), *c = A(p, 3 * MiB + 7);
    CHECK(a && b && c);
    CHECK((uintptr_t)a % 512 == 0 && (uintptr_t)b % 512 == 0 && (uintptr_t)c % 512 == 0);
    memset(a, 1, 1);
    memset(b, 2, 1000);
    memset(c, 3, 3 * MiB + 7);
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    CHECK(s.active_blocks == 3 && s.n_alloc == 3);
    CHECK(s.requested == 1 + 1000 + 3 * MiB + 7);
    CHECK(s.allocated >= s.requested && s.allocated < s.requested + 3 * MiB / 256 + 2048);
    CHECK(s.reserved >= s.allocated);
    CHECK(pool_consistent(p, be) == 0);
    gp_block_info info;
    CHECK(gp_pool_lookup(p, (char *)c + 100, &info) == GP_OK && info.addr == (uintptr_t)c);
    CHECK(info.requested == 3 * MiB + 7 && info.state == GP_BLOCK_USED && info.arena == GP_ARENA_LARGE);
    CHECK(gp_free(p, a) == GP_OK && gp_free(p, b) == GP_OK && gp_free(p, c) == GP_OK);
    gp_pool_stats(p, &s, 1);
    CHECK(s.allocated == 0 && s.requested == 0 && s.active_blocks == 0 && s.n_free == 3);
    CHECK(s.allocated_peak >= 3 * MiB && s.reserved == s.free_bytes);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_reuse_and_merge(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    char *x = A(p, 4096), *y = A(p, 4096), *z = A(p, 4096);
    CHECK(y == x + 4096 && z == y + 4096); /* splits of one free block, in order */
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    gp_free(p, y);
    char *y2 = A(p, 4000);
    CHECK(y2 == y); /* a freed block is reused at once on the same stream */
    gp_free(p, y2);
    gp_free(p, x);
    char *xy = A(p, 8192); /* x and y merged into one block */
    CHECK(xy == x);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.n_map == s0.n_map);                 /* no backend call for any of it */
    CHECK(s1.cache_hits == s0.cache_hits + 2);
    gp_free(p, xy);
    gp_free(p, z);
    gp_pool_stats(p, &s1, 1);
    CHECK(s1.free_blocks == 1); /* everything merged back */
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_bins_many_sizes(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(256 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    enum { N = 400 };
    void *ptr[N];
    size_t sz[N];
    for (int i = 0; i < N; i++) {
        sz[i] = (size_t)1 << (i % 22);
        sz[i] += (size_t)(i * 37) % sz[i];
        ptr[i] = A(p, sz[i]);
        CHECK(ptr[i] != NULL);
    }
    CHECK(pool_consistent(p, be) == 0);
    for (int i = 0; i < N; i += 2) gp_free(p, ptr[i]);
    CHECK(pool_consistent(p, be) == 0);
    gp_stats before, after;
    gp_pool_stats(p, &before, 0);
    /* A freed size is found again without mapping: the request's own class
     * is searched before any larger block is cut. */
    for (int i = 0; i < N; i += 2) {
        CHECK((ptr[i] = A(p, sz[i])) != NULL);
        gp_free(p, ptr[i]);
    }
    gp_pool_stats(p, &after, 0);
    CHECK(after.n_map == before.n_map && after.reserved == before.reserved);
    CHECK(after.cache_hits == before.cache_hits + N / 2);
    CHECK(pool_consistent(p, be) == 0);
    for (int i = 0; i < N; i += 2) CHECK((ptr[i] = A(p, sz[i])) != NULL);
    for (int i = 0; i < N; i++) gp_free(p, ptr[i]);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_bad_pointers(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(16 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    char *a = A(p, 10000), *b = A(p, 10000);
    int local;
    CHECK(gp_free(p, &local) == GP_ERR_FOREIGN);
    CHECK(strstr(gp_last_error(), "did not allocate") != NULL);
    CHECK(gp_free(p, a + 512) == GP_ERR_FOREIGN);
    CHECK(strstr(gp_last_error(), "not at its start") != NULL);
    CHECK(gp_free(p, a) == GP_OK);
    CHECK(gp_free(p, a) == GP_ERR_DOUBLE_FREE);
    CHECK(strstr(gp_last_error(), "freed twice") != NULL);
    CHECK(gp_free(p, NULL) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.active_blocks == 1 && s.n_free == 1);
    gp_status st;
    /* A message wrapping the last one keeps it (it was formatted over itself). */
    gp_error_set(GP_ERR_BACKEND, "inner cause %d", 42);
    gp_error_set(GP_ERR_BACKEND, "outer: %s", gp_last_error());
    CHECK(strcmp(gp_last_error(), "outer: inner cause 42") == 0);
    CHECK(gp_alloc(p, 0, NULL, 0, 1, &st) == NULL && st == GP_ERR_INVALID);
    CHECK(gp_alloc(p, SIZE_MAX, NULL, 0, 1, &st) == NULL && st == GP_ERR_OOM);
    CHECK(strstr(gp_last_error(), "256 TiB") != NULL);
    CHECK(gp_alloc(p, 10, NULL, 0, 999, &st) == NULL && st == GP_ERR_INVALID);
    /* A tag id never interned would break every report of the pool (a
     * block whose tag has no name): refused. */
    gp_tag never[] = {(gp_tag)gp_tag_count(), GP_MAX_TAGS - 1, GP_MAX_TAGS, UINT16_MAX};
    for (int i = 0; i < 4; i++) {
        CHECK(gp_alloc(p, 10, NULL, never[i], GP_PRIO_NORMAL, &st) == NULL && st == GP_ERR_INVALID);
        CHECK(strstr(gp_last_error(), "must be interned") != NULL);
    }
    gp_pool_stats(p, &s, 0);
    CHECK(s.active_blocks == 1);
    gp_free(p, b);
    done(p);
}

static void test_oom_and_trim(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(8 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_status st;
    void *big = gp_alloc(p, 6 * MiB, NULL, 0, 1, &st);
    CHECK(big != NULL);
    void *too = gp_alloc(p, 4 * MiB, NULL, 0, 1, &st);
    CHECK(too == NULL && st == GP_ERR_OOM);
    CHECK(strstr(gp_last_error(), "out of memory") != NULL);
    char report[GP_OOM_REPORT_MAX];
    CHECK(gp_pool_last_oom(p, report, sizeof report) == strlen(report));
    CHECK(strstr(report, "largest free block") != NULL && strcmp(report, gp_last_error()) == 0);
    char part[8];
    CHECK(gp_pool_last_oom(p, part, sizeof part) == strlen(report) && strlen(part) == 7);
    CHECK(pool_consistent(p, be) == 0);
    /* Small blocks fill a chunk of the small arena; once freed, that cached
     * chunk is what the next large request needs: the pool trims and retries. */
    void *small = A(p, 1000);
    CHECK(small != NULL);
    gp_free(p, small);
    gp_free(p, big);
    void *again = gp_alloc(p, 8 * MiB, NULL, 0, 1, &st);
    CHECK(again != NULL);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.n_oom == 1 && s.n_alloc_retries >= 1 && s.reserved == 8 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, again);
    uint64_t freed = gp_pool_empty_cache(p);
    gp_pool_stats(p, &s, 0);
    CHECK(freed == 8 * MiB && s.reserved == 0);
    gp_host_counters c;
    gp_host_counters_get(be, &c);
    CHECK(c.mapped == 0 && s.n_sync_pool >= 1);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_trim_keeps_live_data(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    enum { N = 64 };
    char *ptr[N];
    for (int i = 0; i < N; i++) {
        ptr[i] = A(p, 200 * KiB);
        memset(ptr[i], i, 200 * KiB);
    }
    for (int i = 0; i < N; i++)
        if (i % 4) gp_free(p, ptr[i]);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    uint64_t freed = gp_pool_empty_cache(p);
    gp_pool_stats(p, &s1, 0);
    CHECK(freed > 0 && s1.reserved == s0.reserved - freed);
    /* Each live block keeps at most the chunks it touches (two). */
    CHECK(s1.reserved <= (N / 4) * 2 * 256 * KiB);
    for (int i = 0; i < N; i += 4) {
        int ok = 1;
        for (size_t k = 0; k < 200 * KiB; k++) ok &= ptr[i][k] == (char)i;
        CHECK(ok);
    }
    CHECK(pool_consistent(p, be) == 0);
    /* The holes are mapped again on demand. */
    char *q = A(p, 10 * MiB);
    CHECK(q != NULL);
    memset(q, 7, 10 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_limits(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_pool_set_limit(p, 4 * MiB);
    gp_status st;
    void *a = gp_alloc(p, 3 * MiB, NULL, 0, 1, &st);
    CHECK(a != NULL);
    CHECK(gp_alloc(p, 2 * MiB, NULL, 0, 1, &st) == NULL && st == GP_ERR_LIMIT);
    CHECK(strstr(gp_last_error(), "limit") != NULL);
    gp_pool_set_limit(p, 0);
    void *b = gp_alloc(p, 2 * MiB, NULL, 0, 1, &st);
    CHECK(b != NULL);

    gp_tag t;
    CHECK(gp_tag_intern("kv_cache", &t) == GP_OK);
    CHECK(gp_pool_set_tag_limit(p, t, 1 * MiB) == GP_OK);
    void *k1 = gp_alloc(p, 600 * KiB, NULL, t, 1, &st);
    CHECK(k1 != NULL);
    CHECK(gp_alloc(p, 600 * KiB, NULL, t, 1, &st) == NULL && st == GP_ERR_LIMIT);
    CHECK(strstr(gp_last_error(), "kv_cache") != NULL);
    gp_tag_stats ts;
    gp_pool_tag_stats(p, t, &ts);
    CHECK(ts.allocated >= 600 * KiB && ts.active_blocks == 1 && ts.limit == 1 * MiB);
    void *u = gp_alloc(p, 600 * KiB, NULL, GP_TAG_UNTAGGED, 1, &st); /* other tags unaffected */
    CHECK(u != NULL);
    CHECK(gp_pool_set_tag_limit(p, 1000, 1) == GP_ERR_INVALID);
    gp_free(p, k1);
    gp_pool_tag_stats(p, t, &ts);
    CHECK(ts.allocated == 0 && ts.allocated_peak >= 600 * KiB);
    uint64_t pa, pp;
    gp_pool_prio_stats(p, 1, &pa, &pp);
    CHECK(pa > 0 && pp >= pa);
    gp_pool_reset_peaks(p);
    gp_pool_tag_stats(p, t, &ts);
    CHECK(ts.allocated_peak == 0);
    gp_free(p, a);
    gp_free(p, b);
    gp_free(p, u);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_streams(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_stream s1 = (gp_stream)0x1000, s2 = (gp_stream)0x2000;
    gp_status st;
    void *a = gp_alloc(p, 1 * MiB, s1, 0, 1, &st);
    gp_free(p, a);
    gp_host_counters c0, c1;
    gp_host_counters_get(be, &c0);
    /* Same stream: reused with no wait at all. */
    void *b = gp_alloc(p, 1 * MiB, s1, 0, 1, &st);
    CHECK(b == a);
    gp_host_counters_get(be, &c1);
    CHECK(c1.n_stream_wait == c0.n_stream_wait && c1.n_map == c0.n_map);
    gp_free(p, b);
    /* Another stream: reused only after it was made to wait for s1. */
    void *c = gp_alloc(p, 1 * MiB, s2, 0, 1, &st);
    CHECK(c == a);
    gp_host_counters_get(be, &c1);
    CHECK(c1.n_stream_wait == c0.n_stream_wait + 1 && c1.n_map == c0.n_map);
    gp_block_info info;
    CHECK(gp_pool_lookup(p, c, &info) == GP_OK && info.stream == s2);
    gp_free(p, c);
    /* Free blocks of different streams do not merge. */
    void *x = gp_alloc(p, 64 * KiB, s1, 0, 1, &st), *y = gp_alloc(p, 64 * KiB, s2, 0, 1, &st);
    CHECK(x && y);
    gp_free(p, x);
    gp_free(p, y);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_injected_failures(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *keep = A(p, 100 * KiB);
    gp_status st;
    /* Fail the 3rd chunk of a 1 MiB (4-chunk) growth: the two mapped ones
     * are rolled back, the pool is as before, and the error says why. */
    gp_host_fail(be, GP_HOST_MAP, 3, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    CHECK(gp_alloc(p, 1 * MiB, NULL, 0, 1, &st) == NULL && st == GP_ERR_BACKEND);
    CHECK(strstr(gp_last_error(), "injected") != NULL);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.reserved == s0.reserved && s1.n_map_fail == 1);
    CHECK(pool_consistent(p, be) == 0);
    void *ok = A(p, 1 * MiB);
    CHECK(ok != NULL);
    /* An injected OOM is answered by trimming and a retry. */
    gp_free(p, ok);
    gp_host_fail(be, GP_HOST_MAP, 1, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
    void *big = A(p, 2 * MiB);
    CHECK(big != NULL);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.n_alloc_retries == 1);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, big);
    gp_free(p, keep);
    done(p);

    /* A failure while creating a reserve-mode pool is reported at creation. */
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.mode = GP_MODE_RESERVE;
    cfg.reserve = (gp_size_spec){.bytes = 32 * MiB};
    CHECK(gp_backend_host_create(16 * MiB, &be) == GP_OK);
    CHECK(gp_pool_create(be, &cfg, &p) == GP_ERR_OOM && p == NULL);
    CHECK(strstr(gp_last_error(), "reserve") != NULL);
}

/* A pool whose creation fails frees what it had made (LeakSanitizer
 * checks): the chunk table of an arena whose reservation failed too. */
static void test_create_failure_leaks_nothing(void)
{
    for (int nth = 1; nth <= 2; nth++) {
        gp_config cfg;
        gp_config_default(&cfg);
        gp_backend *be;
        CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
        /* the small arena's, then the large one's */
        gp_host_fail(be, GP_HOST_RESERVE, (uint64_t)nth, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
        gp_pool *p = (gp_pool *)&cfg;
        CHECK(gp_pool_create(be, &cfg, &p) == GP_ERR_OOM && p == NULL);
        CHECK(strstr(gp_last_error(), "host reserve: injected failure") != NULL);
    }
}

/* An unmap that fails keeps its chunk mapped in the backend: the pool
 * must keep it too (as reserved memory it can use and release later), or
 * that physical memory is lost for good -- here while a failed growth is
 * rolled back, and while a trim releases a block. */
static void test_failed_unmap_keeps_the_chunk(void)
{
    gp_backend *be;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = cfg.large_chunk = 256 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.cache_slack = -1;
    gp_pool *p;
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    void *keep = A(p, 100 * KiB);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    /* The 3rd chunk of a 1 MiB growth fails; rolling back, the unmap of the
     * 1st one fails too. */
    gp_host_fail(be, GP_HOST_MAP, 3, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_host_fail(be, GP_HOST_UNMAP, 2, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    gp_status st;
    CHECK(gp_alloc(p, 1 * MiB, NULL, 0, 1, &st) == NULL && st == GP_ERR_BACKEND);
    CHECK(strstr(gp_last_error(), "injected") != NULL);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.reserved == s0.reserved + 256 * KiB && s1.allocated == s0.allocated);
    CHECK(pool_consistent(p, be) == 0);
    /* The chunk is cache: the next growth uses it and maps the rest. */
    char *x = A(p, 1 * MiB);
    CHECK(x != NULL);
    gp_stats s2;
    gp_pool_stats(p, &s2, 0);
    CHECK(s2.reserved == s0.reserved + 1 * MiB && s2.n_map == s1.n_map + 3);
    memset(x, 1, 1 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, x);

    /* A trim whose 2nd unmap fails: the first chunk goes, the rest stays
     * mapped and cached, and the next trim gives it back. */
    gp_host_fail(be, GP_HOST_UNMAP, 2, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    uint64_t freed = gp_pool_empty_cache(p);
    CHECK(freed == 256 * KiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_pool_stats(p, &s2, 0);
    CHECK(s2.reserved == s0.reserved + 768 * KiB);
    CHECK(gp_pool_empty_cache(p) == 768 * KiB);
    gp_pool_stats(p, &s2, 0);
    CHECK(s2.reserved == s0.reserved && pool_consistent(p, be) == 0);
    gp_free(p, keep);
    done(p);
}

/* A request that cannot fit fails from the figures, mapping nothing: it
 * used to map chunk by chunk up to the device's capacity, unmap it all, and
 * do so three times (0.47 s on a 1 GiB pool of 64 KiB chunks).  And its
 * cache stays: trimming could not have made it fit. */
static void test_hopeless_request_fails_fast(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(1024 * MiB, 64 * KiB, GP_MODE_EXPANDABLE, &be);
    void *live = A(p, 512 * MiB), *cached = A(p, 128 * MiB), *sep = A(p, 64 * KiB);
    CHECK(live && cached && sep);
    gp_free(p, cached);
    gp_host_counters c0, c1;
    gp_host_counters_get(be, &c0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gp_status st;
    CHECK(gp_alloc(p, 768 * MiB, NULL, 0, 1, &st) == NULL); /* free 384 MiB + cached 128 */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gp_host_counters_get(be, &c1);
    printf("a failing 768 MiB request on a 1 GiB pool of 64 KiB chunks: %.3f ms, %llu maps, %llu unmaps, "
           "%llu syncs\n", (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
           (unsigned long long)(c1.n_map - c0.n_map), (unsigned long long)(c1.n_unmap - c0.n_unmap),
           (unsigned long long)(c1.n_sync - c0.n_sync));
    CHECK(st == GP_ERR_OOM && strstr(gp_last_error(), "device lacks") != NULL);
    CHECK(c1.n_map == c0.n_map && c1.n_unmap == c0.n_unmap && c1.n_sync == c0.n_sync &&
          c1.calls[GP_HOST_EVENT_WAIT] == c0.calls[GP_HOST_EVENT_WAIT]);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == 640 * MiB + 64 * KiB);
    /* One that fits once the cache goes: released, then mapped. */
    void *x = A(p, 500 * MiB);
    CHECK(x != NULL);
    gp_host_counters_get(be, &c1);
    gp_pool_stats(p, &s, 0);
    CHECK(s.n_map_fail == 0 && c1.n_sync == c0.n_sync && c1.calls[GP_HOST_EVENT_WAIT] > c0.calls[GP_HOST_EVENT_WAIT]);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, x);
    gp_free(p, live);
    gp_free(p, sep);
    done(p);
}

/* fork() while another thread holds the pool's lock (here: a walk, whose
 * callback runs under it): the child must not find the lock held forever,
 * and a pool made before the fork must refuse its use with a clear error
 * (its device memory is the parent's); a pool made in the child works. */
static atomic_int walker_inside;
static int slow_visit(void *arg, const gp_block_info *b)
{
    (void)arg;
    (void)b;
    atomic_store(&walker_inside, 1);
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    return 1;
}

static void *walker(void *p)
{
    gp_pool_walk(p, slow_visit, NULL);
    return NULL;
}

static int forked_error(gp_status st)
{
    return st == GP_ERR_INVALID && strstr(gp_last_error(), "forked child") != NULL &&
           strstr(gp_last_error(), "spawn") != NULL;
}

static void test_fork(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *x = A(p, 4096);
    pthread_t t;
    atomic_store(&walker_inside, 0);
    CHECK(pthread_create(&t, NULL, walker, p) == 0);
    while (!atomic_load(&walker_inside)) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5); /* a lock left held: the child dies of SIGALRM */
        gp_status st;
        int ok = 1;
        ok &= gp_alloc(p, 4096, NULL, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st) == NULL && forked_error(st);
        ok &= forked_error(gp_free(p, x));
        ok &= forked_error(gp_record_stream(p, x, (gp_stream)0x10));
        ok &= forked_error(gp_pool_capture_prepare(p, NULL));
        ok &= forked_error(gp_pool_retag(p, &x, 1, GP_TAG_UNTAGGED, GP_PRIO_DEFAULT, NULL));
        ok &= gp_pool_trim(p, UINT64_MAX) == 0 && forked_error(GP_ERR_INVALID);
        gp_stats s; /* what the pool says of itself is still there */
        gp_pool_stats(p, &s, 1);
        ok &= s.active_blocks == 1 && gp_pool_check(p, NULL, 0) == 0;
        gp_pool *q = make_pool(16 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, NULL);
        void *y = A(q, 4096);
        ok &= y != NULL && gp_free(q, y) == GP_OK && gp_pool_check(q, NULL, 0) == 0;
        gp_pool_destroy(q);
        gp_pool_destroy(p); /* the parent's: host memory only, no device call */
        if (!ok) fprintf(stderr, "forked child: %s\n", gp_last_error());
        _exit(ok ? 0 : 1);
    }
    CHECK(pid > 0);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WIFSIGNALED(status)) fprintf(stderr, "forked child killed by signal %d\n", WTERMSIG(status));
    pthread_join(t, NULL);
    CHECK(gp_free(p, x) == GP_OK); /* the parent's pool is its own */
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

/* GPUPOOL_DEBUG: in a child process, a pool with `debug`, corrupted or not
 * (a figure off by 512 bytes), makes `ops` allocations and frees; returns
 * how the child ended, its stderr in `err` and how many it made in *made. */
static int debug_child(int debug, int corrupt, int ops, char *err, size_t n, int *made)
{
    int pe[2], po[2];
    if (pipe(pe) || pipe(po)) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pe[1], 2);
        close(pe[0]);
        close(po[0]);
        gp_config cfg;
        gp_config_default(&cfg);
        cfg.debug = debug;
        gp_backend *be;
        gp_pool *p;
        if (gp_backend_host_create(16 * MiB, &be) != GP_OK || gp_pool_create(be, &cfg, &p) != GP_OK) _exit(2);
        if (corrupt) p->st.requested += 512;
        void *keep = A(p, 1000);
        for (int i = 1; i < ops; i++) {
            if (i % 2) keep = A(p, (size_t)i * 100);
            else gp_free(p, keep);
            if (write(po[1], &i, sizeof i) != sizeof i) _exit(3);
        }
        _exit(0);
    }
    close(pe[1]);
    close(po[1]);
    int i, status = 0;
    *made = 0;
    while (read(po[0], &i, sizeof i) == sizeof i) *made = i + 1;
    ssize_t got = read(pe[0], err, n - 1);
    err[got > 0 ? got : 0] = '\0';
    close(pe[0]);
    close(po[0]);
    waitpid(pid, &status, 0);
    return status;
}

static void test_debug(void)
{
    char err[1024];
    int made;
    /* Consistent: the checks pass, thousands of operations run. */
    int st = debug_child(1, 0, 20 * GP_DEBUG_EVERY, err, sizeof err, &made);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && made == 20 * GP_DEBUG_EVERY && err[0] == '\0');
    /* Corrupt: the check runs at the GP_DEBUG_EVERY-th operation, names
     * the violation and aborts. */
    st = debug_child(1, 1, 20 * GP_DEBUG_EVERY, err, sizeof err, &made);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && made == GP_DEBUG_EVERY - 1);
    char after[64];
    snprintf(after, sizeof after, "after %d allocations", GP_DEBUG_EVERY);
    CHECK(strstr(err, "GPUPOOL_DEBUG") && strstr(err, "requested says") && strstr(err, after));
    /* Without GPUPOOL_DEBUG nothing is checked. */
    st = debug_child(0, 1, 20 * GP_DEBUG_EVERY, err, sizeof err, &made);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && made == 20 * GP_DEBUG_EVERY);
}

static uint64_t pressure_calls;
static uint64_t pressure_fn(void *arg, gp_pool *pool, uint64_t needed, int prio)
{
    (void)pool;
    (void)prio;
    pressure_calls++;
    void **victim = arg;
    if (!*victim) return 0;
    gp_free(pool, *victim); /* the layer above gives memory back */
    *victim = NULL;
    return needed;
}

static void test_pressure(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(8 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    /* The callback is asked only for memory of a lower priority than the
     * request's: a peer's is not given up. */
    void *victim = A(p, 5 * MiB);
    gp_pool_set_pressure(p, pressure_fn, &victim);
    CHECK(A(p, 5 * MiB) == NULL && victim != NULL && pressure_calls == 0);
    gp_free(p, victim);
    victim = gp_alloc(p, 5 * MiB, NULL, GP_TAG_UNTAGGED, GP_PRIO_LOW, NULL);
    void *x = A(p, 5 * MiB);
    CHECK(x != NULL && victim == NULL && pressure_calls == 1);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, x);
    done(p);
}

static void test_reserve_mode(void)
{
    gp_backend *be;
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.mode = GP_MODE_RESERVE;
    cfg.reserve = (gp_size_spec){.fraction = 0.5};
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    gp_pool *p;
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    CHECK(s0.reserved == 32 * MiB);
    void *v[64];
    for (int i = 0; i < 64; i++) CHECK((v[i] = A(p, (size_t)(i + 1) * 4 * KiB)) != NULL);
    for (int i = 0; i < 64; i += 2) gp_free(p, v[i]);
    CHECK(gp_pool_empty_cache(p) == 0); /* reserve mode never gives back */
    gp_status st;
    CHECK(gp_alloc(p, 40 * MiB, NULL, 0, 1, &st) == NULL && st == GP_ERR_OOM);
    CHECK(strstr(gp_last_error(), "reserve") != NULL);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.n_map == s0.n_map && s1.n_unmap == 0 && s1.reserved == 32 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    for (int i = 1; i < 64; i += 2) gp_free(p, v[i]);
    done(p);
}

/* Reserve mode maps whole chunks: a limit below one is refused at creation
 * (it used to map a chunk past it). */
static void test_reserve_limit_below_a_chunk(void)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.mode = GP_MODE_RESERVE;
    cfg.chunk = 2 * MiB;
    cfg.limit = (gp_size_spec){.bytes = 1 * MiB};
    gp_backend *be;
    gp_pool *p = NULL;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    gp_status st = gp_pool_create(be, &cfg, &p);
    CHECK(st == GP_ERR_INVALID && p == NULL);
    CHECK(strstr(gp_last_error(), "limit of 1048576 bytes") != NULL && strstr(gp_last_error(), "2097152") != NULL);
    if (p) gp_pool_destroy(p);
    /* One chunk exactly is a pool of one chunk. */
    cfg.limit = (gp_size_spec){.bytes = 2 * MiB};
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == 2 * MiB);
    done(p);
}

static void test_tags(void)
{
    gp_tag a, b, c;
    CHECK(gp_tag_intern("weights", &a) == GP_OK);
    CHECK(gp_tag_intern("weights", &b) == GP_OK && a == b);
    CHECK(gp_tag_intern("untagged", &c) == GP_OK && c == GP_TAG_UNTAGGED);
    CHECK(strcmp(gp_tag_name(a), "weights") == 0);
    CHECK(gp_tag_intern("", &c) == GP_ERR_INVALID);
    CHECK(gp_tag_intern("has space", &c) == GP_ERR_INVALID);
    CHECK(gp_tag_name(GP_MAX_TAGS - 1) == NULL);
    char name[32];
    gp_status st = GP_OK;
    for (int i = 0; st == GP_OK && i < 2 * GP_MAX_TAGS; i++) {
        snprintf(name, sizeof name, "t%d", i);
        st = gp_tag_intern(name, &c);
    }
    CHECK(st == GP_ERR_TOO_MANY && gp_tag_count() == GP_MAX_TAGS);
    CHECK(strstr(gp_last_error(), "1024") != NULL);
    int prio;
    CHECK(gp_parse_priority("high", &prio) == GP_OK && prio == GP_PRIO_HIGH);
}

/* The growth and trim tests' pool on `be`: 1 MiB chunks for blocks of 64
 * KiB and up; `slack` (a cache slack) is set unless NULL. */
static gp_pool *slack_pool(gp_backend *be, const double *slack)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 256 * KiB;
    cfg.large_chunk = 1 * MiB;
    cfg.small_size = 64 * KiB;
    if (slack) cfg.cache_slack = *slack;
    gp_pool *p = NULL;
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    return p;
}

static gp_pool *trim_pool(gp_backend *be) { return slack_pool(be, NULL); }

/* Two 8 MiB holes between 1 MiB live blocks, then a 12 MiB request that
 * fits neither: with a cache slack the holes' chunks are given back before
 * the pool maps anew, so reserved stays near allocated; without, the pool
 * maps 12 MiB beside 16 MiB of cache.  Returns the stats after it. */
static gp_stats lean_growth(double slack)
{
    gp_backend *be;
    gp_stats s0, s;
    CHECK(gp_backend_host_create(256 * MiB, &be) == GP_OK);
    gp_pool *p = slack_pool(be, &slack);
    void *a = A(p, 8 * MiB), *s1 = A(p, 1 * MiB), *b = A(p, 8 * MiB), *s2 = A(p, 1 * MiB);
    CHECK(a && s1 && b && s2);
    memset(s1, 0x5a, 1 * MiB);
    memset(s2, 0xa5, 1 * MiB);
    gp_free(p, a);
    gp_free(p, b);
    gp_pool_stats(p, &s0, 0);
    CHECK(s0.reserved == 18 * MiB && s0.allocated == 2 * MiB);
    char *c = A(p, 12 * MiB);
    CHECK(c != NULL);
    memset(c, 0x11, 12 * MiB);
    CHECK(((unsigned char *)s1)[0] == 0x5a && ((unsigned char *)s1)[MiB - 1] == 0x5a);
    CHECK(((unsigned char *)s2)[0] == 0xa5 && ((unsigned char *)s2)[MiB - 1] == 0xa5);
    CHECK(pool_consistent(p, be) == 0);
    gp_pool_stats(p, &s, 0);
    /* The 12 MiB were mapped in 1 MiB units of the large arena. */
    CHECK(s.n_map - s0.n_map == 12);
    s.n_sync -= s0.n_sync;
    s.n_unmap -= s0.n_unmap;
    gp_free(p, c);
    gp_free(p, s1);
    gp_free(p, s2);
    done(p);
    return s;
}

/* fork() while another thread interns a tag: the child must not find the
 * tag table's lock held for ever.  Run after test_tags, which fills the
 * table: interning its last name scans all of it under the lock, so a
 * thread doing that in a loop holds the lock nearly all the time. */
static atomic_int interning;

static void *intern_loop(void *arg)
{
    const char *name = arg;
    gp_tag t;
    while (atomic_load(&interning)) (void)gp_tag_intern(name, &t);
    return NULL;
}

static void test_fork_while_interning(void)
{
    const char *name = gp_tag_name(GP_MAX_TAGS - 1);
    CHECK(name != NULL);
    if (!name) return;
    pthread_t t;
    atomic_store(&interning, 1);
    CHECK(pthread_create(&t, NULL, intern_loop, (void *)name) == 0);
    int stuck = 0;
    for (int i = 0; i < 40; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(5); /* the lock left held: the child dies of SIGALRM */
            gp_tag x;
            _exit(gp_tag_intern(name, &x) == GP_OK && x == GP_MAX_TAGS - 1 ? 0 : 1);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) stuck++;
    }
    CHECK(stuck == 0);
    atomic_store(&interning, 0);
    pthread_join(t, NULL);
}

static void test_lean_growth(void)
{
    gp_stats lean = lean_growth(0.05), fat = lean_growth(-1);
    CHECK(lean.allocated == 14 * MiB && lean.reserved == 14 * MiB);
    CHECK(lean.n_sync == 0 && lean.n_sync_pool == 1 && lean.n_unmap == 16);
    CHECK(fat.allocated == 14 * MiB && fat.reserved == 30 * MiB);
    CHECK(fat.n_sync == 0 && fat.n_sync_pool == 0 && fat.n_unmap == 0);
    /* A slack of 100% keeps up to 14 MiB of cache: 2 MiB too many, so two
     * chunks of a hole go, not the whole hole (the next step would map it
     * again), and the rest stays. */
    gp_stats roomy = lean_growth(1.0);
    CHECK(roomy.reserved == 28 * MiB && roomy.n_sync_pool == 1 && roomy.n_unmap == 2);
}

/* A growth that extends a free block into the unmapped space after it maps
 * only what that block lacks, and the slack's trim keeps the block: a live
 * 1 MiB block, a 4 MiB block freed after it (its stream has not run past
 * it), then 6 MiB asked for with no slack.  The space after the block is
 * the arena's unmapped rest, or (`gap`) a 2 MiB gap a trim left before
 * another live block: the 4 MiB and the gap make the 6.  Trimming the
 * block first (as growths did) waited for the stream, unmapped its 4
 * chunks and mapped them again at the same addresses with 2 more.  Under
 * a limit that leaves room for the 2 MiB only, the same; under one that
 * does not, the request fails and the block stays cached.  Returns the
 * stats after it, less those before (reserved: what it added). */
static gp_stats extend_growth(int gap, uint64_t limit, void **got, void **freed)
{
    gp_backend *be;
    gp_stats s0, s;
    const double zero = 0;
    CHECK(gp_backend_host_create(256 * MiB, &be) == GP_OK);
    gp_pool *p = slack_pool(be, &zero);
    void *live = A(p, 1 * MiB), *t = A(p, 4 * MiB), *g = gap ? A(p, 2 * MiB) : NULL, *end = gap ? A(p, MiB) : NULL;
    CHECK(live && t && (char *)t == (char *)live + MiB && (!gap || (g && end)));
    memset(live, 0x3c, MiB);
    if (gap) {
        gp_free(p, g);
        CHECK(gp_pool_trim(p, 2 * MiB) == 2 * MiB);
    }
    gp_free(p, t);
    gp_pool_set_limit(p, limit);
    gp_pool_stats(p, &s0, 0);
    CHECK(s0.reserved == (gap ? 6 : 5) * MiB && s0.allocated == (gap ? 2 : 1) * MiB);
    char *c = A(p, 6 * MiB);
    if (c) memset(c, 0x11, 6 * MiB);
    CHECK(((unsigned char *)live)[MiB - 1] == 0x3c);
    CHECK(pool_consistent(p, be) == 0);
    gp_pool_stats(p, &s, 0);
    s.reserved -= s0.reserved;
    s.n_map -= s0.n_map;
    s.n_unmap -= s0.n_unmap;
    s.n_sync += s.n_sync_pool - s0.n_sync - s0.n_sync_pool;
    *got = c;
    *freed = t;
    if (c) gp_free(p, c);
    if (end) gp_free(p, end);
    gp_free(p, live);
    done(p);
    return s;
}

static void test_growth_keeps_the_block_it_extends(void)
{
    for (int gap = 0; gap < 2; gap++) {
        void *c, *t;
        uint64_t before = (gap ? 6 : 5) * MiB;
        gp_stats s = extend_growth(gap, 0, &c, &t);
        CHECK(c == t && s.reserved == 2 * MiB && s.n_map == 2 && s.n_unmap == 0 && s.n_sync == 0);
        s = extend_growth(gap, before + 2 * MiB, &c, &t);
        CHECK(c == t && s.reserved == 2 * MiB && s.n_map == 2 && s.n_unmap == 0 && s.n_sync == 0);
        s = extend_growth(gap, before + 1 * MiB + 512 * KiB, &c, &t);
        CHECK(c == NULL && s.reserved == 0 && s.n_map == 0 && s.n_unmap == 0);
    }
}

/* Cache given back without a device sync (gp_trim_idle): only blocks freed
 * before a fence that has completed.  An 8 MiB hole freed before the fence
 * goes once its stream has run past it; one freed after stays (its stream
 * may still use it) until the stream has run past the next fence. */
static void test_trim_without_sync(void)
{
    gp_backend *be;
    CHECK(gp_backend_host_create(256 * MiB, &be) == GP_OK);
    gp_pool *p = trim_pool(be);
    void *a = A(p, 8 * MiB), *s1 = A(p, 1 * MiB), *b = A(p, 8 * MiB), *s2 = A(p, 1 * MiB);
    CHECK(a && s1 && b && s2);
    gp_free(p, a);
    gp_stats s0, s;
    gp_pool_stats(p, &s0, 0);
    pthread_mutex_lock(&p->lock);
    CHECK(gp_trim_idle(p, NULL, UINT64_MAX, GP_PRIO_MAX) == 0); /* (the fence is recorded; its stream runs) */
    pthread_mutex_unlock(&p->lock);
    gp_host_stream_complete(be, NULL);
    gp_free(p, b);
    pthread_mutex_lock(&p->lock);
    uint64_t got = gp_trim_idle(p, NULL, UINT64_MAX, GP_PRIO_MAX);
    pthread_mutex_unlock(&p->lock);
    gp_pool_stats(p, &s, 0);
    CHECK(got == 8 * MiB && s.reserved == s0.reserved - 8 * MiB && s.n_sync == s0.n_sync);
    gp_host_stream_complete(be, NULL);
    pthread_mutex_lock(&p->lock);
    got = gp_trim_idle(p, NULL, UINT64_MAX, GP_PRIO_MAX);
    pthread_mutex_unlock(&p->lock);
    gp_pool_stats(p, &s, 0);
    CHECK(got == 8 * MiB && s.reserved == s0.reserved - 16 * MiB && s.n_sync == s0.n_sync);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, s1);
    gp_free(p, s2);
    done(p);
}

/* The allocating threads' time: what they waited for the lock
 * (ns_lock_wait) and spent past the cache (ns_slow); a cache hit adds to
 * neither. */
static atomic_int lock_held;

static void *hold_lock(void *arg)
{
    gp_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    atomic_store(&lock_held, 1);
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void test_alloc_time(void)
{
    gp_config cfg;
    gp_config_default(&cfg);
    gp_backend *be;
    gp_pool *p;
    CHECK(gp_backend_host_create(256 * MiB, &be) == GP_OK);
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    gp_stats s0, s1, s2;
    gp_pool_stats(p, &s0, 0);
    void *x = A(p, 4 * MiB); /* (grows) */
    gp_free(p, x);
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.ns_slow > s0.ns_slow && s1.ns_lock_wait == 0);
    x = A(p, 4 * MiB); /* (a hit) */
    gp_free(p, x);
    gp_pool_stats(p, &s2, 0);
    CHECK(s2.ns_slow == s1.ns_slow);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, hold_lock, p) == 0);
    while (!atomic_load(&lock_held)) sched_yield();
    x = A(p, 4 * MiB);
    pthread_join(t, NULL);
    gp_free(p, x);
    gp_pool_stats(p, &s2, 0);
    CHECK(s2.ns_lock_wait >= 1000 * 1000); /* (held 30 ms from before we asked) */
    done(p);
}

/* A restore's trim (gp_trim_slack_unlocked, on a thread that does not
 * allocate) makes its unmaps and its device sync without the pool's lock:
 * held, it stopped every allocation of the training thread for their
 * length.  The backend asks, in each call, whether the lock is free, and
 * checks the pool meanwhile (the chunks being unmapped are in transit). */
static gp_pool *unlocked_pool;
static int calls_unlocked, calls_locked, violations_unlocked;

static void note_lock(void)
{
    if (!unlocked_pool) return;
    if (pthread_mutex_trylock(&unlocked_pool->lock) != 0) {
        calls_locked++;
        return;
    }
    pthread_mutex_unlock(&unlocked_pool->lock);
    calls_unlocked++;
    char msg[256];
    if (gp_pool_check(unlocked_pool, msg, sizeof msg)) {
        violations_unlocked++;
        fprintf(stderr, "pool corrupt during an unlocked trim: %s\n", msg);
    }
}

static gp_status noting_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    note_lock();
    return GP_INNER(be)->unmap(GP_INNER(be), addr, size, handle);
}

static gp_status noting_sync(gp_backend *be)
{
    note_lock();
    return GP_INNER(be)->synchronize(GP_INNER(be));
}

static gp_status noting_event_wait(gp_backend *be, uint64_t event)
{
    note_lock();
    return GP_INNER(be)->event_wait(GP_INNER(be), event);
}

/* A host backend of 256 MiB (*host) behind a wrapper whose calls a test
 * replaces; the pool made on it destroys both. */
static gp_backend_wrap *wrapped_host(gp_backend **host)
{
    CHECK(gp_backend_host_create(256 * MiB, host) == GP_OK);
    gp_backend_wrap *w = calloc(1, sizeof *w);
    CHECK(w != NULL);
    gp_backend_forward(w, *host);
    return w;
}

static void test_trim_unlocked(void)
{
    gp_backend *host;
    gp_backend_wrap *w = wrapped_host(&host);
    w->be.unmap = noting_unmap;
    w->be.synchronize = noting_sync;
    w->be.event_wait = noting_event_wait;
    gp_pool *p = trim_pool(&w->be);
    void *a = A(p, 8 * MiB), *s1 = A(p, 1 * MiB), *b = A(p, 8 * MiB), *s2 = A(p, 1 * MiB);
    CHECK(a && s1 && b && s2);
    gp_free(p, a);
    gp_free(p, b);
    gp_stats s0, s;
    gp_pool_stats(p, &s0, 0);
    /* No fence has completed: the cache is not known idle, so the trim
     * waits for the pool's one stream first (without the lock too), then
     * unmaps both holes. */
    unlocked_pool = p;
    gp_trim_slack_unlocked(p, 16 * MiB, 0, GP_PRIO_MAX, 0, 16 * MiB);
    unlocked_pool = NULL;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == s0.reserved - 16 * MiB);
    CHECK(s.n_sync == s0.n_sync && s.n_sync_pool == s0.n_sync_pool + 1 && s.n_unmap == s0.n_unmap + 16);
    CHECK(calls_unlocked == 17 && calls_locked == 0 && violations_unlocked == 0);
    CHECK(pool_consistent(p, host) == 0);
    /* What it released serves the next growth as any unmapped space. */
    void *c = A(p, 16 * MiB);
    CHECK(c != NULL && pool_consistent(p, host) == 0);
    gp_free(p, c);
    gp_free(p, s1);
    gp_free(p, s2);
    done(p);
}

/* A trim that must wait for cache in use waits for the pool's own streams
 * (an event on each: the slots' and those record_stream named), not for
 * the device: a device sync also waits for the streams of others (the
 * offloader's copies beside a training step), under the lock.  It syncs
 * the device only where no fence can be had: an event refused, a wait
 * that fails, a pending block whose event could not be recorded. */
enum { FENCE_STREAMS = 8 };
static gp_stream fence_of[64];  /* the stream of each host event (by id) */
static gp_stream fence_waited[FENCE_STREAMS];
static unsigned n_fence_waited;

static gp_status fence_event_record(gp_backend *be, gp_stream s, uint64_t *ev)
{
    gp_status st = GP_INNER(be)->event_record(GP_INNER(be), s, ev);
    if (st == GP_OK && *ev < 64) fence_of[*ev] = s;
    return st;
}

static gp_status fence_event_wait(gp_backend *be, uint64_t ev)
{
    if (n_fence_waited < FENCE_STREAMS && ev < 64) fence_waited[n_fence_waited++] = fence_of[ev];
    return GP_INNER(be)->event_wait(GP_INNER(be), ev);
}

static int fence_waited_on(gp_stream s)
{
    for (unsigned i = 0; i < n_fence_waited; i++)
        if (fence_waited[i] == s) return 1;
    return 0;
}

/* What fails in trim_waits: nothing, an event of the trim's fence, the
 * wait for one, or the event of the pending block's free. */
enum { FAIL_NONE, FAIL_FENCE_RECORD, FAIL_FENCE_WAIT, FAIL_FREE_RECORD };

/* Cache on two streams and a block pending on a third; an empty_cache,
 * with `fail`: what it released, and the device syncs (pool, backend) it
 * made. */
static void trim_waits(int fail, uint64_t *released, uint64_t *syncs, uint64_t *host_syncs)
{
    gp_backend *host;
    gp_backend_wrap *w = wrapped_host(&host);
    w->be.event_record = fence_event_record;
    w->be.event_wait = fence_event_wait;
    gp_stream s_a = (gp_stream)0x10, s_b = (gp_stream)0x20, side = (gp_stream)0x30;
    gp_pool *p = trim_pool(&w->be);
    gp_status st;
    void *a = gp_alloc(p, 8 * MiB, s_a, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st);
    void *b = gp_alloc(p, 8 * MiB, s_b, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st);
    void *c = gp_alloc(p, 8 * MiB, s_a, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st);
    CHECK(a && b && c && gp_record_stream(p, c, side) == GP_OK);
    CHECK(gp_free(p, a) == GP_OK && gp_free(p, b) == GP_OK);
    if (fail == FAIL_FREE_RECORD) gp_host_fail(host, GP_HOST_EVENT_RECORD, 1, GP_ERR_BACKEND, GP_HOST_FAIL_ONCE);
    CHECK(gp_free(p, c) == GP_OK);
    if (fail == FAIL_FENCE_RECORD || fail == FAIL_FENCE_WAIT)
        gp_host_fail(host, fail == FAIL_FENCE_RECORD ? GP_HOST_EVENT_RECORD : GP_HOST_EVENT_WAIT, 1, GP_ERR_BACKEND,
                     GP_HOST_FAIL_ONCE);
    gp_stats s0, s1;
    gp_host_counters c0, c1;
    gp_pool_stats(p, &s0, 0);
    gp_host_counters_get(host, &c0);
    n_fence_waited = 0;
    *released = gp_pool_empty_cache(p);
    gp_pool_stats(p, &s1, 0);
    gp_host_counters_get(host, &c1);
    gp_host_fail_none(host);
    CHECK(s1.pending == 0 && s1.reserved == 0);
    CHECK(s1.n_sync + s1.n_sync_pool == s0.n_sync + s0.n_sync_pool + 1);
    *syncs = s1.n_sync - s0.n_sync;
    *host_syncs = c1.n_sync - c0.n_sync;
    CHECK(pool_consistent(p, host) == 0);
    done(p);
}

static void test_trim_waits_for_its_streams(void)
{
    uint64_t released, syncs, host_syncs;
    trim_waits(FAIL_NONE, &released, &syncs, &host_syncs);
    CHECK(released == 24 * MiB && syncs == 0 && host_syncs == 0);
    CHECK(n_fence_waited == 3 && fence_waited_on((gp_stream)0x10) && fence_waited_on((gp_stream)0x20) &&
          fence_waited_on((gp_stream)0x30));
    /* No fence to be had, or one whose wait failed: the device, as before. */
    for (int fail = FAIL_FENCE_RECORD; fail <= FAIL_FREE_RECORD; fail++) {
        trim_waits(fail, &released, &syncs, &host_syncs);
        CHECK(released == 24 * MiB && syncs == 1 && host_syncs == 1);
    }
}

/* A device larger than the bins can hold (a HostPool asked for 2^63 bytes
 * and more): refused with its size named, in both modes, nothing written
 * out of bounds; a large one (1 TiB) is a pool that works. */
static void test_device_too_large(void)
{
    const uint64_t sizes[] = {(1ull << 63) + 5, UINT64_MAX, GP_DEVICE_MAX + 1};
    for (int mode = 0; mode < 2; mode++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            gp_config cfg;
            gp_config_default(&cfg);
            cfg.mode = mode ? GP_MODE_RESERVE : GP_MODE_EXPANDABLE;
            cfg.reserve = (gp_size_spec){.bytes = 4 * MiB};
            gp_backend *be;
            gp_pool *p = NULL;
            CHECK(gp_backend_host_create(sizes[i], &be) == GP_OK);
            CHECK(gp_pool_create(be, &cfg, &p) == GP_ERR_INVALID && p == NULL);
            CHECK(strstr(gp_last_error(), "1 PiB") != NULL);
        }
    gp_config cfg;
    gp_config_default(&cfg);
    gp_backend *be;
    gp_pool *p = NULL;
    CHECK(gp_backend_host_create(1ull << 40, &be) == GP_OK && gp_pool_create(be, &cfg, &p) == GP_OK);
    void *x = p ? gp_alloc(p, 3 * MiB, NULL, 0, GP_PRIO_NORMAL, NULL) : NULL;
    CHECK(x != NULL && gp_free(p, x) == GP_OK);
    if (p) done(p);
}

int main(void)
{
    test_device_too_large();
    test_basic();
    test_reuse_and_merge();
    test_bins_many_sizes();
    test_bad_pointers();
    test_oom_and_trim();
    test_trim_keeps_live_data();
    test_limits();
    test_streams();
    test_injected_failures();
    test_create_failure_leaks_nothing();
    test_failed_unmap_keeps_the_chunk();
    test_hopeless_request_fails_fast();
    test_fork();
    test_debug();
    test_pressure();
    test_reserve_mode();
    test_reserve_limit_below_a_chunk();
    test_tags();
    test_fork_while_interning();
    test_lean_growth();
    test_growth_keeps_the_block_it_extends();
    test_trim_without_sync();
    test_alloc_time();
    test_trim_unlocked();
    test_trim_waits_for_its_streams();
    return check_done();
}
