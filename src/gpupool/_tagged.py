"""Re-tagging memory that exists already: ``gpupool.tagged(model, "weights")``
moves the blocks behind a module's parameters and buffers, a tensor or
tensors, to a tag (and priority), in the pool that holds them."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, TypeVar

from ._context import Priority, priority_value, tag_lifetime
from ._pool import PoolView
from ._registry import device_pool

__all__ = ["tagged"]

T = TypeVar("T")


def plain_tensors(tensors: Iterable[Any]) -> List[Any]:
    """The tensors that hold the memory of `tensors`: each plain tensor as
    it is, and for a tensor subclass that wraps others (FSDP2's and tensor
    parallelism's DTensor, torchao's quantised and float8 tensors: torch's
    ``__tensor_flatten__`` protocol) the tensors it wraps, at any depth.  A
    wrapper holds no storage of its own: its address cannot be read."""
    out: List[Any] = []
    todo = list(tensors)[::-1]
    while todo:
        t = todo.pop()
        flatten = getattr(type(t), "__tensor_flatten__", None)
        if flatten is None:
            out.append(t)
            continue
        names, _ = flatten(t)
        todo.extend(getattr(t, n) for n in reversed(names))
    return out


def _tensors(obj: Any) -> List[Any]:
    """The plain tensors of a module (parameters and buffers), a tensor, or
    an iterable of tensors (None entries, such as missing .grad, skipped)."""
    if hasattr(obj, "parameters") and hasattr(obj, "buffers"):
        return plain_tensors([*obj.parameters(), *obj.buffers()])
    if hasattr(obj, "data_ptr"):
        return plain_tensors([obj])
    try:
        items = list(obj)
    except TypeError:
        raise TypeError(f"gpupool.tagged() takes a torch.nn.Module, a tensor or an iterable of tensors, "
                        f"got {type(obj).__name__}") from None
    for t in items:
        if t is not None and not hasattr(t, "data_ptr"):
            raise TypeError(f"gpupool.tagged(): every item must be a tensor, got {type(t).__name__}")
    return plain_tensors(t for t in items if t is not None)


def _address(t: Any) -> int:
    """The start of the memory behind tensor t (its storage, not a view's offset)."""
    storage = getattr(t, "untyped_storage", None)
    return int(storage().data_ptr()) if storage is not None else int(t.data_ptr())


def tagged(obj: T, tag: str, priority: Optional[Priority] = None, *, lifetime: Optional[str] = None,
           pool: Optional[PoolView] = None) -> T:
    """Re-home tensors that exist already under `tag` (and `priority`; None
    keeps each block's own)::

        model = gpupool.tagged(model, "weights", priority="high")

    `obj` is a torch.nn.Module (its parameters and buffers), a tensor or an
    iterable of tensors; returns `obj`.  The blocks behind them move to the
    tag in the statistics and reports, at once and exactly; where they lie
    does not change (`lifetime`, if given, sets the tag's lifetime for later
    allocations).  Tensors on a CUDA device are looked up in that device's
    pool (gpupool must be enabled); others are left alone, unless `pool`
    names the pool that holds them all (a HostPool, in tests).  ValueError
    for a tensor whose memory gpupool does not hold; MemoryError past the
    tag's limit (nothing is changed on that device then)."""
    if lifetime is not None:
        tag_lifetime(tag, lifetime)
    prio = None if priority is None else priority_value(priority)
    groups: Dict[Optional[int], List[int]] = {}
    for t in _tensors(obj):
        if pool is None and getattr(t.device, "type", None) != "cuda":
            continue
        addr = _address(t)
        if addr:  # an empty tensor holds no memory
            groups.setdefault(None if pool is not None else t.device.index, []).append(addr)
    for device, addrs in groups.items():
        (pool if pool is not None else device_pool(device)).retag(addrs, tag, prio)
    return obj

