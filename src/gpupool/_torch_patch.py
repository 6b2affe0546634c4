"""Keep PyTorch's memory APIs working while gpupool is the allocator.

Through CUDAPluggableAllocator PyTorch hands gpupool only malloc and free: its
statistics, snapshot and history calls raise, ``empty_cache`` and
``set_per_process_memory_fraction`` do nothing, ``Tensor.record_stream`` does
nothing (PyTorch 2.11 has a C++ setter for it that Python cannot reach), and a
CUDA graph capture gets no private memory.  This module routes those Python
entry points to gpupool:

* API routing (``install_api`` / ``uninstall_api``; off with
  ``GPUPOOL_TORCH_PATCH=0`` or ``gpupool.disable_torch_patches()``): the
  statistics functions answer from gpupool under PyTorch's key names
  (``torch_memory_stats``), ``memory_summary`` prints gpupool's report,
  ``empty_cache`` trims, ``set_per_process_memory_fraction`` sets gpupool's
  limit, the snapshot functions give gpupool's snapshot in PyTorch's
  format, and the allocator's C++ ``cacheInfo`` (cuDNN's benchmark mode)
  answers from gpupool (csrc/python/pytorch_methods.c).  Each is set in both ``torch.cuda`` and ``torch.cuda.memory``, since
  code calls both.  The allocator calls of torch.compile's CUDA graph trees
  raise an error that names what works under gpupool instead of torch's.
* Correctness hooks (``install_safety``; always on while gpupool is enabled,
  since turning them off would let memory be reused under running kernels):
  ``torch.Tensor.record_stream`` also tells gpupool, and
  ``torch.cuda.CUDAGraph.capture_begin / capture_end / reset`` give each graph
  pool private gpupool memory (see gpupool.h, gp_pool_capture_*).  Calls that
  C++ makes internally (c10d's ``recordStream``, graphs begun without this
  Python class) bypass them.  The allocator's C++ ``enablePeerAccess`` and
  ``memcpyAsync`` also answer from gpupool (csrc/python/pytorch_methods.c):
  PyTorch's do not reach memory mapped with cuMemMap, so copies between the
  GPUs of one process (nn.DataParallel, ``tensor.to("cuda:1")``) failed.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _C, _history
from ._offload import restore
from ._pool import PoolView

__all__ = ["torch_memory_stats", "install_api", "uninstall_api", "install_safety", "api_installed"]

_lock = threading.Lock()
# (module, attribute) -> the original, for every attribute replaced.
_saved: Dict[Tuple[Any, str], Any] = {}
_api_names: List[str] = []
# Cumulative figures at the last reset_accumulated_memory_stats, per device.
_baseline: Dict[int, Dict[str, int]] = {}
# PyTorch graph pool ids -> gpupool graph pool keys.
_graph_keys: Dict[Tuple[Any, ...], int] = {}

# gpupool's figures (gpupool.h's GP_STATS_FIELDS): (name, kind, PyTorch key).
_FIELDS: Tuple[Tuple[str, str, Optional[str]], ...] = _C.STATS_FIELDS
# What a device without a pool yet reports.
_ZERO: Dict[str, int] = {name: 0 for name, _, _ in _FIELDS}
# The counters reset_accumulated_memory_stats restarts.
_TOTALS = tuple(name for name, kind, _ in _FIELDS if kind == "total")


def torch_memory_stats(s: Dict[str, int], base: Optional[Dict[str, int]] = None) -> "OrderedDict[str, int]":
    """gpupool's figures (``PoolView.stats()``) under the key names of
    ``torch.cuda.memory_stats()``, sorted like PyTorch's.  Only what gpupool
    measures is given ("all" pools; no small_pool/large_pool split, no peaks
    it does not keep).  ``base`` holds the cumulative counters at the last
    reset_accumulated_memory_stats (subtracted)."""
    b = base or {}
    out = {key: s[name] - (b.get(name, 0) if kind == "total" else 0)
           for name, kind, key in _FIELDS if key is not None}
    # The figures PyTorch derives from several of ours.
    freed = s["allocated_total"] - s["allocated"] - b.get("allocated_freed", 0)
    out.update({
        "allocated_bytes.all.freed": freed,
        "requested_bytes.all.freed": s["requested_total"] - s["requested"] - b.get("requested_freed", 0),
        # Active = allocated + freed blocks still waiting for record_stream
        # events, as PyTorch counts it.
        "active_bytes.all.current": s["allocated"] + s["pending"],
        "active_bytes.all.allocated": out["allocated_bytes.all.allocated"],
        "active_bytes.all.freed": freed - s["pending"],
        "inactive_split_bytes.all.current": s["free_bytes"] - s["pending"],
        "max_split_size": -1,  # PyTorch's "no limit": gpupool splits any block
    })
    return OrderedDict(sorted(out.items()))


def _accumulated(s: Dict[str, int]) -> Dict[str, int]:
    """The cumulative counters that reset_accumulated_memory_stats zeroes."""
    b = {k: s[k] for k in _TOTALS}
    b["allocated_freed"] = s["allocated_total"] - s["allocated"]
    b["requested_freed"] = s["requested_total"] - s["requested"]
    return b


# ----------------------------------------------------------------- helpers

def _torch() -> Any:
    import torch
    return torch


def _device(device: Any) -> int:
    """PyTorch's device argument (None, int, str, torch.device) -> ordinal."""
    torch = _torch()
    return int(torch.cuda._utils._get_device_index(device, optional=True))


def _pool(device: Any, create: bool = False) -> Optional[PoolView]:
    d = _device(device)
    p = _C.device_pool(d, create)
    return None if p is None else PoolView(p, f"device {d}")


def _raw_stats(d: int) -> Dict[str, int]:
    p = _C.device_pool(d, False)
    return p.stats(True) if p is not None else dict(_ZERO)


# -------------------------------------------------------- the API routing

def memory_stats(device: Any = None) -> "OrderedDict[str, int]":
    """torch.cuda.memory_stats, answered by gpupool."""
    d = _device(device)
    return torch_memory_stats(_raw_stats(d), _baseline.get(d))


def memory_stats_as_nested_dict(device: Any = None) -> Dict[str, Any]:
    """torch.cuda.memory_stats_as_nested_dict, answered by gpupool."""
    nested: Dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary: gpupool's report of the device."""
    p = _pool(device)
    if p is None:
        return f"gpupool: nothing allocated on device {_device(device)} yet"
    return p.report()


def reset_peak_memory_stats(device: Any = None) -> None:
    """torch.cuda.reset_peak_memory_stats: every gpupool peak to its current value."""
    p = _pool(device)
    if p is not None:
        p.reset_peak_stats()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """torch.cuda.reset_accumulated_memory_stats: cumulative counters restart at 0."""
    d = _device(device)
    _baseline[d] = _accumulated(_raw_stats(d))


def empty_cache() -> None:
    """torch.cuda.empty_cache: give gpupool's cached memory back on every device."""
    for d in _C.devices():
        _C.device_pool(d, False).trim()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """torch.cuda.set_per_process_memory_fraction: gpupool's limit on reserved
    memory becomes `fraction` of the device (0..1, as PyTorch accepts)."""
    if not isinstance(fraction, (float, int)) or isinstance(fraction, bool):
        raise TypeError(f"set_per_process_memory_fraction: fraction must be a float, got {fraction!r}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"set_per_process_memory_fraction: fraction {fraction} is outside the "
                         "accepted range 0..1")
    p = _pool(device, create=True)
    assert p is not None
    p.set_limit(int(fraction * p.stats()["device_total"]))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """torch.cuda.get_per_process_memory_fraction: gpupool's limit / device size (1.0: none)."""
    p = _pool(device, create=True)
    assert p is not None
    s = p.stats()
    return s["limit"] / s["device_total"] if s["limit"] else 1.0


def _snapshot(device: Any = None, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """torch.cuda.memory._snapshot: gpupool's snapshot in PyTorch's format."""
    return _history.snapshot(_device(device))


def memory_snapshot(*args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
    """torch.cuda.memory_snapshot: the segments of gpupool's snapshot."""
    return list(_snapshot()["segments"])


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """torch.cuda.memory._dump_snapshot: pickle gpupool's snapshot (memory_viz reads it)."""
    _history.dump_snapshot(filename)


# A ring of more events than this would take GiBs of host memory (40 B an
# event plus stacks); PyTorch's default max_entries is sys.maxsize, meaning
# "no bound", which gpupool's ring cannot honour, so it keeps its default.
_HISTORY_CAP = 1 << 26


def _record_memory_history(enabled: Any = "all", context: Any = "all", stacks: Any = "all",
                           max_entries: Optional[int] = None, device: Any = None,
                           *args: Any, **kwargs: Any) -> None:
    """torch.cuda.memory._record_memory_history: gpupool.record_history.

    ``enabled`` None or False stops (and drops) the history; "state", "all" or
    True records it.  ``stacks="python"`` or ``"all"`` (and ``context`` not
    None) records Python stacks; C++ frames are not gathered.  ``max_entries``
    left out, or above 2**26 events (PyTorch's default, sys.maxsize, means
    "unbounded"), gives gpupool's default ring of 100,000 events."""
    if "trace_alloc_max_entries" in kwargs:  # the pre-2.1 keyword
        max_entries = kwargs.pop("trace_alloc_max_entries")
    on = enabled not in (None, False)
    if max_entries is None or (isinstance(max_entries, int) and max_entries > _HISTORY_CAP):
        max_entries = _C.HISTORY_DEFAULT
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"_record_memory_history: max_entries must be an int > 0, got {max_entries!r}")
    with_stacks = context is not None and stacks in ("python", "all", True)
    _history.record_history(on, max_entries, with_stacks, None if device is None else _device(device))


_API: Dict[str, Callable[..., Any]] = {
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "memory_summary": memory_summary,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "empty_cache": empty_cache,
    "set_per_process_memory_fraction": set_per_process_memory_fraction,
    "get_per_process_memory_fraction": get_per_process_memory_fraction,
    "_snapshot": _snapshot,
    "memory_snapshot": memory_snapshot,
    "_dump_snapshot": _dump_snapshot,
    "_record_memory_history": _record_memory_history,
}
# memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
# reset_max_memory_allocated, ... are left as they are: PyTorch writes them
# over memory_stats / reset_peak_memory_stats, looked up in torch.cuda.memory
# at call time, so they follow.


# torch.compile's CUDA graphs (mode="reduce-overhead" or "max-autotune":
# CUDA graph trees) keep their memory pool's state through calls into
# PyTorch's own caching allocator that a pluggable allocator cannot answer,
# and torch's error for them asks the user to file an issue with torch.
# Under gpupool these calls say what works instead.
_GRAPH_TREE_CALLS = ("_cuda_checkPoolLiveAllocations", "_cuda_getCheckpointState", "_cuda_setCheckpointPoolState")


def _graph_trees_refused(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"gpupool: torch.compile's CUDA graphs (mode='reduce-overhead' or 'max-autotune', which record "
            f"with CUDA graph trees) need PyTorch's own caching allocator (torch._C.{name}), which gpupool "
            "does not replace. Under gpupool, torch.cuda.graph and torch.cuda.make_graphed_callables work, "
            "and so does torch.compile with mode='default' or 'max-autotune-no-cudagraphs'; or set "
            "torch._inductor.config.triton.cudagraph_trees = False before compiling: each graph then has "
            "a memory pool of its own and its outputs are overwritten by its next replay (clone what you keep).")
    return refuse


_API_C: Dict[str, Callable[..., Any]] = {name: _graph_trees_refused(name) for name in _GRAPH_TREE_CALLS}


def _set(obj: Any, name: str, value: Any) -> None:
    if (obj, name) not in _saved:
        _saved[(obj, name)] = getattr(obj, name)
    setattr(obj, name, value)


def install_api() -> Optional[str]:
    """Route torch.cuda's memory APIs to gpupool, and the allocator's
    cacheInfo, which cuDNN's benchmark mode asks for its workspace (the
    pluggable allocator throws: every convolution would fail); CUDA graph
    trees' allocator calls raise an error that says what works.  Idempotent.
    Returns why cacheInfo could not be routed (None when it was)."""
    torch = _torch()
    with _lock:
        for mods, table in (((torch.cuda, torch.cuda.memory), _API), ((torch._C,), _API_C)):
            for name, fn in table.items():
                for mod in mods:
                    if hasattr(mod, name):
                        _set(mod, name, fn)
                if name not in _api_names:
                    _api_names.append(name)
        return _C.set_cache_info(True)


def uninstall_api() -> None:
    """Give torch.cuda its own memory APIs and cacheInfo back."""
    with _lock:
        for (obj, name) in list(_saved):
            if name in _api_names:
                setattr(obj, name, _saved.pop((obj, name)))
        _api_names.clear()
        _C.set_cache_info(False)


def api_installed() -> bool:
    """True while torch.cuda's memory APIs answer from gpupool."""
    return bool(_api_names)


# ------------------------------------------------------ correctness hooks

def _record_stream_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
    def record_stream(self: Any, stream: Any) -> None:
        orig(self, stream)  # PyTorch's checks of the arguments
        if not self.is_cuda:
            return
        ptr = self.untyped_storage().data_ptr()
        p = _C.device_pool(self.device.index, False)
        if not ptr or p is None:
            return
        try:
            p.record_stream(ptr, stream.cuda_stream)
        except ValueError:
            pass  # memory gpupool did not allocate (from_blob, DLPack): not its to keep
    record_stream.__doc__ = orig.__doc__
    return record_stream


def _ident(pool_id: Any) -> Tuple[Any, ...]:
    try:
        return tuple(pool_id)
    except TypeError:
        return (pool_id,)


def _graph_key(pool_id: Any) -> int:
    """A gpupool graph pool key for PyTorch's graph pool id (a pair of ints)."""
    with _lock:
        return _graph_keys.setdefault(_ident(pool_id), len(_graph_keys) + 1)


def _alias_graph_key(pool_id: Any, key: int) -> None:
    with _lock:
        _graph_keys[_ident(pool_id)] = key


def _release(device: int, key: int) -> None:
    p = _C.device_pool(device, False)
    if p is not None:
        p.capture_release(key)


# The users of each capture open now (any thread's: autograd's threads run
# the backward hooks of a capture's backward pass).  A user is an
# OffloadHandle whose hooks ran inside the capture: the graph holds its
# users resident through each replay, which runs none of their hooks, all
# with one restore (OffloadHandle._hold_resident_all, then _release each).
_open_captures: "List[weakref.WeakSet[Any]]" = []
_users_lock = threading.Lock()


def capturing() -> bool:
    """Whether a CUDA graph capture through torch.cuda.CUDAGraph is open."""
    return bool(_open_captures)


def note_use(user: Any) -> None:
    """`user` was used by the captures open now, if any."""
    if _open_captures:  # (a hook's cost outside captures: one test)
        with _users_lock:
            for users in _open_captures:
                users.add(user)


def _graph_hooks(cls: Any) -> Dict[str, Callable[..., Any]]:
    torch = _torch()
    orig_begin, orig_end, orig_reset, orig_replay = cls.capture_begin, cls.capture_end, cls.reset, cls.replay

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        d = torch.cuda.current_device()
        stream = torch.cuda.current_stream(d).cuda_stream
        p = _C.device_pool(d, True)
        # A shared pool (a graph's pool(), graph_pool_handle(), a MemPool) is
        # known by its id; without one the graph gets a pool of its own, whose
        # id PyTorch tells only after the capture (see capture_end).
        shared = kwargs.get("pool", args[0] if args else None)
        key = _graph_key(getattr(shared, "id", shared)) if shared is not None else _graph_key(("graph", id(self)))
        # Before the capture: synchronises and maps ahead, which a capture cannot.
        p.capture_prepare(stream)
        orig_begin(self, *args, **kwargs)
        p.capture_begin(key, stream)
        old = getattr(self, "_gpupool_release", None)
        if old is not None:
            old()  # recaptured without reset: drop the previous capture's hold
        self._gpupool_capture = (d, stream, key)
        # The graph holds its pool until reset() or until it is collected.
        self._gpupool_release = weakref.finalize(self, _release, d, key)
        self._gpupool_key = (d, p, key)
        self._gpupool_users = weakref.WeakSet()
        with _users_lock:
            _open_captures.append(self._gpupool_users)

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> None:
        cap = getattr(self, "_gpupool_capture", None)
        try:
            orig_end(self, *args, **kwargs)
            if cap is not None:
                # Later graphs name this one's pool by the id PyTorch gave it.
                _alias_graph_key(self.pool(), cap[2])
        finally:
            if cap is not None:
                self._gpupool_capture = None
                with _users_lock:
                    _open_captures[:] = [u for u in _open_captures if u is not self._gpupool_users]
                _C.device_pool(cap[0], True).capture_end(cap[1])

    def reset(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_reset(self, *args, **kwargs)
        self._gpupool_key = None
        self._gpupool_users = weakref.WeakSet()
        fin = getattr(self, "_gpupool_release", None)
        if fin is not None:
            self._gpupool_release = None
            fin()

    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The graph's own memory back where an offload of its tags took it,
        # and each user resident (restored if it was offloaded) and held
        # while the replay is queued; an offload after it waits for its
        # kernels, as for any use of the memory.  A restore that raised
        # releases what was held and the graph does not run.
        where = getattr(self, "_gpupool_key", None)
        if where is not None:
            away = where[1].capture_away(where[2])
            if away:
                restore(away, device=where[0])
        users = list(getattr(self, "_gpupool_users", ()))
        held: List[Any] = users[0]._hold_resident_all(users) if users else []
        try:
            return orig_replay(self, *args, **kwargs)
        finally:
            for user in held:
                user._release()

    return {"capture_begin": capture_begin, "capture_end": capture_end, "reset": reset, "replay": replay}


def install_safety() -> Optional[str]:
    """Hook Tensor.record_stream and CUDA graph capture, and route the
    pluggable allocator's peer access and copies between GPUs to gpupool
    (PyTorch's own do not reach the memory gpupool maps: nn.DataParallel and
    tensor.to() of another GPU of the process would fail).  Idempotent.
    Returns why peer access could not be routed (None when it was)."""
    torch = _torch()
    with _lock:
        why = _C.set_peer_access(True)
        if (torch.Tensor, "record_stream") in _saved:
            return why
        _set(torch.Tensor, "record_stream", _record_stream_hook(torch.Tensor.record_stream))
        cls = torch.cuda.graphs.CUDAGraph
        for name, fn in _graph_hooks(cls).items():
            _set(cls, name, fn)
        return why
