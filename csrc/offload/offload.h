/*
 * offload.h -- moving the memory of tags to the host and back at the same
 * addresses (issue 15; the pool's part is gp_pool_offload_* in gpupool.h).
 *
 * An offloader serves one pool.  gp_offload_tags copies the live blocks of
 * some tags to pinned host memory and gives their physical chunks back to
 * the device; gp_restore_tags maps fresh chunks at the same addresses and
 * copies the bytes back, so every pointer into them (every tensor) stays
 * valid.  The copies run in slices on two streams of the backend's own; a
 * chunk is unmapped as soon as the copies out of it have completed, and on
 * restore chunks are mapped ahead of the copies into them, on worker
 * threads.  Each piece has a checksum, computed on the device before it
 * leaves and again after it came back (checksum.h): a mismatch leaves the
 * memory offloaded and names the tag.
 *
 * A restore keeps its host copy (clean) where every piece of it was checked
 * on the way back: the next offload of the same tags, whose blocks lie
 * where they did, sums them on the device and, where every sum is as it
 * was, takes that copy and only gives the chunks back -- nothing crosses
 * the bus (frozen weights streamed, a model switched out again).  Any
 * change copies as before, and a tag found written keeps no copy for its
 * next few restores (memory written every step pays the check rarely).
 * A compressed copy is taken where the codec asked is "auto" or its own
 * (raw asked restores without codec kernels); a raw one whatever is asked.
 * Clean copies hold only room the pinned store holds anyway: an offload
 * that needs room takes theirs, the oldest first, before pinning more.
 *
 * Failure leaves things whole: an offload that fails half way (host limit,
 * a device error) maps back what it had released and copies it back, so
 * the tags are resident as before; a restore that fails (device full after
 * asking lower-priority idle tags to make room, a checksum mismatch) gives
 * back what it had mapped, so the tags stay offloaded and their bytes safe
 * on the host.
 *
 * Host memory is pinned ahead where it can be: when a tag becomes
 * offloadable its live bytes (and GPUPOOL_HOST_RESERVE's, at start) are
 * pinned in the background, within the host limit; an offload's own slabs
 * are pinned on several threads while the first are copied into.
 *
 * Offloadable tags (gp_offload_register) are what the pool's pressure
 * callback may offload on its own: when an allocation of priority P finds
 * the device or the limit full, idle registered tags of priority below P
 * are offloaded, the lowest priority first, then the one whose next use
 * is farthest (predicted from the gaps between its uses: the least
 * recently used where it has no pattern yet), until enough was released.
 * A tag is busy between gp_offload_use(tag, 1) and gp_offload_use(tag, 0)
 * (the Python hooks mark a module's forward, an optimizer's step) and is
 * never offloaded then.
 *
 * Every call may block (device synchronisation, copies); none may be made
 * with the pool's lock held or from inside a pool callback other than the
 * pressure callback it installs.  Calls are serialised per offloader.
 */
#ifndef GP_OFFLOAD_H
#define GP_OFFLOAD_H

#include "gpupool.h"

typedef struct gp_offloader gp_offloader;

/* An offloader for `pool` (which must outlive it): host memory capped at
 * `host_limit` bytes (0: none), `threads` worker threads (1..64), nvCOMP
 * looked for at `nvcomp` first (GPUPOOL_NVCOMP; NULL or "": search).  It
 * takes 1 MiB of the pool (tag "gpupool") for its checksums, and on the
 * first compressed offload up to 160 MiB more for the codecs' staging,
 * kept until it goes; it installs itself as the pool's pressure callback. */
gp_status gp_offloader_create(gp_pool *pool, uint64_t host_limit, unsigned threads, const char *nvcomp,
                              gp_offloader **out);
/* Restores nothing: memory still offloaded is lost (its addresses stay
 * reserved in the pool until the pool goes).  Removes the callback. */
void gp_offloader_destroy(gp_offloader *o);

typedef struct gp_offload_opts {
    int keep;           /* 0: drop the contents (restored memory is
                           uninitialised: a cache to recompute)          */
    int codec;          /* a gp_codec_id (codec.h); GP_CODEC_RAW is 0      */
    unsigned elem_size; /* the data's element size, for the codec (2 for
                           bf16/fp16, 4 for fp32; 0: unknown)           */
    const uint64_t *fence; /* events (gp_pool_fence) the memory's users
                              reach when done with it: waited for instead
                              of a fence taken when the offload starts
                              (NULL); a background offload's is taken by
                              its caller                                  */
    size_t n_fence;
    uint64_t most;      /* the first live blocks of the tags (address
                           order) until they hold this many bytes; 0: all
                           (gp_pool_offload_begin_upto)                  */
    int refill;         /* the memory given back maps again, in its place,
                           the cache the pool's last restore gave back
                           (gp_offload_plan.refill)                     */
} gp_offload_opts;

/* What one offload or restore did. */
typedef struct gp_offload_result {
    uint64_t bytes;      /* bytes of live blocks that moved (offloaded or
                            restored), whole blocks                         */
    uint64_t copied;     /* bytes copied over PCIe (the blocks' parts in
                            released chunks; 0 when contents are dropped,
                            and when an offload took the clean host copy
                            of its last restore)                           */
    uint64_t host_bytes; /* host bytes they take (offload) or took         */
    uint64_t released;   /* device bytes unmapped (offload) or mapped      */
    uint64_t kept;       /* offload: bytes of the tags' live blocks that
                            stay on the device (chunks shared with other
                            live memory)                                   */
    double seconds;      /* wall time of the call                          */
    int codec;           /* the gp_codec_id used (raw when compressing did
                            not pay, or the staging found no room)          */
    uint64_t lost;       /* restore: bytes that came back uninitialised, as
                            an offload that failed and could not be undone
                            reported (the device refused the copies)        */
} gp_offload_result;

/* Offload the live blocks of `tags` (any number; a tag named twice counts
 * once), as one record: a restore of any of them brings back all of them.
 * GP_ERR_LIMIT when the host limit
 * cannot hold them, GP_ERR_INVALID for a bad tag or while a graph captures,
 * GP_ERR_BACKEND for a device error; in every failure the tags are resident
 * as before.  Offloading a tag whose memory is already offloaded offloads
 * only its blocks made since. */
gp_status gp_offload_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, const gp_offload_opts *opts,
                          gp_offload_result *res);

/* gp_offload_tags on the offloader's background thread: returns once it
 * is queued (GP_ERR_INVALID for a bad tag or codec, GP_ERR_NOMEM).  The
 * caller goes on while the copies run (the optimizer hook offloads so,
 * behind the step, while the next forward is queued).  Restores and
 * prefetches wait for every background offload queued before them; a
 * failure leaves the tags resident and is reported by the next restore. */
gp_status gp_offload_tags_background(gp_offloader *o, const gp_tag *tags, size_t n_tags,
                                     const gp_offload_opts *opts);

/* Restore every offload that holds one of `tags` (an offload of several
 * tags at once comes back whole).  Waits for a prefetch of them under way
 * and for the background offloads queued (reporting a failure of one).
 * To make room it releases cached chunks of any priority (what comes back
 * was live when displaced; cache is nobody's data), then offloads idle
 * registered tags of the restored memory's priority or lower, the lowest
 * and then the one needed farthest ahead first -- never one of `tags`: tags
 * that cannot be on the device together fail with GP_ERR_OOM instead of
 * displacing each other.  GP_ERR_OOM (after trying
 * to make room) or GP_ERR_LIMIT when the device cannot hold them;
 * GP_ERR_BACKEND for a device error or a checksum mismatch (named); the
 * memory of that offload then stays offloaded (the tags' offloads
 * restored before it stay restored: each comes back whole or not at all).
 * An offload whose failure lost bytes of blocks still live (the failed
 * offload's message counts them) is restored only with `accept_loss`
 * (those bytes come back uninitialised, and res->lost counts them);
 * without it the restore fails with GP_ERR_BACKEND naming the tag and the
 * bytes, and the memory stays offloaded.  When it returns GP_OK, no memory of `tags` is offloaded.
 * Restoring tags that are not offloaded does nothing. */
gp_status gp_restore_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags, int accept_loss,
                          gp_offload_result *res);

/* Start restoring `tags` on a worker thread and return once it is queued
 * (after the background offloads queued before it have run); a later
 * gp_restore_tags waits for it, and where it failed (the memory stays
 * offloaded) tries again and reports its own failure.  An offload that
 * lost bytes is left to a restore (which may accept the loss). */
gp_status gp_prefetch_tags(gp_offloader *o, const gp_tag *tags, size_t n_tags);

/* Make `tag` offloadable under pressure, at `priority` (its memory's:
 * lower goes first); 0 <= priority <= GP_PRIO_MAX, or -1 to unregister.
 * `elem_size` is the dtype hint its offloads under pressure compress with. */
gp_status gp_offload_register(gp_offloader *o, gp_tag tag, int priority, unsigned elem_size);
/* Keep `bytes` of host memory pinned ahead of offloads (GPUPOOL_HOST_RESERVE),
 * within the host limit: pinned in the background from now on (returns
 * at once); offloads use these slabs first.  Registering a tag offloadable
 * does the same for the live bytes of the offloadable tags. */
void gp_offload_reserve_host(gp_offloader *o, uint64_t bytes);

/* Mark `tag` in use (busy != 0: never offloaded under pressure from its
 * return on; a pressure offload of it under way is waited for, so that a
 * restore after it leaves the tag on the device) or idle (its last use is
 * now). */
gp_status gp_offload_use(gp_offloader *o, gp_tag tag, int busy);

/* Offload idle registered tags of priority below `below`, the lowest
 * first, then the one needed farthest ahead, until `needed` bytes were released
 * (the pressure callback does this for the pool; the tenant registry asks
 * it for other processes), after waiting for the background offloads
 * queued.  Returns the bytes it released; 0 when called from within an
 * offload or restore of the same thread. */
uint64_t gp_offload_reclaim(gp_offloader *o, uint64_t needed, int below);
/* Bytes of idle registered tags still on the device (what a reclaim could
 * offload now) and of live memory offloaded now. */
void gp_offload_figures(gp_offloader *o, uint64_t *offloadable, uint64_t *offloaded);

/* Figures of the offloader, one X(field) each: the member of
 * gp_offload_stats and the key of offload_stats()'s dict. */
#define GP_OFFLOAD_STATS_FIELDS(X)                                              \
    X(host_bytes)  /* bytes of offloaded data on the host now */               \
    X(host_slabs)  /* pinned host memory held (slabs) */                       \
    X(host_pinning) /* host slabs being pinned in the background */          \
    X(host_limit)                                                              \
    X(n_offload)   /* calls that moved memory out */                           \
    X(n_restore)   /* ... and back */                                          \
    X(n_pressure)  /* offloads made by the pressure callback */                \
    X(bytes_out)   /* bytes copied out, ever */                                \
    X(bytes_in)    /* bytes copied back, ever */                               \
    X(n_pin)       /* slabs pinned, ever */                                   \
    X(n_pin_late)  /* ... by the copy that needed them (pinning ahead was late) */ \
    X(clean_bytes) /* host bytes of restored memory kept for its next offload */ \
    X(n_clean)     /* offloads that found that copy current: copied nothing */

typedef struct gp_offload_stats {
#define GP_OFFLOAD_STAT_MEMBER(field) uint64_t field;
    GP_OFFLOAD_STATS_FIELDS(GP_OFFLOAD_STAT_MEMBER)
#undef GP_OFFLOAD_STAT_MEMBER
    uint64_t tag_host_bytes[GP_MAX_TAGS]; /* host bytes per tag now       */
} gp_offload_stats;

void gp_offload_stats_get(gp_offloader *o, gp_offload_stats *out);

/* A whole pool out and back (a tenant swapped out while parked, arbiter.h).
 * gp_offload_swap_out offloads every live block of the pool that is on
 * the device (every tag but the offloader's own, with the codec named
 * `codec` (NULL: auto) where it pays and raw where not), after waiting for all work of the
 * device, and returns the swap's id in *id (> 0) once it is done: the
 * memory it released is unmapped.  Memory offloaded before, by the user,
 * is not part of it, and comes back only when the user restores it.  On
 * failure (host limit: GP_ERR_LIMIT; a device error) what it had
 * offloaded is restored and *id is 0; where the device refuses that too,
 * *id names the swap all the same and res->released counts the device
 * bytes still away (the error says so): the pool is swapped out until
 * gp_offload_swap_in brings it back.
 * gp_offload_swap_in restores every offload the swap made, at the same
 * addresses, displacing nothing; on failure what came back stays back,
 * the rest stays swapped (call it again).  Bytes a failed swap out lost
 * never come back by it: it fails naming them until the blocks that held
 * them are freed.  Each fills res with its sums. */
gp_status gp_offload_swap_out(gp_offloader *o, const char *codec, uint32_t *id, gp_offload_result *res);
gp_status gp_offload_swap_in(gp_offloader *o, uint32_t id, gp_offload_result *res);
/* Pin host memory in the background until `bytes` are free for offloads
 * (within the host limit; returns at once): a tenant that may be swapped
 * keeps room for its swap ready, so that its first swap does not pin. */
void gp_offload_prepare(gp_offloader *o, uint64_t bytes);

/* Whether `tag` has memory offloaded now (any offload holding it). */
int gp_offload_is_offloaded(gp_offloader *o, gp_tag tag);

/* The offloader's integrity check (as gp_pool_check is the pool's): every
 * record in a known state, its runs offloaded in the pool and its pieces
 * inside them, in order and apart; every stored piece in extents of the
 * pinned store that lie in its slabs and overlap no other; the figures
 * (host bytes per tag and in all) the sums of the records'; the store's
 * bytes within its limit.  Returns the number of problems found (0: none),
 * the first described in msg (n bytes).  Takes the offloader's locks:
 * call it between operations, not from a pool callback. */
size_t gp_offload_check(gp_offloader *o, char *msg, size_t n);

/* For tests: flip one stored byte of the newest offload holding `tag`, as
 * a failing host DIMM would (GP_ERR_INVALID if it has no stored bytes). */
gp_status gp_offload_corrupt_for_test(gp_offloader *o, gp_tag tag);

#endif /* GP_OFFLOAD_H */
