/*
 * arbiter_impl.h -- what the files of the tenant registry share (arbiter.h
 * is their interface): the registry's layout in shared memory, the
 * process's side of a tenant, and the internal calls between
 *   arbiter.c          the registry: shared memory, its robust lock,
 *                      joining and leaving, fork
 *   arbiter_queue.c    accounting (what a tenant may map), asks and their
 *                      answers, waits in line, allocation under the arbiter
 *   arbiter_turns.c    yield points: turns, leases, compute share
 *   arbiter_read.c     readers: a registry for `top`, the OOM report
 *   arbiter_reclaim.c  the tenant's reclaim policy
 */
#ifndef GP_ARBITER_IMPL_H
#define GP_ARBITER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "arbiter.h"
#include "util.h"

#define GP_ARB_MAGIC 0x3174696272617067ull /* "gparbit1" */
#define GP_ARB_VERSION 6
#define GP_ARB_LOCK_WAIT_S 10              /* a live holder longer: an error     */
#define GP_ARB_INIT_WAIT_NS 2000000000ull  /* a creator still initialising       */
#define GP_ARB_REAP_NS 100000000ull        /* dead tenants looked for, waiting   */
#define GP_ARB_NAP_NS 50000000ull          /* longest sleep between checks       */
#define GP_ARB_RETRY_NS 100000000ull       /* retry the pool even if short       */
#define GP_ARB_BACKOFF_NS 200000000ull     /* re-ask a tenant that gave nothing  */
#define GP_ARB_BUSY_NS 1000000000ull       /* a step this much past twice the last
                                              one: its tenant went idle          */
#define GP_ARB_PAUSE_MAX_NS 5000000000ull  /* the most one step adds to a pause  */
#define GP_ARB_KEEP_COST 5                /* a swapped-in tenant keeps its room
                                              against equals for a turn and at
                                              least this many times its swap    */
#define GP_ARB_KEEP_MAX_NS 5000000000ull /* ... but no longer than this          */
#define GP_ARB_SLICE_NS 100000000ull      /* a tenant without yield points, below
                                              a busy higher one, runs this long
                                              between pauses                   */
#define GP_ARB_STUCK_NS 1000000000ull     /* a lower step stuck this long goes
                                              ahead of higher wants             */
#define GP_ARB_GAP_NS 50000000ull         /* a tenant back in a step sooner than
                                              this after its yield point was
                                              busy all along                   */
#define MS 1000000ull

typedef struct gp_arb_slot {
    int32_t pid;                /* 0: free                                 */
    int32_t priority;
    uint64_t start_time;        /* /proc/<pid>/stat starttime, 0: unknown  */
    char name[GP_ARB_NAME_MAX];
    uint64_t quota, held, cached, offloadable, offloaded;
    uint64_t wanted, want_since; /* bytes waited for, since (0: none)      */
    int32_t want_step;          /* the wait is a step's, mid-way: ahead of
                                   every wait for a step to begin           */
    int32_t in_turn;            /* within its turn: ahead of the waits of
                                   its priority (GPUPOOL_TENANT_TURN)       */
    uint64_t lease;             /* what it may hold in its current step:
                                   lease - held is room no other tenant
                                   takes, whatever its priority (0: none)   */
    uint64_t heartbeat;
    /* Swaps (arbiter_swap.c): the bytes it held when swapped out (0: on
     * the device), whether it can be swapped (a stack with an offloader),
     * until when equals may not swap it (its room since it got it), and
     * what its swaps cost.  swap_asked: a swap is asked of it (read
     * without the lock on its allocation path). */
    uint64_t swapped;
    int32_t can_swap, swap_status; /* swap_status: its last swap out's failure (0: none) */
    _Atomic int32_t swap_asked;
    uint64_t keep_until, swap_cost_ns;
    uint64_t n_swap_out, n_swap_in, park_ns, swap_ns, swap_max_ns;
    /* Steps between yield points: the current one's start (0: none), the
     * last one's length, and the time paused for higher priorities. */
    uint64_t step_start, step_ns, pause_ns, step_end;
    /* Asks to this tenant: askers raise ask_bytes/ask_level and bump
     * ask_seq; the tenant sees ask_seq move on its hot path and answers
     * (answer_seq = the ask_seq it answered). */
    _Atomic uint32_t ask_seq;
    uint32_t answer_seq;
    int32_t ask_level, ask_from;
    uint64_t ask_bytes, ask_time, answer_bytes;
    uint64_t n_waits, n_wait_fail, wait_ns, wait_max_ns;
    uint64_t n_given, bytes_given, n_received, bytes_received, lat_max_ns;
    uint32_t n_lat, lat_us[GP_ARB_LAT]; /* ring of answer latencies        */
} gp_arb_slot;

typedef struct gp_arb_shm {
    _Atomic uint64_t magic;     /* set last by the creator                 */
    uint32_t version, size;
    pthread_mutex_t lock;       /* robust, process-shared                  */
    _Atomic uint32_t gen;       /* futex word: bumped on every change      */
    _Atomic uint32_t sleepers;  /* processes sleeping on gen               */
    int32_t owner;              /* pid holding the lock (for messages)     */
    int32_t dead;               /* unlinked: whoever maps it starts over   */
    uint64_t limit, total, n_registered, n_reaped;
    /* Tenants below a busy higher priority start no step before this: the
     * time their steps owe it (GPUPOOL_TENANT_SHARE). */
    uint64_t quiet_until;
    /* The highest priority in a step (+1; 0: none) and until when it counts
     * as busy: what a tenant without yield points looks at on its
     * allocations (one relaxed load) to know whether to pause. */
    _Atomic int32_t busy_prio;
    _Atomic uint64_t busy_until;
    char group[64], device[GP_ARB_DEVICE_MAX];
    gp_arb_slot slots[GP_ARB_SLOTS];
} gp_arb_shm;

struct gp_arbiter {
    gp_arb_shm *r;
    int slot;
    char shm[160];
    uint64_t timeout_ns, turn_ns;
    double share;
    uint64_t turn_start;        /* this tenant's turn began (0: none); under the lock */
    _Atomic int turns;          /* it has yield points: asks wait for the next one,
                                   an equal priority's for the end of its turn      */
    _Atomic uint32_t deferred;  /* the ask_seq left for the next yield point        */
    _Atomic int step_due;       /* a yield point passed: the next allocation
                                   begins a step                                   */
    _Atomic uint64_t unit;      /* the largest map size seen: wants round to it */
    _Atomic uint32_t answered;  /* the ask_seq answered last                */
    pthread_mutex_t answering;  /* one thread of the process answers        */
    gp_reclaim_fn reclaim;
    void *reclaim_arg;
    gp_swap_out_fn swap_out;    /* (under `answering`)                    */
    gp_swap_in_fn swap_in;
    void *swap_arg;
    pthread_mutex_t swapping;   /* one swap out or in at a time (after
                                   `answering` where both are taken)       */
    _Atomic int away;           /* swapped out, not yet back                 */
    uint64_t away_since, away_lease; /* when it went, and its lease then   */
    _Atomic uint64_t run_since; /* without yield points: when it last ran on
                                   after a pause (0: no higher one busy)   */
    int prio1;                  /* its priority + 1 (for busy_prio)        */
    _Atomic uint64_t swap_room; /* host room its swap should find ready (0:
                                   taken by gp_arbiter_swap_room)          */
    uint64_t room_told;         /* the last told (under the registry lock) */
    _Atomic uint64_t parked_ns; /* time spent swapped out, ever: waits do not
                                   count it against their timeout          */
    _Atomic(gp_pool *) pool;
    uint64_t next_reap;
    uint64_t step_peak;         /* the most held since the last yield (under the lock) */
    unsigned fork_gen;          /* gp_arb_fork_gen when made: another one is a forked child's */
};

/* Bumped in every forked child: an arbiter made before the fork belongs to
 * the parent (its slot, its pool); in the child it answers nothing, waits
 * for nothing, and closing it frees host memory only. */
extern atomic_uint gp_arb_fork_gen; /* (arbiter.c) */

static inline int gp_arb_forked(const gp_arbiter *a)
{
    return a->fork_gen != atomic_load_explicit(&gp_arb_fork_gen, memory_order_relaxed);
}

static inline void gp_arb_nap(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* When a tenant with yield points answers: at once, at its next yield
 * point (mid-step), or at once unless the ask is an equal priority's (its
 * turn goes on).  A swap is answered at once but in a free (GP_DEFER_ALL):
 * an allocation, a yield point or a wait is where a tenant parks; a free
 * (PyTorch frees from destructors) is not. */
enum { GP_ANSWER_NOW, GP_DEFER_ALL, GP_DEFER_EQUAL, GP_DEFER_BUT_SWAP };

/* What one wait knows of each tenant it asked. */
typedef struct gp_asked {
    int32_t pid;
    int pending;
    int level;               /* the level it was asked at last        */
    uint32_t seq;            /* the ask_seq its ask made               */
    uint64_t bytes;          /* asked                                  */
    uint64_t not_before;     /* do not ask again before               */
} gp_asked;

/* One wait for room in the group: an allocation's, or a step's lease. */
typedef struct gp_wait {
    gp_asked v[GP_ARB_SLOTS];
    uint64_t t0, deadline, want;
    uint64_t lease;          /* a lease's wait: the held level it waits for
                                (the want follows held: answers trim it)  */
    int counted;             /* a wait in the tenant's counters            */
    int step;                /* a step's, mid-way (gp_arb_ahead)           */
    int defer;               /* the asks it leaves for later meanwhile     */
} gp_wait;

/* arbiter.c: the registry and its lock */
void gp_arb_changed(gp_arb_shm *r);
void gp_arb_sleep(gp_arb_shm *r, uint32_t seen, uint64_t ns);
int gp_arb_reap(gp_arb_shm *r);
/* The registry's lock, taken within GP_ARB_LOCK_WAIT_S, and its figures
 * checked (gp_arb_check): an error leaves it unlocked. */
gp_status gp_arb_lock(gp_arb_shm *r);
void gp_arb_unlock(gp_arb_shm *r);
gp_status gp_arb_attach(const char *name, int create, int lock_s, gp_arb_shm **out);
/* Whether every figure of the registry can be (under its lock); the error
 * names the object (`name`, NULL: made from the registry), the slot and the
 * field.  gp_arb_lock and gp_arb_attach call it. */
gp_status gp_arb_check(const gp_arb_shm *r, const char *name);
/* The most bytes a slot's figure may hold: the group's memory, at most
 * GP_DEVICE_MAX. */
uint64_t gp_arb_bound(const gp_arb_shm *r);
/* `v`, no larger than a slot's figure may be (what a want publishes: one
 * beyond the group's memory is never met, whatever it says). */
static inline uint64_t gp_arb_clamp(const gp_arb_shm *r, uint64_t v)
{
    uint64_t b = gp_arb_bound(r);
    return v < b ? v : b;
}

/* arbiter_queue.c: accounting, answering, waiting */
int gp_arb_ahead(const gp_arb_shm *r, int j, int i);
uint64_t gp_arb_cap(const gp_arb_shm *r);
uint64_t gp_arb_leased(const gp_arb_slot *s);
uint64_t gp_arb_free_room(const gp_arb_shm *r);
uint64_t gp_arb_avail(const gp_arb_shm *r, int i, uint64_t *ahead, uint64_t *held_all);
uint64_t gp_arb_answer(gp_arbiter *a, uint64_t gift, int defer, uint64_t since);
uint64_t gp_arb_poll(gp_arbiter *a, int defer);
gp_status gp_arb_wait_begin(gp_arbiter *a, gp_wait *w, uint64_t want, uint64_t lease, int step,
                             int counted);
gp_status gp_arb_wait_look(gp_arbiter *a, gp_wait *w, uint64_t have, uint64_t *short_b, uint32_t *gen);
void gp_arb_wait_sleep(gp_arbiter *a, gp_wait *w, uint32_t gen, uint64_t until);
void gp_arb_wait_end(gp_arbiter *a, gp_wait *w, int ok);

/* arbiter_swap.c */
/* The swap out of an ask at GP_RECLAIM_SWAP (`answering` is held, then
 * `swapping`): GP_OK with the bytes released, the tenant away; an error
 * with the tenant away too where what it took could not be put back
 * (a->away says which), or with nothing away. */
gp_status gp_arb_swap_out(gp_arbiter *a, uint64_t *released);
/* The tenant got its room at `now`: equals swap it no sooner than its
 * keep (under the lock). */
void gp_arb_keep(gp_arbiter *a, uint64_t now);
/* Whether slot i may be asked to swap for slot me now (under the lock). */
int gp_arb_swappable(const gp_arb_shm *r, int i, int me, uint64_t now);
int gp_arb_may_be_swapped(const gp_arb_shm *r, int i);

/* arbiter_turns.c */
void gp_arb_step_mark(gp_arbiter *a);
/* A tenant without yield points, on an allocation while a higher one is
 * busy: every GP_ARB_SLICE_NS it runs, it pauses as a yield point would
 * (GPUPOOL_TENANT_SHARE). */
void gp_arb_duty(gp_arbiter *a);

#endif /* GP_ARBITER_IMPL_H */
