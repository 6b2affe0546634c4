/*
 * pool.h -- the pool's insides, shared by the files of the pool layer and by
 * nothing above it (module.c sees gpupool.h only):
 *   pool.c    the core: block headers, the pointer hash, split and merge,
 *             mapping, trim, growth, alloc/free, limits, create/destroy
 *   stream.c  streams, record_stream events, CUDA graph capture
 *   stats.c   walks, statistics, the OOM report, the history's API
 *   check.c   gp_pool_check, the integrity checker
 *   bins.h    blocks and the TLSF bins
 *
 * Every byte of an arena belongs to exactly one block, in address order:
 *   USED            handed out, in the pointer hash
 *   FREE            mapped and free, in the bins of the stream it was used on
 *   PENDING         freed, waiting for record_stream events; in no bin
 *   FREE_UNMAPPED   no physical memory behind it, in the arena's unmapped bins
 * Mapped/unmapped boundaries fall on chunk boundaries, so an unmapped block
 * starts and ends on one.  Neighbours merge when both are free with the same
 * stream, or both unmapped (never across the long-lived region's start).
 * Hence reserved = sum(USED) + sum(FREE) + sum(PENDING) and
 * allocated = sum(USED).
 *
 * Functions here that take a pool expect its lock held, unless they say
 * otherwise.
 */
#ifndef GP_POOL_H
#define GP_POOL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend.h"
#include "bins.h"
#include "trace.h"

#define GP_MAX_SIZE (1ull << 48)
#define GP_MAX_STREAMS 64
/* Streams a fence may name: the slots', and those record_stream named. */
#define GP_FENCE_STREAMS (GP_MAX_STREAMS + 64)
#define GP_OWED_PIECES 32
/* Block headers are allocated this many at a time (a slab). */
#define GP_SLAB_BLOCKS 256

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
    /* An offload took some of its blocks (live or free) since a replay's
     * question (gp_pool_capture_away) last found none away. */
    int away;
    /* The tags its captures allocated under: an offload of any of them
     * takes the pool's free blocks too (pool_offload.c), since every replay
     * needs them mapped at their addresses. */
    uint64_t tags[GP_MAX_TAGS / 64];
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

    uint64_t window_peak; /* highest `allocated` since gp_pool_window_peak reset it */
    uint64_t mapping;   /* bytes a plan maps now, outside the lock: counted
                           in reserved (the limit holds), not yet in the
                           chunk table (gp_pool_plan_map)                */
    /* Which cache no stream can still be using, known without a device
     * sync (gp_trim_idle): each block that comes to the bins takes the
     * next free_seq, and those with freed <= idle_seq are idle.  idle_ev:
     * a fence (gp_fence_locked: an event on each stream it knows) recorded when
     * free_seq was fence_seq; n_idle_ev 0: none pending. */
    uint64_t free_seq, idle_seq, fence_seq;
    uint64_t idle_ev[GP_FENCE_STREAMS];
    size_t n_idle_ev;
    gp_rec *recs;       /* record_stream: live and pending blocks */
    unsigned n_recs, n_pending;
    size_t cap_recs;

    gp_gpool gpools[GP_MAX_GPOOLS];
    unsigned n_capturing; /* streams capturing into a graph pool now */

    gp_block **buckets; /* USED blocks by address, chained through fnext */
    uint64_t hmask, hcount;

    gp_block *spare;    /* free block headers */
    uint64_t held;      /* headers trims and refills in transit keep for their cut (gp_detached.spare) */
    /* While a growth trims cache beyond the slack, the address of the free
     * block it will extend (0: none): the trims pass the block holding it
     * by (gp_trim_cached), as unmapping its last chunks would only have
     * the growth map them again, after a wait for the streams if they were
     * freed lately. */
    uintptr_t growing_from;
    void **slabs;
    size_t n_slabs, cap_slabs;

    gp_stats st;
    gp_tag_stats tags[GP_MAX_TAGS];
    uint64_t prio_alloc[GP_PRIO_MAX + 1], prio_peak[GP_PRIO_MAX + 1];

    gp_pressure_fn pressure;
    void *pressure_arg;
    /* Offloads under way (plans begun and not ended) and background ones
     * queued (gp_pool_releasing): memory that goes back to the device
     * soon, which a request that found no room waits for through the
     * pressure callback. */
    unsigned n_releasing;
    /* Cache a restore gave back to stay under the peak (gp_trim_slack_unlocked)
     * is owed to the phase that follows, which would map it again on the
     * thread that allocates: an offload that gives memory back maps it in
     * its place first, on the offloader's thread (gp_refill_unlocked), at
     * the addresses it had (the largest pieces taken, as many as fit here),
     * so that the cache is laid out as the phase left it.  A growth pays
     * the debt down (what it mapped was the phase's own), a trim asked for
     * or a request under pressure cancels it. */
    struct {
        uint64_t bytes; /* still owed, at most the pieces' sum */
        unsigned n;
        struct gp_owed_piece {
            uintptr_t addr;
            uint64_t len;
            uint8_t arena, sidx, prio;
        } piece[GP_OWED_PIECES];
    } owed;
    unsigned n_asking;  /* requests in the pressure callback now: no refill takes their room */
    char last_oom[GP_OOM_REPORT_MAX];

    /* The history (trace.c), NULL while off: every event site tests it,
     * under the lock.  history_stacks mirrors "on, with stacks" for
     * gp_pool_history_stacks, which reads it without the lock. */
    gp_trace *trace;
    _Atomic int history_stacks;

    /* Every pool of the process, for the fork handlers (pool.c). */
    gp_pool *all_prev, *all_next;
    /* The process and fork generation it was made in: in the child of a
     * fork it belongs to the parent (gp_pool_usable). */
    unsigned fork_gen;
    int pid;

    uint64_t debug_ops; /* GPUPOOL_DEBUG: allocations and frees counted */
};

/* Record an event in the history if it is on (the lock is held). */
#define GP_TRACE(p, action, addr, size, stream, tag, prio)                        \
    do {                                                                          \
        if ((p)->trace) gp_trace_add((p)->trace, action, addr, size, stream, tag, prio); \
    } while (0)

static inline uint64_t gp_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Incremented in the child of every fork(): a pool made before it is its
 * parent's, whose device memory the child cannot use. */
extern atomic_uint gp_fork_generation;
gp_status gp_forked_error(const gp_pool *p);

/* GP_OK, or the error of a pool used in a forked child: what every entry
 * point that changes the pool or calls its backend asks first (a load and
 * a compare, no syscall: the hot path runs it). */
static inline gp_status gp_pool_usable(const gp_pool *p)
{
    if (__builtin_expect(p->fork_gen == atomic_load_explicit(&gp_fork_generation, memory_order_relaxed), 1))
        return GP_OK;
    return gp_forked_error(p);
}

static inline uint64_t gp_chunk_index(const gp_arena *a, uintptr_t addr)
{
    return (addr - a->base) / a->chunk;
}

static inline void gp_peak(uint64_t *cur, uint64_t *peak, uint64_t add)
{
    *cur += add;
    if (*cur > *peak) *peak = *cur;
}

/* `allocated` grows by `add`: its peaks, the pool's and the window's. */
static inline void gp_allocated_grows(gp_pool *p, uint64_t add)
{
    gp_peak(&p->st.allocated, &p->st.allocated_peak, add);
    if (p->st.allocated > p->window_peak) p->window_peak = p->st.allocated;
}

static inline uint64_t gp_hash(const gp_pool *p, uintptr_t a)
{
    /* Fibonacci hashing of the 512-byte unit number: consecutive blocks land
     * far apart, so the chains stay short. */
    return ((a >> GP_ALIGN_LOG2) * 0x9E3779B97F4A7C15ull >> 20) & p->hmask;
}

static inline gp_block *gp_hash_find(const gp_pool *p, uintptr_t a)
{
    for (gp_block *b = p->buckets[gp_hash(p, a)]; b; b = b->fnext)
        if (b->addr == a) return b;
    return NULL;
}

static inline gp_bins *gp_bins_of(gp_arena *a, const gp_block *b)
{
    return b->state == GP_BLOCK_FREE_UNMAPPED ? &a->unmapped[b->life] : a->bins[b->sidx];
}

/* ------------------------------------------------ pool.c: blocks and memory */

/* Make sure `n` block headers are spare, so that the next n splits cannot
 * fail: a change of several blocks then never fails half-way.  It holds
 * only while the lock is: after dropping it (the pressure callback) a
 * caller reserves again.  gp_new_block takes a spare header, refilling the
 * list if empty, and returns NULL (error set) if the host has no memory. */
gp_status gp_reserve_headers(gp_pool *p, int n);
/* The same for any n, refilling as many slabs as it takes. */
gp_status gp_spare_at_least(gp_pool *p, size_t n);
gp_block *gp_new_block(gp_pool *p);
/* b (in no bin) becomes free: merged with its free neighbours and binned. */
gp_block *gp_insert_free(gp_pool *p, gp_arena *a, gp_block *b);
/* Cut b (in no bin) after `size` bytes; returns the tail (in no bin). */
gp_block *gp_split(gp_pool *p, gp_block *b, uint64_t size);
/* Map [addr, addr+len) of arena a chunk by chunk (all or nothing, but for
 * chunks whose unmap failed in the rollback: the mapped prefix they keep is
 * *kept bytes long, and stays mapped and counted); unmap from addr,
 * returning the bytes unmapped (less than len only if the backend failed).
 * Both keep reserved, the chunk table and the history. */
gp_status gp_map_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len, uint64_t *kept);
uint64_t gp_unmap_range(gp_pool *p, gp_arena *a, uintptr_t addr, uint64_t len);
/* Give back at least `want` bytes of cached chunks of priority <= max_prio
 * (arena `only`, or all when NULL), after the pool's streams have run
 * (gp_quiesce_locked); returns the bytes released. */
uint64_t gp_trim_in(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio);
/* The same without a wait: only cache known idle (a fence recorded after
 * it was freed has completed). */
uint64_t gp_trim_idle(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio);
/* The pool's streams (or the device) were waited for with the lock held:
 * every block in the bins is idle. */
void gp_idle_synced(gp_pool *p);
/* Idle cache first (gp_trim_idle), then the rest after a wait (gp_trim_in). */
uint64_t gp_trim_first_idle(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio);
/* Before `need` bytes are mapped for `size` bytes of live blocks: give
 * back cache of priority <= prio (arena `only`, or all when NULL) beyond
 * GPUPOOL_CACHE_SLACK of what will be allocated then, or beyond `floor`
 * reserved bytes if that is more; at most `most`.  Idle cache first;
 * then, where `sync`, after a wait for the pool's streams under the lock
 * (gp_quiesce_locked).  Returns the bytes still over. */
uint64_t gp_trim_slack(gp_pool *p, const gp_arena *only, uint64_t need, uint64_t size, int prio, uint64_t floor,
                       uint64_t most, int sync);
/* gp_trim_slack for a caller that holds no lock (transit.c): the unmaps,
 * and the wait for the pool's streams where idle cache is short, run
 * without the pool's lock (other threads allocate meanwhile); after the
 * wait, what was cached when it began is trimmed.  A restore's: what it
 * gives back is owed (gp_pool.owed). */
void gp_trim_slack_unlocked(gp_pool *p, uint64_t need, uint64_t size, int prio, uint64_t floor, uint64_t most);
/* Give back `want` bytes of cache of priority <= prio toward the limit
 * the same way; the lock is held on entry and on return, and let go
 * meanwhile (the caller decides afresh).  Returns the bytes released. */
uint64_t gp_trim_unlocked(gp_pool *p, uint64_t want, int prio);
/* Trims whose driver calls run without the lock (transit.c): chunks of
 * cache taken out as a TRANSIT block, with what it was before. */
typedef struct gp_detached {
    gp_block *b;            /* the TRANSIT block                           */
    gp_block *spare;        /* a header for gp_trim_settle's cut           */
    uint64_t freed, done;   /* b's free_seq; bytes unmapped from its start */
    unsigned tried;         /* unmap calls made                            */
    uint8_t sidx, prio;
} gp_detached;
typedef struct gp_detach_list {
    gp_detached *d;
    size_t n, cap;
} gp_detach_list;
/* Refills (transit.c): [addr, addr+len) of unmapped block u (in its bins,
 * whole chunks) taken out as a TRANSIT block d->b, its bytes counted
 * in reserved (the limit holds) while mapped without the lock; settled
 * with the lock, given the handles of the d->done bytes mapped: they
 * become cache of slot d->sidx, the rest unmapped space again.  Detach
 * returns 0 when headers are short. */
int gp_fill_detach(gp_pool *p, gp_arena *a, gp_block *u, uintptr_t addr, uint64_t len, unsigned sidx, int prio,
                   gp_detached *d);
void gp_fill_settle(gp_pool *p, gp_detached *d, const uint64_t *handles);
/* Map again up to `room` bytes of the cache owed (gp_pool.owed), chunk by
 * chunk without the lock (held on entry and on return), within the limit
 * and never while a request is in the pressure callback.  Returns the
 * bytes mapped. */
uint64_t gp_refill_unlocked(gp_pool *p, uint64_t room);
/* gp_trim_in's selection without the sync; with `out`, detached into it
 * rather than unmapped (see pool.c). */
uint64_t gp_trim_cached(gp_pool *p, const gp_arena *only, uint64_t want, int max_prio, uint64_t upto,
                        gp_detach_list *out);
/* Unmap a detached block (no lock needed: it is the caller's), then, with
 * the lock, make it unmapped space (what failed to go: cache again). */
void gp_trim_unmap(gp_pool *p, gp_detached *d);
void gp_trim_settle(gp_pool *p, gp_detached *d);
/* Learn what cache is idle without waiting (a completed fence), and
 * record a new fence where blocks came to the bins since. */
void gp_idle_refresh(gp_pool *p);
/* The cache gp_trim_slack would give back (0 when none is over). */
uint64_t gp_slack_over(const gp_pool *p, uint64_t need, uint64_t size, uint64_t floor, uint64_t most);
/* The lowest priority >= min of cache in arena `only` (NULL: all), at
 * least a chunk long when `whole`; GP_PRIO_MAX + 1 if none. */
int gp_cache_level(const gp_pool *p, const gp_arena *only, int min, int whole);
/* Merge free neighbours of different streams (the device is idle). */
void gp_coalesce_idle(gp_pool *p, gp_arena *a);
/* Map so that a free block of `size` exists on slot sidx; returned removed
 * from its bins, or NULL with *st set. */
gp_block *gp_grow(gp_pool *p, gp_arena *a, unsigned sidx, uint64_t size, int prio, gp_status *st);
/* The arena holding address x, the block containing it (slow: a walk). */
gp_arena *gp_arena_of(gp_pool *p, uintptr_t x);
gp_block *gp_block_at(gp_arena *a, uintptr_t x);
/* Explain why ptr is not a live block start (error path); sets the error. */
gp_status gp_bad_pointer(gp_pool *p, const void *ptr, const char *what);

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

/* ------------------------------------------- stream.c: streams and capture */

/* The slot of stream s for blocks of lifetime `life` (made on first use). */
gp_status gp_slot_of(gp_pool *p, gp_stream s, unsigned life, unsigned *out);
gp_status gp_stream_index(gp_pool *p, gp_stream s, unsigned *out);
/* record_stream: give back the pending blocks whose events completed (no
 * host wait: a driver call per event, so only off the hot path -- a miss,
 * a trim); b, with recorded streams, is freed. */
void gp_poll_pending(gp_pool *p);
void gp_free_recorded(gp_pool *p, gp_block *b);
/* Synchronise the device (counted in n_sync); then every pending block is
 * safe and goes back to the bins. */
gp_status gp_sync_locked(gp_pool *p);
/* What a trim waits for before it gives cache back: the pool's own
 * streams (gp_fence_locked: the last users of every block in the bins and
 * of every pending one) have run what was queued on them, so that every
 * block in the bins is idle and every pending one goes back to them.  A
 * device sync would also wait for the streams of others -- the
 * offloader's copies beside a training step, a user's copier -- with the
 * lock held.  It is one where no fence can be had (a capture under way,
 * an event refused, a pending block whose events could not be recorded)
 * or a wait fails.  Counted in n_sync_pool, or n_sync for a device sync. */
gp_status gp_quiesce_locked(gp_pool *p);
/* The same in two steps, for a caller that waits without the lock:
 * gp_fence_begin (lock held) records the fence into events[0..*n),
 * GP_FENCE_STREAMS of room, and returns whether it could (0: the finish
 * syncs the device); gp_fence_finish (no lock needed) waits for the
 * events and releases them, or syncs the device, *synced saying which. */
int gp_fence_begin(gp_pool *p, uint64_t *events, size_t *n);
gp_status gp_fence_finish(gp_backend *be, uint64_t *events, size_t n, int fenced, int *synced);
/* Whether a pending block of priority <= max_prio exists (a sync would
 * turn it into cache that priority may release). */
int gp_pending_upto(const gp_pool *p, int max_prio);
/* An event on each stream the pool knows (its slots', those record_stream
 * named), at most cap: gp_pool_fence with the lock held.  None (and an
 * error) while a graph captures or when one cannot be recorded. */
gp_status gp_fence_locked(gp_pool *p, uint64_t *events, size_t cap, size_t *n);
/* The record_stream record of live block b goes (b is freed while
 * offloaded: no stream can use memory that is not there). */
void gp_rec_forget(gp_pool *p, gp_block *b);
/* While a capture is underway: the graph pool slot an allocation on stream
 * s goes to (*slot -1: none), and a free block for it. */
gp_status gp_capture_route(gp_pool *p, gp_stream s, int *slot);
gp_block *gp_capture_find(gp_pool *p, gp_arena **ap, unsigned slot, unsigned sidx, uint64_t size);

/* ------------------------------------------------------- check.c: integrity */

/* GPUPOOL_DEBUG: gp_pool_check under the held lock; if the pool is corrupt,
 * print the first violation on stderr and abort. */
void gp_debug_check(gp_pool *p);

/* Count an allocation or free; every GP_DEBUG_EVERY, check (debug only: one
 * branch otherwise). */
static inline void gp_debug_tick(gp_pool *p)
{
    if (__builtin_expect(p->cfg.debug, 0) && ++p->debug_ops % GP_DEBUG_EVERY == 0) gp_debug_check(p);
}

/* ------------------------------------------------ pool_offload.c: offload */

/* gp_free of a live block whose memory is offloaded: it becomes a free
 * piece of its run (FREE_OFFLOADED) until the run is restored. */
void gp_free_offloaded(gp_pool *p, gp_block *b);

/* ------------------------------------------------------- stats.c: reports */

void gp_info_of(const gp_pool *p, const gp_block *b, gp_block_info *o);
/* segments, free_blocks and largest_free of *o, by walking the arenas. */
void gp_scan_locked(gp_pool *p, gp_stats *o);
void gp_oom_report_locked(gp_pool *p, uint64_t requested, char *buf, size_t len);

#endif /* GP_POOL_H */
