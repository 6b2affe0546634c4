/*
 * backend_host.c -- host memory pretending to be a device, so the whole pool
 * runs (and is tested under sanitizers) on a machine without a GPU.
 *
 * Virtual reservations are PROT_NONE anonymous mappings; map() replaces a
 * range with read-write pages and unmap() puts PROT_NONE back, which returns
 * the pages to the kernel.  A capacity caps the bytes mapped at once so that
 * out-of-memory paths are reachable, and gp_host_fail_map() injects failures.
 * Streams are any pointer value; stream_wait() and synchronize() only count.
 * Events are slots that complete when the test says their stream progressed
 * (gp_host_stream_complete) or on synchronize(); a stream can be marked as
 * capturing a graph, so that capture handling is tested too.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend_host.h"
#include "checksum.h"

typedef struct host_map {
    uintptr_t addr;
    uint64_t size, handle;
} host_map;

typedef struct host_event {
    gp_stream stream;
    int live, done;
} host_event;

#define HOST_MAX_CAPTURING 16

typedef struct host_backend {
    gp_backend be; /* first: the pool sees only this */
    pthread_mutex_t lock;
    uint64_t capacity;
    uint64_t next_handle, next_stream;
    uint64_t fail_countdown; /* 0: off; 1: the next map() fails */
    gp_status fail_status;
    gp_host_counters c;
    host_map *maps; /* live mappings, to check unmap() is given what map() made */
    size_t n_maps, cap_maps;
    host_event *events; /* event id = index + 1; dead slots are reused */
    size_t n_events;
    gp_stream capturing[HOST_MAX_CAPTURING];
    unsigned n_capturing;
} host_backend;

#define HOST(be) ((host_backend *)(be))

static gp_status host_reserve(gp_backend *be, uint64_t size, uint64_t align,
                              uintptr_t *base)
{
    host_backend *h = HOST(be);
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
    h->c.n_reserve++;
    pthread_mutex_unlock(&h->lock);
    *base = aligned;
    return GP_OK;
}

static void host_unreserve(gp_backend *be, uintptr_t base, uint64_t size)
{
    host_backend *h = HOST(be);
    munmap((void *)base, size);
    pthread_mutex_lock(&h->lock);
    h->c.n_unreserve++;
    pthread_mutex_unlock(&h->lock);
}

static gp_status host_map_fn(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    host_backend *h = HOST(be);
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    h->c.n_map++;
    if (addr % be->granularity || size == 0 || size % be->granularity) {
        st = gp_error_set(GP_ERR_INVALID, "host map: 0x%llx+%llu is not a multiple of the granularity %llu",
                          (unsigned long long)addr, (unsigned long long)size,
                          (unsigned long long)be->granularity);
    } else if (h->fail_countdown && --h->fail_countdown == 0) {
        st = gp_error_set(h->fail_status, "host map: injected failure (%s)", gp_status_str(h->fail_status));
    } else if (h->c.mapped + size > h->capacity) {
        st = gp_error_set(GP_ERR_OOM, "host map of %llu bytes: capacity %llu with %llu mapped",
                          (unsigned long long)size, (unsigned long long)h->capacity,
                          (unsigned long long)h->c.mapped);
    } else if (h->n_maps == h->cap_maps) {
        size_t nc = h->cap_maps ? 2 * h->cap_maps : 64;
        host_map *m = realloc(h->maps, nc * sizeof *m);
        if (!m) st = gp_error_set(GP_ERR_NOMEM, "host map: out of host memory");
        else { h->maps = m; h->cap_maps = nc; }
    }
    if (st == GP_OK &&
        mmap((void *)addr, size, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        st = gp_error_set(GP_ERR_OOM, "host map of %llu bytes: %s", (unsigned long long)size, strerror(errno));
    if (st == GP_OK) {
        if (h->n_capturing) h->c.n_map_capturing++;
        *handle = ++h->next_handle;
        h->maps[h->n_maps++] = (host_map){addr, size, *handle};
        h->c.mapped += size;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static gp_status host_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    host_backend *h = HOST(be);
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    h->c.n_unmap++;
    size_t i = 0;
    while (i < h->n_maps && h->maps[i].addr != addr) i++;
    if (i == h->n_maps || h->maps[i].size != size || h->maps[i].handle != handle) {
        st = gp_error_set(GP_ERR_INVALID, "host unmap: 0x%llx+%llu (handle %llu) was not mapped as such",
                          (unsigned long long)addr, (unsigned long long)size, (unsigned long long)handle);
    } else {
        mmap((void *)addr, size, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        h->maps[i] = h->maps[--h->n_maps];
        h->c.mapped -= size;
    }
    pthread_mutex_unlock(&h->lock);
    return st;
}

static int host_is_capturing_locked(const host_backend *h, gp_stream s)
{
    for (unsigned i = 0; i < h->n_capturing; i++)
        if (h->capturing[i] == s) return 1;
    return 0;
}

static gp_status host_stream_wait(gp_backend *be, gp_stream waiter, gp_stream signaler)
{
    host_backend *h = HOST(be);
    if (waiter == signaler) return GP_OK;
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    /* As on CUDA: ordering across a capturing stream would break the capture. */
    if (host_is_capturing_locked(h, waiter) || host_is_capturing_locked(h, signaler))
        st = gp_error_set(GP_ERR_BACKEND, "host stream_wait: %p or %p is capturing a graph", waiter,
                          signaler);
    else
        h->c.n_stream_wait++;
    pthread_mutex_unlock(&h->lock);
    return st;
}

static gp_status host_synchronize(gp_backend *be)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->c.n_sync++;
    for (size_t i = 0; i < h->n_events; i++) h->events[i].done = 1;
    pthread_mutex_unlock(&h->lock);
    return GP_OK;
}

static gp_status host_event_record(gp_backend *be, gp_stream stream, uint64_t *event)
{
    host_backend *h = HOST(be);
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    size_t i = 0;
    while (i < h->n_events && h->events[i].live) i++;
    if (i == h->n_events) {
        host_event *e = realloc(h->events, (h->n_events + 1) * sizeof *e);
        if (!e) st = gp_error_set(GP_ERR_NOMEM, "host event_record: out of host memory");
        else { h->events = e; h->n_events++; }
    }
    if (st == GP_OK) {
        h->events[i] = (host_event){.stream = stream, .live = 1, .done = 0};
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
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    h->c.n_event_query++;
    if (event == 0 || event > h->n_events || !h->events[event - 1].live)
        st = gp_error_set(GP_ERR_INVALID, "host event_query: event %llu is not live", (unsigned long long)event);
    else
        *done = h->events[event - 1].done;
    pthread_mutex_unlock(&h->lock);
    return st;
}

static void host_event_release(gp_backend *be, uint64_t event)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    if (event && event <= h->n_events && h->events[event - 1].live) {
        h->events[event - 1].live = 0;
        h->c.events_live--;
    }
    pthread_mutex_unlock(&h->lock);
}

static gp_status host_is_capturing(gp_backend *be, gp_stream stream, int *capturing)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    *capturing = host_is_capturing_locked(h, stream);
    pthread_mutex_unlock(&h->lock);
    return GP_OK;
}

static gp_status host_mem_info(gp_backend *be, uint64_t *free_b, uint64_t *total_b)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    *total_b = h->capacity;
    *free_b = h->capacity > h->c.mapped ? h->capacity - h->c.mapped : 0;
    pthread_mutex_unlock(&h->lock);
    return GP_OK;
}

static gp_status host_host_alloc(gp_backend *be, uint64_t size, void **ptr)
{
    host_backend *h = HOST(be);
    if (size == 0) return gp_error_set(GP_ERR_INVALID, "host host_alloc: size 0");
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return gp_error_set(GP_ERR_NOMEM, "host host_alloc of %llu bytes: %s", (unsigned long long)size,
                            strerror(errno));
    pthread_mutex_lock(&h->lock);
    h->c.n_host_alloc++;
    h->c.host_bytes += size;
    pthread_mutex_unlock(&h->lock);
    *ptr = p;
    return GP_OK;
}

static void host_host_free(gp_backend *be, void *ptr, uint64_t size)
{
    host_backend *h = HOST(be);
    if (!ptr) return;
    munmap(ptr, size);
    pthread_mutex_lock(&h->lock);
    h->c.host_bytes -= size;
    pthread_mutex_unlock(&h->lock);
}

static gp_status host_stream_create(gp_backend *be, gp_stream *out)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    /* A value no caller's fake stream is likely to use. */
    *out = (gp_stream)(uintptr_t)(0x5eed0000000ull + ++h->next_stream);
    h->c.streams_live++;
    pthread_mutex_unlock(&h->lock);
    return GP_OK;
}

static void host_stream_destroy(gp_backend *be, gp_stream stream)
{
    host_backend *h = HOST(be);
    (void)stream;
    pthread_mutex_lock(&h->lock);
    h->c.streams_live--;
    pthread_mutex_unlock(&h->lock);
}

/* Bytes of [a, a+n) that lie in live mappings (they never overlap). */
static uint64_t host_mapped_in(const host_backend *h, uintptr_t a, uint64_t n)
{
    uint64_t in = 0;
    for (size_t i = 0; i < h->n_maps; i++) {
        uintptr_t lo = h->maps[i].addr > a ? h->maps[i].addr : a;
        uintptr_t hi = h->maps[i].addr + h->maps[i].size < a + n ? h->maps[i].addr + h->maps[i].size : a + n;
        if (hi > lo) in += hi - lo;
    }
    return in;
}

/* Copies run at once (the host is the device); the device side must be
 * mapped, as on a GPU, where touching unmapped memory is a fatal fault. */
static gp_status host_copy(gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream stream)
{
    host_backend *h = HOST(be);
    (void)stream;
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    h->c.n_copy++;
    if (dir != GP_COPY_D2H && dir != GP_COPY_H2D && dir != GP_COPY_D2D) {
        st = gp_error_set(GP_ERR_INVALID, "host copy: direction %d is not one of GP_COPY_*", dir);
    } else {
        int dev_src = dir != GP_COPY_H2D, dev_dst = dir != GP_COPY_D2H;
        if ((dev_src && host_mapped_in(h, (uintptr_t)src, size) != size) ||
            (dev_dst && host_mapped_in(h, (uintptr_t)dst, size) != size))
            st = gp_error_set(GP_ERR_BACKEND, "host copy of %llu bytes from %p to %p: device memory not mapped "
                              "(a GPU would fault)", (unsigned long long)size, src, dst);
    }
    if (st == GP_OK) h->c.copy_bytes += size;
    pthread_mutex_unlock(&h->lock);
    if (st == GP_OK && size) memmove(dst, src, size);
    return st;
}

static gp_status host_checksum(gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out,
                               gp_stream stream)
{
    host_backend *h = HOST(be);
    (void)stream;
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    if (size % 8)
        st = gp_error_set(GP_ERR_INVALID, "host checksum of %llu bytes: not a multiple of 8", (unsigned long long)size);
    else if (host_mapped_in(h, (uintptr_t)ptr, size) != size || host_mapped_in(h, (uintptr_t)out, 8) != 8)
        st = gp_error_set(GP_ERR_BACKEND, "host checksum of %llu bytes at %p into %p: device memory not mapped",
                          (unsigned long long)size, ptr, out);
    pthread_mutex_unlock(&h->lock);
    if (st == GP_OK) {
        uint64_t sum = gp_checksum_words(ptr, size, seed);
        memcpy(out, &sum, 8);
    }
    return st;
}

static gp_status host_event_wait(gp_backend *be, uint64_t event)
{
    host_backend *h = HOST(be);
    gp_status st = GP_OK;
    pthread_mutex_lock(&h->lock);
    if (event == 0 || event > h->n_events || !h->events[event - 1].live)
        st = gp_error_set(GP_ERR_INVALID, "host event_wait: event %llu is not live", (unsigned long long)event);
    else
        h->events[event - 1].done = 1; /* the host ran everything queued before it */
    pthread_mutex_unlock(&h->lock);
    return st;
}

static void host_destroy(gp_backend *be)
{
    host_backend *h = HOST(be);
    for (size_t i = 0; i < h->n_maps; i++)
        mmap((void *)h->maps[i].addr, h->maps[i].size, PROT_NONE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    free(h->maps);
    free(h->events);
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
    h->capacity = capacity;
    h->be = (gp_backend){
        .name = "host", .device = 0, .total = capacity, .granularity = 4096,
        .reserve = host_reserve, .unreserve = host_unreserve, .map = host_map_fn,
        .unmap = host_unmap, .stream_wait = host_stream_wait,
        .event_record = host_event_record, .event_query = host_event_query,
        .event_release = host_event_release, .is_capturing = host_is_capturing,
        .synchronize = host_synchronize, .mem_info = host_mem_info, .destroy = host_destroy,
        .host_alloc = host_host_alloc, .host_free = host_host_free, .stream_create = host_stream_create,
        .stream_destroy = host_stream_destroy, .copy = host_copy, .event_wait = host_event_wait,
        .checksum = host_checksum,
    };
    *out = &h->be;
    return GP_OK;
}

void gp_host_fail_map(gp_backend *be, uint64_t nth, gp_status status)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    h->fail_countdown = nth;
    h->fail_status = status;
    pthread_mutex_unlock(&h->lock);
}

void gp_host_counters_get(gp_backend *be, gp_host_counters *out)
{
    host_backend *h = HOST(be);
    pthread_mutex_lock(&h->lock);
    *out = h->c;
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

void gp_host_stream_complete(gp_backend *be, gp_stream stream)
{
    host_backend *h = HOST(be);
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
