/*
 * pool.c -- the allocator: arenas of virtual address space, physical chunks
 * mapped into them on demand, blocks kept in two-level segregated-fit bins.
 *
 * Every byte of an arena belongs to exactly one block, in address order:
 *   USED            handed out, in the pointer hash
 *   FREE            mapped and free, in the bins of the stream it was used on
 *   FREE_UNMAPPED   no physical memory behind it, in the arena's unmapped bins
 * Mapped/unmapped boundaries fall on chunk boundaries, so an unmapped block
 * starts and ends on one.  Neighbours merge when both are free with the same
 * stream, or both unmapped.  Hence
 *   reserved = sum(USED) + sum(FREE)   and   allocated = sum(USED).
 *
 * The hot path (gp_alloc hit, gp_free) is: lock, O(1) bin search, split or
 * merge, hash insert or remove, counters, unlock.  No backend call, no malloc
 * (block headers come from a free list refilled in slabs on the slow path).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "trace.h"

#define GP_ALIGN 512u
#define GP_ALIGN_LOG2 9
#define GP_MAX_SIZE (1ull << 48)
#define GP_MAX_STREAMS 64
/* How many blocks of the request's own size class are looked at for a fit
 * before a block of a larger class is cut (bounds the time under the lock). */
#define GP_FIT_SCAN 8

/* ------------------------------------------------------------------ TLSF
 * Sizes are counted in 512-byte units u.  First level: the power of two of u;
 * second level: the next SL_LOG2 bits below the top bit, i.e. 16 linear steps
 * per power of two.  Units below 16 map linearly to fl 0.  A bitmap per level
 * finds the first non-empty list at or above a class with one ctz. */
#define SL_LOG2 4
#define SL_COUNT (1u << SL_LOG2)
#define FL_COUNT 48

typedef struct gp_block gp_block;
struct gp_block {
    uintptr_t addr;
    uint64_t size, requested;
    gp_block *prev, *next;   /* neighbours in address order              */
    gp_block *fprev, *fnext; /* bin list while free; hash chain if used  */
    uint16_t tag;
    /* prio: the holder's priority; while free, that of the last holder (the
     * priority of the cache, which decides who may release it). */
    uint8_t prio, state, sidx, arena;
    uint8_t rec;             /* has a gp_rec: streams from gp_record_stream */
    uint8_t life;            /* GP_LIFE_*: the region of the arena it lies in */
};

typedef struct gp_bins {
    uint64_t fl_map;
    uint16_t sl_map[FL_COUNT];
    gp_block *heads[FL_COUNT][SL_COUNT];
} gp_bins;

static inline unsigned gp_log2(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static inline void gp_mapping(uint64_t u, unsigned *fl, unsigned *sl)
{
    if (u < SL_COUNT) { *fl = 0; *sl = (unsigned)u; return; }
    unsigned f = gp_log2(u);
    *fl = f - SL_LOG2 + 1;
    *sl = (unsigned)(u >> (f - SL_LOG2)) & (SL_COUNT - 1);
}

/* Round u up to the next class boundary first, so that any block of the
 * class found fits without looking at it ("good fit"). */
static inline void gp_mapping_search(uint64_t u, unsigned *fl, unsigned *sl)
{
    if (u >= SL_COUNT) u += (1ull << (gp_log2(u) - SL_LOG2)) - 1;
    gp_mapping(u, fl, sl);
}

static void gp_bins_insert(gp_bins *b, gp_block *blk)
{
    unsigned fl, sl;
    gp_mapping(blk->size >> GP_ALIGN_LOG2, &fl, &sl);
    gp_block *h = b->heads[fl][sl];
    blk->fprev = NULL;
    blk->fnext = h;
    if (h) h->fprev = blk;
    b->heads[fl][sl] = blk;
    b->sl_map[fl] |= (uint16_t)(1u << sl);
    b->fl_map |= 1ull << fl;
}

static void gp_bins_remove(gp_bins *b, gp_block *blk)
{
    unsigned fl, sl;
    gp_mapping(blk->size >> GP_ALIGN_LOG2, &fl, &sl);
    if (blk->fprev) blk->fprev->fnext = blk->fnext;
    else b->heads[fl][sl] = blk->fnext;
    if (blk->fnext) blk->fnext->fprev = blk->fprev;
    if (!b->heads[fl][sl]) {
        b->sl_map[fl] &= (uint16_t)~(1u << sl);
        if (!b->sl_map[fl]) b->fl_map &= ~(1ull << fl);
    }
}

/* A free block of at least `size` bytes, or NULL; not removed.  The
 * request's own class is looked at first (a few blocks of it), so that a
 * block of the right size is reused rather than a larger one cut: this keeps
 * fragmentation down at the cost of one short list walk.  Then good fit:
 * the first non-empty class above, any block of which fits. */
static gp_block *gp_bins_find(const gp_bins *b, uint64_t size)
{
    unsigned fl, sl;
    uint64_t u = size >> GP_ALIGN_LOG2;
    gp_mapping(u, &fl, &sl);
    int n = 0;
    for (gp_block *blk = b->heads[fl][sl]; blk && n < GP_FIT_SCAN; blk = blk->fnext, n++)
        if (blk->size >= size) return blk;
    gp_mapping_search(u + 1, &fl, &sl);
    if (fl >= FL_COUNT) return NULL;
    uint32_t sl_bits = b->sl_map[fl] & (~0u << sl);
    if (!sl_bits) {
        uint64_t fl_bits = fl + 1 < 64 ? b->fl_map & (~0ull << (fl + 1)) : 0;
        if (!fl_bits) return NULL;
        fl = (unsigned)__builtin_ctzll(fl_bits);
        sl_bits = b->sl_map[fl];
    }
    return b->heads[fl][__builtin_ctz(sl_bits)];
}

/* ---------------------------------------------------------------- arenas */

/* record_stream: the extra streams of a live block, then, once it is freed
 * (state PENDING), the event recorded on each of them.  The block goes back
 * to the bins when every event completed; it is rare, so a short array. */
#define GP_REC_STREAMS 8
typedef struct gp_rec {
    gp_block *b;
    gp_stream streams[GP_REC_STREAMS];
    uint64_t events[GP_REC_STREAMS]; /* 0: completed (or none recorded) */
    unsigned n;
    uint8_t pending;   /* freed, waiting for the events                  */
    uint8_t wait_sync; /* an event could not be recorded: wait for a sync */
} gp_rec;

/* A graph pool: the memory of the CUDA graphs captured into it (PyTorch's
 * graph memory pool id is the key).  Its free blocks sit in a stream slot of
 * their own, which no other allocation looks at, so that memory a graph
 * captured is never handed to code outside it until the pool is released;
 * then its blocks go back to the slot of the stream that captured. */
#define GP_MAX_GPOOLS 16
#define GP_GPOOL_STREAMS 4
typedef struct gp_gpool {
    uint64_t key;
    unsigned slot, home;   /* its stream slot; where its memory goes back   */
    unsigned refs;         /* graphs that hold it                           */
    gp_stream capturing[GP_GPOOL_STREAMS]; /* streams capturing into it now */
    unsigned n_capturing;
    int live;
} gp_gpool;

/* Kinds of stream slots. */
enum { GP_SLOT_STREAM = 0, GP_SLOT_GPOOL = 1, GP_SLOT_SPARE = 2 };

typedef struct gp_arena {
    uintptr_t base;
    uint64_t size, chunk;
    uint64_t *handles;        /* per chunk: the backend's handle when mapped */
    gp_block *first;          /* lowest block; the list covers the arena     */
    gp_bins *bins[GP_MAX_STREAMS]; /* FREE blocks per stream, made lazily   */
    gp_bins unmapped[2];      /* FREE_UNMAPPED blocks, per region (GP_LIFE_*) */
    /* Lifetime placement: [long_base, base + size) is the long-lived region,
     * the rest the short-lived one (long_base = base + size: no long region).
     * Blocks never straddle nor merge across long_base. */
    uintptr_t long_base;
} gp_arena;

struct gp_pool {
    pthread_mutex_t lock;
    gp_backend *be;
    gp_config cfg;
    int reserve_mode;
    unsigned n_arenas;
    uint64_t small_size;
    gp_arena arenas[GP_ARENA_COUNT];

    gp_stream streams[GP_MAX_STREAMS];
    unsigned n_streams, last_sidx;
    uint8_t slot_kind[GP_MAX_STREAMS]; /* GP_SLOT_*: graph pools use slots too */
    /* GP_LIFE_* of a slot: the region it maps new memory in.  With placement
     * a stream has a slot per lifetime, so that its free blocks of the two
     * regions are binned apart and one never serves the other. */
    uint8_t slot_life[GP_MAX_STREAMS];
    int placement;      /* lifetime placement on (expandable mode only) */

    gp_rec *recs;       /* record_stream: live and pending blocks */
    unsigned n_recs, cap_recs, n_pending;

    gp_gpool gpools[GP_MAX_GPOOLS];
    unsigned n_capturing; /* streams capturing into a graph pool now */

    gp_block **buckets; /* USED blocks by address, chained through fnext */
    uint64_t hmask, hcount;

    gp_block *spare;    /* free block headers */
    void **slabs;
    size_t n_slabs, cap_slabs;

    gp_stats st;
    gp_tag_stats tags[GP_MAX_TAGS];
    uint64_t prio_alloc[GP_PRIO_MAX + 1], prio_peak[GP_PRIO_MAX + 1];

    gp_pressure_fn pressure;
    void *pressure_arg;
    char last_oom[1024];

    /* The history (trace.c), NULL while off: every event site tests it,
     * under the lock.  history_stacks mirrors "on, with stacks" for
     * gp_pool_history_stacks, which reads it without the lock. */
    gp_trace *trace;
    _Atomic int history_stacks;
};

/* Record an event in the history if it is on (the lock is held). */
#define GP_TRACE(p, action, addr, size, stream, tag, prio)                        \
    do {                                                                          \
        if ((p)->trace) gp_trace_add((p)->trace, action, addr, size, stream, tag, prio); \
    } while (0)

static inline uint64_t gp_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The size a request occupies.  Small requests round to 512 B; large ones to
 * 1/256 of their power of two (at most 2 MiB), which bounds the waste at
 * 0.4% while keeping odd sizes from leaving unusable slivers. */
static uint64_t gp_block_size(const gp_pool *p, uint64_t size)
{
    if (size < p->small_size) return gp_round_up(size, GP_ALIGN);
    uint64_t g = (1ull << gp_log2(size)) >> 8;
    if (g < GP_ALIGN) g = GP_ALIGN;
    if (g > (2ull << 20)) g = 2ull << 20;
    return gp_round_up(size, g);
}

/* ----------------------------------------------------- block header slabs */

#define GP_SLAB_BLOCKS 256

static gp_status gp_refill_spare(gp_pool *p)
{
    if (p->n_slabs == p->cap_slabs) {
        size_t nc = p->cap_slabs ? 2 * p->cap_slabs : 16;
        void **s = realloc(p->slabs, nc * sizeof *s);
        if (!s) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for block headers");
        p->slabs = s;
        p->cap_slabs = nc;
    }
    gp_block *slab = malloc(GP_SLAB_BLOCKS * sizeof *slab);
    if (!slab) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for block headers");
    p->slabs[p->n_slabs++] = slab;
    for (int i = 0; i < GP_SLAB_BLOCKS; i++) {
        slab[i].fnext = p->spare;
        p->spare = &slab[i];
    }
    return GP_OK;
}

/* Callers make sure a header is spare (gp_reserve_headers) before they start
 * changing blocks, so a split never fails half-way. */
static gp_block *gp_new_block(gp_pool *p)
{
    gp_block *b = p->spare;
    p->spare = b->fnext;
    memset(b, 0, sizeof *b);
    return b;
}

static gp_status gp_reserve_headers(gp_pool *p, int n)
{
    int have = 0;
    for (gp_block *b = p->spare; b && have < n; b = b->fnext) have++;
    return have >= n ? GP_OK : gp_refill_spare(p);
}

static void gp_drop_block(gp_pool *p, gp_block *b)
{
    b->fnext = p->spare;
    p->spare = b;
}

/* ------------------------------------------------------------ pointer hash */

static inline uint64_t gp_hash(const gp_pool *p, uintptr_t a)
{
    /* Fibonacci hashing of the 512-byte unit number: consecutive blocks land
     * far apart, so the chains stay short. */
    return ((a >> GP_ALIGN_LOG2) * 0x9E3779B97F4A7C15ull >> 20) & p->hmask;
}

static gp_status gp_hash_grow(gp_pool *p)
{
    uint64_t n = (p->hmask + 1) * 2;
    gp_block **nb = calloc(n, sizeof *nb);
    if (!nb) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pointer table");
    uint64_t old = p->hmask + 1;
    gp_block **ob = p->buckets;
    p->buckets = nb;
    p->hmask = n - 1;
    for (uint64_t i = 0; i < old; i++) {
        for (gp_block *b = ob[i], *nx; b; b = nx) {
            nx = b->fnext;
            uint64_t h = gp_hash(p, b->addr);
            b->fnext = nb[h];
            nb[h] = b;
        }
    }
    free(ob);
    return GP_OK;
}

static void gp_hash_insert(gp_pool *p, gp_block *b)
{
    uint64_t h = gp_hash(p, b->addr);
    b->fnext = p->buckets[h];
    p->buckets[h] = b;
    p->hcount++;
}

static gp_block *gp_hash_remove(gp_pool *p, uintptr_t a)
{
    gp_block **pp = &p->buckets[gp_hash(p, a)];
    for (gp_block *b = *pp; b; pp = &b->fnext, b = b->fnext) {
        if (b->addr == a) {
            *pp = b->fnext;
            p->hcount--;
            return b;
        }
    }
    return NULL;
}

static gp_block *gp_hash_find(const gp_pool *p, uintptr_t a)
{
    for (gp_block *b = p->buckets[gp_hash(p, a)]; b; b = b->fnext)
        if (b->addr == a) return b;
    return NULL;
}

/* ------------------------------------------------------------ free blocks */

static gp_bins *gp_bins_of(gp_arena *a, const gp_block *b)
{
    return b->state == GP_BLOCK_FREE_UNMAPPED ? &a->unmapped[b->life] : a->bins[b->sidx];
}

static int gp_mergeable(const gp_block *x, const gp_block *y)
{
    return x && y && x->state == y->state && x->state != GP_BLOCK_USED &&
           x->state != GP_BLOCK_PENDING && x->life == y->life &&
           (x->state == GP_BLOCK_FREE_UNMAPPED || x->sidx == y->sidx);
}

/* b (not in any bin) becomes free: merge it with its free neighbours of the
 * same kind and put the result in its bins.  Returns the merged block.
 * Merged cache takes the highest of the priorities: memory a high-priority
 * holder gave back must not become releasable by lower requests. */
static gp_block *gp_insert_free(gp_pool *p, gp_arena *a, gp_block *b)
{
    gp_block *pv = b->prev, *nx = b->next;
    if (gp_mergeable(pv, b)) {
        gp_bins_remove(gp_bins_of(a, pv), pv);
        if (b->prio > pv->prio) pv->prio = b->prio;
        pv->size += b->size;
        pv->next = nx;
        if (nx) nx->prev = pv;
        gp_drop_block(p, b);
        b = pv;
    }
    if (gp_mergeable(b, nx)) {
        gp_bins_remove(gp_bins_of(a, nx), nx);
        if (nx->prio > b->prio) b->prio = nx->prio;
        b->size += nx->size;
        b->next = nx->next;
        if (nx->next) nx->next->prev = b;
        gp_drop_block(p, nx);
    }
    b->requested = 0;
    gp_bins_insert(gp_bins_of(a, b), b);
    return b;
}

/* Cut b (in no bin) after `size` bytes; the tail becomes a block of the same
 * state and stream, returned (not in any bin).  Needs a spare header. */
static gp_block *gp_split(gp_pool *p, gp_block *b, uint64_t size)
{
    gp_block *t = gp_new_block(p);
    t->addr = b->addr + size;
    t->size = b->size - size;
    t->state = b->state;
    t->sidx = b->sidx;
    t->arena = b->arena;
    t->life = b->life;
    t->prio = b->prio;
    t->prev = b;
    t->next = b->next;
    if (b->next) b->next->prev = t;
    b->next = t;
    b->size = size;
    return t;
}

/* ---------------------------------------------------------------- streams */

/* A new slot (bins in every arena) for stream s, or for a graph pool whose
 * blocks are reported on stream s; a graph pool reuses a spare slot first. */
static gp_status gp_slot_new(gp_pool *p, gp_stream s, int kind, unsigned *out)
{
    if (kind == GP_SLOT_GPOOL) {
        for (unsigned i = 0; i < p->n_streams; i++) {
            if (p->slot_kind[i] == GP_SLOT_SPARE) {
                p->slot_kind[i] = GP_SLOT_GPOOL;
                p->slot_life[i] = GP_LIFE_SHORT;
                p->streams[i] = s;
                *out = i;
                return GP_OK;
            }
        }
    }
    if (p->n_streams == GP_MAX_STREAMS)
        return gp_error_set(GP_ERR_TOO_MANY,
                            "gpupool: more than %d streams allocate from one device pool; "
                            "reuse streams (e.g. a fixed stream pool) instead of creating one per step",
                            GP_MAX_STREAMS);
    unsigned i = p->n_streams;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        p->arenas[k].bins[i] = calloc(1, sizeof(gp_bins));
        if (!p->arenas[k].bins[i]) {
            for (unsigned j = 0; j < k; j++) {
                free(p->arenas[j].bins[i]);
                p->arenas[j].bins[i] = NULL;
            }
            return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for stream bins");
        }
    }
    p->streams[i] = s;
    p->slot_kind[i] = (uint8_t)kind;
    p->slot_life[i] = GP_LIFE_SHORT;
    p->n_streams++;
    *out = i;
    return GP_OK;
}

/* The slot of stream s for blocks of lifetime `life`. */
static gp_status gp_slot_of(gp_pool *p, gp_stream s, unsigned life, unsigned *out)
{
    /* last_sidx is only ever a stream's slot, never a graph pool's. */
    if (p->last_sidx < p->n_streams && p->streams[p->last_sidx] == s &&
        p->slot_kind[p->last_sidx] == GP_SLOT_STREAM && p->slot_life[p->last_sidx] == life) {
        *out = p->last_sidx;
        return GP_OK;
    }
    for (unsigned i = 0; i < p->n_streams; i++) {
        if (p->streams[i] == s && p->slot_kind[i] == GP_SLOT_STREAM && p->slot_life[i] == life) {
            *out = p->last_sidx = i;
            return GP_OK;
        }
    }
    gp_status st = gp_slot_new(p, s, GP_SLOT_STREAM, out);
    if (st == GP_OK) p->slot_life[*out] = (uint8_t)life;
    if (st == GP_OK) p->last_sidx = *out;
    return st;
}

static gp_status gp_stream_index(gp_pool *p, gp_stream s, unsigned *out)
{
    return gp_slot_of(p, s, GP_LIFE_SHORT, out);
}

/* ------------------------------------------------------------ map / unmap */

static inline uint64_t gp_chunk_index(const gp_arena *a, uintptr_t addr)
{
    return (addr - a->base) / a->chunk;
}

/* Map [addr, addr+len) chunk by chunk; on failure unmap what this call
 * mapped, so the range is either wholly mapped or wholly not. */
static gp_status gp_map_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len)
{
    uint64_t done = 0;
    gp_status st = GP_OK;
    while (done < len) {
        uint64_t ci = gp_chunk_index(a, addr + done);
        p->st.n_map++;
        st = p->be->map(p->be, addr + done, a->chunk, &a->handles[ci]);
        if (st != GP_OK) break;
        done += a->chunk;
    }
    if (st != GP_OK) {
        p->st.n_map_fail++;
        while (done > 0) {
            done -= a->chunk;
            p->st.n_unmap++;
            p->be->unmap(p->be, addr + done, a->chunk, a->handles[gp_chunk_index(a, addr + done)]);
        }
        return st;
    }
    p->st.reserved += len;
    p->st.mapped_total += len;
    GP_TRACE(p, GP_EV_MAP, addr, len, NULL, GP_TAG_UNTAGGED, 0);
    if (p->n_capturing) p->st.n_capture_maps += len / a->chunk;
    if (p->st.reserved > p->st.reserved_peak) p->st.reserved_peak = p->st.reserved;
    return GP_OK;
}

/* Unmap chunks of [addr, addr+len) from the start; returns bytes unmapped
 * (less than len only if the backend failed). */
static uint64_t gp_unmap_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        p->st.n_unmap++;
        if (p->be->unmap(p->be, addr + done, a->chunk, a->handles[gp_chunk_index(a, addr + done)]) != GP_OK)
            break;
        done += a->chunk;
    }
    p->st.reserved -= done;
    p->st.unmapped_total += done;
    if (done) GP_TRACE(p, GP_EV_UNMAP, addr, done, NULL, GP_TAG_UNTAGGED, 0);
    return done;
}

/* ------------------------------------------------------------------- trim */

/* Unmap the whole chunks inside free block b (in its bins): b splits into a
 * mapped head, an unmapped middle and a mapped tail, each put back in its
 * bins.  Returns the bytes released; *resume is the first block after the
 * pieces, where a walk of the arena goes on (b itself may be merged away). */
static uint64_t gp_trim_block(gp_pool *p, gp_arena *a, gp_block *b, gp_block **resume)
{
    uintptr_t lo = gp_round_up(b->addr, a->chunk);
    uintptr_t hi = (b->addr + b->size) / a->chunk * a->chunk;
    *resume = b->next;
    if (lo >= hi || gp_reserve_headers(p, 2) != GP_OK) return 0;
    uint64_t freed = gp_unmap_range(p, a, lo, hi - lo);
    if (freed == 0) return 0;
    gp_bins_remove(gp_bins_of(a, b), b);
    gp_block *mid = lo > b->addr ? gp_split(p, b, lo - b->addr) : b;
    gp_block *tail = mid->size > freed ? gp_split(p, mid, freed) : NULL;
    mid->state = GP_BLOCK_FREE_UNMAPPED;
    if (mid != b) gp_insert_free(p, a, b);
    /* b was a maximal free block, so the tail merges with nothing after it. */
    if (tail) gp_insert_free(p, a, tail);
    mid = gp_insert_free(p, a, mid);
    *resume = tail ? tail->next : mid->next;
    return freed;
}

/* Once the device is idle no stream can still be reading a free block, so
 * free neighbours of different streams may become one block (of the first
 * one's stream): a chunk they share can then be released. */
static void gp_coalesce_idle(gp_pool *p, gp_arena *a)
{
    for (gp_block *b = a->first; b; b = b->next) {
        if (b->state != GP_BLOCK_FREE || p->slot_kind[b->sidx] != GP_SLOT_STREAM) continue;
        while (b->next && b->next->state == GP_BLOCK_FREE && b->next->life == b->life &&
               p->slot_kind[b->next->sidx] == GP_SLOT_STREAM) {
            gp_block *nx = b->next;
            gp_bins_remove(a->bins[b->sidx], b);
            gp_bins_remove(a->bins[nx->sidx], nx);
            if (nx->prio > b->prio) b->prio = nx->prio;
            b->size += nx->size;
            b->next = nx->next;
            if (nx->next) nx->next->prev = b;
            gp_drop_block(p, nx);
            gp_bins_insert(a->bins[b->sidx], b);
        }
    }
}

/* ----------------------------------------------------------- record_stream */

static gp_status gp_bad_pointer(gp_pool *p, const void *ptr, const char *what);

static gp_rec *gp_rec_of(gp_pool *p, const gp_block *b)
{
    for (unsigned i = 0; i < p->n_recs; i++)
        if (p->recs[i].b == b) return &p->recs[i];
    return NULL;
}

/* The events of pending record i have completed: its block goes back to the
 * bins and the record is dropped (the last one takes its place). */
static void gp_rec_finish(gp_pool *p, unsigned i)
{
    gp_rec *r = &p->recs[i];
    gp_block *b = r->b;
    for (unsigned j = 0; j < r->n; j++)
        if (r->events[j]) p->be->event_release(p->be, r->events[j]);
    p->st.pending -= b->size;
    p->n_pending--;
    GP_TRACE(p, GP_EV_FREE_COMPLETED, b->addr, b->size, p->streams[b->sidx], b->tag, b->prio);
    b->rec = 0;
    b->state = GP_BLOCK_FREE;
    p->recs[i] = p->recs[--p->n_recs];
    gp_insert_free(p, &p->arenas[b->arena], b);
}

/* Give back the pending blocks whose streams finished the work queued at
 * free time: a query per event, never a host wait. */
static void gp_poll_pending(gp_pool *p)
{
    for (unsigned i = 0; i < p->n_recs;) {
        gp_rec *r = &p->recs[i];
        int all = r->pending && !r->wait_sync;
        for (unsigned j = 0; all && j < r->n; j++) {
            int done = 0;
            if (!r->events[j]) continue;
            if (p->be->event_query(p->be, r->events[j], &done) != GP_OK) {
                gp_error_clear(); /* a failing query: keep the block out */
                done = 0;
            }
            if (done) {
                p->be->event_release(p->be, r->events[j]);
                r->events[j] = 0;
            } else {
                all = 0;
            }
        }
        if (all) gp_rec_finish(p, i);
        else i++;
    }
}

/* After a device synchronisation every pending block is safe. */
static void gp_release_pending(gp_pool *p)
{
    for (unsigned i = 0; i < p->n_recs;) {
        if (p->recs[i].pending) gp_rec_finish(p, i);
        else i++;
    }
}

/* b, with extra streams, is freed: record an event on each and keep it out
 * of the bins until they completed.  Its bytes stay reserved as `pending`. */
static void gp_free_recorded(gp_pool *p, gp_block *b)
{
    gp_rec *r = gp_rec_of(p, b);
    for (unsigned j = 0; j < r->n; j++) {
        if (p->be->event_record(p->be, r->streams[j], &r->events[j]) != GP_OK) {
            /* e.g. the stream is capturing a graph: fall back to the next
             * device synchronisation (trim). */
            gp_error_clear();
            r->events[j] = 0;
            r->wait_sync = 1;
        }
    }
    r->pending = 1;
    b->state = GP_BLOCK_PENDING;
    b->requested = 0;
    p->st.pending += b->size;
    p->n_pending++;
}

gp_status gp_record_stream(gp_pool *p, void *ptr, gp_stream s)
{
    pthread_mutex_lock(&p->lock);
    gp_status st = GP_OK;
    gp_block *b = gp_hash_find(p, (uintptr_t)ptr);
    gp_rec *r = NULL;
    if (!b) {
        st = gp_bad_pointer(p, ptr, "record_stream");
        goto out;
    }
    if (s == p->streams[b->sidx]) goto out; /* its own stream orders it already */
    r = b->rec ? gp_rec_of(p, b) : NULL;
    if (r) {
        for (unsigned j = 0; j < r->n; j++)
            if (r->streams[j] == s) goto out;
        if (r->n == GP_REC_STREAMS) {
            st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: record_stream of %p on more than %d streams",
                              ptr, GP_REC_STREAMS);
            goto out;
        }
    } else {
        if (p->n_recs == p->cap_recs) {
            unsigned nc = p->cap_recs ? 2 * p->cap_recs : 16;
            gp_rec *nr = realloc(p->recs, nc * sizeof *nr);
            if (!nr) {
                st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for record_stream");
                goto out;
            }
            p->recs = nr;
            p->cap_recs = nc;
        }
        r = &p->recs[p->n_recs++];
        memset(r, 0, sizeof *r);
        r->b = b;
        b->rec = 1;
    }
    r->streams[r->n++] = s;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* Cache that trim may give back, of priority `min`..`max`: free blocks of
 * stream slots (a graph pool's memory stays mapped: its graphs use the
 * addresses), at least a chunk long when `whole` (before coalescing, smaller
 * neighbours may still make a chunk). */
static inline int gp_cached(const gp_pool *p, const gp_arena *a, const gp_block *b, int min, int max,
                            int whole)
{
    return b->state == GP_BLOCK_FREE && p->slot_kind[b->sidx] == GP_SLOT_STREAM &&
           b->prio >= min && b->prio <= max && (!whole || b->size >= a->chunk);
}

/* The lowest priority >= min of cache in arena `only` (NULL: all), or
 * GP_PRIO_MAX + 1 if none. */
static int gp_cache_level(const gp_pool *p, const gp_arena *only, int min, int whole)
{
    int level = GP_PRIO_MAX + 1;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        const gp_arena *a = &p->arenas[k];
        if (only && a != only) continue;
        for (const gp_block *b = a->first; b; b = b->next)
            if (gp_cached(p, a, b, min, level - 1, whole)) level = b->prio;
    }
    return level;
}

/* Give back at least `want` bytes of cached chunks (fewer if there are not
 * so many), from arena `only` or, when it is NULL, from every arena: only
 * cache of priority <= max_prio, the lowest priority first (a pass over the
 * arenas per priority that holds cache; one pass when all is one priority). */
static uint64_t gp_trim_in(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio)
{
    /* No synchronisation (illegal) nor unmapping while a graph captures. */
    if (p->reserve_mode || p->n_capturing || p->st.reserved == p->st.allocated) return 0;
    /* Nothing this request may release: spare the device sync. */
    if (gp_cache_level(p, only, 0, 0) > max_prio) return 0;
    /* A stream may still read a block it freed: wait for the device before
     * giving any chunk back. */
    p->st.n_sync++;
    if (p->be->synchronize(p->be) != GP_OK) return 0;
    gp_release_pending(p);
    for (unsigned k = 0; k < p->n_arenas; k++)
        if (!only || &p->arenas[k] == only) gp_coalesce_idle(p, &p->arenas[k]);
    uint64_t freed = 0;
    for (int level = gp_cache_level(p, only, 0, 1); level <= max_prio && freed < want;
         level = gp_cache_level(p, only, level + 1, 1)) {
        for (unsigned k = 0; k < p->n_arenas && freed < want; k++) {
            gp_arena *a = &p->arenas[k];
            if (only && a != only) continue;
            for (gp_block *b = a->first, *nx; b && freed < want; b = nx) {
                nx = b->next;
                if (gp_cached(p, a, b, level, level, 1)) freed += gp_trim_block(p, a, b, &nx);
            }
        }
    }
    if (freed) p->st.n_trim++;
    return freed;
}

static uint64_t gp_trim_locked(gp_pool *p, uint64_t want) { return gp_trim_in(p, NULL, want, GP_PRIO_MAX); }

uint64_t gp_pool_trim(gp_pool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->lock);
    uint64_t f = gp_trim_locked(p, bytes);
    pthread_mutex_unlock(&p->lock);
    return f;
}

uint64_t gp_pool_empty_cache(gp_pool *p) { return gp_pool_trim(p, UINT64_MAX); }

/* ---------------------------------------------------------------- growing */

/* Map new memory so that a free block of at least `size` bytes exists on
 * stream slot sidx, in the slot's region, for a request of `prio` (which
 * may release cache of priorities up to its own to stay under the limit);
 * return it (removed from its bins) or NULL with the error set. */
static gp_block *gp_grow(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size, int prio, gp_status *st)
{
    if (p->reserve_mode) {
        *st = gp_error_set(GP_ERR_OOM, "the reserved pool is exhausted (reserve mode never maps more)");
        return NULL;
    }
    uint64_t need = gp_round_up(size, a->chunk);
    uint64_t limit = p->st.limit;
    if (limit && p->st.reserved + need > limit) {
        gp_trim_in(p, NULL, p->st.reserved + need - limit, prio);
        if (p->st.reserved + need > limit) {
            *st = gp_error_set(GP_ERR_LIMIT,
                               "the pool limit of %" PRIu64 " bytes would be exceeded "
                               "(reserved %" PRIu64 ", %" PRIu64 " more needed)",
                               limit, p->st.reserved, need);
            return NULL;
        }
    }
    /* Keep reserved near allocated.  The free memory a request cannot use
     * lies in holes between live blocks (on a LoRA step: two holes of 2.2
     * GiB beside a 4.6 GiB request).  Rather than map new memory beside
     * them, give their chunks back first -- one device sync -- so that the
     * physical memory moves to where it is needed.  GPUPOOL_CACHE_SLACK is
     * how much cache may stay; growing is rare once a workload has seen its
     * largest step, so the sync is too. */
    double slack = p->cfg.cache_slack;
    if (slack >= 0 && !p->n_capturing) {
        uint64_t after = p->st.allocated + size, keep = (uint64_t)(slack * (double)after);
        if (p->st.reserved + need > after + keep)
            gp_trim_in(p, a, p->st.reserved + need - after - keep, prio);
    }
    gp_block *u = gp_bins_find(&a->unmapped[p->slot_life[sidx]], need);
    if (!u) {
        *st = gp_error_set(GP_ERR_OOM, "no unmapped address range of %" PRIu64 " bytes left in the arena", need);
        return NULL;
    }
    /* A free block of this stream just below u is extended rather than a new
     * run started: map only what it lacks. */
    gp_block *pv = u->prev;
    if (pv && pv->state == GP_BLOCK_FREE && pv->sidx == sidx && pv->life == u->life && pv->size < size)
        need = gp_round_up(size - pv->size, a->chunk);
    if ((*st = gp_reserve_headers(p, 2)) != GP_OK) return NULL;
    if ((*st = gp_map_range(p, a, u->addr, need)) != GP_OK) return NULL;
    gp_bins_remove(gp_bins_of(a, u), u);
    gp_block *rest = u->size > need ? gp_split(p, u, need) : NULL;
    u->state = GP_BLOCK_FREE; /* before the rest goes back, or they would merge */
    u->sidx = (uint8_t)sidx;
    u->prio = (uint8_t)prio;
    if (rest) gp_insert_free(p, a, rest);
    gp_block *b = gp_insert_free(p, a, u);
    gp_bins_remove(a->bins[sidx], b);
    return b;
}

/* A free block of another stream, made safe for `sidx` by a device-side
 * wait on the stream that freed it. */
static gp_block *gp_steal(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size)
{
    for (unsigned s = 0; s < p->n_streams; s++) {
        /* (Placement: a region's blocks serve only that region's slots.) */
        if (s == sidx || p->slot_kind[s] != GP_SLOT_STREAM || p->slot_life[s] != p->slot_life[sidx])
            continue;
        gp_block *b = gp_bins_find(a->bins[s], size);
        if (!b) continue;
        p->st.n_stream_waits++;
        if (p->be->stream_wait(p->be, p->streams[sidx], p->streams[s]) != GP_OK) continue;
        gp_bins_remove(a->bins[s], b);
        b->sidx = (uint8_t)sidx;
        return b;
    }
    return NULL;
}

/* ------------------------------------------------------------ graph capture */

static gp_gpool *gp_gpool_find(gp_pool *p, uint64_t key)
{
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++)
        if (p->gpools[i].live && p->gpools[i].key == key) return &p->gpools[i];
    return NULL;
}

/* Which graph pool an allocation on stream s goes to (*slot, or -1: none).
 * Called only while a capture is underway. */
static gp_status gp_capture_route(gp_pool *p, gp_stream s, int *slot)
{
    gp_gpool *only = NULL;
    unsigned n_active = 0;
    *slot = -1;
    for (unsigned i = 0; i < GP_MAX_GPOOLS; i++) {
        gp_gpool *g = &p->gpools[i];
        if (!g->live || !g->n_capturing) continue;
        n_active++;
        only = g;
        for (unsigned j = 0; j < g->n_capturing; j++) {
            if (g->capturing[j] == s) {
                *slot = (int)g->slot;
                return GP_OK;
            }
        }
    }
    /* A stream the capture forked to (it waited on an event of the
     * capturing stream) captures into the same graph: ask the device, which
     * costs a call only while a capture is underway. */
    int capturing = 0;
    gp_status st = p->be->is_capturing(p->be, s, &capturing);
    if (st != GP_OK || !capturing) return st;
    if (n_active != 1)
        return gp_error_set(GP_ERR_INVALID,
                            "gpupool: stream %p captures a CUDA graph while %u captures are underway "
                            "and was not named to gp_pool_capture_begin: cannot tell which graph's "
                            "memory it should use", s, n_active);
    *slot = (int)only->slot;
    return GP_OK;
}

/* A free block for an allocation during capture into the graph pool of
 * `slot`: one of the pool's own, else one of the capturing stream (free
 * since the device was idle at gp_pool_capture_prepare, or freed in this
 * stream's order), in the large arena too when the small one has none
 * (prepare maps ahead there).  Removed from its bins; *ap is its arena. */
static gp_block *gp_capture_find(gp_pool *p, gp_arena **ap, unsigned slot, unsigned sidx, uint64_t size)
{
    for (unsigned k = (unsigned)(*ap - p->arenas); k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_bins *order[2] = {a->bins[slot], a->bins[sidx]};
        for (int i = 0; i < 2; i++) {
            gp_block *b = gp_bins_find(order[i], size);
            if (b) {
                gp_bins_remove(order[i], b);
                *ap = a;
                return b;
            }
        }
    }
    return NULL;
}

gp_status gp_pool_capture_prepare(gp_pool *p, gp_stream stream)
{
    pthread_mutex_lock(&p->lock);
    unsigned sidx;
    gp_status st = gp_stream_index(p, stream, &sidx);
    /* With another capture underway the device cannot be synchronised: the
     * new capture then draws on its stream's own blocks and new mappings. */
    if (st != GP_OK || p->n_capturing) goto out;
    p->st.n_sync++;
    if ((st = p->be->synchronize(p->be)) != GP_OK) goto out;
    gp_release_pending(p);
    /* The device is idle: every cached block is safe for the capturing
     * stream.  Hand them all to it, so that the capture finds them without
     * a cross-stream wait (which a capture cannot make). */
    uint64_t have = 0;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        gp_coalesce_idle(p, a);
        for (gp_block *b = a->first; b; b = b->next) {
            if (b->state != GP_BLOCK_FREE || p->slot_kind[b->sidx] != GP_SLOT_STREAM) continue;
            if (b->sidx != sidx) {
                gp_bins_remove(a->bins[b->sidx], b);
                b->sidx = (uint8_t)sidx;
                b = gp_insert_free(p, a, b);
            }
            if (k == p->n_arenas - 1) have += b->size;
        }
    }
    /* Map ahead, before the capture starts, what the workload needed at its
     * peak beyond what is live (warm-up runs set that peak), so that the
     * capture itself makes no driver call.  Best effort: if the device or
     * the limit says no, the capture maps what it lacks. */
    uint64_t want = p->st.allocated_peak - p->st.allocated;
    if (!p->reserve_mode && want > have) {
        gp_arena *a = &p->arenas[p->n_arenas - 1];
        gp_status gs;
        gp_block *b = gp_grow(p, a, sidx, want - have, p->cfg.priority, &gs);
        if (b) gp_insert_free(p, a, b);
        else gp_error_clear();
    }
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_capture_begin(gp_pool *p, uint64_t key, gp_stream stream)
{
    pthread_mutex_lock(&p->lock);
    gp_status st = GP_OK;
    gp_gpool *g = gp_gpool_find(p, key);
    if (!g) {
        unsigned i = 0, home, slot;
        while (i < GP_MAX_GPOOLS && p->gpools[i].live) i++;
        if (i == GP_MAX_GPOOLS) {
            st = gp_error_set(GP_ERR_TOO_MANY,
                              "gpupool: more than %d CUDA graph memory pools are alive on device %d; "
                              "share pools between graphs (pool=graph.pool()) or release graphs",
                              GP_MAX_GPOOLS, p->be->device);
            goto out;
        }
        if ((st = gp_stream_index(p, stream, &home)) != GP_OK) goto out;
        if ((st = gp_slot_new(p, stream, GP_SLOT_GPOOL, &slot)) != GP_OK) goto out;
        g = &p->gpools[i];
        *g = (gp_gpool){.key = key, .slot = slot, .home = home, .live = 1};
    }
    if (g->n_capturing == GP_GPOOL_STREAMS) {
        st = gp_error_set(GP_ERR_TOO_MANY, "gpupool: more than %d streams capture into one graph pool",
                          GP_GPOOL_STREAMS);
        goto out;
    }
    g->capturing[g->n_capturing++] = stream;
    g->refs++;
    p->n_capturing++;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* Give the memory of graph pool g back: its free blocks return to the bins
 * of the stream that captured, and its live blocks (outputs the caller still
 * holds) go there when freed.  The device is synchronised first, since a
 * replay may still be running. */
static gp_status gp_gpool_free(gp_pool *p, gp_gpool *g)
{
    p->st.n_sync++;
    gp_status st = p->be->synchronize(p->be);
    if (st != GP_OK) return st;
    for (unsigned k = 0; k < p->n_arenas; k++) {
        gp_arena *a = &p->arenas[k];
        for (gp_block *b = a->first; b; b = b->next) {
            if (b->state == GP_BLOCK_FREE_UNMAPPED || b->sidx != g->slot) continue;
            if (b->state == GP_BLOCK_FREE) {
                gp_bins_remove(a->bins[g->slot], b);
                b->sidx = (uint8_t)g->home;
                b = gp_insert_free(p, a, b);
            } else {
                b->sidx = (uint8_t)g->home;
            }
        }
    }
    p->slot_kind[g->slot] = GP_SLOT_SPARE;
    g->live = 0;
    return GP_OK;
}

/* Free the graph pools nobody holds, once no capture is underway. */
static gp_status gp_gpools_collect(gp_pool *p)
{
    gp_status st = GP_OK;
    for (unsigned i = 0; i < GP_MAX_GPOOLS && !p->n_capturing; i++) {
        gp_gpool *g = &p->gpools[i];
        if (g->live && !g->refs && (st = gp_gpool_free(p, g)) != GP_OK) break;
    }
    return st;
}

gp_status gp_pool_capture_end(gp_pool *p, gp_stream stream)
{
    pthread_mutex_lock(&p->lock);
    gp_status st = gp_error_set(GP_ERR_INVALID, "gpupool: capture_end on stream %p, which is not capturing "
                                "into a graph pool", stream);
    for (unsigned i = 0; i < GP_MAX_GPOOLS && st != GP_OK; i++) {
        gp_gpool *g = &p->gpools[i];
        for (unsigned j = 0; g->live && j < g->n_capturing; j++) {
            if (g->capturing[j] == stream) {
                g->capturing[j] = g->capturing[--g->n_capturing];
                p->n_capturing--;
                gp_error_clear();
                st = GP_OK;
                break;
            }
        }
    }
    if (st == GP_OK) st = gp_gpools_collect(p);
    pthread_mutex_unlock(&p->lock);
    return st;
}

gp_status gp_pool_capture_release(gp_pool *p, uint64_t key)
{
    pthread_mutex_lock(&p->lock);
    gp_status st = GP_OK;
    gp_gpool *g = gp_gpool_find(p, key);
    if (!g || !g->refs)
        st = gp_error_set(GP_ERR_INVALID, "gpupool: release of graph pool %llu, which holds no graph",
                          (unsigned long long)key);
    else if (--g->refs == 0)
        st = gp_gpools_collect(p);
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* ------------------------------------------------------------ alloc, free */

static void gp_oom_report_locked(gp_pool *p, uint64_t requested, char *buf, size_t len);

static inline void gp_peak(uint64_t *cur, uint64_t *peak, uint64_t add)
{
    *cur += add;
    if (*cur > *peak) *peak = *cur;
}

/* Whether live memory of a priority below `prio` exists (what the pressure
 * callback may give up). */
static int gp_lower_live(const gp_pool *p, int prio)
{
    for (int q = 0; q < prio; q++)
        if (p->prio_alloc[q]) return 1;
    return 0;
}

/* Bytes cached at priorities above `prio`: what a request of `prio` may not
 * release (for its error message). */
static uint64_t gp_cached_above(const gp_pool *p, int prio)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < p->n_arenas; k++)
        for (const gp_block *b = p->arenas[k].first; b; b = b->next)
            if (gp_cached(p, &p->arenas[k], b, prio + 1, GP_PRIO_MAX, 0)) n += b->size;
    return n;
}

/* The limit or the device stands in the way of a request of `prio` that
 * found no cached block: give up, in this order, what it may displace, and
 * retry after each step -- (1) cached chunks of priorities up to its own,
 * the lowest first, as many as it needs, then all of them (the limit path
 * of gp_grow has done this already); (2) live memory of lower priorities,
 * through the pressure callback (offload, the arbiter), only if some
 * exists.  Nothing of a higher priority is touched, so only a request that
 * can displace nobody fails.  Called, and returns, with the lock held. */
static gp_block *gp_displace(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t bsize, int prio,
                             gp_status *st)
{
    gp_block *b = NULL;
    p->st.n_alloc_retries++;
    if (*st == GP_ERR_OOM && !p->reserve_mode) {
        gp_trim_in(p, NULL, gp_round_up(bsize, a->chunk), prio);
        if (!(b = gp_grow(p, a, sidx, bsize, prio, st)) && *st == GP_ERR_OOM) {
            gp_trim_in(p, NULL, UINT64_MAX, prio);
            b = gp_grow(p, a, sidx, bsize, prio, st);
        }
    }
    if (!b && (*st == GP_ERR_OOM || *st == GP_ERR_LIMIT) && p->pressure && gp_lower_live(p, prio)) {
        gp_pressure_fn fn = p->pressure;
        void *arg = p->pressure_arg;
        pthread_mutex_unlock(&p->lock);
        uint64_t got = fn(arg, p, bsize, prio);
        pthread_mutex_lock(&p->lock);
        if (got) {
            /* What was given up is cache now: reuse it, or release it and map. */
            if ((b = gp_bins_find(a->bins[sidx], bsize))) gp_bins_remove(a->bins[sidx], b);
            else if (!(b = gp_steal(p, a, sidx, bsize))) {
                b = gp_grow(p, a, sidx, bsize, prio, st);
                if (!b && *st == GP_ERR_OOM && !p->reserve_mode) {
                    gp_trim_in(p, NULL, UINT64_MAX, prio);
                    b = gp_grow(p, a, sidx, bsize, prio, st);
                }
            }
        }
    }
    return b;
}

void *gp_alloc(gp_pool *p, size_t size, gp_stream stream, gp_tag tag, int priority, gp_status *status)
{
    gp_status st = GP_OK, dummy;
    if (!status) status = &dummy;
    if (size == 0 || size > GP_MAX_SIZE) {
        *status = gp_error_set(GP_ERR_INVALID,
                               "gpupool: cannot allocate %zu bytes: sizes from 1 byte to 256 TiB are accepted", size);
        return NULL;
    }
    if (priority == GP_PRIO_DEFAULT) priority = p->cfg.priority;
    if (tag >= GP_MAX_TAGS || priority < 0 || priority > GP_PRIO_MAX) {
        *status = gp_error_set(GP_ERR_INVALID, "gpupool: bad tag %u or priority %d (0..%d)",
                               (unsigned)tag, priority, GP_PRIO_MAX);
        return NULL;
    }
    uint64_t bsize = gp_block_size(p, size);
    pthread_mutex_lock(&p->lock);
    unsigned sidx;
    gp_tag_stats *ts = &p->tags[tag];
    gp_arena *a = &p->arenas[p->n_arenas == 1 || bsize >= p->small_size ? p->n_arenas - 1 : 0];
    gp_block *b = NULL;
    /* Placement: long-lived tags use their stream's slot of the long region
     * (not while capturing: a capture draws on the capturing stream's slot). */
    unsigned life = p->placement && !p->n_capturing ? (unsigned)gp_tag_lifetime(tag) : GP_LIFE_SHORT;
    if ((st = gp_slot_of(p, stream, life, &sidx)) != GP_OK) goto fail;
    int gslot = -1; /* the graph pool this allocation goes to, if capturing */
    if (p->n_capturing && (st = gp_capture_route(p, stream, &gslot)) != GP_OK) goto fail;
    if (p->n_pending) gp_poll_pending(p);
    if (ts->limit && ts->allocated + bsize > ts->limit) {
        st = gp_error_set(GP_ERR_LIMIT,
                          "tag '%s' is limited to %" PRIu64 " bytes and holds %" PRIu64
                          "; %" PRIu64 " more were asked for",
                          gp_tag_name(tag), ts->limit, ts->allocated, (uint64_t)bsize);
        goto fail;
    }
    if (gp_reserve_headers(p, 1) != GP_OK) { st = GP_ERR_NOMEM; goto fail; }
    if (gslot >= 0) b = gp_capture_find(p, &a, (unsigned)gslot, sidx, bsize);
    else if ((b = gp_bins_find(a->bins[sidx], bsize))) gp_bins_remove(a->bins[sidx], b);
    if (b) {
        p->st.cache_hits++;
    } else if (gslot >= 0 || !(b = gp_steal(p, a, sidx, bsize))) {
        /* (A capture cannot wait on another stream: it never steals.) */
        b = gp_grow(p, a, sidx, bsize, priority, &st);
        if (!b && (st == GP_ERR_OOM || st == GP_ERR_LIMIT))
            b = gp_displace(p, a, sidx, bsize, priority, &st);
        if (!b) goto fail;
    }
    b->state = GP_BLOCK_USED; /* before the tail goes back, or they would merge */
    if (b->size - bsize >= GP_ALIGN) {
        gp_block *tail = gp_split(p, b, bsize);
        tail->state = GP_BLOCK_FREE;
        gp_insert_free(p, a, tail);
    }
    /* Only the block handed out joins the graph pool; the tail stays with
     * the stream. */
    if (gslot >= 0) b->sidx = (uint8_t)gslot;
    b->requested = size;
    p->st.allocated_total += b->size;
    p->st.requested_total += size;
    b->tag = tag;
    b->prio = (uint8_t)priority;
    if (p->hcount >= p->hmask + 1 && gp_hash_grow(p) != GP_OK) {
        /* Keep going with longer chains: the table is only slower. */
        gp_error_clear();
    }
    gp_hash_insert(p, b);
    gp_peak(&p->st.allocated, &p->st.allocated_peak, b->size);
    gp_peak(&p->st.requested, &p->st.requested_peak, size);
    gp_peak(&p->st.active_blocks, &p->st.active_blocks_peak, 1);
    p->st.n_alloc++;
    gp_peak(&ts->allocated, &ts->allocated_peak, b->size);
    ts->requested += size;
    ts->active_blocks++;
    ts->n_alloc++;
    gp_peak(&p->prio_alloc[priority], &p->prio_peak[priority], b->size);
    GP_TRACE(p, GP_EV_ALLOC, b->addr, b->size, stream, tag, priority);
    pthread_mutex_unlock(&p->lock);
    *status = GP_OK;
    return (void *)b->addr;

fail:
    if (st == GP_ERR_OOM || st == GP_ERR_LIMIT) {
        char why[256];
        snprintf(why, sizeof why, "%s", gp_last_error());
        p->st.n_oom++;
        gp_oom_report_locked(p, size, p->last_oom, sizeof p->last_oom);
        size_t n = strlen(p->last_oom);
        n += (size_t)snprintf(p->last_oom + n, sizeof p->last_oom - n, "\n  cause: %s", why);
        uint64_t kept = gp_cached_above(p, priority);
        if (kept && n < sizeof p->last_oom)
            snprintf(p->last_oom + n, sizeof p->last_oom - n,
                     "\n  %" PRIu64 " bytes cached at priorities above this request's (%d) stay theirs",
                     kept, priority);
        gp_error_set(st, "%s", p->last_oom);
        if (p->trace) {
            uint64_t dev_free = 0, dev_total = 0;
            if (p->be->mem_info(p->be, &dev_free, &dev_total) != GP_OK) dev_free = 0;
            gp_trace_add(p->trace, GP_EV_OOM, (uintptr_t)dev_free, size, stream, tag, priority);
            gp_error_set(st, "%s", p->last_oom); /* (mem_info may have left its own) */
        }
    }
    pthread_mutex_unlock(&p->lock);
    *status = st;
    return NULL;
}

static gp_arena *gp_arena_of(gp_pool *p, uintptr_t a)
{
    for (unsigned k = 0; k < p->n_arenas; k++)
        if (a >= p->arenas[k].base && a < p->arenas[k].base + p->arenas[k].size) return &p->arenas[k];
    return NULL;
}

/* The block containing address x of arena a (slow: error paths only). */
static gp_block *gp_block_at(gp_arena *a, uintptr_t x)
{
    for (gp_block *b = a->first; b; b = b->next)
        if (x >= b->addr && x < b->addr + b->size) return b;
    return NULL;
}

/* Explain why x is not a live block start (error path). */
static gp_status gp_bad_pointer(gp_pool *p, const void *ptr, const char *what)
{
    uintptr_t x = (uintptr_t)ptr;
    gp_arena *a = gp_arena_of(p, x);
    gp_block *b = a ? gp_block_at(a, x) : NULL;
    if (!b)
        return gp_error_set(GP_ERR_FOREIGN,
                            "gpupool: %s of %p, which gpupool did not allocate (device %d)",
                            what, ptr, p->be->device);
    if (b->state != GP_BLOCK_USED)
        return gp_error_set(GP_ERR_DOUBLE_FREE,
                            "gpupool: %s of %p, which is not allocated: freed twice, or used after free",
                            what, ptr);
    return gp_error_set(GP_ERR_FOREIGN,
                        "gpupool: %s of %p, which points %" PRIu64 " bytes into the block at 0x%" PRIxPTR
                        " of %" PRIu64 " bytes, not at its start", what, ptr,
                        (uint64_t)(x - b->addr), b->addr, b->size);
}

gp_status gp_free(gp_pool *p, void *ptr)
{
    if (!ptr) return GP_OK;
    pthread_mutex_lock(&p->lock);
    gp_block *b = gp_hash_remove(p, (uintptr_t)ptr);
    if (!b) {
        gp_status st = gp_bad_pointer(p, ptr, "free");
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    gp_tag_stats *ts = &p->tags[b->tag];
    p->st.allocated -= b->size;
    p->st.requested -= b->requested;
    p->st.active_blocks--;
    p->st.n_free++;
    ts->allocated -= b->size;
    ts->requested -= b->requested;
    ts->active_blocks--;
    p->prio_alloc[b->prio] -= b->size;
    if (p->trace) {
        gp_stream bs = p->streams[b->sidx];
        gp_trace_add(p->trace, GP_EV_FREE_REQUESTED, b->addr, b->size, bs, b->tag, b->prio);
        if (!b->rec) gp_trace_add(p->trace, GP_EV_FREE_COMPLETED, b->addr, b->size, bs, b->tag, b->prio);
    }
    if (b->rec) {
        gp_free_recorded(p, b);
    } else {
        b->state = GP_BLOCK_FREE;
        gp_insert_free(p, &p->arenas[b->arena], b);
    }
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}

/* ---------------------------------------------------------- create, destroy */

/* Reserve arena k: `size` bytes, and a long-lived region of `long_size`
 * above them (0: none). */
static gp_status gp_arena_init(gp_pool *p, unsigned k, uint64_t size, uint64_t chunk, uint64_t long_size)
{
    gp_arena *a = &p->arenas[k];
    a->chunk = chunk;
    long_size = gp_round_up(long_size, chunk);
    a->size = gp_round_up(size, chunk) + long_size;
    a->handles = calloc(a->size / chunk, sizeof *a->handles);
    if (!a->handles) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the chunk table");
    gp_status st = p->be->reserve(p->be, a->size, chunk, &a->base);
    if (st != GP_OK) return st;
    a->long_base = a->base + a->size - long_size;
    if ((st = gp_reserve_headers(p, 2)) != GP_OK) return st;
    gp_block *b = gp_new_block(p);
    b->addr = a->base;
    b->size = a->size - long_size;
    b->state = GP_BLOCK_FREE_UNMAPPED;
    b->arena = (uint8_t)k;
    a->first = b;
    gp_bins_insert(&a->unmapped[GP_LIFE_SHORT], b);
    if (long_size) {
        gp_block *l = gp_split(p, b, b->size);
        l->size = long_size;
        l->life = GP_LIFE_LONG;
        gp_bins_insert(&a->unmapped[GP_LIFE_LONG], l);
    }
    return GP_OK;
}

/* The reserve of reserve mode, mapped at once in large chunks (they are
 * never unmapped, and each mapping costs the same whatever its size). */
static gp_status gp_map_reserve(gp_pool *p, uint64_t bytes)
{
    gp_arena *a = &p->arenas[0];
    gp_block *u = a->first;
    uint64_t len = bytes / a->chunk * a->chunk;
    if (len == 0) len = a->chunk;
    gp_status st = gp_reserve_headers(p, 1);
    if (st == GP_OK) st = gp_map_range(p, a, u->addr, len);
    if (st != GP_OK)
        return gp_error_set(st, "gpupool: cannot map the reserve of %" PRIu64 " bytes on device %d: %s",
                            len, p->be->device, gp_last_error());
    gp_bins_remove(&a->unmapped[GP_LIFE_SHORT], u);
    gp_block *rest = u->size > len ? gp_split(p, u, len) : NULL;
    u->state = GP_BLOCK_FREE;
    u->sidx = 0;
    if (rest) gp_insert_free(p, a, rest);
    gp_insert_free(p, a, u);
    return GP_OK;
}

gp_status gp_pool_create(gp_backend *be, const gp_config *cfg, gp_pool **out)
{
    *out = NULL;
    gp_pool *p = calloc(1, sizeof *p);
    if (!p) {
        be->destroy(be);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pool");
    }
    pthread_mutex_init(&p->lock, NULL);
    p->be = be;
    p->cfg = *cfg;
    p->small_size = cfg->small_size ? cfg->small_size : (1u << 20);
    p->st.device_total = be->total;
    p->st.limit = gp_size_resolve(cfg->limit, be->total);
    uint64_t chunk = cfg->chunk ? cfg->chunk : (2u << 20);
    if (chunk % be->granularity) chunk = gp_round_up(chunk, be->granularity);
    gp_status st = GP_OK;
    p->hmask = 1023;
    p->buckets = calloc(p->hmask + 1, sizeof *p->buckets);
    if (!p->buckets) st = gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the pointer table");
    /* GPUPOOL_TRACE: on from the start, so that a reserve's mapping is in it. */
    if (st == GP_OK && cfg->trace) st = gp_pool_history(p, GP_HISTORY_DEFAULT, 1);
    /* Stream index 0 is the default stream, so that the reserve has bins. */
    if (st == GP_OK) {
        p->reserve_mode = cfg->mode == GP_MODE_RESERVE;
        if (p->reserve_mode) {
            uint64_t r = gp_size_resolve(cfg->reserve, be->total);
            if (r == 0) r = (uint64_t)(0.8 * (double)be->total);
            if (p->st.limit && r > p->st.limit) r = p->st.limit;
            /* Few large chunks: about 64 of them, between `chunk` and 1 GiB. */
            uint64_t big = chunk;
            while (big < (1ull << 30) && big * 64 < r) big *= 2;
            p->n_arenas = 1;
            st = gp_arena_init(p, 0, r < big ? big : r, big, 0);
            p->st.arena_size[GP_ARENA_LARGE] = p->arenas[0].size;
            p->st.chunk = big;
            if (st == GP_OK) st = gp_stream_index(p, NULL, &(unsigned){0});
            if (st == GP_OK) st = gp_map_reserve(p, r < big ? big : r);
        } else {
            p->n_arenas = 2;
            /* Placement: a long-lived region of the device's size in each
             * arena, as the short one could use all of it too (virtual
             * space costs nothing). */
            p->placement = cfg->placement == GP_PLACE_LIFETIME;
            uint64_t long_size = p->placement ? be->total : 0;
            st = gp_arena_init(p, GP_ARENA_SMALL, be->total, chunk, long_size);
            /* Large blocks map in larger units: a driver call per unit is what
             * growing costs (77 us for 2 MiB, 98 us for 32 MiB on an H100),
             * and holes of large blocks are large.  At most 1/32 of the device,
             * so that a small device still grows in steps. */
            uint64_t lchunk = cfg->large_chunk > chunk ? cfg->large_chunk : chunk;
            while (lchunk > chunk && lchunk > be->total / 32) lchunk /= 2;
            if (lchunk % be->granularity) lchunk = gp_round_up(lchunk, be->granularity);
            if (st == GP_OK) st = gp_arena_init(p, GP_ARENA_LARGE, 2 * be->total, lchunk, long_size);
            p->st.arena_size[GP_ARENA_SMALL] = p->arenas[0].size;
            p->st.arena_size[GP_ARENA_LARGE] = p->arenas[1].size;
            p->st.chunk = chunk;
        }
    }
    if (st != GP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", gp_last_error());
        gp_pool_destroy(p);
        return gp_error_set(st, "%s", msg);
    }
    *out = p;
    return GP_OK;
}

void gp_pool_destroy(gp_pool *p)
{
    if (!p) return;
    if (p->st.reserved) p->be->synchronize(p->be);
    for (unsigned i = 0; i < p->n_recs; i++)
        for (unsigned j = 0; j < p->recs[i].n; j++)
            if (p->recs[i].events[j]) p->be->event_release(p->be, p->recs[i].events[j]);
    free(p->recs);
    for (unsigned k = 0; k < GP_ARENA_COUNT; k++) {
        gp_arena *a = &p->arenas[k];
        if (!a->base) continue;
        /* Blocks are in address order and two mapped blocks may share a
         * chunk: `done` keeps each chunk from being released twice. */
        uintptr_t done = a->base;
        for (gp_block *b = a->first; b; b = b->next) {
            if (b->state == GP_BLOCK_FREE_UNMAPPED) continue;
            uintptr_t c = b->addr / a->chunk * a->chunk;
            for (c = c < done ? done : c; c < b->addr + b->size; c += a->chunk)
                p->be->unmap(p->be, c, a->chunk, a->handles[gp_chunk_index(a, c)]);
            done = c;
        }
        p->be->unreserve(p->be, a->base, a->size);
        free(a->handles);
        for (unsigned s = 0; s < GP_MAX_STREAMS; s++) free(a->bins[s]);
    }
    for (size_t i = 0; i < p->n_slabs; i++) free(p->slabs[i]);
    free(p->slabs);
    free(p->buckets);
    gp_trace_free(p->trace);
    p->be->destroy(p->be);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ---------------------------------------------------------------- queries */

static void gp_info_of(const gp_pool *p, const gp_block *b, gp_block_info *o)
{
    const gp_gpool *g = NULL;
    if (b->state != GP_BLOCK_FREE_UNMAPPED && p->slot_kind[b->sidx] == GP_SLOT_GPOOL)
        for (unsigned i = 0; i < GP_MAX_GPOOLS && !g; i++)
            if (p->gpools[i].live && p->gpools[i].slot == b->sidx) g = &p->gpools[i];
    *o = (gp_block_info){
        .in_graph_pool = g != NULL, .graph_pool = g ? g->key : 0,
        .addr = b->addr, .size = b->size, .requested = b->requested,
        .stream = b->state == GP_BLOCK_FREE_UNMAPPED ? NULL : p->streams[b->sidx],
        .tag = b->tag, .priority = b->prio, .state = b->state,
        .arena = p->n_arenas == 1 ? GP_ARENA_LARGE : b->arena, .lifetime = b->life,
    };
}

gp_status gp_pool_lookup(gp_pool *p, const void *ptr, gp_block_info *out)
{
    pthread_mutex_lock(&p->lock);
    gp_block *b = gp_hash_find(p, (uintptr_t)ptr);
    if (!b) {
        gp_arena *a = gp_arena_of(p, (uintptr_t)ptr);
        b = a ? gp_block_at(a, (uintptr_t)ptr) : NULL;
        if (b && b->state != GP_BLOCK_USED) b = NULL;
    }
    gp_status st = GP_OK;
    if (b) gp_info_of(p, b, out);
    else st = gp_bad_pointer(p, ptr, "lookup");
    pthread_mutex_unlock(&p->lock);
    return st;
}

void gp_pool_walk(gp_pool *p, gp_block_fn fn, void *arg)
{
    pthread_mutex_lock(&p->lock);
    for (unsigned k = 0; k < p->n_arenas; k++) {
        for (gp_block *b = p->arenas[k].first; b; b = b->next) {
            gp_block_info info;
            gp_info_of(p, b, &info);
            if (fn(arg, &info)) goto out;
        }
    }
out:
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_set_pressure(gp_pool *p, gp_pressure_fn fn, void *arg)
{
    pthread_mutex_lock(&p->lock);
    p->pressure = fn;
    p->pressure_arg = arg;
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_set_limit(gp_pool *p, uint64_t bytes)
{
    pthread_mutex_lock(&p->lock);
    p->st.limit = bytes;
    p->cfg.limit = (gp_size_spec){.bytes = bytes};
    pthread_mutex_unlock(&p->lock);
}

gp_status gp_pool_set_tag_limit(gp_pool *p, gp_tag tag, uint64_t bytes)
{
    if (tag >= GP_MAX_TAGS || !gp_tag_name(tag))
        return gp_error_set(GP_ERR_INVALID, "gpupool: tag id %u was never interned", (unsigned)tag);
    pthread_mutex_lock(&p->lock);
    p->tags[tag].limit = bytes;
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}

static int gp_block_cmp(const void *x, const void *y)
{
    uintptr_t a = (*(gp_block *const *)x)->addr, b = (*(gp_block *const *)y)->addr;
    return a < b ? -1 : a > b;
}

gp_status gp_pool_retag(gp_pool *p, void *const *ptrs, size_t n, gp_tag tag, int priority, uint64_t *bytes)
{
    if (bytes) *bytes = 0;
    if (tag >= GP_MAX_TAGS || !gp_tag_name(tag) || priority < GP_PRIO_DEFAULT || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID,
                            "gpupool: cannot retag to tag id %u, priority %d: the tag must be interned "
                            "and the priority 0..%d (or %d to keep each block's)",
                            (unsigned)tag, priority, GP_PRIO_MAX, GP_PRIO_DEFAULT);
    if (n == 0) return GP_OK;
    gp_block **bl = malloc(n * sizeof *bl);
    if (!bl) return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory to retag %zu blocks", n);
    gp_status st = GP_OK;
    pthread_mutex_lock(&p->lock);
    /* Resolve every address first, so that a bad one changes nothing. */
    for (size_t i = 0; i < n; i++) {
        uintptr_t x = (uintptr_t)ptrs[i];
        gp_block *b = gp_hash_find(p, x);
        if (!b) { /* an address inside a block (a view): the slow walk */
            gp_arena *a = gp_arena_of(p, x);
            b = a ? gp_block_at(a, x) : NULL;
            if (b && b->state != GP_BLOCK_USED) b = NULL;
        }
        if (!b) {
            st = gp_error_set(GP_ERR_FOREIGN, "gpupool: retag of %p, which lies in no live block of "
                              "this pool (device %d)", ptrs[i], p->be->device);
            goto out;
        }
        bl[i] = b;
    }
    qsort(bl, n, sizeof *bl, gp_block_cmp);
    size_t m = 0;
    uint64_t add = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && bl[m - 1] == bl[i]) continue;
        bl[m++] = bl[i];
        if (bl[i]->tag != tag) add += bl[i]->size;
    }
    gp_tag_stats *ts = &p->tags[tag];
    if (ts->limit && ts->allocated + add > ts->limit) {
        st = gp_error_set(GP_ERR_LIMIT, "gpupool: retag to '%s' would exceed its limit of %" PRIu64
                          " bytes (it holds %" PRIu64 ", %" PRIu64 " more)", gp_tag_name(tag),
                          ts->limit, ts->allocated, add);
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        gp_block *b = bl[i];
        int np = priority == GP_PRIO_DEFAULT ? b->prio : priority;
        if (b->tag == tag && b->prio == np) continue;
        gp_tag_stats *os = &p->tags[b->tag];
        os->allocated -= b->size;
        os->requested -= b->requested;
        os->active_blocks--;
        gp_peak(&ts->allocated, &ts->allocated_peak, b->size);
        ts->requested += b->requested;
        ts->active_blocks++;
        p->prio_alloc[b->prio] -= b->size;
        gp_peak(&p->prio_alloc[np], &p->prio_peak[np], b->size);
        b->tag = tag;
        b->prio = (uint8_t)np;
        moved += b->size;
    }
    if (bytes) *bytes = moved;
out:
    pthread_mutex_unlock(&p->lock);
    free(bl);
    return st;
}

static void gp_scan_locked(gp_pool *p, gp_stats *o)
{
    for (unsigned k = 0; k < p->n_arenas; k++) {
        int in_run = 0;
        for (gp_block *b = p->arenas[k].first; b; b = b->next) {
            int mapped = b->state != GP_BLOCK_FREE_UNMAPPED;
            if (mapped && !in_run) o->segments++;
            in_run = mapped;
            if (b->state == GP_BLOCK_FREE) {
                o->free_blocks++;
                if (b->size > o->largest_free) o->largest_free = b->size;
            }
        }
    }
}

uint64_t gp_pool_headroom(gp_pool *p)
{
    gp_stats s;
    gp_pool_stats(p, &s, 1);
    uint64_t best = s.largest_free, dev_free = 0, dev_total = 0;
    if (!p->reserve_mode && p->be->mem_info(p->be, &dev_free, &dev_total) == GP_OK) {
        if (s.limit) {
            uint64_t room = s.limit > s.reserved ? s.limit - s.reserved : 0;
            if (room < dev_free) dev_free = room;
        }
        if (dev_free > best) best = dev_free;
    }
    return best;
}

void gp_pool_stats(gp_pool *p, gp_stats *out, int full)
{
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    out->free_bytes = p->st.reserved - p->st.allocated;
    if (full) gp_scan_locked(p, out);
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_tag_stats(gp_pool *p, gp_tag tag, gp_tag_stats *out)
{
    if (tag >= GP_MAX_TAGS) { memset(out, 0, sizeof *out); return; }
    pthread_mutex_lock(&p->lock);
    *out = p->tags[tag];
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_prio_stats(gp_pool *p, int prio, uint64_t *allocated, uint64_t *peak)
{
    *allocated = *peak = 0;
    if (prio < 0 || prio > GP_PRIO_MAX) return;
    pthread_mutex_lock(&p->lock);
    *allocated = p->prio_alloc[prio];
    *peak = p->prio_peak[prio];
    pthread_mutex_unlock(&p->lock);
}

void gp_pool_reset_peaks(gp_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->st.allocated_peak = p->st.allocated;
    p->st.requested_peak = p->st.requested;
    p->st.reserved_peak = p->st.reserved;
    p->st.active_blocks_peak = p->st.active_blocks;
    for (unsigned t = 0; t < GP_MAX_TAGS; t++) p->tags[t].allocated_peak = p->tags[t].allocated;
    for (unsigned i = 0; i <= GP_PRIO_MAX; i++) p->prio_peak[i] = p->prio_alloc[i];
    pthread_mutex_unlock(&p->lock);
}

/* ------------------------------------------------------------- OOM report */

static const char *gp_fmt_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static void gp_oom_report_locked(gp_pool *p, uint64_t requested, char *buf, size_t len)
{
    gp_stats s = p->st;
    s.largest_free = 0;
    gp_scan_locked(p, &s);
    uint64_t dfree = 0, dtotal = 0;
    p->be->mem_info(p->be, &dfree, &dtotal);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    size_t n = (size_t)snprintf(buf, len,
        "gpupool: out of memory on device %d allocating %s (%" PRIu64 " bytes)\n"
        "  allocated %s, reserved %s, largest free block %s, limit %s, device free %s of %s",
        p->be->device, gp_fmt_bytes(requested, b1, sizeof b1), requested,
        gp_fmt_bytes(s.allocated, b2, sizeof b2), gp_fmt_bytes(s.reserved, b3, sizeof b3),
        gp_fmt_bytes(s.largest_free, b4, sizeof b4),
        s.limit ? gp_fmt_bytes(s.limit, b5, sizeof b5) : "none",
        gp_fmt_bytes(dfree, b6, sizeof b6), gp_fmt_bytes(dtotal, b7, sizeof b7));
    /* The three biggest tags: where to look first. */
    unsigned top[3] = {GP_MAX_TAGS, GP_MAX_TAGS, GP_MAX_TAGS};
    unsigned nt = gp_tag_count();
    for (unsigned t = 0; t < nt; t++) {
        uint64_t v = p->tags[t].allocated;
        if (!v) continue;
        for (int i = 0; i < 3; i++) {
            if (top[i] == GP_MAX_TAGS || v > p->tags[top[i]].allocated) {
                memmove(&top[i + 1], &top[i], (size_t)(2 - i) * sizeof top[0]);
                top[i] = t;
                break;
            }
        }
    }
    for (int i = 0; i < 3 && top[i] != GP_MAX_TAGS && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s %s", i ? ", " : "\n  top tags: ",
                              gp_tag_name((gp_tag)top[i]),
                              gp_fmt_bytes(p->tags[top[i]].allocated, b1, sizeof b1));
}

size_t gp_pool_oom_report(gp_pool *p, uint64_t requested, char *buf, size_t len)
{
    char tmp[1024];
    pthread_mutex_lock(&p->lock);
    gp_oom_report_locked(p, requested, tmp, sizeof tmp);
    pthread_mutex_unlock(&p->lock);
    if (len) snprintf(buf, len, "%s", tmp);
    return strlen(tmp);
}

const char *gp_pool_last_oom(gp_pool *p) { return p->last_oom; }

/* ---------------------------------------------------------------- history */

gp_status gp_pool_history(gp_pool *p, size_t max_entries, int stacks)
{
    gp_trace *fresh = NULL, *old;
    /* Under the lock: a resize copies the newest events of the old ring.
     * Not a hot path (a malloc and a copy of at most the ring). */
    pthread_mutex_lock(&p->lock);
    if (max_entries) {
        fresh = p->trace ? gp_trace_resized(p->trace, max_entries) : gp_trace_new(max_entries);
        if (!fresh) {
            pthread_mutex_unlock(&p->lock);
            return gp_error_set(GP_ERR_NOMEM,
                                "gpupool: out of host memory for a history of %zu events (%zu bytes each)",
                                max_entries, sizeof(gp_event));
        }
    }
    old = p->trace;
    p->trace = fresh;
    atomic_store_explicit(&p->history_stacks, fresh && stacks, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
    gp_trace_free(old);
    return GP_OK;
}

int gp_pool_history_stacks(const gp_pool *p)
{
    return atomic_load_explicit(&p->history_stacks, memory_order_relaxed);
}

void gp_pool_history_info(gp_pool *p, size_t *capacity, size_t *len, uint64_t *recorded)
{
    *capacity = *len = 0;
    *recorded = 0;
    pthread_mutex_lock(&p->lock);
    if (p->trace) gp_trace_info(p->trace, capacity, len, recorded);
    pthread_mutex_unlock(&p->lock);
}

size_t gp_pool_history_read(gp_pool *p, gp_event *out, size_t max)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->trace ? gp_trace_copy(p->trace, out, max) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

gp_status gp_pool_history_note(gp_pool *p, int action, uintptr_t addr, uint64_t size, gp_tag tag,
                               int priority)
{
    if (action < 0 || action >= GP_EV_COUNT || tag >= GP_MAX_TAGS || priority < 0 || priority > GP_PRIO_MAX)
        return gp_error_set(GP_ERR_INVALID, "gpupool: history note with bad action %d, tag %u or priority %d",
                            action, (unsigned)tag, priority);
    pthread_mutex_lock(&p->lock);
    GP_TRACE(p, action, addr, size, NULL, tag, priority);
    pthread_mutex_unlock(&p->lock);
    return GP_OK;
}
