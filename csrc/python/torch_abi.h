/*
 * torch_abi.h -- what gpupool does through PyTorch's C++ ABI, from C, with
 * nothing linked: every symbol is looked up in the libraries torch has
 * loaded, and each call says when one is missing.  See torch_abi.c.
 */
#ifndef GP_TORCH_ABI_H
#define GP_TORCH_ABI_H

#include <stddef.h>

/* NULL when every C++ symbol the throws need is loaded in the process,
 * else the name of the first one missing (looked up once, on the first
 * call). */
const char *gp_torch_throw_missing(void);

/* Throw a c10::OutOfMemoryError (when `oom`: torch.OutOfMemoryError in
 * Python) or a c10::Error (RuntimeError) carrying `msg` through the
 * caller's frames (they must hold no lock and own nothing).  Returns only
 * when the symbols are not there (no torch in the process): the caller then
 * returns NULL. */
void gp_torch_throw(int oom, const char *msg);

/* The methods of CUDAPluggableAllocator that gpupool answers in place of
 * PyTorch, as C functions of the Itanium C++ ABI: `self` first,
 * DeviceIndex is int8_t, cudaError_t an int, cudaStream_t a pointer.
 *   cacheInfo(DeviceIndex, size_t *largestBlock): PyTorch's throws "does
 *     not yet support cacheInfo"; cuDNN asks it to size its workspace when
 *     torch.backends.cudnn.benchmark is on.
 *   enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access): PyTorch's
 *     enables the contexts' peer access, which does not reach memory mapped
 *     with cuMemMap: `dev` could not copy to or run on gpupool's memory of
 *     `dev_to_access`.
 *   memcpyAsync(dst, dstDevice, src, srcDevice, count, stream, p2p_enabled):
 *     PyTorch's calls cudaMemcpyAsync, which cannot copy memory mapped with
 *     cuMemMap between devices without a peer-to-peer path. */
typedef void (*gp_cache_info_fn)(void *self, signed char device, size_t *largest);
typedef void (*gp_enable_peer_access_fn)(void *self, signed char dev, signed char dev_to_access);
typedef int (*gp_memcpy_async_fn)(void *self, void *dst, int dst_device, const void *src, int src_device,
                                  size_t count, void *stream, _Bool p2p_enabled);

typedef enum gp_torch_method {
    GP_TORCH_CACHE_INFO,
    GP_TORCH_ENABLE_PEER_ACCESS,
    GP_TORCH_MEMCPY_ASYNC,
    GP_TORCH_METHODS
} gp_torch_method;

/* Make every CUDAPluggableAllocator call `fn` (a function of the method's
 * type above) for method `m`: the class's vtable entry is rewritten in
 * place; `fn` NULL puts PyTorch's own back.  Idempotent; NULL on success,
 * else why not (a symbol missing, or the entry not found: the behaviour is
 * then PyTorch's). */
const char *gp_torch_override(gp_torch_method m, void *fn);
/* PyTorch's own function for `m`, for an override to call; NULL when
 * PyTorch's CUDA library is not loaded. */
void *gp_torch_own(gp_torch_method m);

#endif
