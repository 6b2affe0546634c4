/*
 * test_compat.c -- what PyTorch needs beyond malloc and free, on the host
 * backend: record_stream (a freed block waits for the events of the streams
 * recorded on it) and CUDA graph capture (graph pools: memory a capture got
 * is never handed to anyone else until the graph is released, and a capture
 * that repeats a warm-up maps nothing).  Run under ASan and UBSan.
 */
#include <string.h>

#include "pool_check.h"

#define S_MAIN ((gp_stream)0x1000)
#define S_SIDE ((gp_stream)0x2000)
#define S_OTHER ((gp_stream)0x3000)

static void *AS(gp_pool *p, size_t n, gp_stream s)
{
    return gp_alloc(p, n, s, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, NULL);
}

static gp_host_counters counters(gp_backend *be)
{
    gp_host_counters c;
    gp_host_counters_get(be, &c);
    return c;
}

static void test_record_stream_waits_for_the_side_stream(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    char *x = AS(p, 3 * MiB, S_MAIN); /* whole chunks: no free neighbour */
    CHECK(gp_record_stream(p, x, S_SIDE) == GP_OK);
    CHECK(gp_record_stream(p, x, S_SIDE) == GP_OK); /* twice: one stream */
    CHECK(gp_free(p, x) == GP_OK);
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    CHECK(s.pending == 3 * MiB && s.allocated == 0);
    CHECK(counters(be).n_event_record == 1);
    CHECK(pool_consistent(p, be) == 0);
    CHECK(gp_free(p, x) == GP_ERR_DOUBLE_FREE);
    /* The side stream has not finished: the block must not come back, though
     * it is the best fit on the very stream that freed it. */
    char *y = AS(p, 3 * MiB, S_MAIN);
    CHECK(y && y != x);
    CHECK(counters(be).n_event_query == 1); /* asked on the miss */
    gp_block_info info;
    CHECK(gp_pool_lookup(p, x, &info) == GP_ERR_DOUBLE_FREE);
    /* Allocations served from the cache make no driver call, pending
     * blocks or not: their events are asked only on a miss. */
    gp_free(p, AS(p, 4096, S_MAIN)); /* (maps the small arena's first chunk) */
    uint64_t queries = counters(be).n_event_query;
    gp_host_stream_complete(be, S_SIDE);
    for (int i = 0; i < 100; i++) gp_free(p, AS(p, 4096, S_MAIN));
    CHECK(counters(be).n_event_query == queries);
    /* The next miss finds the block's event completed and reuses it. */
    char *z = AS(p, 3 * MiB, S_MAIN);
    CHECK(z == x);
    gp_pool_stats(p, &s, 1);
    CHECK(s.pending == 0 && counters(be).events_live == 0);
    CHECK(pool_consistent(p, be) == 0);

    /* Recording the block's own stream changes nothing. */
    CHECK(gp_record_stream(p, z, S_MAIN) == GP_OK);
    gp_free(p, z);
    CHECK(AS(p, 3 * MiB, S_MAIN) == z);
    /* Not a live block. */
    CHECK(gp_record_stream(p, (char *)y + 512, S_SIDE) == GP_ERR_FOREIGN);
    int local;
    CHECK(gp_record_stream(p, &local, S_SIDE) == GP_ERR_FOREIGN);
    done(p);
}

/* Events that cannot be recorded (the backend refuses): the block waits for
 * the next device synchronisation. */
static gp_status (*real_event_record)(gp_backend *, gp_stream, uint64_t *);
static gp_status refused_event_record(gp_backend *be, gp_stream s, uint64_t *ev)
{
    (void)be;
    (void)s;
    (void)ev;
    return gp_error_set(GP_ERR_BACKEND, "test: event_record refused");
}

/* A pending block must never be stuck: a miss that would fail synchronises
 * and takes it back (reserve mode never trims, so nothing else would), and
 * a trim releases it even when no other cache exists. */
static void test_pending_blocks_are_never_stuck(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_RESERVE, &be);
    real_event_record = be->event_record;
    be->event_record = refused_event_record;
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    uint64_t all = s.reserved;
    char *x = AS(p, all, S_MAIN); /* the whole reserve */
    CHECK(x && gp_record_stream(p, x, S_SIDE) == GP_OK && gp_free(p, x) == GP_OK);
    gp_host_stream_complete(be, S_SIDE);
    gp_status st;
    char *y = gp_alloc(p, all, S_MAIN, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st);
    CHECK(y == x && st == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    /* empty_cache in reserve mode releases nothing, but pending blocks. */
    CHECK(gp_record_stream(p, y, S_SIDE) == GP_OK && gp_free(p, y) == GP_OK);
    uint64_t syncs = counters(be).n_sync;
    CHECK(gp_pool_empty_cache(p) == 0);
    gp_pool_stats(p, &s, 0);
    CHECK(s.pending == 0 && counters(be).n_sync == syncs + 1);
    CHECK(pool_consistent(p, be) == 0);
    be->event_record = real_event_record;
    done(p);

    /* Expandable mode, the only cache pending: empty_cache synchronises and
     * gives it back. */
    p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    x = AS(p, 1 * MiB, S_MAIN);
    y = AS(p, 2 * MiB, S_MAIN);
    CHECK(x && y && y == x + 1 * MiB);
    CHECK(gp_record_stream(p, x, S_SIDE) == GP_OK && gp_free(p, x) == GP_OK);
    CHECK(gp_record_stream(p, y, S_SIDE) == GP_OK && gp_free(p, y) == GP_OK);
    CHECK(pool_consistent(p, be) == 0); /* two pending neighbours: never merged, and rightly so */
    CHECK(gp_pool_empty_cache(p) == 3 * MiB);
    gp_pool_stats(p, &s, 0);
    CHECK(s.pending == 0 && s.reserved == 0 && counters(be).mapped == 0);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_record_stream_released_by_trim_and_destroy(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    char *x = AS(p, 3 * MiB, S_MAIN);
    CHECK(gp_record_stream(p, x, S_SIDE) == GP_OK);
    CHECK(gp_record_stream(p, x, S_OTHER) == GP_OK);
    gp_free(p, x);
    CHECK(counters(be).n_event_record == 2);
    /* One of two streams done is not enough. */
    gp_host_stream_complete(be, S_SIDE);
    char *y = AS(p, 3 * MiB, S_MAIN);
    CHECK(y != x);
    gp_free(p, y);
    /* A trim synchronises the device: every pending block is then free, and
     * its chunks can go back. */
    uint64_t released = gp_pool_trim(p, UINT64_MAX);
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    CHECK(released >= 6 * MiB && s.pending == 0 && s.reserved == 0);
    CHECK(counters(be).events_live == 0);
    CHECK(pool_consistent(p, be) == 0);
    /* Destroyed with a pending block and a live recorded one: nothing leaks
     * (ASan checks). */
    char *a = AS(p, 4096, S_MAIN), *b = AS(p, 4096, S_MAIN);
    gp_record_stream(p, a, S_SIDE);
    gp_record_stream(p, b, S_SIDE);
    gp_free(p, a);
    done(p);
}

/* Whether one of n allocations of `size` on s returns `addr` (they are
 * freed again). */
static int handed_out(gp_pool *p, void *addr, size_t size, gp_stream s, int n)
{
    void *got[16];
    int hit = 0;
    for (int i = 0; i < n; i++) {
        got[i] = AS(p, size, s);
        hit |= got[i] == addr;
    }
    for (int i = 0; i < n; i++) gp_free(p, got[i]);
    return hit;
}

static void test_capture_memory_stays_with_the_graph(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    /* Warm-up on the capture stream and on another one. */
    void *w[4];
    for (int i = 0; i < 4; i++) w[i] = AS(p, MiB, i % 2 ? S_MAIN : S_OTHER);
    for (int i = 0; i < 4; i++) gp_free(p, w[i]);
    uint64_t syncs = counters(be).n_sync;
    CHECK(gp_pool_capture_prepare(p, S_MAIN) == GP_OK);
    CHECK(counters(be).n_sync == syncs + 1);
    gp_host_set_capturing(be, S_MAIN, 1);
    CHECK(gp_pool_capture_begin(p, 7, S_MAIN) == GP_OK);
    uint64_t maps = counters(be).n_map;
    /* Everything the warm-up freed, on either stream, serves the capture. */
    void *c[4];
    for (int i = 0; i < 4; i++) c[i] = AS(p, MiB, S_MAIN);
    CHECK(c[0] && c[1] && c[2] && c[3]);
    CHECK(counters(be).n_map == maps && counters(be).n_map_capturing == 0);
    /* A stream the capture forked to allocates from the graph pool too. */
    gp_host_set_capturing(be, S_SIDE, 1);
    void *side = AS(p, MiB, S_SIDE);
    gp_host_set_capturing(be, S_SIDE, 0);
    gp_free(p, side);
    gp_free(p, c[1]); /* freed during the capture: reusable by the capture */
    CHECK(handed_out(p, c[1], MiB, S_MAIN, 1));
    /* No sync and no unmapping while capturing. */
    syncs = counters(be).n_sync;
    CHECK(gp_pool_trim(p, UINT64_MAX) == 0 && counters(be).n_sync == syncs);
    gp_host_set_capturing(be, S_MAIN, 0);
    CHECK(gp_pool_capture_end(p, S_MAIN) == GP_OK);
    CHECK(gp_pool_capture_end(p, S_MAIN) == GP_ERR_INVALID);
    CHECK(pool_consistent(p, be) == 0);

    /* The graph is alive: what it freed during capture (c[1], side) belongs
     * to it and no other allocation gets it, on any stream, even after a
     * trim. */
    CHECK(!handed_out(p, c[1], MiB, S_MAIN, 8));
    CHECK(!handed_out(p, c[1], MiB, S_OTHER, 8));
    CHECK(!handed_out(p, side, MiB, S_MAIN, 8));
    gp_pool_trim(p, UINT64_MAX);
    gp_block_info info;
    CHECK(gp_pool_lookup(p, c[0], &info) == GP_OK);
    CHECK(!handed_out(p, c[1], MiB, S_MAIN, 8));
    CHECK(pool_consistent(p, be) == 0);

    /* A second graph shares the pool: it reuses what the first freed. */
    CHECK(gp_pool_capture_prepare(p, S_MAIN) == GP_OK);
    gp_host_set_capturing(be, S_MAIN, 1);
    CHECK(gp_pool_capture_begin(p, 7, S_MAIN) == GP_OK);
    CHECK(handed_out(p, c[1], MiB, S_MAIN, 1));
    gp_host_set_capturing(be, S_MAIN, 0);
    CHECK(gp_pool_capture_end(p, S_MAIN) == GP_OK);

    /* One of the two graphs released: still private. */
    CHECK(gp_pool_capture_release(p, 7) == GP_OK);
    CHECK(!handed_out(p, c[1], MiB, S_MAIN, 8));
    /* Both: the memory returns to the stream that captured. */
    syncs = counters(be).n_sync;
    CHECK(gp_pool_capture_release(p, 7) == GP_OK);
    CHECK(counters(be).n_sync == syncs + 1);
    CHECK(gp_pool_capture_release(p, 7) == GP_ERR_INVALID);
    CHECK(handed_out(p, c[1], MiB, S_MAIN, 8));
    /* Blocks still live when the pool went (graph outputs) go back on free. */
    for (int i = 0; i < 4; i++)
        if (i != 1) gp_free(p, c[i]);
    CHECK(handed_out(p, c[0], MiB, S_MAIN, 8));
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_capture_maps_ahead_and_when_short(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *w[3];
    for (int i = 0; i < 3; i++) w[i] = AS(p, 2 * MiB, S_MAIN);
    for (int i = 0; i < 3; i++) gp_free(p, w[i]);
    gp_pool_trim(p, UINT64_MAX); /* torch.cuda.graph empties the cache first */
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == 0);
    CHECK(gp_pool_capture_prepare(p, S_MAIN) == GP_OK);
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved >= 6 * MiB); /* the warm-up's peak, mapped ahead */
    gp_host_set_capturing(be, S_MAIN, 1);
    CHECK(gp_pool_capture_begin(p, 1, S_MAIN) == GP_OK);
    void *c[4];
    for (int i = 0; i < 3; i++) c[i] = AS(p, 2 * MiB, S_MAIN);
    gp_pool_stats(p, &s, 0);
    CHECK(s.n_capture_maps == 0 && counters(be).n_map_capturing == 0);
    /* More than the warm-up needed: mapped during the capture, counted. */
    c[3] = AS(p, 8 * MiB, S_MAIN);
    CHECK(c[3] != NULL);
    gp_pool_stats(p, &s, 0);
    CHECK(s.n_capture_maps > 0 && counters(be).n_map_capturing > 0);
    /* An unregistered capturing stream while two captures run: refused. */
    gp_host_set_capturing(be, S_OTHER, 1);
    CHECK(gp_pool_capture_begin(p, 2, S_SIDE) == GP_OK);
    gp_status st;
    CHECK(gp_alloc(p, 4096, S_OTHER, GP_TAG_UNTAGGED, GP_PRIO_NORMAL, &st) == NULL && st == GP_ERR_INVALID);
    gp_host_set_capturing(be, S_OTHER, 0);
    CHECK(gp_pool_capture_end(p, S_SIDE) == GP_OK);
    CHECK(gp_pool_capture_release(p, 2) == GP_OK);
    gp_host_set_capturing(be, S_MAIN, 0);
    /* Released while the capture of its own graph still runs: freed at its end. */
    CHECK(gp_pool_capture_release(p, 1) == GP_OK);
    CHECK(handed_out(p, c[0], 2 * MiB, S_OTHER, 1) == 0);
    CHECK(gp_pool_capture_end(p, S_MAIN) == GP_OK);
    for (int i = 0; i < 4; i++) gp_free(p, c[i]);
    CHECK(pool_consistent(p, be) == 0);
    /* Everything is the pool's again: a trim gives it all back. */
    gp_pool_trim(p, UINT64_MAX);
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved == 0);
    done(p);
}

/* Placement (make_pool's default): preparing a capture hands the cached
 * blocks to the capturing stream, each to its slot of the block's own
 * region -- the long-lived region's blocks moved into the short slot, and
 * the next untagged allocation landed among the long-lived ones. */
static void test_capture_prepare_keeps_regions_apart(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    gp_tag weights;
    CHECK(gp_tag_intern("weights", &weights) == GP_OK && gp_tag_lifetime(weights) == GP_LIFE_LONG);
    void *w = gp_alloc(p, 1 * MiB, S_OTHER, weights, GP_PRIO_NORMAL, NULL);
    void *keep = gp_alloc(p, 1 * MiB, S_OTHER, weights, GP_PRIO_NORMAL, NULL);
    void *a = AS(p, 1 * MiB, S_OTHER);
    CHECK(w && keep && a);
    gp_free(p, w);
    gp_free(p, a);
    CHECK(gp_pool_capture_prepare(p, S_MAIN) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    uint64_t maps = counters(be).n_map;
    gp_block_info info;
    void *x = AS(p, 1 * MiB, S_MAIN), *y = gp_alloc(p, 1 * MiB, S_MAIN, weights, GP_PRIO_NORMAL, NULL);
    CHECK(x == a && gp_pool_lookup(p, x, &info) == GP_OK && info.lifetime == GP_LIFE_SHORT);
    CHECK(y == w && gp_pool_lookup(p, y, &info) == GP_OK && info.lifetime == GP_LIFE_LONG);
    CHECK(counters(be).n_map == maps);
    gp_free(p, x);
    gp_free(p, y);
    gp_free(p, keep);
    done(p);
}

/* cacheInfo's answer: the largest free block, or what the device and the
 * limit still let the pool map, whichever is larger; reserve mode never maps. */
static void test_headroom(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    CHECK(gp_pool_headroom(p) == 64 * MiB);
    char *x = AS(p, 10 * MiB, S_MAIN);
    CHECK(x);
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    CHECK(gp_pool_headroom(p) == 64 * MiB - s.reserved);
    gp_free(p, x);
    CHECK(gp_pool_headroom(p) == 64 * MiB - s.reserved); /* 54 MiB unmapped beats 10 cached */
    gp_pool_set_limit(p, 16 * MiB);
    CHECK(gp_pool_headroom(p) == s.reserved); /* the limit leaves 6 MiB: the cached block is larger */
    gp_pool_set_limit(p, 8 * MiB);             /* below reserved: nothing more may be mapped */
    CHECK(gp_pool_headroom(p) == s.reserved);
    CHECK(pool_consistent(p, be) == 0);
    done(p);

    p = make_pool(64 * MiB, 256 * KiB, GP_MODE_RESERVE, &be);
    gp_pool_stats(p, &s, 1);
    CHECK(s.reserved > 0 && gp_pool_headroom(p) == s.reserved);
    char *y = AS(p, 1 * MiB, S_MAIN);
    CHECK(y && gp_pool_headroom(p) == s.reserved - 1 * MiB);
    gp_free(p, y);
    done(p);
}

int main(void)
{
    test_headroom();
    test_record_stream_waits_for_the_side_stream();
    test_record_stream_released_by_trim_and_destroy();
    test_pending_blocks_are_never_stuck();
    test_capture_memory_stays_with_the_graph();
    test_capture_maps_ahead_and_when_short();
    test_capture_prepare_keeps_regions_apart();
    return check_done();
}
