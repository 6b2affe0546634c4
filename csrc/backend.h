/*
 * backend.h -- the device interface: everything the pool needs from a device,
 * as a table of function pointers (as gpu-alloc's MemoryDevice trait keeps its
 * allocator independent of Vulkan).  pool.c sees only this; backend_cuda.c
 * implements it over the CUDA driver API, backend_host.c over mmap.
 *
 * All functions return GP_OK or a gp_status, leaving a message with
 * gp_error_set() (error.h) on failure.  GP_ERR_OOM means "the device has no memory for
 * this", which the pool answers by trimming and retrying; anything else is a
 * hard error.
 */
#ifndef GP_BACKEND_H
#define GP_BACKEND_H

#include "error.h"
#include "gpupool.h"

/* Directions of gp_backend.copy.  GP_COPY_BY_KERNEL, or'ed with D2H or
 * H2D, is for a copy of a few KiB whose host side is host_alloc memory: the
 * device's threads do it, so that it does not wait behind the large copies
 * other streams have queued on the copy engine of that direction (a
 * codec's arrays while the other lane's data is copied). */
enum { GP_COPY_D2H = 0, GP_COPY_H2D = 1, GP_COPY_D2D = 2, GP_COPY_BY_KERNEL = 4 };

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

    /* For offload (offload.c).  Page-locked host memory, which the device
     * reads and writes asynchronously at full speed: pinning is slow (about
     * 1.6 GB/s), so callers keep it.  GP_ERR_NOMEM when the host has none. */
    gp_status (*host_alloc)(gp_backend *be, uint64_t size, void **ptr);
    void (*host_free)(gp_backend *be, void *ptr, uint64_t size);
    /* A stream of the backend's own, ordered with no other stream. */
    gp_status (*stream_create)(gp_backend *be, gp_stream *out);
    void (*stream_destroy)(gp_backend *be, gp_stream stream);
    /* Queue a copy of `size` bytes from `src` to `dst` on `stream`, in the
     * direction GP_COPY_*; it runs in stream order (asynchronously to the
     * host when the host side is host_alloc memory).  Device addresses must
     * be mapped until the copy has run. */
    gp_status (*copy)(gp_backend *be, void *dst, const void *src, uint64_t size,
                      int dir, gp_stream stream);
    /* Block the host until `event` (event_record) has completed. */
    gp_status (*event_wait)(gp_backend *be, uint64_t event);
    /* Write, in `stream`'s order, the checksum (checksum.h) of the device
     * memory [ptr, ptr+size) (size a multiple of 8) with `seed` to the 8
     * bytes at device address `out`. */
    gp_status (*checksum)(gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out,
                          gp_stream stream);
    /* Queue on `stream` the gather of n device ranges into one: range b,
     * srcs[b] for lens[b] bytes, lands at dst + the sum of the earlier
     * ranges' lengths, each rounded up to `align` (a power of two); a
     * length above max_len counts as 0 and copies nothing.  srcs and lens
     * are read where the work runs, in stream order (a compression may
     * have written them): device arrays on a GPU.  Compressed offload
     * gathers a batch's chunks so that one copy takes them to the host. */
    gp_status (*gather)(gp_backend *be, void *dst, const void *const *srcs, const size_t *lens, uint32_t n,
                        uint64_t align, uint64_t max_len, gp_stream stream);
    /* Run fn(arg) on the calling thread with the device's context current
     * (CUDA: the primary context, pushed only if another one is current),
     * for libraries that work on the current context, as nvCOMP does
     * (codec_nvcomp.c); returns fn's status. */
    gp_status (*in_context)(gp_backend *be, gp_status (*fn)(void *arg), void *arg);

    void (*destroy)(gp_backend *be);
};

#endif /* GP_BACKEND_H */
