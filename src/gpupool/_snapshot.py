"""Snapshots of a pool in the format of ``torch.cuda.memory._snapshot()``, so
that PyTorch's memory_viz (https://pytorch.org/memory_viz) and
``torch.cuda._memory_viz`` read them, and the history they carry.

A snapshot is a dict:

* ``segments``: the mapped runs of the pool (gpupool maps physical memory in
  chunks; a run of mapped chunks is what PyTorch calls an expandable
  segment), each with its ``blocks`` in address order: ``active_allocated``
  (live), ``inactive`` (free, cached) or ``active_pending_free`` (freed,
  waiting for ``record_stream`` streams).  Blocks also carry gpupool's
  ``tag``, ``priority``, ``stream`` and ``lifetime``, which memory_viz ignores.
  A segment's ``stream`` is 0: gpupool's mapped memory belongs to no stream
  (its blocks do), and memory_viz merges neighbouring segments only when
  their streams match.
* ``device_traces``: one list per device index; the device's list holds the
  history when it is on (``record_history()`` / ``GPUPOOL_TRACE=1``):
  ``alloc``, ``free_requested``, ``free_completed``, ``segment_map``,
  ``segment_unmap``, ``oom`` (with ``device_free``), and gpupool's own
  ``offload`` / ``restore``, each with ``addr``, ``size``, ``stream``,
  ``time_us`` (wall clock), ``frames`` (the Python stack, innermost first,
  when stacks are on) and ``tag`` / ``priority``.
* ``allocator_settings``: ``expandable_segments`` and gpupool's options.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _C

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ._pool import PoolView

__all__ = ["pool_snapshot", "history_events", "ACTIONS"]

# gp_event.action (GP_EV_*) -> the action names of PyTorch's trace.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_map", "segment_unmap", "oom",
           "offload", "restore")
_STATES = {"used": "active_allocated", "free": "inactive", "pending": "active_pending_free"}


def history_events(view: "PoolView") -> List[Dict[str, Any]]:
    """The pool's history, oldest first, as trace entries of PyTorch's
    snapshot format (see the module docstring); [] while the history is off."""
    # time.monotonic_ns() reads CLOCK_MONOTONIC, as the C side does.
    offset_ns = time.time_ns() - time.monotonic_ns()
    frames: Dict[int, List[Dict[str, Any]]] = {0: []}
    out = []
    for t_ns, action, addr, size, stream, tag, prio, stack in view._pool.history():
        if stack not in frames:
            frames[stack] = _C.stack_frames(stack)
        name = ACTIONS[action]
        e: Dict[str, Any] = {"action": name}
        if name == "oom":
            e["device_free"] = addr
        else:
            e["addr"] = addr
        e.update(size=size, stream=stream, time_us=(t_ns + offset_ns) // 1000, frames=frames[stack],
                 tag=_C.tag_name(tag), priority=prio)
        out.append(e)
    return out


def pool_snapshot(view: "PoolView", device: int = 0,
                  settings: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The snapshot of any pool (a device's or a HostPool), filed under
    device index `device`; `settings` are the options shown in
    ``allocator_settings`` (gpupool's configuration for device pools)."""
    opts = dict(settings if settings is not None else {})
    trace = history_events(view)
    blocks = view.blocks()
    # The live block at an address was allocated by the last alloc there.
    alloc_frames: Dict[int, List[Dict[str, Any]]] = {}
    for e in trace:
        if e["action"] == "alloc":
            alloc_frames[e["addr"]] = e["frames"]
    segments: List[Dict[str, Any]] = []
    seg: Optional[Dict[str, Any]] = None
    end, arena = -1, ""
    for b in blocks:
        # Offloaded memory is on the host: outside the device's segments (its
        # blocks' offload and restore are in the trace).
        if b.state in ("unmapped", "offloaded", "free_offloaded", "transit"):
            seg = None
            continue
        if seg is None or b.addr != end or b.arena != arena:
            seg = {"device": device, "address": b.addr, "total_size": 0, "allocated_size": 0,
                   "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": b.arena,
                   "segment_pool_id": (0, 0),
                   "is_expandable": opts.get("mode", "expandable") != "reserve",
                   "frames": [], "blocks": []}
            segments.append(seg)
        state = _STATES[b.state]
        live = b.state == "used"
        seg["total_size"] += b.size
        if live:
            seg["allocated_size"] += b.size
            seg["requested_size"] += b.requested
        if b.state in ("used", "pending"):
            seg["active_size"] += b.size
        seg["blocks"].append({
            "address": b.addr, "size": b.size, "requested_size": b.requested if live else 0,
            "state": state, "frames": alloc_frames.get(b.addr, []) if live else [],
            "tag": b.tag, "priority": b.priority, "stream": b.stream, "lifetime": b.lifetime})
        end, arena = b.addr + b.size, b.arena
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(device + 1)]
    traces[device] = trace
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "expandable_segments": opts.get("mode", "expandable") != "reserve",
            "allocator": "gpupool",
            "gpupool": opts,
        },
    }
