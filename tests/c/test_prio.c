/*
 * test_prio.c -- tags and priorities acting on memory, on the host backend:
 * who may release cached memory and whom the pressure callback is asked to
 * displace when the pool limit or the device is reached, re-tagging of live
 * blocks, the default priority, lifetime-aware placement, and the tag table
 * limit.  Run under ASan and UBSan by the test suite.
 */
#include <string.h>

#include "pool.h"
#include "pool_check.h"

enum { LOW = GP_PRIO_LOW, NORMAL = GP_PRIO_NORMAL, HIGH = GP_PRIO_HIGH, CRIT = GP_PRIO_CRITICAL };

static gp_pool *pool_with(uint64_t capacity, int placement, int priority, gp_backend **be)
{
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 256 * KiB;
    cfg.large_chunk = 256 * KiB;
    cfg.small_size = 64 * KiB;
    cfg.cache_slack = -1; /* keep every cached chunk: the tests count them */
    cfg.placement = placement;
    cfg.priority = priority;
    gp_backend *b;
    gp_pool *p;
    if (gp_backend_host_create(capacity, &b) != GP_OK || gp_pool_create(b, &cfg, &p) != GP_OK) {
        fprintf(stderr, "pool: %s\n", gp_last_error());
        exit(2);
    }
    if (be) *be = b;
    return p;
}

static void *AP(gp_pool *p, uint64_t n, int prio, gp_status *st)
{
    return gp_alloc(p, n, NULL, GP_TAG_UNTAGGED, prio, st);
}

static uint64_t reserved(gp_pool *p)
{
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    return s.reserved;
}

/* The state of the block at `addr` (-1: no block starts there). */
typedef struct find_state {
    uintptr_t addr;
    int state, prio, life;
} find_state;

static int find_fn(void *arg, const gp_block_info *b)
{
    find_state *f = arg;
    if (b->addr != f->addr) return 0;
    f->state = b->state;
    f->prio = b->priority;
    f->life = b->lifetime;
    return 1;
}

static find_state block_at(gp_pool *p, const void *addr)
{
    find_state f = {.addr = (uintptr_t)addr, .state = -1};
    gp_pool_walk(p, find_fn, &f);
    return f;
}

/* Cache of priority `prio`: two 3 MiB free blocks held apart by live 1 MiB
 * blocks (so that a 4 MiB request fits in neither and must grow). */
typedef struct cache2 {
    void *hole1, *hole2, *sep1, *sep2;
} cache2;

static cache2 make_cache(gp_pool *p, int prio1, int prio2)
{
    cache2 c;
    c.hole1 = AP(p, 3 * MiB, prio1, NULL);
    c.sep1 = AP(p, 1 * MiB, CRIT, NULL);
    c.hole2 = AP(p, 3 * MiB, prio2, NULL);
    c.sep2 = AP(p, 1 * MiB, CRIT, NULL);
    CHECK(c.hole1 && c.sep1 && c.hole2 && c.sep2);
    gp_free(p, c.hole1);
    gp_free(p, c.hole2);
    return c;
}

/* At the pool limit: a lower-priority request never releases the cache of a
 * higher priority; an equal or higher one does. */
static void test_limit_low_cannot_displace_high_cache(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    gp_pool_set_limit(p, 8 * MiB);
    cache2 c = make_cache(p, HIGH, HIGH);
    CHECK(reserved(p) == 8 * MiB);
    gp_status st;
    CHECK(AP(p, 4 * MiB, LOW, &st) == NULL && st == GP_ERR_LIMIT);
    CHECK(strstr(gp_last_error(), "priorities above") != NULL);
    CHECK(AP(p, 4 * MiB, NORMAL, &st) == NULL && st == GP_ERR_LIMIT);
    /* The high cache is intact: still mapped, still free. */
    CHECK(reserved(p) == 8 * MiB);
    CHECK(block_at(p, c.hole1).state == GP_BLOCK_FREE && block_at(p, c.hole1).prio == HIGH);
    CHECK(block_at(p, c.hole2).state == GP_BLOCK_FREE);
    /* A high request may release it. */
    void *h = AP(p, 4 * MiB, HIGH, &st);
    CHECK(h != NULL && st == GP_OK && reserved(p) <= 8 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, h);
    gp_free(p, c.sep1);
    gp_free(p, c.sep2);
    done(p);
}

/* A high request displaces low cache before normal cache, and only as much
 * as it needs; a low request then cannot touch the normal cache left. */
static void test_limit_lowest_cache_first(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    gp_pool_set_limit(p, 10 * MiB);
    cache2 c = make_cache(p, NORMAL, LOW); /* hole2 (low) lies above hole1 (normal) */
    CHECK(reserved(p) == 8 * MiB);
    gp_status st;
    void *h = AP(p, 4 * MiB, HIGH, &st); /* 2 MiB over the limit */
    CHECK(h != NULL);
    /* 2 MiB of the low cache went, its last chunks, and no more. */
    CHECK(block_at(p, c.hole2).state == GP_BLOCK_FREE);
    CHECK(block_at(p, (char *)c.hole2 + MiB).state == GP_BLOCK_FREE_UNMAPPED);
    CHECK(block_at(p, c.hole1).state == GP_BLOCK_FREE); /* normal cache stayed */
    CHECK(reserved(p) == 10 * MiB);
    CHECK(AP(p, 4 * MiB, LOW, &st) == NULL && st == GP_ERR_LIMIT);
    /* (The low request gave back the low chunk left, and no normal cache.) */
    CHECK(block_at(p, c.hole1).state == GP_BLOCK_FREE && reserved(p) == 9 * MiB);
    /* The same priority may release its own cache. */
    void *n = AP(p, 4 * MiB, NORMAL, &st);
    CHECK(n != NULL && block_at(p, c.hole1).state != GP_BLOCK_FREE);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, n);
    gp_free(p, h);
    gp_free(p, c.sep1);
    gp_free(p, c.sep2);
    done(p);
}

/* The same rules when the device, not the limit, is full. */
static void test_device_full(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(8 * MiB, GP_PLACE_NONE, NORMAL, &be);
    cache2 c = make_cache(p, HIGH, LOW);
    gp_status st;
    /* Low may take the low cache (3 MiB) but needs 4: the high cache stays. */
    CHECK(AP(p, 4 * MiB, LOW, &st) == NULL && st == GP_ERR_OOM);
    CHECK(block_at(p, c.hole1).state == GP_BLOCK_FREE);
    void *h = AP(p, 4 * MiB, HIGH, &st);
    CHECK(h != NULL);
    gp_host_counters hc;
    gp_host_counters_get(be, &hc);
    CHECK(hc.mapped == reserved(p) && reserved(p) <= 8 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, h);
    gp_free(p, c.sep1);
    gp_free(p, c.sep2);
    done(p);
}

/* The layer above (offload): gives up live blocks of priorities below the
 * request's only, lowest first, and records what it was asked. */
typedef struct offloader {
    void *blocks[8];
    int prio[8];
    int n, calls, asked;
} offloader;

static uint64_t offload_fn(void *arg, gp_pool *pool, uint64_t needed, int prio)
{
    offloader *o = arg;
    o->calls++;
    o->asked = prio;
    uint64_t got = 0;
    for (int level = 0; level < prio && got < needed; level++) {
        for (int i = 0; i < o->n && got < needed; i++) {
            if (!o->blocks[i] || o->prio[i] != level) continue;
            gp_block_info info;
            gp_pool_lookup(pool, o->blocks[i], &info);
            gp_free(pool, o->blocks[i]);
            o->blocks[i] = NULL;
            got += info.size;
        }
    }
    return got;
}

static void *held(gp_pool *p, offloader *o, uint64_t n, int prio)
{
    void *x = AP(p, n, prio, NULL);
    o->blocks[o->n] = x;
    o->prio[o->n++] = prio;
    return x;
}

static void test_pressure_priorities(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    gp_pool_set_limit(p, 8 * MiB);
    offloader o = {0};
    gp_pool_set_pressure(p, offload_fn, &o);
    void *lw = held(p, &o, 4 * MiB, LOW), *nw = held(p, &o, 4 * MiB, NORMAL);
    CHECK(lw && nw);
    gp_status st;
    /* Nothing below low: the callback is not even asked. */
    CHECK(AP(p, 4 * MiB, LOW, &st) == NULL && st == GP_ERR_LIMIT && o.calls == 0);
    /* Normal displaces the low block, not its peer. */
    void *n2 = AP(p, 4 * MiB, NORMAL, &st);
    CHECK(n2 != NULL && o.calls == 1 && o.asked == NORMAL && o.blocks[0] == NULL && o.blocks[1] == nw);
    /* Critical never fails while lower memory can be given up. */
    void *c1 = AP(p, 4 * MiB, CRIT, &st);
    CHECK(c1 != NULL && o.calls == 2 && o.asked == CRIT && o.blocks[1] == NULL);
    /* Now the pool holds normal (n2, not the offloader's) and critical:
     * critical displaces nobody it may not, and fails when nothing lower is
     * offloadable -- the callback is asked and gives up nothing. */
    CHECK(AP(p, 4 * MiB, CRIT, &st) == NULL && st == GP_ERR_LIMIT && o.calls == 3);
    CHECK(reserved(p) == 8 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, n2);
    gp_free(p, c1);
    done(p);
}

/* The pressure callback runs without the pool's lock, and what happens
 * meanwhile must not break what the request decided before it (issue 14):
 * here the callback makes n small allocations, then frees the low-priority
 * block, which the request then splits.  Each allocation uses one spare
 * block header, so one n in a slab's worth leaves the spare list empty
 * whatever its length was before -- the split dereferenced it (SEGV). */
typedef struct greedy {
    void *victim;
    void *small[GP_SLAB_BLOCKS + 64];
    int n, made;
    gp_tag tag;       /* also allocate `tag_bytes` under this tag */
    uint64_t tag_bytes;
    void *tagged;
} greedy;

static uint64_t greedy_fn(void *arg, gp_pool *pool, uint64_t needed, int prio)
{
    (void)needed;
    (void)prio;
    greedy *g = arg;
    for (int i = 0; i < g->n; i++) g->small[g->made++] = AP(pool, 512, CRIT, NULL);
    if (g->tag_bytes) g->tagged = gp_alloc(pool, g->tag_bytes, NULL, g->tag, CRIT, NULL);
    gp_free(pool, g->victim);
    g->victim = NULL;
    return 4 * MiB;
}

static void test_pressure_callback_that_allocates(void)
{
    int ok = 1;
    for (int n = 0; n <= GP_SLAB_BLOCKS + 32; n++) {
        gp_backend *be;
        gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
        gp_pool_set_limit(p, 8 * MiB);
        greedy g = {.n = n};
        gp_pool_set_pressure(p, greedy_fn, &g);
        g.victim = AP(p, 5 * MiB, LOW, NULL);
        gp_status st;
        void *x = AP(p, 4 * MiB, HIGH, &st); /* over the limit: the callback frees the victim */
        ok &= x != NULL && g.victim == NULL && g.made == n && pool_consistent(p, be) == 0;
        gp_free(p, x);
        for (int i = 0; i < g.made; i++) ok &= g.small[i] != NULL && gp_free(p, g.small[i]) == GP_OK;
        ok &= pool_consistent(p, be) == 0;
        gp_pool_destroy(p);
    }
    CHECK(ok);

    /* The tag limit, checked before the callback, is checked again after
     * it: the callback allocated under the same tag meanwhile. */
    gp_tag kv;
    CHECK(gp_tag_intern("kv_cache", &kv) == GP_OK);
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    gp_pool_set_limit(p, 8 * MiB);
    CHECK(gp_pool_set_tag_limit(p, kv, 6 * MiB) == GP_OK);
    greedy g = {.tag = kv, .tag_bytes = 2 * MiB};
    gp_pool_set_pressure(p, greedy_fn, &g);
    void *k = gp_alloc(p, 1 * MiB, NULL, kv, HIGH, NULL);
    g.victim = AP(p, 4 * MiB, LOW, NULL);
    gp_status st;
    void *x = gp_alloc(p, 4 * MiB, NULL, kv, HIGH, &st); /* 1 + 2 + 4 > 6 once the callback ran */
    CHECK(x == NULL && st == GP_ERR_LIMIT && g.victim == NULL && g.tagged != NULL);
    CHECK(strstr(gp_last_error(), "kv_cache") != NULL);
    gp_tag_stats ts;
    gp_pool_tag_stats(p, kv, &ts);
    CHECK(ts.allocated == 3 * MiB);
    CHECK(pool_consistent(p, be) == 0);
    gp_free(p, x);
    gp_free(p, k);
    gp_free(p, g.tagged);
    done(p);
}

/* Free neighbours merge to the highest of their priorities. */
static void test_cache_priority_merges_up(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    void *a = AP(p, 1 * MiB, LOW, NULL), *b = AP(p, 1 * MiB, HIGH, NULL), *c = AP(p, 1 * MiB, LOW, NULL);
    void *d = AP(p, 1 * MiB, LOW, NULL); /* keeps c from merging with the unmapped tail */
    gp_free(p, a);
    CHECK(block_at(p, a).prio == LOW);
    gp_free(p, b);
    CHECK(block_at(p, a).prio == HIGH && block_at(p, b).state == -1); /* merged into a */
    gp_free(p, c);
    CHECK(block_at(p, a).prio == HIGH);
    gp_free(p, d);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

static void test_default_priority(void)
{
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, HIGH, NULL);
    void *x = gp_alloc(p, 4096, NULL, GP_TAG_UNTAGGED, GP_PRIO_DEFAULT, NULL);
    gp_block_info info;
    CHECK(x && gp_pool_lookup(p, x, &info) == GP_OK && info.priority == HIGH);
    uint64_t cur, peak;
    gp_pool_prio_stats(p, HIGH, &cur, &peak);
    CHECK(cur == 4096);
    gp_status st;
    CHECK(gp_alloc(p, 4096, NULL, GP_TAG_UNTAGGED, -2, &st) == NULL && st == GP_ERR_INVALID);
    gp_free(p, x);
    done(p);
}

static void test_retag(void)
{
    gp_backend *be;
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_NONE, NORMAL, &be);
    gp_tag acts, weights;
    CHECK(gp_tag_intern("acts", &acts) == GP_OK && gp_tag_intern("weights", &weights) == GP_OK);
    char *w1 = gp_alloc(p, 1000, NULL, acts, LOW, NULL);
    char *w2 = gp_alloc(p, 2 * MiB, NULL, acts, LOW, NULL);
    char *keep = gp_alloc(p, 3000, NULL, acts, LOW, NULL);
    CHECK(w1 && w2 && keep);
    gp_block_info i1, i2, ik;
    gp_pool_lookup(p, w1, &i1);
    gp_pool_lookup(p, w2, &i2);
    gp_pool_lookup(p, keep, &ik);
    gp_tag_stats ta, tw;
    uint64_t moved, cur, peak;
    /* An interior address names its block; a block named twice counts once. */
    void *ptrs[] = {w1, w2 + 12345, w1 + 512};
    CHECK(gp_pool_retag(p, ptrs, 3, weights, HIGH, &moved) == GP_OK);
    CHECK(moved == i1.size + i2.size);
    gp_pool_tag_stats(p, acts, &ta);
    gp_pool_tag_stats(p, weights, &tw);
    CHECK(ta.allocated == ik.size && ta.active_blocks == 1 && ta.requested == 3000);
    CHECK(tw.allocated == i1.size + i2.size && tw.active_blocks == 2 && tw.requested == 1000 + 2 * MiB);
    CHECK(tw.allocated_peak == tw.allocated && tw.n_alloc == 0);
    gp_pool_prio_stats(p, LOW, &cur, &peak);
    CHECK(cur == ik.size);
    gp_pool_prio_stats(p, HIGH, &cur, &peak);
    CHECK(cur == i1.size + i2.size);
    gp_block_info after;
    CHECK(gp_pool_lookup(p, w2, &after) == GP_OK && after.tag == weights && after.priority == HIGH &&
          after.addr == i2.addr);
    /* Again, keeping priorities: nothing to move. */
    CHECK(gp_pool_retag(p, ptrs, 2, weights, GP_PRIO_DEFAULT, &moved) == GP_OK && moved == 0);
    /* All or nothing: one foreign address, or the tag's limit, changes nothing. */
    void *bad[] = {keep, (void *)(uintptr_t)4096};
    CHECK(gp_pool_retag(p, bad, 2, weights, GP_PRIO_DEFAULT, NULL) == GP_ERR_FOREIGN);
    CHECK(gp_pool_set_tag_limit(p, weights, tw.allocated + 1) == GP_OK);
    CHECK(gp_pool_retag(p, bad, 1, weights, GP_PRIO_DEFAULT, NULL) == GP_ERR_LIMIT);
    gp_pool_tag_stats(p, acts, &ta);
    CHECK(ta.allocated == ik.size && ta.active_blocks == 1);
    /* A tag over a limit lowered since may still re-prioritise its own
     * blocks, which adds nothing to it (it was refused as exceeding it). */
    CHECK(gp_pool_set_tag_limit(p, weights, 4096) == GP_OK);
    CHECK(gp_pool_retag(p, ptrs, 1, weights, NORMAL, &moved) == GP_OK && moved == i1.size);
    CHECK(gp_pool_retag(p, ptrs, 1, weights, HIGH, &moved) == GP_OK && moved == i1.size);
    CHECK(gp_pool_retag(p, bad, 1, weights, GP_PRIO_DEFAULT, NULL) == GP_ERR_LIMIT);
    CHECK(gp_pool_retag(p, bad, 1, (gp_tag)(GP_MAX_TAGS - 1), NORMAL, NULL) == GP_ERR_INVALID);
    CHECK(gp_pool_retag(p, bad, 1, weights, GP_PRIO_MAX + 1, NULL) == GP_ERR_INVALID);
    /* A free after the retag is counted against the new tag and priority. */
    gp_free(p, w1);
    gp_free(p, w2);
    gp_pool_tag_stats(p, weights, &tw);
    gp_pool_prio_stats(p, HIGH, &cur, &peak);
    CHECK(tw.allocated == 0 && tw.active_blocks == 0 && tw.requested == 0 && cur == 0);
    gp_free(p, keep);
    gp_pool_tag_stats(p, acts, &ta);
    CHECK(ta.allocated == 0 && ta.requested == 0);
    CHECK(pool_consistent(p, be) == 0);
    done(p);
}

/* Placement: long-lived tags in a region of their own; free blocks of one
 * region never serve the other; with placement off, one region. */
static void test_placement_separates(void)
{
    gp_tag weights, acts;
    CHECK(gp_tag_intern("weights", &weights) == GP_OK && gp_tag_intern("acts", &acts) == GP_OK);
    CHECK(gp_tag_lifetime(weights) == GP_LIFE_LONG && gp_tag_lifetime(acts) == GP_LIFE_SHORT);
    for (int placement = 0; placement < 2; placement++) {
        gp_backend *be;
        gp_pool *p = pool_with(64 * MiB, placement, NORMAL, &be);
        char *w[4], *s[4];
        for (int i = 0; i < 4; i++) {
            w[i] = gp_alloc(p, (i + 1) * 300 * KiB, NULL, weights, NORMAL, NULL);
            s[i] = gp_alloc(p, (i + 1) * 300 * KiB, NULL, acts, NORMAL, NULL);
            CHECK(w[i] && s[i]);
        }
        uintptr_t lo_w = UINTPTR_MAX, hi_s = 0;
        for (int i = 0; i < 4; i++) {
            gp_block_info iw, is;
            gp_pool_lookup(p, w[i], &iw);
            gp_pool_lookup(p, s[i], &is);
            CHECK(iw.lifetime == (placement ? GP_LIFE_LONG : GP_LIFE_SHORT) && is.lifetime == GP_LIFE_SHORT);
            if (iw.addr < lo_w) lo_w = iw.addr;
            if (is.addr > hi_s) hi_s = is.addr;
        }
        /* Separated: every weight lies above every activation. */
        CHECK(placement ? lo_w > hi_s : lo_w < hi_s);
        /* A freed weight's block is not handed to an activation. */
        gp_free(p, w[1]);
        char *s2 = gp_alloc(p, 600 * KiB, NULL, acts, NORMAL, NULL);
        CHECK(placement ? s2 != w[1] : s2 == w[1]);
        CHECK(pool_consistent(p, be) == 0);
        gp_pool_trim(p, UINT64_MAX);
        CHECK(pool_consistent(p, be) == 0);
        gp_free(p, s2);
        for (int i = 0; i < 4; i++) {
            if (i != 1) gp_free(p, w[i]);
            gp_free(p, s[i]);
        }
        gp_pool_trim(p, UINT64_MAX);
        CHECK(reserved(p) == 0 && pool_consistent(p, be) == 0);
        done(p);
    }
    /* A lifetime is a property of the tag: set, applied to new allocations. */
    CHECK(gp_tag_set_lifetime(acts, GP_LIFE_LONG) == GP_OK && gp_tag_lifetime(acts) == GP_LIFE_LONG);
    gp_pool *p = pool_with(64 * MiB, GP_PLACE_LIFETIME, NORMAL, NULL);
    void *x = gp_alloc(p, 4096, NULL, acts, NORMAL, NULL);
    gp_block_info info;
    CHECK(gp_pool_lookup(p, x, &info) == GP_OK && info.lifetime == GP_LIFE_LONG);
    gp_free(p, x);
    done(p);
    CHECK(gp_tag_set_lifetime(acts, GP_LIFE_SHORT) == GP_OK);
    CHECK(gp_tag_set_lifetime(acts, 2) == GP_ERR_INVALID);
    CHECK(gp_tag_set_lifetime((gp_tag)(GP_MAX_TAGS - 1), GP_LIFE_LONG) == GP_ERR_INVALID);
}

/* The fragmentation placement prevents: each step an activation of a size
 * that grows and falls back (a new shape), and while it lives a small
 * long-lived block (optimizer state made lazily, a cache growing).  Without
 * placement the long-lived block lands beside the activation and pins the
 * hole it leaves, which the next, larger activation cannot use; with it,
 * the activations' region stays one run that is reused and extended.
 * Returns the peak reserved. */
static uint64_t frag_peak(int placement)
{
    gp_backend *be;
    gp_pool *p = pool_with(1024 * MiB, placement, NORMAL, &be);
    gp_tag opt, acts;
    gp_tag_intern("optimizer", &opt);
    gp_tag_intern("acts", &acts);
    void *state[64];
    for (int step = 0; step < 64; step++) {
        uint64_t size = (uint64_t)(1 + step % 8) * MiB;
        void *a = gp_alloc(p, size, NULL, acts, NORMAL, NULL);
        void *b = gp_alloc(p, size / 2, NULL, acts, NORMAL, NULL);
        state[step] = gp_alloc(p, 256 * KiB, NULL, opt, NORMAL, NULL);
        CHECK(a && b && state[step]);
        gp_free(p, a);
        gp_free(p, b);
    }
    CHECK(pool_consistent(p, be) == 0);
    gp_stats s;
    gp_pool_stats(p, &s, 0);
    for (int i = 0; i < 64; i++) gp_free(p, state[i]);
    done(p);
    return s.reserved_peak;
}

static void test_placement_fragmentation(void)
{
    uint64_t none = frag_peak(GP_PLACE_NONE), life = frag_peak(GP_PLACE_LIFETIME);
    printf("fragmentation trace: peak reserved %.1f MiB without placement, %.1f MiB with\n",
           (double)none / MiB, (double)life / MiB);
    CHECK(life < none);
}

/* At least 255 distinct tags; past the table, a clear error (last: it fills
 * the process-wide table). */
static void test_tag_table(void)
{
    char name[32];
    gp_tag t = 0, first = 0;
    unsigned start = gp_tag_count();
    for (unsigned i = start; i < GP_MAX_TAGS; i++) {
        snprintf(name, sizeof name, "t%u", i);
        CHECK(gp_tag_intern(name, &t) == GP_OK && t == i);
        if (i == start) first = t;
    }
    CHECK(GP_MAX_TAGS >= 255 && gp_tag_count() == GP_MAX_TAGS);
    snprintf(name, sizeof name, "t%u", start);
    CHECK(gp_tag_intern(name, &t) == GP_OK && t == first); /* old names still resolve */
    CHECK(gp_tag_intern("one-too-many", &t) == GP_ERR_TOO_MANY);
    CHECK(strstr(gp_last_error(), "all 1024 tags are in use") != NULL);
    CHECK(gp_tag_intern("has space", &t) == GP_ERR_INVALID);
}

int main(void)
{
    test_limit_low_cannot_displace_high_cache();
    test_limit_lowest_cache_first();
    test_device_full();
    test_pressure_priorities();
    test_pressure_callback_that_allocates();
    test_cache_priority_merges_up();
    test_default_priority();
    test_retag();
    test_placement_separates();
    test_placement_fragmentation();
    test_tag_table();
    return check_done();
}
