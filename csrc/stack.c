/*
 * stack.c -- a device's allocator stack (stack.h): assembled once, owning
 * its parts, and what both entry points allocate from.
 *
 * The process's stacks are kept in one list, for the yield points of every
 * tenant (gp_stack_yield_all); nothing on the allocation path looks at it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "stack.h"
#include "util.h"

struct gp_stack {
    gp_pool *pool;
    gp_arbiter *arb;               /* the tenant, NULL without a group */
    _Atomic(gp_offloader *) off;   /* made on first use                */
    pthread_mutex_t off_lock;      /* making it                        */
    gp_stack *prev, *next;         /* the process's stacks (g_list)    */
    int listed;
    /* Swapped out whole (the tenant's, arbiter.h): set from the start of a
     * swap out until the swap in is done.  Every allocation checks it on
     * entry and before it returns (the gate).  The swap out and in run
     * under the arbiter's `swapping`, which the gate waits for. */
    _Atomic int away;
    uint32_t swap_id;
};

static _Atomic(gp_context_fn) g_context;

static pthread_mutex_t g_list_lock = PTHREAD_MUTEX_INITIALIZER;
static gp_stack *g_list;

/* ------------------------------------------------------------ the list */

/* fork(): the list's lock is held across it (never for long, and no other
 * lock is taken under it); the child starts with an empty list, as its
 * parent's tenants are not its own (arbiter.h). */
static void gp_list_prepare(void) { pthread_mutex_lock(&g_list_lock); }
static void gp_list_parent(void) { pthread_mutex_unlock(&g_list_lock); }
static void gp_list_child(void)
{
    for (gp_stack *s = g_list, *next; s; s = next) {
        next = s->next;
        s->prev = s->next = NULL;
        s->listed = 0;
    }
    g_list = NULL;
    pthread_mutex_init(&g_list_lock, NULL);
}

static void gp_list_atfork(void) { pthread_atfork(gp_list_prepare, gp_list_parent, gp_list_child); }

static void gp_list_add(gp_stack *s)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, gp_list_atfork);
    pthread_mutex_lock(&g_list_lock);
    s->next = g_list;
    if (g_list) g_list->prev = s;
    g_list = s;
    s->listed = 1;
    pthread_mutex_unlock(&g_list_lock);
}

static void gp_list_remove(gp_stack *s)
{
    pthread_mutex_lock(&g_list_lock);
    if (s->listed) {
        if (s->prev) s->prev->next = s->next;
        else g_list = s->next;
        if (s->next) s->next->prev = s->prev;
        s->listed = 0;
    }
    pthread_mutex_unlock(&g_list_lock);
}

/* ------------------------------------------------------------ callbacks */

/* The tenant's answer to an ask (run by the arbiter with no lock held). */
static uint64_t gp_stack_reclaim(void *arg, uint64_t bytes, int level)
{
    gp_stack *s = arg;
    uint64_t got = gp_tenant_reclaim(s->pool, gp_stack_offloader(s, 0), bytes, level);
    gp_stack_publish(s);
    return got;
}

/* Swap the tenant out whole: every live block of the pool to the host
 * (its offloader's swap, with GPUPOOL_CODEC), then its cache
 * unmapped.  From its start every other allocation of the process waits
 * at the gate (gp_stack_back). */
static gp_status gp_stack_swap_out(void *arg, uint64_t *released, uint64_t *back)
{
    gp_stack *s = arg;
    gp_offloader *o = gp_stack_offloader(s, 1);
    if (!o) return gp_error_set(GP_ERR_BACKEND, "gpupool: no offloader to swap with: %s", gp_last_error());
    atomic_store(&s->away, 1);
    gp_offload_result res;
    gp_config cfg;
    gp_pool_config(s->pool, &cfg);
    uint32_t id = 0;
    gp_status st = gp_offload_swap_out(o, cfg.codec, &id, &res); /* (GPUPOOL_CODEC: auto by default) */
    if (id) { /* (also a failed one whose undo failed: what it left away comes back by the swap in) */
        s->swap_id = id;
        *back = res.released;
        *released = res.released;
        if (st == GP_OK) *released += gp_pool_trim(s->pool, UINT64_MAX);
    }
    if (!res.released) atomic_store(&s->away, 0); /* (nothing went: nothing comes back) */
    gp_stack_publish(s);
    return st;
}

static gp_status gp_stack_swap_in(void *arg)
{
    gp_stack *s = arg;
    gp_offload_result res;
    gp_status st = gp_offload_swap_in(gp_stack_offloader(s, 0), s->swap_id, &res);
    if (st == GP_OK) {
        s->swap_id = 0;
        atomic_store(&s->away, 0);
    }
    gp_stack_publish(s);
    return st;
}

/* The gate: a swap out under way ends first (gp_arbiter_swap_in waits for
 * it), then the tenant is brought back (by whichever thread of the process
 * comes first). */
static gp_status gp_stack_back(gp_stack *s)
{
    gp_status st = gp_arbiter_swap_in(s->arb);
    if (st == GP_OK) return st;
    char why[1024];
    snprintf(why, sizeof why, "%s", gp_last_error());
    return gp_error_set(st, "gpupool: this tenant was swapped out and could not come back: %s", why);
}

/* The pool's pressure callback once the offloader exists: its reclaim (as
 * the offloader's own callback), and what it offloaded told to the
 * registry.  Inside an operation of the offloader (its own allocations)
 * the reclaim gives nothing and nothing is published. */
static uint64_t gp_stack_pressure(void *arg, gp_pool *pool, uint64_t needed, int priority)
{
    (void)pool;
    gp_stack *s = arg;
    uint64_t got = gp_offload_reclaim(atomic_load(&s->off), needed, priority);
    if (got) gp_stack_publish(s);
    return got;
}

/* ------------------------------------------------------------ assembly */

/* The tenant adaptor over *be (taken in every case): quota and limit as
 * the pool will resolve them, against the device the group sees. */
static gp_status gp_stack_tenant(gp_backend **be, const char *device_id, const gp_config *cfg, gp_arbiter **out)
{
    uint64_t total = (*be)->total, limit = gp_size_resolve(cfg->device_limit, total);
    gp_arbiter_params pr = {
        .group = cfg->tenant,
        .device = device_id,
        .priority = cfg->priority,
        .quota = gp_size_resolve(cfg->limit, limit && limit < total ? limit : total),
        .limit = limit,
        .total = total,
        .timeout_ms = cfg->reclaim_timeout_ms,
        .turn_ms = cfg->tenant_turn_ms,
        .share = cfg->tenant_share,
    };
    gp_status st = gp_arbiter_open(&pr, out);
    if (st != GP_OK) {
        (*be)->destroy(*be);
        return st;
    }
    return gp_backend_arbiter_wrap(*be, *out, be);
}

gp_status gp_stack_create(gp_backend *be, const char *device_id, const gp_config *cfg, gp_stack **out)
{
    *out = NULL;
    gp_status st = gp_config_validate(cfg, be->total);
    if (st != GP_OK) {
        be->destroy(be); /* a limit that resolves to less than a chunk on this device */
        return st;
    }
    gp_stack *s = calloc(1, sizeof *s);
    if (!s) {
        be->destroy(be);
        return gp_error_set(GP_ERR_NOMEM, "gpupool: out of host memory for the allocator stack");
    }
    pthread_mutex_init(&s->off_lock, NULL);
    if (cfg->log == GP_LOG_ALL) st = gp_backend_logged(be, &be);
    if (st == GP_OK && cfg->tenant[0]) st = gp_stack_tenant(&be, device_id, cfg, &s->arb);
    if (st == GP_OK) st = gp_pool_create(be, cfg, &s->pool);
    if (st != GP_OK) { /* (each step destroyed what it was given) */
        pthread_mutex_destroy(&s->off_lock);
        free(s);
        return st;
    }
    if (s->arb) {
        gp_arbiter_bind(s->arb, s->pool);
        gp_arbiter_set_reclaim(s->arb, gp_stack_reclaim, s);
        /* Its offloader now: when it is asked to swap, the group is full
         * and the offloader's own memory (its checksums) would not fit. */
        if (cfg->tenant_swap && gp_stack_offloader(s, 1))
            gp_arbiter_set_swap(s->arb, gp_stack_swap_out, gp_stack_swap_in, s);
        gp_error_clear(); /* (without one, it is not swapped: `top` says so) */
    }
    gp_list_add(s);
    *out = s;
    return GP_OK;
}

void gp_stack_destroy(gp_stack *s)
{
    if (!s) return;
    gp_list_remove(s);
    /* An answer under way finishes first; later ones only trim. */
    if (s->arb) {
        gp_arbiter_set_reclaim(s->arb, NULL, NULL);
        gp_arbiter_set_swap(s->arb, NULL, NULL, NULL);
    }
    gp_offloader_destroy(atomic_load(&s->off));
    gp_pool_destroy(s->pool); /* the adaptors and the backend, and the tenant's leaving */
    pthread_mutex_destroy(&s->off_lock);
    free(s);
}

gp_pool *gp_stack_pool(const gp_stack *s) { return s->pool; }

gp_arbiter *gp_stack_arbiter(const gp_stack *s) { return s->arb; }

gp_status gp_stack_grant_peer(gp_stack *s, int peer)
{
    gp_backend *be = gp_pool_backend(s->pool);
    return be->grant_peer(be, peer);
}

gp_offloader *gp_stack_offloader(gp_stack *s, int create)
{
    gp_offloader *o = atomic_load_explicit(&s->off, memory_order_acquire);
    if (o || !create) return o;
    pthread_mutex_lock(&s->off_lock);
    if (!(o = atomic_load(&s->off))) {
        gp_config cfg;
        gp_pool_config(s->pool, &cfg);
        if (gp_offloader_create(s->pool, gp_size_resolve(cfg.host_limit, gp_host_ram()),
                                (unsigned)cfg.offload_threads, cfg.nvcomp, &o) == GP_OK) {
            /* (Pinned in the background: the offloader is ready now.) */
            gp_offload_reserve_host(o, gp_size_resolve(cfg.host_reserve, gp_host_ram()));
            atomic_store_explicit(&s->off, o, memory_order_release);
            gp_pool_set_pressure(s->pool, gp_stack_pressure, s);
        }
    }
    pthread_mutex_unlock(&s->off_lock);
    return o;
}

/* ---------------------------------------------------------- entry points */

void gp_stack_set_context_source(gp_context_fn fn) { atomic_store(&g_context, fn); }

/* The history's context for the coming call: set (1) when the pool records
 * stacks and a source is known. */
static int gp_context_begin(gp_stack *s)
{
    if (!gp_pool_history_stacks(s->pool)) return 0;
    gp_context_fn fn = atomic_load_explicit(&g_context, memory_order_relaxed);
    if (!fn) return 0;
    gp_set_context(fn());
    return 1;
}

void *gp_stack_alloc(gp_stack *s, size_t size, gp_stream stream, gp_tag tag, int priority, gp_status *status)
{
    gp_status dummy;
    if (!status) status = &dummy;
    if (!s->arb) {
        int ctx = gp_context_begin(s);
        void *r = gp_alloc(s->pool, size, stream, tag, priority, status);
        if (ctx) gp_set_context(0);
        return r;
    }
    /* The gate, on the way in and out: no allocation of a process swapped
     * out returns before its memory is back. */
    if (atomic_load_explicit(&s->away, memory_order_relaxed) && (*status = gp_stack_back(s)) != GP_OK) return NULL;
    int ctx = gp_context_begin(s);
    void *r = gp_arbiter_alloc(s->arb, s->pool, size, stream, tag, priority, status);
    if (ctx) gp_set_context(0);
    uint64_t room = gp_arbiter_swap_room(s->arb);
    if (room) gp_offload_prepare(gp_stack_offloader(s, 0), room);
    gp_status back;
    if (atomic_load_explicit(&s->away, memory_order_relaxed) && (back = gp_stack_back(s)) != GP_OK) {
        if (r) {
            char why[1024];
            snprintf(why, sizeof why, "%s", gp_last_error());
            gp_free(s->pool, r);
            gp_error_set(back, "%s", why); /* (the free may have set errors of its own) */
        }
        *status = back;
        return NULL;
    }
    return r;
}

typedef struct gp_restore_call {
    gp_offloader *o;
    const gp_tag *tags;
    size_t n;
    int accept_loss;
    gp_offload_result *res;
} gp_restore_call;

static gp_status gp_restore_call_run(void *arg)
{
    gp_restore_call *c = arg;
    return gp_restore_tags(c->o, c->tags, c->n, c->accept_loss, c->res);
}

gp_status gp_stack_restore(gp_stack *s, const gp_tag *tags, size_t n, int accept_loss, gp_offload_result *res)
{
    gp_restore_call c = {gp_stack_offloader(s, 0), tags, n, accept_loss, res};
    if (!c.o) {
        memset(res, 0, sizeof *res);
        return GP_OK; /* nothing was ever offloaded */
    }
    if (!s->arb) return gp_restore_call_run(&c);
    /* What the restore maps: its tags' offloaded bytes, and a large chunk
     * either side of each run at most (chunks shared with other memory). */
    uint64_t bytes = 0, limit, avail;
    gp_config cfg;
    gp_pool_config(s->pool, &cfg);
    for (size_t i = 0; i < n; i++) {
        gp_tag_stats ts;
        gp_pool_tag_stats(s->pool, tags[i], &ts);
        bytes += ts.offloaded;
    }
    if (!bytes) return gp_restore_call_run(&c);
    bytes += 2 * cfg.large_chunk;
    gp_arbiter_view(s->arb, &limit, &avail);
    gp_status st = avail >= bytes ? gp_restore_call_run(&c) : GP_ERR_OOM;
    if (st == GP_ERR_OOM) st = gp_arbiter_with_room(s->arb, bytes, gp_restore_call_run, &c);
    gp_stack_publish(s);
    return st;
}

gp_status gp_stack_free(gp_stack *s, void *ptr)
{
    int ctx = gp_context_begin(s);
    gp_status st = gp_free(s->pool, ptr);
    if (ctx) gp_set_context(0);
    if (s->arb) {
        /* (The poll may answer an ask, which sets errors of its own.) */
        char why[1024];
        if (st != GP_OK) snprintf(why, sizeof why, "%s", gp_last_error());
        gp_arbiter_poll(s->arb);
        if (st != GP_OK) gp_error_set(st, "%s", why);
    }
    return st;
}

/* ------------------------------------------------------- the tenant's view */

void gp_stack_publish(gp_stack *s)
{
    gp_offloader *o = s->arb ? gp_stack_offloader(s, 0) : NULL;
    if (o) gp_tenant_publish(s->arb, o);
}

size_t gp_stack_check(gp_stack *s, char *msg, size_t n)
{
    size_t bad = gp_pool_check(s->pool, msg, n);
    gp_offloader *o = gp_stack_offloader(s, 0);
    if (o) {
        char first[1024];
        size_t more = gp_offload_check(o, first, sizeof first);
        if (more && !bad && n) snprintf(msg, n, "%s", first);
        bad += more;
    }
    return bad;
}

uint64_t gp_stack_yield_all(uint64_t need)
{
    /* Copied out: a yield may wait, and the list's lock must not be held
     * meanwhile (a fork takes it). */
    gp_stack **ss = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g_list_lock);
    for (gp_stack *s = g_list; s; s = s->next) cap += s->arb != NULL;
    if (cap && (ss = malloc(cap * sizeof *ss)))
        for (gp_stack *s = g_list; s; s = s->next)
            if (s->arb) ss[n++] = s;
    pthread_mutex_unlock(&g_list_lock);
    uint64_t given = 0;
    for (size_t i = 0; i < n; i++) {
        gp_stack_publish(ss[i]); /* (the background offloads finished since) */
        given += gp_arbiter_yield(ss[i]->arb, need);
    }
    free(ss);
    return given;
}
