/*
 * backend_host.c -- host memory pretending to be a device, so the whole pool
 * runs (and is tested under sanitizers) on a machine without a GPU.
 *
 * Virtual reservations are PROT_NONE anonymous mappings; map() replaces a
 * range with read-write pages and unmap() puts PROT_NONE back, which returns
 * the pages to the kernel.  A capacity caps the bytes mapped at once so that
 * out-of-memory paths are reachable, and gp_host_fail() makes any call that
 * returns a status fail (the nth one, or every one from the nth on).
 * Streams are any pointer value; stream_wait() and synchronize() only count.
 * Events are slots that complete when the test says their stream progressed
 * (gp_host_stream_complete) or on synchronize(); a stream can be marked as
 * capturing a graph, so that capture handling is tested too.  Copies,
 * checksums and gathers run inside the calls, or, with deferred streams
 * (gp_host_set_deferred), as late as a GPU may run them (host_queue.h).
 *
 * It checks its callers as a strict driver would: every reservation,
 * mapping, event and pinned buffer is tracked, and a call that names one
 * that does not exist, maps over a mapping, or a destroy that leaves any
 * behind, is counted as misuse (gp_host_misuse) -- a pool bug that a real
 * device would answer with corruption or a leak.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend_host.h"
#include "host_pages.h"
#include "host_queue.h"
#include "util.h"

/* A list of address ranges: reservations, mappings (with their handle),
 * pinned host buffers. */
typedef struct host_range {
    uintptr_t addr;
    uint64_t size, handle;
    uint64_t peers; /* mappings: the devices granted access (bit per ordinal) */
} host_range;

typedef struct host_ranges {
    host_range *v;
    size_t n, cap;
} host_ranges;

typedef struct host_event {
    gp_stream stream;
    uint64_t seq; /* deferred: the queue's last op when it was recorded */
    int live, done;
} host_event;

#define HOST_MAX_CAPTURING 16

typedef struct host_fault {
    uint64_t countdown; /* 0: off; 1: the next call fails */
    gp_status status;
    int mode;           /* GP_HOST_FAIL_*                */
} host_fault;

typedef struct host_backend {
    gp_backend be; /* first: the pool sees only this */
    pthread_mutex_t lock;
    uint64_t capacity;
    uint64_t next_handle, next_stream;
    host_fault faults[GP_HOST_FN_COUNT];
    gp_host_counters c;
    host_ranges reserved, maps, pinned, registered;
    host_event *events; /* event id = index + 1; dead slots are reused */
    size_t n_events;
    gp_stream capturing[HOST_MAX_CAPTURING];
    unsigned n_capturing;
    uint64_t register_ns; /* gp_host_set_register_time */
    uint64_t peers;       /* grant_peer: devices with access to every mapping */
    int deferred;         /* gp_host_set_deferred                          */
    host_queue q;         /* deferred: queued work (under lock)             */
    pthread_mutex_t run;  /* deferred: held while queued work runs, and by
                             what frees memory it may use (before lock)     */
} host_backend;

#define HOST(be) ((host_backend *)(be))
#define HOST_JUNK_PTR ((void *)(uintptr_t)GP_HOST_JUNK)
/* Streams made by stream_create: a range no caller's fake stream is likely
 * to use. */
#define HOST_STREAM_BASE 0x5eed0000000ull

static const char *const host_fn_names[] = {
#define HOST_FN_NAME(ret, name, NAME, params, args) GP_BACKEND_IF_STATUS_##ret(#name,)
    GP_BACKEND_OPS(HOST_FN_NAME)
#undef HOST_FN_NAME
};

const char *gp_host_fn_name(gp_host_fn fn)
{
    return (unsigned)fn < GP_HOST_FN_COUNT ? host_fn_names[fn] : NULL;
}

/* ------------------------------------------------------------------ misuse */

/* Process-wide: the backend that saw it may be destroyed by now. */
static pthread_mutex_t host_misuse_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t host_misuse_count;
static char host_misuse_last[256];

static void host_misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void host_misuse(const char *fmt, ...)
{
    pthread_mutex_lock(&host_misuse_lock);
    host_misuse_count++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(host_misuse_last, sizeof host_misuse_last, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&host_misuse_lock);
}

uint64_t gp_host_misuse(char *msg, size_t n)
{
    pthread_mutex_lock(&host_misuse_lock);
    uint64_t count = host_misuse_count;
    if (n) snprintf(msg, n, "%s", host_misuse_last);
    pthread_mutex_unlock(&host_misuse_lock);
    return count;
}

/* ------------------------------------------------------------ range lists */

static gp_status host_ranges_add(host_ranges *l, uintptr_t addr, uint64_t size, uint64_t handle)
{
    host_range *v = gp_array_room(l->v, &l->cap, l->n, sizeof *v, 64);
    if (!v) return gp_error_set(GP_ERR_NOMEM, "host backend: out of host memory");
    l->v = v;
    l->v[l->n++] = (host_range){addr, size, handle, 0};
    return GP_OK;
}

/* The index of the range starting at addr, or l->n if none. */
static size_t host_ranges_find(const host_ranges *l, uintptr_t addr)
{
    size_t i = 0;
    while (i < l->n && l->v[i].addr != addr) i++;
    return i;
}

static void host_ranges_del(host_ranges *l, size_t i) { l->v[i] = l->v[--l->n]; }

/* Bytes of [a, a+n) covered by the ranges (they never overlap) whose peers
 * include every bit of `peers` (0: by any). */
static uint64_t host_ranges_cover_for(const host_ranges *l, uintptr_t a, uint64_t n, uint64_t peers)
{
    uint64_t in = 0;
    for (size_t i = 0; i < l->n; i++) {
        uintptr_t lo = l->v[i].addr > a ? l->v[i].addr : a;
        uintptr_t hi = l->v[i].addr + l->v[i].size < a + n ? l->v[i].addr + l->v[i].size : a + n;
        if (hi > lo && (l->v[i].peers & peers) == peers) in += hi - lo;
    }
    return in;
}

static uint64_t host_ranges_cover(const host_ranges *l, uintptr_t a, uint64_t n)
{
    return host_ranges_cover_for(l, a, n, 0);
}

/* --------------------------------------------------------- fault injection */

/* Every call of a function that can fail starts here, under the lock: it is
 * counted, and fails if a fault is armed for it and due. */
static gp_status host_fault_locked(host_backend *h, gp_host_fn fn)
{
    host_fault *f = &h->faults[fn];
    h->c.calls[fn]++;
    if (f->countdown == 0) return GP_OK;
    if (f->countdown > 1) {
        f->countdown--;
        return GP_OK;
    }
    if (f->mode != GP_HOST_FAIL_FROM) f->countdown = 0;
    h->c.injected[fn]++;
    return gp_error_set(f->status, "host %s: injected failure (%s)", host_fn_names[fn],
                        gp_status_str(f->status));
}

static gp_status host_fault_check(host_backend *h, gp_host_fn fn)
{
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, fn);
    pthread_mutex_unlock(&h->lock);
    return st;
}

void gp_host_fail(gp_backend *be, gp_host_fn fn, uint64_t nth, gp_status status, int mode)
{
    host_backend *h = HOST(be);
    if ((unsigned)fn >= GP_HOST_FN_COUNT) return;
    pthread_mutex_lock(&h->lock);
    h->faults[fn] = (host_fault){.countdown = nth, .status = status, .mode = mode};
    pthread_mutex_unlock(&h->lock);
}

void gp_host_fail_none(gp_backend *be)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    memset(h->faults, 0, sizeof h->faults);
    pthread_mutex_unlock(&h->lock);
}

/* ------------------------------------------------------ deferred streams */

static int host_device_mapped(void *ctx, uintptr_t addr, uint64_t size, int device)
{
    host_backend *h = ctx;
    return !device || !size || host_ranges_cover(&h->maps, addr, size) == size;
}

/* Run the queued ops of `stream` (of every stream: any) up to seq `upto`,
 * in order, a wait's signaler's before it; `run` is held.  An op whose
 * device memory was unmapped before it ran is misuse (a GPU would fault)
 * and does nothing. */
static void host_run_queued(host_backend *h, int any, gp_stream stream, uint64_t upto)
{
    for (;;) {
        host_op op;
        pthread_mutex_lock(&h->lock);
        int got = host_queue_take(&h->q, any, stream, upto, &op);
        int ok = got && host_op_ranges(&op, host_device_mapped, h);
        pthread_mutex_unlock(&h->lock);
        if (!got) return;
        if (!ok)
            host_misuse("host: a %s queued on stream %p (%p+%llu into %p) ran on device memory unmapped since "
                        "(a GPU would fault)", host_op_name(op.kind), op.stream, op.src, (unsigned long long)op.size,
                        op.dst);
        else if (op.kind == HOST_OP_WAIT)
            host_run_queued(h, 0, op.signaler, op.upto);
        else
            host_op_run(&op);
    }
}

static void host_run_upto(host_backend *h, int any, gp_stream stream, uint64_t upto)
{
    if (!h->deferred) return;
    pthread_mutex_lock(&h->run);
    host_run_queued(h, any, stream, upto);
    pthread_mutex_unlock(&h->run);
}

/* A call's op (lock held): nothing when the call failed (*st), queued where
 * streams are deferred (*st says whether that failed), else 1: the caller
 * runs it (host_op_run) once the lock is released. */
static int host_run_now_locked(host_backend *h, const host_op *op, gp_status *st)
{
    if (*st != GP_OK) return 0;
    if (!h->deferred) return 1;
    *st = host_queue_push(&h->q, *op);
    return 0;
}

/* Memory about to be freed (unmapped, host_free, unregistered) that queued
 * work still uses: misuse (lock held), as freeing what a GPU's pending copy
 * reads. */
static void host_free_check_locked(host_backend *h, const char *fn, uintptr_t addr, uint64_t size)
{
    const host_op *op = h->deferred ? host_queue_touching(&h->q, addr, size) : NULL;
    if (op)
        host_misuse("host %s: 0x%llx+%llu is used by a %s queued on stream %p and not yet run", fn,
                    (unsigned long long)addr, (unsigned long long)size, host_op_name(op->kind), op->stream);
}

/* Deferred: what frees memory holds `run` first, so that no queued op runs
 * in memory freed under it. */
static void host_free_begin(host_backend *h)
{
    if (h->deferred) pthread_mutex_lock(&h->run);
    pthread_mutex_lock(&h->lock);
}

static void host_free_end(host_backend *h)
{
    pthread_mutex_unlock(&h->lock);
    if (h->deferred) pthread_mutex_unlock(&h->run);
}

/* ------------------------------------------------------ address space */

static gp_status host_reserve(gp_backend *be, uint64_t size, uint64_t align,
                              uintptr_t *base)
{
    host_backend *h = HOST(be);
    gp_status st = host_fault_check(h, GP_HOST_RESERVE);
    if (st != GP_OK) {
        *base = (uintptr_t)GP_HOST_JUNK;
        return st;
    }
    if (size == 0 || align == 0 || (align & (align - 1)))
        return gp_error_set(GP_ERR_INVALID, "host reserve: bad size %llu or alignment %llu",
                            (unsigned long long)size, (unsigned long long)align);
    /* Over-reserve by `align` and cut the ends off: mmap only promises pages. */
    uint64_t span = size + align;
    void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return gp_error_set(GP_ERR_OOM, "host reserve of %llu bytes: %s",
                            (unsigned long long)size, strerror(errno));
    uintptr_t start = (uintptr_t)p, aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
    if (aligned > start) munmap(p, aligned - start);
    uintptr_t end = start + span, aend = aligned + size;
    if (end > aend) munmap((void *)aend, end - aend);
    pthread_mutex_lock(&h->lock);
    st = host_ranges_add(&h->reserved, aligned, size, 0);
    if (st == GP_OK) h->c.n_reserve++;
    pthread_mutex_unlock(&h->lock);
    if (st != GP_OK) {
        munmap((void *)aligned, size);
        return st;
    }
    *base = aligned;
    return GP_OK;
}

static void host_unreserve(gp_backend *be, uintptr_t base, uint64_t size)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    size_t i = host_ranges_find(&h->reserved, base);
    if (i == h->reserved.n || h->reserved.v[i].size != size) {
        host_misuse("host unreserve: 0x%llx+%llu was not reserved as such", (unsigned long long)base,
                    (unsigned long long)size);
    } else if (host_ranges_cover(&h->maps, base, size)) {
        host_misuse("host unreserve: 0x%llx+%llu still has %llu bytes mapped", (unsigned long long)base,
                    (unsigned long long)size, (unsigned long long)host_ranges_cover(&h->maps, base, size));
    } else {
        host_ranges_del(&h->reserved, i);
        munmap((void *)base, size);
        h->c.n_unreserve++;
    }
    pthread_mutex_unlock(&h->lock);
}

static gp_status host_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->c.n_map++;
    gp_status st = host_fault_locked(h, GP_HOST_MAP);
    if (st != GP_OK) {
        *handle = GP_HOST_JUNK;
    } else if (addr % be->granularity || size == 0 || size % be->granularity) {
        st = gp_error_set(GP_ERR_INVALID, "host map: 0x%llx+%llu is not a multiple of the granularity %llu",
                          (unsigned long long)addr, (unsigned long long)size,
                          (unsigned long long)be->granularity);
    } else if (host_ranges_cover(&h->reserved, addr, size) != size || host_ranges_cover(&h->maps, addr, size)) {
        host_misuse("host map: 0x%llx+%llu is %s", (unsigned long long)addr, (unsigned long long)size,
                    host_ranges_cover(&h->maps, addr, size) ? "mapped already" : "not inside one reservation");
        st = gp_error_set(GP_ERR_INVALID, "host map: 0x%llx+%llu is mapped already or not reserved",
                          (unsigned long long)addr, (unsigned long long)size);
    } else if (h->c.mapped + size > h->capacity) {
        st = gp_error_set(GP_ERR_OOM, "host map of %llu bytes: capacity %llu with %llu mapped",
                          (unsigned long long)size, (unsigned long long)h->capacity,
                          (unsigned long long)h->c.mapped);
    } else if ((st = host_ranges_add(&h->maps, addr, size, h->next_handle + 1)) == GP_OK &&
               mmap((void *)addr, size, PROT_READ | PROT_WRITE,
                    MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
        h->maps.n--;
        st = gp_error_set(GP_ERR_OOM, "host map of %llu bytes: %s", (unsigned long long)size, strerror(errno));
    }
    if (st == GP_OK) {
        if (h->n_capturing) h->c.n_map_capturing++;
        h->maps.v[h->maps.n - 1].peers = h->peers;
        *handle = ++h->next_handle;
        h->c.mapped += size;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

/* Device ordinals: 64 as the bits of a mapping's peers. */
#define HOST_MAX_DEVICES 64

static gp_status host_grant_peer(gp_backend *be, int peer)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_GRANT_PEER);
    if (st != GP_OK) {
        /* injected: no mapping changes */
    } else if (peer < 0 || peer >= HOST_MAX_DEVICES || peer == be->device) {
        st = gp_error_set(GP_ERR_INVALID, "host grant_peer: device %d is not another device (0..%d, this one is %d)",
                          peer, HOST_MAX_DEVICES - 1, be->device);
    } else {
        h->peers |= 1ull << peer;
        for (size_t i = 0; i < h->maps.n; i++) h->maps.v[i].peers |= 1ull << peer;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

int gp_host_peer_access(gp_backend *be, uintptr_t addr, uint64_t size, int peer)
{
    host_backend *h = HOST(be);
    if (peer < 0 || peer >= HOST_MAX_DEVICES || !size) return 0;
    pthread_mutex_lock(&h->lock);
    uint64_t in = host_ranges_cover_for(&h->maps, addr, size, 1ull << peer);
    pthread_mutex_unlock(&h->lock);
    return in == size;
}

static void host_protect_none(uintptr_t addr, uint64_t size)
{
    mmap((void *)addr, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

static gp_status host_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    host_backend *h = HOST(be);
    host_free_begin(h);
    h->c.n_unmap++;
    gp_status st = host_fault_locked(h, GP_HOST_UNMAP);
    size_t i = host_ranges_find(&h->maps, addr);
    if (st != GP_OK) {
        /* injected: the chunk stays mapped */
    } else if (i == h->maps.n || h->maps.v[i].size != size || h->maps.v[i].handle != handle) {
        host_misuse("host unmap: 0x%llx+%llu (handle %llu) was not mapped as such", (unsigned long long)addr,
                    (unsigned long long)size, (unsigned long long)handle);
        st = gp_error_set(GP_ERR_INVALID, "host unmap: 0x%llx+%llu (handle %llu) was not mapped as such",
                          (unsigned long long)addr, (unsigned long long)size, (unsigned long long)handle);
    } else {
        host_free_check_locked(h, "unmap", addr, size);
        host_protect_none(addr, size);
        host_ranges_del(&h->maps, i);
        h->c.mapped -= size;
    }
    host_free_end(h);
    return st;
}

/* ----------------------------------------------------- streams and events */

static int host_is_capturing_locked(const host_backend *h, gp_stream s)
{
    for (unsigned i = 0; i < h->n_capturing; i++)
        if (h->capturing[i] == s) return 1;
    return 0;
}

static gp_status host_stream_wait(gp_backend *be, gp_stream waiter, gp_stream signaler)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_STREAM_WAIT);
    /* As on CUDA: ordering across a capturing stream would break the capture. */
    if (st == GP_OK && waiter != signaler) {
        if (host_is_capturing_locked(h, waiter) || host_is_capturing_locked(h, signaler))
            st = gp_error_set(GP_ERR_BACKEND, "host stream_wait: %p or %p is capturing a graph", waiter,
                              signaler);
        else
            h->c.n_stream_wait++;
        host_run_now_locked(h, &(host_op){.stream = waiter, .kind = HOST_OP_WAIT, .signaler = signaler,
                                          .upto = h->q.seq}, &st); /* (a wait run now does nothing) */
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static gp_status host_synchronize(gp_backend *be)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_SYNCHRONIZE);
    if (st == GP_OK) {
        h->c.n_sync++;
        for (size_t i = 0; i < h->n_events; i++) h->events[i].done = 1;
    }
    pthread_mutex_unlock(&h->lock);
    if (st == GP_OK) host_run_upto(h, 1, NULL, UINT64_MAX);
    return st;
}

/* The live event `event`, or NULL after counting a misuse by `fn`. */
static host_event *host_event_live(host_backend *h, uint64_t event, const char *fn)
{
    if (event && event <= h->n_events && h->events[event - 1].live) return &h->events[event - 1];
    host_misuse("host %s: event %llu is not live", fn, (unsigned long long)event);
    return NULL;
}

static gp_status host_event_record(gp_backend *be, gp_stream stream, uint64_t *event)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_EVENT_RECORD);
    size_t i = 0;
    while (i < h->n_events && h->events[i].live) i++;
    if (st != GP_OK) {
        *event = GP_HOST_JUNK;
    } else if (i == h->n_events) {
        host_event *e = realloc(h->events, (h->n_events + 1) * sizeof *e);
        if (!e) st = gp_error_set(GP_ERR_NOMEM, "host event_record: out of host memory");
        else { h->events = e; h->n_events++; }
    }
    if (st == GP_OK) {
        h->events[i] = (host_event){.stream = stream, .seq = h->q.seq, .live = 1, .done = 0};
        h->c.n_event_record++;
        h->c.events_live++;
        *event = i + 1;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static gp_status host_event_query(gp_backend *be, uint64_t event, int *done)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->c.n_event_query++;
    gp_status st = host_fault_locked(h, GP_HOST_EVENT_QUERY);
    host_event *e = st == GP_OK ? host_event_live(h, event, "event_query") : NULL;
    if (st != GP_OK)
        *done = (int)(GP_HOST_JUNK & 0x7fffffff);
    else if (!e)
        st = gp_error_set(GP_ERR_INVALID, "host event_query: event %llu is not live", (unsigned long long)event);
    else
        *done = e->done;
    pthread_mutex_unlock(&h->lock);
    return st;
}

static void host_event_release(gp_backend *be, uint64_t event)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    host_event *e = host_event_live(h, event, "event_release");
    if (e) {
        e->live = 0;
        h->c.events_live--;
    }
    pthread_mutex_unlock(&h->lock);
}

static gp_status host_event_wait(gp_backend *be, uint64_t event)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_EVENT_WAIT);
    host_event *e = st == GP_OK ? host_event_live(h, event, "event_wait") : NULL;
    if (st == GP_OK && !e)
        st = gp_error_set(GP_ERR_INVALID, "host event_wait: event %llu is not live", (unsigned long long)event);
    gp_stream stream = e ? e->stream : NULL;
    uint64_t seq = e ? e->seq : 0;
    if (st == GP_OK && e) e->done = 1; /* the host ran (or runs now) everything queued before it */
    pthread_mutex_unlock(&h->lock);
    if (st == GP_OK) host_run_upto(h, 0, stream, seq);
    return st;
}

static gp_status host_is_capturing(gp_backend *be, gp_stream stream, int *capturing)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_IS_CAPTURING);
    *capturing = st == GP_OK ? host_is_capturing_locked(h, stream) : (int)(GP_HOST_JUNK & 0x7fffffff);
    pthread_mutex_unlock(&h->lock);
    return st;
}

static gp_status host_mem_info(gp_backend *be, uint64_t *free_b, uint64_t *total_b)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_MEM_INFO);
    if (st != GP_OK) {
        *total_b = *free_b = GP_HOST_JUNK;
    } else {
        *total_b = h->capacity;
        *free_b = h->capacity > h->c.mapped ? h->capacity - h->c.mapped : 0;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

/* ----------------------------------------------------------------- offload */

static gp_status host_host_alloc(gp_backend *be, uint64_t size, void **ptr)
{
    host_backend *h = HOST(be);
    gp_status st = host_fault_check(h, GP_HOST_HOST_ALLOC);
    if (st != GP_OK) {
        *ptr = HOST_JUNK_PTR;
        return st;
    }
    if (size == 0) return gp_error_set(GP_ERR_INVALID, "host host_alloc: size 0");
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return gp_error_set(GP_ERR_NOMEM, "host host_alloc of %llu bytes: %s", (unsigned long long)size,
                            strerror(errno));
    pthread_mutex_lock(&h->lock);
    st = host_ranges_add(&h->pinned, (uintptr_t)p, size, 0);
    if (st == GP_OK) {
        h->c.n_host_alloc++;
        h->c.host_bytes += size;
    }
    pthread_mutex_unlock(&h->lock);
    if (st != GP_OK) {
        munmap(p, size);
        return st;
    }
    *ptr = p;
    return GP_OK;
}

static void host_host_free(gp_backend *be, void *ptr, uint64_t size)
{
    host_backend *h = HOST(be);
    if (!ptr) return;
    host_free_begin(h);
    size_t i = host_ranges_find(&h->pinned, (uintptr_t)ptr);
    if (i == h->pinned.n || h->pinned.v[i].size != size) {
        host_misuse("host host_free: %p+%llu was not allocated as such", ptr, (unsigned long long)size);
    } else {
        host_free_check_locked(h, "host_free", (uintptr_t)ptr, size);
        host_ranges_del(&h->pinned, i);
        munmap(ptr, size);
        h->c.host_bytes -= size;
    }
    host_free_end(h);
}

/* Populating is the host's work on either backend; only the fault point
 * is the host backend's own. */
static gp_status host_host_populate(gp_backend *be, void *ptr, uint64_t size)
{
    gp_status st = host_fault_check(HOST(be), GP_HOST_HOST_POPULATE);
    return st == GP_OK ? gp_host_pages_populate(ptr, size) : st;
}

/* Nothing to lock on the host: the range is only tracked, so that an
 * unregister of what was not registered, or a destroy that leaves a
 * registration behind, is caught.  A call lasts register_ns first. */
static gp_status host_host_register(gp_backend *be, void *ptr, uint64_t size)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    if (++h->c.n_registering > h->c.most_registering) h->c.most_registering = h->c.n_registering;
    uint64_t ns = h->register_ns;
    pthread_mutex_unlock(&h->lock);
    if (ns) nanosleep(&(struct timespec){(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}, NULL);
    pthread_mutex_lock(&h->lock);
    h->c.n_registering--;
    gp_status st = host_fault_locked(h, GP_HOST_HOST_REGISTER);
    if (st == GP_OK && (!ptr || !size))
        st = gp_error_set(GP_ERR_INVALID, "host host_register: %p+%llu is empty", ptr, (unsigned long long)size);
    if (st == GP_OK && host_ranges_cover(&h->registered, (uintptr_t)ptr, size)) {
        host_misuse("host host_register: %p+%llu overlaps a registered range", ptr, (unsigned long long)size);
        st = gp_error_set(GP_ERR_INVALID, "host host_register: %p+%llu is registered already", ptr,
                          (unsigned long long)size);
    }
    if (st == GP_OK && (st = host_ranges_add(&h->registered, (uintptr_t)ptr, size, 0)) == GP_OK) {
        h->c.n_host_register++;
        h->c.host_registered += size;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static void host_host_unregister(gp_backend *be, void *ptr, uint64_t size)
{
    host_backend *h = HOST(be);
    host_free_begin(h);
    size_t i = host_ranges_find(&h->registered, (uintptr_t)ptr);
    if (i == h->registered.n || h->registered.v[i].size != size) {
        host_misuse("host host_unregister: %p+%llu was not registered as such", ptr, (unsigned long long)size);
    } else {
        host_free_check_locked(h, "host_unregister", (uintptr_t)ptr, size);
        host_ranges_del(&h->registered, i);
        h->c.host_registered -= size;
    }
    host_free_end(h);
}

static gp_status host_stream_create(gp_backend *be, gp_stream *out)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_STREAM_CREATE);
    if (st != GP_OK) {
        *out = HOST_JUNK_PTR;
    } else {
        *out = (gp_stream)(uintptr_t)(HOST_STREAM_BASE + ++h->next_stream);
        h->c.streams_live++;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static void host_stream_destroy(gp_backend *be, gp_stream stream)
{
    host_backend *h = HOST(be);
    uintptr_t s = (uintptr_t)stream;
    host_run_upto(h, 0, stream, UINT64_MAX); /* (a GPU finishes it) */
    pthread_mutex_lock(&h->lock);
    if (s <= HOST_STREAM_BASE || s > HOST_STREAM_BASE + h->next_stream || h->c.streams_live == 0)
        host_misuse("host stream_destroy: %p was not made by stream_create or is destroyed", stream);
    else
        h->c.streams_live--;
    pthread_mutex_unlock(&h->lock);
}

/* Copies run at once (the host is the device); the device side must be
 * mapped, as on a GPU, where touching unmapped memory is a fatal fault. */
static gp_status host_copy(gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream stream)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->c.n_copy++;
    gp_status st = host_fault_locked(h, GP_HOST_COPY);
    if (dir == (GP_COPY_D2H | GP_COPY_BY_KERNEL) || dir == (GP_COPY_H2D | GP_COPY_BY_KERNEL))
        dir &= ~GP_COPY_BY_KERNEL; /* (the host is the device) */
    if (st == GP_OK && dir != GP_COPY_D2H && dir != GP_COPY_H2D && dir != GP_COPY_D2D) {
        st = gp_error_set(GP_ERR_INVALID, "host copy: direction %d is not one of GP_COPY_*", dir);
    } else if (st == GP_OK) {
        int dev_src = dir != GP_COPY_H2D, dev_dst = dir != GP_COPY_D2H;
        if ((dev_src && host_ranges_cover(&h->maps, (uintptr_t)src, size) != size) ||
            (dev_dst && host_ranges_cover(&h->maps, (uintptr_t)dst, size) != size))
            st = gp_error_set(GP_ERR_BACKEND, "host copy of %llu bytes from %p to %p: device memory not mapped "
                              "(a GPU would fault)", (unsigned long long)size, src, dst);
    }
    if (st == GP_OK) h->c.copy_bytes += size;
    host_op op = {.stream = stream, .kind = HOST_OP_COPY, .dst = dst, .src = src, .size = size, .dir = dir};
    int now = host_run_now_locked(h, &op, &st);
    pthread_mutex_unlock(&h->lock);
    if (now) host_op_run(&op);
    return st;
}

static gp_status host_checksum(gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out,
                               gp_stream stream)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_CHECKSUM);
    if (st == GP_OK && size % 8)
        st = gp_error_set(GP_ERR_INVALID, "host checksum of %llu bytes: not a multiple of 8", (unsigned long long)size);
    else if (st == GP_OK && (host_ranges_cover(&h->maps, (uintptr_t)ptr, size) != size ||
                             host_ranges_cover(&h->maps, (uintptr_t)out, 8) != 8))
        st = gp_error_set(GP_ERR_BACKEND, "host checksum of %llu bytes at %p into %p: device memory not mapped",
                          (unsigned long long)size, ptr, out);
    host_op op = {.stream = stream, .kind = HOST_OP_CHECKSUM, .dst = out, .src = ptr, .size = size, .seed = seed};
    int now = host_run_now_locked(h, &op, &st);
    pthread_mutex_unlock(&h->lock);
    if (now) host_op_run(&op);
    return st;
}

static gp_status host_gather(gp_backend *be, void *dst, const void *const *srcs, const size_t *lens, uint32_t n,
                             uint64_t align, uint64_t max_len, gp_stream stream)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    gp_status st = host_fault_locked(h, GP_HOST_GATHER);
    if (st == GP_OK && (!align || (align & (align - 1))))
        st = gp_error_set(GP_ERR_INVALID, "host gather aligned to %llu: expected a power of two",
                          (unsigned long long)align);
    /* Every range must be mapped where it comes from and where it goes. */
    uint64_t off = 0;
    for (uint32_t b = 0; b < n && st == GP_OK; b++) {
        uint64_t len = lens[b] > max_len ? 0 : lens[b];
        if (len && (host_ranges_cover(&h->maps, (uintptr_t)srcs[b], len) != len ||
                    host_ranges_cover(&h->maps, (uintptr_t)dst + off, len) != len))
            st = gp_error_set(GP_ERR_BACKEND, "host gather of %llu bytes from %p to %p: device memory not mapped "
                              "(a GPU would fault)", (unsigned long long)len, srcs[b], (void *)((char *)dst + off));
        off += (len + align - 1) & ~(align - 1);
    }
    if (st == GP_OK) h->c.copy_bytes += off;
    host_op op = {.stream = stream, .kind = HOST_OP_GATHER, .dst = dst, .srcs = srcs, .lens = lens, .n = n,
                  .align = align, .max_len = max_len};
    int now = host_run_now_locked(h, &op, &st);
    pthread_mutex_unlock(&h->lock);
    if (now) host_op_run(&op);
    return st;
}

/* The host has no contexts: fn runs as it is (unless the call fails),
 * after the work queued so far, as the device work it stands for (the host
 * codec's) would. */
static gp_status host_in_context(gp_backend *be, gp_status (*fn)(void *arg), void *arg)
{
    gp_status st = host_fault_check(HOST(be), GP_HOST_IN_CONTEXT);
    if (st == GP_OK) host_run_upto(HOST(be), 1, NULL, UINT64_MAX);
    return st == GP_OK ? fn(arg) : st;
}

/* ------------------------------------------------------------ the backend */

static void host_destroy(gp_backend *be)
{
    host_backend *h = HOST(be);
    if (h->maps.n || h->reserved.n || h->pinned.n || h->registered.n || h->c.events_live || h->c.streams_live)
        host_misuse("host destroy: %zu mappings (%llu bytes), %zu reservations, %zu pinned buffers, "
                    "%zu registered ranges, %llu events and %llu streams are left", h->maps.n,
                    (unsigned long long)h->c.mapped, h->reserved.n, h->pinned.n, h->registered.n,
                    (unsigned long long)h->c.events_live, (unsigned long long)h->c.streams_live);
    for (size_t i = 0; i < h->reserved.n; i++) munmap((void *)h->reserved.v[i].addr, h->reserved.v[i].size);
    for (size_t i = 0; i < h->pinned.n; i++) munmap((void *)h->pinned.v[i].addr, h->pinned.v[i].size);
    free(h->reserved.v);
    free(h->maps.v);
    free(h->pinned.v);
    free(h->registered.v); /* (the caller maps what it registers: not ours to unmap) */
    free(h->events);
    host_queue_free(&h->q);
    pthread_mutex_destroy(&h->run);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

gp_status gp_backend_host_create(uint64_t capacity, gp_backend **out)
{
    if (capacity == 0)
        return gp_error_set(GP_ERR_INVALID, "host backend: capacity must be > 0 bytes");
    host_backend *h = calloc(1, sizeof *h);
    if (!h) return gp_error_set(GP_ERR_NOMEM, "host backend: out of host memory");
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_init(&h->run, NULL);
    h->capacity = capacity;
    h->be = (gp_backend){.name = "host", .device = 0, .total = capacity, .granularity = 4096,
                         .destroy = host_destroy};
#define HOST_OP(ret, name, NAME, params, args) h->be.name = host_##name;
    GP_BACKEND_OPS(HOST_OP)
#undef HOST_OP
    *out = &h->be;
    return GP_OK;
}

void gp_host_counters_get(gp_backend *be, gp_host_counters *out)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    *out = h->c;
    pthread_mutex_unlock(&h->lock);
}

void gp_host_set_register_time(gp_backend *be, uint64_t ns)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->register_ns = ns;
    pthread_mutex_unlock(&h->lock);
}

void gp_host_set_capacity(gp_backend *be, uint64_t capacity)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->capacity = capacity;
    be->total = capacity;
    pthread_mutex_unlock(&h->lock);
}

void gp_host_set_deferred(gp_backend *be, int on)
{
    host_backend *h = HOST(be);
    host_run_upto(h, 1, NULL, UINT64_MAX);
    h->deferred = on != 0;
}

void gp_host_stream_complete(gp_backend *be, gp_stream stream)
{
    host_backend *h = HOST(be);
    host_run_upto(h, 0, stream, UINT64_MAX);
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->n_events; i++)
        if (h->events[i].live && h->events[i].stream == stream) h->events[i].done = 1;
    pthread_mutex_unlock(&h->lock);
}

void gp_host_set_capturing(gp_backend *be, gp_stream stream, int on)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    unsigned i = 0;
    while (i < h->n_capturing && h->capturing[i] != stream) i++;
    if (on && i == h->n_capturing && h->n_capturing < HOST_MAX_CAPTURING)
        h->capturing[h->n_capturing++] = stream;
    else if (!on && i < h->n_capturing)
        h->capturing[i] = h->capturing[--h->n_capturing];
    pthread_mutex_unlock(&h->lock);
}
