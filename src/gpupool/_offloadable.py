"""Making a ``torch.nn.Module`` or a ``torch.optim.Optimizer`` offloadable:
its tensors move to a tag, and hooks restore them before each use, hold
them while they are in use, and let the pool offload them when they are idle
(:func:`offloadable`, :class:`OffloadHandle`)."""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import importlib.abc
import itertools
import sys
import threading
import types
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from . import _C
from ._context import Priority, priority_value, tag_id, tag_lifetime
from ._offload import _pool, offload, prefetch, restore
from ._tagged import plain_tensors, tagged
from ._torch_patch import capturing, note_use

if TYPE_CHECKING:  # pragma: no cover
    from ._pool import PoolView

__all__ = ["offloadable", "OffloadHandle"]


class OffloadHandle:
    """What :func:`offloadable` returns: the tag, and the hooks it installed."""

    # Offloadable modules in the order they were made so: a module's forward
    # prefetches the next one.
    _chain: "List[weakref.ReferenceType[OffloadHandle]]" = []
    _chain_lock = threading.Lock()

    def __init__(self, obj: Any, tag: str, priority: int, pool: "PoolView", tag_pool: Optional["PoolView"]) -> None:
        self.tag = tag
        self.priority = priority
        self._pool = pool
        self._tag_pool = tag_pool  # tagged()'s pool: None for CUDA tensors
        self._obj = weakref.ref(obj)
        self.elem_size = 0  # the dtype hint: the element size of most of its bytes
        self._tid = tag_id(tag)
        self._hooks: List[Any] = []
        # The addresses of the object's tensors as the tag last took them
        # (None: to be taken at the next use), and an optimizer's state bytes.
        self._key: Optional[List[int]] = None
        self._state_bytes = 0
        # An optimizer's loaded state that something else held when the tag
        # took it in place: its addresses, to copy into the tag at the next step.
        self._regather: Set[int] = set()
        # Under a pool limit, the bytes of the state that the offload behind
        # the next step takes (None: all of it): what the limit leaves no
        # room for at the step's peak, measured at the last one (_measure).
        self._part: Optional[int] = None
        self._measured = False
        # What the pool took of the state beyond the measure, under
        # pressure, at most so far; its count of such offloads at the last
        # measure; and the part the offload behind the last step asked for
        # (None: all of it, nothing the pool could add).
        self._margin = 0
        self._pressed = 0
        self._sent: Optional[int] = None
        # Busy as the hooks last said, and readers they do not see the end
        # of (a module's state_dict, while it lives): busy while any is held.
        self._busy = False
        self._holds = 0
        self._use_lock = threading.RLock()  # (a finalizer may release inside _use)

    # -- what a user may call ------------------------------------------------
    def offload(self, **kw: Any) -> Optional[Dict[str, Any]]:
        """Offload the object's memory now (see :func:`offload`; the dtype
        hint is the object's own unless given).  A module's tensors that
        replaced its own since it was last looked at join the tag first (an
        optimizer's state is looked at after each step)."""
        obj = self._obj()
        if obj is not None and not _is_optimizer(obj):
            self._retake(obj)
        kw.setdefault("dtype", self.elem_size or None)
        return offload(self.tag, pool=self._pool, **kw)

    def restore(self) -> Dict[str, Any]:
        """Bring it back now (see :func:`restore`)."""
        return restore(self.tag, pool=self._pool)

    def prefetch(self) -> None:
        """Start bringing it back (see :func:`prefetch`)."""
        prefetch(self.tag, pool=self._pool)

    @contextlib.contextmanager
    def in_use(self) -> Iterator["OffloadHandle"]:
        """Resident, and never offloaded under pressure, inside the block:
        for code that reads or writes the object's tensors where no hook
        sees it (``m.weight.norm()``, an EMA of a module's weights written
        by hand, a copy of an optimizer's state on the device).  Outside
        its hooks idle offloadable memory may be offloaded by any
        allocation that runs short, and a kernel that then touches it
        loses the CUDA context.
        Kernels queued inside the block may run after it ends: an offload
        waits for them.  An optimizer's step (any optimizer's) holds the
        offloadable modules whose parameters it updates in the same way."""
        self._hold_resident()
        try:
            yield self
        finally:
            self._release()

    def set_priority(self, priority: Priority) -> None:
        """Move the object's memory to `priority` (re-tagged where it lies,
        offloaded or not): what the pool weighs when another allocation
        needs room, and what a restore of it may displace."""
        self.priority = priority_value(priority)
        obj = self._obj()
        if obj is not None:
            self._key = None
            self._retake(obj)
        self._pool._pool.offload_register(self._tid, self.priority, self.elem_size)

    def remove(self) -> None:
        """Remove the hooks and stop offloading it under pressure (its memory
        is restored first, so that nothing is left on the host)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._pool._pool.offload_register(self._tid, -1)
        self.restore()
        with OffloadHandle._chain_lock:
            OffloadHandle._chain[:] = [r for r in OffloadHandle._chain if r() not in (None, self)]

    # -- what the hooks do ---------------------------------------------------
    def _use(self, busy: bool) -> None:
        if busy:
            note_use(self)
        with self._use_lock:
            self._busy = busy
            self._pool._pool.offload_use(self._tid, busy or self._holds > 0)

    def _hold(self) -> None:
        """Busy until as many :meth:`_release` calls, whatever the hooks say."""
        note_use(self)
        with self._use_lock:
            self._holds += 1
            self._pool._pool.offload_use(self._tid, True)

    def _release(self) -> None:
        with self._use_lock:
            self._holds -= 1
            if not self._holds:
                self._pool._pool.offload_use(self._tid, self._busy)

    def _hold_resident(self) -> None:
        """Held (see :meth:`_hold`), then restored; not held if the restore fails."""
        self._hold()
        try:
            self._resident()
        except BaseException:
            self._release()
            raise

    @staticmethod
    def _hold_resident_all(handles: List["OffloadHandle"]) -> List["OffloadHandle"]:
        """Each handle held (see :meth:`OffloadHandle._hold`), then all of them
        restored with one restore per pool: a replay over a graph of 24
        per-layer modules, or an optimizer's step over their parameters, makes
        one call and one wait, not one each.  Held together, none of them can
        displace another to make room.  Returns the handles (each to release);
        none is held when a restore raises."""
        held: List[OffloadHandle] = []
        try:
            for h in handles:
                h._hold()
                held.append(h)
            # (By the pool itself, not its view: each handle has a view of
            # its own, and views of one pool compare equal.)
            pools: Dict[Any, Tuple["PoolView", List[str]]] = {}
            for h in held:
                pools.setdefault(h._pool._pool, (h._pool, []))[1].append(h.tag)
            for pool, tags in pools.values():
                _not_capturing(pool, tags)
                restore(tags, pool=pool)
        except BaseException:
            for h in held:
                h._release()
            raise
        return held

    def _resident(self) -> None:
        """Restored (waits for a prefetch), unless a capture forbids it
        (:func:`_not_capturing`)."""
        _not_capturing(self._pool, [self.tag])
        self.restore()

    def _hold_while(self, obj: Any) -> Optional[weakref.finalize]:
        """Held until `obj` is collected (released now where it cannot be
        weakly referenced); calling what it returns releases it sooner,
        once whatever comes first."""
        try:
            done = weakref.finalize(obj, self._release)
        except TypeError:
            self._release()
            return None
        done.atexit = False
        return done

    def _enter(self) -> None:
        """Before the object is used: busy (never offloaded under pressure),
        and resident (waits for a prefetch, restores if offloaded)."""
        self._use(True)
        self._resident()

    def _prefetch_next(self) -> None:
        if capturing():
            return  # (a capture's own hook restores; a prefetch beside it has nothing to win)
        with OffloadHandle._chain_lock:
            chain = [r() for r in OffloadHandle._chain]
        if self in chain:
            i = chain.index(self)
            nxt = chain[i + 1] if i + 1 < len(chain) else None
            if nxt is not None:
                nxt.prefetch()

    def _retake(self, obj: Any) -> None:
        """The object's tensors join the tag: a module's parameters and
        buffers, an optimizer's state (made by its first step); and any
        that replace them later, told apart by their addresses, not their
        number (``load_state_dict`` going back to a checkpoint makes as
        many new ones, outside the tag, and so does a module's
        ``load_state_dict(assign=True)``).  An optimizer's state is looked
        at after each step; a module's tensors (a walk of its submodules,
        too slow for every forward) when it is made offloadable, loaded,
        offloaded through the handle, or moved to another priority."""
        optimizer = _is_optimizer(obj)
        if optimizer:
            tensors = _state_tensors(obj)
        else:
            tensors = plain_tensors([*obj.parameters(), *obj.buffers()])
        key = [t.data_ptr() for t in tensors]
        fresh = key != self._key
        if not fresh and not self._regather:
            return
        if optimizer and self._tag_pool is None:
            del tensors  # (the gather copies only what the state alone holds)
            moved, held = self._gather(obj, self._regather)
            # (a tensor the loader's dict still held may go at the next step)
            self._regather = held if fresh else set()
            if not moved and not fresh:
                return
            tensors = _state_tensors(obj)
            key = [t.data_ptr() for t in tensors]
        tagged(tensors, self.tag, self.priority, pool=self._tag_pool)
        if not optimizer and self._tag_pool is None and self._apart(obj):
            key = [t.data_ptr() for t in tensors]
        self._key = key
        if optimizer:
            self._state_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self._hint(tensors)

    def _apart(self, module: Any) -> bool:
        """Copies the module's tensors that share a mapping unit with other
        memory into units of their own (one new mapping, the tensors side
        by side), so that an offload of the module alone releases all of
        it.  A model moved to the GPU at once (``model.cuda()``,
        ``from_pretrained(device_map=...)``) lays its layers side by side:
        a decoder layer of Qwen2 0.5B (28 MiB) shares every unit with its
        neighbours, and made offloadable on its own, its offload moved
        nothing.  Each tensor is copied and swapped in under its own object
        (``t.data = copy``: the parameters the optimizer and tied modules
        hold stay the same objects).  Only a plain tensor or parameter that
        is its storage's only user, and all of that storage, is copied: a
        view or a wrapper (FSDP2's DTensor) elsewhere goes on seeing the
        old memory, so such a tensor stays (and is reported ``kept`` at
        offload).  Nothing is copied while a CUDA graph lives (it reads
        the addresses it was captured with) or a capture runs, nor when
        the device has no room for the copies.  Returns whether any moved.

        A tensor that moves leaves free cache where it was, and the unit it
        left may hold tensors of the module that shared nothing before: the
        next allocations of others fill the hole, and those tensors stay at
        the next offload (a Qwen2 built on the device in float32 and
        converted to bfloat16 kept 56 MiB of 376 so).  So passes follow
        until none is left sharing, each over what the last one left; a
        tensor moves once."""
        torch = sys.modules.get("torch")
        use_count = getattr(getattr(torch, "_C", None), "_storage_Use_Count", None)
        if use_count is None or torch.cuda.is_current_stream_capturing():
            return False
        placed: Set[int] = set()  # (the copies made by the passes before)
        while self._apart_pass(module, torch, use_count, placed):
            pass
        return bool(placed)

    def _apart_pass(self, module: Any, torch: Any, use_count: Any, placed: Set[int]) -> bool:
        """One pass of `_apart` over the tensors sharing a unit now, but the
        copies in `placed`, to which this pass's are added; whether any
        moved."""
        mixed, graphs = self._pool._pool.tag_mixed(self._tid)
        if not mixed or graphs:
            return False
        mixed = set(mixed) - placed
        moving: List[Any] = []
        for t in [*module.parameters(), *module.buffers()]:
            if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.data_ptr() not in mixed:
                continue
            u = t.untyped_storage()
            # (the use count of a storage the tensor alone holds: its own and
            # u's; two tensors over one storage count more)
            if t.is_contiguous() and u.nbytes() == t.numel() * t.element_size() and use_count(u._cdata) == 2:
                moving.append(t)
        if not moving:
            return False
        pool = self._pool._pool
        stream = torch.cuda.current_stream(moving[0].device)
        try:
            ptrs = pool.apart_begin([t.numel() * t.element_size() for t in moving], self._tid, self.priority,
                                    stream.cuda_stream)
        except MemoryError:
            return False  # (no room for the copies: they stay where they lie)
        moved = False
        try:
            with torch.no_grad():
                for t, ptr in zip(moving, ptrs):
                    new = torch.empty(t.shape, dtype=t.dtype, device=t.device)
                    if new.data_ptr() != ptr:
                        break  # (not the block handed out: the rest stay)
                    new.copy_(t)
                    if self._pool.lookup(t.data_ptr()).stream != stream.cuda_stream:
                        t.record_stream(stream)
                    t.data = new
                    placed.add(ptr)
                    moved = True
        finally:
            pool.apart_end()
        return moved

    def _gather(self, opt: Any, again: Set[int]) -> Tuple[bool, Set[int]]:
        """Copies into the tag the optimizer's state tensors made outside it
        (a state loaded by ``load_state_dict``, before the handle was made
        or since).  Made under another tag, such tensors lie among its
        blocks, sharing mapping units with memory that stays, and an
        offload keeps those pieces on the device: after transformers'
        Trainer resumed a small model from a checkpoint, 38% of the state
        left, against all of it before the checkpoint.  Only a tensor that
        the state alone holds, that is its whole storage and shares it with
        no other entry nor any parameter, is copied (code that keeps the
        tensor elsewhere must go on seeing the state's updates); the old
        one is freed at once.  A tensor that wraps others (FSDP2's DTensor)
        is copied whole where each tensor it wraps could be, and it alone
        holds them.  A copy the device has no room for leaves the tensor
        where it lies.  `again`: addresses the tag took in place before, to
        copy now.  Returns whether any moved, and the addresses that stayed
        because something else held them."""
        torch = sys.modules.get("torch")
        if torch is None or torch.cuda.is_current_stream_capturing():
            return False, set()
        # (entries, not tensors: each old tensor goes as soon as it is copied)
        entries = [(st, k) for st in opt.state.values() for k, v in st.items()
                   if (type(v) is torch.Tensor or hasattr(type(v), "__tensor_flatten__"))
                   and v.is_cuda and v.numel()]
        storages = collections.Counter(q.untyped_storage().data_ptr()
                                       for q in plain_tensors(st[k] for st, k in entries))
        for g in opt.param_groups:
            storages.update(q.untyped_storage().data_ptr() for q in plain_tensors(g["params"]))
        stream = torch.cuda.current_stream()
        # The counts of a value held by the state alone, as this interpreter
        # counts a dict's value, a local and a wrapper's tensors.
        probe = {0: _Wraps()}
        v = probe[0]
        alone, _ = _refcounts(v)
        moved = False
        held: Set[int] = set()
        for st, k in entries:
            v = st[k]
            counts, parts = _refcounts(v)
            blocks = [self._movable(q, storages, again) for q in parts]
            if not all(blocks):
                continue
            if counts[0] > alone[0] or any(n > alone[1] for n in counts[1:]):
                held.update(q.data_ptr() for q in parts)
                continue
            try:
                with self._allocating():
                    st[k] = v.clone()
            except torch.OutOfMemoryError:
                continue
            for q, block in zip(parts, blocks):
                if block.stream != stream.cuda_stream:
                    q.record_stream(stream)
            moved = True
        return moved, held

    def _movable(self, q: Any, storages: "collections.Counter[int]", again: Set[int]) -> Any:
        """The pool's block behind plain tensor q where the gather may copy
        q (its whole storage, shared with nothing it counted, this pool's
        memory in use outside the tag or taken in place before), else None."""
        u = q.untyped_storage()
        if (storages[u.data_ptr()] > 1 or u.data_ptr() != q.data_ptr()
                or u.nbytes() != q.numel() * q.element_size()):
            return None
        try:
            block = self._pool.lookup(q.data_ptr())
        except ValueError:
            return None  # (not this pool's memory)
        if (block.tag == self.tag and q.data_ptr() not in again) or block.state != "used":
            return None
        return block

    @contextlib.contextmanager
    def _allocating(self) -> Iterator[None]:
        """This thread allocates under the tag (in its region), at the
        priority it had."""
        ctx = _C.set_context(self._tid, _C.get_context()[1])
        try:
            yield
        finally:
            _C.set_context(*ctx)

    def _offload_behind_step(self) -> None:
        """After the step: the state leaves on the background thread, all of
        it, or under a pool limit the part the limit needs; the window in
        which the next peak is measured starts."""
        self._pool._pool.window_peak(True)
        self._measured = False
        self._sent = self._part
        if self._part == 0:
            return  # (the limit has room for all of it: nothing moves)
        with _mark("gpupool.offload"):
            self.offload(wait=False, max_bytes=self._part, refill_cache=True)

    def _measure(self) -> None:
        """Once the forward pass and the start of the backward pass are
        behind (the prefetch, else the step): the most the rest of the step
        held (`allocated` at its highest since the last step, less the part
        of the state still on the device then) sets the part of the state
        the next offload takes under a pool limit, leaving 1/16 of the
        limit for the cache.  Where the pool had to take more of the state
        meanwhile (a request the limit had no room for: cache in pieces too
        small to give back, which `allocated` does not show), that offload
        ran on the thread that allocated (tens of ms on the fp32 recipe,
        every other step); what it took beyond the measure becomes a margin
        kept for the following steps.  Without a limit: all of it."""
        if self._measured:
            return
        self._measured = True
        peak = self._pool._pool.window_peak(True)
        s = self._pool.stats()
        limit = s["limit"]
        if not limit or not self._state_bytes:
            self._part = None
            return
        away = s["tags"].get(self.tag, {}).get("offloaded", 0)
        others = peak - max(0, self._state_bytes - away)
        need = others + self._state_bytes + limit // 16 - limit
        pressed = (s.get("offload") or {}).get("n_pressure", 0)
        if self._sent is not None and pressed > self._pressed and away > need:
            self._margin = max(self._margin, away - need)
        self._pressed = pressed
        need += self._margin
        self._part = None if need >= self._state_bytes else max(0, need)

    def _hint(self, tensors: List[Any]) -> None:
        """The dtype hint: the element size holding most of the bytes."""
        by: Dict[int, int] = {}
        for t in tensors:
            size = t.element_size()
            by[size] = by.get(size, 0) + t.numel() * size
        if by:
            self.elem_size = max(by, key=by.__getitem__)
        self._pool._pool.offload_register(self._tid, self.priority, self.elem_size)

    def __repr__(self) -> str:
        return f"OffloadHandle(tag={self.tag!r}, priority={self.priority})"


def offloadable(obj: Any, tag: str, priority: Priority = "low", *, offload_after_step: bool = False,
                prefetch_next: bool = True, prefetch_at: Optional[float] = 0.0, device: Optional[int] = None,
                pool: Optional["PoolView"] = None) -> OffloadHandle:
    """Make a ``torch.nn.Module`` or a ``torch.optim.Optimizer`` offloadable.

    Its tensors move to `tag` with `priority` (re-tagged where they lie; a
    module's tensors that share a mapping unit with other memory are
    copied into units of their own and swapped in under their own objects
    (``t.data = copy``), so that the module leaves whole; a tensor with a
    view elsewhere, a tensor subclass and anything while a CUDA graph lives
    stay), and hooks make offload transparent:

    * a module: before its forward, its memory is restored (a prefetch under
      way is waited for) and marked busy, and the next offloadable module's
      is prefetched (``prefetch_next``); it stays busy until its backward has
      run when the forward recorded a graph, else until the forward ends.
      ``state_dict()`` restores first, and the module is not offloaded
      under pressure while the dict it returned lives (its tensors are the
      module's own); ``load_state_dict(assign=True)``
      puts the loaded tensors in the tag.  A conversion (``.to()``,
      ``.half()``, ``.cuda()``, ``.cpu()``), ``.apply(fn)`` and
      ``copy.deepcopy`` restore it and hold it while they run; the tensors
      a conversion or fn puts in place of its own join the tag (what fn
      keeps apart stays in the caller's tag); a ``.to()``, ``.cuda()`` or
      ``.cpu()`` to where every tensor already is returns the module as it
      is, offloaded or not.  A deep copy, a pickle
      (``torch.save(model)``) and ``copy.copy`` take a plain module, without
      the handle's hooks, with the module restored and held while what
      they took lives; tensors swapped in by other means
      (``m.weight.data = t``) join at the handle's ``.offload()``.  Any optimizer's
      step restores the offloadable modules whose parameters it updates
      and holds them (busy) until it ends.  A module outside it that holds
      one of its tensors (a tied embedding when the module is ``lm_head``;
      a view of one counts) or one of its submodules as a child of its own
      (an encoder-decoder's shared embedding) is held the same way through
      its forward and its part of the backward pass: such modules are
      looked for when this is called (one walk of the interpreter's
      objects, about 65 ms with a Qwen2 0.5B model loaded), so a tie made
      later is not seen.  ``nn.DataParallel`` over several GPUs (and
      ``torch.nn.parallel.data_parallel``), which copies its module's
      tensors to the other GPUs before any hook of the module runs, holds
      the offloadable modules whose tensors its module holds through its
      forward and its part of the backward pass, and
      ``DistributedDataParallel``'s sync of its module's buffers (before
      each forward, with ``broadcast_buffers=True``) holds those whose
      buffers it syncs, as its making (which broadcasts the module's
      tensors) holds those of its module; an EMA's
      (``torch.optim.swa_utils.AveragedModel``) ``update_parameters``
      holds the model it averages; PEFT's merge and unload hold each of
      its layers while it merges it, and transformers'
      ``resize_token_embeddings`` the embeddings it copies (wrapped at
      the first ``offloadable()`` call, or as the library is imported
      after it).
      A CUDA graph captured through
      ``torch.cuda.graph`` over the module (its hooks ran inside the
      capture) restores it before each replay and holds it while the replay
      is queued; a capture while it is offloaded raises RuntimeError
      (restore it first).  Code torch.compile compiled
      before is dropped (a warning says so): it would not run the hooks.
    * an optimizer: before ``step()``, its state is restored and marked
      busy; after it, the state (made by the first step) joins the tag, is
      marked idle and, with ``offload_after_step=True``, offloaded at once,
      on the pool's background thread (the next forward is queued while
      the copies run; the next step's restore waits for them).  Then the
      state is prefetched during the backward pass, once the gradients of
      ``prefetch_at`` of the parameters' bytes have been accumulated: by
      default at the first gradient, when the step's peak (the loss and
      its gradient) is behind, so that the copies have the whole backward
      pass to run beside (at half of the bytes, a tied embedding's
      gradient, which comes last, left them too little: 0.69x the tokens/s
      of the fp32 fine-tune without offload, against 0.79x); None: the
      step's own restore brings it back.  Neither
      waits on the thread that queues the work: the offload waits for the
      step's kernels (an event, not a device sync), and a prefetch asked
      while it still copies is queued behind it.  ``state_dict()`` restores
      the state and holds it while the dict it returned lives, up to the
      next step (the dict is an OrderedDict); ``torch.save(optimizer)`` and
      ``copy.deepcopy`` restore it and hold it while what they took lives.  Under a pool limit
      (``set_limit``) only the part of the state the limit needs leaves:
      what the step's other memory, at its highest before the prefetch,
      leaves no room for (with 1/16 of the limit for the cache), measured
      anew at each step, plus the most the pool once had to offload of it
      beyond that under pressure; the rest stays on the device.  With
      gradient accumulation it comes back in the first backward pass and
      stays until the step.  A state loaded later (``load_state_dict``)
      joins the tag as it is loaded, its tensors copied into the tag's
      memory where they lie among other memory.  An optimizer that wraps
      another without torch's hooks of its own (accelerate's, which
      transformers' Trainer hands its callbacks) is taken through the
      one it wraps.  The end of the step is a yield point (gpupool.yield_point) for a
      process sharing the GPU (GPUPOOL_TENANT).

    Idle offloadable memory of a priority below an allocation's may be
    offloaded by the pool when that allocation would otherwise run out of
    memory (lowest priority first, then what the gaps between its uses say
    is needed farthest ahead: of layers used in turn, the one just used;
    else the least recently used), and so
    may idle offloadable memory of the same priority when a restore needs
    room (modules offloadable one by one, streamed under a limit); the
    hooks bring it back when it is next used; code that reads the tensors where
    no hook sees it holds them with the handle's ``.in_use()`` (also a
    module that came to share its memory after this call: or make the
    module holding both offloadable).  Returns a
    handle with ``.offload()``, ``.restore()``, ``.prefetch()``,
    ``.in_use()`` and ``.remove()``."""
    is_optimizer = _is_optimizer(obj)
    if not is_optimizer and not hasattr(obj, "register_forward_pre_hook"):
        raise TypeError(f"gpupool.offloadable() takes a torch.nn.Module or a torch.optim.Optimizer, "
                        f"got {type(obj).__name__}")
    if prefetch_at is not None and not 0.0 <= prefetch_at <= 1.0:
        raise ValueError(f"prefetch_at must be a fraction of the parameters' bytes in [0, 1] or None, "
                         f"got {prefetch_at!r}")
    if is_optimizer:
        obj = _wrapped_optimizer(obj)
    prio = priority_value(priority)
    tag_lifetime(tag, "long")  # with placement: apart from short-lived churn, so whole chunks can go
    p = _pool(device, pool)
    h = OffloadHandle(obj, tag, prio, p, pool)
    p._pool.offload_register(h._tid, prio)
    if is_optimizer:
        _optimizer_hooks(h, obj, offload_after_step)
        if offload_after_step and prefetch_at is not None:
            _prefetch_in_backward(h, obj, prefetch_at)
    else:
        h._retake(obj)
        _module_hooks(h, obj, prefetch_next)
        for sharer in _sharers(obj):
            _sharer_hooks(h, sharer)
        _drop_code_compiled_without_hooks()
        with OffloadHandle._chain_lock:
            OffloadHandle._chain.append(weakref.ref(h))
        _hold_modules_in_steps()
        _wrap_readers()
    h._use(False)
    return h


# An optimizer's step writes the parameters of modules that may be
# offloadable, idle since their backward pass: an allocation of the step
# (foreach temporaries, new state) could offload them under pressure before
# the step's kernels write them.  So every optimizer's step holds the
# offloadable modules that own its parameters (global step hooks, installed
# with the first offloadable module).  Per optimizer, the handles its step
# holds; a step that raised leaves them held until its next step.
_step_holds: "weakref.WeakKeyDictionary[Any, List[OffloadHandle]]" = weakref.WeakKeyDictionary()
_step_hooks: List[Any] = []


def _hold_modules_in_steps() -> None:
    with OffloadHandle._chain_lock:
        if _step_hooks:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        except ImportError:  # (no torch: no optimizer either)
            return
        _step_hooks.append(register_optimizer_step_pre_hook(_eager(_step_pre)))
        _step_hooks.append(register_optimizer_step_post_hook(_eager(_step_post)))


def _eager(hook: Any) -> Any:
    """`hook` as torch.compile runs it: as it is, not traced.  A step hook
    runs inside ``opt.step()``, which a compiled function traces (PyTorch's
    compiled-optimizer recipe); traced, the handle's bookkeeping (state
    addresses, calls into the extension) failed dynamo's guards at each
    step: a compilation every step until its recompile limit, and a screen
    of warnings naming gpupool's code."""
    disable = getattr(getattr(sys.modules.get("torch"), "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


def _not_capturing(pool: "PoolView", tags: List[str]) -> None:
    """Inside a CUDA graph capture a restore, which copies and waits, would
    invalidate the capture (its error names no cause): offloaded memory of
    `tags` raises a RuntimeError that says what to do instead.  (Another
    thread's capture, in a mode that lets this one work, is not this
    one's.)"""
    torch = sys.modules.get("torch")
    if capturing() and torch is not None and torch.cuda.is_current_stream_capturing():
        stats = pool.stats()["tags"]
        away = [t for t in tags if stats.get(t, {}).get("offloaded", 0)]
        if away:
            raise RuntimeError(f"gpupool: {away[0]!r} is offloaded while a CUDA graph is being captured, and a "
                               "capture cannot restore it (a restore copies and waits): restore it "
                               "(handle.restore()) before the capture")


def _step_pre(opt: Any, args: Any, kwargs: Any) -> None:
    _step_post(opt, args, kwargs)
    with OffloadHandle._chain_lock:
        modules = [h for h in (r() for r in OffloadHandle._chain) if h is not None and h._key]
    if not modules:
        return
    params = {q.data_ptr() for g in getattr(opt, "param_groups", ()) for q in plain_tensors(g["params"])}
    held = OffloadHandle._hold_resident_all([h for h in modules if not params.isdisjoint(h._key or ())])
    if held:
        with OffloadHandle._chain_lock:
            _step_holds[opt] = held


def _step_post(opt: Any, args: Any, kwargs: Any) -> None:
    with OffloadHandle._chain_lock:
        held = _step_holds.pop(opt, ())
    for h in held:
        h._release()


# torch.compile does not guard on module hooks by default
# (torch._dynamo.config.skip_nnmodule_hook_guards): code it compiled before
# the hooks existed, for this module or any module of the same structure,
# runs without them and reads offloaded weights (on a GPU the CUDA context
# is lost).  Such code is dropped when a module is made offloadable; the
# count of frames compiled when it last was tells whether any is left.
_frames_at_drop = 0


def _drop_code_compiled_without_hooks() -> None:
    global _frames_at_drop
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None or not getattr(getattr(dynamo, "config", None), "skip_nnmodule_hook_guards", True):
        return
    try:
        frames = int(dynamo.utils.counters["frames"]["ok"])
    except (AttributeError, KeyError, TypeError, ValueError):
        frames = _frames_at_drop + 1  # (not told: assume some)
    if frames == _frames_at_drop:
        return
    warnings.warn("gpupool.offloadable(): torch.compile had compiled code, which does not run module hooks "
                  "installed after it (torch does not guard on them); its caches are reset "
                  "(torch.compiler.reset()) so that compiled calls run the offload hooks. Make modules "
                  "offloadable before their first compiled call to keep what was compiled.",
                  RuntimeWarning, stacklevel=3)
    import torch.compiler

    torch.compiler.reset()
    _frames_at_drop = frames


def _module_hooks(h: OffloadHandle, module: Any, prefetch_next: bool) -> None:
    import torch

    # A copy made from the module's dict without pickling it (DataParallel's
    # replicas) carries these hooks: on it, whose tensors are its own, they
    # do nothing.  (Copies that pickle it carry none: get_state below.)
    def mine(mod: Any) -> bool:
        return mod is h._obj()

    def pre(mod: Any, args: Any) -> None:
        if not mine(mod):
            return
        h._enter()
        if prefetch_next:
            h._prefetch_next()

    def post(mod: Any, args: Any, out: Any) -> None:
        if not mine(mod):
            return
        graph = [t for t in _flat(out) if getattr(t, "grad_fn", None) is not None]
        if not (torch.is_grad_enabled() and graph):
            h._use(False)
            return
        # Backward reads the weights again: busy until the backward pass has
        # run (restored first, should pressure have taken them meanwhile).
        # A tensor hook, not a module backward hook: those forbid in-place
        # changes of the outputs, which models make.
        def on_grad(grad: Any) -> Any:
            h._enter()
            torch.autograd.Variable._execution_engine.queue_callback(lambda: h._use(False))
            return grad

        graph[0].register_hook(on_grad)

    # The state dict's tensors are the module's own: whoever reads them after
    # state_dict() returns (clones them, loads them elsewhere) would find
    # them offloaded had the pool taken them under pressure meanwhile, so the
    # module is busy for as long as the dict lives.
    def keep(state_dict: Any) -> None:
        h._hold_while(state_dict)

    def load_post(mod: Any, incompatible: Any) -> None:
        if mine(mod):
            h._retake(mod)  # (assign=True puts the loaded tensors in the parameters' place)

    # A conversion (module.to(), .half(), .cuda(), .cpu(): torch's
    # Module._apply) reads every tensor of the module where no hook sees it,
    # and allocates the tensors that replace them, which under pressure could
    # offload those still to be read: it runs with the module held resident,
    # its new tensors allocated under the tag (in its region, at the
    # caller's priority), and what replaced the module's tensors joins the
    # tag after it.  Module.apply(fn) (weight initialisation, a re-scaling)
    # runs the same way, but allocates under the caller's tag: fn is the
    # user's code, and what it keeps apart from the module must not leave
    # with it.
    def held(name: str, under_tag: bool) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            h._hold_resident()
            try:
                with h._allocating() if under_tag else contextlib.nullcontext():
                    return getattr(type(self), name)(self, *args, **kwargs)
            finally:
                h._release()
                h._retake(self)
        return run

    # What pickling takes of the module (torch.save(model), copy.copy, a
    # deep copy): a plain module, without the methods and hooks of the
    # handle (functions of this one, which pickle cannot name).
    def get_state(self: Any) -> Any:
        state = dict(type(self).__getstate__(self))
        for n, f in methods.items():
            if getattr(state.get(n), "__func__", None) is f:
                del state[n]
        for k, v in state.items():  # (by identity: `in` would compare any value, arrays too)
            if isinstance(v, dict) and any(id(f) in hooks for f in v.values()):
                state[k] = type(v)((i, f) for i, f in v.items() if id(f) not in hooks)
        return _held_state(h, state)

    # A deep copy clones every tensor of the module where no hook sees it:
    # it runs with the module held resident, as the standard deep copy
    # (of what get_state gives) with this method taken out meanwhile.
    def deep_copy(self: Any, memo: Any) -> Any:
        own = self.__dict__.pop("__deepcopy__")
        try:
            with h.in_use():
                return copy.deepcopy(self, memo)
        finally:
            self.__dict__["__deepcopy__"] = own

    # A move to where every tensor already is (model.to(device) or
    # model.cuda() before use, as pipelines and trainers call it) reads
    # nothing: it returns the module as it is, offloaded or not, instead of
    # restoring it for a conversion of nothing.  `where` parses the
    # method's arguments as torch does: (device, dtype, memory format).
    def unmoved(name: str, where: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            device, dtype, fmt = where(*args, **kwargs)
            tensors = [*self.parameters(), *self.buffers()]
            tensors += [t.grad for t in tensors if t.grad is not None]
            if fmt is None and (dtype is None or dtype.is_floating_point or dtype.is_complex) and \
                    all(_stays(t, device, dtype) for t in tensors):
                return self
            return getattr(type(self), name)(self, *args, **kwargs)
        return run

    def to_args(*args: Any, **kwargs: Any) -> Any:
        device, dtype, _, fmt = torch._C._nn._parse_to(*args, **kwargs)
        return device, dtype, fmt

    def cuda_args(device: Any = None) -> Any:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda"), None, None

    methods = {"_apply": held("_apply", True), "apply": held("apply", False), "to": unmoved("to", to_args),
               "cuda": unmoved("cuda", cuda_args), "cpu": unmoved("cpu", lambda: (torch.device("cpu"), None, None)),
               "__deepcopy__": deep_copy, "__getstate__": get_state}
    # The restore runs before the module's other forward pre-hooks: they may
    # read its tensors (FSDP2's gathers the parameters from their shards).
    h._hooks += [module.register_forward_pre_hook(pre, prepend=True), module.register_forward_hook(post)]
    h._hooks += [_own_method(module, n, f) for n, f in methods.items() if n.startswith("__") or hasattr(module, n)]
    hooks = {id(f) for f in (pre, post, *_state_dict_hooks(h, module, keep, load_post, mine))}

    # FSDP2 gathers a module's parameters from their shards ahead of its
    # forward (an explicit prefetch: set_modules_to_forward_prefetch) and
    # of its backward (the implicit prefetch), before any hook of the module
    # runs: each parameter group's unshard restores the module and holds
    # it while the gather is queued (an offload after it waits for the
    # gather's streams, which allocate).  A group another handle took first
    # keeps that handle's.
    def gathered(self: Any, *args: Any, **kwargs: Any) -> Any:
        h._hold_resident()
        try:
            return type(self).unshard(self, *args, **kwargs)
        finally:
            h._release()

    h._hooks += [_own_method(g, "unshard", gathered) for g in _fsdp_groups(module) if "unshard" not in vars(g)]


def _fsdp_groups(module: Any) -> List[Any]:
    """The FSDP2 parameter groups of `module` and its submodules."""
    groups = []
    for m in module.modules():
        state = getattr(m, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if callable(state) else None
        if group is not None and hasattr(type(group), "unshard"):
            groups.append(group)
    return groups


# A module outside the offloadable one may use its memory: a tied embedding
# holds the very weight of `lm_head`, and a submodule may also be reachable
# from elsewhere (an encoder-decoder's shared embedding).  Its forward ran
# outside every hook of the handle and read offloaded memory (on a GPU the
# CUDA context is lost).  Such modules are found when the module is made
# offloadable (one walk of the interpreter's objects) and get hooks of
# their own that hold the handle resident through their forward and, when
# it recorded a graph, through their part of the backward pass.
def _sharers(module: Any) -> List[Any]:
    """Modules outside `module` that hold one of its tensors (or a view of
    one) as a parameter or buffer of their own, and submodules of it that a
    module outside it holds as a child."""
    import gc

    import torch

    inside = {id(m) for m in module.modules()}
    storages = {_storage(t) for t in plain_tensors([*module.parameters(), *module.buffers()])} - {0}
    found: Dict[int, Any] = {}
    for o in gc.get_objects():
        if not issubclass(type(o), torch.nn.Module) or id(o) in inside:  # (isinstance may ask o.__class__)
            continue
        state = vars(o)  # (a module whose __init__ failed may lack any of these)
        for child in (state.get("_modules") or {}).values():
            if child is not module and id(child) in inside:
                found[id(child)] = child
        own = [t for d in ("_parameters", "_buffers") for t in (state.get(d) or {}).values() if t is not None]
        if any(_storage(t) in storages for t in plain_tensors(own)):
            found[id(o)] = o
    return list(found.values())


def _storage(t: Any) -> int:
    """The address of `t`'s storage; 0 for a tensor without one (sparse, meta)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0


def _sharer_hooks(h: OffloadHandle, sharer: Any) -> None:
    """Hooks that hold `h` resident while `sharer` runs its forward, and
    again from the gradient of its output to the end of that backward pass
    (a hold each, counted, so that they nest with the module's own use)."""
    ref = weakref.ref(sharer)
    taken = threading.local()  # (per thread: the holds its forwards took; a pre-hook that raised took none)

    def pre(mod: Any, args: Any) -> None:
        if mod is ref():
            h._hold_resident()
            taken.n = getattr(taken, "n", 0) + 1

    def post(mod: Any, args: Any, out: Any) -> None:
        if mod is not ref() or not getattr(taken, "n", 0):
            return
        taken.n -= 1
        h._release()
        _hold_in_backward([h], out)

    # (always_call: a forward that raised releases its hold too)
    h._hooks += [sharer.register_forward_pre_hook(pre, prepend=True),
                 sharer.register_forward_hook(post, always_call=True)]


def _hold_in_backward(handles: List[OffloadHandle], out: Any) -> None:
    """Where `out`, a forward's output, recorded a graph: `handles` held
    resident again from the gradient of its output to the end of that
    backward pass, which reads what the forward saved of their tensors."""
    import torch

    graph = [t for t in _flat(out) if getattr(t, "grad_fn", None) is not None]
    if not (torch.is_grad_enabled() and graph):
        return

    def on_grad(grad: Any) -> Any:
        held = OffloadHandle._hold_resident_all(handles)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: [h._release() for h in held])
        return grad

    graph[0].register_hook(on_grad)


# Code of torch's (and of the libraries a fine-tune runs on) that reads a
# module's tensors where none of its hooks runs.  nn.DataParallel over
# several GPUs, and its functional form, copy them to the other devices
# (replicate) before the module's forward, and the replica on the first
# device computes on the module's own tensors; the replicas are copies, on
# which the module's hooks do nothing.  DistributedDataParallel broadcasts
# its module's parameters and buffers when it is made, and the buffers
# before each forward (its default broadcast_buffers=True).  An EMA
# (torch.optim.swa_utils.AveragedModel) reads the model it averages in
# update_parameters.  PEFT's merge and unload (merge_and_unload,
# merge_adapter, unmerge_adapter) add each adapter's product to its base
# layer's weight, a layer at a time inside its onload_layer(); transformers'
# resize_token_embeddings copies the old embeddings into new ones.  An
# offloadable module there was read offloaded (the CUDA context lost).  So
# these hold the offloadable modules whose tensors they read while they run
# (a PEFT layer while it is merged), and DataParallel's forward again from
# its output's gradient to the end of that backward pass.  Wrapped at each
# offloadable(), what is imported by then and not wrapped yet, and what is
# imported later as it loads (_ReaderImports).
_wrapped: Set[Tuple[int, str]] = set()  # (id of the class or module, attribute) of each wrapped
_READER_MODULES = frozenset({"peft.tuners.tuners_utils", "transformers.modeling_utils"})


def _wrap_readers() -> None:
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    if nn is None:
        return
    parallel = getattr(nn, "parallel", None)
    ddp = getattr(parallel, "DistributedDataParallel", None)
    ema = getattr(getattr(getattr(torch, "optim", None), "swa_utils", None), "AveragedModel", None)
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    pretrained = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    table = (
        (getattr(nn, "DataParallel", None), "forward", _dp_forward),
        (parallel, "data_parallel", _dp_function),
        (ddp, "__init__", _holding(lambda self, *a, **k: _module_tensors(_first(a, k, "module")))),
        (ddp, "_sync_module_buffers", _holding(lambda self, *a, **k: getattr(self, "modules_buffers", None) or ())),
        (ema, "update_parameters", _holding(lambda self, *a, **k: itertools.chain(
            _module_tensors(_first(a, k, "model")), _module_tensors(getattr(self, "module", None))))),
        (tuners, "onload_layer", _holding_within(getattr(tuners, "BaseTunerLayer", ()))),
        (pretrained, "resize_token_embeddings", _holding(lambda self, *a, **k: itertools.chain(
            _module_tensors(self.get_input_embeddings()), _module_tensors(self.get_output_embeddings())))),
    )
    with OffloadHandle._chain_lock:
        if not any(isinstance(f, _ReaderImports) for f in sys.meta_path):
            sys.meta_path.insert(0, _ReaderImports())
        for owner, name, wrap in table:
            own = getattr(owner, name, None)
            if own is not None and (id(owner), name) not in _wrapped:
                setattr(owner, name, functools.wraps(own)(wrap(own)))
                _wrapped.add((id(owner), name))


class _ReaderImports(importlib.abc.MetaPathFinder):
    """A finder of nothing of its own: for a module of the readers' table
    imported after the first offloadable module (a fine-tune that imports
    PEFT only to merge, once training is done), the spec that the finders
    after it give, loaded through `_WrappingLoader`."""

    _finding = threading.local()  # (a finder after it that asks for the same name finds it without this one)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _READER_MODULES or getattr(self._finding, "name", None) == fullname:
            return None
        self._finding.name = fullname
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                spec = None if isinstance(finder, _ReaderImports) or find is None else find(fullname, path, target)
                if spec is not None:
                    if hasattr(spec.loader, "exec_module"):
                        spec.loader = _WrappingLoader(spec.loader)
                    return spec
            return None
        finally:
            self._finding.name = None


class _WrappingLoader(importlib.abc.Loader):
    """`loader`, which wraps the readers once the module has run (before any
    other module can bind them by name), then leaves the module its own
    loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _wrap_readers()


def _dp_forward(own: Any) -> Any:
    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        return _data_parallel(lambda: own(self, *inputs, **kwargs), self.module, getattr(self, "device_ids", None))

    return forward


def _dp_function(own: Any) -> Any:
    def data_parallel(module: Any, inputs: Any, device_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
        ids = device_ids if device_ids is not None else range(sys.modules["torch"].cuda.device_count())
        return _data_parallel(lambda: own(module, inputs, device_ids, *args, **kwargs), module, ids)

    return data_parallel


def _data_parallel(run: Any, module: Any, device_ids: Any) -> Any:
    """``run()``, a data-parallel forward of `module` over `device_ids`:
    over several, with the offloadable modules inside held through it and
    again through its part of the backward pass; over one, the module
    itself runs, whose own hooks hold it."""
    if len(device_ids or ()) < 2:
        return run()
    with _held(_module_tensors(module)) as held:
        out = run()
        if held:
            _hold_in_backward(held, out)
    return out


@contextlib.contextmanager
def _held(tensors: Iterable[Any]) -> Iterator[List[OffloadHandle]]:
    """The offloadable modules owning any of `tensors` held resident inside."""
    held = OffloadHandle._hold_resident_all(_handles_of(tensors))
    try:
        yield held
    finally:
        for h in held:
            h._release()


def _holding(tensors_of: Any) -> Any:
    """A wrapper of a method (of its function `own`) that holds the
    offloadable modules owning the tensors ``tensors_of(self, *args,
    **kwargs)`` names while the method runs; run as it is under
    torch.compile (see `_eager`: the holds take a lock)."""
    def wrap(own: Any) -> Any:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _held(tensors_of(self, *args, **kwargs)):
                return own(self, *args, **kwargs)

        return _eager(run)

    return wrap


def _holding_within(kind: Any) -> Any:
    """A wrapper of a context manager of a module (PEFT's onload_layer,
    its function `own`) that holds the offloadable modules owning the
    module's tensors inside it where the module is a `kind` (PEFT's layers: its
    unload enters every module of the model, the root too, and merges only
    its layers; a hold of the root would restore a model streamed under a
    limit whole)."""
    def wrap(own: Any) -> Any:
        @contextlib.contextmanager
        def within(module: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            with _held(_module_tensors(module) if isinstance(module, kind) else ()), \
                    own(module, *args, **kwargs) as inside:
                yield inside

        return within

    return wrap


def _first(args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str) -> Any:
    """A method's first argument, given by position or as `name`."""
    return args[0] if args else kwargs.get(name)


def _module_tensors(module: Any) -> Iterable[Any]:
    """`module`'s parameters and buffers, as they come; none for what is no module."""
    if not hasattr(module, "parameters"):
        return ()
    return itertools.chain(module.parameters(), module.buffers())


def _handles_of(tensors: Iterable[Any]) -> List[OffloadHandle]:
    """The offloadable modules' handles that any of `tensors` belongs to
    (`tensors` not looked at while no module is offloadable)."""
    with OffloadHandle._chain_lock:
        handles = [h for h in (r() for r in OffloadHandle._chain) if h is not None and h._key]
    if not handles:
        return []
    ptrs = {t.data_ptr() for t in plain_tensors(tensors)}
    return [h for h in handles if not ptrs.isdisjoint(h._key)]


def _state_dict_hooks(h: OffloadHandle, obj: Any, keep: Any, load_post: Any, mine: Any = None) -> List[Any]:
    """state_dict()'s pre and post hooks and load_state_dict()'s post hook
    on a module or optimizer (of the handle's object; `mine` tells it from
    a copy that carries the hooks), where its torch has them.  The pre hook
    restores the object and holds it; the post hook hands the hold to
    ``keep(state_dict)`` (which releases it once the dict is done with) and
    returns what that returns.  Without a post hook, the pre hook only
    restores.  Returns the hooks it registered.

    A state_dict() that raises between the two (a submodule's or a user's
    hook) leaves the pre hook's hold without its post: the next
    state_dict() of the same thread releases it, as a step that raised is
    released by the next step.  Per thread: another thread's call may lie
    between its two hooks meanwhile."""
    holds = hasattr(obj, "register_state_dict_pre_hook") and hasattr(obj, "register_state_dict_post_hook")
    pending = threading.local()

    def pre(o: Any, *args: Any) -> None:
        if mine is not None and not mine(o):
            return
        if not holds:
            h.restore()
            return
        if getattr(pending, "held", False):
            pending.held = False
            h._release()
        h._hold_resident()
        pending.held = True

    def post(o: Any, state_dict: Any, *args: Any) -> Any:
        if mine is not None and not mine(o):
            return None
        pending.held = False
        return keep(state_dict)

    fns = []
    if hasattr(obj, "register_state_dict_pre_hook"):
        h._hooks.append(obj.register_state_dict_pre_hook(pre))
        fns.append(pre)
    if holds:
        h._hooks.append(obj.register_state_dict_post_hook(post))
        fns.append(post)
    if hasattr(obj, "register_load_state_dict_post_hook"):
        h._hooks.append(obj.register_load_state_dict_post_hook(load_post))
        fns.append(load_post)
    return fns


def _stays(t: Any, device: Any, dtype: Any) -> bool:
    """Whether Module.to(device, dtype) leaves tensor `t` as it is."""
    import torch

    if dtype is not None and (t.is_floating_point() or t.is_complex()) and t.dtype != dtype:
        return False
    if device is None or device.index is not None:
        return device is None or t.device == device
    if device.type == "cuda":  # (the current device, as torch fills the index in)
        return t.device.type == "cuda" and t.device.index == torch.cuda.current_device()
    return t.device.type == device.type == "cpu"


def _held_state(h: OffloadHandle, state: Any) -> Any:
    """`state`, what pickling takes of the handle's object, with the object
    restored and held while the state lives: its tensors are read where no
    hook sees it, after ``__getstate__`` returns (torch.save writes them
    once the pickle is made, while its pickler still holds the state; a
    deep copy clones them).  As an OrderedDict: a plain dict cannot be
    weakly referenced, and a class of ours would pickle as gpupool's."""
    state = collections.OrderedDict(state)
    h._hold_resident()
    h._hold_while(state)
    return state


class _Undo:
    """What undoes a hook that is not torch's, as torch's hook handles do."""

    def __init__(self, undo: Any) -> None:
        self.remove = undo


def _own_method(obj: Any, name: str, fn: Any) -> _Undo:
    """`fn` bound to the module or optimizer as an attribute of its own,
    where torch has no hook.  The undo leaves a method someone set since in
    place."""
    obj.__dict__[name] = types.MethodType(fn, obj)
    ref = weakref.ref(obj)  # (the handle does not keep the object alive)

    def undo() -> None:
        o = ref()
        if o is not None and getattr(o.__dict__.get(name), "__func__", None) is fn:
            del o.__dict__[name]

    return _Undo(undo)


def _optimizer_hooks(h: OffloadHandle, opt: Any, offload_after_step: bool) -> None:
    # The context the step allocates under: its new state (the first step
    # makes it) lands under the tag, in the tag's region (offloadable tags
    # are long-lived), not among the gradients it would then share chunks
    # with.  At the priority of the code that steps, which is what may
    # displace cache under a limit (cache of a priority above the request's
    # stays): the state moves to the handle's priority after the step.  Per
    # thread; a step that raised leaves it set until the next.
    saved = threading.local()

    def pre(o: Any, args: Any, kwargs: Any) -> None:
        while dicts:
            dicts.pop()()
        if offload_after_step:
            h._measure()  # (where no prefetch did)
        with _mark("gpupool.restore"):
            h._enter()
        if getattr(saved, "ctx", None) is None:
            saved.ctx = _C.set_context(h._tid, _C.get_context()[1])

    def post(o: Any, args: Any, kwargs: Any) -> None:
        ctx, saved.ctx = getattr(saved, "ctx", None), None
        if ctx is not None:
            _C.set_context(*ctx)
        h._retake(o)
        h._use(False)
        if offload_after_step:
            h._offload_behind_step()
        # The end of a step is a yield point of this process's tenants
        # (GPUPOOL_TENANT): their asks are answered, the next step's room taken.
        _C.tenant_yield(0)

    # As a module's (see _module_hooks): busy while the dict lives, whose
    # tensors are the state itself, but only until the next step, which
    # moves the state on (a dict kept in a variable of the training loop
    # would otherwise keep the pool from it for good).  torch's dict is a
    # plain one, which cannot be weakly referenced: the hook returns it as
    # an OrderedDict (saved and loaded as torch's own, weights_only too).
    dicts: List[weakref.finalize] = []

    def keep(state_dict: Any) -> Any:
        held = collections.OrderedDict(state_dict)
        done = h._hold_while(held)
        dicts[:] = [d for d in dicts if d.alive] + ([done] if done is not None else [])
        return held

    def load_post(o: Any) -> None:
        # The loaded state joins the tag now, not at the next step: under a
        # limit the forward pass before it may need the room, and only the
        # tag's memory can be offloaded for it.
        h._retake(o)

    # torch.save(optimizer) and copy.deepcopy(optimizer) read the state
    # where no hook sees it (torch's own __getstate__ leaves the hooks out).
    def get_state(self: Any) -> Any:
        return _held_state(h, type(self).__getstate__(self))

    h._hooks += [opt.register_step_pre_hook(_eager(pre)), opt.register_step_post_hook(_eager(post))]
    if hasattr(type(opt), "__getstate__"):
        h._hooks.append(_own_method(opt, "__getstate__", get_state))
    _state_dict_hooks(h, opt, keep, load_post)
    h._retake(opt)


def _prefetch_in_backward(h: OffloadHandle, opt: Any, at: float) -> None:
    params = [q for g in getattr(opt, "param_groups", ()) for q in g["params"]
              if getattr(q, "requires_grad", False) and hasattr(q, "register_post_accumulate_grad_hook")]
    total = sum(q.numel() * q.element_size() for q in params)
    # Bytes whose gradients this backward pass has accumulated; -1 once the
    # prefetch has been started.  The step starts the count afresh.
    seen = [0]

    def on_grad(q: Any) -> None:
        if seen[0] < 0:
            return
        seen[0] += q.numel() * q.element_size()
        if seen[0] >= at * total:
            seen[0] = -1
            h._measure()
            with _mark("gpupool.prefetch"):
                h.prefetch()

    def restart(o: Any, args: Any, kwargs: Any) -> None:
        seen[0] = 0

    h._hooks += [q.register_post_accumulate_grad_hook(on_grad) for q in params]
    h._hooks.append(opt.register_step_post_hook(restart))


def _is_optimizer(obj: Any) -> bool:
    return hasattr(obj, "state") and hasattr(obj, "register_step_pre_hook")


def _state_tensors(opt: Any) -> List[Any]:
    """An optimizer's state tensors (the plain ones that hold their memory),
    in the state's order."""
    return plain_tensors(v for st in opt.state.values() for v in st.values() if hasattr(v, "data_ptr"))


class _Wraps:
    """A stand-in for a tensor that wraps one other (a DTensor), held as the
    state holds its values: the reference counts it shows are those of a
    state value that nothing else holds."""

    __slots__ = ("inner",)

    def __init__(self) -> None:
        self.inner = object()

    def __tensor_flatten__(self) -> Tuple[List[str], None]:
        return ["inner"], None


def _refcounts(v: Any) -> Tuple[List[int], List[Any]]:
    """The reference counts of v and, where it wraps others, of each tensor
    it wraps, as the caller holds v (in a local, the value in a dict),
    taken before anything else holds them; and v's plain tensors."""
    n = sys.getrefcount(v)
    parts = plain_tensors([v])
    if len(parts) == 1 and parts[0] is v:
        return [n], parts
    return [n] + [sys.getrefcount(q) for q in parts], parts


def _wrapped_optimizer(obj: Any) -> Any:
    """The optimizer whose hooks see obj's steps: obj, or the one it wraps.
    A wrapper that subclasses torch's Optimizer without running its
    ``__init__`` (accelerate's AcceleratedOptimizer, the ``optimizer`` that
    transformers' Trainer hands its callbacks) has no hook registries of
    its own; its ``step()``, ``state_dict()`` and ``load_state_dict()``
    call the wrapped optimizer's, whose hooks then run."""
    torch = sys.modules.get("torch")
    seen = []
    while (torch is not None and isinstance(obj, torch.optim.Optimizer)
           and not hasattr(obj, "_optimizer_step_pre_hooks")):
        seen.append(type(obj).__name__)
        inner = getattr(obj, "optimizer", None)
        if inner is None or len(seen) > 8 or not _is_optimizer(inner):
            raise TypeError(f"gpupool.offloadable(): {' wrapping '.join(seen)} subclasses torch.optim.Optimizer "
                            f"without running its __init__, so no step hook can be registered on it, and it "
                            f"wraps no optimizer at .optimizer; pass the torch optimizer whose step() it calls")
        obj = inner
    return obj


def _mark(name: str) -> Any:
    """A range of the hooks' host time in a torch.profiler trace (benchmarks/timeline.py
    names the hooks under way when the compute stream is idle); nothing without torch."""
    torch = sys.modules.get("torch")
    return contextlib.nullcontext() if torch is None else torch.profiler.record_function(name)


def _flat(x: Any) -> Iterator[Any]:
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
    else:
        yield x
