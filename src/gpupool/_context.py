"""Tags and priorities: names interned once, the thread-local context that
every allocation made on a thread is tagged with, the inherited context of
threads without one (autograd's backward threads), and tag lifetimes for
placement.  Re-tagging tensors that exist already is ``_tagged``."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar, Union

from . import _C

__all__ = ["tag", "tag_id", "tag_lifetime", "priority_value", "priority_name", "current_tag", "LIFETIMES",
           "PRIORITY_NAMES", "Priority"]

Priority = Union[str, int]
F = TypeVar("F", bound=Callable[..., Any])

# Indexed by the C side's GP_LIFE_*.
LIFETIMES: Tuple[str, str] = ("short", "long")
# The named priorities, 0 up: the C side's list (gpupool.h, GP_PRIORITIES).
PRIORITY_NAMES: Tuple[str, ...] = tuple(_C.PRIORITY_NAMES)

_ids: Dict[str, int] = {}


def tag_id(name: str) -> int:
    """The small integer behind a tag name (interned on first use).  ValueError
    for a bad name; RuntimeError (which says to reuse names) once all
    1024 tags of the process are in use -- a full table, not a lack of memory."""
    i = _ids.get(name)
    if i is None:
        if not isinstance(name, str):
            raise TypeError(f"a tag is a str, got {type(name).__name__}")
        i = _ids[name] = _C.tag_intern(name)
    return i


def priority_value(p: Priority) -> int:
    """'low', 'normal', 'high', 'critical' or an int 0..255 -> int."""
    if isinstance(p, bool) or not isinstance(p, (str, int)):
        names = ", ".join(repr(n) for n in PRIORITY_NAMES)
        raise TypeError(f"a priority is {names} or an int 0..{_C.PRIO_MAX}, got {p!r}")
    return int(_C.parse_priority(str(p)))


def priority_name(p: int) -> str:
    """A priority as reports write it: its name ('high'), else the number."""
    return PRIORITY_NAMES[p] if 0 <= p < len(PRIORITY_NAMES) else str(p)


def tag_lifetime(name: str, lifetime: Optional[str] = None) -> str:
    """The lifetime of tag `name`, "short" or "long"; sets it when `lifetime`
    is given (for allocations made afterwards).  With placement on (the
    default, GPUPOOL_PLACEMENT=lifetime), blocks of long-lived tags come from
    a region of their own, apart from short-lived churn.  "weights",
    "parameters", "params", "buffers", "lora", "optimizer", "optimizer_state"
    and "kv_cache" start long; other tags short (gradients too: dropped and
    made again every step, they are churn)."""
    if lifetime is None:
        return LIFETIMES[_C.tag_lifetime(tag_id(name))]
    if lifetime not in LIFETIMES:
        raise ValueError(f"lifetime of tag {name!r} must be 'short' or 'long', got {lifetime!r}")
    _C.tag_lifetime(tag_id(name), LIFETIMES.index(lifetime))
    return lifetime


def current_tag() -> str:
    """The tag this thread's allocations get now (its own context, or the
    inherited one when it has none)."""
    return str(_C.tag_name(_C.get_context()[0]))


class tag(contextlib.ContextDecorator):
    """Tag (and prioritise) every allocation made on this thread inside the
    block or decorated function::

        with gpupool.tag("kv_cache", priority="high"):
            cache = torch.empty(...)

    Nestable; the previous tag and priority come back on exit, also on an
    exception.  Priority None keeps the enclosing one.  `lifetime` ("short"
    or "long") sets the tag's lifetime for placement (see tag_lifetime).

    inherit=True also makes this the context of threads that have none of
    their own -- above all autograd's backward threads, which run
    loss.backward()'s kernels and would otherwise allocate untagged::

        with gpupool.tag("backward", inherit=True):
            loss.backward()

    The inherited context is one per process: two threads that use inherit
    at once overwrite each other's (each restores the previous on exit)."""

    def __init__(self, name: str, priority: Optional[Priority] = None, lifetime: Optional[str] = None,
                 inherit: bool = False) -> None:
        self._tag = tag_id(name)
        self._prio = None if priority is None else priority_value(priority)
        self._inherit = bool(inherit)
        if lifetime is not None:
            tag_lifetime(name, lifetime)
        # The contexts to restore, per thread: one tag object may be entered
        # by several threads at once.
        self._local = threading.local()

    def __enter__(self) -> "tag":
        prio = self._prio if self._prio is not None else _C.get_context()[1]
        saved = getattr(self._local, "saved", None)
        if saved is None:
            saved = self._local.saved = []
        prev = _C.set_context(self._tag, prio)
        saved.append((prev, _C.set_inherited(self._tag, prio) if self._inherit else None))
        return self

    def __exit__(self, *exc: Any) -> None:
        saved = getattr(self._local, "saved", None)
        if not saved:
            raise RuntimeError(
                f"gpupool.tag({_C.tag_name(self._tag)!r}) exited on a thread that has not entered it "
                f"(or more often than entered): a tag context belongs to the thread that enters it; "
                f"enter and exit it on the same thread (a `with` block does)")
        prev, inherited = saved.pop()
        if inherited is not None:
            _C.set_inherited(*inherited)
        _C.set_context(*prev)

    def __call__(self, fn: F) -> F:  # a fresh context per call, safe with recursion and threads
        name, prio, inherit = _C.tag_name(self._tag), self._prio, self._inherit

        @functools.wraps(fn)
        def inner(*a: Any, **k: Any) -> Any:
            with tag(name, prio, inherit=inherit):
                return fn(*a, **k)
        return inner  # type: ignore[return-value]
