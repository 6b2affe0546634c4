/*
 * fuzz_offload.c -- libFuzzer target over the offload API (offload.h): an
 * input is a program of operations on a fresh host-backend pool with an
 * offloader, every byte that comes back checked against a model.
 *
 * The first bytes choose the device (24..64 MiB), the chunk sizes, the
 * offloader's threads and host limit.  Every later byte group is one
 * operation: allocations (4 tags, priorities 0..3, 512 B..4 MiB, filled
 * with a per-block pattern: random, bf16-like or sparse, so that the codecs
 * have something to compress and something they must refuse), frees,
 * rewrites, offloads (tag sets, keep or drop, raw/auto/zstd, element
 * sizes), restores (with and without accept_loss), prefetches and
 * background offloads (each opens a window of a few operations that run
 * while the worker thread copies, closed by the restore or sync a program
 * would make), retags (of resident and offloaded blocks), registration and
 * use of tags (the pressure callback offloads registered idle ones when an
 * allocation or a restore runs short), explicit reclaims, swaps of the
 * whole pool out and back in (a parked tenant's), corrupted host bytes
 * (gp_offload_corrupt_for_test), and injected backend failures (copy, map,
 * unmap, events, host_alloc, checksum, ... once or from then on).
 *
 * The model: every live block with its tag, size, pattern seed, and the
 * record (one offload) that holds it while offloaded; a record knows its
 * tags, whether its contents were dropped (keep=0: undefined after
 * restore), whether it may be corrupt, whether its offload failed and lost
 * bytes (sure: the offload said so; maybe: a pressure offload while faults
 * were armed).  After every operation: the status is one the operation may
 * give in the model's state, with a message; gp_pool_check and
 * gp_offload_check find nothing; the backend maps what the pool reserves
 * and saw no misuse; every live block is resident or offloaded and the
 * pool's offloaded figure is the sum of the offloaded ones; a tag with an
 * offloaded block says so (gp_offload_is_offloaded); every resident block
 * has its pattern (sampled every 4 KiB; in full for blocks that came back or
 * whose tags the operation named); a restore that returns GP_OK leaves no
 * block of its tags offloaded, and the bytes that differ in what came back
 * from lost records are at most what it reports lost; a restore without
 * accept_loss does not bring back a record whose offload lost bytes; a
 * checksum failure needs a record that may be corrupt; a restore that fails
 * for room when the device had room for everything it had to map is a
 * finding.  At the end faults stop, everything is restored (accepting
 * losses), checked and freed, the offloader and the pool go, and the
 * backend saw no misuse (LeakSanitizer sees leaks).
 *
 * Built with -DGP_HAVE_ZSTD -lzstd (tests/test_fuzz.py does so when the
 * extension has zstd), GP_CODEC_AUTO compresses on the host.
 * FUZZ_OFFLOAD_TRACE=1 prints every operation.  Build and run: see
 * tests/fuzz/README.md.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_host.h"
#include "codec.h"
#include "fuzz.h"
#include "offload.h"
#include "patterns.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)


/* ------------------------------------------------------------------ model */

#define NT 4       /* tags the program uses */
#define MAXB 96    /* live blocks */
#define MAXR 256   /* records */
static const char *const tag_names[NT] = {"fz0", "fz1", "fz2", "fz3"};
static gp_tag tags[NT];
static gp_tag own_tag; /* the offloader's ("gpupool") */

enum { LOST_NO, LOST_MAYBE, LOST_SURE };

typedef struct mrec {
    int used;
    unsigned mask;    /* the tags it holds (a superset where the model cannot tell) */
    int keep;         /* 0: contents dropped (or unknown: a window's offloads) */
    int corrupt;      /* corrupt_for_test may have flipped one of its bytes */
    int lost;         /* LOST_* */
    int64_t released; /* device bytes its restore maps (-1: unknown) */
    int codec;        /* compressed: its restore needs the staging */
} mrec;

typedef struct mblk {
    char *ptr;
    uint64_t req, size; /* requested; the block's (the pool's figure) */
    uint64_t seed;
    int kind, tag, prio;
    int rec;            /* the record holding it while offloaded (-1: resident) */
} mblk;

typedef struct model {
    gp_backend *be;
    gp_pool *p;
    gp_offloader *o;
    uint64_t capacity, large_chunk, host_limit;
    mblk b[MAXB];
    int n;
    mrec r[MAXR];
    int reg_prio[NT], busy[NT];
    uint64_t seq, misuse, injected0;
    int faults;  /* faults armed since the last disarm (a once may not have fired) */
    int window;  /* a prefetch or background offload is under way: no reads of offloadable bytes */
    unsigned win_mask; /* the tags of the window's prefetch or background offload */
    int win_bg;    /* the window's is a background offload (which takes new blocks of its tags too) */
    int win_keep0; /* an offload in the window dropped contents */
    unsigned win_named; /* the tags the window's own offloads named: their records hold every one */
    int bg_report; /* a background offload ran since the last restore: its failure may come with that one */
    /* Tags of records the model forgot although they may still be there
     * (a record's tags are a superset where the model cannot tell): a
     * restore of them may fail as those could. */
    int ghost_corrupt[NT], ghost_lost[NT];
    unsigned touched;  /* tags the operation named: their blocks are checked in full */
} model;

static model M;
static int trace;
/* FUZZ_OFFLOAD_IGNORE=accept_loss,retag,...: checks not to stop at (by
 * hand, to look past a finding not fixed yet; never in the suite). */
static const char *ignore;

static int checking(const char *what) { return !ignore || !strstr(ignore, what); }

#define TRACE(...)                                                             \
    do {                                                                       \
        if (trace) fprintf(stderr, __VA_ARGS__);                               \
    } while (0)

static uint64_t injected(void)
{
    gp_host_counters c;
    gp_host_counters_get(M.be, &c);
    uint64_t n = 0;
    for (int i = 0; i < GP_HOST_FN_COUNT; i++) n += c.injected[i];
    return n;
}

/* Whether the operation may have met an injected failure. */
static int faulty(void) { return M.faults || injected() != M.injected0; }

static int says(const char *what) { return strstr(gp_last_error(), what) != NULL; }

static int state_of(const mblk *b)
{
    gp_block_info info;
    return gp_pool_lookup(M.p, b->ptr, &info) == GP_OK ? (int)info.state : -1;
}

static int new_rec(unsigned mask, int keep, int lost)
{
    for (int i = 0; i < MAXR; i++)
        if (!M.r[i].used) {
            M.r[i] = (mrec){.used = 1, .mask = mask, .keep = keep, .lost = lost, .released = -1};
            return i;
        }
    finding("the model ran out of records");
}

static unsigned mask_arg(uint8_t x)
{
    unsigned m = x % (1u << NT);
    return m ? m : 1u << (x >> 4) % NT;
}

static size_t tags_of(unsigned mask, gp_tag *out)
{
    size_t n = 0;
    for (int t = 0; t < NT; t++)
        if (mask >> t & 1) out[n++] = tags[t];
    return n;
}

static void refill(mblk *b)
{
    b->seed = ++M.seq;
    pat_fill(b->ptr, b->req, b->seed, b->kind);
}

/* --------------------------------------------------------------- checks */

static void check_figures(const char *after)
{
    char msg[512];
    size_t v = gp_pool_check(M.p, msg, sizeof msg);
    EXPECT(v == 0, "after %s: gp_pool_check: %zu violations, the first: %s", after, v, msg);
    v = gp_offload_check(M.o, msg, sizeof msg);
    EXPECT(v == 0, "after %s: gp_offload_check: %zu violations, the first: %s", after, v, msg);
    uint64_t misuse = gp_host_misuse(msg, sizeof msg);
    EXPECT(misuse == M.misuse, "after %s: backend misuse: %s", after, msg);
    if (M.window) return; /* (the worker maps and unmaps while these are read) */
    gp_stats s;
    gp_host_counters c;
    gp_pool_stats(M.p, &s, 0);
    gp_host_counters_get(M.be, &c);
    EXPECT(c.mapped == s.reserved, "after %s: the backend maps %llu bytes, reserved is %llu", after,
           (unsigned long long)c.mapped, (unsigned long long)s.reserved);
}

/* After an operation (no window open): what moved, and every byte. */
static void observe(const char *after, unsigned restored_mask, const gp_offload_result *res, int restore_st)
{
    uint64_t lost_diff = 0, offloaded = 0;
    uint8_t back[MAXR] = {0};
    int rec_of_tag[NT];
    for (int t = 0; t < NT; t++) rec_of_tag[t] = -1;
    for (int i = 0; i < M.n; i++) {
        mblk *b = &M.b[i];
        int st = state_of(b);
        EXPECT(st == GP_BLOCK_USED || st == GP_BLOCK_OFFLOADED, "after %s: the live block %p (tag %d) is in state %d",
               after, (void *)b->ptr, b->tag, st);
        if (st == GP_BLOCK_OFFLOADED) {
            offloaded += b->size;
            if (b->rec < 0) {
                /* Went out in this operation and not through the model's
                 * own offload (which assigns its record): the pressure
                 * callback, one record per tag. */
                if (rec_of_tag[b->tag] < 0)
                    rec_of_tag[b->tag] = new_rec(1u << b->tag, 1, faulty() ? LOST_MAYBE : LOST_NO);
                b->rec = rec_of_tag[b->tag];
                TRACE("  block %p (tag %d) offloaded under pressure\n", (void *)b->ptr, b->tag);
            }
            EXPECT(gp_offload_is_offloaded(M.o, tags[b->tag]) || !checking("is_offloaded"),
                   "after %s: the block %p of tag %d is offloaded, gp_offload_is_offloaded says the tag is not",
                   after, (void *)b->ptr, b->tag);
            continue;
        }
        if (b->rec >= 0) { /* came back */
            const mrec *r = &M.r[b->rec];
            back[b->rec] = 1;
            b->rec = -1;
            if (!r->keep) {
                refill(b); /* (its contents were dropped: undefined) */
                continue;
            }
            uint64_t d = pat_diff(b->ptr, b->req, b->seed, b->kind, 0);
            if (r->lost != LOST_NO) {
                lost_diff += d;
                if (d) refill(b);
                continue;
            }
            EXPECT(d == 0, "after %s: the block %p (tag %d, %llu bytes) came back with %llu bytes wrong%s", after,
                   (void *)b->ptr, b->tag, (unsigned long long)b->req, (unsigned long long)d,
                   r->corrupt ? " (its record was corrupted: the checksum missed it)" : "");
            continue;
        }
        uint64_t d = pat_diff(b->ptr, b->req, b->seed, b->kind, !(M.touched >> b->tag & 1));
        EXPECT(d == 0, "after %s: the resident block %p (tag %d, %llu bytes) has %llu bytes wrong", after,
               (void *)b->ptr, b->tag, (unsigned long long)b->req, (unsigned long long)d);
    }
    if (restore_st == GP_OK && res)
        EXPECT(lost_diff <= res->lost, "after %s: %llu bytes came back wrong from offloads that lost bytes, the "
               "restore reports %llu lost", after, (unsigned long long)lost_diff, (unsigned long long)res->lost);
    gp_stats s;
    gp_pool_stats(M.p, &s, 0);
    EXPECT(s.offloaded == offloaded, "after %s: the pool says %llu bytes offloaded, the blocks %llu", after,
           (unsigned long long)s.offloaded, (unsigned long long)offloaded);
    /* Records after a restore: one whose blocks all came back is gone (and
     * after a restore that returned GP_OK, every one of its tags); one
     * whose blocks did not all come back keeps its flags for the rest
     * (they may be in a record of a pressure offload that took them back
     * out, so a sure loss becomes a maybe), and its tags but those such a
     * restore took back: the offloader restores a record whole once any
     * tag it names is asked, so what is left of the offloader's records
     * behind it names none of those, and may name tags it holds no block
     * of (a window's offload named tags it found nothing of), which
     * corrupt_for_test and a restore of those tags still reach. */
    if (!restored_mask) return;
    for (int k = 0; k < MAXR; k++) {
        mrec *r = &M.r[k];
        if (!r->used || !(r->mask & restored_mask)) continue;
        unsigned left = 0;
        for (int i = 0; i < M.n; i++)
            if (M.b[i].rec == k) left |= 1u << M.b[i].tag;
        if (!back[k] && !(restore_st == GP_OK && !left)) continue;
        if (left) {
            r->mask = left | (restore_st == GP_OK ? r->mask & ~restored_mask : r->mask);
            r->released = -1;
            if (r->lost == LOST_SURE) r->lost = LOST_MAYBE;
            continue;
        }
        for (int t = 0; t < NT; t++)
            if ((r->mask >> t & 1) && !(restored_mask >> t & 1)) {
                M.ghost_corrupt[t] |= r->corrupt;
                M.ghost_lost[t] |= r->lost != LOST_NO;
            }
        r->used = 0;
    }
    for (int t = 0; t < NT; t++)
        if (restore_st == GP_OK && (restored_mask >> t & 1)) M.ghost_corrupt[t] = M.ghost_lost[t] = 0;
}

/* A window closed: what went out meanwhile (under pressure, by the
 * window's offloads) goes in one record of all their tags, its contents
 * known only if nothing in the window dropped them. */
static void window_close(int keep)
{
    /* (a background offload's record holds all its tags, an offload's
     * record the tags it named, with blocks or not) */
    unsigned also = (M.win_bg ? M.win_mask : 0) | M.win_named;
    int rec = -1;
    for (int i = 0; i < M.n; i++) {
        mblk *b = &M.b[i];
        if (b->rec >= 0 || state_of(b) != GP_BLOCK_OFFLOADED) continue;
        if (rec < 0) rec = new_rec(also, keep && !M.win_keep0, faulty() ? LOST_MAYBE : LOST_NO);
        M.r[rec].mask |= 1u << b->tag;
        b->rec = rec;
    }
    M.window = M.win_bg = M.win_keep0 = 0;
    M.win_mask = M.win_named = 0;
}

/* -------------------------------------------------------------- operations */

static void op_alloc(reader *r)
{
    uint8_t k = u8(r), t = u8(r) % NT;
    uint16_t x = u16(r);
    unsigned bits = 9 + k % 14; /* 512 B .. 4 MiB */
    uint64_t size = (1ull << bits) + (x & ((1ull << bits) - 1));
    int prio = (k >> 4) % 4;
    if (M.n == MAXB || (M.win_bg && (M.win_mask >> t & 1))) return; /* (the background offload may take it) */
    /* While a worker copies, a block is written only with its tag busy, so
     * that no pressure offload takes it from under the writes. */
    if (M.window) gp_offload_use(M.o, tags[t], 1);
    gp_status st;
    gp_error_clear();
    char *q = gp_alloc(M.p, size, NULL, tags[t], prio, &st);
    TRACE("  alloc %llu bytes, tag %d, priority %d: %p %s\n", (unsigned long long)size, t, prio, (void *)q,
          q ? "" : gp_last_error());
    if (!q) {
        EXPECT(st == GP_ERR_OOM || st == GP_ERR_LIMIT || (faulty() && says("injected")),
               "alloc of %llu bytes failed with %s: %s", (unsigned long long)size, gp_status_str(st), gp_last_error());
    } else {
        gp_block_info info;
        EXPECT(gp_pool_lookup(M.p, q, &info) == GP_OK && info.state == GP_BLOCK_USED, "alloc: lookup of %p",
               (void *)q);
        mblk *b = &M.b[M.n++];
        *b = (mblk){.ptr = q, .req = size, .size = info.size, .kind = (k >> 6) % PAT_KINDS, .tag = t,
                    .prio = prio, .rec = -1};
        refill(b);
    }
    if (M.window) gp_offload_use(M.o, tags[t], M.busy[t]);
}

static void op_free(reader *r)
{
    if (!M.n) return;
    int i = u8(r) % M.n;
    gp_error_clear();
    gp_status st = gp_free(M.p, M.b[i].ptr);
    TRACE("  free %p (tag %d, %s)\n", (void *)M.b[i].ptr, M.b[i].tag, M.b[i].rec < 0 ? "resident" : "offloaded");
    EXPECT(st == GP_OK, "free of the live block %p gave %s: %s", (void *)M.b[i].ptr, gp_status_str(st),
           gp_last_error());
    M.b[i] = M.b[--M.n];
}

/* Rewrite a resident block (new contents before its next offload). */
static void op_write(reader *r)
{
    if (!M.n || M.window) return;
    mblk *b = &M.b[u8(r) % M.n];
    if (b->rec >= 0 || state_of(b) != GP_BLOCK_USED) return;
    b->kind = (int)(b->seed % PAT_KINDS);
    refill(b);
}

static gp_offload_opts opts_arg(uint8_t k)
{
    static const unsigned elems[] = {0, 1, 2, 4};
    int codec = k % 3 == 0 ? GP_CODEC_RAW : GP_CODEC_AUTO;
#ifdef GP_HAVE_ZSTD
    if (k % 3 == 2) codec = GP_CODEC_ZSTD;
#endif
    /* (Bit 6: the memory given back maps again the cache the last restore
     * gave back.) */
    return (gp_offload_opts){.keep = (k >> 2) % 4 != 0, .codec = codec, .elem_size = elems[(k >> 4) % 4],
                             .refill = (k >> 6) & 1};
}

static void op_offload(reader *r)
{
    unsigned mask = mask_arg(u8(r));
    gp_offload_opts opts = opts_arg(u8(r));
    gp_tag tv[NT];
    size_t nt = tags_of(mask, tv);
    if (M.window && (mask & M.win_mask)) return; /* (the window's tags are the worker's) */
    int was[MAXB];
    for (int i = 0; i < M.n; i++) was[i] = M.b[i].rec < 0 && (mask >> M.b[i].tag & 1);
    gp_offload_result res;
    gp_error_clear();
    gp_status st = gp_offload_tags(M.o, tv, nt, &opts, &res);
    TRACE("  offload tags 0x%x keep %d codec %d elem %u: %s %s (bytes %llu kept %llu released %llu codec %d)\n", mask,
          opts.keep, opts.codec, opts.elem_size, gp_status_str(st), st ? gp_last_error() : "",
          (unsigned long long)res.bytes, (unsigned long long)res.kept, (unsigned long long)res.released, res.codec);
    M.touched |= mask;
    const char *gave_up = st != GP_OK ? strstr(gp_last_error(), "it stays offloaded and ") : NULL;
    /* A dropped offload undone: the blocks are back, but what it had given
     * back lost its contents, which it says (never "as before").  In a
     * window too: its tags are not the window's, whose close sees only
     * what moved. */
    uint64_t changed = 0;
    if (st != GP_OK && !gave_up && !opts.keep && says("lost their contents"))
        for (int i = 0; i < M.n; i++) {
            mblk *b = &M.b[i];
            uint64_t d = was[i] && state_of(b) == GP_BLOCK_USED ? pat_diff(b->ptr, b->req, b->seed, b->kind, 0) : 0;
            changed += d;
            if (d) refill(b);
        }
    EXPECT(changed <= res.lost, "a dropped offload undone changed %llu bytes and said %llu lost",
           (unsigned long long)changed, (unsigned long long)res.lost);
    if (M.window) {
        M.win_keep0 |= !opts.keep;
        M.win_named |= mask;
        EXPECT(st == GP_OK || st == GP_ERR_LIMIT || (faulty() && says("injected")), "offload in a window gave %s: %s",
               gp_status_str(st), gp_last_error());
        return; /* (the window's close sees what moved) */
    }
    if (st != GP_OK) {
        EXPECT((st == GP_ERR_LIMIT && M.host_limit && says("GPUPOOL_HOST_LIMIT")) || (faulty() && says("injected")),
               "offload of tags 0x%x gave %s: %s", mask, gp_status_str(st), gp_last_error());
        /* (one that failed before anything moved need not say it undid
         * anything: the blocks below tell) */
    }
    uint64_t moved = 0, kept = 0;
    int rec = -1;
    for (int i = 0; i < M.n; i++) {
        if (!was[i]) continue;
        mblk *b = &M.b[i];
        int now = state_of(b);
        if (now == GP_BLOCK_USED) {
            kept += b->size;
            continue;
        }
        EXPECT(now == GP_BLOCK_OFFLOADED, "offload left the block %p in state %d", (void *)b->ptr, now);
        EXPECT(st == GP_OK || gave_up, "a failed offload (%s) that says it was undone left the block %p of tag %d "
               "offloaded", gp_last_error(), (void *)b->ptr, b->tag);
        if (rec < 0) {
            unsigned long long lost = gave_up ? strtoull(gave_up + strlen("it stays offloaded and "), NULL, 10) : 0;
            rec = new_rec(mask, opts.keep, lost ? LOST_SURE : LOST_NO);
            M.r[rec].released = st == GP_OK ? (int64_t)res.released : -1;
            M.r[rec].codec = st == GP_OK && res.codec != GP_CODEC_RAW;
        }
        b->rec = rec;
        moved += b->size;
    }
    if (st == GP_OK)
        EXPECT(res.bytes == moved && res.kept == kept, "offload of tags 0x%x: %llu bytes moved and %llu kept, the "
               "blocks say %llu and %llu", mask, (unsigned long long)res.bytes, (unsigned long long)res.kept,
               (unsigned long long)moved, (unsigned long long)kept);
}

/* What a restore of `mask` may have to map, when the model knows it
 * (-1: it does not). */
static int64_t restore_needs(unsigned mask)
{
    int64_t need = 0;
    for (int k = 0; k < MAXR; k++) {
        const mrec *r = &M.r[k];
        if (!r->used || !(r->mask & mask)) continue;
        if (r->released < 0) return -1;
        need += r->released;
        if (r->codec) need += (int64_t)(M.capacity / 16 / 4096 * 4096 * 2);
    }
    return need;
}

static void do_restore(unsigned mask, int accept, int room_known, const char *what)
{
    gp_tag tv[NT];
    size_t nt = tags_of(mask, tv);
    /* What the model allows it to fail with. */
    int corrupt = 0, lost_sure = 0, lost_any = 0;
    for (int k = 0; k < MAXR; k++) {
        const mrec *r = &M.r[k];
        if (!r->used || !(r->mask & mask)) continue;
        corrupt |= r->corrupt;
        lost_any |= r->lost != LOST_NO;
    }
    for (int t = 0; t < NT; t++)
        if (mask >> t & 1) corrupt |= M.ghost_corrupt[t], lost_any |= M.ghost_lost[t];
    for (int k = 0; k < MAXR; k++) {
        const mrec *r = &M.r[k];
        if (!r->used || !(r->mask & mask)) continue;
        if (r->lost == LOST_SURE)
            for (int i = 0; i < M.n; i++) lost_sure |= M.b[i].rec == k && (mask >> M.b[i].tag & 1);
    }
    int64_t need = restore_needs(mask);
    gp_host_counters c;
    gp_host_counters_get(M.be, &c);
    uint64_t room = M.capacity - c.mapped;
    gp_offload_result res;
    gp_error_clear();
    gp_status st = gp_restore_tags(M.o, tv, nt, accept, &res);
    TRACE("  %s of tags 0x%x (accept_loss %d): %s %s (bytes %llu lost %llu)\n", what, mask, accept,
          gp_status_str(st), st ? gp_last_error() : "", (unsigned long long)res.bytes, (unsigned long long)res.lost);
    M.touched |= mask;
    int bg = M.bg_report;
    M.bg_report = 0;
    int bg_failed = bg && (says("injected") || (st == GP_ERR_LIMIT && says("GPUPOOL_HOST_LIMIT")));
    if (st != GP_OK) {
        /* (a corrupted copy: the checksum finds it, or the codec first) */
        int bad_copy = corrupt && (says("corrupt") || says("checksum") || says("did not decompress"));
        int ok = bg_failed || (faulty() && says("injected")) || bad_copy ||
                 (lost_any && !accept && st == GP_ERR_BACKEND);
        if (st == GP_ERR_OOM || st == GP_ERR_LIMIT) {
            ok = 1;
            /* For lack of room although the device had it free, without
             * making any. */
            if (!faulty() && !bg_failed && room_known && need >= 0)
                EXPECT((uint64_t)need + 4 * M.large_chunk > room, "%s of tags 0x%x failed with %s although %llu bytes "
                       "were free and it needed %lld: %s", what, mask, gp_status_str(st), (unsigned long long)room,
                       (long long)need, gp_last_error());
        }
        EXPECT(ok, "%s of tags 0x%x (accept_loss %d) gave %s: %s", what, mask, accept, gp_status_str(st),
               gp_last_error());
    } else {
        for (int i = 0; i < M.n; i++)
            EXPECT(!(mask >> M.b[i].tag & 1) || state_of(&M.b[i]) == GP_BLOCK_USED || !checking("stays_offloaded"),
                   "%s of tags 0x%x returned OK, the block %p of tag %d stays offloaded", what, mask,
                   (void *)M.b[i].ptr, M.b[i].tag);
        for (int t = 0; t < NT; t++)
            EXPECT(!(mask >> t & 1) || !gp_offload_is_offloaded(M.o, tags[t]) || !checking("stays_offloaded"),
                   "%s of tags 0x%x returned OK, tag %d is still offloaded", what, mask, t);
        EXPECT(accept || !lost_sure || !checking("accept_loss"), "%s of tags 0x%x without accept_loss returned OK, bringing back blocks whose "
               "offload lost bytes (it reports %llu lost)", what, mask, (unsigned long long)res.lost);
    }
    observe(what, mask, &res, st);
}

static void op_restore(reader *r)
{
    uint8_t k = u8(r);
    if (M.window) return;
    do_restore(mask_arg(k), k >> 7, 1, "restore");
}

static void op_corrupt(reader *r)
{
    int t = u8(r) % NT;
    if (M.window) return;
    gp_error_clear();
    gp_status st = gp_offload_corrupt_for_test(M.o, tags[t]);
    TRACE("  corrupt tag %d: %s\n", t, gp_status_str(st));
    EXPECT(st == GP_OK || st == GP_ERR_INVALID, "corrupt_for_test gave %s", gp_status_str(st));
    if (st != GP_OK) return;
    /* The newest record of the tag with stored bytes: the model marks all
     * its records of the tag, any may be that one. */
    for (int k = 0; k < MAXR; k++)
        if (M.r[k].used && (M.r[k].mask >> t & 1)) M.r[k].corrupt = 1;
}

static void op_retag(reader *r)
{
    uint8_t k = u8(r), x = u8(r);
    if (!M.n || M.window) return;
    mblk *b = &M.b[k % M.n];
    int t = x % NT, prio = x >> 4 & 1 ? GP_PRIO_DEFAULT : (x >> 5) % 4;
    void *v = b->ptr + (x >> 7 ? b->req / 2 : 0);
    gp_error_clear();
    gp_status st = gp_pool_retag(M.p, &v, 1, tags[t], prio, NULL);
    TRACE("  retag %p (%s) from tag %d to %d priority %d: %s\n", (void *)b->ptr, b->rec < 0 ? "resident" : "offloaded",
          b->tag, t, prio, gp_status_str(st));
    EXPECT(st == GP_OK, "retag gave %s: %s", gp_status_str(st), gp_last_error());
    M.touched |= 1u << b->tag | 1u << t;
    b->tag = t;
    if (prio != GP_PRIO_DEFAULT) b->prio = prio;
    /* Offloaded, it comes back with a restore of its new tag. */
    if (b->rec >= 0) M.r[b->rec].mask |= 1u << t;
}

static void op_register(reader *r)
{
    uint8_t k = u8(r);
    int t = k % NT, prio = (int)(k >> 2) % 5 - 1;
    gp_status st = gp_offload_register(M.o, tags[t], prio, k >> 7 ? 2 : 4);
    EXPECT(st == GP_OK, "register gave %s", gp_status_str(st));
    M.reg_prio[t] = prio;
}

static void op_use(reader *r)
{
    uint8_t k = u8(r);
    int t = k % NT;
    M.busy[t] = k >> 2 & 1;
    EXPECT(gp_offload_use(M.o, tags[t], M.busy[t]) == GP_OK, "use gave %s", gp_last_error());
}

static void op_reclaim(reader *r)
{
    uint8_t k = u8(r);
    uint64_t needed = (uint64_t)(k % 16) * MiB;
    uint64_t got = gp_offload_reclaim(M.o, needed, (k >> 4) % 5);
    TRACE("  reclaim %llu below %d: %llu\n", (unsigned long long)needed, (k >> 4) % 5, (unsigned long long)got);
    uint64_t offloadable, offloaded;
    gp_offload_figures(M.o, &offloadable, &offloaded);
}

static void op_fault(reader *r)
{
    static const gp_host_fn fns[] = {GP_HOST_COPY,        GP_HOST_MAP,        GP_HOST_UNMAP,
                                     GP_HOST_EVENT_RECORD, GP_HOST_EVENT_QUERY, GP_HOST_EVENT_WAIT,
                                     GP_HOST_HOST_ALLOC,  GP_HOST_CHECKSUM,   GP_HOST_STREAM_WAIT,
                                     GP_HOST_SYNCHRONIZE, GP_HOST_GATHER,     GP_HOST_COPY};
    uint8_t k = u8(r), n = u8(r);
    if (k == 255) {
        gp_host_fail_none(M.be);
        M.faults = 0;
        return;
    }
    gp_host_fn fn = fns[k % 12];
    gp_status st = (k >> 4) & 1 ? GP_ERR_OOM : GP_ERR_BACKEND;
    int mode = (k >> 5) % 4 == 0 ? GP_HOST_FAIL_FROM : GP_HOST_FAIL_ONCE;
    gp_host_fail(M.be, fn, 1 + n % 24, st, mode);
    M.faults = 1;
    TRACE("  fault: %s call %u from now %s (%s)\n", gp_host_fn_name(fn), 1 + n % 24,
          mode == GP_HOST_FAIL_FROM ? "and after" : "once", gp_status_str(st));
}

/* A window: operations that run while the worker thread prefetches or
 * offloads in the background (no restore, retag or corruption: those
 * would make the model unable to tell what the worker did). */
static void run_window(reader *r, unsigned n);

static void op_prefetch(reader *r)
{
    uint8_t k = u8(r), w = u8(r);
    if (M.window) return;
    unsigned mask = mask_arg(k);
    gp_tag tv[NT];
    size_t nt = tags_of(mask, tv);
    gp_error_clear();
    gp_status st = gp_prefetch_tags(M.o, tv, nt);
    TRACE("  prefetch tags 0x%x: %s\n", mask, gp_status_str(st));
    EXPECT(st == GP_OK, "prefetch gave %s: %s", gp_status_str(st), gp_last_error());
    M.window = 1;
    /* The window's tags: those of every record the prefetch may take (a
     * record of several tags comes back whole: an offload of one of its
     * other tags in the window may run after it came back). */
    M.win_mask = mask;
    for (int i = 0; i < MAXR; i++)
        if (M.r[i].used && (M.r[i].mask & mask)) M.win_mask |= M.r[i].mask;
    for (int i = 0; i < M.n; i++)
        if (M.b[i].rec >= 0 && (mask >> M.b[i].tag & 1)) M.win_mask |= M.r[M.b[i].rec].mask;
    run_window(r, w % 4);
    window_close(1);
    /* A restore of the tags waits for their prefetch (and reports its
     * failure; the room it had is not known: the window's allocations
     * ran beside it). */
    do_restore(mask, k >> 7, 0, "restore after a prefetch");
}

static void op_background(reader *r)
{
    uint8_t k = u8(r), w = u8(r);
    if (M.window) return;
    unsigned mask = mask_arg(k);
    gp_offload_opts opts = opts_arg(u8(r));
    gp_tag tv[NT];
    size_t nt = tags_of(mask, tv);
    gp_error_clear();
    gp_status st = gp_offload_tags_background(M.o, tv, nt, &opts);
    TRACE("  background offload of tags 0x%x keep %d codec %d: %s\n", mask, opts.keep, opts.codec, gp_status_str(st));
    EXPECT(st == GP_OK, "background offload gave %s: %s", gp_status_str(st), gp_last_error());
    M.bg_report = 1;
    M.window = M.win_bg = 1;
    M.win_mask = mask;
    run_window(r, w % 4);
    /* Wait for it: a reclaim of nothing waits for the background offloads. */
    gp_offload_reclaim(M.o, 0, 0);
    M.touched |= mask;
    window_close(opts.keep);
    /* A dropped one that failed was undone with what it had given back
     * empty (its failure comes with a later restore): resident blocks of
     * its tags hold what keep=0 asked to drop. */
    for (int i = 0; !opts.keep && i < M.n; i++)
        if (M.b[i].rec < 0 && (mask >> M.b[i].tag & 1) && state_of(&M.b[i]) == GP_BLOCK_USED) refill(&M.b[i]);
    if (k >> 7) do_restore(mask, 1, 1, "restore after a background offload");
}

/* A swap out of the whole pool and, when it went, its swap in: what a
 * parked tenant goes through.  Out, every resident block is offloaded, or
 * kept (a chunk it shares with the offloader's own memory); a failure is
 * undone, or says it could not be (its record stays, with what it lost).
 * In, what it took comes back as it was. */
static void op_swap(reader *r)
{
    static const char *const codecs[] = {"raw", "auto",
#ifdef GP_HAVE_ZSTD
                                         "zstd",
#endif
    };
    uint8_t k = u8(r);
    if (M.window) return;
    int was[MAXB];
    for (int i = 0; i < M.n; i++) was[i] = M.b[i].rec < 0;
    uint32_t id = 0;
    gp_offload_result out, in;
    gp_error_clear();
    gp_status st = gp_offload_swap_out(M.o, codecs[k % (sizeof codecs / sizeof codecs[0])], &id, &out);
    TRACE("  swap out (%s): %s %s (bytes %llu kept %llu)\n", codecs[k % (sizeof codecs / sizeof codecs[0])],
          gp_status_str(st), st ? gp_last_error() : "", (unsigned long long)out.bytes, (unsigned long long)out.kept);
    M.touched = (1u << NT) - 1;
    const char *stayed = st != GP_OK ? strstr(gp_last_error(), "it stays offloaded and ") : NULL;
    if (st != GP_OK)
        EXPECT((st == GP_ERR_LIMIT && M.host_limit && says("GPUPOOL_HOST_LIMIT")) || (faulty() && says("injected")),
               "swap out gave %s: %s", gp_status_str(st), gp_last_error());
    /* A failed one whose undo failed too is away all the same: its id
     * names it, and the bytes it left away are counted. */
    int away = st == GP_OK || says("restoring what it had taken failed too");
    EXPECT(away == (id != 0) && (st == GP_OK || away == (out.released != 0)),
           "swap out gave %s, the id %u and %llu bytes released", gp_status_str(st), id,
           (unsigned long long)out.released);
    int rec = -1;
    uint64_t moved = 0;
    for (int i = 0; i < M.n; i++) {
        mblk *b = &M.b[i];
        if (!was[i] || state_of(b) != GP_BLOCK_OFFLOADED) continue;
        EXPECT(st == GP_OK || (stayed && says("restoring what it had taken failed too")),
               "a swap out that failed (%s) left the block %p of tag %d offloaded without saying so", gp_last_error(),
               (void *)b->ptr, b->tag);
        if (rec < 0) {
            unsigned long long lost = stayed ? strtoull(stayed + strlen("it stays offloaded and "), NULL, 10) : 0;
            rec = new_rec((1u << NT) - 1, 1, lost ? LOST_SURE : LOST_NO);
        }
        b->rec = rec;
        moved += b->size;
    }
    if (st != GP_OK) return;
    EXPECT(out.bytes == moved, "swap out: %llu bytes moved, the blocks say %llu", (unsigned long long)out.bytes,
           (unsigned long long)moved);
    gp_error_clear();
    st = gp_offload_swap_in(M.o, id, &in);
    TRACE("  swap in: %s %s (bytes %llu)\n", gp_status_str(st), st ? gp_last_error() : "",
          (unsigned long long)in.bytes);
    EXPECT(st == GP_OK || (faulty() && says("injected")), "swap in gave %s: %s", gp_status_str(st), gp_last_error());
    EXPECT(st != GP_OK || in.bytes == out.bytes, "swap in brought back %llu bytes, the swap out took %llu",
           (unsigned long long)in.bytes, (unsigned long long)out.bytes);
    observe("a swap in", 0, NULL, GP_OK); /* (what came back, checked with its record's flags) */
    int left = 0;
    for (int i = 0; i < M.n; i++) left |= rec >= 0 && M.b[i].rec == rec;
    EXPECT(st != GP_OK || !left, "swap in returned OK, a block it took stays offloaded");
    if (rec >= 0 && !left) M.r[rec].used = 0;
}

/* The operations, by opcode (the byte modulo their count). */
#define OPS(X)                                                                                 \
    X(alloc) X(alloc) X(alloc) X(free) X(free) X(write) X(offload) X(offload) X(offload)        \
    X(restore) X(restore) X(restore) X(prefetch) X(background) X(retag) X(register) X(register) \
    X(use) X(reclaim) X(corrupt) X(fault) X(swap)

typedef void (*op_fn)(reader *);
#define OP_ENTRY(name) {op_##name, #name},
static const struct {
    op_fn fn;
    const char *name;
} ops[] = {OPS(OP_ENTRY)};
#define N_OPS (sizeof ops / sizeof ops[0])

/* Inside a window: allocations, frees, offloads of other tags,
 * registration and use, reclaims. */
static void run_window(reader *r, unsigned n)
{
    static const op_fn inner[] = {op_alloc, op_alloc, op_free, op_offload, op_register, op_use, op_reclaim};
    for (unsigned k = 0; k < n && r->n; k++) {
        uint8_t op = u8(r) % (sizeof inner / sizeof inner[0]);
        TRACE(" in the window: %u\n", op);
        inner[op](r);
        check_figures("an operation in a window");
    }
}

/* ------------------------------------------------------------------ a run */

static void setup(reader *r)
{
    memset(&M, 0, sizeof M);
    M.misuse = gp_host_misuse(NULL, 0);
    uint8_t a = u8(r), b = u8(r);
    M.capacity = (24 + 8 * (uint64_t)(a % 6)) * MiB;
    unsigned threads = 1 + (a >> 3) % 4;
    /* (a limit below a slab, 32 MiB, holds nothing: rarely) */
    static const uint64_t limits[] = {8 * MiB, 32 * MiB, 64 * MiB, 64 * MiB};
    M.host_limit = (b & 3) == 0 ? limits[(b >> 2) % 4] : 0;
    gp_config cfg;
    gp_config_default(&cfg);
    cfg.chunk = 64 * KiB << (b >> 4) % 3;
    cfg.small_size = 64 * KiB;
    cfg.large_chunk = b >> 6 & 1 ? 1 * MiB : cfg.chunk;
    cfg.cache_slack = b >> 7 ? 0.05 : -1;
    M.large_chunk = cfg.large_chunk;
    EXPECT(gp_backend_host_create(M.capacity, &M.be) == GP_OK, "host backend: %s", gp_last_error());
    EXPECT(gp_pool_create(M.be, &cfg, &M.p) == GP_OK, "pool: %s", gp_last_error());
    EXPECT(gp_offloader_create(M.p, M.host_limit, threads, NULL, &M.o) == GP_OK, "offloader: %s", gp_last_error());
    for (int t = 0; t < NT; t++) M.reg_prio[t] = -1;
    TRACE("setup: %llu MiB, chunk %llu KiB, large %llu KiB, %u threads, host limit %llu MiB\n",
          (unsigned long long)(M.capacity / MiB), (unsigned long long)(cfg.chunk / KiB),
          (unsigned long long)(cfg.large_chunk / KiB), threads, (unsigned long long)(M.host_limit / MiB));
}

static void teardown(void)
{
    gp_host_fail_none(M.be);
    M.faults = 0;
    M.injected0 = injected();
    M.touched = 0;
    /* Everything back (losses accepted), checked; corrupt records stay. */
    for (int t = 0; t < NT; t++) gp_offload_use(M.o, tags[t], 1);
    do_restore((1u << NT) - 1, 1, 1, "the final restore");
    check_figures("the final restore");
    while (M.n) {
        EXPECT(gp_free(M.p, M.b[0].ptr) == GP_OK, "a final free: %s", gp_last_error());
        M.b[0] = M.b[--M.n];
    }
    gp_offloader_destroy(M.o);
    gp_pool_empty_cache(M.p);
    char msg[512];
    size_t v = gp_pool_check(M.p, msg, sizeof msg);
    EXPECT(v == 0, "at the end: gp_pool_check: %zu violations, the first: %s", v, msg);
    gp_pool_destroy(M.p);
    EXPECT(gp_host_misuse(msg, sizeof msg) == M.misuse, "backend misuse at the end: %s", msg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    trace = getenv("FUZZ_OFFLOAD_TRACE") != NULL;
    ignore = getenv("FUZZ_OFFLOAD_IGNORE");
    for (int i = 0; i < NT; i++)
        if (gp_tag_intern(tag_names[i], &tags[i]) != GP_OK) finding("tag %s: %s", tag_names[i], gp_last_error());
    if (gp_tag_intern("gpupool", &own_tag) != GP_OK) finding("tag gpupool: %s", gp_last_error());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    setup(&r);
    check_figures("creation");
    for (unsigned k = 0; r.n; k++) {
        uint8_t opcode = u8(&r);
        const char *name = ops[opcode % N_OPS].name;
        TRACE("op %u: %s\n", k, name);
        M.injected0 = injected();
        M.touched = 0;
        ops[opcode % N_OPS].fn(&r);
        char after[64];
        snprintf(after, sizeof after, "op %u (%s)", k, name);
        check_figures(after);
        if (opcode % N_OPS != 9 && opcode % N_OPS != 10 && opcode % N_OPS != 11) observe(after, 0, NULL, GP_OK);
    }
    teardown();
    return 0;
}
