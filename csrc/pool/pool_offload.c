/*
 * pool_offload.c -- the pool's side of offload: which physical chunks can
 * leave the device while every address stays valid, and the block states
 * and figures while they are away (see gpupool.h, "offload, pool side").
 * offload.c moves the bytes; this file never copies anything.
 *
 * A chunk is the unit of physical memory: it can only be given back whole.
 * It is released when every block overlapping it is a live block of the
 * tags (a candidate) or free cache of a stream.  A candidate that touches a
 * released chunk is offloaded as a whole block (no kernel may touch it), but
 * only its bytes in released chunks move: its head or tail in a chunk shared
 * with other live memory stays where it is, untouched, until the restore.
 * Free blocks straddling a run's edge are split at the chunk boundary: the
 * part inside waits in the run (FREE_OFFLOADED).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "util.h"

static inline uintptr_t gp_chunk_down(const gp_arena *a, uintptr_t x)
{
    return a->base + (x - a->base) / a->chunk * a->chunk;
}

static inline uintptr_t gp_chunk_up(const gp_arena *a, uintptr_t x)
{
    return a->base + gp_round_up(x - a->base, a->chunk);
}

typedef struct gp_plan_build {
    gp_offload_plan *pl;
    size_t cap_runs, cap_ranges;
    const gp_arena *last; /* the arena of the last run */
} gp_plan_build;

static gp_status gp_nomem_plan(void)
{
    return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for an offload plan");
}

/* Add chunk range [lo, hi) of arena a to the runs, joining the last run
 * when they touch. */
static gp_status gp_add_run(gp_plan_build *pb, const gp_arena *a, uintptr_t lo, uintptr_t hi)
{
    gp_offload_plan *pl = pb->pl;
    gp_offload_run *last = pl->n_runs && pb->last == a ? &pl->runs[pl->n_runs - 1] : NULL;
    if (last && last->addr + last->size >= lo && last->addr <= lo) {
        if (hi > last->addr + last->size) {
            pl->released += hi - (last->addr + last->size);
            last->size = hi - last->addr;
        }
        return GP_OK;
    }
    gp_offload_run *v = gp_array_room(pl->runs, &pb->cap_runs, pl->n_runs, sizeof *v, 16);
    if (!v) return gp_nomem_plan();
    pl->runs = v;
    v[pl->n_runs++] = (gp_offload_run){.addr = lo, .size = hi - lo, .chunk = a->chunk};
    pl->released += hi - lo;
    pb->last = a;
    return GP_OK;
}

/* The part of live block b inside [lo, hi), as a range to copy. */
static gp_status gp_add_range(gp_plan_build *pb, const gp_block *b, uintptr_t lo, uintptr_t hi)
{
    uintptr_t x = b->addr > lo ? b->addr : lo, e = b->addr + b->size < hi ? b->addr + b->size : hi;
    if (e <= x) return GP_OK;
    gp_offload_plan *pl = pb->pl;
    gp_offload_range *v = gp_array_room(pl->ranges, &pb->cap_ranges, pl->n_ranges, sizeof *v, 16);
    if (!v) return gp_nomem_plan();
    pl->ranges = v;
    v[pl->n_ranges++] = (gp_offload_range){.addr = x, .size = e - x, .tag = b->tag, .priority = b->prio};
    pl->bytes += e - x;
    return GP_OK;
}

static int gp_run_cmp(const void *a, const void *b)
{
    uintptr_t x = ((const gp_offload_run *)a)->addr, y = ((const gp_offload_run *)b)->addr;
    return (x > y) - (x < y);
}

static int gp_range_cmp(const void *a, const void *b)
{
    uintptr_t x = ((const gp_offload_range *)a)->addr, y = ((const gp_offload_range *)b)->addr;
    return (x > y) - (x < y);
}

/* The plan is built arena by arena, and the arenas' order is not their
 * address order (the small arena lies above the large one); the header
 * promises address order, which the data path walks runs and ranges by. */
static void gp_plan_sort(gp_offload_plan *pl)
{
    if (pl->n_runs > 1) qsort(pl->runs, pl->n_runs, sizeof *pl->runs, gp_run_cmp);
    if (pl->n_ranges > 1) qsort(pl->ranges, pl->n_ranges, sizeof *pl->ranges, gp_range_cmp);
}

static gp_offload_plan *gp_plan_new(int restore)
{
    gp_offload_plan *pl = calloc(1, sizeof *pl);
    if (pl) pl->restore = restore;
    return pl;
}

static void gp_plan_free(gp_offload_plan *pl)
{
    if (!pl) return;
    free(pl->runs);
    free(pl->ranges);
    free(pl);
}

/* Unlock, then hand out the plan in address order (or free it). */
static gp_status gp_plan_done(gp_pool *p, gp_offload_plan *pl, gp_status st, gp_offload_plan **out)
{
    pthread_mutex_unlock(&p->lock);
    if (st != GP_OK) {
        gp_plan_free(pl);
        return st;
    }
    gp_plan_sort(pl);
    *out = pl;
    return GP_OK;
}

/* The figures of a live block that leaves the device or comes back. */
static void gp_block_away(gp_pool *p, gp_block *b)
{
    gp_tag_stats *ts = &p->tags[b->tag];
    p->st.allocated -= b->size;
    p->st.requested -= b->requested;
    p->st.offloaded += b->size;
    ts->allocated -= b->size;
    ts->requested -= b->requested;
    ts->offloaded += b->size;
    p->prio_alloc[b->prio] -= b->size;
    b->state = GP_BLOCK_OFFLOADED;
}

static void gp_block_back(gp_pool *p, gp_block *b)
{
    gp_tag_stats *ts = &p->tags[b->tag];
    gp_allocated_grows(p, b->size);
    gp_peak(&p->st.requested, &p->st.requested_peak, b->requested);
    p->st.offloaded -= b->size;
    gp_peak(&ts->allocated, &ts->allocated_peak, b->size);
    ts->requested += b->requested;
    ts->offloaded -= b->size;
    gp_peak(&p->prio_alloc[b->prio], &p->prio_peak[b->prio], b->size);
    b->state = GP_BLOCK_USED;
}

/* Put free block b (of a stream slot, in its bins) in two at chunk-aligned
 * address x, both halves back in the bins (b was maximal, so neither merges
 * with anything).  Returns the half that starts at x. */
static gp_block *gp_cut_free(gp_pool *p, gp_arena *a, gp_block *b, uintptr_t x)
{
    gp_bins_remove(gp_bins_of(a, b), b);
    gp_block *t = gp_split(p, b, x - b->addr);
    gp_bins_insert(gp_bins_of(a, b), b);
    gp_bins_insert(gp_bins_of(a, t), t);
    return t;
}

/* The first block overlapping address x, from a block at or after it. */
static gp_block *gp_back_to(gp_block *b, uintptr_t x)
{
    while (b->prev && b->prev->addr + b->prev->size > x) b = b->prev;
    return b;
}

typedef struct gp_want {
    const gp_pool *p;
    uint8_t tag[GP_MAX_TAGS];
    /* Per slot: a graph pool that one of the tags allocated into.  Its free
     * blocks go with the tags: a captured graph keeps the addresses of the
     * blocks freed inside its capture (its scratch), so they may leave the
     * device only with the rest of the graph's memory, and must be mapped
     * again at the same addresses before a replay. */
    uint8_t gpool[GP_MAX_STREAMS];
    uintptr_t cut[GP_ARENA_COUNT]; /* per arena: blocks from here on are not taken */
} gp_want;

/* Whether b lies before its arena's cut (an offload of at most max_bytes
 * takes the blocks before the cuts only). */
static int gp_before_cut(const gp_want *w, const gp_block *b)
{
    for (unsigned k = 0; k < w->p->n_arenas; k++) {
        const gp_arena *a = &w->p->arenas[k];
        if (b->addr >= a->base && b->addr < a->base + a->size) return b->addr < w->cut[k];
    }
    return 0;
}

/* A live block of the tags, of a stream or of a graph pool, before the
 * cut. */
static int gp_cand(const gp_want *w, const gp_block *b)
{
    return b->state == GP_BLOCK_USED && w->tag[b->tag] && w->p->slot_kind[b->sidx] != GP_SLOT_SPARE &&
           gp_before_cut(w, b);
}

/* A free block of a graph pool that goes with the tags.  Its bytes are not
 * copied: a replay writes a scratch block before it reads it, as the
 * capture did (the block was handed out uninitialised). */
static int gp_gfree(const gp_want *w, const gp_block *b)
{
    return b->state == GP_BLOCK_FREE && w->gpool[b->sidx] && gp_before_cut(w, b);
}

/* The cuts of an offload of at most `most` bytes (0: all): the first
 * candidates in address order, arena by arena, until they hold `most`. */
static void gp_want_cut(gp_want *w, uint64_t most)
{
    const gp_pool *p = w->p;
    uint64_t sum = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        const gp_arena *a = &p->arenas[k];
        w->cut[k] = UINTPTR_MAX;
        if (!most) continue;
        if (sum >= most) {
            w->cut[k] = a->base;
            continue;
        }
        for (const gp_block *b = a->first; b; b = b->next) {
            if (!gp_cand(w, b)) continue;
            sum += b->size;
            if (sum >= most) {
                w->cut[k] = b->addr + b->size;
                break;
            }
        }
    }
}

/* Whether chunk [x, x + chunk) can be released: every block in it is a
 * candidate, free cache of a stream or a graph pool's free block that goes
 * with the tags.  `near` is a block in or after it. */
static int gp_chunk_free_of_others(const gp_want *w, const gp_arena *a, gp_block *near, uintptr_t x)
{
    for (gp_block *y = gp_back_to(near, x); y && y->addr < x + a->chunk; y = y->next)
        if (!gp_cand(w, y) && !gp_gfree(w, y) &&
            !(y->state == GP_BLOCK_FREE && w->p->slot_kind[y->sidx] == GP_SLOT_STREAM))
            return 0;
    return 1;
}

/* The graph pools the tags allocated into (under the pool's lock). */
static void gp_want_gpools(gp_want *w, const gp_pool *p)
{
    memset(w->gpool, 0, sizeof w->gpool);
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++) {
        const gp_gpool *g = &p->gpools[i];
        for (unsigned t = 0; g->live && t < GP_MAX_TAGS && !w->gpool[g->slot]; t++)
            if (w->tag[t] && (g->tags[t / 64] >> (t % 64) & 1)) w->gpool[g->slot] = 1;
    }
}

/* Whether b is a live block of `tag` on a stream (what a move apart takes). */
static int gp_mine(const gp_pool *p, const gp_block *b, gp_tag tag)
{
    return b->state == GP_BLOCK_USED && b->tag == tag && p->slot_kind[b->sidx] == GP_SLOT_STREAM;
}

gp_status gp_pool_tag_mixed(gp_pool *p, gp_tag tag, uintptr_t *addrs, size_t cap, size_t *n, unsigned *graphs)
{
    *n = 0;
    *graphs = 0;
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    if (tag >= gp_tag_count())
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++) *graphs += p->gpools[i].live;
    for (unsigned k = 0; k < p->n_arenas && st == GP_OK; k++) {
        gp_arena *a = &p->arenas[k];
        /* Pass 1 marks the chunks holding anything but the tag's blocks,
         * pass 2 names the blocks in such a chunk: O(blocks + chunks). */
        uint64_t n_chunks = a->size / a->chunk;
        uint8_t *other = calloc((size_t)(n_chunks + 7) / 8, 1);
        if (!other) {
            st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a map of %" PRIu64 " chunks",
                              n_chunks);
            break;
        }
        for (const gp_block *b = a->first; b; b = b->next) {
            if (b->state == GP_BLOCK_FREE_UNMAPPED || gp_mine(p, b, tag)) continue;
            for (uint64_t c = gp_chunk_index(a, b->addr); c <= gp_chunk_index(a, b->addr + b->size - 1); c++)
                other[c / 8] |= (uint8_t)(1u << (c % 8));
        }
        for (const gp_block *b = a->first; b; b = b->next) {
            uint64_t c0 = gp_chunk_index(a, b->addr), c1 = gp_chunk_index(a, b->addr + b->size - 1);
            if (!gp_mine(p, b, tag) || !((other[c0 / 8] >> (c0 % 8) | other[c1 / 8] >> (c1 % 8)) & 1)) continue;
            if (*n < cap) addrs[*n] = b->addr;
            ++*n;
        }
        free(other);
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_offload_begin(gp_pool *p, const gp_tag *tags, size_t n_tags, gp_offload_plan **out)
{
    return gp_pool_offload_begin_upto(p, tags, n_tags, 0, out);
}

gp_status gp_pool_offload_begin_upto(gp_pool *p, const gp_tag *tags, size_t n_tags, uint64_t most,
                                     gp_offload_plan **out)
{
    *out = NULL;
    if (gp_pool_usable(p) != GP_OK) return gp_pool_usable(p);
    if (!tags || n_tags == 0) return gp_error_set(GP_ERR_INVALID, "gpupool: offload of no tag");
    static _Thread_local gp_want w; /* 1 KiB: off the stack */
    memset(&w, 0, sizeof w);
    w.p = p;
    for (size_t i = 0; i < n_tags; i++) {
        if (tags[i] >= gp_tag_count())
            return gp_error_set(GP_ERR_INVALID, "gpupool: offload of tag id %u, which was never interned",
                                (unsigned)tags[i]);
        w.tag[tags[i]] = 1;
    }
    gp_plan_build pb = {.pl = gp_plan_new(0)};
    gp_offload_plan *pl = pb.pl;
    gp_status st = GP_OK;
    if (!pl) return gp_nomem_plan();
    pthread_mutex_lock(&p->lock);
    if (p->n_capturing) {
        st = gp_error_set(GP_ERR_INVALID, "gpupool: cannot offload while a CUDA graph is being captured on "
                          "device %d (a capture may not synchronise)", p->be->device);
        goto out;
    }
    gp_want_gpools(&w, p);
    for (unsigned k = 0; k < GP_ARENA_COUNT; k++) w.cut[k] = UINTPTR_MAX;
    gp_want_cut(&w, most);
    /* Pass 1: the runs.  A candidate's inner chunks are its own (and a
     * graph pool's free block's that goes with the tags); its edge chunks
     * are released when nothing else lives in them. */
    size_t n_arena_runs[GP_ARENA_COUNT] = {0};
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        size_t before = pl->n_runs;
        for (gp_block *b = a->first; b; b = b->next) {
            if (!gp_cand(&w, b) && !gp_gfree(&w, b)) continue;
            uintptr_t lo = gp_chunk_down(a, b->addr), hi = gp_chunk_up(a, b->addr + b->size);
            if (lo != b->addr && !gp_chunk_free_of_others(&w, a, b, lo)) lo += a->chunk;
            if (hi != b->addr + b->size && hi - a->chunk >= lo &&
                !gp_chunk_free_of_others(&w, a, b, hi - a->chunk))
                hi -= a->chunk;
            if (hi > lo && (st = gp_add_run(&pb, a, lo, hi)) != GP_OK) goto out;
        }
        n_arena_runs[k] = pl->n_runs - before;
    }
    /* Each run may cut a free block at either end. */
    if ((st = gp_spare_at_least(p, 2 * pl->n_runs)) != GP_OK) goto out;
    /* The ranges (this pass can fail; nothing is marked yet). */
    size_t ri = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_block *b = a->first; /* the runs are in address order: b only advances */
        for (size_t j = 0; j < n_arena_runs[k]; j++, ri++) {
            const gp_offload_run *r = &pl->runs[ri];
            while (b->addr + b->size <= r->addr) b = b->next;
            for (gp_block *y = b; y && y->addr < r->addr + r->size; y = y->next)
                if (gp_cand(&w, y) && (st = gp_add_range(&pb, y, r->addr, r->addr + r->size)) != GP_OK) goto out;
        }
    }
    /* Pass 2: mark.  Nothing can fail from here on: all or nothing. */
    ri = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_block *b = a->first;
        for (size_t j = 0; j < n_arena_runs[k]; j++, ri++) {
            const gp_offload_run *r = &pl->runs[ri];
            uintptr_t end = r->addr + r->size;
            while (b->addr + b->size <= r->addr) b = b->next;
            gp_block *y = b;
            if (y->state == GP_BLOCK_FREE && y->addr < r->addr) y = gp_cut_free(p, a, y, r->addr);
            for (; y && y->addr < end; y = y->next) {
                if (p->slot_kind[y->sidx] == GP_SLOT_GPOOL) {
                    pl->graphs = 1;
                    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++)
                        if (p->gpools[i].live && p->gpools[i].slot == y->sidx) p->gpools[i].away = 1;
                }
                if (y->state == GP_BLOCK_FREE) {
                    if (y->addr + y->size > end) gp_cut_free(p, a, y, end);
                    gp_bins_remove(gp_bins_of(a, y), y);
                    y->state = GP_BLOCK_FREE_OFFLOADED;
                } else if (gp_cand(&w, y)) {
                    pl->offloaded += y->size;
                    gp_block_away(p, y);
                }
            }
            b = y ? y : b;
        }
    }
    p->n_releasing++; /* (until gp_pool_plan_end) */
    /* What stays: the tags' live blocks that touch no released chunk. */
    for (unsigned k = 0; k < p->n_arenas; k++)
        for (gp_block *b = p->arenas[k].first; b; b = b->next)
            if (b->state == GP_BLOCK_USED && w.tag[b->tag]) pl->kept += b->size;
out:
    return gp_plan_done(p, pl, st, out);
}

/* The arena holding run r, if r is chunk-aligned and inside it. */
static gp_arena *gp_run_arena(gp_pool *p, const gp_offload_run *r)
{
    gp_arena *a = gp_arena_of(p, r->addr);
    if (!a || r->size == 0 || r->chunk != a->chunk || (r->addr - a->base) % a->chunk || r->size % a->chunk ||
        r->addr + r->size > a->base + a->size || r->addr + r->size < r->addr)
        return NULL;
    return a;
}

/* Whether [r->addr, +r->size) is an offloaded run of arena a: every block
 * in it offloaded (live or free); *first its first block.  (Its chunks may
 * be mapped or not: a give-back that failed leaves one mapped.) */
static gp_status gp_run_offloaded(gp_pool *p, const gp_offload_run *r, gp_arena **a_out, gp_block **first)
{
    gp_arena *a = gp_run_arena(p, r);
    gp_block *b = a ? gp_block_at(a, r->addr) : NULL;
    if (!b)
        return gp_error_set(GP_ERR_INVALID, "gpupool: 0x%" PRIxPTR "+%" PRIu64 " is not an offloaded run of this pool",
                            r->addr, r->size);
    *a_out = a;
    *first = b;
    for (; b && b->addr < r->addr + r->size; b = b->next)
        if (b->state != GP_BLOCK_OFFLOADED && b->state != GP_BLOCK_FREE_OFFLOADED)
            return gp_error_set(GP_ERR_INVALID, "gpupool: 0x%" PRIxPTR "+%" PRIu64 " is not wholly offloaded: the "
                                "block at 0x%" PRIxPTR " is not", r->addr, r->size, b->addr);
    return GP_OK;
}

gp_status gp_pool_run_check(gp_pool *p, const gp_offload_run *r)
{
    gp_arena *a;
    gp_block *b;
    pthread_mutex_lock(&p->lock);
    gp_status st = gp_run_offloaded(p, r, &a, &b);
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_offloaded_blocks(gp_pool *p, const gp_tag *tags, size_t n_tags, gp_offload_range **out,
                                   size_t *n)
{
    *out = NULL;
    *n = 0;
    uint8_t want[GP_MAX_TAGS] = {0};
    for (size_t i = 0; i < n_tags; i++)
        if (tags[i] < GP_MAX_TAGS) want[tags[i]] = 1;
    gp_plan_build pb = {.pl = gp_plan_new(0)};
    if (!pb.pl) return gp_nomem_plan();
    gp_status st = GP_OK;
    pthread_mutex_lock(&p->lock);
    for (int k = 0; k < GP_ARENA_COUNT && st == GP_OK; k++)
        for (gp_block *b = p->arenas[k].first; b && st == GP_OK; b = b->next)
            if (b->state == GP_BLOCK_OFFLOADED && (!n_tags || want[b->tag]))
                st = gp_add_range(&pb, b, b->addr, b->addr + b->size);
    pthread_mutex_unlock(&p->lock);
    if (st == GP_OK) {
        gp_plan_sort(pb.pl);
        *out = pb.pl->ranges;
        *n = pb.pl->n_ranges;
        pb.pl->ranges = NULL;
    }
    gp_plan_free(pb.pl);
    return st;
}

gp_status gp_pool_restore_begin(gp_pool *p, const gp_offload_run *runs, size_t n_runs, gp_offload_plan **out)
{
    *out = NULL;
    if (gp_pool_usable(p) != GP_OK) return gp_pool_usable(p);
    gp_plan_build pb = {.pl = gp_plan_new(1)};
    gp_offload_plan *pl = pb.pl;
    gp_status st = GP_OK;
    if (!pl) return gp_nomem_plan();
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < n_runs && st == GP_OK; i++) {
        const gp_offload_run *r = &runs[i];
        gp_arena *a;
        gp_block *b;
        if ((st = gp_run_offloaded(p, r, &a, &b)) != GP_OK) {
            st = gp_error_set(st, "gpupool: restore of %s", gp_last_error() + strlen("gpupool: "));
            break;
        }
        for (; st == GP_OK && b && b->addr < r->addr + r->size; b = b->next)
            if (b->state == GP_BLOCK_OFFLOADED) {
                st = gp_add_range(&pb, b, r->addr, r->addr + r->size);
                pl->offloaded += b->size;
            }
        if (st == GP_OK) st = gp_add_run(&pb, a, r->addr, r->addr + r->size);
    }
    /* What comes back takes the place of cache beyond the slack where it
     * would raise reserved past its peak: after a phase that left cache (a
     * backward pass, before the optimizer's state comes back for its step)
     * it would otherwise be mapped on top of it, and the peak would not
     * fall by what was offloaded.  Below the peak the cache stays (the
     * trim costs a device sync, and the next phase would map it again).
     * Cache of any priority (gp_restore_tags), and no more than it maps: a
     * prefetch during the backward pass would otherwise give back what the
     * next forward maps again. */
    uint64_t need = 0, floor = p->st.reserved_peak, size = pl->offloaded;
    for (size_t i = 0; st == GP_OK && i < pl->n_runs; i++) need += pl->runs[i].size;
    /* (The sync the trim may need runs without the lock: a prefetch's
     * restore runs during a backward pass, whose allocations held up for
     * the device to drain would cost it its lead.) */
    if ((st = gp_plan_done(p, pl, st, out)) == GP_OK) gp_trim_slack_unlocked(p, need, size, GP_PRIO_MAX, floor, need);
    return st;
}

/* The run of the plan containing [addr, addr+size), chunk-aligned in it. */
static const gp_offload_run *gp_plan_run(const gp_offload_plan *pl, uintptr_t addr, uint64_t size)
{
    for (size_t i = 0; i < pl->n_runs; i++) {
        const gp_offload_run *r = &pl->runs[i];
        if (addr >= r->addr && size && addr + size <= r->addr + r->size && addr + size > addr &&
            (addr - r->addr) % r->chunk == 0 && size % r->chunk == 0)
            return r;
    }
    return NULL;
}

/* The driver calls of a plan's maps and unmaps run without the pool's
 * lock: a run of a plan is its own (offloaded: no allocation lands there,
 * no trim looks at it), and the lock held across them stopped every
 * allocation of the thread that trains -- a cache hit too -- for the
 * length of each cuMemUnmap or cuMemCreate/cuMemMap/cuMemSetAccess, while
 * an optimizer's state went out behind the forward pass or came back
 * during the backward pass. */
gp_status gp_pool_plan_unmap(gp_pool *p, gp_offload_plan *pl, uintptr_t addr, uint64_t size)
{
    if (!pl || !gp_plan_run(pl, addr, size))
        return gp_error_set(GP_ERR_INVALID, "gpupool: unmap of 0x%" PRIxPTR "+%" PRIu64 ", which is not a "
                            "chunk-aligned piece of one run of the plan", addr, size);
    pthread_mutex_lock(&p->lock);
    gp_arena *a = gp_arena_of(p, addr);
    gp_status st = GP_OK;
    uint64_t gave = 0;
    /* Chunk by chunk: what is unmapped already stays so (a retry after a
     * failure resumes). */
    for (uintptr_t x = addr; x < addr + size && st == GP_OK; x += a->chunk) {
        uint64_t ci = gp_chunk_index(a, x), h = a->handles[ci];
        if (!h) continue;
        p->st.n_unmap++;
        pthread_mutex_unlock(&p->lock);
        st = p->be->unmap(p->be, x, a->chunk, h);
        pthread_mutex_lock(&p->lock);
        if (st != GP_OK) {
            st = gp_error_set(GP_ERR_BACKEND, "gpupool: offload could not give back the chunk at 0x%" PRIxPTR
                              " of device %d: %s", x, p->be->device, gp_last_error());
            break;
        }
        a->handles[ci] = 0;
        p->st.reserved -= a->chunk;
        p->st.unmapped_total += a->chunk;
        gave += a->chunk;
        GP_TRACE(p, GP_EV_UNMAP, x, a->chunk, NULL, GP_TAG_UNTAGGED, 0);
    }
    if (pl->refill && !pl->restore) gp_refill_unlocked(p, gave);
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* Map the unmapped chunks [x, x + need) of a plan's run: the lock is held,
 * and let go for the driver calls (their bytes counted in reserved
 * meanwhile, so that the limit holds); on failure what this call mapped
 * is given back and the range is as it was, or *kept is the prefix still
 * mapped (as gp_map_range). */
static gp_status gp_plan_map_range(gp_pool *p, gp_arena *a, uintptr_t x, uint64_t need, uint64_t *kept)
{
    size_t n = need / a->chunk;
    uint64_t *hs = malloc(n * sizeof *hs);
    *kept = 0;
    if (!hs) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for a restore's maps");
    gp_peak(&p->st.reserved, &p->st.reserved_peak, need); /* (the peak too: a check meanwhile sees both) */
    p->mapping += need;
    pthread_mutex_unlock(&p->lock);
    size_t done = 0, tried = 0, mapped;
    gp_status st = GP_OK;
    while (done < n && (tried++, st = p->be->map(p->be, x + done * a->chunk, a->chunk, &hs[done])) == GP_OK) done++;
    mapped = done;
    char why[1024] = "";
    if (st != GP_OK) {
        snprintf(why, sizeof why, "%s", gp_last_error());
        while (done > 0 && p->be->unmap(p->be, x + (done - 1) * a->chunk, a->chunk, hs[done - 1]) == GP_OK) done--;
    }
    pthread_mutex_lock(&p->lock);
    p->st.reserved -= need;
    p->mapping -= need;
    p->st.n_map += tried;
    for (size_t i = 0; i < done; i++) a->handles[gp_chunk_index(a, x + i * a->chunk)] = hs[i];
    free(hs);
    uint64_t len = done * a->chunk;
    if (st != GP_OK) {
        p->st.n_map_fail++;
        p->st.n_unmap += mapped - done + (done > 0); /* (the maps given back, and one that failed) */
        gp_error_set(st, "%s", why);
        if (!done) return st;
        *kept = len;
    }
    p->st.reserved += len;
    p->st.mapped_total += len;
    GP_TRACE(p, GP_EV_MAP, x, len, NULL, GP_TAG_UNTAGGED, 0);
    if (p->st.reserved > p->st.reserved_peak) p->st.reserved_peak = p->st.reserved;
    return st;
}

gp_status gp_pool_plan_map(gp_pool *p, gp_offload_plan *pl, uintptr_t addr, uint64_t size, int priority)
{
    if (!pl || !gp_plan_run(pl, addr, size))
        return gp_error_set(GP_ERR_INVALID, "gpupool: map of 0x%" PRIxPTR "+%" PRIu64 ", which is not a "
                            "chunk-aligned piece of one run of the plan", addr, size);
    if (priority < 0 || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: map with priority %d (0..%d)", priority, GP_PRIO_MAX);
    pthread_mutex_lock(&p->lock);
    gp_arena *a = gp_arena_of(p, addr);
    gp_status st = GP_OK;
    /* The room the limit lacks for all of it is made first, the unmaps
     * (and the sync where idle cache is short) without the lock: the
     * thread that allocates goes on meanwhile.  Decided afresh below. */
    uint64_t unmapped = 0;
    for (uintptr_t x = addr; p->st.limit && x < addr + size; x += a->chunk)
        unmapped += a->handles[gp_chunk_index(a, x)] ? 0 : a->chunk;
    if (p->st.limit && p->st.reserved + unmapped > p->st.limit)
        gp_trim_unlocked(p, p->st.reserved + unmapped - p->st.limit, priority);
    for (uintptr_t x = addr; x < addr + size && st == GP_OK;) {
        if (a->handles[gp_chunk_index(a, x)]) {
            x += a->chunk;
            continue;
        }
        uintptr_t end = x; /* the unmapped stretch from x */
        while (end < addr + size && !a->handles[gp_chunk_index(a, end)]) end += a->chunk;
        uint64_t need = end - x, limit = p->st.limit;
        /* The limit first, then the device: cached chunks of priorities up
         * to the caller's make room, as for an allocation. */
        if (limit && p->st.reserved + need > limit)
            gp_trim_first_idle(p, NULL, p->st.reserved + need - limit, priority);
        if (limit && p->st.reserved + need > limit) {
            st = gp_error_set(GP_ERR_LIMIT, "gpupool: restoring %" PRIu64 " bytes would exceed the pool limit of "
                              "%" PRIu64 " bytes (reserved %" PRIu64 ")", need, limit, p->st.reserved);
            break;
        }
        uint64_t kept; /* (a prefix a failed rollback left mapped: not mapped again) */
        st = gp_plan_map_range(p, a, x, need, &kept);
        if (st == GP_ERR_OOM && gp_trim_in(p, NULL, need - kept, priority)) {
            gp_error_clear();
            st = gp_plan_map_range(p, a, x + kept, need - kept, &kept);
        }
        x = end;
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_plan_end(gp_pool *p, gp_offload_plan *pl, int resident)
{
    if (!pl) return gp_error_set(GP_ERR_INVALID, "gpupool: end of no plan");
    pthread_mutex_lock(&p->lock);
    gp_status st = GP_OK;
    for (size_t i = 0; i < pl->n_runs && st == GP_OK; i++) {
        const gp_offload_run *r = &pl->runs[i];
        gp_arena *a = gp_arena_of(p, r->addr);
        for (uintptr_t x = r->addr; resident && x < r->addr + r->size; x += a->chunk)
            if (!a->handles[gp_chunk_index(a, x)]) {
                st = gp_error_set(GP_ERR_INVALID, "gpupool: %s plan ended resident, but the chunk at 0x%" PRIxPTR
                                  " is not mapped", pl->restore ? "restore" : "offload", x);
                break;
            }
    }
    if (st != GP_OK) {
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    for (size_t i = 0; i < pl->n_runs; i++) {
        const gp_offload_run *r = &pl->runs[i];
        gp_arena *a = gp_arena_of(p, r->addr);
        gp_block *b = gp_block_at(a, r->addr); /* (may start before the run) */
        if (!resident) {
            for (; !pl->restore && b && b->addr < r->addr + r->size; b = b->next)
                if (b->state == GP_BLOCK_OFFLOADED)
                    GP_TRACE(p, GP_EV_OFFLOAD, b->addr, b->size, NULL, b->tag, b->prio);
            continue;
        }
        /* Live blocks first (no block moves), then the free pieces, which
         * merge with their free neighbours as they go back to the bins. */
        for (gp_block *y = b; y && y->addr < r->addr + r->size; y = y->next) {
            if (y->state != GP_BLOCK_OFFLOADED) continue;
            gp_block_back(p, y);
            if (pl->restore) GP_TRACE(p, GP_EV_RESTORE, y->addr, y->size, NULL, y->tag, y->prio);
        }
        uintptr_t end = r->addr + r->size;
        for (gp_block *y = b; y && y->addr < end;) {
            if (y->state != GP_BLOCK_FREE_OFFLOADED) {
                y = y->next;
                continue;
            }
            y->state = GP_BLOCK_FREE;
            y = gp_insert_free(p, a, y)->next;
        }
    }
    if (!pl->restore) p->n_releasing--;
    pthread_mutex_unlock(&p->lock);
    gp_plan_free(pl);
    return GP_OK;
}

void gp_free_offloaded(gp_pool *p, gp_block *b)
{
    gp_tag_stats *ts = &p->tags[b->tag];
    p->st.offloaded -= b->size;
    p->st.active_blocks--;
    p->st.n_free++;
    ts->offloaded -= b->size;
    ts->active_blocks--;
    if (p->trace) {
        gp_stream bs = p->streams[b->sidx];
        gp_trace_add(p->trace, GP_EV_FREE_REQUESTED, b->addr, b->size, bs, b->tag, b->prio);
        gp_trace_add(p->trace, GP_EV_FREE_COMPLETED, b->addr, b->size, bs, b->tag, b->prio);
    }
    if (b->rec) gp_rec_forget(p, b);
    b->requested = 0;
    b->state = GP_BLOCK_FREE_OFFLOADED;
}

gp_status gp_pool_synchronize(gp_pool *p)
{
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    p->st.n_sync++;
    pthread_mutex_unlock(&p->lock);
    return p->be->synchronize(p->be);
}

gp_status gp_pool_fence(gp_pool *p, uint64_t *events, size_t cap, size_t *n)
{
    *n = 0;
    gp_status st = gp_pool_usable(p);
    if (st != GP_OK) return st;
    pthread_mutex_lock(&p->lock);
    st = gp_fence_locked(p, events, cap, n);
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_backend *gp_pool_backend(gp_pool *p) { return p->be; }

gp_status gp_pool_in_process(gp_pool *p) { return gp_pool_usable(p); }

void gp_pool_config(gp_pool *p, gp_config *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->cfg;
    pthread_mutex_unlock(&p->lock);
}
