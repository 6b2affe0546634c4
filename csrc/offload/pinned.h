/*
 * pinned.h -- where offloaded bytes live on the host: a pool of pinned
 * (page-locked) slabs from the backend's host_alloc, kept for the life of
 * the offloader (pinning costs about 1.6 GB/s: it must not sit on the
 * offload path once warm), capped by a host limit (GPUPOOL_HOST_LIMIT).
 *
 * Space is handed out as extents of a slab, 16-byte aligned, first fit;
 * a caller that can cut what it stores takes what a slab's tail has left
 * (gp_pinned_alloc_part) and shrinks it to a cut.  Freed extents
 * coalesce; slabs are never returned to the host while the store lives
 * (the next offload reuses them), except by gp_pinned_trim.
 *
 * Thread-safe (one mutex); never called with a pool lock held.
 */
#ifndef GP_PINNED_H
#define GP_PINNED_H

#include "backend.h"

typedef struct gp_pinned gp_pinned;

typedef struct gp_extent {
    void *ptr;       /* NULL: none */
    uint64_t size;
    uint32_t slab;
} gp_extent;

typedef struct gp_pinned_stats {
    uint64_t limit;      /* bytes the slabs may total (0: none)           */
    uint64_t slabs;      /* bytes of pinned slabs held                    */
    uint64_t used;       /* bytes in extents                              */
    uint64_t reserved;   /* bytes promised to offloads under way          */
    uint64_t n_pin;      /* slabs pinned, ever                            */
    double pin_seconds;  /* time spent pinning, ever                      */
} gp_pinned_stats;

/* A store over backend `be` whose slabs total at most `limit` bytes (0: no
 * limit), `slab` bytes each (a slab is at least as large as the largest
 * extent asked for). */
gp_status gp_pinned_create(gp_backend *be, uint64_t limit, uint64_t slab, gp_pinned **out);
/* Frees every slab: extents still held are lost. */
void gp_pinned_destroy(gp_pinned *hs);

/* Promise `bytes` to an offload about to start: GP_ERR_LIMIT (naming the
 * limit) when used + reserved + bytes would pass it.  Nothing is pinned
 * here: the extents taken under the promise pin slabs as they need them
 * (a compressed offload reserves the raw size and uses about two thirds of
 * it; pinning the whole promise made host RSS grow by the raw size), so
 * gp_pinned_alloc may still fail with GP_ERR_NOMEM (the host refuses to
 * pin) or, where holes too small strand room, GP_ERR_LIMIT.
 * gp_pinned_settle gives back what the offload did not use. */
gp_status gp_pinned_reserve(gp_pinned *hs, uint64_t bytes);
void gp_pinned_settle(gp_pinned *hs, uint64_t bytes);

/* An extent of `size` bytes (> 0, at most the slab size) from reserved
 * room: the reservation shrinks by `size`.  GP_ERR_LIMIT when the
 * reservation or the slabs hold too little room. */
gp_status gp_pinned_alloc(gp_pinned *hs, uint64_t size, gp_extent *out);
/* The same, but the extent may be shorter, down to `min` bytes, where the
 * first hole with room for that many is shorter than `size`: a caller that
 * can cut what it stores fills the slabs' tails instead of pinning another
 * slab.  out->size says how much it got (16-byte aligned). */
gp_status gp_pinned_alloc_part(gp_pinned *hs, uint64_t size, uint64_t min, gp_extent *out);
/* Keep only the first `size` bytes of `e` (none: `e` is gone), taken
 * under the reservation of an offload under way: the rest is free again
 * and back in the reservation. */
void gp_pinned_shrink(gp_pinned *hs, gp_extent *e, uint64_t size);
void gp_pinned_free(gp_pinned *hs, gp_extent *e);

/* Pin one more slab ahead of need when less than a slab is free, within the
 * limit (a caller's background thread calls it after an offload). */
void gp_pinned_grow_ahead(gp_pinned *hs);

void gp_pinned_stats_get(gp_pinned *hs, gp_pinned_stats *out);

/* The store's integrity, given every extent its callers hold (`ext`, n of
 * them, in address order), between offloads (nothing reserved): each lies
 * inside its slab and overlaps no other extent and no hole; the holes of
 * each slab are in order, apart, and add up to its free bytes; extents and
 * holes cover the slabs exactly; `used` is the extents' sum; the slabs are
 * within the limit.  Returns the number of problems (0: none), the first
 * described in msg (n bytes). */
size_t gp_pinned_check(gp_pinned *hs, const gp_extent *ext, size_t n_ext, char *msg, size_t n);

#endif /* GP_PINNED_H */
