"""gpupool: a caching, pooled GPU memory allocator for PyTorch.

    import gpupool
    gpupool.enable()          # first thing: every CUDA tensor now lives in gpupool
    ...
    print(gpupool.report())

Importing gpupool needs neither torch nor a GPU; HostPool runs the same
allocator over host memory."""
# (No `from __future__ import annotations` and no bare typing names here:
# every public name of the package is in __all__, tests/test_python_api.py.)
from typing import Any as _Any, Dict as _Dict, List as _List, Optional as _Optional, TextIO as _TextIO, Tuple as _Tuple

from . import _C
from ._arbiter import install_yield_point, registries, tenants, yield_point
from ._context import current_tag, priority_value, tag, tag_lifetime
from ._history import dump_snapshot, record_history, snapshot
from ._offload import offload, offloaded, prefetch, restore
from ._offloadable import OffloadHandle, offloadable
from ._plot import plot
from ._pool import Block, HostPool, PoolCorruptError, PoolView, format_bytes
from ._registry import device_pool, is_enabled
from ._tagged import tagged
from ._torch import disable_torch_patches, enable

# pyproject.toml's version, as the extension was built with it (setup.py).
__version__: str = _C.build_info()["version"]

__all__ = [
    "__version__", "build_info", "enable", "is_enabled", "stats", "report", "reset_peak_stats",
    "empty_cache", "set_limit", "budget", "last_oom_report", "tag", "current_tag", "HostPool",
    "PoolView", "Block", "format_bytes", "config", "config_options", "priority_value",
    "tagged", "tag_lifetime",
    "disable_torch_patches", "snapshot", "dump_snapshot", "record_history", "plot",
    "offload", "restore", "prefetch", "offloaded", "offloadable", "OffloadHandle",
    "yield_point", "install_yield_point", "tenants", "registries", "device_pool",
    "check", "PoolCorruptError",
]


def build_info() -> _Dict[str, _Any]:
    """Version, compiler, and whether the optional zstd codec of the host
    backend can be used here (libzstd.so.1 is loaded at run time)."""
    return dict(_C.build_info())


def config() -> _Dict[str, str]:
    """The configuration in force (defaults until enable() is called)."""
    return dict(_C.config())


def config_options() -> _List[_Tuple[str, str, str, str, str]]:
    """Every GPUPOOL_* option: (variable, keyword, default, accepted, meaning)."""
    return list(_C.config_options())


def stats(device: _Optional[int] = None) -> _Dict[str, _Any]:
    """Figures of a device's pool: allocated, reserved, peaks, counts, driver
    calls, fragmentation, per tag ('tags') and per priority ('priorities')."""
    return device_pool(device).stats()


def check(device: _Optional[int] = None) -> None:
    """Check the integrity of a device's pool (the current device by
    default) and of its offloader, if it has one: None when consistent,
    PoolCorruptError naming the first problem otherwise (PoolView.check)."""
    device_pool(device).check()


def report(device: _Optional[int] = None, file: _Optional[_TextIO] = None) -> str:
    """A readable table of the device's memory; also written to `file` if given."""
    text = device_pool(device).report()
    if file is not None:
        print(text, file=file)
    return text


def reset_peak_stats(device: _Optional[int] = None) -> None:
    """Reset every peak figure of the device's pool to its current value."""
    device_pool(device).reset_peak_stats()


def empty_cache(device: _Optional[int] = None) -> int:
    """Give cached (free) physical memory back to the device; returns bytes released."""
    return device_pool(device).empty_cache()


def set_limit(nbytes: _Optional[int], tag: _Optional[str] = None, device: _Optional[int] = None) -> None:
    """Cap the pool's reserved bytes, or a tag's allocated bytes; None removes the cap."""
    device_pool(device).set_limit(nbytes, tag)


def last_oom_report(device: _Optional[int] = None) -> str:
    """The report of the last allocation that ran out of memory ('' if none)."""
    return device_pool(device).last_oom_report()


def budget(device: _Optional[int] = None) -> _Dict[str, int]:
    """Device total, free (as the driver sees it), the pool limit and what gpupool holds."""
    import torch

    d = device if device is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(d)
    s = device_pool(d).stats()
    return {"total": int(total), "free": int(free), "limit": s["limit"],
            "reserved": s["reserved"], "allocated": s["allocated"]}
