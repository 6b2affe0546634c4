"""Snapshots and history of the device pools: ``snapshot()``,
``dump_snapshot()`` and ``record_history()`` (the format itself is
``_snapshot``; these reach the pools through the device registry)."""
from __future__ import annotations

import pickle
from typing import Any, Dict, Optional

from . import _C
from ._registry import current_device, device_pool
from ._snapshot import pool_snapshot

__all__ = ["snapshot", "dump_snapshot", "record_history"]


def snapshot(device: Optional[int] = None) -> Dict[str, Any]:
    """The snapshot of a CUDA device's pool (the current device by default)
    in the format of ``torch.cuda.memory._snapshot()``.  Needs enable()."""
    d = current_device() if device is None else int(device)
    return pool_snapshot(device_pool(d), d, dict(_C.config()))


def dump_snapshot(filename: str, device: Optional[int] = None) -> None:
    """Pickle ``snapshot(device)`` to `filename`: drop the file on
    https://pytorch.org/memory_viz, or give it to ``python -m
    torch.cuda._memory_viz``."""
    data = snapshot(device)
    with open(filename, "wb") as f:
        pickle.dump(data, f)


def record_history(enabled: bool = True, max_entries: int = _C.HISTORY_DEFAULT, stacks: bool = True,
                   device: Optional[int] = None) -> None:
    """Record the history of allocations for snapshots and plots: the newest
    `max_entries` alloc/free/map/unmap/OOM events of each device's pool (a
    ring; 40 bytes an event), with the Python stack of each call when
    `stacks` (cost: a walk of the Python frames per allocation and free,
    about a microsecond for a shallow stack -- and a Python thread that
    released the GIL, as PyTorch's operators do, takes it for the walk,
    as PyTorch's own history does).  enabled=False stops and drops it.
    `device`: one device; None: every device that has a pool, and the
    current one.  ``GPUPOOL_TRACE=1`` turns it on from the start."""
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"record_history: max_entries must be an int > 0, got {max_entries!r}")
    devices = [int(device)] if device is not None else sorted(set(_C.devices()) | {current_device()})
    for d in devices:
        device_pool(d).record_history(enabled, max_entries, stacks)
