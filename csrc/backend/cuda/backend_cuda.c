/*
 * backend_cuda.c -- the device interface (backend.h) over the CUDA driver
 * API's virtual memory management: cuMemAddressReserve for arenas,
 * cuMemCreate + cuMemMap + cuMemSetAccess for physical chunks, events for
 * ordering streams.
 *
 * libcuda.so.1 is opened with dlopen on first use and never linked, so that
 * the extension imports (and the host backend works) on a machine with no
 * driver, and so that one wheel serves every driver version.  cuda.h is
 * included for types only; every entry point is resolved with dlsym under its
 * ABI name (cuMemGetInfo_v2, not cuMemGetInfo: the plain names are the
 * 32-bit-size originals kept for old binaries), and each function pointer
 * type is checked at compile time against the prototype in cuda.h.
 *
 * The legacy (non-_ptsz) entry points are used on purpose: PyTorch's default
 * stream is the legacy NULL stream, and gp_stream NULL must mean that one.
 *
 * Every call runs with the device's primary context current: the one the
 * CUDA runtime, and so PyTorch, uses.  It is retained at creation (so it
 * cannot be reset under the pool) and pushed only when the calling thread has
 * another context current, which on PyTorch's threads it almost never has.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "backend.h"
#include "host_pages.h"
#include "kernels.h"
#include "range_set.h"

#if !defined(CUDA_VERSION) || CUDA_VERSION < 11000
#error "backend_cuda.c needs cuda.h from CUDA 11.0 or newer (virtual memory management, cuDevicePrimaryCtxRelease_v2)"
#endif

_Static_assert(sizeof(size_t) == sizeof(uint64_t) && sizeof(CUdeviceptr) == sizeof(uint64_t) &&
                   sizeof(CUmemGenericAllocationHandle) == sizeof(uint64_t),
               "the CUDA backend assumes a 64-bit address space");

/* ------------------------------------------------------- the driver entry points */

typedef CUresult (CUDAAPI *cu_pfn_init)(unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_get_error_name)(CUresult, const char **);
typedef CUresult (CUDAAPI *cu_pfn_get_error_string)(CUresult, const char **);
typedef CUresult (CUDAAPI *cu_pfn_device_get_count)(int *);
typedef CUresult (CUDAAPI *cu_pfn_device_get)(CUdevice *, int);
typedef CUresult (CUDAAPI *cu_pfn_device_get_attribute)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_device_total_mem)(size_t *, CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_primary_ctx_retain)(CUcontext *, CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_primary_ctx_release)(CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_ctx_get_current)(CUcontext *);
typedef CUresult (CUDAAPI *cu_pfn_ctx_push_current)(CUcontext);
typedef CUresult (CUDAAPI *cu_pfn_ctx_pop_current)(CUcontext *);
typedef CUresult (CUDAAPI *cu_pfn_ctx_synchronize)(void);
typedef CUresult (CUDAAPI *cu_pfn_mem_get_info)(size_t *, size_t *);
typedef CUresult (CUDAAPI *cu_pfn_mem_get_granularity)(size_t *, const CUmemAllocationProp *,
                                                       CUmemAllocationGranularity_flags);
typedef CUresult (CUDAAPI *cu_pfn_mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                                       unsigned long long);
typedef CUresult (CUDAAPI *cu_pfn_mem_address_free)(CUdeviceptr, size_t);
typedef CUresult (CUDAAPI *cu_pfn_mem_create)(CUmemGenericAllocationHandle *, size_t,
                                              const CUmemAllocationProp *, unsigned long long);
typedef CUresult (CUDAAPI *cu_pfn_mem_release)(CUmemGenericAllocationHandle);
typedef CUresult (CUDAAPI *cu_pfn_mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                           unsigned long long);
typedef CUresult (CUDAAPI *cu_pfn_mem_unmap)(CUdeviceptr, size_t);
typedef CUresult (CUDAAPI *cu_pfn_mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (CUDAAPI *cu_pfn_event_create)(CUevent *, unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_event_destroy)(CUevent);
typedef CUresult (CUDAAPI *cu_pfn_event_record)(CUevent, CUstream);
typedef CUresult (CUDAAPI *cu_pfn_stream_wait_event)(CUstream, CUevent, unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_stream_is_capturing)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (CUDAAPI *cu_pfn_event_query)(CUevent);
typedef CUresult (CUDAAPI *cu_pfn_thread_exchange_capture_mode)(CUstreamCaptureMode *);
typedef CUresult (CUDAAPI *cu_pfn_mem_host_alloc)(void **, size_t, unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_mem_free_host)(void *);
typedef CUresult (CUDAAPI *cu_pfn_mem_host_register)(void *, size_t, unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_mem_host_unregister)(void *);
typedef CUresult (CUDAAPI *cu_pfn_stream_create)(CUstream *, unsigned int);
typedef CUresult (CUDAAPI *cu_pfn_stream_destroy)(CUstream);
typedef CUresult (CUDAAPI *cu_pfn_memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (CUDAAPI *cu_pfn_memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (CUDAAPI *cu_pfn_memcpy_dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (CUDAAPI *cu_pfn_event_synchronize)(CUevent);
typedef CUresult (CUDAAPI *cu_pfn_module_load_data)(CUmodule *, const void *);
typedef CUresult (CUDAAPI *cu_pfn_module_get_function)(CUfunction *, CUmodule, const char *);
typedef CUresult (CUDAAPI *cu_pfn_module_unload)(CUmodule);
typedef CUresult (CUDAAPI *cu_pfn_launch_kernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                                 unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (CUDAAPI *cu_pfn_device_get_uuid)(CUuuid *, CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_device_can_access_peer)(int *, CUdevice, CUdevice);
typedef CUresult (CUDAAPI *cu_pfn_memcpy_peer_async)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);

/* field, ABI symbol.  The symbol is spelled out (not left to cuda.h's
 * #define cuX cuX_v2) so that what dlsym looks up is visible here. */
#define CU_SYMBOLS(X)                                  \
    X(init, cuInit)                                    \
    X(get_error_name, cuGetErrorName)                  \
    X(get_error_string, cuGetErrorString)              \
    X(device_get_count, cuDeviceGetCount)              \
    X(device_get, cuDeviceGet)                         \
    X(device_get_attribute, cuDeviceGetAttribute)      \
    X(device_total_mem, cuDeviceTotalMem_v2)           \
    X(primary_ctx_retain, cuDevicePrimaryCtxRetain)    \
    X(primary_ctx_release, cuDevicePrimaryCtxRelease_v2) \
    X(ctx_get_current, cuCtxGetCurrent)                \
    X(ctx_push_current, cuCtxPushCurrent_v2)           \
    X(ctx_pop_current, cuCtxPopCurrent_v2)             \
    X(ctx_synchronize, cuCtxSynchronize)               \
    X(mem_get_info, cuMemGetInfo_v2)                   \
    X(mem_get_granularity, cuMemGetAllocationGranularity) \
    X(mem_address_reserve, cuMemAddressReserve)        \
    X(mem_address_free, cuMemAddressFree)              \
    X(mem_create, cuMemCreate)                         \
    X(mem_release, cuMemRelease)                       \
    X(mem_map, cuMemMap)                               \
    X(mem_unmap, cuMemUnmap)                           \
    X(mem_set_access, cuMemSetAccess)                  \
    X(event_create, cuEventCreate)                     \
    X(event_destroy, cuEventDestroy_v2)                \
    X(event_record, cuEventRecord)                     \
    X(stream_wait_event, cuStreamWaitEvent)            \
    X(stream_is_capturing, cuStreamIsCapturing)        \
    X(event_query, cuEventQuery)                       \
    X(thread_exchange_capture_mode, cuThreadExchangeStreamCaptureMode) \
    X(mem_host_alloc, cuMemHostAlloc)                  \
    X(mem_free_host, cuMemFreeHost)                    \
    X(mem_host_register, cuMemHostRegister_v2)         \
    X(mem_host_unregister, cuMemHostUnregister)        \
    X(stream_create, cuStreamCreate)                   \
    X(stream_destroy, cuStreamDestroy_v2)              \
    X(memcpy_dtoh_async, cuMemcpyDtoHAsync_v2)         \
    X(memcpy_htod_async, cuMemcpyHtoDAsync_v2)         \
    X(memcpy_dtod_async, cuMemcpyDtoDAsync_v2)         \
    X(event_synchronize, cuEventSynchronize)           \
    X(module_load_data, cuModuleLoadData)              \
    X(module_get_function, cuModuleGetFunction)        \
    X(module_unload, cuModuleUnload)                   \
    X(launch_kernel, cuLaunchKernel)                   \
    X(device_get_uuid, cuDeviceGetUuid)                \
    X(device_can_access_peer, cuDeviceCanAccessPeer)   \
    X(memcpy_peer_async, cuMemcpyPeerAsync)

/* A typo in a typedef or a symbol name that cuda.h does not declare fails
 * the build here rather than corrupting the stack at run time.  _Generic does
 * not evaluate its operand, so this references no libcuda symbol. */
#define CU_CHECK(field, sym)                                             \
    _Static_assert(_Generic(&sym, cu_pfn_##field: 1, default: 0),       \
                   #sym " does not match its prototype in cuda.h");
CU_SYMBOLS(CU_CHECK)
#undef CU_CHECK

#define CU_FIELD(field, sym) cu_pfn_##field field;
static struct {
    CU_SYMBOLS(CU_FIELD)
} cu_api;
#undef CU_FIELD

static pthread_once_t cu_load_once = PTHREAD_ONCE_INIT;
static gp_status cu_load_status;
static char cu_load_msg[512];

static void cu_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        cu_load_status = GP_ERR_BACKEND;
        snprintf(cu_load_msg, sizeof cu_load_msg,
                 "libcuda.so.1 not found: is an NVIDIA driver installed? (dlopen: %s)",
                 why ? why : "unknown error");
        return;
    }
    /* memcpy, because ISO C has no conversion from void * to a function
     * pointer; POSIX guarantees the representations agree. */
#define CU_RESOLVE(field, sym)                                                       \
    {                                                                                \
        void *p = dlsym(lib, #sym);                                                  \
        if (!p) {                                                                    \
            cu_load_status = GP_ERR_BACKEND;                                         \
            snprintf(cu_load_msg, sizeof cu_load_msg,                                \
                     "libcuda.so.1 has no %s: the NVIDIA driver is too old for "    \
                     "gpupool (it needs a driver for CUDA 11.0 or newer)", #sym);  \
            memset(&cu_api, 0, sizeof cu_api);                                       \
            dlclose(lib);                                                            \
            return;                                                                  \
        }                                                                            \
        _Static_assert(sizeof p == sizeof cu_api.field, "function pointer size");   \
        memcpy(&cu_api.field, &p, sizeof p);                                         \
    }
    CU_SYMBOLS(CU_RESOLVE)
#undef CU_RESOLVE
    /* lib stays open for the life of the process: pools may outlive any one
     * backend, and unloading a driver library is never safe in practice. */
    cu_load_status = GP_OK;
}

/* The toolkit's stub libcuda (lib64/stubs, sometimes left on
 * LD_LIBRARY_PATH in containers) answers every call, these two included,
 * with CUDA_ERROR_STUB_LIBRARY: name it, since it explains the failure.
 * Spelled as its value because cuda.h before 11.1 lacks the name. */
#define CU_ERROR_STUB_LIBRARY ((CUresult)34)

static const char *cu_err_name(CUresult r)
{
    static _Thread_local char buf[32];
    const char *s = NULL;
    if (cu_api.get_error_name(r, &s) == CUDA_SUCCESS && s) return s;
    if (r == CU_ERROR_STUB_LIBRARY) return "CUDA_ERROR_STUB_LIBRARY";
    snprintf(buf, sizeof buf, "CUresult %d", (int)r);
    return buf;
}

static const char *cu_err_string(CUresult r)
{
    const char *s = NULL;
    if (cu_api.get_error_string(r, &s) == CUDA_SUCCESS && s) return s;
    if (r == CU_ERROR_STUB_LIBRARY)
        return "the libcuda.so.1 found is the CUDA toolkit's stub, not the NVIDIA driver's library";
    return "no description";
}

static const char *cu_visible_devices(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return v ? v : "(unset)";
}

/* Only "the device is full" may be retried by the pool after a trim. */
static gp_status cu_status(CUresult r)
{
    return r == CUDA_ERROR_OUT_OF_MEMORY ? GP_ERR_OOM : GP_ERR_BACKEND;
}

#define CU_FAIL(r, dev, fmt, ...)                                                      \
    gp_error_set(cu_status(r), "cuda device %d: " fmt " failed: %s (%s)", (dev),      \
                 __VA_ARGS__, cu_err_name(r), cu_err_string(r))

/* ------------------------------------------------------------- the backend */

/* Events go back to the list right after cuStreamWaitEvent, which captures
 * the event's state at call time, so a few cover any number of callers.
 * record_stream events live until their block is reused; more than the cache
 * holds are destroyed when given back. */
#define CU_EVENT_CACHE 32

typedef struct cu_backend {
    gp_backend be; /* first: the pool sees only this */
    CUdevice dev;
    CUcontext ctx; /* the retained primary context */
    CUmemAllocationProp prop;
    /* Who may read and write the mappings: this device, then each peer
     * granted (grant_peer); every map sets them all.  maps holds the live
     * mappings, for a grant to reach those made before it.  map_lock
     * guards both, so that a map and a grant that run at once leave the
     * new mapping with the peer's access either way. */
    pthread_mutex_t map_lock;
    CUmemAccessDesc *access; /* room for every device */
    int n_access;
    gp_range_set maps;
    pthread_mutex_t ev_lock;
    CUevent ev_free[CU_EVENT_CACHE];
    int n_ev_free;
    /* Our kernels (kernels.h), loaded on first use. */
    pthread_once_t k_once;
    CUresult k_load;
    CUmodule k_module;
    CUfunction k_checksum, k_zero, k_gather, k_copy;
} cu_backend;

#define CU(be) ((cu_backend *)(be))

/* Make the primary context current for the duration of one entry point.
 * Checking first costs a TLS read in the driver and spares a push/pop pair
 * on every thread where PyTorch already made it current. */
static CUresult cu_enter(cu_backend *cb, int *pushed)
{
    CUcontext cur = NULL;
    *pushed = 0;
    if (cu_api.ctx_get_current(&cur) == CUDA_SUCCESS && cur == cb->ctx) return CUDA_SUCCESS;
    CUresult r = cu_api.ctx_push_current(cb->ctx);
    if (r == CUDA_SUCCESS) *pushed = 1;
    return r;
}

static void cu_leave(int pushed)
{
    CUcontext popped;
    if (pushed) cu_api.ctx_pop_current(&popped);
}

#define CU_ENTER_OR_FAIL(cb, pushed, what)                                               \
    do {                                                                               \
        CUresult er_ = cu_enter((cb), &(pushed));                                      \
        if (er_ != CUDA_SUCCESS)                                                       \
            return CU_FAIL(er_, (cb)->be.device, "cuCtxPushCurrent(primary context) for %s", \
                           (what));                                                    \
    } while (0)

static int cu_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static gp_status cu_reserve(gp_backend *be, uint64_t size, uint64_t align, uintptr_t *base)
{
    cu_backend *cb = CU(be);
    if (size == 0 || size % be->granularity || (align && !cu_is_pow2(align)))
        return gp_error_set(GP_ERR_INVALID,
                            "cuda device %d: reserve of %llu bytes aligned to %llu: the size must be a "
                            "non-zero multiple of the granularity %llu and the alignment 0 or a power of two",
                            be->device, (unsigned long long)size, (unsigned long long)align,
                            (unsigned long long)be->granularity);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "reserve");
    CUdeviceptr p = 0;
    CUresult r = cu_api.mem_address_reserve(&p, size, align, 0, 0);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, be->device, "cuMemAddressReserve(size=%llu, alignment=%llu)",
                       (unsigned long long)size, (unsigned long long)align);
    *base = (uintptr_t)p;
    return GP_OK;
}

/* void in backend.h, so a failure is dropped: writing the error slot here
 * would overwrite the message of the failure that made the pool clean up. */
static void cu_unreserve(gp_backend *be, uintptr_t base, uint64_t size)
{
    int pushed;
    if (cu_enter(CU(be), &pushed) != CUDA_SUCCESS) return;
    cu_api.mem_address_free((CUdeviceptr)base, size);
    cu_leave(pushed);
}

static gp_status cu_map(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t *handle)
{
    cu_backend *cb = CU(be);
    if (size == 0 || size % be->granularity || addr % be->granularity)
        return gp_error_set(GP_ERR_INVALID,
                            "cuda device %d: map of %#llx+%llu: address and size must be multiples of "
                            "the granularity %llu",
                            be->device, (unsigned long long)addr, (unsigned long long)size,
                            (unsigned long long)be->granularity);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "map");
    /* While a stream captures a CUDA graph in "global" mode (PyTorch's
     * default), the driver refuses cuMemCreate/cuMemMap on every thread.  Mapping
     * memory is not work on a stream, and memory mapped now stays mapped for as
     * long as a graph may use it, so it is safe: switch this thread to relaxed
     * mode for the call, as PyTorch's own allocator does around cudaMalloc. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    cu_api.thread_exchange_capture_mode(&mode);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cu_api.mem_create(&h, size, &cb->prop, 0);
    if (r != CUDA_SUCCESS) {
        cu_api.thread_exchange_capture_mode(&mode);
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuMemCreate(size=%llu)", (unsigned long long)size);
    }
    r = cu_api.mem_map((CUdeviceptr)addr, size, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        cu_api.mem_release(h);
        cu_api.thread_exchange_capture_mode(&mode);
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuMemMap(addr=%#llx, size=%llu)", (unsigned long long)addr,
                       (unsigned long long)size);
    }
    /* A new mapping starts with no access at all: without this, the first
     * kernel touching it faults.  The peers granted so far get it too. */
    pthread_mutex_lock(&cb->map_lock);
    int n_access = cb->n_access;
    r = cu_api.mem_set_access((CUdeviceptr)addr, size, cb->access, (size_t)n_access);
    gp_status st = r == CUDA_SUCCESS ? gp_range_set_add(&cb->maps, addr, size) : GP_OK;
    pthread_mutex_unlock(&cb->map_lock);
    if (r != CUDA_SUCCESS || st != GP_OK) {
        cu_api.mem_unmap((CUdeviceptr)addr, size);
        cu_api.mem_release(h);
        cu_api.thread_exchange_capture_mode(&mode);
        cu_leave(pushed);
        if (st != GP_OK) return st; /* (no room to remember the mapping) */
        return CU_FAIL(r, be->device, "cuMemSetAccess(addr=%#llx, size=%llu, read-write for %d device(s))",
                       (unsigned long long)addr, (unsigned long long)size, n_access);
    }
    cu_api.thread_exchange_capture_mode(&mode);
    cu_leave(pushed);
    *handle = (uint64_t)h;
    return GP_OK;
}

static gp_status cu_unmap(gp_backend *be, uintptr_t addr, uint64_t size, uint64_t handle)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "unmap");
    /* Under the lock: a grant never reaches a range being unmapped. */
    pthread_mutex_lock(&cb->map_lock);
    CUresult r = cu_api.mem_unmap((CUdeviceptr)addr, size);
    if (r == CUDA_SUCCESS) gp_range_set_remove(&cb->maps, addr);
    pthread_mutex_unlock(&cb->map_lock);
    if (r != CUDA_SUCCESS) {
        /* Keep the handle: the range is still mapped, and releasing it now
         * would leave the pool no way to retry. */
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuMemUnmap(addr=%#llx, size=%llu)", (unsigned long long)addr,
                       (unsigned long long)size);
    }
    r = cu_api.mem_release((CUmemGenericAllocationHandle)handle);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, be->device, "cuMemRelease(handle=%#llx) after unmapping %#llx+%llu",
                       (unsigned long long)handle, (unsigned long long)addr, (unsigned long long)size);
    return GP_OK;
}

/* A peer device's access to one live mapping (gp_range_set_each). */
typedef struct cu_grant {
    cu_backend *cb;
    const CUmemAccessDesc *desc;
} cu_grant;

static gp_status cu_grant_range(const gp_range *m, void *arg)
{
    cu_grant *g = arg;
    CUresult r = cu_api.mem_set_access((CUdeviceptr)m->addr, m->size, g->desc, 1);
    if (r == CUDA_SUCCESS) return GP_OK;
    return CU_FAIL(r, g->cb->be.device, "cuMemSetAccess(addr=%#llx, size=%llu, read-write for device %d)",
                   (unsigned long long)m->addr, (unsigned long long)m->size, g->desc->location.id);
}

static gp_status cu_grant_peer(gp_backend *be, int peer)
{
    cu_backend *cb = CU(be);
    int count = 0, can = 0;
    CUdevice pdev;
    CUresult r = cu_api.device_get_count(&count);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "%s", "cuDeviceGetCount()");
    if (peer < 0 || peer >= count || peer == be->device)
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: device %d is not another device of the process "
                            "(0..%d; CUDA_VISIBLE_DEVICES=%s)", be->device, peer, count - 1, cu_visible_devices());
    r = cu_api.device_get(&pdev, peer);
    if (r == CUDA_SUCCESS) r = cu_api.device_can_access_peer(&can, pdev, cb->dev);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "cuDeviceCanAccessPeer(device %d)", peer);
    if (!can)
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: device %d cannot access its memory (no peer-to-peer "
                            "path between them)", be->device, peer);
    CUmemAccessDesc desc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = peer},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "grant_peer");
    gp_status st = GP_OK;
    pthread_mutex_lock(&cb->map_lock);
    int have = 0;
    for (int i = 0; i < cb->n_access; i++) have |= cb->access[i].location.id == peer;
    if (!have) {
        cu_grant g = {cb, &desc};
        st = gp_range_set_each(&cb->maps, cu_grant_range, &g);
        if (st == GP_OK) cb->access[cb->n_access++] = desc;
    }
    pthread_mutex_unlock(&cb->map_lock);
    cu_leave(pushed);
    return st;
}

/* Ordering across a stream that is capturing a CUDA graph would either pull
 * the waiter into the capture (it then runs nothing until the graph is
 * launched) or break the capture (an event recorded outside it, or any use of
 * the legacy stream while a blocking stream captures).  Refusing makes the
 * pool pick another block, which is always safe. */
enum { CU_CAPTURE_NONE = 0, CU_CAPTURE_ACTIVE = 1, CU_CAPTURE_IMPLICIT = 2 };

static CUresult cu_capturing(CUstream s, int *capturing)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = cu_api.stream_is_capturing(s, &cs);
    *capturing = CU_CAPTURE_NONE;
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        *capturing = CU_CAPTURE_IMPLICIT;
        return CUDA_SUCCESS;
    }
    if (r == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE) *capturing = CU_CAPTURE_ACTIVE;
    return r;
}

static CUresult cu_event_get(cu_backend *cb, CUevent *ev)
{
    pthread_mutex_lock(&cb->ev_lock);
    if (cb->n_ev_free > 0) {
        *ev = cb->ev_free[--cb->n_ev_free];
        pthread_mutex_unlock(&cb->ev_lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&cb->ev_lock);
    return cu_api.event_create(ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
}

static void cu_event_put(cu_backend *cb, CUevent ev)
{
    pthread_mutex_lock(&cb->ev_lock);
    if (cb->n_ev_free < CU_EVENT_CACHE) {
        cb->ev_free[cb->n_ev_free++] = ev;
        ev = NULL;
    }
    pthread_mutex_unlock(&cb->ev_lock);
    if (ev) cu_api.event_destroy(ev);
}

static gp_status cu_stream_wait(gp_backend *be, gp_stream waiter, gp_stream signaler)
{
    cu_backend *cb = CU(be);
    if (waiter == signaler) return GP_OK;
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "stream_wait");
    CUstream w = (CUstream)waiter, s = (CUstream)signaler;
    int cap_w = 0, cap_s = 0;
    CUresult r = cu_capturing(w, &cap_w);
    if (r == CUDA_SUCCESS) r = cu_capturing(s, &cap_s);
    if (r != CUDA_SUCCESS) {
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuStreamIsCapturing(waiter=%p, signaler=%p)", waiter, signaler);
    }
    if (cap_w || cap_s) {
        cu_leave(pushed);
        if (cap_w == CU_CAPTURE_IMPLICIT || cap_s == CU_CAPTURE_IMPLICIT)
            return gp_error_set(GP_ERR_BACKEND,
                                "cuda device %d: stream %p cannot wait for stream %p: the legacy default "
                                "stream is unusable while another stream captures a CUDA graph",
                                be->device, waiter, signaler);
        return gp_error_set(GP_ERR_BACKEND,
                            "cuda device %d: stream %p cannot wait for stream %p while %s is capturing "
                            "a CUDA graph",
                            be->device, waiter, signaler, cap_w ? "the waiter" : "the signaler");
    }
    CUevent ev = NULL;
    r = cu_event_get(cb, &ev);
    if (r != CUDA_SUCCESS) {
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuEventCreate(%s)", "CU_EVENT_DISABLE_TIMING");
    }
    const char *call = "cuEventRecord";
    r = cu_api.event_record(ev, s);
    if (r == CUDA_SUCCESS) {
        call = "cuStreamWaitEvent";
        r = cu_api.stream_wait_event(w, ev, 0);
    }
    cu_event_put(cb, ev);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, be->device, "%s(waiter=%p, signaler=%p)", call, waiter, signaler);
    return GP_OK;
}

static gp_status cu_event_record(gp_backend *be, gp_stream stream, uint64_t *event)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "event_record");
    CUevent ev = NULL;
    CUresult r = cu_event_get(cb, &ev);
    if (r != CUDA_SUCCESS) {
        cu_leave(pushed);
        return CU_FAIL(r, be->device, "cuEventCreate(%s)", "CU_EVENT_DISABLE_TIMING");
    }
    r = cu_api.event_record(ev, (CUstream)stream);
    if (r != CUDA_SUCCESS) cu_event_put(cb, ev);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "cuEventRecord(stream=%p)", stream);
    _Static_assert(sizeof(CUevent) <= sizeof(uint64_t), "an event fits a uint64_t");
    *event = (uint64_t)(uintptr_t)ev;
    return GP_OK;
}

static gp_status cu_event_query(gp_backend *be, uint64_t event, int *done)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "event_query");
    CUresult r = cu_api.event_query((CUevent)(uintptr_t)event);
    cu_leave(pushed);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY) {
        *done = r == CUDA_SUCCESS;
        return GP_OK;
    }
    return CU_FAIL(r, be->device, "%s", "cuEventQuery()");
}

static void cu_event_release(gp_backend *be, uint64_t event)
{
    int pushed;
    if (cu_enter(CU(be), &pushed) != CUDA_SUCCESS) return;
    cu_event_put(CU(be), (CUevent)(uintptr_t)event);
    cu_leave(pushed);
}

static gp_status cu_is_capturing(gp_backend *be, gp_stream stream, int *capturing)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "is_capturing");
    CUresult r = cu_capturing((CUstream)stream, capturing);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "cuStreamIsCapturing(%p)", stream);
    /* IMPLICIT: the legacy stream, which another stream's capture makes
     * unusable but which is not capturing itself. */
    *capturing = *capturing == CU_CAPTURE_ACTIVE;
    return GP_OK;
}

static gp_status cu_synchronize(gp_backend *be)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "synchronize");
    CUresult r = cu_api.ctx_synchronize();
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "%s", "cuCtxSynchronize()");
    return GP_OK;
}

static gp_status cu_mem_info(gp_backend *be, uint64_t *free_b, uint64_t *total_b)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "mem_info");
    size_t f = 0, t = 0;
    CUresult r = cu_api.mem_get_info(&f, &t);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "%s", "cuMemGetInfo()");
    *free_b = f;
    *total_b = t;
    return GP_OK;
}

static gp_status cu_host_alloc(gp_backend *be, uint64_t size, void **ptr)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "host_alloc");
    void *p = NULL;
    /* PORTABLE: pinned for every context, as the device's primary one may
     * not be the only one copying. */
    CUresult r = cu_api.mem_host_alloc(&p, size, CU_MEMHOSTALLOC_PORTABLE);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) {
        gp_status st = CU_FAIL(r, be->device, "cuMemHostAlloc(size=%llu)", (unsigned long long)size);
        /* Pinned host memory that is not there is host memory, not device memory. */
        return st == GP_ERR_OOM ? GP_ERR_NOMEM : st;
    }
    *ptr = p;
    return GP_OK;
}

static void cu_host_free(gp_backend *be, void *ptr, uint64_t size)
{
    (void)size;
    int pushed;
    if (!ptr || cu_enter(CU(be), &pushed) != CUDA_SUCCESS) return;
    cu_api.mem_free_host(ptr);
    cu_leave(pushed);
}

static gp_status cu_host_populate(gp_backend *be, void *ptr, uint64_t size)
{
    (void)be;
    return gp_host_pages_populate(ptr, size);
}

static gp_status cu_host_register(gp_backend *be, void *ptr, uint64_t size)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "host_register");
    /* PORTABLE, as host_alloc's: pinned for every context. */
    CUresult r = cu_api.mem_host_register(ptr, size, CU_MEMHOSTREGISTER_PORTABLE);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) {
        gp_status st = CU_FAIL(r, be->device, "cuMemHostRegister(%p, size=%llu)", ptr, (unsigned long long)size);
        return st == GP_ERR_OOM ? GP_ERR_NOMEM : st; /* (host memory, not the device's) */
    }
    return GP_OK;
}

static void cu_host_unregister(gp_backend *be, void *ptr, uint64_t size)
{
    (void)size;
    int pushed;
    if (!ptr || cu_enter(CU(be), &pushed) != CUDA_SUCCESS) return;
    cu_api.mem_host_unregister(ptr);
    cu_leave(pushed);
}

static gp_status cu_stream_create(gp_backend *be, gp_stream *out)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "stream_create");
    CUstream s = NULL;
    /* NON_BLOCKING: not ordered with the legacy default stream, which
     * PyTorch's work runs on; the caller orders with events. */
    CUresult r = cu_api.stream_create(&s, CU_STREAM_NON_BLOCKING);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "%s", "cuStreamCreate(NON_BLOCKING)");
    *out = (gp_stream)s;
    return GP_OK;
}

static void cu_stream_destroy(gp_backend *be, gp_stream stream)
{
    int pushed;
    if (cu_enter(CU(be), &pushed) != CUDA_SUCCESS) return;
    cu_api.stream_destroy((CUstream)stream);
    cu_leave(pushed);
}

/* pthread_once takes no argument: the backend being loaded for. */
static _Thread_local cu_backend *cu_k_loading;

static void cu_k_load_once(void)
{
    cu_backend *cb = cu_k_loading;
    /* SASS where it has this GPU's, else PTX (JIT). */
    cb->k_load = cu_api.module_load_data(&cb->k_module, gp_kernels_sass);
    if (cb->k_load != CUDA_SUCCESS) cb->k_load = cu_api.module_load_data(&cb->k_module, gp_kernels_ptx);
    if (cb->k_load == CUDA_SUCCESS)
        cb->k_load = cu_api.module_get_function(&cb->k_checksum, cb->k_module, "gp_checksum_kernel");
    if (cb->k_load == CUDA_SUCCESS)
        cb->k_load = cu_api.module_get_function(&cb->k_zero, cb->k_module, "gp_zero_kernel");
    if (cb->k_load == CUDA_SUCCESS)
        cb->k_load = cu_api.module_get_function(&cb->k_gather, cb->k_module, "gp_gather_kernel");
    if (cb->k_load == CUDA_SUCCESS)
        cb->k_load = cu_api.module_get_function(&cb->k_copy, cb->k_module, "gp_copy_kernel");
}

/* Launch one of our kernels (*f, set by the load) on `stream`, the
 * context current; the module is loaded on first use. */
static CUresult cu_k_launch(cu_backend *cb, const CUfunction *f, unsigned int gx, unsigned int gy,
                            unsigned int threads, gp_stream stream, void **args)
{
    cu_k_loading = cb;
    pthread_once(&cb->k_once, cu_k_load_once);
    if (cb->k_load != CUDA_SUCCESS) return cb->k_load;
    return cu_api.launch_kernel(*f, gx, gy, 1, threads, 1, 1, 0, (CUstream)stream, args, NULL);
}

static gp_status cu_copy(gp_backend *be, void *dst, const void *src, uint64_t size, int dir, gp_stream stream)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "copy");
    CUresult r;
    CUstream s = (CUstream)stream;
    switch (dir) {
    case GP_COPY_D2H | GP_COPY_BY_KERNEL:
    case GP_COPY_H2D | GP_COPY_BY_KERNEL:
        /* Host memory from cuMemHostAlloc is the device's at the same
         * address (unified addressing). */
        {
            unsigned long long d = (uintptr_t)dst, sr = (uintptr_t)src, n = size;
            void *args[] = {&d, &sr, &n};
            r = size ? cu_k_launch(cb, &cb->k_copy, (unsigned int)(n / 4096 + 1 < 64 ? n / 4096 + 1 : 64), 1, 256,
                                   stream, args)
                     : CUDA_SUCCESS;
        }
        break;
    case GP_COPY_D2H: r = cu_api.memcpy_dtoh_async(dst, (CUdeviceptr)(uintptr_t)src, size, s); break;
    case GP_COPY_H2D: r = cu_api.memcpy_htod_async((CUdeviceptr)(uintptr_t)dst, src, size, s); break;
    case GP_COPY_D2D:
        r = cu_api.memcpy_dtod_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size, s);
        break;
    default:
        cu_leave(pushed);
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: copy direction %d is not one of GP_COPY_*",
                            be->device, dir);
    }
    cu_leave(pushed);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, be->device, "cuMemcpy%sAsync(dst=%p, src=%p, size=%llu)",
                       dir & GP_COPY_BY_KERNEL ? "(kernel)" : dir == GP_COPY_D2H ? "DtoH"
                       : dir == GP_COPY_H2D ? "HtoD" : "DtoD", dst, src,
                       (unsigned long long)size);
    return GP_OK;
}

static gp_status cu_in_context(gp_backend *be, gp_status (*fn)(void *arg), void *arg)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "in_context");
    gp_status st = fn(arg);
    cu_leave(pushed);
    return st;
}

static gp_status cu_event_wait(gp_backend *be, uint64_t event)
{
    cu_backend *cb = CU(be);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "event_wait");
    CUresult r = cu_api.event_synchronize((CUevent)(uintptr_t)event);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "%s", "cuEventSynchronize()");
    return GP_OK;
}

static gp_status cu_checksum(gp_backend *be, const void *ptr, uint64_t size, uint64_t seed, void *out,
                             gp_stream stream)
{
    cu_backend *cb = CU(be);
    if (size % 8)
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: checksum of %llu bytes: not a multiple of 8",
                            be->device, (unsigned long long)size);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "checksum");
    unsigned long long words = size / 8, p = (uintptr_t)ptr, o = (uintptr_t)out;
    void *zero_args[] = {&o}, *args[] = {&p, &words, &seed, &o};
    /* Zeroed by a kernel too (a memset may queue on a copy engine).  The sum
     * runs beside the training step's kernels: a grid that fills every SM
     * (it was 2,048 blocks) holds each of their kernels back while it runs,
     * which cost the fp32 optimizer-offload recipe about 5% of its tokens/s
     * on an H100.  On 64 blocks (the rest by striding) the recipe ran as
     * fast as with no sums, and the sums still keep up with the bus. */
    CUresult r = cu_k_launch(cb, &cb->k_zero, 1, 1, 1, stream, zero_args);
    if (r == CUDA_SUCCESS)
        r = cu_k_launch(cb, &cb->k_checksum, (unsigned int)(words / 256 + 1 < 64 ? words / 256 + 1 : 64), 1, 256,
                        stream, args);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, be->device, "checksum kernels for %llu bytes at %p", (unsigned long long)size, ptr);
    return GP_OK;
}

static gp_status cu_gather(gp_backend *be, void *dst, const void *const *srcs, const size_t *lens, uint32_t n,
                           uint64_t align, uint64_t max_len, gp_stream stream)
{
    cu_backend *cb = CU(be);
    if (!n) return GP_OK;
    if (!align || (align & (align - 1)))
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: gather aligned to %llu: expected a power of two",
                            be->device, (unsigned long long)align);
    int pushed;
    CU_ENTER_OR_FAIL(cb, pushed, "gather");
    unsigned long long d = (uintptr_t)dst, s = (uintptr_t)srcs, l = (uintptr_t)lens, a = align, m = max_len;
    void *args[] = {&d, &s, &l, &a, &m};
    /* A block per range, split in parts so that a few large ranges still
     * spread over the device. */
    CUresult r = cu_k_launch(cb, &cb->k_gather, n, 8, 256, stream, args);
    cu_leave(pushed);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, be->device, "gather kernel of %u ranges into %p", n, dst);
    return GP_OK;
}

/* Errors are ignored: at interpreter exit the driver may already be torn
 * down (CUDA_ERROR_DEINITIALIZED), and there is nobody left to tell. */
static void cu_destroy(gp_backend *be)
{
    cu_backend *cb = CU(be);
    if (!cb) return;
    int pushed = 0;
    if (cu_enter(cb, &pushed) == CUDA_SUCCESS) {
        for (int i = 0; i < cb->n_ev_free; i++) cu_api.event_destroy(cb->ev_free[i]);
        if (cb->k_module) cu_api.module_unload(cb->k_module);
        cu_leave(pushed);
    }
    cb->n_ev_free = 0;
    cu_api.primary_ctx_release(cb->dev);
    pthread_mutex_destroy(&cb->ev_lock);
    pthread_mutex_destroy(&cb->map_lock);
    gp_range_set_clear(&cb->maps);
    free(cb->access);
    free(cb);
}

/* ------------------------------------------------------------------ create */

gp_status gp_backend_cuda_create(int device, gp_backend **out)
{
    if (!out) return gp_error_set(GP_ERR_INVALID, "gp_backend_cuda_create: out is NULL");
    *out = NULL;
    if (device < 0)
        return gp_error_set(GP_ERR_INVALID, "cuda device %d: a device ordinal must be >= 0", device);

    pthread_once(&cu_load_once, cu_load);
    if (cu_load_status != GP_OK) return gp_error_set(cu_load_status, "%s", cu_load_msg);

    CUresult r = cu_api.init(0);
    if (r != CUDA_SUCCESS)
        return gp_error_set(GP_ERR_BACKEND, "cuInit(0) failed: %s (%s); CUDA_VISIBLE_DEVICES=%s",
                            cu_err_name(r), cu_err_string(r), cu_visible_devices());
    int count = 0;
    r = cu_api.device_get_count(&count);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, device, "%s", "cuDeviceGetCount()");
    if (device >= count)
        return gp_error_set(GP_ERR_BACKEND,
                            "cuda device %d does not exist: %d device(s) visible (CUDA_VISIBLE_DEVICES=%s)",
                            device, count, cu_visible_devices());
    CUdevice dev;
    r = cu_api.device_get(&dev, device);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, device, "cuDeviceGet(%d)", device);
    int vmm = 0;
    r = cu_api.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, device, "%s", "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    if (!vmm)
        return gp_error_set(GP_ERR_BACKEND,
                            "cuda device %d does not support CUDA virtual memory management "
                            "(cuMemCreate/cuMemMap), which gpupool needs; some vGPU and WSL setups "
                            "lack it", device);
    size_t total = 0;
    r = cu_api.device_total_mem(&total, dev);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, device, "%s", "cuDeviceTotalMem()");

    cu_backend *cb = calloc(1, sizeof *cb);
    CUmemAccessDesc *access = calloc((size_t)count, sizeof *access);
    if (!cb || !access) {
        free(cb);
        free(access);
        return gp_error_set(GP_ERR_NOMEM, "cuda device %d: out of host memory for the backend", device);
    }
    if (pthread_mutex_init(&cb->ev_lock, NULL) != 0) {
        free(cb);
        free(access);
        return gp_error_set(GP_ERR_NOMEM, "cuda device %d: pthread_mutex_init failed", device);
    }
    if (pthread_mutex_init(&cb->map_lock, NULL) != 0) {
        pthread_mutex_destroy(&cb->ev_lock);
        free(cb);
        free(access);
        return gp_error_set(GP_ERR_NOMEM, "cuda device %d: pthread_mutex_init failed", device);
    }
    cb->access = access;
    cb->dev = dev;
    pthread_once_t once = PTHREAD_ONCE_INIT;
    cb->k_once = once;
    r = cu_api.primary_ctx_retain(&cb->ctx, dev);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_destroy(&cb->ev_lock);
        pthread_mutex_destroy(&cb->map_lock);
        free(cb->access);
        free(cb);
        return CU_FAIL(r, device, "%s", "cuDevicePrimaryCtxRetain()");
    }
    /* requestedHandleTypes stays CU_MEM_HANDLE_TYPE_NONE (0): exportable
     * handles are not needed and are refused on some systems. */
    cb->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    cb->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    cb->prop.location.id = device;
    cb->access[0].location = cb->prop.location;
    cb->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cb->n_access = 1;

    gp_backend *be = &cb->be;
    be->name = "cuda";
    be->device = device;
    be->total = total;
    be->destroy = cu_destroy;
#define CU_OP(ret, name, NAME, params, args) be->name = cu_##name;
    GP_BACKEND_OPS(CU_OP)
#undef CU_OP

    int pushed;
    size_t gran = 0;
    r = cu_enter(cb, &pushed);
    if (r == CUDA_SUCCESS) {
        r = cu_api.mem_get_granularity(&gran, &cb->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        cu_leave(pushed);
    }
    if (r != CUDA_SUCCESS || gran == 0) {
        gp_status st = r != CUDA_SUCCESS
                           ? CU_FAIL(r, device, "%s", "cuMemGetAllocationGranularity(MINIMUM)")
                           : gp_error_set(GP_ERR_BACKEND,
                                          "cuda device %d: cuMemGetAllocationGranularity returned 0",
                                          device);
        cu_destroy(be);
        return st;
    }
    be->granularity = gran;
    *out = be;
    return GP_OK;
}

gp_status gp_backend_cuda_uuid(int device, char *buf, size_t len)
{
    pthread_once(&cu_load_once, cu_load);
    if (cu_load_status != GP_OK) return gp_error_set(cu_load_status, "%s", cu_load_msg);
    CUresult r = cu_api.init(0);
    CUdevice dev;
    if (r == CUDA_SUCCESS) r = cu_api.device_get(&dev, device);
    CUuuid u;
    if (r == CUDA_SUCCESS) r = cu_api.device_get_uuid(&u, dev);
    if (r != CUDA_SUCCESS) return CU_FAIL(r, device, "%s", "cuDeviceGetUuid()");
    /* As nvidia-smi writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return GP_OK;
}

/* Primary contexts for copies between devices, retained on first use and
 * kept: PyTorch keeps them for the life of the process too. */
#define CU_PEER_MAX 64
static _Atomic(CUcontext) cu_peer_ctx[CU_PEER_MAX];

static CUresult cu_peer_context(int device, CUcontext *out)
{
    if (device < 0 || device >= CU_PEER_MAX) return CUDA_ERROR_INVALID_DEVICE;
    *out = atomic_load(&cu_peer_ctx[device]);
    if (*out) return CUDA_SUCCESS;
    CUdevice dev;
    CUresult r = cu_api.device_get(&dev, device);
    if (r == CUDA_SUCCESS) r = cu_api.primary_ctx_retain(out, dev);
    if (r != CUDA_SUCCESS) return r;
    CUcontext none = NULL;
    if (!atomic_compare_exchange_strong(&cu_peer_ctx[device], &none, *out)) cu_api.primary_ctx_release(dev);
    return CUDA_SUCCESS;
}

gp_status gp_backend_cuda_copy_peer(void *dst, int dst_device, const void *src, int src_device, uint64_t size,
                                    void *stream)
{
    pthread_once(&cu_load_once, cu_load);
    if (cu_load_status != GP_OK) return gp_error_set(cu_load_status, "%s", cu_load_msg);
    CUcontext dctx = NULL, sctx = NULL;
    CUresult r = cu_peer_context(dst_device, &dctx);
    if (r == CUDA_SUCCESS) r = cu_peer_context(src_device, &sctx);
    if (r == CUDA_SUCCESS)
        r = cu_api.memcpy_peer_async((CUdeviceptr)dst, dctx, (CUdeviceptr)src, sctx, size, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return CU_FAIL(r, src_device, "cuMemcpyPeerAsync(%llu bytes from %p to %p on device %d)",
                       (unsigned long long)size, src, dst, dst_device);
    return GP_OK;
}
