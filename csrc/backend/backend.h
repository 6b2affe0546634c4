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

/* The operations of a backend, one X(ret, name, NAME, params, args) each,
 * with what each promises: ret is gp_status or void, NAME the upper-case
 * name (the host backend's fault-injection points, backend_host.h), params
 * the parameters and args the same names as a call passes them.  This one
 * list makes the function pointers of struct gp_backend, the forwarders of
 * the adaptors (backend_forward.c), the initialisers of the backends and
 * the host backend's fault-injection points: an operation added here
 * reaches all of them, or the build fails.  destroy is apart (it is every
 * adaptor's own). */
#define GP_BACKEND_OPS(X)                                                                              \
    /* Reserve `size` bytes of virtual address space aligned to `align` (both                       \
     * multiples of granularity; align a power of two); nothing is backed yet. */                  \
    X(gp_status, reserve, RESERVE, (gp_backend *be, uint64_t size, uint64_t align, uintptr_t *base),  \
      (be, size, align, base))                                                                       \
    /* Give back exactly one earlier reservation (same base and size), with                         \
     * nothing mapped in it any more. */                                                              \
    X(void, unreserve, UNRESERVE, (gp_backend *be, uintptr_t base, uint64_t size), (be, base, size))  \
    /* Back [addr, addr+size) inside a reservation with new physical memory,                          \
     * readable and writable by the device; `*handle` identifies it for                               \
     * unmap.  GP_ERR_OOM when the device is full. */                                                 \
    X(gp_status, map, MAP, (gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle),          \
      (be, addr, size, handle))                                                                      \
    /* Release exactly one earlier map(): same addr, size and handle. */                              \
    X(gp_status, unmap, UNMAP, (gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle),      \
      (be, addr, size, handle))                                                                      \
    /* Let device `peer` of the process read and write this device's memory:                         \
     * every mapping live now and every later one, until unmapped.  For                              \
     * copies and kernels of one process that span devices (PyTorch asks                             \
     * before the first: enablePeerAccess).  Idempotent.  GP_ERR_INVALID for                         \
     * this device itself, a device that does not exist or one with no                               \
     * peer-to-peer path to this one; on a failure the peer has no access to                         \
     * later mappings (a call again retries). */                                                     \
    X(gp_status, grant_peer, GRANT_PEER, (gp_backend *be, int peer), (be, peer))                      \
    /* Make `waiter` wait (on the device, not the host) for all work queued                          \
     * on `signaler` so far. */                                                                        \
    X(gp_status, stream_wait, STREAM_WAIT, (gp_backend *be, gp_stream waiter, gp_stream signaler),    \
      (be, waiter, signaler))                                                                        \
    /* Events, for Tensor.record_stream: record one on `stream` (it completes                        \
     * when the work queued there so far has), ask whether it has completed                           \
     * (no host wait), and give it back.  `*event` is never 0. */                                    \
    X(gp_status, event_record, EVENT_RECORD, (gp_backend *be, gp_stream stream, uint64_t *event),     \
      (be, stream, event))                                                                           \
    X(gp_status, event_query, EVENT_QUERY, (gp_backend *be, uint64_t event, int *done),              \
      (be, event, done))                                                                             \
    X(void, event_release, EVENT_RELEASE, (gp_backend *be, uint64_t event), (be, event))             \
    /* Whether `stream` is capturing a CUDA graph now (*capturing 0 or 1).                            \
     * Asked only while a capture is known to be underway. */                                         \
    X(gp_status, is_capturing, IS_CAPTURING, (gp_backend *be, gp_stream stream, int *capturing),      \
      (be, stream, capturing))                                                                       \
    /* Block the host until all work on the device has completed. */                                  \
    X(gp_status, synchronize, SYNCHRONIZE, (gp_backend *be), (be))                                    \
    /* Free and total memory of the device as its driver sees it. */                                  \
    X(gp_status, mem_info, MEM_INFO, (gp_backend *be, uint64_t *free_b, uint64_t *total_b),           \
      (be, free_b, total_b))                                                                         \
    /* For offload (offload.c).  Page-locked host memory, which the device                            \
     * reads and writes asynchronously at full speed: pinning is slow (about                          \
     * 1.6 GB/s), so callers keep it.  GP_ERR_NOMEM when the host has none.                           \
     * host_free gives back exactly one earlier host_alloc (same ptr and size). */                    \
    X(gp_status, host_alloc, HOST_ALLOC, (gp_backend *be, uint64_t size, void **ptr), (be, size, ptr)) \
    X(void, host_free, HOST_FREE, (gp_backend *be, void *ptr, uint64_t size), (be, ptr, size))       \
    /* The fast way to the same (pinned.c's slabs): host memory the caller                          \
     * mapped itself (anonymous, page-aligned) has its pages faulted in by                           \
     * host_populate, which several threads may call at once on parts of                             \
     * it (one thread populates at a fifth of the machine's rate, and                                 \
     * pinning unpopulated memory populates it on one thread), then is                                \
     * page-locked for the device by host_register (CUDA: cuMemHostRegister,                         \
     * which then only pins) until host_unregister (same ptr and size; the                            \
     * caller unmaps it after).  GP_ERR_NOMEM when the host has no memory.  */                        \
    X(gp_status, host_populate, HOST_POPULATE, (gp_backend *be, void *ptr, uint64_t size), (be, ptr, size)) \
    X(gp_status, host_register, HOST_REGISTER, (gp_backend *be, void *ptr, uint64_t size), (be, ptr, size)) \
    X(void, host_unregister, HOST_UNREGISTER, (gp_backend *be, void *ptr, uint64_t size), (be, ptr, size)) \
    /* A stream of the backend's own, ordered with no other stream. */                                \
    X(gp_status, stream_create, STREAM_CREATE, (gp_backend *be, gp_stream *out), (be, out))          \
    X(void, stream_destroy, STREAM_DESTROY, (gp_backend *be, gp_stream stream), (be, stream))        \
    /* Queue a copy of `size` bytes from `src` to `dst` on `stream`, in the                           \
     * direction GP_COPY_*; it runs in stream order (asynchronously to the                            \
     * host when the host side is host_alloc memory).  Device addresses must                          \
     * be mapped until the copy has run. */                                                           \
    X(gp_status, copy, COPY, (gp_backend *be, void *dst, const void *src, uint64_t size, int dir,     \
                              gp_stream stream), (be, dst, src, size, dir, stream))                   \
    /* Block the host until `event` (event_record) has completed. */                                  \
    X(gp_status, event_wait, EVENT_WAIT, (gp_backend *be, uint64_t event), (be, event))              \
    /* Write, in `stream`'s order, the checksum (checksum.h) of the device                            \
     * memory [ptr, ptr+size) (size a multiple of 8) with `seed` to the 8                             \
     * bytes at device address `out`. */                                                              \
    X(gp_status, checksum, CHECKSUM, (gp_backend *be, const void *ptr, uint64_t size, uint64_t seed,  \
                                      void *out, gp_stream stream), (be, ptr, size, seed, out, stream)) \
    /* Queue on `stream` the gather of n device ranges into one: range b,                             \
     * srcs[b] for lens[b] bytes, lands at dst + the sum of the earlier                               \
     * ranges' lengths, each rounded up to `align` (a power of two); a                                \
     * length above max_len counts as 0 and copies nothing.  srcs and lens                            \
     * are read where the work runs, in stream order (a compression may                               \
     * have written them): device arrays on a GPU.  Compressed offload                                \
     * gathers a batch's chunks so that one copy takes them to the host. */                           \
    X(gp_status, gather, GATHER, (gp_backend *be, void *dst, const void *const *srcs, const size_t *lens, \
                                  uint32_t n, uint64_t align, uint64_t max_len, gp_stream stream),     \
      (be, dst, srcs, lens, n, align, max_len, stream))                                              \
    /* Run fn(arg) on the calling thread with the device's context current                            \
     * (CUDA: the primary context, pushed only if another one is current),                            \
     * for libraries that work on the current context, as nvCOMP does                                 \
     * (codec_nvcomp.c); returns fn's status. */                                                      \
    X(gp_status, in_context, IN_CONTEXT, (gp_backend *be, gp_status (*fn)(void *arg), void *arg),    \
      (be, fn, arg))

/* ret, the list's first column, pasted: GP_BACKEND_IF_STATUS_##ret(...) is
 * its arguments for an operation that returns a status (one that can
 * fail), nothing for the others. */
#define GP_BACKEND_IF_STATUS_gp_status(...) __VA_ARGS__
#define GP_BACKEND_IF_STATUS_void(...)

struct gp_backend {
    const char *name;        /* "cuda", "host"                               */
    int device;              /* device ordinal                               */
    uint64_t total;          /* device memory in bytes                       */
    uint64_t granularity;    /* mapping unit: addresses and sizes of map()
                                are multiples of it                          */
#define GP_BACKEND_MEMBER(ret, name, NAME, params, args) ret(*name) params;
    GP_BACKEND_OPS(GP_BACKEND_MEMBER)
#undef GP_BACKEND_MEMBER
    /* Free everything the backend holds, itself included. */
    void (*destroy)(gp_backend *be);
};

#endif /* GP_BACKEND_H */
