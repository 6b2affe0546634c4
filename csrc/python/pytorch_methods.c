/*
 * pytorch_methods.c -- the methods of PyTorch's CUDAPluggableAllocator that
 * gpupool answers in its place (torch_abi.h says why each), and the module
 * functions that install them (module.c adds these with
 * gp_pytorch_methods_register):
 *
 *   cacheInfo         the pool's headroom, for cuDNN's benchmark mode;
 *   enablePeerAccess  PyTorch's own (the contexts' peer access), then the
 *                     peer's access to every mapping of the device's stack,
 *                     now and later (gp_registry_grant_peer);
 *   memcpyAsync       between devices without a peer-to-peer path,
 *                     cuMemcpyPeerAsync; else PyTorch's own.
 *
 * Over the host backend (tests without a GPU) there is no CUDA to call:
 * devices are the host's memory, and a copy between them is a memmove.
 */
#include <string.h>

#include "module.h"
#include "torch_abi.h"

/* PyTorch's allocator answers the larger of its largest cached block and
 * what it is given -- the driver's free memory when given 0.  The pool's
 * headroom is that, within its limit.  It only reads: a device without a
 * pool gets no pool (in reserve mode, making one would map most of the
 * device), and the answer PyTorch's would give with nothing cached. */
static void gp_cache_info(void *self, signed char device, size_t *largest)
{
    (void)self;
    gp_stack *p = gp_registry_get(device);
    uint64_t h = p ? gp_pool_headroom(gp_stack_pool(p)) : *largest ? 0 : gp_registry_device_free(device);
    if (h > *largest) *largest = (size_t)h;
}

/* `dev` may now read and write `dev_to_access`'s memory.  PyTorch asks once
 * per pair of devices, before the first copy (or copy kernel) between them
 * when they have a peer-to-peer path; it runs that copy on `dev`. */
static void gp_enable_peer_access(void *self, signed char dev, signed char dev_to_access)
{
    if (!gp_registry_on_host()) {
        gp_enable_peer_access_fn own = (gp_enable_peer_access_fn)gp_torch_own(GP_TORCH_ENABLE_PEER_ACCESS);
        own(self, dev, dev_to_access); /* (throws if the contexts cannot) */
    }
    if (gp_registry_grant_peer(dev_to_access, dev) == GP_OK) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "gpupool: device %d cannot be given access to device %d's memory: %s", dev,
             dev_to_access, gp_last_error());
    gp_torch_throw(0, msg); /* (returns only without PyTorch's C++ symbols: nothing to tell) */
}

/* A cudaError_t: cudaSuccess, and cudaErrorInvalidValue for a copy that
 * could not be queued (after the throw, which PyTorch's bindings raise). */
enum { GP_CUDA_SUCCESS = 0, GP_CUDA_INVALID_VALUE = 1 };

static int gp_memcpy_async(void *self, void *dst, int dst_device, const void *src, int src_device, size_t count,
                           void *stream, _Bool p2p_enabled)
{
    /* The same device, or two whose peer access enablePeerAccess granted:
     * gpupool's memory is mapped for both, cudaMemcpyAsync reaches it. */
    if (p2p_enabled || dst_device == src_device) {
        gp_memcpy_async_fn own = (gp_memcpy_async_fn)gp_torch_own(GP_TORCH_MEMCPY_ASYNC);
        return own(self, dst, dst_device, src, src_device, count, stream, p2p_enabled);
    }
    if (gp_registry_on_host()) {
        memmove(dst, src, count);
        return GP_CUDA_SUCCESS;
    }
    if (gp_backend_cuda_copy_peer(dst, dst_device, src, src_device, count, stream) == GP_OK) return GP_CUDA_SUCCESS;
    char msg[1024];
    snprintf(msg, sizeof msg, "gpupool: copy of %zu bytes from device %d to device %d: %s", count, src_device,
             dst_device, gp_last_error());
    gp_torch_throw(0, msg);
    return GP_CUDA_INVALID_VALUE;
}

/* Install (on) or take back the methods; None when done, else why not. */
static PyObject *gp_override(PyObject *arg, const gp_torch_method *methods, void *const *fns, size_t n)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *why = gp_torch_override(methods[i], on ? fns[i] : NULL);
        if (why) return PyUnicode_FromString(why);
    }
    Py_RETURN_NONE;
}

static PyObject *m_set_cache_info(PyObject *self, PyObject *arg)
{
    (void)self;
    static const gp_torch_method m[] = {GP_TORCH_CACHE_INFO};
    void *const fns[] = {(void *)gp_cache_info};
    return gp_override(arg, m, fns, 1);
}

static PyObject *m_set_peer_access(PyObject *self, PyObject *arg)
{
    (void)self;
    static const gp_torch_method m[] = {GP_TORCH_ENABLE_PEER_ACCESS, GP_TORCH_MEMCPY_ASYNC};
    void *const fns[] = {(void *)gp_enable_peer_access, (void *)gp_memcpy_async};
    return gp_override(arg, m, fns, 2);
}

static PyObject *m_device_peers(PyObject *self, PyObject *arg)
{
    (void)self;
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    uint64_t peers = gp_registry_peers((int)device);
    PyObject *out = PyList_New(0);
    for (int d = 0; out && d < GP_MAX_DEVICES; d++) {
        if (!(peers >> d & 1)) continue;
        PyObject *v = PyLong_FromLong(d);
        if (!v || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

static PyMethodDef pytorch_methods[] = {
    {"set_cache_info", m_set_cache_info, METH_O,
     "set_cache_info(on): answer CUDAPluggableAllocator::cacheInfo (cuDNN benchmark) from gpupool, "
     "or (False) give PyTorch's own back; None when done, else why not"},
    {"set_peer_access", m_set_peer_access, METH_O,
     "set_peer_access(on): answer CUDAPluggableAllocator::enablePeerAccess and memcpyAsync for gpupool's "
     "memory (copies and kernels between devices of one process), or (False) give PyTorch's own back; "
     "None when done, else why not"},
    {"device_peers", m_device_peers, METH_O,
     "device_peers(device) -> [devices granted access to device's memory]"},
    {NULL, NULL, 0, NULL},
};

int gp_pytorch_methods_register(PyObject *module) { return PyModule_AddFunctions(module, pytorch_methods); }
