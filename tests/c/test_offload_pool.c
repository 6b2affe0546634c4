/*
 * test_offload_pool.c -- the pool's side of offload on the host backend:
 * which chunks a plan releases, the block states and figures while memory
 * is away, restore at the same addresses, frees and retags of offloaded
 * blocks, failures (limit, wrong end, capture), and a randomized run that
 * offloads, restores and frees while checking every byte and the pool's
 * integrity after each step.  The copies are memcpy: on the host backend
 * "device" memory is host memory.
 */
#include <string.h>

#include "backend_forward.h"
#include "pool_check.h"

static gp_tag T_W, T_O, T_X;

static void *A(gp_pool *p, size_t n, gp_tag t) { return gp_alloc(p, n, NULL, t, GP_PRIO_NORMAL, NULL); }

static void fill(void *ptr, size_t n, unsigned seed)
{
    unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++) c[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

static int same(const void *ptr, size_t n, unsigned seed)
{
    const unsigned char *c = ptr;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 9))) return 0;
    return 1;
}

/* The offload.c part, done by hand: copy each block out, unmap each run. */
typedef struct saved {
    size_t n;
    void **data;
} saved;

static saved copy_out(const gp_offload_plan *pl)
{
    saved s = {pl->n_ranges, calloc(pl->n_ranges ? pl->n_ranges : 1, sizeof(void *))};
    for (size_t i = 0; i < pl->n_ranges; i++) {
        s.data[i] = malloc(pl->ranges[i].size);
        memcpy(s.data[i], (void *)pl->ranges[i].addr, pl->ranges[i].size);
    }
    return s;
}

static void saved_free(saved *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->data[i]);
    free(s->data);
}

static int unmap_all(gp_pool *p, gp_offload_plan *pl)
{
    for (size_t i = 0; i < pl->n_runs; i++)
        if (gp_pool_plan_unmap(p, pl, pl->runs[i].addr, pl->runs[i].size) != GP_OK) return 0;
    return 1;
}

static int map_all(gp_pool *p, gp_offload_plan *pl)
{
    for (size_t i = 0; i < pl->n_runs; i++)
        if (gp_pool_plan_map(p, pl, pl->runs[i].addr, pl->runs[i].size, GP_PRIO_NORMAL) != GP_OK) return 0;
    return 1;
}

static int state_of(gp_pool *p, void *ptr)
{
    gp_block_info b;
    return gp_pool_lookup(p, ptr, &b) == GP_OK ? b.state : -1;
}

static void test_offload_restore(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    /* Large blocks of W back to back, one of O after them. */
    enum { N = 6 };
    void *w[N];
    size_t sz[N] = {300 * KiB, 1 * MiB, 700 * KiB, 2 * MiB + 4096, 90 * KiB + 512, 3 * MiB};
    for (int i = 0; i < N; i++) {
        w[i] = A(p, sz[i], T_W);
        fill(w[i], sz[i], (unsigned)i + 1);
    }
    void *o = A(p, 500 * KiB, T_O);
    fill(o, 500 * KiB, 99);
    gp_stats s0, s1;
    gp_host_counters c0, c1;
    gp_pool_stats(p, &s0, 0);
    gp_host_counters_get(be, &c0);

    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl);
    CHECK(pl->n_runs >= 1 && pl->restore == 0);
    uint64_t wbytes = 0;
    for (int i = 0; i < N; i++) {
        gp_block_info b;
        gp_pool_lookup(p, w[i], &b);
        wbytes += b.size;
    }
    CHECK(pl->offloaded + pl->kept == wbytes);
    CHECK(pl->bytes > 0 && pl->bytes <= pl->offloaded && pl->released >= pl->bytes);
    for (size_t i = 0; i < pl->n_runs; i++) CHECK(pl->runs[i].addr % pl->runs[i].chunk == 0);
    /* Marked at once: offloaded blocks are no longer allocated. */
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.offloaded == pl->offloaded && s1.allocated == s0.allocated - pl->offloaded);
    CHECK(s1.active_blocks == s0.active_blocks);
    CHECK(pool_consistent(p, be) == 0);
    saved sv = copy_out(pl);
    CHECK(unmap_all(p, pl));
    gp_pool_stats(p, &s1, 0);
    gp_host_counters_get(be, &c1);
    CHECK(s1.reserved == s0.reserved - pl->released);
    CHECK(c1.mapped == c0.mapped - pl->released);
    CHECK(pool_consistent(p, be) == 0);
    /* Ending resident while unmapped is refused and changes nothing. */
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_ERR_INVALID && gp_last_error()[0]);
    gp_offload_run runs[16];
    size_t n_runs = pl->n_runs < 16 ? pl->n_runs : 16;
    memcpy(runs, pl->runs, n_runs * sizeof *runs);
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    int n_off = 0;
    for (int i = 0; i < N; i++) n_off += state_of(p, w[i]) == GP_BLOCK_OFFLOADED;
    CHECK(n_off > 0);
    CHECK(state_of(p, o) == GP_BLOCK_USED && same(o, 500 * KiB, 99));
    gp_tag_stats ts;
    gp_pool_tag_stats(p, T_W, &ts);
    CHECK(ts.offloaded == s1.offloaded);

    /* Allocations meanwhile never land in a run. */
    void *more[32];
    for (int i = 0; i < 32; i++) {
        more[i] = A(p, 64 * KiB + (size_t)i * 4096, T_X);
        CHECK(more[i] != NULL);
        for (size_t r = 0; r < n_runs; r++)
            CHECK((uintptr_t)more[i] + 64 * KiB <= runs[r].addr ||
                  (uintptr_t)more[i] >= runs[r].addr + runs[r].size);
    }
    CHECK(pool_consistent(p, be) == 0);

    /* Restore: same addresses, same bytes. */
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, runs, n_runs, &rp) == GP_OK && rp->restore == 1);
    CHECK(rp->n_ranges == sv.n);
    CHECK(map_all(p, rp));
    for (size_t i = 0; i < rp->n_ranges; i++) memcpy((void *)rp->ranges[i].addr, sv.data[i], rp->ranges[i].size);
    CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK);
    for (int i = 0; i < N; i++) CHECK(state_of(p, w[i]) == GP_BLOCK_USED && same(w[i], sz[i], (unsigned)i + 1));
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.offloaded == 0);
    CHECK(pool_consistent(p, be) == 0);
    /* A run that is resident now cannot be restored again. */
    CHECK(gp_pool_restore_begin(p, runs, n_runs, &rp) == GP_ERR_INVALID);
    saved_free(&sv);
    for (int i = 0; i < 32; i++) gp_free(p, more[i]);
    for (int i = 0; i < N; i++) CHECK(gp_free(p, w[i]) == GP_OK);
    gp_free(p, o);
    done(p);
}

/* A block sharing a chunk with another tag's live block stays resident
 * (kept), and so does every block joined to it through shared chunks. */
/* A chunk shared with another tag's live block stays mapped: a block wholly
 * in it stays resident (kept); a block reaching into released chunks is
 * offloaded, its part in the shared chunk left in place. */
static void test_shared_chunk(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 1 * MiB, GP_MODE_EXPANDABLE, &be);
    void *a = A(p, 300 * KiB, T_W);  /* chunk 0                     */
    void *b = A(p, 300 * KiB, T_O);  /* chunk 0: keeps chunk 0 mapped */
    void *c = A(p, 600 * KiB, T_W);  /* chunks 0-1                  */
    fill(a, 300 * KiB, 1);
    fill(b, 300 * KiB, 2);
    fill(c, 600 * KiB, 3);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK);
    CHECK(pl->n_runs == 1 && pl->runs[0].addr == (uintptr_t)c + 424 * KiB && pl->runs[0].size == 1 * MiB);
    CHECK(pl->kept == 300 * KiB && pl->offloaded == 600 * KiB);
    CHECK(pl->n_ranges == 1 && pl->bytes == 176 * KiB); /* c's tail */
    CHECK(state_of(p, a) == GP_BLOCK_USED && state_of(p, c) == GP_BLOCK_OFFLOADED);
    CHECK(pool_consistent(p, be) == 0);
    saved sv = copy_out(pl);
    gp_offload_run run = pl->runs[0];
    CHECK(unmap_all(p, pl) && gp_pool_plan_end(p, pl, 0) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    CHECK(same(a, 300 * KiB, 1) && same(b, 300 * KiB, 2));
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, &run, 1, &rp) == GP_OK && rp->n_ranges == 1 && map_all(p, rp));
    memcpy((void *)rp->ranges[0].addr, sv.data[0], rp->ranges[0].size);
    CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK);
    CHECK(same(c, 600 * KiB, 3));
    CHECK(pool_consistent(p, be) == 0);
    saved_free(&sv);
    done(p);
}

static uint64_t block_size(gp_pool *p, void *ptr)
{
    gp_block_info b;
    return gp_pool_lookup(p, ptr, &b) == GP_OK ? b.size : 0;
}

static size_t mixed(gp_pool *p, gp_tag t, uintptr_t *addrs, size_t cap)
{
    size_t n = 0;
    unsigned graphs = 1;
    CHECK(gp_pool_tag_mixed(p, t, addrs, cap, &n, &graphs) == GP_OK && graphs == 0);
    return n;
}

/* Blocks sharing a chunk are named; moved apart, the tag's offload takes
 * all of it; the new mapping stays apart from free blocks around it; every
 * failure leaves the pool as it was. */
static void test_apart(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 1 * MiB, GP_MODE_EXPANDABLE, &be);
    void *d = A(p, 2 * MiB, T_W);    /* chunks 0-1: its own           */
    void *a = A(p, 300 * KiB, T_W);  /* chunk 2, beside b            */
    void *b = A(p, 300 * KiB, T_O);
    void *c = A(p, 600 * KiB, T_W);  /* chunks 2-3, free after it    */
    uintptr_t addrs[4] = {0};
    CHECK(mixed(p, T_W, addrs, 4) == 2 && addrs[0] == (uintptr_t)a && addrs[1] == (uintptr_t)c);
    CHECK(mixed(p, T_W, addrs, 1) == 2); /* (the count, past the room) */
    CHECK(mixed(p, T_O, addrs, 4) == 1 && addrs[0] == (uintptr_t)b);
    size_t n;
    unsigned g;
    CHECK(gp_pool_tag_mixed(p, GP_MAX_TAGS - 1, addrs, 4, &n, &g) == GP_ERR_INVALID);
    uint64_t sizes[2] = {300 * KiB, 600 * KiB};
    void *out[2] = {0};
    CHECK(gp_pool_alloc_apart(p, sizes, 2, NULL, T_W, GP_PRIO_NORMAL, out) == GP_OK);
    CHECK((uintptr_t)out[1] == (uintptr_t)out[0] + 300 * KiB);
    CHECK(block_size(p, out[1]) == 1 * MiB - 300 * KiB); /* (to the chunk's end) */
    fill(out[0], 300 * KiB, 1);
    fill(out[1], 600 * KiB, 3);
    CHECK(gp_free(p, a) == GP_OK && gp_free(p, c) == GP_OK);
    CHECK(mixed(p, T_W, addrs, 4) == 0);
    CHECK(pool_consistent(p, be) == 0);
    gp_tag_stats ts;
    gp_pool_tag_stats(p, T_W, &ts);
    CHECK(ts.allocated == 3 * MiB && ts.active_blocks == 3);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK);
    CHECK(pl->kept == 0 && pl->offloaded == 3 * MiB && pl->n_runs == 2);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_OK); /* (not copied: undone) */
    CHECK(same(out[0], 300 * KiB, 1) && same(out[1], 600 * KiB, 3));
    /* Many blocks at once: more headers than a slab holds. */
    enum { MANY = 3000 };
    static uint64_t many[MANY];
    static void *many_out[MANY];
    for (int i = 0; i < MANY; i++) many[i] = 512 + (uint64_t)(i % 7) * 512;
    CHECK(gp_pool_alloc_apart(p, many, MANY, NULL, T_W, GP_PRIO_NORMAL, many_out) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    for (int i = 1; i < MANY; i++)
        CHECK((uintptr_t)many_out[i] == (uintptr_t)many_out[i - 1] + many[i - 1]);
    for (int i = 0; i < MANY; i++) CHECK(gp_free(p, many_out[i]) == GP_OK);
    gp_pool_empty_cache(p); /* (the limits below must find no cache to release) */
    /* Bad requests, and requests the pool or the device refuses: nothing
     * changes. */
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    uint64_t zero[1] = {0}, huge[2] = {1ull << 47, 1ull << 47}, big[1] = {4 * MiB};
    CHECK(gp_pool_alloc_apart(p, sizes, 0, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_INVALID);
    CHECK(gp_pool_alloc_apart(p, zero, 1, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_INVALID);
    CHECK(gp_pool_alloc_apart(p, huge, 2, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_OOM);
    CHECK(gp_pool_alloc_apart(p, big, 1, NULL, GP_MAX_TAGS - 1, GP_PRIO_NORMAL, out) == GP_ERR_INVALID);
    CHECK(gp_pool_alloc_apart(p, big, 1, NULL, T_W, GP_PRIO_MAX + 1, out) == GP_ERR_INVALID);
    CHECK(gp_pool_set_tag_limit(p, T_W, 5 * MiB) == GP_OK);
    CHECK(gp_pool_alloc_apart(p, big, 1, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_LIMIT);
    CHECK(gp_pool_set_tag_limit(p, T_W, 0) == GP_OK);
    gp_pool_set_limit(p, s0.reserved + 2 * MiB);
    CHECK(gp_pool_alloc_apart(p, big, 1, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_LIMIT);
    gp_pool_set_limit(p, 0);
    gp_host_fail(be, GP_HOST_MAP, 2, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
    CHECK(gp_pool_alloc_apart(p, big, 1, NULL, T_W, GP_PRIO_NORMAL, out) == GP_ERR_OOM);
    gp_pool_stats(p, &s1, 0);
    /* (reserved may fall: the limit releases idle cache first) */
    CHECK(s1.allocated == s0.allocated && s1.reserved <= s0.reserved && s1.n_alloc == s0.n_alloc);
    (void)b;
    (void)d;
    done(p);
    /* A hole of one chunk between free cache: the new mapping fills it and
     * merges with neither neighbour. */
    p = make_pool(64 * MiB, 1 * MiB, GP_MODE_EXPANDABLE, &be);
    void *e = A(p, 1 * MiB, T_O), *f = A(p, 1 * MiB, T_O), *h = A(p, 1 * MiB, T_O);
    CHECK(gp_free(p, e) == GP_OK && gp_free(p, f) == GP_OK);
    CHECK(gp_pool_trim(p, 1 * MiB) == 1 * MiB); /* one of the two goes: a hole beside the other */
    CHECK(gp_free(p, h) == GP_OK);
    gp_pool_stats(p, &s0, 0);
    uint64_t one[1] = {960 * KiB}; /* (the large arena: it wastes little of a chunk) */
    CHECK(gp_pool_alloc_apart(p, one, 1, NULL, T_W, GP_PRIO_NORMAL, out) == GP_OK);
    CHECK(block_size(p, out[0]) == 1 * MiB && ((uintptr_t)out[0] == (uintptr_t)e || (uintptr_t)out[0] == (uintptr_t)f));
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.reserved == s0.reserved + 1 * MiB && s1.free_bytes == s0.free_bytes);
    CHECK(mixed(p, T_W, addrs, 4) == 0);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

/* Free and retag while offloaded; undo a failed offload; errors. */
static void test_free_retag_abort(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *x = A(p, 2 * MiB, T_W), *y = A(p, 1 * MiB, T_W), *z = A(p, 3 * MiB, T_W);
    fill(y, 1 * MiB, 5);
    fill(z, 3 * MiB, 6);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_ranges == 3);
    saved sv = copy_out(pl);
    CHECK(unmap_all(p, pl));
    /* Chunk-aligned neighbours: their runs touch and join. */
    gp_offload_run runs[1];
    CHECK(pl->n_runs == 1 && pl->released == 6 * MiB);
    memcpy(runs, pl->runs, sizeof *runs);
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    /* Free x while it is away: its bytes leave offloaded; freeing it twice
     * is a double free. */
    CHECK(gp_free(p, x) == GP_OK);
    CHECK(gp_free(p, x) == GP_ERR_DOUBLE_FREE);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.offloaded == 4 * MiB);
    /* Retag z while away: the offloaded bytes move with it. */
    void *zp[1] = {(char *)z + 100};
    uint64_t moved = 0;
    CHECK(gp_pool_retag(p, zp, 1, T_X, GP_PRIO_DEFAULT, &moved) == GP_OK && moved == 3 * MiB);
    gp_tag_stats tw, tx;
    gp_pool_tag_stats(p, T_W, &tw);
    gp_pool_tag_stats(p, T_X, &tx);
    CHECK(tw.offloaded == 1 * MiB && tx.offloaded == 3 * MiB && tx.allocated == 0);
    CHECK(pool_consistent(p, be) == 0);
    /* Restore: x's space comes back free, y and z with their bytes. */
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, runs, 1, &rp) == GP_OK && rp->n_ranges == 2);
    CHECK(map_all(p, rp));
    /* The plan lists blocks in address order; sv had x, y, z. */
    memcpy(y, sv.data[1], 1 * MiB);
    memcpy(z, sv.data[2], 3 * MiB);
    CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK);
    CHECK(same(y, 1 * MiB, 5) && same(z, 3 * MiB, 6));
    gp_pool_tag_stats(p, T_X, &tx);
    CHECK(tx.allocated == 3 * MiB && tx.offloaded == 0);
    CHECK(pool_consistent(p, be) == 0);
    void *x2 = A(p, 2 * MiB, T_W); /* x's space is free cache again */
    CHECK(x2 == x);
    saved_free(&sv);

    /* A failed offload undone: unmapped half, mapped again, ended resident. */
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs >= 1 && pl->runs[0].size > pl->runs[0].chunk);
    CHECK(gp_pool_plan_unmap(p, pl, pl->runs[0].addr, pl->runs[0].chunk) == GP_OK);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_ERR_INVALID); /* (half mapped: not resident) */
    CHECK(gp_pool_plan_map(p, pl, pl->runs[0].addr, pl->runs[0].size, GP_PRIO_NORMAL) == GP_OK);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_OK);
    CHECK(state_of(p, y) == GP_BLOCK_USED);
    CHECK(pool_consistent(p, be) == 0);

    /* A give-back that failed half way ends offloaded with chunks still
     * mapped (reserved until the restore); the restore maps the others. */
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs >= 1 && pl->runs[0].size > pl->runs[0].chunk);
    gp_offload_run half[8];
    size_t n_half = pl->n_runs < 8 ? pl->n_runs : 8;
    memcpy(half, pl->runs, n_half * sizeof *half);
    CHECK(gp_pool_plan_unmap(p, pl, half[0].addr, half[0].chunk) == GP_OK);
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK && state_of(p, y) == GP_BLOCK_OFFLOADED);
    CHECK(pool_consistent(p, be) == 0);
    CHECK(gp_pool_run_check(p, &half[0]) == GP_OK);
    CHECK(gp_pool_restore_begin(p, half, n_half, &rp) == GP_OK);
    for (size_t i = 0; i < n_half; i++)
        CHECK(gp_pool_plan_map(p, rp, half[i].addr, half[i].size, GP_PRIO_NORMAL) == GP_OK);
    CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK && state_of(p, y) == GP_BLOCK_USED);
    CHECK(gp_pool_run_check(p, &half[0]) == GP_ERR_INVALID);
    CHECK(pool_consistent(p, be) == 0);

    /* Bad input. */
    CHECK(gp_pool_offload_begin(p, NULL, 0, &pl) == GP_ERR_INVALID);
    gp_tag bad = (gp_tag)(GP_MAX_TAGS - 1);
    CHECK(gp_pool_offload_begin(p, &bad, 1, &pl) == GP_ERR_INVALID && strstr(gp_last_error(), "interned"));
    gp_offload_run junk = {.addr = 12345, .size = 4096, .chunk = 4096};
    CHECK(gp_pool_restore_begin(p, &junk, 1, &rp) == GP_ERR_INVALID);
    /* While a graph captures, offload is refused. */
    gp_stream cs = (gp_stream)0x77;
    CHECK(gp_pool_capture_begin(p, 1, cs) == GP_OK);
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_ERR_INVALID && strstr(gp_last_error(), "captur"));
    CHECK(gp_pool_capture_end(p, cs) == GP_OK && gp_pool_capture_release(p, 1) == GP_OK);
    gp_free(p, x2);
    gp_free(p, y);
    gp_free(p, z);
    done(p);
}

/* Restoring needs room: the pool limit applies (after releasing cache). */
static void test_restore_limit(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *w = A(p, 8 * MiB, T_W);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && unmap_all(p, pl));
    gp_offload_run run = pl->runs[0];
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    /* Someone else takes the room, then a limit. */
    void *o = A(p, 8 * MiB, T_O);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    gp_pool_set_limit(p, s.reserved + 1 * MiB);
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, &run, 1, &rp) == GP_OK);
    CHECK(gp_pool_plan_map(p, rp, run.addr, run.size, GP_PRIO_NORMAL) == GP_ERR_LIMIT);
    CHECK(strstr(gp_last_error(), "limit") != NULL);
    /* Nothing half mapped is left: end offloaded is still possible. */
    CHECK(gp_pool_plan_end(p, rp, 0) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, o);
    gp_pool_set_limit(p, 0);
    CHECK(gp_pool_restore_begin(p, &run, 1, &rp) == GP_OK && map_all(p, rp) && gp_pool_plan_end(p, rp, 1) == GP_OK);
    CHECK(state_of(p, w) == GP_BLOCK_USED);
    gp_free(p, w);
    done(p);
}

/* Destroying a pool with memory offloaded: nothing unmapped twice, no leak. */
static void test_destroy_offloaded(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    A(p, 5 * MiB, T_W);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && unmap_all(p, pl) && gp_pool_plan_end(p, pl, 0) == GP_OK);
    done(p);
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* Free cache straddling a run's edge is cut at the chunk boundary: the
 * part outside stays allocatable while the tag is away. */
static void test_edge_cache_stays(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 1 * MiB, GP_MODE_EXPANDABLE, &be);
    void *w = A(p, 1536 * KiB, T_W); /* [0, 1.5M)          */
    void *f = A(p, 1536 * KiB, T_O); /* [1.5M, 3M)         */
    void *o = A(p, 1 * MiB, T_O);    /* [3M, 4M)           */
    CHECK((char *)f == (char *)w + 1536 * KiB && (char *)o == (char *)f + 1536 * KiB);
    gp_free(p, f); /* free cache [1.5M, 3M), across the chunk boundary at 2M */
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs == 1 && pl->runs[0].size == 2 * MiB);
    CHECK(unmap_all(p, pl));
    gp_offload_run run = pl->runs[0];
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    gp_stats s0, s1;
    gp_pool_stats(p, &s0, 0);
    void *g = A(p, 1 * MiB, T_O); /* fits [2M, 3M) without mapping */
    gp_pool_stats(p, &s1, 0);
    CHECK((char *)g == (char *)w + 2 * MiB && s1.n_map == s0.n_map);
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, &run, 1, &rp) == GP_OK && map_all(p, rp) && gp_pool_plan_end(p, rp, 1) == GP_OK);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, g);
    gp_free(p, o);
    gp_free(p, w);
    done(p);
}

/* A tag with blocks in both arenas: the small arena lies above the large
 * one, and the plan still lists runs and ranges in address order (the data
 * path pairs each chunk with its pieces by one forward walk; out of order,
 * a restore copied into chunks not yet mapped). */
static void test_both_arenas_in_order(void)
{
    gp_backend *be;
    gp_pool *p = make_pool(64 * MiB, 256 * KiB, GP_MODE_EXPANDABLE, &be);
    void *big[3], *small[16];
    for (int i = 0; i < 3; i++) fill(big[i] = A(p, 1 * MiB, T_W), 1 * MiB, (unsigned)i);
    for (int i = 0; i < 16; i++) fill(small[i] = A(p, 48 * KiB, T_W), 48 * KiB, 10u + (unsigned)i);
    gp_block_info bi, si;
    CHECK(gp_pool_lookup(p, big[0], &bi) == GP_OK && gp_pool_lookup(p, small[0], &si) == GP_OK);
    CHECK(bi.arena != si.arena);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs >= 2);
    int order = 1;
    for (size_t i = 1; i < pl->n_runs; i++) order &= pl->runs[i - 1].addr + pl->runs[i - 1].size <= pl->runs[i].addr;
    for (size_t i = 1; i < pl->n_ranges; i++)
        order &= pl->ranges[i - 1].addr + pl->ranges[i - 1].size <= pl->ranges[i].addr;
    CHECK(order);
    saved sv = copy_out(pl);
    CHECK(unmap_all(p, pl));
    size_t n = pl->n_runs;
    gp_offload_run *runs = malloc(n * sizeof *runs);
    memcpy(runs, pl->runs, n * sizeof *runs);
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    /* Restore from runs given out of order: its plan is in order too. */
    for (size_t i = 0; i < n / 2; i++) {
        gp_offload_run t = runs[i];
        runs[i] = runs[n - 1 - i];
        runs[n - 1 - i] = t;
    }
    gp_offload_plan *rp;
    CHECK(gp_pool_restore_begin(p, runs, n, &rp) == GP_OK && rp->n_ranges == sv.n);
    order = 1;
    for (size_t i = 1; i < rp->n_runs; i++) order &= rp->runs[i - 1].addr < rp->runs[i].addr;
    CHECK(order && map_all(p, rp));
    for (size_t i = 0; i < rp->n_ranges; i++) memcpy((void *)rp->ranges[i].addr, sv.data[i], rp->ranges[i].size);
    CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK);
    for (int i = 0; i < 3; i++) CHECK(same(big[i], 1 * MiB, (unsigned)i));
    for (int i = 0; i < 16; i++) CHECK(same(small[i], 48 * KiB, 10u + (unsigned)i));
    CHECK(pool_consistent(p, be) == 0);
    saved_free(&sv);
    free(runs);
    for (int i = 0; i < 3; i++) gp_free(p, big[i]);
    for (int i = 0; i < 16; i++) gp_free(p, small[i]);
    done(p);
}

/* Random allocations of three tags; offload and restore whole tags and
 * free blocks at random, checking every live block's bytes and the pool's
 * integrity after each step. */
static void test_random(unsigned seed0, gp_mode mode, int placement)
{
    gp_backend *be;
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 64 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.large_chunk = 256 * KiB;
    cfg.cache_slack = -1;
    cfg.mode = mode;
    cfg.reserve = (gp_size_spec){.bytes = 48 * MiB};
    cfg.placement = placement ? GP_PLACE_LIFETIME : GP_PLACE_NONE;
    CHECK(gp_backend_host_create(64 * MiB, &be) == GP_OK);
    gp_pool *p;
    CHECK(gp_pool_create(be, &cfg, &p) == GP_OK);
    enum { LIVE = 96, STEPS = 900 };
    uint64_t released = 0, restored = 0;
    struct { void *ptr; size_t n; unsigned seed; gp_tag tag; } live[LIVE] = {0};
    struct rec { gp_tag tag; size_t n_runs; gp_offload_run *runs; size_t n; uintptr_t *addr; void **data; uint64_t *size; } off[3] = {0};
    gp_tag tagset[3] = {T_W, T_O, T_X};
    unsigned seed = seed0;
#define RND() rnd(&seed)
    for (int step = 0; step < STEPS; step++) {
        unsigned r = RND() % 100;
        if (r < 60) {
            unsigned k = RND() % LIVE;
            if (live[k].ptr) {
                CHECK(gp_free(p, live[k].ptr) == GP_OK);
                live[k].ptr = NULL;
            } else {
                unsigned big = RND() % 4 == 0;
                size_t n = 1 + RND() % (big ? 900000 : 40000);
                gp_tag t = tagset[RND() % 3];
                void *x = gp_alloc(p, n, NULL, t, GP_PRIO_NORMAL, NULL);
                if (x) {
                    live[k].ptr = x;
                    live[k].n = n;
                    live[k].seed = (unsigned)step;
                    live[k].tag = t;
                    fill(x, n, (unsigned)step);
                }
            }
        } else if (r < 80) {
            int t = (int)(RND() % 3);
            if (off[t].runs) continue;
            gp_offload_plan *pl;
            CHECK(gp_pool_offload_begin(p, &tagset[t], 1, &pl) == GP_OK);
            saved sv = copy_out(pl);
            CHECK(unmap_all(p, pl));
            released += pl->released;
            off[t].n_runs = pl->n_runs;
            off[t].runs = malloc((pl->n_runs + 1) * sizeof *pl->runs);
            if (pl->n_runs) memcpy(off[t].runs, pl->runs, pl->n_runs * sizeof *pl->runs);
            off[t].n = sv.n;
            off[t].data = sv.data;
            off[t].addr = malloc((sv.n + 1) * sizeof(uintptr_t));
            off[t].size = malloc((sv.n + 1) * sizeof(uint64_t));
            for (size_t i = 0; i < sv.n; i++) off[t].addr[i] = pl->ranges[i].addr, off[t].size[i] = pl->ranges[i].size;
            CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
        } else {
            int t = (int)(RND() % 3);
            if (!off[t].runs) continue;
            gp_offload_plan *rp;
            CHECK(gp_pool_restore_begin(p, off[t].runs, off[t].n_runs, &rp) == GP_OK);
            int ok = map_all(p, rp);
            CHECK(ok);
            if (!ok) { gp_pool_plan_end(p, rp, 0); continue; }
            /* Copy back what is still live (the plan lists it). */
            for (size_t i = 0, j = 0; i < rp->n_ranges; i++) {
                while (j < off[t].n && off[t].addr[j] != rp->ranges[i].addr) j++;
                CHECK(j < off[t].n);
                if (j < off[t].n) memcpy((void *)rp->ranges[i].addr, off[t].data[j], rp->ranges[i].size);
            }
            restored += rp->bytes;
            CHECK(gp_pool_plan_end(p, rp, 1) == GP_OK);
            saved sv = {off[t].n, off[t].data};
            saved_free(&sv);
            free(off[t].runs);
            free(off[t].addr);
            free(off[t].size);
            memset(&off[t], 0, sizeof off[t]);
        }
        /* Every resident live block holds its bytes (checked now and then:
         * the bytes are what an offload must not change). */
        for (int k = 0; k < LIVE && (step % 16 == 0 || r >= 80); k++) {
            if (!live[k].ptr) continue;
            int s = state_of(p, live[k].ptr);
            CHECK(s == GP_BLOCK_USED || s == GP_BLOCK_OFFLOADED);
            if (s == GP_BLOCK_USED && !same(live[k].ptr, live[k].n, live[k].seed)) {
                CHECK(!"live bytes changed");
                break;
            }
        }
        if (pool_consistent(p, be)) {
            CHECK(!"pool inconsistent");
            break;
        }
    }
#undef RND
    /* The run exercised what it is for. */
    CHECK(released > 0 && restored > 0);
    for (int t = 0; t < 3; t++) {
        saved sv = {off[t].n, off[t].data};
        saved_free(&sv);
        free(off[t].runs);
        free(off[t].addr);
        free(off[t].size);
    }
    done(p);
}

/* A plan maps without the pool's lock: whatever looks at the pool
 * meanwhile (a check, another thread's figures) finds it consistent, the
 * bytes being mapped counted in reserved and its peak (the fuzzer found a
 * check that saw reserved above its peak). */
static gp_pool *checked_pool;
static int checks_in_map, violations_in_map;
static char first_violation[512];

static gp_status checking_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    if (checked_pool) { /* (set only around gp_pool_plan_map, which lets the lock go) */
        char msg[512];
        size_t n = gp_pool_check(checked_pool, msg, sizeof msg);
        checks_in_map++;
        if (n && !violations_in_map++) snprintf(first_violation, sizeof first_violation, "%s", msg);
    }
    return GP_INNER(be)->map(GP_INNER(be), addr, size, handle);
}

/* A host backend of 64 MiB (*host) behind a wrapper whose map checks
 * checked_pool first. */
static gp_backend_wrap *checking_backend(gp_backend **host)
{
    CHECK(gp_backend_host_create(64 * MiB, host) == GP_OK);
    gp_backend_wrap *w = calloc(1, sizeof *w);
    CHECK(w != NULL);
    gp_backend_forward(w, *host);
    w->be.map = checking_map;
    return w;
}

static void test_check_while_a_plan_maps(void)
{
    gp_backend *host;
    gp_backend_wrap *w = checking_backend(&host);
    gp_pool *p = make_pool_on(&w->be, 256 * KiB, GP_MODE_EXPANDABLE);
    void *x = A(p, 4 * MiB, T_W);
    fill(x, 4 * MiB, 7);
    gp_offload_plan *pl;
    gp_tag tags[1] = {T_W};
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs >= 1);
    saved sv = copy_out(pl);
    CHECK(unmap_all(p, pl));
    gp_offload_run run = pl->runs[0];
    CHECK(pl->n_runs == 1 && gp_pool_plan_end(p, pl, 0) == GP_OK);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    CHECK(s.reserved_peak >= s.reserved + run.size); /* (4 MiB were mapped before) */
    gp_pool_reset_peaks(p); /* so that the restore's maps raise the peak */
    CHECK(gp_pool_restore_begin(p, &run, 1, &pl) == GP_OK);
    checked_pool = p;
    CHECK(map_all(p, pl));
    checked_pool = NULL;
    CHECK(checks_in_map > 0);
    if (violations_in_map) fprintf(stderr, "check during a plan's map: %s\n", first_violation);
    CHECK(violations_in_map == 0);
    CHECK(pl->n_ranges == sv.n); /* (one block: the same range) */
    for (size_t i = 0; i < pl->n_ranges && i < sv.n; i++)
        memcpy((void *)pl->ranges[i].addr, sv.data[i], pl->ranges[i].size);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_OK && same(x, 4 * MiB, 7));
    saved_free(&sv);
    gp_free(p, x);
    done(p);
}

/* An optimizer's step, cut down: a restore that would pass the peak gives
 * cache back (a pool with no slack: all of it over the floor), and the
 * offload behind the next step maps it again in its place as it gives the
 * state's memory back (plan.refill), on its own thread and without the
 * pool's lock: the next "forward pass" finds its cache where it was, with
 * no map of its own.  Without refill it maps; under a limit only what the
 * limit leaves is mapped again; a trim asked for meanwhile cancels it.
 * The pool is checked while the refill maps (the lock let go). */
enum { REFILL_OFF, REFILL_ON, REFILL_LIMIT, REFILL_TRIMMED, REFILL_FAULT };

static void test_refill(int mode)
{
    gp_backend *host;
    gp_backend_wrap *w = checking_backend(&host);
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = cfg.large_chunk = 1 * MiB;
    cfg.small_size = 64 * KiB;
    cfg.cache_slack = 0;
    cfg.mode = GP_MODE_EXPANDABLE;
    gp_pool *p;
    CHECK(gp_pool_create(&w->be, &cfg, &p) == GP_OK);
    void *st = A(p, 8 * MiB, T_W); /* the state */
    fill(st, 8 * MiB, 3);
    /* The forward pass's memory: two pieces apart (the restore's trim
     * takes the 8 MiB it maps: one of them). */
    void *act[2], *sep;
    act[0] = A(p, 8 * MiB, T_O);
    sep = A(p, 1 * MiB, T_O);
    act[1] = A(p, 8 * MiB, T_O);
    for (int i = 0; i < 2; i++) gp_free(p, act[i]);
    gp_tag tags[1] = {T_W};
    gp_offload_plan *pl;
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK && pl->n_runs == 1);
    saved sv = copy_out(pl);
    gp_offload_run run = pl->runs[0];
    CHECK(unmap_all(p, pl) && gp_pool_plan_end(p, pl, 0) == GP_OK);
    gp_pool_reset_peaks(p); /* (the peak is the cache's: the restore gives some back) */
    gp_stats s0, s1, s2, s3;
    gp_pool_stats(p, &s0, 0);
    CHECK(gp_pool_restore_begin(p, &run, 1, &pl) == GP_OK && map_all(p, pl));
    memcpy((void *)pl->ranges[0].addr, sv.data[0], pl->ranges[0].size);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_OK && same(st, 8 * MiB, 3));
    gp_pool_stats(p, &s1, 0);
    CHECK(s1.reserved == s0.reserved && s1.unmapped_total - s0.unmapped_total == 8 * MiB); /* one piece went */
    uint64_t trimmed = 0;
    if (mode == REFILL_LIMIT) gp_pool_set_limit(p, s1.reserved - 4 * MiB);
    if (mode == REFILL_TRIMMED) CHECK((trimmed = gp_pool_trim(p, 1 * MiB)) >= 1 * MiB);
    CHECK(gp_pool_offload_begin(p, tags, 1, &pl) == GP_OK);
    pl->refill = mode != REFILL_OFF;
    /* (The third map fails: two chunks come back, the rest is the phase's
     * to map, and the state goes out all the same.) */
    if (mode == REFILL_FAULT) gp_host_fail(host, GP_HOST_MAP, 3, GP_ERR_OOM, GP_HOST_FAIL_ONCE);
    checked_pool = p;
    checks_in_map = violations_in_map = 0;
    CHECK(unmap_all(p, pl));
    checked_pool = NULL;
    if (violations_in_map) fprintf(stderr, "check during a refill: %s\n", first_violation);
    CHECK(violations_in_map == 0);
    CHECK(gp_pool_plan_end(p, pl, 0) == GP_OK);
    gp_pool_stats(p, &s2, 0);
    uint64_t refilled = s2.refilled_total - s1.refilled_total;
    CHECK(refilled == (mode == REFILL_ON ? 8 * MiB : mode == REFILL_LIMIT ? 4 * MiB : mode == REFILL_FAULT ? 2 * MiB : 0));
    /* (A check per chunk the refill mapped, and the one refused.) */
    CHECK(checks_in_map == (int)(refilled / MiB) + (mode == REFILL_FAULT));
    CHECK(s2.n_map_fail - s1.n_map_fail == (mode == REFILL_FAULT));
    CHECK(s2.reserved == s1.reserved - 8 * MiB - trimmed + refilled);
    CHECK(pool_consistent(p, NULL) == 0);
    /* The next forward pass: its cache, at its addresses, with no map
     * where all of it came back. */
    gp_pool_set_limit(p, 0);
    void *again[2] = {A(p, 8 * MiB, T_O), A(p, 8 * MiB, T_O)};
    gp_pool_stats(p, &s3, 0);
    CHECK(again[0] && again[1]);
    if (mode == REFILL_ON)
        CHECK(s3.n_map == s2.n_map && ((again[0] == act[0] && again[1] == act[1]) ||
                                       (again[0] == act[1] && again[1] == act[0])));
    else
        CHECK(s3.n_map > s2.n_map);
    for (int i = 0; i < 2; i++) gp_free(p, again[i]);
    gp_free(p, sep);
    CHECK(gp_pool_restore_begin(p, &run, 1, &pl) == GP_OK && map_all(p, pl));
    memcpy((void *)pl->ranges[0].addr, sv.data[0], pl->ranges[0].size);
    CHECK(gp_pool_plan_end(p, pl, 1) == GP_OK && same(st, 8 * MiB, 3));
    saved_free(&sv);
    gp_free(p, st);
    done(p);
}

int main(void)
{
    CHECK(gp_tag_intern("offl", &T_W) == GP_OK);
    CHECK(gp_tag_intern("other", &T_O) == GP_OK);
    CHECK(gp_tag_intern("kv_cache", &T_X) == GP_OK); /* long-lived: placement */
    test_offload_restore();
    test_shared_chunk();
    test_apart();
    test_free_retag_abort();
    test_restore_limit();
    test_edge_cache_stays();
    test_destroy_offloaded();
    test_both_arenas_in_order();
    test_check_while_a_plan_maps();
    test_refill(REFILL_OFF);
    test_refill(REFILL_ON);
    test_refill(REFILL_LIMIT);
    test_refill(REFILL_TRIMMED);
    test_refill(REFILL_FAULT);
    for (unsigned s = 1; s <= 3; s++) {
        test_random(s, GP_MODE_EXPANDABLE, 0);
        test_random(s + 100, GP_MODE_EXPANDABLE, 1);
    }
    test_random(7, GP_MODE_RESERVE, 0);
    return check_done();
}
