/*
 * check.c -- gp_pool_check, the pool's integrity checker (as tlsf_check is
 * TLSF's): every structure the pool keeps is checked against every other
 * one that states the same fact -- the block list against the arenas, the
 * bins and their bitmaps against the free blocks, the pointer hash against
 * the used blocks, the spare headers against the slabs, the record_stream
 * table against the pending blocks, the figures against sums over the
 * blocks, the chunk table against the mapped blocks.  Tests run it after
 * every operation; GPUPOOL_DEBUG=1 runs it every GP_DEBUG_EVERY operations.
 *
 * Every walk is bounded by the number of block headers that exist, so a
 * corrupted list (a cycle) is reported, never followed forever.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

typedef struct gp_checker {
    char *msg;
    size_t n;
    size_t violations;
    uint64_t headers; /* block headers that exist: the bound of every walk */
} gp_checker;

static void gp_violation(gp_checker *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void gp_violation(gp_checker *c, const char *fmt, ...)
{
    if (c->violations++ == 0 && c->n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, c->n, fmt, ap);
        va_end(ap);
    }
}

#define VIOLATION_IF(c, cond, ...)                                         \
    do {                                                                   \
        if (cond) gp_violation((c), __VA_ARGS__);                          \
    } while (0)

/* The blocks of one list of bins `b`, all of arena a, state `state` and
 * (for FREE) slot `sidx`; returns how many (stops at the bound). */
static uint64_t gp_check_bins(gp_checker *c, const gp_pool *p, const gp_arena *a, const gp_bins *b,
                              int state, unsigned sidx, const char *what)
{
    uint64_t count = 0;
    for (unsigned fl = 0; fl < FL_COUNT; fl++) {
        VIOLATION_IF(c, !!(b->fl_map & (1ull << fl)) != !!b->sl_map[fl],
                     "%s: first-level bit %u is %d but its second-level map is %#x", what, fl,
                     !!(b->fl_map & (1ull << fl)), (unsigned)b->sl_map[fl]);
        for (unsigned sl = 0; sl < SL_COUNT; sl++) {
            const gp_block *h = b->heads[fl][sl];
            VIOLATION_IF(c, !!(b->sl_map[fl] & (1u << sl)) != (h != NULL),
                         "%s: bitmap bit (%u, %u) is %d but the list is %s", what, fl, sl,
                         !!(b->sl_map[fl] & (1u << sl)), h ? "not empty" : "empty");
            const gp_block *prev = NULL;
            for (const gp_block *blk = h; blk; prev = blk, blk = blk->fnext) {
                if (++count > c->headers) {
                    gp_violation(c, "%s: the list of class (%u, %u) is longer than the headers that exist "
                                 "(a cycle)", what, fl, sl);
                    return count;
                }
                unsigned f, s;
                gp_mapping(blk->size >> GP_ALIGN_LOG2, &f, &s);
                VIOLATION_IF(c, f != fl || s != sl,
                             "%s: block 0x%" PRIxPTR " of %" PRIu64 " bytes sits in class (%u, %u), "
                             "belongs in (%u, %u)", what, blk->addr, blk->size, fl, sl, f, s);
                VIOLATION_IF(c, blk->fprev != prev, "%s: block 0x%" PRIxPTR " has a wrong back link", what,
                             blk->addr);
                VIOLATION_IF(c, blk->state != state, "%s: block 0x%" PRIxPTR " is in state %u", what,
                             blk->addr, (unsigned)blk->state);
                VIOLATION_IF(c, &p->arenas[blk->arena] != a, "%s: block 0x%" PRIxPTR " is of arena %u", what,
                             blk->addr, (unsigned)blk->arena);
                VIOLATION_IF(c, state == GP_BLOCK_FREE && blk->sidx != sidx,
                             "%s: block 0x%" PRIxPTR " has slot %u", what, blk->addr, (unsigned)blk->sidx);
            }
        }
    }
    return count;
}

typedef struct gp_sums {
    uint64_t used, requested, n_used, free_mapped, pending, n_pending, n_rec_blocks;
    uint64_t offloaded, n_offloaded, offl_mapped; /* offl_mapped: bytes of runs and TRANSIT blocks still mapped */
    uint64_t tag_alloc[GP_MAX_TAGS], tag_req[GP_MAX_TAGS], tag_blocks[GP_MAX_TAGS], tag_off[GP_MAX_TAGS];
    uint64_t prio_alloc[GP_PRIO_MAX + 1];
    uint64_t free_in_slot[GP_ARENA_COUNT][GP_MAX_STREAMS];
    uint64_t unmapped_in[GP_ARENA_COUNT][2];
    uint64_t blocks;
} gp_sums;

static int gp_is_mapped(const gp_block *b) { return b->state != GP_BLOCK_FREE_UNMAPPED; }

/* The block list of arena k: coverage, links, states, maximal merging, the
 * chunk table; sums into *s. */
static void gp_check_arena(gp_checker *c, gp_pool *p, unsigned k, gp_sums *s)
{
    const gp_arena *a = &p->arenas[k];
    uintptr_t end = a->base;
    const gp_block *prev = NULL;
    uint64_t n = 0;
    for (const gp_block *b = a->first; b; prev = b, b = b->next) {
        if (++n > c->headers) {
            gp_violation(c, "arena %u: the block list is longer than the headers that exist (a cycle)", k);
            return;
        }
        s->blocks++;
        VIOLATION_IF(c, b->prev != prev, "arena %u: block 0x%" PRIxPTR " has a wrong back link", k, b->addr);
        VIOLATION_IF(c, b->addr != end, "arena %u: block 0x%" PRIxPTR " starts where the previous ended, "
                     "0x%" PRIxPTR " (a gap or an overlap)", k, b->addr, end);
        VIOLATION_IF(c, b->size == 0 || b->size % GP_ALIGN || b->addr % GP_ALIGN,
                     "arena %u: block 0x%" PRIxPTR " of %" PRIu64 " bytes is not 512-byte aligned", k, b->addr,
                     b->size);
        VIOLATION_IF(c, b->arena != k, "arena %u: block 0x%" PRIxPTR " says arena %u", k, b->addr,
                     (unsigned)b->arena);
        unsigned life = b->addr >= a->long_base ? GP_LIFE_LONG : GP_LIFE_SHORT;
        VIOLATION_IF(c, b->life != life, "arena %u: block 0x%" PRIxPTR " says lifetime %u in region %u", k,
                     b->addr, (unsigned)b->life, life);
        VIOLATION_IF(c, b->addr < a->long_base && b->addr + b->size > a->long_base,
                     "arena %u: block 0x%" PRIxPTR " straddles the long-lived region's start", k, b->addr);
        end = b->addr + b->size;

        if (prev && gp_is_mapped(prev) != gp_is_mapped(b))
            VIOLATION_IF(c, b->addr % a->chunk, "arena %u: mapped and unmapped memory meet at 0x%" PRIxPTR
                         ", not a chunk boundary", k, b->addr);
        /* Maximal merging: what gp_insert_free would merge must be merged. */
        if (prev && prev->life == b->life && prev->state == b->state &&
            ((b->state == GP_BLOCK_FREE && prev->sidx == b->sidx) || b->state == GP_BLOCK_FREE_UNMAPPED))
            gp_violation(c, "arena %u: free blocks 0x%" PRIxPTR " and 0x%" PRIxPTR " are neighbours of the "
                         "same kind and were not merged", k, prev->addr, b->addr);

        switch (b->state) {
        case GP_BLOCK_USED:
            s->used += b->size;
            s->requested += b->requested;
            s->n_used++;
            VIOLATION_IF(c, b->requested == 0 || b->requested > b->size,
                         "used block 0x%" PRIxPTR " of %" PRIu64 " bytes was asked for %" PRIu64, b->addr,
                         b->size, b->requested);
            VIOLATION_IF(c, gp_hash_find(p, b->addr) != b, "used block 0x%" PRIxPTR " is not in the pointer hash",
                         b->addr);
            if (b->tag < GP_MAX_TAGS) {
                s->tag_alloc[b->tag] += b->size;
                s->tag_req[b->tag] += b->requested;
                s->tag_blocks[b->tag]++;
            }
            VIOLATION_IF(c, b->tag >= gp_tag_count(), "used block 0x%" PRIxPTR " has tag %u, never interned",
                         b->addr, (unsigned)b->tag);
            s->prio_alloc[b->prio] += b->size;
            break;
        case GP_BLOCK_FREE:
            s->free_mapped += b->size;
            VIOLATION_IF(c, b->sidx >= p->n_streams || p->slot_kind[b->sidx] == GP_SLOT_SPARE,
                         "free block 0x%" PRIxPTR " is in slot %u, which is not in use", b->addr,
                         (unsigned)b->sidx);
            if (b->sidx < GP_MAX_STREAMS) s->free_in_slot[k][b->sidx]++;
            /* Placement: a slot's bins hold blocks of its region only. */
            VIOLATION_IF(c, b->sidx < GP_MAX_STREAMS && b->life != p->slot_life[b->sidx],
                         "free block 0x%" PRIxPTR " of region %u is in slot %u, of region %u", b->addr,
                         (unsigned)b->life, (unsigned)b->sidx, (unsigned)p->slot_life[b->sidx]);
            VIOLATION_IF(c, b->rec, "free block 0x%" PRIxPTR " still has a record_stream record", b->addr);
            break;
        case GP_BLOCK_PENDING:
            s->pending += b->size;
            s->n_pending++;
            VIOLATION_IF(c, !b->rec, "pending block 0x%" PRIxPTR " has no record_stream record", b->addr);
            break;
        case GP_BLOCK_OFFLOADED:
            s->offloaded += b->size;
            s->n_offloaded++;
            VIOLATION_IF(c, b->requested == 0 || b->requested > b->size,
                         "offloaded block 0x%" PRIxPTR " of %" PRIu64 " bytes was asked for %" PRIu64, b->addr,
                         b->size, b->requested);
            VIOLATION_IF(c, gp_hash_find(p, b->addr) != b,
                         "offloaded block 0x%" PRIxPTR " is not in the pointer hash", b->addr);
            VIOLATION_IF(c, b->tag >= gp_tag_count(), "offloaded block 0x%" PRIxPTR " has tag %u, never interned",
                         b->addr, (unsigned)b->tag);
            if (b->tag < GP_MAX_TAGS) {
                s->tag_off[b->tag] += b->size;
                s->tag_blocks[b->tag]++;
            }
            break;
        case GP_BLOCK_FREE_OFFLOADED:
            VIOLATION_IF(c, b->rec, "free offloaded block 0x%" PRIxPTR " still has a record_stream record", b->addr);
            break;
        case GP_BLOCK_TRANSIT:
            VIOLATION_IF(c, b->addr % a->chunk || b->size % a->chunk,
                         "block 0x%" PRIxPTR " of %" PRIu64 " bytes in transit is not on chunk boundaries", b->addr,
                         b->size);
            break;
        case GP_BLOCK_FREE_UNMAPPED:
            s->unmapped_in[k][b->life]++;
            VIOLATION_IF(c, b->addr % a->chunk || b->size % a->chunk,
                         "unmapped block 0x%" PRIxPTR " of %" PRIu64 " bytes is not on chunk boundaries", b->addr,
                         b->size);
            break;
        default:
            gp_violation(c, "block 0x%" PRIxPTR " has state %u", b->addr, (unsigned)b->state);
        }
        if (b->rec) s->n_rec_blocks++;

        /* The chunk table: a chunk under mapped memory has a handle, one
         * under unmapped memory none; an offloaded run's chunks, and those
         * in transit, are mapped or not, all of a chunk alike (runs are
         * whole chunks). */
        if (b->state == GP_BLOCK_OFFLOADED || b->state == GP_BLOCK_FREE_OFFLOADED || b->state == GP_BLOCK_TRANSIT) {
            for (uintptr_t x = b->addr / a->chunk * a->chunk; x < b->addr + b->size; x += a->chunk) {
                if (!a->handles[gp_chunk_index(a, x)]) continue;
                uintptr_t lo = x > b->addr ? x : b->addr, hi = x + a->chunk;
                if (hi > b->addr + b->size) hi = b->addr + b->size;
                s->offl_mapped += hi - lo;
            }
        } else if (b->state == GP_BLOCK_FREE_UNMAPPED) {
            for (uintptr_t x = b->addr; x < b->addr + b->size && x >= b->addr; x += a->chunk)
                VIOLATION_IF(c, a->handles[gp_chunk_index(a, x)] != 0,
                             "arena %u: chunk at 0x%" PRIxPTR " is unmapped but has a handle", k, x);
        } else {
            uintptr_t lo = b->addr / a->chunk * a->chunk;
            for (uintptr_t x = lo; x < b->addr + b->size; x += a->chunk)
                VIOLATION_IF(c, a->handles[gp_chunk_index(a, x)] == 0,
                             "arena %u: chunk at 0x%" PRIxPTR " holds mapped blocks but has no handle", k, x);
        }
    }
    VIOLATION_IF(c, end != a->base + a->size, "arena %u: the blocks end at 0x%" PRIxPTR ", the arena at 0x%" PRIxPTR,
                 k, end, a->base + a->size);
}

static size_t gp_check_locked(gp_pool *p, char *msg, size_t n)
{
    gp_checker c = {.msg = msg, .n = n};
    if (n) msg[0] = '\0';
    c.headers = (uint64_t)p->n_slabs * GP_SLAB_BLOCKS;

    static _Thread_local gp_sums s; /* large: off the stack */
    memset(&s, 0, sizeof s);
    for (unsigned k = 0; k < p->n_arenas; k++) gp_check_arena(&c, p, k, &s);

    /* The bins hold exactly the free blocks of their slot and region. */
    for (unsigned k = 0; k < p->n_arenas; k++) {
        const gp_arena *a = &p->arenas[k];
        char what[64];
        for (unsigned life = 0; life < 2; life++) {
            snprintf(what, sizeof what, "arena %u unmapped bins (region %u)", k, life);
            uint64_t m = gp_check_bins(&c, p, a, &a->unmapped[life], GP_BLOCK_FREE_UNMAPPED, 0, what);
            VIOLATION_IF(&c, m != s.unmapped_in[k][life], "%s hold %" PRIu64 " blocks, the arena %" PRIu64, what,
                         m, s.unmapped_in[k][life]);
        }
        for (unsigned i = 0; i < GP_MAX_STREAMS; i++) {
            VIOLATION_IF(&c, (i < p->n_streams) != (a->bins[i] != NULL),
                         "arena %u: slot %u has %s bins (%u slots in use)", k, i, a->bins[i] ? "" : "no",
                         p->n_streams);
            if (!a->bins[i]) continue;
            snprintf(what, sizeof what, "arena %u bins of slot %u", k, i);
            uint64_t m = gp_check_bins(&c, p, a, a->bins[i], GP_BLOCK_FREE, i, what);
            VIOLATION_IF(&c, m != s.free_in_slot[k][i], "%s hold %" PRIu64 " blocks, the arena %" PRIu64, what, m,
                         s.free_in_slot[k][i]);
        }
    }

    /* The pointer hash holds exactly the used blocks. */
    uint64_t hashed = 0;
    for (uint64_t h = 0; h <= p->hmask && hashed <= c.headers; h++) {
        for (const gp_block *b = p->buckets[h]; b; b = b->fnext) {
            if (++hashed > c.headers) {
                gp_violation(&c, "the pointer hash has more entries than headers exist (a cycle)");
                break;
            }
            VIOLATION_IF(&c, b->state != GP_BLOCK_USED && b->state != GP_BLOCK_OFFLOADED,
                         "the pointer hash holds block 0x%" PRIxPTR " in state %u", b->addr, (unsigned)b->state);
            VIOLATION_IF(&c, gp_hash(p, b->addr) != h, "block 0x%" PRIxPTR " is in the wrong hash bucket",
                         b->addr);
        }
    }
    VIOLATION_IF(&c, hashed != s.n_used + s.n_offloaded || p->hcount != hashed,
                 "the pointer hash holds %" PRIu64 " blocks (count %" PRIu64 "), %" PRIu64 " are live", hashed,
                 p->hcount, s.n_used + s.n_offloaded);

    /* Every header is in a block list, spare, or held by a trim in transit. */
    uint64_t spare = p->held;
    for (const gp_block *b = p->spare; b && spare <= c.headers; b = b->fnext) spare++;
    VIOLATION_IF(&c, spare + s.blocks != c.headers,
                 "%" PRIu64 " spare headers and %" PRIu64 " blocks, but %" PRIu64 " headers exist", spare,
                 s.blocks, c.headers);

    /* Only a growth, which keeps the lock throughout, names a block its
     * trims pass by. */
    VIOLATION_IF(&c, p->growing_from != 0, "a growth's block 0x%" PRIxPTR " is still kept from trims",
                 p->growing_from);

    /* The record_stream table against the blocks. */
    unsigned pending_recs = 0;
    VIOLATION_IF(&c, p->n_recs > p->cap_recs, "%u record_stream records in room for %zu", p->n_recs,
                 p->cap_recs);
    for (unsigned i = 0; i < p->n_recs && i < p->cap_recs; i++) {
        const gp_rec *r = &p->recs[i];
        VIOLATION_IF(&c, !r->b || !r->b->rec, "record_stream record %u names no block that has one", i);
        VIOLATION_IF(&c, r->n == 0 || r->n > GP_REC_STREAMS, "record_stream record %u has %u streams", i, r->n);
        if (r->b) {
            int ok = r->pending ? r->b->state == GP_BLOCK_PENDING
                                : r->b->state == GP_BLOCK_USED || r->b->state == GP_BLOCK_OFFLOADED;
            VIOLATION_IF(&c, !ok, "record_stream record %u (%s) names block 0x%" PRIxPTR " in state %u", i,
                         r->pending ? "pending" : "live", r->b->addr, (unsigned)r->b->state);
        }
        for (unsigned j = i + 1; j < p->n_recs; j++)
            VIOLATION_IF(&c, p->recs[j].b == r->b, "record_stream records %u and %u name one block", i, j);
        pending_recs += r->pending;
    }
    VIOLATION_IF(&c, s.n_rec_blocks != p->n_recs, "%" PRIu64 " blocks have a record_stream record, the table "
                 "holds %u", s.n_rec_blocks, p->n_recs);
    VIOLATION_IF(&c, pending_recs != p->n_pending || s.n_pending != p->n_pending,
                 "%u pending records, %" PRIu64 " pending blocks, n_pending %u", pending_recs, s.n_pending,
                 p->n_pending);

    /* Graph pools against their slots. */
    unsigned capturing = 0;
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++) {
        const gp_gpool *g = &p->gpools[i];
        if (!g->live) continue;
        capturing += g->n_capturing;
        VIOLATION_IF(&c, g->slot >= p->n_streams || p->slot_kind[g->slot] != GP_SLOT_GPOOL,
                     "graph pool %" PRIu64 " has slot %u, which is not a graph pool's", g->key, g->slot);
        /* A replay's question trusts the flag: no block of its away without it. */
        for (unsigned k = 0; !g->away && k < p->n_arenas; k++)
            for (const gp_block *b = p->arenas[k].first; b; b = b->next)
                VIOLATION_IF(&c, b->sidx == g->slot &&
                             (b->state == GP_BLOCK_OFFLOADED || b->state == GP_BLOCK_FREE_OFFLOADED),
                             "graph pool %" PRIu64 "'s block 0x%" PRIxPTR " is offloaded, its away flag unset",
                             g->key, b->addr);
    }
    VIOLATION_IF(&c, capturing != p->n_capturing, "%u streams capture into graph pools, n_capturing %u",
                 capturing, p->n_capturing);

    /* The figures against the blocks. */
    const gp_stats *st = &p->st;
    VIOLATION_IF(&c, s.used != st->allocated, "used blocks hold %" PRIu64 " bytes, allocated says %" PRIu64,
                 s.used, st->allocated);
    VIOLATION_IF(&c, s.requested != st->requested, "used blocks were asked %" PRIu64 " bytes, requested says "
                 "%" PRIu64, s.requested, st->requested);
    VIOLATION_IF(&c, s.n_used + s.n_offloaded != st->active_blocks,
                 "%" PRIu64 " live blocks, active_blocks says %" PRIu64, s.n_used + s.n_offloaded, st->active_blocks);
    VIOLATION_IF(&c, s.offloaded != st->offloaded, "offloaded blocks hold %" PRIu64 " bytes, offloaded says %"
                 PRIu64, s.offloaded, st->offloaded);
    VIOLATION_IF(&c, s.pending != st->pending, "pending blocks hold %" PRIu64 " bytes, pending says %" PRIu64,
                 s.pending, st->pending);
    /* (Chunks a restore is mapping are in reserved, not yet in the table.) */
    VIOLATION_IF(&c, s.used + s.free_mapped + s.pending + s.offl_mapped + p->mapping != st->reserved,
                 "mapped blocks hold %" PRIu64 " bytes, reserved says %" PRIu64,
                 s.used + s.free_mapped + s.pending + s.offl_mapped + p->mapping, st->reserved);
    VIOLATION_IF(&c, st->allocated_peak < st->allocated || st->reserved_peak < st->reserved,
                 "a peak is below its current value");
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) {
        const gp_tag_stats *ts = &p->tags[t];
        VIOLATION_IF(&c, ts->allocated != s.tag_alloc[t] || ts->requested != s.tag_req[t] ||
                             ts->active_blocks != s.tag_blocks[t] || ts->offloaded != s.tag_off[t],
                     "tag %u: figures say %" PRIu64 " bytes (%" PRIu64 " offloaded) in %" PRIu64 " blocks, the "
                     "blocks %" PRIu64 " (%" PRIu64 ") in %" PRIu64, t, ts->allocated, ts->offloaded,
                     ts->active_blocks, s.tag_alloc[t], s.tag_off[t], s.tag_blocks[t]);
    }
    for (unsigned q = 0; q <= GP_PRIO_MAX; q++)
        VIOLATION_IF(&c, p->prio_alloc[q] != s.prio_alloc[q],
                     "priority %u: figures say %" PRIu64 " bytes, the blocks %" PRIu64, q, p->prio_alloc[q],
                     s.prio_alloc[q]);

    /* Mapped chunks against reserved: each chunk with a handle is mapped. */
    uint64_t mapped = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        const gp_arena *a = &p->arenas[k];
        for (uint64_t i = 0; i < a->size / a->chunk; i++) mapped += a->handles[i] ? a->chunk : 0;
    }
    VIOLATION_IF(&c, mapped + p->mapping != st->reserved, "%" PRIu64 " bytes of chunks are mapped, reserved says %"
                 PRIu64, mapped + p->mapping, st->reserved);

    /* Streams. */
    VIOLATION_IF(&c, p->n_streams > GP_MAX_STREAMS, "%u stream slots", p->n_streams);
    VIOLATION_IF(&c, p->n_streams && p->last_sidx >= p->n_streams, "the last slot %u is not in use",
                 p->last_sidx);
    return c.violations;
}

void gp_debug_check(gp_pool *p)
{
    char msg[512];
    size_t v = gp_check_locked(p, msg, sizeof msg);
    if (!v) return;
    fprintf(stderr, "gpupool: GPUPOOL_DEBUG: the pool of device %d is corrupt after %" PRIu64
            " allocations and frees (%zu violations); the first: %s\n", p->be->device, p->debug_ops, v, msg);
    abort();
}

size_t gp_pool_check(gp_pool *p, char *msg, size_t n)
{
    pthread_mutex_lock(&p->lock);
    size_t v = gp_check_locked(p, msg, n);
    pthread_mutex_unlock(&p->lock);
    return v;
}
