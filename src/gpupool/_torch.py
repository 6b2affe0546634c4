"""Plugging gpupool into PyTorch: enable() installs the C allocator through
torch.cuda.memory.CUDAPluggableAllocator.  torch is imported only here, and
only when enable() (or a device query) is called."""
from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, Optional

from . import _C, _torch_patch
from ._registry import mark_enabled

__all__ = ["enable", "disable_torch_patches"]

_lock = threading.Lock()
_allocator: Any = None
_options: Optional[Dict[str, Any]] = None


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError("gpupool.enable() needs PyTorch: pip install torch (the README's "
                           "Requirements give the versions tested)") from e
    return torch


def enable(**options: Any) -> None:
    """Make gpupool PyTorch's CUDA allocator for this process.

    Call it once, at the top of the script, before anything allocates CUDA
    memory.  Keywords are the GPUPOOL_* options without the prefix, in lower
    case (mode="reserve", reserve="80%", limit="20GiB", priority="high", ...);
    they override the environment.  A malformed value raises ValueError
    naming the option and what is accepted.

    torch.cuda's memory APIs (memory_allocated, memory_stats, empty_cache,
    set_per_process_memory_fraction, memory_snapshot, ...) then answer from
    gpupool unless torch_patch=False (GPUPOOL_TORCH_PATCH=0);
    Tensor.record_stream and CUDA graph capture are always hooked, since
    memory could otherwise be reused under running kernels."""
    global _allocator, _options
    with _lock:
        if _allocator is not None:
            if options and options != _options:
                raise RuntimeError(
                    f"gpupool is already enabled with options {_options}; it cannot be "
                    f"re-enabled with {options} in the same process")
            return
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("gpupool.enable(): torch sees no CUDA device (torch.cuda.is_available() "
                               "is False); gpupool holds GPU memory, so there is nothing to enable on "
                               "this machine (gpupool.HostPool runs the allocator over host memory)")
        _C.configure(options)
        alloc = torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, "gpupool_malloc", "gpupool_free")
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "gpupool.enable() must run before the first CUDA allocation of the process: "
                "PyTorch's own allocator is already in use. Call it at the top of the script, "
                "or use `python -m gpupool run script.py`.") from e
        _allocator, _options = alloc, dict(options)
        mark_enabled()
        why = _C.torch_throw_missing()
        if why:
            warnings.warn(f"gpupool: a failed allocation cannot raise torch.OutOfMemoryError or "
                          f"RuntimeError under this PyTorch (C++ symbol {why} not found); PyTorch "
                          f"would get a tensor without memory", RuntimeWarning, stacklevel=2)
        why = _torch_patch.install_safety()
        if why:
            warnings.warn(f"gpupool: copies between the GPUs of this process (nn.DataParallel, tensor.to() "
                          f"of another GPU) will fail under this PyTorch (peer access not routed to gpupool: "
                          f"{why})", RuntimeWarning, stacklevel=2)
        if _C.config()["torch_patch"] == "1":
            why = _torch_patch.install_api()
            if why:
                warnings.warn(f"gpupool: torch.backends.cudnn.benchmark=True will fail under this "
                              f"PyTorch (cacheInfo not routed to gpupool: {why})", RuntimeWarning,
                              stacklevel=2)


def disable_torch_patches() -> None:
    """Give torch.cuda its own memory APIs back (memory_stats, empty_cache,
    memory_snapshot, ..., and the allocator's cacheInfo: under a pluggable
    allocator most of them then raise or do nothing, and
    torch.backends.cudnn.benchmark=True fails).  The record_stream and CUDA
    graph hooks stay: without them memory would be reused under running
    kernels."""
    _torch_patch.uninstall_api()
