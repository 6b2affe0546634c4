"""The device registry: one gpupool pool per CUDA device (made by the C side
on the device's first allocation), whether gpupool is enabled, and which
device is current.  Imports nothing of gpupool but the C module and the pool
view, so that every layer above (tags, snapshots, the PyTorch hooks) can
reach device pools without importing back into itself."""
from __future__ import annotations

import sys
from typing import Optional

from . import _C
from ._pool import PoolView

__all__ = ["device_pool", "current_device", "is_enabled", "mark_enabled"]

_enabled = False


def mark_enabled() -> None:
    """Record that gpupool is PyTorch's allocator now (enable() succeeded)."""
    global _enabled
    _enabled = True


def is_enabled() -> bool:
    """True once enable() succeeded in this process."""
    return _enabled


def current_device() -> int:
    """torch's current CUDA device when torch is loaded, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.current_device())
    return 0


def device_pool(device: Optional[int] = None) -> PoolView:
    """The pool of a CUDA device (the current one by default)."""
    if not is_enabled():
        raise RuntimeError("gpupool is not enabled: call gpupool.enable() first")
    d = current_device() if device is None else int(device)
    return PoolView(_C.device_pool(d, True), f"device {d}")
