/*
 * bins.h -- blocks and the two-level segregated-fit bins that hold the free
 * ones (TLSF, as in the reference implementation): O(1) insert, remove and
 * good-fit search with one bitmap per level.  Header-only because the hot path
 * (every gp_alloc and gp_free) runs through these few lines.
 */
#ifndef GP_BINS_H
#define GP_BINS_H

#include <stdint.h>

#define GP_ALIGN 512u
#define GP_ALIGN_LOG2 9
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
    /* While free: p->free_seq when it last came to the bins.  A trim
     * without a device sync releases it once a fence recorded after that
     * has completed (gp_trim_idle). */
    uint64_t freed;
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

static inline void gp_bins_insert(gp_bins *b, gp_block *blk)
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

static inline void gp_bins_remove(gp_bins *b, gp_block *blk)
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
static inline gp_block *gp_bins_find(const gp_bins *b, uint64_t size)
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

#endif /* GP_BINS_H */
