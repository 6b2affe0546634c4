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

/* CUDAPluggableAllocator::cacheInfo(DeviceIndex, size_t *largestBlock), as a
 * C function of the Itanium C++ ABI: `self` first, DeviceIndex is int8_t. */
typedef void (*gp_cache_info_fn)(void *self, signed char device, size_t *largest);

/* Make every CUDAPluggableAllocator answer cacheInfo() with `fn` instead of
 * throwing "does not yet support cacheInfo" (cuDNN asks it to size its
 * workspace when torch.backends.cudnn.benchmark is on).  The class's vtable
 * entry is rewritten in place; `fn` NULL puts PyTorch's own back.
 * Idempotent; NULL on success, else why not (a symbol missing, or the entry
 * not found: the behaviour is then PyTorch's). */
const char *gp_torch_set_cache_info(gp_cache_info_fn fn);

#endif
