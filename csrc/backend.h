/*
 * backend.h -- the device interface: everything the pool needs from a device,
 * as a table of function pointers (as gpu-alloc's MemoryDevice trait keeps its
 * allocator independent of Vulkan).  pool.c sees only this; backend_cuda.c
 * implements it over the CUDA driver API, backend_host.c over mmap.
 *
 * All functions return GP_OK or a gp_status, leaving a message with
 * gp_error_set() on failure.  GP_ERR_OOM means "the device has no memory for
 * this", which the pool answers by trimming and retrying; anything else is a
 * hard error.
 */
#ifndef GP_BACKEND_H
#define GP_BACKEND_H

#include "gpupool.h"

struct gp_backend {
    const char *name;        /* "cuda", "host"                               */
    int device;              /* device ordinal                               */
    uint64_t total;          /* device memory in bytes                       */
    uint64_t granularity;    /* mapping unit: addresses and sizes of map()
                                are multiples of it                          */

    /* Reserve `size` bytes of virtual address space aligned to `align`
     * (both multiples of granularity); nothing is backed yet. */
    gp_status (*reserve)(gp_backend *be, uint64_t size, uint64_t align,
                         uintptr_t *base);
    void (*unreserve)(gp_backend *be, uintptr_t base, uint64_t size);

    /* Back [addr, addr+size) inside a reservation with new physical memory,
     * readable and writable by the device; `*handle` identifies it for
     * unmap.  GP_ERR_OOM when the device is full. */
    gp_status (*map)(gp_backend *be, uintptr_t addr, uint64_t size,
                     uint64_t *handle);
    /* Release exactly one earlier map(): same addr, size and handle. */
    gp_status (*unmap)(gp_backend *be, uintptr_t addr, uint64_t size,
                       uint64_t handle);

    /* Make `waiter` wait (on the device, not the host) for all work queued
     * on `signaler` so far. */
    gp_status (*stream_wait)(gp_backend *be, gp_stream waiter,
                             gp_stream signaler);
    /* Events, for Tensor.record_stream: record one on `stream` (it completes
     * when the work queued there so far has), ask whether it has completed
     * (no host wait), and give it back.  `*event` is never 0. */
    gp_status (*event_record)(gp_backend *be, gp_stream stream, uint64_t *event);
    gp_status (*event_query)(gp_backend *be, uint64_t event, int *done);
    void (*event_release)(gp_backend *be, uint64_t event);
    /* Whether `stream` is capturing a CUDA graph now (*capturing 0 or 1).
     * Asked only while a capture is known to be underway. */
    gp_status (*is_capturing)(gp_backend *be, gp_stream stream, int *capturing);
    /* Block the host until all work on the device has completed. */
    gp_status (*synchronize)(gp_backend *be);
    /* Free and total memory of the device as its driver sees it. */
    gp_status (*mem_info)(gp_backend *be, uint64_t *free_b, uint64_t *total_b);

    void (*destroy)(gp_backend *be);
};

/* Leave a message for gp_last_error() (printf format); returns `s` so that
 * callers can write `return gp_error_set(GP_ERR_OOM, "...")`. */
gp_status gp_error_set(gp_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void gp_error_clear(void);

/* Host backend fault injection and observation, for tests. */
typedef struct gp_host_counters {
    uint64_t n_map, n_unmap, n_reserve, n_unreserve;
    uint64_t n_stream_wait, n_sync;
    uint64_t n_map_capturing; /* map() calls while a fake capture was on */
    uint64_t n_event_record, n_event_query;
    uint64_t events_live;     /* recorded and not yet released */
    uint64_t mapped;         /* bytes mapped now */
} gp_host_counters;

/* Make the n-th next map() fail with `status` (1 = the very next one);
 * 0 disarms. */
void gp_host_fail_map(gp_backend *be, uint64_t nth, gp_status status);
void gp_host_counters_get(gp_backend *be, gp_host_counters *out);
/* Change the capacity (bytes that may be mapped at once). */
void gp_host_set_capacity(gp_backend *be, uint64_t capacity);
/* Fake stream progress: events recorded on `stream` so far complete (all
 * events complete on synchronize()).  Until then event_query says "not done",
 * as for a stream that still runs a long kernel. */
void gp_host_stream_complete(gp_backend *be, gp_stream stream);
/* Mark `stream` as capturing a graph (on != 0) or not.  While any stream
 * captures, stream_wait() involving it fails, as on CUDA, and map() calls are
 * counted in n_map_capturing. */
void gp_host_set_capturing(gp_backend *be, gp_stream stream, int on);

#endif /* GP_BACKEND_H */
