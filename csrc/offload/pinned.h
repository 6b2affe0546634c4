/*
 * pinned.h -- where offloaded bytes live on the host: a pool of pinned
 * (page-locked) slabs (hostmem.h), kept for the life of the offloader
 * (pinning, even made fast, is slower than the copies: it must not sit on
 * the offload path once warm), capped by a host limit (GPUPOOL_HOST_LIMIT).
 * Slabs are pinned by threads of the store's own, in the background: an
 * extent is handed out at once and gp_pinned_ready waits for its slab.
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
    uint64_t pinning;    /* bytes of slabs queued or being pinned (one
                            whose pinning failed waits, in neither, for
                            the first copy into it to pin it)           */
    uint64_t used;       /* bytes in extents                              */
    uint64_t reserved;   /* bytes promised to offloads under way          */
    uint64_t n_pin;      /* slabs pinned, ever                            */
    uint64_t n_pin_late; /* ... of them by the copy that needed them: no
                            pinning thread had started on them          */
    double pin_seconds;  /* time spent pinning, ever                      */
} gp_pinned_stats;

/* A store over backend `be` whose slabs total at most `limit` bytes (0: no
 * limit), `slab` bytes each (a multiple of 2 MiB, at least as large as the
 * largest extent asked for), pinned by `threads` threads of its own. */
gp_status gp_pinned_create(gp_backend *be, uint64_t limit, uint64_t slab, unsigned threads, gp_pinned **out);
/* Cancels the pinning not started, waits for the slabs being pinned (a
 * few ms each), and frees every slab: extents still held are lost. */
void gp_pinned_destroy(gp_pinned *hs);

/* Promise `bytes` to an offload about to start: GP_ERR_LIMIT (naming the
 * limit) when used + reserved + bytes would pass it.  Nothing is pinned
 * here: the extents taken under the promise pin slabs as they need them
 * (a compressed offload reserves the raw size and uses about two thirds of
 * it; pinning the whole promise made host RSS grow by the raw size), so
 * gp_pinned_alloc may still fail with GP_ERR_NOMEM (no address space for
 * a slab) or, where holes too small strand room, GP_ERR_LIMIT, and
 * gp_pinned_ready with GP_ERR_NOMEM (the host refuses to pin).
 * gp_pinned_settle gives back what the offload did not use. */
gp_status gp_pinned_reserve(gp_pinned *hs, uint64_t bytes);
void gp_pinned_settle(gp_pinned *hs, uint64_t bytes);

/* An extent of `size` bytes (> 0, at most the slab size) from reserved
 * room: the reservation shrinks by `size`.  GP_ERR_LIMIT when the
 * reservation or the slabs hold too little room.  A slab added for it is
 * queued to be pinned, with one more while the reservation wants more
 * than is free; gp_pinned_ready before a copy. */
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

/* Wait until the slab of extent `e` is pinned (nothing to wait for when
 * e->ptr is NULL), pinning it on this thread where no pinning thread has
 * started on it: before the device copies into or out of `e`.  A failure
 * (the host refuses to pin, GP_ERR_NOMEM) is that of this call's second
 * attempt; the slab stays, unpinned, for the next one to try. */
gp_status gp_pinned_ready(gp_pinned *hs, const gp_extent *e);

/* Queue one more slab to be pinned when less than a slab is free beyond
 * the reservations, counting `spare` bytes the caller can free when asked
 * as free, within the limit (after an offload: the next finds it). */
void gp_pinned_grow_ahead(gp_pinned *hs, uint64_t spare);
/* Queue slabs to be pinned in the background until `bytes` are free in
 * them, at most the reservations and two slabs per pinning thread: an
 * offload that learns its host bytes as it goes (a compressed one takes
 * its extents piece by piece) asks for those it expects next, so that
 * slabs are pinned while the ones before are copied into. */
void gp_pinned_ahead(gp_pinned *hs, uint64_t bytes);
/* Queue slabs to be pinned in the background until `bytes` are free beyond
 * the reservations, `spare` of them (bytes the caller can free when asked)
 * counted as free, as far as the limit allows (no error past it): host
 * memory made ready before an offload needs it.  Returns at once. */
void gp_pinned_prepare(gp_pinned *hs, uint64_t bytes, uint64_t spare);

/* Bytes free in the slabs (pinned or queued) beyond the reservations. */
uint64_t gp_pinned_room(gp_pinned *hs);

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
