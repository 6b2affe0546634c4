/*
 * arbiter.h -- several processes on one device: the tenant registry and the
 * reclaim protocol (DESIGN.md, "Overcommit across processes").
 *
 * Processes that set the same group (GPUPOOL_TENANT) on the same device
 * register as tenants in a POSIX shared-memory registry,
 * /gpupool.<device>.<group>, this user's alone (mode 0600; any other is
 * refused): pid, program name (never its arguments), priority, quota, bytes
 * held (mapped), cached, offloadable and offloaded, bytes wanted, heartbeat,
 * counters, each checked before anything sums them.  A
 * robust process-shared mutex guards it: a tenant killed while holding it
 * wedges nobody (the next locker repairs), and entries of dead processes
 * are reclaimed.  No group, no registry, no cost.
 *
 * Enforcement is a backend adaptor (gp_backend_arbiter_wrap): every map()
 * of the pool asks the registry for its bytes first -- within the group's
 * device limit (GPUPOOL_DEVICE_LIMIT) and leaving what tenants ahead of it
 * announced they are waiting for -- and unmap() gives them back.  A map the
 * registry refuses is GP_ERR_OOM, which the pool answers as it answers a
 * full device (it releases its own cache, then fails).
 *
 * The protocol: a tenant whose allocation fails (gp_arbiter_alloc) posts
 * what it wants, asks lower-priority tenants -- the lowest first, then the
 * largest -- to give memory back (cache and idle offloadable memory), and
 * equal-priority ones to give their cache, then waits for the memory up to
 * GPUPOOL_RECLAIM_TIMEOUT, retrying.  Asked tenants answer at their next
 * allocator call (one relaxed atomic load on the hot path: gp_arbiter_poll)
 * or at a yield point, by running their reclaim callback without any lock
 * held.  Waiting tenants queue: higher priority first, then the oldest
 * want, so no tenant of a priority waits behind newer ones of the same.
 *
 * Threads: every function may be called from any thread.  Lock order: the
 * pool's lock, then the registry's; the reclaim callback runs with
 * neither.
 */
#ifndef GP_ARBITER_H
#define GP_ARBITER_H

#include "backend.h"
#include "offload.h"

#define GP_ARB_SLOTS 64       /* tenants of one group on one device */
#define GP_ARB_NAME_MAX 48    /* a tenant's name, with its NUL       */
#define GP_ARB_DEVICE_MAX 64  /* a device id, with its NUL           */
#define GP_ARB_LAT 32         /* reclaim latencies kept per tenant   */

typedef struct gp_arbiter gp_arbiter;

/* What an asked tenant may give: its cached (free, mapped) memory only,
 * also idle memory it can offload, or everything: swapped out whole at its
 * next safe point (an allocation, a yield point, a wait), and back before
 * that call returns. */
enum { GP_RECLAIM_CACHE = 0, GP_RECLAIM_OFFLOAD = 1, GP_RECLAIM_SWAP = 2 };

/* Give back at least `bytes` (more is fine; fewer if that is all there is)
 * at `level`; returns the bytes released.  Called without any arbiter or
 * pool lock held, on a thread of the tenant's own process. */
typedef uint64_t (*gp_reclaim_fn)(void *arg, uint64_t bytes, int level);

typedef struct gp_arbiter_params {
    const char *group;    /* GPUPOOL_TENANT: 1..63 of [A-Za-z0-9_.-]           */
    const char *device;   /* the device's identity, the same in every process:
                             a CUDA device UUID, "host": 1..63 of [A-Za-z0-9_-] */
    const char *name;     /* shown by `top`; NULL: the program's name (the base
                             of argv[0], never its arguments)                  */
    int priority;         /* 0..GP_PRIO_MAX, higher wins                       */
    uint64_t quota;       /* this tenant's own cap (its pool limit), 0: none;
                             shown, the pool enforces it                       */
    uint64_t limit;       /* the group's device limit, 0: none (the device)    */
    uint64_t total;       /* the device's memory                               */
    uint64_t timeout_ms;  /* how long an allocation waits for memory           */
    uint64_t turn_ms;     /* GPUPOOL_TENANT_TURN (gp_arbiter_yield)             */
    double share;         /* GPUPOOL_TENANT_SHARE (gp_arbiter_yield), (0, 1]    */
} gp_arbiter_params;

/* Register in the group's registry, made if absent (mode 0600 whatever the
 * umask).  The first tenant of an empty registry sets the group's limit; a
 * later one must give the same or 0 (GP_ERR_INVALID names both).
 * GP_ERR_INVALID for a bad group or device id, and for a registry that is
 * not this user's alone -- owned by another uid, or of a mode other than
 * 0600 (the message names the object, its owner and mode, what is accepted
 * and how to remove it); GP_ERR_TOO_MANY when GP_ARB_SLOTS tenants are
 * registered; GP_ERR_BACKEND when shared memory fails, or for a corrupt
 * registry: a figure that cannot be (a slot's held, cached, offloadable,
 * lease or wanted above the group's memory, a used slot's pid below 1, a
 * priority out of range, counts that contradict each other).  The message
 * names the object and the slot and field.  A registry found corrupt later
 * fails every call of its tenants that takes its lock in the same way: an
 * allocation that needs a map (gp_arbiter_take) fails with that error at
 * once, never waits; gp_arbiter_close still leaves it. */
gp_status gp_arbiter_open(const gp_arbiter_params *params, gp_arbiter **out);
/* Unregister; the last tenant out removes the registry.  NULL is fine. */
void gp_arbiter_close(gp_arbiter *a);

/* What the tenant runs when asked (default: gp_pool_trim of the bound pool,
 * i.e. its cache; a stack installs gp_tenant_reclaim).  Waits for an answer
 * under way; does nothing in a forked child (the parent's tenant). */
void gp_arbiter_set_reclaim(gp_arbiter *a, gp_reclaim_fn fn, void *arg);
/* How this tenant is swapped out whole (the stack's: arbiter.h knows no
 * offloader).  `out` gives back every byte it can -- all device work
 * waited for, every live block offloaded, the cache unmapped -- and
 * returns GP_OK with the bytes released and those `in` will map again
 * (*back: the cache it gave up does not come back), or an error: with
 * *back 0, nothing swapped, every byte where it was (the host limit is
 * full, a device error); with *back > 0, the device refused to put back
 * what it had taken, and the tenant is swapped out all the same.  `in`
 * brings it all back at the same addresses; an error there is retried.
 * Both run with the arbiter's own `swapping` held and no other lock (`out`
 * on the parked thread, `in` on the first thread of the process to call
 * gp_arbiter_swap_in, which waits for a swap out under way); NULL: never
 * swapped. */
typedef gp_status (*gp_swap_out_fn)(void *arg, uint64_t *released, uint64_t *back);
typedef gp_status (*gp_swap_in_fn)(void *arg);
void gp_arbiter_set_swap(gp_arbiter *a, gp_swap_out_fn out, gp_swap_in_fn in, void *arg);
/* What host memory a tenant that may be swapped should keep ready for
 * its swap: the bytes it holds once another tenant shares its group (0:
 * nothing new since the last call, which took it).  One relaxed load when
 * there is nothing. */
uint64_t gp_arbiter_swap_room(gp_arbiter *a);
/* Bring this tenant back if it is swapped out: wait in line for its room
 * (without a timeout: it holds nothing meanwhile, and its memory must be
 * back before its call returns), then `in`, retried twice.  GP_OK when it
 * is back (or was not away); else `in`'s error, the memory still on the
 * host (call again).  One thread of the process at a time; the others
 * wait for it. */
gp_status gp_arbiter_swap_in(gp_arbiter *a);

/* Wait in line, as an allocation does, until the group can give this
 * tenant `bytes` more than it holds (asking others, swapping them out),
 * then run fn(arg) with that room kept for it (a lease: nobody else maps
 * into it), no lock held; while fn fails with GP_ERR_OOM (the room was
 * not enough), wait and run it again.  Gives up with GP_ERR_OOM and the
 * group's table when the timeout (GPUPOOL_RECLAIM_TIMEOUT) passed, time
 * spent swapped out not counted.  Returns fn's status otherwise.  For what
 * maps memory other than an allocation: a restore, a prefetch. */
gp_status gp_arbiter_with_room(gp_arbiter *a, uint64_t bytes, gp_status (*fn)(void *), void *arg);

/* The pool whose memory this tenant holds: the default reclaim trims it,
 * and answers publish its cached bytes. */
void gp_arbiter_bind(gp_arbiter *a, gp_pool *pool);
/* Announce bytes offloadable now and bytes offloaded now (shown by `top`;
 * nothing in a forked child). */
void gp_arbiter_publish(gp_arbiter *a, uint64_t offloadable, uint64_t offloaded);

/* The tenant's reclaim policy (arbiter_reclaim.c), for a pool and its
 * offloader (NULL: none): the pool's cache first (gp_pool_trim), then, at
 * GP_RECLAIM_OFFLOAD and while short, idle offloadable tags of any
 * priority (gp_offload_reclaim).  Returns the bytes released.  No lock may
 * be held. */
uint64_t gp_tenant_reclaim(gp_pool *pool, gp_offloader *o, uint64_t bytes, int level);
/* gp_arbiter_publish of what `o` could offload now and has offloaded
 * (gp_offload_figures). */
void gp_tenant_publish(gp_arbiter *a, gp_offloader *o);

/* The hot-path check: if a reclaim request is pending for this tenant,
 * answer it now (runs the callback); else one relaxed atomic load.
 * Returns the bytes given (0 when nothing was asked).  Call it where no
 * pool lock is held: before an allocation, after a free, at a step's end.
 * Once the tenant has yield points, asks are left to its next yield point
 * (a step keeps the memory its lease counted on), an equal priority's to
 * the one that ends its turn; unless it waits itself, for memory: then
 * every ask is answered.  Such a wait is a step's, stuck mid-way: it comes
 * before every wait for a step to begin, of any priority, and a tenant at
 * its yield point gives it its cache (else a server of a higher priority,
 * keeping its cache between requests, could hold a lower step half way
 * for ever). */
uint64_t gp_arbiter_poll(gp_arbiter *a);

/* A safe point between steps (gpupool.yield_point()):
 * - answers pending asks; if a tenant waits ahead of this one, gives its
 *   cache back -- one of its own priority only once its turn is over
 *   (GPUPOOL_TENANT_TURN since its step first began after it last gave);
 * - while a higher priority is in a step, pauses: the tenants below it
 *   compute at most GPUPOOL_TENANT_SHARE of the time, together (each step
 *   they end owes the group its length times 1/share - 1 of quiet);
 * - takes a lease for the coming step: waits (up to the timeout, in line
 *   like any want) until the group can give what the step will need beyond
 *   what this tenant holds: the larger of `need` (bytes held at the step's
 *   peak, 0: unknown) and the most it held during the last step.  The lease
 *   keeps that room for it until its next yield point, so that two steps
 *   never both stall half way, each holding what the other needs: no other
 *   tenant, of whatever priority, maps into it (a higher one asks, and is
 *   answered at this tenant's next yield point).  It is a level of held,
 *   not a count that maps spend: a step whose pool unmaps and maps again
 *   keeps its room.
 * Returns the bytes given back. */
uint64_t gp_arbiter_yield(gp_arbiter *a, uint64_t need);

/* fork(): an arbiter belongs to the process that opened it.  In a forked
 * child the parent's arbiters answer nothing, wait for nothing and yield
 * nothing (the child's allocations on the parent's pools are refused by
 * the pool anyway), and closing one there frees host memory only: the
 * parent's tenant stays registered.  Arbiters opened in the child work.
 * Installed by the first gp_arbiter_open; idempotent. */
void gp_arbiter_atfork_install(void);

/* gp_alloc under the arbiter: polls first; when the allocation fails for
 * lack of memory, posts the want, asks others and waits up to the timeout,
 * retrying.  On final failure: GP_ERR_OOM, and gp_last_error() holds the
 * pool's report followed by who holds what in the group. */
void *gp_arbiter_alloc(gp_arbiter *a, gp_pool *pool, size_t size, gp_stream stream,
                       gp_tag tag, int priority, gp_status *status);


/* ------------------------------------------------------------- adaptor */

/* A backend over `inner` whose map() asks `a` for the bytes and whose
 * unmap() gives them back; mem_info() reports the group's view (the limit
 * as total, what may still be mapped as free); total is min(inner's,
 * limit).  Every other call goes to `inner`.  Owns both: its destroy()
 * closes `a` and destroys `inner` (also on failure here). */
gp_status gp_backend_arbiter_wrap(gp_backend *inner, gp_arbiter *a, gp_backend **out);

/* For the adaptor: take `size` bytes for this tenant (GP_ERR_OOM with a
 * message when the group cannot give them now), give them back. */
gp_status gp_arbiter_take(gp_arbiter *a, uint64_t size, gp_backend *inner);
void gp_arbiter_give(gp_arbiter *a, uint64_t size);
/* The group's limit (0: none) and what this tenant may still take now. */
void gp_arbiter_view(gp_arbiter *a, uint64_t *limit, uint64_t *avail);

/* ------------------------------------------------------------ reading */

/* A tenant's figures, one X(field, key, unit) each: the member of
 * gp_tenant_info and the key of gpupool.tenants()'s dict, which gives a
 * GP_TENANT_NS figure in seconds (key ..._s) and a GP_TENANT_COUNT one as
 * it is (bytes or a count). */
enum { GP_TENANT_COUNT = 0, GP_TENANT_NS = 1 };
#define GP_TENANT_FIGURES(X)                                                                      \
    X(quota, "quota", GP_TENANT_COUNT)             /* its own cap (its pool limit), 0: none */    \
    X(held, "held", GP_TENANT_COUNT)               /* bytes mapped */                             \
    X(cached, "cached", GP_TENANT_COUNT)                                                          \
    X(offloadable, "offloadable", GP_TENANT_COUNT)                                                \
    X(offloaded, "offloaded", GP_TENANT_COUNT)                                                    \
    X(wanted, "wanted", GP_TENANT_COUNT)           /* bytes it waits for now */                   \
    X(lease, "lease", GP_TENANT_COUNT)             /* what its step may hold (0: no lease) */     \
    X(waiting_ns, "waiting_s", GP_TENANT_NS)       /* since when it waits (0: not waiting) */     \
    X(seen_ns, "seen_s", GP_TENANT_NS)             /* since its last sign of life */              \
    X(asked, "asked", GP_TENANT_COUNT)             /* bytes asked of it, not yet answered */      \
    X(n_waits, "waits", GP_TENANT_COUNT)                                                          \
    X(n_wait_fail, "wait_failures", GP_TENANT_COUNT)                                              \
    X(wait_ns, "wait_s", GP_TENANT_NS)                                                            \
    X(wait_max_ns, "wait_max_s", GP_TENANT_NS)                                                    \
    X(pause_ns, "paused_s", GP_TENANT_NS)          /* paused at yield points for higher ones */   \
    X(step_ns, "step_s", GP_TENANT_NS)             /* its last step, yield point to yield point */ \
    X(n_given, "reclaims_given", GP_TENANT_COUNT)  /* answers it gave */                          \
    X(bytes_given, "bytes_given", GP_TENANT_COUNT) /* bytes they released */                      \
    X(n_received, "reclaims_received", GP_TENANT_COUNT) /* answers to its asks */                 \
    X(bytes_received, "bytes_received", GP_TENANT_COUNT)                                          \
    X(lat_median_ns, "latency_median_s", GP_TENANT_NS) /* ask -> answer, of its answers */        \
    X(lat_max_ns, "latency_max_s", GP_TENANT_NS)                                                  \
    X(swapped, "swapped", GP_TENANT_COUNT)         /* bytes swapped out now */                    \
    X(n_swap_out, "swaps_out", GP_TENANT_COUNT)                                                   \
    X(n_swap_in, "swaps_in", GP_TENANT_COUNT)                                                     \
    X(park_ns, "swapped_s", GP_TENANT_NS)          /* time spent swapped out */                   \
    X(swap_ns, "swap_s", GP_TENANT_NS)             /* its swaps' latency, out + in, summed */     \
    X(swap_max_ns, "swap_max_s", GP_TENANT_NS)     /* the longest swap out, or in */

typedef struct gp_tenant_info {
    int pid, priority, slot;
    int self;                   /* this process                            */
    char name[GP_ARB_NAME_MAX];
#define GP_TENANT_MEMBER(field, key, unit) uint64_t field;
    GP_TENANT_FIGURES(GP_TENANT_MEMBER)
#undef GP_TENANT_MEMBER
    uint32_t n_lat;
    uint32_t lat_us[GP_ARB_LAT];         /* the last answers' latencies,
                                            oldest first                   */
} gp_tenant_info;

typedef struct gp_group_info {
    char group[64], device[GP_ARB_DEVICE_MAX];
    uint64_t limit, total;
    uint64_t n_registered;      /* registrations ever                      */
    uint64_t n_reaped;          /* dead tenants reclaimed                  */
    size_t n_tenants;
} gp_group_info;

/* A consistent copy of a registry without joining it (dead tenants are
 * reclaimed first): the group, and up to `max` tenants by slot.
 * GP_ERR_INVALID for bad ids, and for a registry not this user's alone;
 * GP_ERR_FOREIGN when no such registry exists; GP_ERR_BACKEND for a corrupt
 * one (as gp_arbiter_open: nothing of it is copied). */
gp_status gp_arbiter_read(const char *group, const char *device, gp_group_info *g,
                          gp_tenant_info *t, size_t max);
/* Remove a registry whatever its tenants (tests, a stale object). */
gp_status gp_arbiter_unlink(const char *group, const char *device);
/* The shared-memory name of a registry ("/gpupool.<device>.<group>");
 * GP_ERR_INVALID for bad ids. */
gp_status gp_arbiter_shm_name(const char *group, const char *device, char *buf, size_t len);
/* Who holds what in the group, one line a tenant (for OOM messages). */
size_t gp_arbiter_report(gp_arbiter *a, char *buf, size_t len);

/* Test hooks: hold the registry's lock (as a tenant killed in the middle
 * of an update would), and let it go. */
gp_status gp_arbiter_debug_lock(gp_arbiter *a);
void gp_arbiter_debug_unlock(gp_arbiter *a);
/* Test hook: the user a registry must belong to (see gp_arbiter_open) is
 * taken to be `uid` rather than this process's effective uid (-1: back to
 * it), so that a test without root can meet another user's registry. */
void gp_arbiter_debug_owner(long uid);

#endif /* GP_ARBITER_H */
