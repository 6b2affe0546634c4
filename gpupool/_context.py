"""Tags and priorities: names interned once, and the thread-local context
that every allocation made on this thread is tagged with."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, Optional, TypeVar, Union

from . import _C

__all__ = ["tag", "tag_id", "priority_value", "current_tag"]

Priority = Union[str, int]
F = TypeVar("F", bound=Callable[..., Any])

_ids: Dict[str, int] = {}


def tag_id(name: str) -> int:
    """The small integer behind a tag name (interned on first use)."""
    i = _ids.get(name)
    if i is None:
        if not isinstance(name, str):
            raise TypeError(f"a tag is a str, got {type(name).__name__}")
        i = _ids[name] = _C.tag_intern(name)
    return i


def priority_value(p: Priority) -> int:
    """'low', 'normal', 'high', 'critical' or an int 0..255 -> int."""
    if isinstance(p, bool) or not isinstance(p, (str, int)):
        raise TypeError(f"a priority is 'low', 'normal', 'high', 'critical' or an int 0..255, got {p!r}")
    return int(_C.parse_priority(str(p)))


def current_tag() -> str:
    """The tag this thread's allocations get now."""
    return str(_C.tag_name(_C.get_context()[0]))


class tag(contextlib.ContextDecorator):
    """Tag (and prioritise) every allocation made on this thread inside the
    block or decorated function::

        with gpupool.tag("kv_cache", priority="high"):
            cache = torch.empty(...)

    Nestable; the previous tag and priority come back on exit, also on an
    exception.  Priority None keeps the enclosing one."""

    def __init__(self, name: str, priority: Optional[Priority] = None) -> None:
        self._tag = tag_id(name)
        self._prio = None if priority is None else priority_value(priority)
        self._saved: list = []

    def __enter__(self) -> "tag":
        prio = self._prio if self._prio is not None else _C.get_context()[1]
        self._saved.append(_C.set_context(self._tag, prio))
        return self

    def __exit__(self, *exc: Any) -> None:
        _C.set_context(*self._saved.pop())

    def __call__(self, fn: F) -> F:  # a fresh context per call, safe with recursion and threads
        name, prio = _C.tag_name(self._tag), self._prio

        @functools.wraps(fn)
        def inner(*a: Any, **k: Any) -> Any:
            with tag(name, prio):
                return fn(*a, **k)
        return inner  # type: ignore[return-value]
