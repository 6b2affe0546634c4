"""The pool view shared by device pools and host pools: typed accessors over
gpupool._C.Pool, statistics as dicts and the readable report."""
from __future__ import annotations

import operator
from typing import Any, Dict, Iterable, List, NamedTuple, Optional

from . import _C
from ._context import LIFETIMES, Priority, priority_value, tag_id
from ._report import format_bytes, format_report
from ._snapshot import pool_snapshot

__all__ = ["Block", "PoolView", "HostPool", "PoolCorruptError", "format_bytes"]

# pending: waits for record_stream events; offloaded: live, its memory on the
# host; free_offloaded: free space inside an offloaded run; transit: chunks a
# background thread maps or unmaps now (indexed by GP_BLOCK_*)
_STATES = ("unmapped", "free", "used", "pending", "offloaded", "free_offloaded", "transit")
_ARENAS = ("small", "large")


class Block(NamedTuple):
    """One block of a pool, as snapshots and `blocks()` list it."""

    addr: int
    size: int
    requested: int
    stream: int
    tag: str
    priority: int
    state: str   # "used", "free", "unmapped", "pending", "offloaded", "free_offloaded" or "transit"
    arena: str   # "small" or "large"
    lifetime: str  # region of the arena it lies in: "short" or "long" (placement)


class PoolCorruptError(RuntimeError):
    """A pool's integrity check (`PoolView.check`, `gpupool.check`) found
    its bookkeeping inconsistent; the message names the first problem."""

    def __init__(self, pool: str, problems: int, first: str) -> None:
        super().__init__(f"gpupool: the pool of {pool} is corrupt: {problems} problem(s), the first: {first}")
        self.problems = problems
        self.first = first


class PoolView:
    """Typed access to one gpupool pool (a device's, or a HostPool)."""

    def __init__(self, pool: "_C.Pool", name: str, settings: Optional[Dict[str, str]] = None) -> None:
        self._pool = pool
        self.name = name
        self._settings = settings

    def settings(self) -> Dict[str, str]:
        """The options this pool was made with (the process's configuration
        for device pools), as text."""
        return dict(_C.config()) if self._settings is None else dict(self._settings)

    def stats(self) -> Dict[str, Any]:
        """All figures: allocated, reserved, active (allocated + freed blocks
        waiting for record_stream streams), their peaks, counts, cache hit
        rate, driver calls (maps + unmaps + device syncs + host waits for
        the pool's own streams), mapped runs ('segments'), the largest free
        block, fragmentation (share of free mapped bytes outside the largest
        free block), offloaded bytes and the host bytes holding them
        ('host_bytes'; 'offload': the offloader's figures, None before any
        offload), the history's state, per tag ('tags') and per priority
        ('priorities')."""
        s: Dict[str, Any] = self._pool.stats(True)  # one copy, under one hold of the lock
        n = s["n_alloc"]
        s["cache_hit_rate"] = s["cache_hits"] / n if n else 1.0
        s["fragmentation"] = 1.0 - s["largest_free"] / s["free_bytes"] if s["free_bytes"] else 0.0
        s["active"] = s["allocated"] + s["pending"]
        s["driver_calls"] = s["n_map"] + s["n_unmap"] + s["n_sync"] + s["n_sync_pool"]
        # Offload's figures (an offloader exists once something offloaded or
        # registered; its own lock): host bytes of the pool and per tag.
        off = self._pool.offload_stats()
        s["host_bytes"] = off["host_bytes"] if off else 0
        s["offload"] = off
        for name, t in s["tags"].items():
            t["host_bytes"] = off["tags"].get(name, {}).get("host_bytes", 0) if off else 0
        return s

    def check(self) -> None:
        """Check the pool's integrity (every block, bin and figure, as
        tlsf_check checks a heap) and, when it has an offloader, the
        offloader's (its records and the host store).  Returns None when all
        is consistent; raises PoolCorruptError naming the first problem
        otherwise.  It walks every block under the pool's lock: a debugging
        aid, not something to call every step."""
        problems, first = self._pool.check()
        if problems:
            raise PoolCorruptError(self.name, int(problems), str(first))

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

    def record_history(self, enabled: bool = True, max_entries: int = _C.HISTORY_DEFAULT,
                       stacks: bool = True) -> None:
        """Keep the newest `max_entries` alloc/free/map/unmap/OOM events (with
        the Python stack of each call when `stacks`); enabled=False stops
        and drops them.  See gpupool.record_history."""
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries <= 0:
            raise ValueError(f"record_history: max_entries must be an int > 0, got {max_entries!r}")
        self._pool.set_history(max_entries if enabled else 0, bool(stacks))

    def snapshot(self, device: int = 0) -> Dict[str, Any]:
        """Segments, blocks and history in the format of
        torch.cuda.memory._snapshot(), filed under device index `device`."""
        return pool_snapshot(self, device, self.settings())

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
        # An integer number of bytes: int(1.5) once made a 1-byte pool.
        if isinstance(capacity, bool) or not hasattr(capacity, "__index__"):
            raise TypeError(f"HostPool capacity must be an integer number of bytes (e.g. 1 << 30), "
                            f"got {capacity!r} ({type(capacity).__name__})")
        nbytes = operator.index(capacity)
        if nbytes <= 0:
            raise ValueError(f"HostPool capacity must be > 0 bytes, got {nbytes}")
        opts = {k: v for k, v in options.items() if v is not None}
        super().__init__(_C.Pool(nbytes, opts), "host", {k: str(v) for k, v in opts.items()})

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

