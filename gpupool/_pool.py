"""The pool view shared by device pools and host pools: typed accessors over
gpupool._C.Pool, statistics as dicts and the readable report."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, NamedTuple, Optional

from . import _C
from ._context import LIFETIMES, Priority, priority_value, tag_id

__all__ = ["Block", "PoolView", "HostPool", "format_bytes"]

_STATES = ("unmapped", "free", "used", "pending")  # pending: waits for record_stream events
_ARENAS = ("small", "large")


class Block(NamedTuple):
    """One block of a pool, as snapshots and `blocks()` list it."""

    addr: int
    size: int
    requested: int
    stream: int
    tag: str
    priority: int
    state: str   # "used", "free" or "unmapped"
    arena: str   # "small" or "large"
    lifetime: str  # region of the arena it lies in: "short" or "long" (placement)


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    v, u = float(n), 0
    while abs(v) >= 1024 and u < len(units) - 1:
        v /= 1024
        u += 1
    return f"{v:.0f} {units[u]}" if u == 0 else f"{v:.2f} {units[u]}"


class PoolView:
    """Typed access to one gpupool pool (a device's, or a HostPool)."""

    def __init__(self, pool: "_C.Pool", name: str) -> None:
        self._pool = pool
        self.name = name

    def stats(self) -> Dict[str, Any]:
        """All figures: allocated, reserved, peaks, counts, per tag and priority."""
        s: Dict[str, Any] = self._pool.stats(True)
        n = s["n_alloc"]
        s["cache_hit_rate"] = s["cache_hits"] / n if n else 1.0
        s["fragmentation"] = 1.0 - s["largest_free"] / s["free_bytes"] if s["free_bytes"] else 0.0
        s["tags"] = self._pool.tag_stats()
        s["priorities"] = {p: {"allocated": c, "allocated_peak": pk}
                           for p, (c, pk) in self._pool.prio_stats().items()}
        return s

    def reset_peak_stats(self) -> None:
        """Set every peak (pool, tags, priorities) to its current value."""
        self._pool.reset_peaks()

    def empty_cache(self) -> int:
        """Give every free physical chunk back to the device; returns bytes released."""
        return int(self._pool.trim())

    def trim(self, nbytes: int) -> int:
        """Release free chunks until `nbytes` were released; returns bytes released."""
        if nbytes < 0:
            raise ValueError(f"trim: nbytes must be >= 0, got {nbytes}")
        return int(self._pool.trim(nbytes))

    def set_limit(self, nbytes: Optional[int], tag: Optional[str] = None) -> None:
        """Cap reserved bytes of the pool, or allocated bytes of one tag; None removes it."""
        v = 0 if nbytes is None else int(nbytes)
        if v < 0:
            raise ValueError(f"limit must be a number of bytes >= 0 or None, got {nbytes}")
        if tag is None:
            self._pool.set_limit(v)
        else:
            self._pool.set_tag_limit(tag_id(tag), v)

    def retag(self, addrs: Iterable[int], tag: str, priority: Optional[Priority] = None) -> int:
        """Re-home the live blocks containing `addrs` under `tag` (and `priority`;
        None keeps each block's own).  All or nothing: ValueError for an address
        in no live block, MemoryError past the tag's limit.  Returns the bytes
        whose tag or priority changed."""
        prio = -1 if priority is None else priority_value(priority)
        return int(self._pool.retag([int(a) for a in addrs], tag_id(tag), prio))

    def blocks(self) -> List[Block]:
        """Every block in address order: used, free and unmapped."""
        return [_block(t) for t in self._pool.blocks()]

    def lookup(self, addr: int) -> Block:
        """The live block containing `addr` (ValueError if none)."""
        return _block(self._pool.lookup(addr))

    def last_oom_report(self) -> str:
        """The report of the last allocation that failed for lack of memory ('' if none)."""
        return str(self._pool.last_oom())

    def report(self) -> str:
        """A readable table of where the memory is."""
        return format_report(self.name, self.stats())


class HostPool(PoolView):
    """A pool over host memory that behaves as a device: for tests, CI and
    trying gpupool without a GPU.  `capacity` caps the bytes mapped at once;
    options are those of enable() (chunk, limit, mode, reserve, ...)."""

    def __init__(self, capacity: int, **options: Any) -> None:
        if capacity <= 0:
            raise ValueError(f"HostPool capacity must be > 0 bytes, got {capacity}")
        super().__init__(_C.Pool(int(capacity), {k: v for k, v in options.items() if v is not None}),
                         "host")

    def alloc(self, size: int, stream: int = 0, tag: Optional[str] = None,
              priority: Optional[object] = None) -> int:
        """Allocate `size` bytes on `stream`; returns the address.  MemoryError
        when the pool is full, ValueError for a bad size, tag or priority."""
        return int(self._pool.alloc(size, stream,
                                    -1 if tag is None else tag_id(tag),
                                    -1 if priority is None else priority_value(priority)))

    def free(self, addr: int) -> None:
        """Free a block; ValueError for an address not allocated (or freed twice)."""
        self._pool.free(addr)


def _block(t: tuple) -> Block:
    addr, size, req, stream, tag, prio, state, arena, life = t
    return Block(addr, size, req, stream, _C.tag_name(tag), prio, _STATES[state], _ARENAS[arena],
                 LIFETIMES[life])


def format_report(name: str, s: Dict[str, Any]) -> str:
    """The table printed by report(): totals, counters, then tags by size."""
    fb = format_bytes
    ratio = s["reserved_peak"] / s["allocated_peak"] if s["allocated_peak"] else 0.0
    lines = [
        f"gpupool {name}: chunk {fb(s['chunk'])}, limit {fb(s['limit']) if s['limit'] else 'none'}, "
        f"device {fb(s['device_total'])}",
        f"{'':12}{'current':>12}{'peak':>12}",
        f"{'allocated':12}{fb(s['allocated']):>12}{fb(s['allocated_peak']):>12}",
        f"{'reserved':12}{fb(s['reserved']):>12}{fb(s['reserved_peak']):>12}",
        f"{'requested':12}{fb(s['requested']):>12}{fb(s['requested_peak']):>12}",
        f"{'blocks':12}{s['active_blocks']:>12}{s['active_blocks_peak']:>12}",
        f"peak reserved / peak allocated {ratio:.3f}; free {fb(s['free_bytes'])} in "
        f"{s['free_blocks']} blocks, largest {fb(s['largest_free'])}; {s['segments']} mapped runs",
        f"allocs {s['n_alloc']}, frees {s['n_free']}, cache hits {100 * s['cache_hit_rate']:.2f}%, "
        f"maps {s['n_map']}, unmaps {s['n_unmap']}, stream waits {s['n_stream_waits']}, "
        f"trims {s['n_trim']}, retries {s['n_alloc_retries']}, OOMs {s['n_oom']}",
    ]
    tags = sorted(s["tags"].items(), key=lambda kv: -kv[1]["allocated_peak"])
    if tags:
        lines.append(f"{'tag':20}{'allocated':>12}{'peak':>12}{'blocks':>9}{'limit':>12}")
        for name_, t in tags:
            lines.append(f"{name_[:20]:20}{fb(t['allocated']):>12}{fb(t['allocated_peak']):>12}"
                         f"{t['active_blocks']:>9}{fb(t['limit']) if t['limit'] else '-':>12}")
    return "\n".join(lines)
