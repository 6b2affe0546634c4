"""The readable report of a pool (``gpupool.report()``): totals with their
peaks, counters, then where the memory is by tag and by priority."""
from __future__ import annotations

from typing import Any, Dict

from ._context import priority_name

__all__ = ["format_bytes", "format_report"]


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    v, u = float(n), 0
    while abs(v) >= 1024 and u < len(units) - 1:
        v /= 1024
        u += 1
    return f"{v:.0f} {units[u]}" if u == 0 else f"{v:.2f} {units[u]}"


def format_report(name: str, s: Dict[str, Any]) -> str:
    """The table printed by report(), from a ``stats()`` dict: totals and
    peaks, fragmentation, counters (driver calls included), then the tags by
    peak (with their share of the pool's peak) and the priorities."""
    fb = format_bytes
    ratio = s["reserved_peak"] / s["allocated_peak"] if s["allocated_peak"] else 0.0
    lines = [
        f"gpupool {name}: chunk {fb(s['chunk'])}, limit {fb(s['limit']) if s['limit'] else 'none'}, "
        f"device {fb(s['device_total'])}",
        f"{'':12}{'current':>12}{'peak':>12}",
        f"{'allocated':12}{fb(s['allocated']):>12}{fb(s['allocated_peak']):>12}",
        f"{'reserved':12}{fb(s['reserved']):>12}{fb(s['reserved_peak']):>12}",
        f"{'active':12}{fb(s['active']):>12}{'':>12}",
        f"{'requested':12}{fb(s['requested']):>12}{fb(s['requested_peak']):>12}",
        f"{'blocks':12}{s['active_blocks']:>12}{s['active_blocks_peak']:>12}",
        f"peak reserved / peak allocated {ratio:.3f}; free {fb(s['free_bytes'])} in "
        f"{s['free_blocks']} blocks, largest {fb(s['largest_free'])} "
        f"(fragmentation {100 * s['fragmentation']:.1f}%); {s['segments']} mapped runs",
        f"allocs {s['n_alloc']}, frees {s['n_free']}, cache hits {100 * s['cache_hit_rate']:.2f}%, "
        f"driver calls {s['driver_calls']} (maps {s['n_map']}, unmaps {s['n_unmap']}, device syncs "
        f"{s['n_sync']}, waits for the pool's streams {s['n_sync_pool']}), stream waits "
        f"{s['n_stream_waits']}, trims {s['n_trim']} ({s['n_trim_idle']} with no wait), "
        f"retries {s['n_alloc_retries']}, OOMs {s['n_oom']}",
        f"allocating threads waited {s['ns_lock_wait'] / 1e6:.1f} ms for the lock and spent "
        f"{s['ns_slow'] / 1e6:.1f} ms past the cache (growth, trims, syncs, pressure)",
    ]
    if s["offloaded"] or s["pending"]:
        lines.append(f"offloaded to host {fb(s['offloaded'])} (in {fb(s.get('host_bytes', 0))} of host memory); "
                     f"freed, waiting for streams {fb(s['pending'])}")
    tags = sorted(s["tags"].items(), key=lambda kv: (-kv[1]["allocated_peak"], kv[0]))
    if tags:
        peak = s["allocated_peak"] or 1
        lines.append(f"{'tag':24}{'allocated':>12}{'peak':>12}{'of peak':>9}{'blocks':>9}"
                     f"{'allocs':>10}{'limit':>12}{'offloaded':>12}")
        for tag, t in tags:
            short = tag if len(tag) <= 24 else tag[:23] + "~"
            lines.append(f"{short:24}{fb(t['allocated']):>12}{fb(t['allocated_peak']):>12}"
                         f"{100 * t['allocated_peak'] / peak:>8.1f}%{t['active_blocks']:>9}"
                         f"{t['n_alloc']:>10}{fb(t['limit']) if t['limit'] else '-':>12}"
                         f"{fb(t['offloaded']) if t.get('offloaded') else '-':>12}")
    prios = sorted(s["priorities"].items())
    if prios:
        lines.append(f"{'priority':24}{'allocated':>12}{'peak':>12}")
        for p, v in prios:
            lines.append(f"{priority_name(p):24}{fb(v['allocated']):>12}{fb(v['allocated_peak']):>12}")
    h = s["history"]
    if h["max_entries"]:
        lines.append(f"history: {h['len']} of {h['max_entries']} events kept ({h['recorded']} recorded), "
                     f"stacks {'on' if h['stacks'] else 'off'}")
    return "\n".join(lines)
