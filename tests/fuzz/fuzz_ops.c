/*
 * fuzz_ops.c -- libFuzzer target: an input is a program of operations over
 * the public C API, run on a fresh host-backend pool and checked against a
 * reference model after every operation.
 *
 * The first bytes choose the pool: capacity, expandable or reserve mode,
 * placement, chunk sizes, small-block threshold, cache slack, reserve size,
 * limit, default priority, history.  Every later byte group is one
 * operation (opcode, then its arguments; a short input reads zeros):
 * allocations of any size (0, huge, overflowing), stream (up to 256 of
 * them, past the pool's 64), tag (interned or never), priority (in range
 * or not); frees; bad frees (interior pointers, freed ones, foreign ones);
 * trims; pool and tag limits; re-tagging; record_stream and stream
 * progress; graph capture prepare/begin/end/release and streams that join
 * a capture unnamed; history on/off/read/note; a pressure callback that
 * allocates, frees and gives up a lower-priority block; queries (lookup,
 * walk, stats, headroom, OOM report); the device's capacity; injected
 * backend failures (gp_host_fail); and groups of blocks apart.
 *
 * The model holds what must be true: which blocks are live, their sizes,
 * tags, priorities, streams and recorded streams, the limits, the graph
 * pools and captures.  After every operation: the status is one the
 * operation may return in the model's state (exactly the one, where the
 * model can tell), every failure leaves a message, gp_pool_check finds
 * nothing, the backend maps what the pool reserves and saw no misuse, the
 * pool's figures (allocated, requested, blocks; per tag; per priority)
 * equal the model's, no two live blocks overlap, every live block keeps
 * its stamps, limits hold.  At the end faults stop, captures end, graphs
 * are released, everything is freed, and the cache must empty; the pool
 * is destroyed leaving nothing behind.  A violation aborts (a finding).
 *
 * Offload (csrc/pool_offload.c) adds its operations to the OPS list below
 * (offload_begin/restore_begin with plan_unmap/plan_map/plan_end): an
 * offloaded block stays live in the model (it can be freed, retagged and
 * looked up) but its bytes move from `allocated` to `offloaded`; keep a
 * flag per mblock and check gp_stats.offloaded and gp_tag_stats.offloaded
 * in check_figures, and skip stamp checks of offloaded blocks.
 *
 * Build and run: see tests/fuzz/README.md.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_host.h"
#include "fuzz.h"
#include "stamps.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)


/* ------------------------------------------------------------------ model */

#define MAXLIVE 256
#define NTAGS 5 /* interned at start; one more id is never interned */
#define NKEYS 20
#define NSTREAMS 256
static const char *const tag_names[NTAGS] = {"untagged", "weights", "activations", "kv_cache", "grads"};
static gp_tag tags[NTAGS];

typedef struct mblock {
    char *ptr;
    uint64_t req, size, stamp;
    int tag, prio;
    gp_stream own;            /* the stream the pool reports for it */
    gp_stream rec[8];         /* streams named to record_stream */
    int nrec;
} mblock;

typedef struct model {
    gp_backend *be;
    gp_pool *p;
    gp_config cfg;
    uint64_t capacity;
    mblock b[MAXLIVE];
    int n;
    uint64_t tag_limit[NTAGS];
    char *freed[16]; /* addresses freed lately, for double frees */
    unsigned n_freed;
    /* graph pools: references per key, live or not; captures per stream
     * (named to capture_begin), streams the host says capture unnamed */
    unsigned refs[NKEYS];
    int gpool_live[NKEYS]; /* GP_LIVE_* */
    unsigned captures; /* streams capturing now */
    uint8_t capturing[NSTREAMS], forked[NSTREAMS];
    /* the pressure callback */
    int pressure_on, pressure_allocs, pressure_keep, pressure_first, in_pressure;
    uint64_t stamp_seq, misuse;
    uint64_t injected0; /* injected() when the operation began */
    /* calls that worked, and the peaks since creation or the last reset */
    uint64_t n_alloc, n_free;
    uint64_t peak_alloc, peak_req, peak_blocks, tag_peak[NTAGS], prio_peak[256];
} model;

static model M;
static int trace; /* FUZZ_OPS_TRACE=1: print every operation (to read a finding) */

/* Whether a graph pool lives: a failed device sync may stop the pool from
 * giving back some of the unheld ones and not others, so after one the
 * model cannot tell. */
enum { GP_DEAD = 0, GP_LIVE = 1, GP_MAYBE = 2 };

/* Backend failures injected so far (gp_host_fail), to tell what an
 * operation may return. */
static uint64_t injected(void)
{
    gp_host_counters c;
    gp_host_counters_get(M.be, &c);
    uint64_t n = 0;
    for (int i = 0; i < GP_HOST_FN_COUNT; i++) n += c.injected[i];
    return n;
}

/* Whether the operation's failure is an injected one it passes on, named
 * (any status: the fault chose it). */
static int injected_failure(void)
{
    return injected() > M.injected0 && strstr(gp_last_error(), "injected");
}

static gp_stream stream_of(unsigned i) { return i ? (gp_stream)(uintptr_t)(0x1000 + 16 * (uintptr_t)i) : NULL; }

static int find_live(const void *ptr)
{
    for (int i = 0; i < M.n; i++)
        if (M.b[i].ptr == ptr) return i;
    return -1;
}

static void forget(int i)
{
    M.n_free++;
    M.freed[M.n_freed++ % 16] = M.b[i].ptr;
    M.b[i] = M.b[--M.n];
}

/* ------------------------------------------------------------ the checks */

static void check_figures(const char *after)
{
    char msg[512];
    size_t v = gp_pool_check(M.p, msg, sizeof msg);
    EXPECT(v == 0, "after %s: gp_pool_check: %zu violations, the first: %s", after, v, msg);
    gp_stats s;
    gp_host_counters c;
    gp_pool_stats(M.p, &s, 0);
    gp_host_counters_get(M.be, &c);
    EXPECT(c.mapped == s.reserved, "after %s: the backend maps %llu bytes, reserved is %llu", after,
           (unsigned long long)c.mapped, (unsigned long long)s.reserved);
    uint64_t misuse = gp_host_misuse(msg, sizeof msg);
    EXPECT(misuse == M.misuse, "after %s: backend misuse: %s", after, msg);
    uint64_t alloc = 0, req = 0, tag_alloc[NTAGS] = {0}, tag_req[NTAGS] = {0}, tag_n[NTAGS] = {0}, prio[256] = {0};
    for (int i = 0; i < M.n; i++) {
        const mblock *b = &M.b[i];
        alloc += b->size;
        req += b->req;
        tag_alloc[b->tag] += b->size;
        tag_req[b->tag] += b->req;
        tag_n[b->tag]++;
        prio[b->prio] += b->size;
        EXPECT(stamp_ok(b->ptr, b->req, b->stamp), "after %s: the block at %p (%llu bytes) was overwritten", after, (void *)b->ptr,
               (unsigned long long)b->req);
    }
    EXPECT(s.n_alloc == M.n_alloc && s.n_free == M.n_free, "after %s: %llu allocs and %llu frees, the model %llu, %llu",
           after, (unsigned long long)s.n_alloc, (unsigned long long)s.n_free, (unsigned long long)M.n_alloc,
           (unsigned long long)M.n_free);
    EXPECT(s.allocated_peak == M.peak_alloc && s.requested_peak == M.peak_req && s.active_blocks_peak == M.peak_blocks,
           "after %s: peaks %llu bytes, %llu requested, %llu blocks; the model %llu, %llu, %llu", after,
           (unsigned long long)s.allocated_peak, (unsigned long long)s.requested_peak,
           (unsigned long long)s.active_blocks_peak, (unsigned long long)M.peak_alloc, (unsigned long long)M.peak_req,
           (unsigned long long)M.peak_blocks);
    EXPECT(s.allocated == alloc && s.requested == req && s.active_blocks == (uint64_t)M.n,
           "after %s: the pool has %llu blocks, %llu bytes (%llu requested); the model %d, %llu (%llu)", after,
           (unsigned long long)s.active_blocks, (unsigned long long)s.allocated, (unsigned long long)s.requested,
           M.n, (unsigned long long)alloc, (unsigned long long)req);
    for (int t = 0; t < NTAGS; t++) {
        gp_tag_stats ts;
        gp_pool_tag_stats(M.p, tags[t], &ts);
        EXPECT(ts.allocated == tag_alloc[t] && ts.requested == tag_req[t] && ts.active_blocks == tag_n[t],
               "after %s: tag %s has %llu bytes in %llu blocks, the model %llu in %llu", after, tag_names[t],
               (unsigned long long)ts.allocated, (unsigned long long)ts.active_blocks,
               (unsigned long long)tag_alloc[t], (unsigned long long)tag_n[t]);
        EXPECT(ts.limit == M.tag_limit[t], "after %s: tag %s's limit is %llu, the model's %llu", after,
               tag_names[t], (unsigned long long)ts.limit, (unsigned long long)M.tag_limit[t]);
        EXPECT(ts.allocated_peak == M.tag_peak[t], "after %s: tag %s's peak is %llu, the model's %llu", after,
               tag_names[t], (unsigned long long)ts.allocated_peak, (unsigned long long)M.tag_peak[t]);
    }
    /* A replay's question: live graph pools answer, nothing of theirs is
     * offloaded here; keys given back are refused. */
    for (int k = 0; k < NKEYS; k++) {
        if (M.gpool_live[k] == GP_MAYBE) continue;
        gp_tag away[NTAGS];
        size_t n_away;
        gp_status st = gp_pool_capture_away(M.p, (uint64_t)k + 1, away, NTAGS, &n_away);
        EXPECT(st == (M.gpool_live[k] ? GP_OK : GP_ERR_INVALID) && n_away == 0,
               "after %s: capture_away of graph pool %d (live %d) gave %s with %zu tags", after, k,
               M.gpool_live[k], gp_status_str(st), n_away);
        gp_error_clear();
    }
    static const int prios[] = {0, 1, 2, 3, 255};
    for (size_t k = 0; k < sizeof prios / sizeof prios[0]; k++) {
        uint64_t a, pk;
        gp_pool_prio_stats(M.p, prios[k], &a, &pk);
        EXPECT(a == prio[prios[k]] && pk == M.prio_peak[prios[k]],
               "after %s: priority %d holds %llu bytes (peak %llu), the model %llu (%llu)", after, prios[k],
               (unsigned long long)a, (unsigned long long)pk, (unsigned long long)prio[prios[k]],
               (unsigned long long)M.prio_peak[prios[k]]);
    }
}

/* The peaks after live blocks were added or moved. */
static void update_peaks(void)
{
    uint64_t alloc = 0, req = 0, tag[NTAGS] = {0}, prio[256] = {0};
    for (int i = 0; i < M.n; i++) {
        alloc += M.b[i].size;
        req += M.b[i].req;
        tag[M.b[i].tag] += M.b[i].size;
        prio[M.b[i].prio] += M.b[i].size;
    }
    if (alloc > M.peak_alloc) M.peak_alloc = alloc;
    if (req > M.peak_req) M.peak_req = req;
    if ((uint64_t)M.n > M.peak_blocks) M.peak_blocks = (uint64_t)M.n;
    for (int t = 0; t < NTAGS; t++)
        if (tag[t] > M.tag_peak[t]) M.tag_peak[t] = tag[t];
    for (int q = 0; q < 256; q++)
        if (prio[q] > M.prio_peak[q]) M.prio_peak[q] = prio[q];
}

static void expect_message(gp_status st, const char *what)
{
    EXPECT(st == GP_OK || gp_last_error()[0], "%s failed with %s and left no message", what, gp_status_str(st));
}

/* -------------------------------------------------------------- allocation */

static int valid_tag(int t) { return t >= 0 && t < NTAGS; }

/* The tag id an argument byte names: an interned one, or one never handed
 * out (NTAGS). */
static gp_tag tag_arg(uint8_t x, int *ti)
{
    *ti = x % (NTAGS + 1);
    return *ti < NTAGS ? tags[*ti] : (gp_tag)(gp_tag_count() + (x >> 4));
}

static int prio_arg(uint8_t x)
{
    static const int odd[] = {GP_PRIO_DEFAULT, 255, 256, -2, 100, 1000};
    return x % 8 < 4 ? x % 4 : odd[(x >> 3) % 6];
}

static uint64_t size_arg(reader *r)
{
    uint8_t k = u8(r);
    static const uint64_t odd[] = {0, SIZE_MAX, (1ull << 48) + 1, 1ull << 48, 1ull << 63, 511, 512, 513};
    if (k < 16) return odd[k % 8];
    if (k < 24) return M.capacity + u16(r);    /* more than the device */
    unsigned bits = k % 23;                    /* 1 B .. 8 MiB, log-uniform */
    return (1ull << bits) + (u32(r) & ((1ull << bits) - 1));
}

/* A stream index: mostly few streams, sometimes many (past the 64 slots). */
static unsigned stream_arg(uint8_t x) { return x < 224 ? x % 6 : x; }

static int do_alloc(uint64_t size, unsigned si, uint8_t tag_byte, uint8_t prio_byte, const char *what);

/* Gives up the lowest-priority live block below `priority` (without
 * recorded streams); returns its size, 0 if none. */
static uint64_t give_up(gp_pool *p, int priority)
{
    int best = -1;
    for (int i = 0; i < M.n; i++)
        if (M.b[i].prio < priority && (best < 0 || M.b[i].prio < M.b[best].prio)) best = i;
    if (best < 0 || M.b[best].nrec) return 0;
    uint64_t got = M.b[best].size;
    EXPECT(gp_free(p, M.b[best].ptr) == GP_OK, "the pressure callback's free: %s", gp_last_error());
    forget(best);
    return got;
}

/* The pressure callback: like offload, it gives up the lowest-priority live
 * block below `priority`, and it may allocate (its own staging) before or
 * after that, and free what it allocated or keep it. */
static uint64_t pressure(void *arg, gp_pool *p, uint64_t needed, int priority)
{
    (void)arg, (void)needed;
    EXPECT(p == M.p, "the pressure callback got another pool");
    if (M.in_pressure) return 0; /* an allocation of its own ran short */
    M.in_pressure = 1;
    uint64_t got = M.pressure_first ? give_up(p, priority) : 0;
    int made[256], n_made = 0;
    for (int k = 0; k < M.pressure_allocs && M.n < MAXLIVE - 2; k++) {
        int before = M.n;
        if (do_alloc(512 + 4096 * (uint64_t)(k % 8), 1, 0, 0, "an allocation in the pressure callback") &&
            M.n > before)
            made[n_made++] = M.n - 1;
    }
    while (n_made && !M.pressure_keep) {
        int i = made[--n_made];
        EXPECT(gp_free(p, M.b[i].ptr) == GP_OK, "a free in the pressure callback: %s", gp_last_error());
        forget(i);
    }
    if (!M.pressure_first) got = give_up(p, priority);
    M.in_pressure = 0;
    return got;
}

/* Returns 1 when an allocation was made (it is then M.b[M.n - 1]). */
static int do_alloc(uint64_t size, unsigned si, uint8_t tag_byte, uint8_t prio_byte, const char *what)
{
    int ti;
    gp_tag tag = tag_arg(tag_byte, &ti);
    int prio = prio_arg(prio_byte);
    gp_stream s = stream_of(si);
    gp_stats s0;
    gp_pool_stats(M.p, &s0, 0);
    gp_status st;
    gp_error_clear();
    unsigned captures = M.captures;
    char *q = gp_alloc(M.p, size, s, tag, prio, &st);
    if (trace)
        fprintf(stderr, "  %s of %llu bytes, stream %u, tag %d, priority %d: %p %s\n", what,
                (unsigned long long)size, si, ti, prio, (void *)q, st ? gp_last_error() : "");
    expect_message(st, what);
    int bad_arg = size == 0 || !valid_tag(ti) || (prio != GP_PRIO_DEFAULT && (prio < 0 || prio > 255));
    if (bad_arg) {
        EXPECT(!q && st == GP_ERR_INVALID, "%s of %llu bytes, tag %d, priority %d: %s, not refused", what,
               (unsigned long long)size, ti, prio, gp_status_str(st));
        return 0;
    }
    if (!q) {
        /* What may go wrong with good arguments: no memory, a limit, too
         * many streams, an injected backend failure, or a stream that joins
         * a capture unnamed while several captures run. */
        int unnamed = M.forked[si] && !M.capturing[si] && captures != 1;
        EXPECT(st == GP_ERR_OOM || st == GP_ERR_LIMIT || st == GP_ERR_TOO_MANY || injected_failure() ||
                   (st == GP_ERR_INVALID && unnamed),
               "%s of %llu bytes failed with %s: %s", what, (unsigned long long)size, gp_status_str(st),
               gp_last_error());
        if (st == GP_ERR_OOM || st == GP_ERR_LIMIT)
            EXPECT(gp_pool_last_oom(M.p, NULL, 0) > 0, "%s failed for lack of memory and left no OOM report", what);
        return 0;
    }
    if (prio == GP_PRIO_DEFAULT) prio = M.cfg.priority;
    EXPECT((uintptr_t)q % 512 == 0, "%s returned %p, not 512-byte aligned", what, (void *)q);
    EXPECT(M.n < MAXLIVE, "the model is full");
    gp_block_info info;
    EXPECT(gp_pool_lookup(M.p, q, &info) == GP_OK && info.addr == (uintptr_t)q, "%s: lookup of %p failed: %s",
           what, (void *)q, gp_last_error());
    EXPECT(info.size >= size && info.size - size < size / 256 + 1024 && info.requested == size &&
               info.tag == tag && info.priority == prio && info.state == GP_BLOCK_USED,
           "%s of %llu bytes: the block says %llu bytes (%llu requested), tag %u, priority %u, state %u", what,
           (unsigned long long)size, (unsigned long long)info.size, (unsigned long long)info.requested,
           (unsigned)info.tag, (unsigned)info.priority, (unsigned)info.state);
    for (int i = 0; i < M.n; i++)
        EXPECT((uintptr_t)q + info.size <= (uintptr_t)M.b[i].ptr || (uintptr_t)M.b[i].ptr + M.b[i].size <= (uintptr_t)q,
               "%s: the block at %p of %llu bytes overlaps the live one at %p of %llu", what, (void *)q,
               (unsigned long long)info.size, (void *)M.b[i].ptr, (unsigned long long)M.b[i].size);
    /* Placement: outside captures, a tag's blocks lie in its lifetime's
     * region. */
    if (M.cfg.placement == GP_PLACE_LIFETIME && M.cfg.mode == GP_MODE_EXPANDABLE && !captures && !M.in_pressure)
        EXPECT(info.lifetime == gp_tag_lifetime(tag), "%s under tag %s lies in region %u, the tag is %d", what,
               tag_names[ti], (unsigned)info.lifetime, gp_tag_lifetime(tag));
    gp_stats s1;
    gp_pool_stats(M.p, &s1, 0);
    if (s1.limit && s1.reserved > s0.reserved)
        EXPECT(s1.reserved <= s1.limit, "%s mapped past the pool limit: %llu reserved, limit %llu", what,
               (unsigned long long)s1.reserved, (unsigned long long)s1.limit);
    mblock *b = &M.b[M.n++];
    *b = (mblock){.ptr = q, .req = size, .size = info.size, .stamp = ++M.stamp_seq, .tag = ti, .prio = prio,
                  .own = info.stream};
    stamp_put(b->ptr, b->req, b->stamp);
    M.n_alloc++;
    update_peaks();
    /* It fitted under its tag's limit. */
    uint64_t held = 0;
    for (int i = 0; i < M.n; i++)
        if (M.b[i].tag == ti) held += M.b[i].size;
    EXPECT(!M.tag_limit[ti] || held <= M.tag_limit[ti],
           "%s: tag %s holds %llu bytes, over its limit of %llu", what, tag_names[ti], (unsigned long long)held,
           (unsigned long long)M.tag_limit[ti]);
    return 1;
}

/* ------------------------------------------------------------- operations */

/* 0..4 blocks apart (gp_pool_alloc_apart): each a live block of the model,
 * side by side in chunks of their own, so that none of them is among the
 * tag's blocks that share a chunk (gp_pool_tag_mixed). */
static void op_apart(reader *r)
{
    size_t n = u8(r) % 5;
    uint64_t sizes[4];
    int bad = n == 0;
    for (size_t i = 0; i < n; i++) bad |= (sizes[i] = size_arg(r)) == 0 || sizes[i] > (1ull << 48);
    unsigned si = stream_arg(u8(r));
    int ti;
    gp_tag tag = tag_arg(u8(r), &ti);
    int prio = prio_arg(u8(r));
    bad |= !valid_tag(ti) || (prio != GP_PRIO_DEFAULT && (prio < 0 || prio > 255));
    if (M.n + (int)n >= MAXLIVE - 3) return;
    void *out[4] = {0};
    gp_error_clear();
    unsigned captures = M.captures;
    gp_status st = gp_pool_alloc_apart(M.p, sizes, n, stream_of(si), tag, prio, out);
    if (trace) fprintf(stderr, "  apart of %zu blocks, tag %d: %s %s\n", n, ti, gp_status_str(st), gp_last_error());
    expect_message(st, "apart");
    if (st != GP_OK) {
        EXPECT(bad || st == GP_ERR_OOM || st == GP_ERR_LIMIT || st == GP_ERR_TOO_MANY || injected_failure() ||
                   (st == GP_ERR_INVALID && captures),
               "apart of %zu blocks failed with %s: %s", n, gp_status_str(st), gp_last_error());
        return;
    }
    EXPECT(!bad, "apart of %zu blocks, tag %d, priority %d: not refused", n, ti, prio);
    if (prio == GP_PRIO_DEFAULT) prio = M.cfg.priority;
    for (size_t i = 0; i < n; i++) {
        gp_block_info info;
        EXPECT(gp_pool_lookup(M.p, out[i], &info) == GP_OK && info.addr == (uintptr_t)out[i] &&
                   info.requested == sizes[i] && info.size >= sizes[i] && info.tag == tag && info.priority == prio &&
                   info.state == GP_BLOCK_USED && !info.in_graph_pool,
               "apart: block %zu at %p is not what was asked", i, out[i]);
        EXPECT(i + 1 == n || (uintptr_t)out[i + 1] == (uintptr_t)out[i] + info.size,
               "apart: block %zu does not follow block %zu", i + 1, i);
        for (int j = 0; j < M.n; j++)
            EXPECT((uintptr_t)out[i] + info.size <= (uintptr_t)M.b[j].ptr ||
                       (uintptr_t)M.b[j].ptr + M.b[j].size <= (uintptr_t)out[i],
                   "apart: the block at %p overlaps the live one at %p", out[i], (void *)M.b[j].ptr);
        mblock *b = &M.b[M.n++];
        *b = (mblock){.ptr = out[i], .req = sizes[i], .size = info.size, .stamp = ++M.stamp_seq, .tag = ti,
                      .prio = prio, .own = info.stream};
        stamp_put(b->ptr, b->req, b->stamp);
        M.n_alloc++;
    }
    update_peaks();
    uintptr_t mixed[64];
    size_t n_mixed;
    unsigned graphs;
    EXPECT(gp_pool_tag_mixed(M.p, tag, mixed, 64, &n_mixed, &graphs) == GP_OK, "tag_mixed: %s", gp_last_error());
    for (size_t k = 0; k < n_mixed && k < 64; k++)
        for (size_t i = 0; i < n; i++)
            EXPECT(mixed[k] != (uintptr_t)out[i], "apart: block %zu at %p shares a chunk", i, out[i]);
    uint64_t held = 0;
    for (int i = 0; i < M.n; i++)
        if (M.b[i].tag == ti) held += M.b[i].size;
    EXPECT(!M.tag_limit[ti] || held <= M.tag_limit[ti], "apart: tag %s holds %llu bytes, over its limit of %llu",
           tag_names[ti], (unsigned long long)held, (unsigned long long)M.tag_limit[ti]);
}

static void op_alloc(reader *r)
{
    uint64_t size = size_arg(r);
    unsigned si = stream_arg(u8(r));
    uint8_t t = u8(r), pr = u8(r);
    if (M.n < MAXLIVE - 3) do_alloc(size, si, t, pr, "alloc"); /* (room for the callback's and its own) */
}

static void op_free(reader *r)
{
    if (!M.n) return;
    int i = u8(r) % M.n;
    EXPECT(gp_free(M.p, M.b[i].ptr) == GP_OK, "free of the live block %p: %s", (void *)M.b[i].ptr, gp_last_error());
    forget(i);
}

/* An address that is not a live block's start, and the statuses a free of
 * it may give. */
static char *bad_pointer(reader *r, gp_status *want1, gp_status *want2)
{
    uint8_t k = u8(r);
    uint16_t off = u16(r);
    static char foreign;
    *want1 = *want2 = GP_ERR_FOREIGN;
    if (k % 4 == 0 && M.n) { /* inside a live block */
        mblock *b = &M.b[k / 4 % M.n];
        if (b->size > 1) return b->ptr + 1 + off % (b->size - 1);
    }
    if (k % 4 == 1 && M.n_freed) { /* freed earlier, unless it is live again */
        char *x = M.freed[(k / 4) % (M.n_freed < 16 ? M.n_freed : 16)];
        if (find_live(x) < 0) {
            *want1 = GP_ERR_DOUBLE_FREE; /* (or, reused inside another block, foreign) */
            return x;
        }
    }
    if (k % 4 == 2) return &foreign + off;
    return (char *)(uintptr_t)(0x1000 + (uintptr_t)off * 512);
}

static void op_bad_free(reader *r)
{
    gp_status w1, w2;
    char *x = bad_pointer(r, &w1, &w2);
    gp_error_clear();
    gp_status st = gp_free(M.p, x);
    expect_message(st, "a bad free");
    EXPECT(st == w1 || st == w2 || st == GP_ERR_FOREIGN, "free of %p, no live block's start, gave %s", (void *)x,
           gp_status_str(st));
}

/* The mapping unit of the arena a block lies in, as gp_pool_create works
 * it out. */
static uint64_t chunk_of(int arena)
{
    uint64_t chunk = M.cfg.chunk, lchunk = M.cfg.large_chunk > chunk ? M.cfg.large_chunk : chunk;
    while (lchunk > chunk && lchunk > M.capacity / 32) lchunk /= 2;
    return arena == GP_ARENA_SMALL ? chunk : lchunk;
}

static int no_whole_chunk_free(void *arg, const gp_block_info *b)
{
    (void)arg;
    uint64_t c = chunk_of(b->arena);
    uint64_t first = (b->addr + c - 1) / c * c;
    EXPECT(b->state != GP_BLOCK_FREE || b->in_graph_pool || first + c > b->addr + b->size,
           "after trimming everything, the free block at 0x%llx of %llu bytes holds a whole chunk of %llu",
           (unsigned long long)b->addr, (unsigned long long)b->size, (unsigned long long)c);
    return 0;
}

static void op_trim(reader *r)
{
    static const uint64_t sizes[] = {0, 1, 4096, 64 * KiB, MiB, UINT64_MAX};
    uint8_t k = u8(r);
    uint64_t want = k < 192 ? sizes[k % 6] : u32(r);
    gp_stats a, b;
    gp_pool_stats(M.p, &a, 0);
    uint64_t got = k % 7 == 6 ? gp_pool_empty_cache(M.p) : gp_pool_trim(M.p, want);
    gp_pool_stats(M.p, &b, 0);
    EXPECT(b.reserved == a.reserved - got && got <= a.reserved - a.allocated,
           "trim released %llu bytes: reserved %llu -> %llu, allocated %llu", (unsigned long long)got,
           (unsigned long long)a.reserved, (unsigned long long)b.reserved, (unsigned long long)a.allocated);
    if (M.cfg.mode == GP_MODE_RESERVE) EXPECT(got == 0, "a trim in reserve mode released %llu bytes", (unsigned long long)got);
    /* Trimming everything leaves no whole chunk of cache mapped (a graph
     * pool's memory stays; nothing is trimmed while a capture runs). */
    if ((k % 7 == 6 || want == UINT64_MAX) && M.cfg.mode == GP_MODE_EXPANDABLE && !M.captures &&
        injected() == M.injected0)
        gp_pool_walk(M.p, no_whole_chunk_free, NULL);
}

static void op_limit(reader *r)
{
    uint8_t k = u8(r);
    uint64_t v = k < 64 ? 0 : k < 128 ? u32(r) : k < 250 ? (uint64_t)u16(r) * 4096 : UINT64_MAX - k;
    gp_pool_set_limit(M.p, v);
    gp_stats s;
    gp_pool_stats(M.p, &s, 0);
    EXPECT(s.limit == v, "set_limit(%llu): the limit is %llu", (unsigned long long)v, (unsigned long long)s.limit);
}

static void op_tag_limit(reader *r)
{
    int ti;
    gp_tag t = tag_arg(u8(r), &ti);
    uint64_t v = u8(r) < 128 ? 0 : (uint64_t)u16(r) * 512;
    gp_error_clear();
    gp_status st = gp_pool_set_tag_limit(M.p, t, v);
    expect_message(st, "set_tag_limit");
    EXPECT(st == (valid_tag(ti) ? GP_OK : GP_ERR_INVALID), "set_tag_limit(%d, %llu) gave %s", ti,
           (unsigned long long)v, gp_status_str(st));
    if (st == GP_OK) M.tag_limit[ti] = v;
}

static void op_retag(reader *r)
{
    void *v[5];
    int idx[5], n = (int)(u8(r) % 5), foreign = 0;
    for (int k = 0; k < n; k++) {
        uint8_t x = u8(r);
        if (x == 255 || !M.n) { /* an address in no live block */
            v[k] = (void *)(uintptr_t)0x1000;
            idx[k] = -1;
            foreign = 1;
        } else {
            idx[k] = x % M.n;
            v[k] = M.b[idx[k]].ptr + (x & 1 ? M.b[idx[k]].req - 1 : 0); /* start or inside */
        }
    }
    int ti;
    gp_tag t = tag_arg(u8(r), &ti);
    int prio = prio_arg(u8(r));
    uint64_t moved = 7;
    gp_error_clear();
    gp_status st = gp_pool_retag(M.p, v, (size_t)n, t, prio, &moved);
    expect_message(st, "retag");
    /* The model's answer: all or nothing. */
    gp_status want = GP_OK;
    uint64_t add = 0, bytes = 0;
    if (!valid_tag(ti) || prio < GP_PRIO_DEFAULT || prio > 255) want = GP_ERR_INVALID;
    else if (n && foreign) want = GP_ERR_FOREIGN;
    else {
        for (int k = 0; k < n; k++) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= idx[j] == idx[k];
            if (dup) continue;
            mblock *b = &M.b[idx[k]];
            if (b->tag != ti) add += b->size;
            if (b->tag != ti || (prio != GP_PRIO_DEFAULT && b->prio != prio)) bytes += b->size;
        }
        uint64_t held = 0;
        for (int i = 0; i < M.n; i++)
            if (M.b[i].tag == ti) held += M.b[i].size;
        if (M.tag_limit[ti] && add && held + add > M.tag_limit[ti]) want = GP_ERR_LIMIT;
    }
    EXPECT(st == want, "retag of %d addresses to tag %d priority %d gave %s, the model says %s", n, ti, prio,
           gp_status_str(st), gp_status_str(want));
    EXPECT(moved == (st == GP_OK ? bytes : 0), "retag moved %llu bytes, the model %llu", (unsigned long long)moved,
           (unsigned long long)(st == GP_OK ? bytes : 0));
    if (st != GP_OK) return;
    for (int k = 0; k < n; k++) {
        M.b[idx[k]].tag = ti;
        if (prio != GP_PRIO_DEFAULT) M.b[idx[k]].prio = prio;
    }
    update_peaks();
}

static void op_record(reader *r)
{
    uint8_t k = u8(r);
    gp_stream s = stream_of(stream_arg(u8(r)));
    if (k >= 240 || !M.n) { /* not a live block's start */
        gp_status w1, w2;
        char *x = bad_pointer(r, &w1, &w2);
        gp_error_clear();
        gp_status st = gp_record_stream(M.p, x, s);
        expect_message(st, "record_stream of a bad pointer");
        EXPECT(st == w1 || st == w2 || st == GP_ERR_FOREIGN, "record_stream of %p gave %s", (void *)x,
               gp_status_str(st));
        return;
    }
    mblock *b = &M.b[k % M.n];
    gp_error_clear();
    gp_status st = gp_record_stream(M.p, b->ptr, s);
    expect_message(st, "record_stream");
    int known = s == b->own;
    for (int j = 0; j < b->nrec; j++) known |= b->rec[j] == s;
    gp_status want = known ? GP_OK : b->nrec == 8 ? GP_ERR_TOO_MANY : GP_OK;
    EXPECT(st == want, "record_stream on the %d-th stream gave %s", b->nrec + 1, gp_status_str(st));
    if (st == GP_OK && !known) b->rec[b->nrec++] = s;
}

static void op_progress(reader *r) { gp_host_stream_complete(M.be, stream_of(stream_arg(u8(r)))); }

static void host_capturing(unsigned si)
{
    gp_host_set_capturing(M.be, stream_of(si), M.capturing[si] || M.forked[si]);
}

/* After a capture's end or a release that returned st: graph pools nobody
 * holds are given back once no capture runs -- all of them, or (the device
 * sync failed) maybe some. */
static void settle(gp_status st, const char *what)
{
    EXPECT(st == GP_OK || injected_failure(), "%s gave %s: %s", what, gp_status_str(st), gp_last_error());
    if (M.captures) return;
    for (int k = 0; k < NKEYS; k++)
        if (M.gpool_live[k] && !M.refs[k]) M.gpool_live[k] = st == GP_OK ? GP_DEAD : GP_MAYBE;
}

static gp_status release(int key)
{
    gp_error_clear();
    gp_status st = gp_pool_capture_release(M.p, (uint64_t)key + 1);
    expect_message(st, "capture_release");
    if (M.gpool_live[key] == GP_MAYBE && st == GP_ERR_INVALID) {
        M.gpool_live[key] = GP_DEAD; /* it was given back after all */
        return st;
    }
    if (!M.gpool_live[key] || (!M.refs[key] && M.captures)) {
        EXPECT(st == GP_ERR_INVALID, "release of graph pool %d (live %d, refs %u) gave %s", key, M.gpool_live[key],
               M.refs[key], gp_status_str(st));
        return st;
    }
    if (M.refs[key]) M.refs[key]--;
    settle(st, "capture_release");
    return st;
}

static void op_capture(reader *r)
{
    uint8_t what = u8(r) % 5;
    unsigned si = stream_arg(u8(r));
    int key = u8(r) % NKEYS;
    gp_stream s = stream_of(si);
    gp_status st;
    gp_error_clear();
    switch (what) {
    case 0:
        st = gp_pool_capture_prepare(M.p, s);
        expect_message(st, "capture_prepare");
        EXPECT(st == GP_OK || st == GP_ERR_TOO_MANY || injected_failure(), "capture_prepare gave %s: %s",
               gp_status_str(st), gp_last_error());
        return;
    case 1: {
        if (M.capturing[si]) return; /* (one capture per stream: the model could not tell which ends) */
        unsigned streams_of_key = 0;
        for (unsigned i = 0; i < NSTREAMS; i++) streams_of_key += M.capturing[i] == key + 1;
        st = gp_pool_capture_begin(M.p, (uint64_t)key + 1, s);
        expect_message(st, "capture_begin");
        unsigned live = 0;
        for (int k = 0; k < NKEYS; k++) live += M.gpool_live[k];
        if (M.gpool_live[key] == GP_LIVE && streams_of_key < 4)
            EXPECT(st == GP_OK, "capture_begin into live graph pool %d gave %s", key, gp_status_str(st));
        else
            EXPECT(st == GP_OK || st == GP_ERR_TOO_MANY, "capture_begin gave %s (%u graph pools live): %s",
                   gp_status_str(st), live, gp_last_error());
        if (st != GP_OK) return;
        M.gpool_live[key] = GP_LIVE;
        M.refs[key]++;
        M.capturing[si] = (uint8_t)(key + 1);
        M.captures++;
        host_capturing(si);
        return;
    }
    case 2:
        st = gp_pool_capture_end(M.p, s);
        expect_message(st, "capture_end");
        if (!M.capturing[si]) {
            EXPECT(st == GP_ERR_INVALID, "capture_end on a stream not capturing gave %s", gp_status_str(st));
            return;
        }
        M.capturing[si] = 0;
        M.captures--;
        host_capturing(si);
        settle(st, "capture_end");
        return;
    case 3:
        release(key);
        return;
    case 4: /* a stream joins (or leaves) a capture without being named */
        M.forked[si] = !M.forked[si];
        host_capturing(si);
        return;
    }
}

static void op_history(reader *r)
{
    uint8_t k = u8(r);
    gp_status st;
    gp_error_clear();
    switch (k % 4) {
    case 0:
        st = gp_pool_history(M.p, k < 128 ? (size_t)u8(r) * 4 : 0, k & 1);
        EXPECT(st == GP_OK, "history gave %s", gp_status_str(st));
        return;
    case 1: {
        gp_event ev[64];
        size_t max = u8(r) % 65, cap, len;
        uint64_t recorded;
        gp_pool_history_info(M.p, &cap, &len, &recorded);
        size_t n = gp_pool_history_read(M.p, ev, max);
        EXPECT(len <= cap && recorded >= len && n == (len < max ? len : max),
               "history: %zu of %zu read (capacity %zu, held %zu, recorded %llu)", n, max, cap, len,
               (unsigned long long)recorded);
        for (size_t i = 0; i < n; i++)
            EXPECT(ev[i].action < GP_EV_COUNT && (i == 0 || ev[i].time_ns >= ev[i - 1].time_ns),
                   "history event %zu: action %u, out of order", i, (unsigned)ev[i].action);
        return;
    }
    default: {
        int action = (int)(u8(r) % 12) - 2, ti;
        gp_tag t = tag_arg(u8(r), &ti);
        int prio = prio_arg(u8(r));
        st = gp_pool_history_note(M.p, action, (uintptr_t)u32(r), u32(r), t, prio);
        expect_message(st, "history_note");
        int ok = action >= 0 && action < GP_EV_COUNT && t < GP_MAX_TAGS && prio >= 0 && prio <= 255;
        EXPECT(st == (ok ? GP_OK : GP_ERR_INVALID), "history_note(%d, tag %u, priority %d) gave %s", action,
               (unsigned)t, prio, gp_status_str(st));
        return;
    }
    }
}

static void op_pressure(reader *r)
{
    uint8_t k = u8(r);
    M.pressure_on = k & 1;
    M.pressure_keep = k >> 1 & 1;
    M.pressure_first = k >> 2 & 1;
    M.pressure_allocs = k >> 3 & 1 ? u8(r) : 0;
    gp_pool_set_pressure(M.p, M.pressure_on ? pressure : NULL, NULL);
}

typedef struct walk_sum {
    uint64_t used, n_used;
    uintptr_t last_end;
    int order_ok, arena;
} walk_sum;

static int walk_fn(void *arg, const gp_block_info *b)
{
    walk_sum *w = arg;
    if (b->arena != w->arena) w->arena = b->arena, w->last_end = 0; /* address order within an arena */
    if (b->addr < w->last_end) w->order_ok = 0;
    w->last_end = b->addr + b->size;
    if (b->state == GP_BLOCK_USED) w->used += b->size, w->n_used++;
    return 0;
}

static void op_query(reader *r)
{
    uint8_t k = u8(r);
    gp_block_info info;
    switch (k % 5) {
    case 0:
        if (M.n) {
            mblock *b = &M.b[u8(r) % M.n];
            uint64_t off = u32(r) % b->size;
            EXPECT(gp_pool_lookup(M.p, b->ptr + off, &info) == GP_OK && info.addr == (uintptr_t)b->ptr,
                   "lookup of %p + %llu found no block or another", (void *)b->ptr, (unsigned long long)off);
        } else {
            gp_error_clear();
            gp_status st = gp_pool_lookup(M.p, (void *)(uintptr_t)(0x1000 + u16(r)), &info);
            EXPECT(st == GP_ERR_FOREIGN && gp_last_error()[0], "lookup of a foreign address gave %s",
                   gp_status_str(st));
        }
        return;
    case 1: {
        walk_sum w = {.order_ok = 1, .arena = -1};
        gp_pool_walk(M.p, walk_fn, &w);
        uint64_t alloc = 0;
        for (int i = 0; i < M.n; i++) alloc += M.b[i].size;
        EXPECT(w.order_ok && w.used == alloc && w.n_used == (uint64_t)M.n,
               "the walk found %llu used blocks of %llu bytes (in order: %d), the model %d of %llu",
               (unsigned long long)w.n_used, (unsigned long long)w.used, w.order_ok, M.n, (unsigned long long)alloc);
        return;
    }
    case 2: {
        gp_stats s;
        gp_pool_stats(M.p, &s, 1);
        EXPECT(gp_pool_headroom(M.p) >= s.largest_free && s.largest_free <= s.reserved - s.allocated,
               "headroom or largest free block out of bounds");
        return;
    }
    case 3: {
        char buf[300];
        size_t len = u8(r) % sizeof buf;
        memset(buf, 'x', sizeof buf);
        size_t want = gp_pool_oom_report(M.p, u64(r), buf, len);
        EXPECT(want > 0 && (len == 0 || (strlen(buf) < len && strlen(buf) == (want < len ? want : len - 1))),
               "oom_report into %zu bytes wanted %zu and wrote %zu", len, want, len ? strlen(buf) : 0);
        EXPECT(len == sizeof buf || buf[len] == 'x', "oom_report wrote past %zu bytes", len);
        return;
    }
    case 4: {
        gp_tag_stats ts;
        uint64_t a = 1, pk = 1;
        gp_pool_tag_stats(M.p, (gp_tag)(GP_MAX_TAGS + u8(r)), &ts);
        gp_pool_prio_stats(M.p, 256 + u8(r), &a, &pk);
        EXPECT(ts.allocated == 0 && ts.n_alloc == 0 && a == 0 && pk == 0, "figures of a tag or priority out of range");
        gp_pool_reset_peaks(M.p);
        gp_stats s;
        gp_pool_stats(M.p, &s, 0);
        EXPECT(s.allocated_peak == s.allocated && s.reserved_peak == s.reserved, "peaks after a reset");
        M.peak_alloc = M.peak_req = M.peak_blocks = 0;
        memset(M.tag_peak, 0, sizeof M.tag_peak);
        memset(M.prio_peak, 0, sizeof M.prio_peak);
        update_peaks();
        return;
    }
    }
}

static void op_capacity(reader *r)
{
    uint64_t c = ((uint64_t)u8(r) + 1) * (M.capacity / 128);
    gp_host_set_capacity(M.be, c);
}

/* Injected backend failures. */
static void op_fault(reader *r)
{
    uint8_t k = u8(r);
    gp_host_fn fn = (gp_host_fn)(k % GP_HOST_FN_COUNT);
    static const gp_status sts[] = {GP_ERR_BACKEND, GP_ERR_OOM, GP_ERR_NOMEM};
    gp_host_fail(M.be, fn, u8(r) % 8, sts[(k >> 4) % 3], k & 0x80 ? GP_HOST_FAIL_FROM : GP_HOST_FAIL_ONCE);
}

/* The operations, by opcode (the byte modulo their count).  Offload's go
 * here too (see the top of the file). */
#define OPS(X)                                                                 \
    X(alloc) X(alloc) X(alloc) X(free) X(free) X(bad_free) X(trim) X(limit)    \
    X(tag_limit) X(retag) X(record) X(progress) X(capture) X(history)         \
    X(pressure) X(query) X(capacity) X(fault) X(apart)

typedef void (*op_fn)(reader *);
#define OP_ENTRY(name) {op_##name, #name},
static const struct {
    op_fn fn;
    const char *name;
} ops[] = {OPS(OP_ENTRY)};
#define N_OPS (sizeof ops / sizeof ops[0])

/* ------------------------------------------------------------------ a run */

static void setup(reader *r)
{
    memset(&M, 0, sizeof M);
    M.misuse = gp_host_misuse(NULL, 0);
    uint8_t a = u8(r), b = u8(r), c = u8(r), d = u8(r);
    M.capacity = ((uint64_t)(a % 32) + 1) * MiB;
    gp_config *cfg = &M.cfg;
    gp_config_default(cfg);
    cfg->mode = b & 1 ? GP_MODE_RESERVE : GP_MODE_EXPANDABLE;
    cfg->placement = b & 2 ? GP_PLACE_NONE : GP_PLACE_LIFETIME;
    cfg->chunk = 64 * KiB << (b >> 2 & 3);
    cfg->large_chunk = cfg->chunk << (b >> 4 & 3);
    static const uint64_t smalls[] = {4 * KiB, 64 * KiB, 256 * KiB, MiB};
    cfg->small_size = smalls[c & 3];
    static const double slacks[] = {-1, 0, 0.05, 0.5};
    cfg->cache_slack = slacks[c >> 2 & 3];
    cfg->priority = c >> 4 & 3;
    cfg->trace = c >> 6 & 1;
    if (d & 1) cfg->reserve = (gp_size_spec){.bytes = ((uint64_t)(d >> 1) + 1) * 64 * KiB};
    else if (d & 2) cfg->reserve = (gp_size_spec){.fraction = (double)((d >> 2) + 1) / 64};
    if (c & 0x80) cfg->limit = (gp_size_spec){.bytes = (uint64_t)u16(r) * 4096};
    gp_status st = gp_backend_host_create(M.capacity, &M.be);
    EXPECT(st == GP_OK, "host backend: %s", gp_last_error());
    gp_error_clear();
    st = gp_pool_create(M.be, cfg, &M.p);
    expect_message(st, "pool creation");
    if (st != GP_OK) {
        /* Only a reserve may fail: bigger than the device, or a limit below
         * one of its chunks. */
        EXPECT(cfg->mode == GP_MODE_RESERVE && (st == GP_ERR_OOM || (st == GP_ERR_INVALID && cfg->limit.bytes)),
               "pool creation failed with %s: %s", gp_status_str(st), gp_last_error());
        M.p = NULL;
        return;
    }
}

/* Everything stops: faults, captures, graphs; everything is freed and the
 * cache must empty; the pool goes, leaving nothing behind. */
static void teardown(void)
{
    gp_host_fail_none(M.be);
    gp_pool_set_pressure(M.p, NULL, NULL);
    M.pressure_on = 0;
    M.injected0 = injected();
    for (unsigned i = 0; i < NSTREAMS; i++) {
        if (M.capturing[i]) {
            M.capturing[i] = 0;
            M.captures--;
            settle(gp_pool_capture_end(M.p, stream_of(i)), "a final capture_end");
        }
        M.forked[i] = 0;
        gp_host_set_capturing(M.be, stream_of(i), 0);
        gp_host_stream_complete(M.be, stream_of(i));
    }
    for (int k = 0; k < NKEYS; k++)
        while (M.gpool_live[k]) {
            gp_status st = release(k);
            EXPECT(st == GP_OK || st == GP_ERR_INVALID, "the final release of graph pool %d: %s", k, gp_last_error());
        }
    while (M.n) {
        EXPECT(gp_free(M.p, M.b[0].ptr) == GP_OK, "a final free: %s", gp_last_error());
        forget(0);
    }
    if (do_alloc(1, 0, 0, 0, "an allocation at the end")) { /* it looks at pending blocks */
        EXPECT(gp_free(M.p, M.b[M.n - 1].ptr) == GP_OK, "a final free: %s", gp_last_error());
        forget(M.n - 1);
    }
    gp_pool_empty_cache(M.p);
    gp_stats s;
    gp_pool_stats(M.p, &s, 1);
    check_figures("the teardown");
    EXPECT(s.pending == 0, "%llu bytes stay pending at the end", (unsigned long long)s.pending);
    if (M.cfg.mode == GP_MODE_EXPANDABLE)
        EXPECT(s.reserved == 0, "%llu bytes stay reserved after freeing everything and emptying the cache",
               (unsigned long long)s.reserved);
    gp_pool_destroy(M.p);
    char msg[256];
    EXPECT(gp_host_misuse(msg, sizeof msg) == M.misuse, "backend misuse at the end: %s", msg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    trace = getenv("FUZZ_OPS_TRACE") != NULL;
    for (int i = 0; i < NTAGS; i++)
        if (gp_tag_intern(tag_names[i], &tags[i]) != GP_OK) finding("tag %s: %s", tag_names[i], gp_last_error());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    setup(&r);
    if (!M.p) {
        EXPECT(gp_host_misuse(NULL, 0) == M.misuse, "backend misuse at a failed creation");
        return 0;
    }
    check_figures("creation");
    for (unsigned k = 0; r.n; k++) {
        uint8_t opcode = u8(&r);
        const char *name = ops[opcode % N_OPS].name;
        if (trace) fprintf(stderr, "op %u: %s\n", k, name);
        M.injected0 = injected();
        ops[opcode % N_OPS].fn(&r);
        char after[64];
        snprintf(after, sizeof after, "op %u (%s)", k, name);
        check_figures(after);
    }
    teardown();
    return 0;
}
