"""Offload: the memory of a tag moves to host RAM and comes back at the same
addresses, so every tensor that points there stays valid.

    gpupool.offload("ref_model")          # device memory given back
    ...
    gpupool.restore("ref_model")          # same tensors, same data

No kernel may touch offloaded memory (the GPU faults and the CUDA context is
lost), so the usual way in is ``gpupool.offloadable`` (_offloadable.py),
whose hooks restore a module before its forward and an optimizer before its
step, and let the pool offload idle offloadable memory of lower priority
when a more important allocation would otherwise run out of memory."""
from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Optional, Sequence, Union, overload

from . import _C, _nvcomp
from ._context import tag_id
from ._registry import device_pool

if TYPE_CHECKING:  # pragma: no cover
    from ._pool import PoolView

__all__ = ["offload", "restore", "prefetch", "offloaded", "CODECS"]

Tags = Union[str, Sequence[str]]

# Codecs offload accepts (the C side's list): "auto" is nvCOMP's ANS on a GPU
# (raw without nvCOMP) and zstd on byte planes on the host backend.
CODECS = tuple(_C.codec_names())


def _tag_ids(tags: Tags) -> List[int]:
    names = [tags] if isinstance(tags, str) else list(tags)
    if not names:
        raise ValueError("no tag given: pass a tag name or a list of them")
    return [tag_id(t) for t in names]


_nvcomp_looked = False


def _pool(device: Optional[int], pool: Optional["PoolView"]) -> "PoolView":
    global _nvcomp_looked
    if not _nvcomp_looked:  # where pip put nvCOMP, before a codec first loads it
        _nvcomp.register()
        _nvcomp_looked = True
    if pool is not None:
        return pool
    return device_pool(device)


def _codec(codec: Optional[str]) -> Optional[str]:
    if codec is not None and codec not in CODECS:
        raise ValueError(f"offload codec {codec!r} is not one of {', '.join(CODECS)} (or None: GPUPOOL_CODEC)")
    return codec


def _elem_size(dtype: Any) -> int:
    """A dtype hint as the codecs take it: bytes per element (0: unknown)."""
    if dtype is None:
        return 0
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype not in (1, 2, 4, 8):
            raise ValueError(f"dtype as an element size must be 1, 2, 4 or 8 bytes, got {dtype}")
        return dtype
    size = getattr(dtype, "itemsize", None)
    if not isinstance(size, int):
        raise TypeError(f"dtype must be a torch.dtype or an element size in bytes, got {dtype!r}")
    return size


@overload
def offload(tag: Tags, *, codec: Optional[str] = None, keep: bool = True, dtype: Any = None,
            wait: Literal[True] = True, max_bytes: Optional[int] = None, refill_cache: bool = False,
            device: Optional[int] = None, pool: Optional["PoolView"] = None) -> Dict[str, Any]: ...


@overload
def offload(tag: Tags, *, codec: Optional[str] = None, keep: bool = True, dtype: Any = None,
            wait: Literal[False], max_bytes: Optional[int] = None, refill_cache: bool = False,
            device: Optional[int] = None, pool: Optional["PoolView"] = None) -> None: ...


def offload(tag: Tags, *, codec: Optional[str] = None, keep: bool = True, dtype: Any = None, wait: bool = True,
            max_bytes: Optional[int] = None, refill_cache: bool = False, device: Optional[int] = None,
            pool: Optional["PoolView"] = None) -> Optional[Dict[str, Any]]:
    """Move the memory of `tag` (a name or a list of names) to host RAM.

    Waits for the streams that used the memory, copies its live blocks to
    pinned host memory and gives their physical memory back to the device.
    `codec` (None: GPUPOOL_CODEC, "auto" by default) compresses on the way:
    on a GPU with nvCOMP (``pip install "gpupool[nvcomp]"``) "auto" is ANS,
    which `dtype` (a torch.dtype or an element size: bf16 weights, fp32
    optimizer state) tunes; data that does not compress goes raw.
    keep=False drops the contents instead (a cache to recompute: restored
    memory is then uninitialised).  Returns ``{"bytes", "copied",
    "host_bytes", "released", "kept", "seconds", "codec"}``: bytes of the
    blocks offloaded, bytes copied (0 when the host copy that the tag's
    last restore kept still holds the same bytes, as the device's checksums
    say: frozen weights offloaded again; a compressed copy only where
    `codec` is "auto" or its own), host bytes holding them, device
    bytes released, bytes of the tag's blocks that had to stay (they share
    a mapping unit with other live memory), the codec used.  MemoryError when
    the host limit (GPUPOOL_HOST_LIMIT) cannot hold them; the memory is then
    as it was.

    wait=False queues the offload on the pool's background thread and
    returns None at once: the caller goes on queueing work (that does not
    touch the memory) while the copies run.  A later :func:`restore` or
    :func:`prefetch` waits for it; if it failed, the memory stayed on the
    device and the next :func:`restore` raises what it failed with.

    max_bytes offloads part of the memory: the tag's first live blocks, in
    address order, until they hold max_bytes (what a cap needs); the next
    offload takes the next ones.  None: all of it.

    refill_cache=True hands the device memory given back, as it goes and
    within the pool's limit, first to the cache the pool's last restore gave
    back to keep reserved memory under its peak, mapped again at the
    addresses it had: the phase that follows finds the cache its last run
    left instead of mapping memory on the thread that allocates (an
    optimizer's state offloaded behind its step, before the forward pass:
    what ``offloadable(..., offload_after_step=True)`` does).  Not for an
    offload meant to free the device for someone else."""
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
        raise ValueError(f"max_bytes must be a positive number of bytes or None, got {max_bytes!r}")
    info = _pool(device, pool)._pool.offload(_tag_ids(tag), bool(keep), _codec(codec), _elem_size(dtype),
                                             bool(wait), max_bytes or 0, bool(refill_cache))
    return None if info is None else dict(info)


def restore(tag: Tags, *, accept_loss: bool = False, device: Optional[int] = None,
            pool: Optional["PoolView"] = None) -> Dict[str, Any]:
    """Bring the memory of `tag` (a name or a list of any number of names)
    back at the same addresses (waits).  An offload of several tags at
    once comes back whole; when it returns, no memory of `tag` is
    offloaded.  MemoryError when the device has no room even after idle
    offloadable memory of `tag`'s priority or lower made way, the lowest
    priority first, then what is needed farthest ahead as the gaps between
    its uses predict (the least recently used where they say nothing yet).
    Tags asked for together that cannot fit together fail so, instead of
    displacing each other.  RuntimeError when the host copy is corrupt.  In
    both cases the memory of the offload that failed stays offloaded and
    its bytes safe on the host (memory of other offloads that `tag` names
    and that came back before it stays restored).

    An offload that failed and that the device refused to undo leaves some
    bytes lost (its error says how many): restoring that memory raises
    RuntimeError naming the tag and the bytes, and it stays offloaded,
    unless `accept_loss` is true: then it comes back with those bytes
    uninitialised, counted in ``"lost"`` (and a RuntimeWarning says so).
    Returns what :func:`offload` returns, and ``"lost"``."""
    info = dict(_pool(device, pool)._pool.restore(_tag_ids(tag), bool(accept_loss)))
    if info.get("lost"):
        warnings.warn(f"gpupool: {info['lost']} bytes of tag {tag!r} came back uninitialised: an offload of "
                      "them failed and the device refused to undo it", RuntimeWarning, stacklevel=2)
    return info


def prefetch(tag: Tags, *, device: Optional[int] = None, pool: Optional["PoolView"] = None) -> None:
    """Start restoring `tag` on a worker thread and return at once; a later
    :func:`restore` (or a hook of :func:`offloadable`) waits for it, and
    where it failed (the memory stays offloaded) tries again and raises its
    own error if that fails too.  Memory whose offload lost bytes is left
    to :func:`restore`, which may accept the loss."""
    _pool(device, pool)._pool.prefetch(_tag_ids(tag))


@contextlib.contextmanager
def offloaded(tag: Tags, *, codec: Optional[str] = None, keep: bool = True, dtype: Any = None,
              device: Optional[int] = None, pool: Optional["PoolView"] = None) -> Iterator[Dict[str, Any]]:
    """Offload `tag` for the duration of a ``with`` block (restored on exit,
    also on an exception); yields what :func:`offload` returned."""
    info = offload(tag, codec=codec, keep=keep, dtype=dtype, device=device, pool=pool)
    try:
        yield info
    finally:
        restore(tag, device=device, pool=pool)
