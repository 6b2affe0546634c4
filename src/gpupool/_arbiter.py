"""Several processes on one GPU: the tenant registry of a group.

Processes started with the same ``GPUPOOL_TENANT=<group>`` on the same device
register in a registry in shared memory, and the group's memory goes where
the priorities say (``GPUPOOL_DEVICE_LIMIT`` caps the whole group,
``GPUPOOL_RECLAIM_TIMEOUT`` bounds a wait; docs/architecture.md, "Tenants").
A process that needs memory asks lower-priority tenants to give theirs
back; they answer at their next allocation, or at a yield point:

    for batch in data:
        train_step(batch)
        gpupool.yield_point()        # or install_yield_point(optimizer)

``tenants()`` reads a registry without joining it (``python -m gpupool top``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _C
from ._context import priority_name

__all__ = ["yield_point", "install_yield_point", "tenants", "registries", "format_tenants"]




def yield_point(need: int = 0) -> int:
    """A safe point between two steps of this process (it holds no step's
    memory now): answer the reclaim requests pending for it, give its cache
    to a tenant waiting ahead of it, then wait in line until the group can
    give the coming step its memory -- ``need`` bytes held at the step's
    peak, or (0) as much as the last step held -- and keep that room for
    the step (a lease, until the next yield point), so that two steps never
    both stall half way.  Returns the bytes given back.  Without a tenant
    group it does nothing; with nothing asked or short, it costs one lock
    of the registry per tenant pool."""
    return int(_C.tenant_yield(int(need)))


class _Hook:
    """What install_yield_point returns: .remove() takes the hook away."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def remove(self) -> None:
        self._handle.remove()


def install_yield_point(obj: Any, need: int = 0) -> _Hook:
    """Make every step of `obj` a yield point (``yield_point(need)``): after
    each ``step()`` of a torch optimizer, before each forward of an
    ``nn.Module``."""
    def hook(*args: Any, **kwargs: Any) -> None:
        yield_point(need)

    if hasattr(obj, "register_step_post_hook"):
        return _Hook(obj.register_step_post_hook(hook))
    if hasattr(obj, "register_forward_pre_hook"):
        return _Hook(obj.register_forward_pre_hook(hook))
    raise TypeError(f"install_yield_point: {type(obj).__name__} is neither a torch optimizer nor an "
                    f"nn.Module; call gpupool.yield_point() in its loop instead")


def registries() -> List[Tuple[str, str]]:
    """(group, device) of every tenant registry on this machine."""
    return [(str(g), str(d)) for g, d in _C.tenant_registries()]


def tenants(group: str, device: str) -> Optional[Dict[str, Any]]:
    """A consistent copy of a registry (dead tenants reclaimed first), or None
    when the group has none on that device: ``{group, device, limit, total,
    registered, reaped, tenants: [{pid, name, priority, quota, held, cached,
    offloadable, offloaded, lease, wanted, waiting_s, seen_s, waits, wait_failures,
    reclaims_given, bytes_given, reclaims_received, bytes_received,
    latency_median_s, latency_max_s, latencies_s, ...}]}``.  ValueError for a
    registry that is not this user's alone (another owner, a mode other than
    0600); RuntimeError for a corrupt one (a figure that cannot be: the
    message names the slot and the field)."""
    return _C.tenant_read(group, device)


def format_tenants(info: Dict[str, Any], fmt: Callable[[int], str]) -> str:
    """One registry as a table: a line for the group, a row per tenant."""
    limit = fmt(info["limit"]) if info["limit"] else f"none (device {fmt(info['total'])})"
    held = sum(t["held"] for t in info["tenants"])
    lines = [f"tenant group '{info['group']}' on {info['device']}: limit {limit}, held {fmt(held)}, "
             f"{len(info['tenants'])} tenants ({info['registered']} registered, {info['reaped']} dead reclaimed)"]
    head = ("pid", "name", "prio", "quota", "held", "cached", "offloadable", "offloaded", "lease", "wanted",
            "waits", "given", "received", "answer med/max")
    rows = [head]
    for t in sorted(info["tenants"], key=lambda t: (-t["priority"], -t["held"])):
        wanted = f"{fmt(t['wanted'])} {t['waiting_s']:.1f}s" if t["wanted"] else "-"
        latency = (f"{1e3 * t['latency_median_s']:.1f}/{1e3 * t['latency_max_s']:.1f}ms"
                   if t["latencies_s"] else "-")
        rows.append((str(t["pid"]), t["name"][:24], priority_name(t["priority"]),
                     fmt(t["quota"]) if t["quota"] else "-", fmt(t["held"]), fmt(t["cached"]),
                     fmt(t["offloadable"]), fmt(t["offloaded"]), fmt(t["lease"]) if t["lease"] else "-", wanted,
                     f"{t['waits']} ({t['wait_failures']} failed)",
                     f"{t['reclaims_given']} ({fmt(t['bytes_given'])})",
                     f"{t['reclaims_received']} ({fmt(t['bytes_received'])})", latency))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("    " + "  ".join(c.rjust(w) if i not in (1, 2) else c.ljust(w)
                                       for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(lines)
