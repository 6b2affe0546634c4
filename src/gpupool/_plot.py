"""``gpupool.plot()``: a PNG timeline of a pool's memory, from its history --
allocated bytes stacked by tag, reserved bytes as a line, the peak of
allocated marked with the tags that held it, OOMs and offloads marked.
Needs matplotlib (the ``[plot]`` extra)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ._pool import PoolView

__all__ = ["plot", "timeline"]

# Distinct colours for the tags (matplotlib's tab10, then tab20's light half).
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78"]


def _device_trace(snap: Dict[str, Any], device: Optional[int]) -> Tuple[int, List[Dict[str, Any]]]:
    traces = snap.get("device_traces", [])
    if device is not None:
        if device >= len(traces) or not traces[device]:
            raise ValueError(f"gpupool.plot: the snapshot has no history for device {device}; "
                             "turn it on with gpupool.record_history() (or GPUPOOL_TRACE=1) "
                             "before the work to plot")
        return device, traces[device]
    have = [d for d, t in enumerate(traces) if t]
    if not have:
        raise ValueError("gpupool.plot: the snapshot has no history; turn it on with "
                         "gpupool.record_history() (or GPUPOOL_TRACE=1) before the work to plot")
    return have[0], traces[have[0]]


def timeline(snap: Dict[str, Any], device: Optional[int] = None) -> Dict[str, Any]:
    """The series plot() draws, from a snapshot with history: ``t`` (seconds
    since the first event), ``tags`` {tag: allocated bytes after each event},
    ``reserved`` and ``allocated`` after each event, the times of ``ooms``,
    ``offloads`` and ``restores``, and ``device``.  The state before the
    first event kept is worked out backwards from the snapshot's blocks, so
    a ring that dropped old events still gives true levels.  A block counts
    under the tag it had at each event (re-tagging moves it at its free)."""
    d, trace = _device_trace(snap, device)
    final: Dict[str, int] = {}
    reserved = 0
    for seg in snap["segments"]:
        if seg["device"] != d:
            continue
        reserved += seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                tag = b.get("tag", "untagged")
                final[tag] = final.get(tag, 0) + b["size"]
    # Net change over the window, to find the levels before it.
    net: Dict[str, int] = {}
    net_reserved = 0
    for e in trace:
        a = e["action"]
        if a == "alloc":
            net[e.get("tag", "untagged")] = net.get(e.get("tag", "untagged"), 0) + e["size"]
        elif a == "free_requested":
            net[e.get("tag", "untagged")] = net.get(e.get("tag", "untagged"), 0) - e["size"]
        elif a == "segment_map":
            net_reserved += e["size"]
        elif a == "segment_unmap":
            net_reserved -= e["size"]
    level = {tag: final.get(tag, 0) - net.get(tag, 0) for tag in set(final) | set(net)}
    res = reserved - net_reserved
    t0 = trace[0]["time_us"]
    t: List[float] = []
    series: Dict[str, List[int]] = {tag: [] for tag in level}
    res_series: List[int] = []
    marks: Dict[str, List[float]] = {"oom": [], "offload": [], "restore": []}
    for e in trace:
        a = e["action"]
        tag = e.get("tag", "untagged")
        if a == "alloc":
            level[tag] += e["size"]
        elif a == "free_requested":
            level[tag] -= e["size"]
        elif a == "segment_map":
            res += e["size"]
        elif a == "segment_unmap":
            res -= e["size"]
        elif a in marks:
            marks[a].append((e["time_us"] - t0) / 1e6)
        t.append((e["time_us"] - t0) / 1e6)
        for k, v in level.items():
            series[k].append(v)
        res_series.append(res)
    allocated = [sum(vals) for vals in zip(*series.values())] if series else [0] * len(t)
    return {"device": d, "t": t, "tags": series, "reserved": res_series, "allocated": allocated,
            "ooms": marks["oom"], "offloads": marks["offload"], "restores": marks["restore"]}


def _unit(n: float) -> Tuple[float, str]:
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= 2 * scale:
            return float(scale), name
    return 1.0, "B"


def plot(path: str, device: Optional[int] = None,
         source: Union[None, "PoolView", Dict[str, Any]] = None, top: int = 8) -> str:
    """Draw allocated memory over time, stacked by tag (the `top` tags with
    the highest peaks; the rest as 'other'), reserved memory as a line, the
    peak of allocated (when, how much, the biggest tags then), OOMs (red
    lines) and offloads/restores (triangles), into the PNG `path`.  From the
    history of a device's pool (`device`, default the current one), of a pool
    (`source`: a HostPool or PoolView), or of a snapshot dict (`source`, e.g.
    a pickle of gpupool.dump_snapshot).  Returns `path`.  ImportError
    without matplotlib; ValueError when there is no history to draw."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("gpupool.plot() needs matplotlib: pip install matplotlib "
                          "(what gpupool's plot extra installs)") from e
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"gpupool.plot: top must be an int >= 1, got {top!r}")
    if source is None:
        from ._history import snapshot  # the device's pool: above this module's layer
        snap = snapshot(device)
        device = None
    elif isinstance(source, dict):
        snap = source
    else:
        snap = source.snapshot(0 if device is None else device)
    tl = timeline(snap, device)
    t = tl["t"]
    ranked = sorted(tl["tags"].items(), key=lambda kv: -max(kv[1], default=0))
    shown = [(k, v) for k, v in ranked[:top] if max(v, default=0) > 0]
    rest = ranked[top:]
    # Steadiest at the bottom (mean / peak over the run: weights, optimizer
    # state), churn on top, so that the layers below do not jump with it.
    shown.sort(key=lambda kv: -sum(kv[1]) / (len(kv[1]) * max(kv[1])))
    if rest:
        shown.append(("other", [sum(x) for x in zip(*(v for _, v in rest))]))
    tscale, tunit = next((s_, u) for s_, u in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))
                         if t[-1] >= 2 * s_ or u == "µs")
    t = [x / tscale for x in t]
    ooms, offloads, restores = ([x / tscale for x in tl[k]] for k in ("ooms", "offloads", "restores"))
    peak_i = max(range(len(t)), key=lambda i: tl["allocated"][i])
    ymax = max(max(tl["reserved"], default=0), max(tl["allocated"], default=0), 1)
    scale, unit = _unit(ymax)

    fig = Figure(figsize=(12, 6), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if shown:
        ax.stackplot(t, *[[x / scale for x in v] for _, v in shown], labels=[k for k, _ in shown],
                     colors=[_COLORS[i % len(_COLORS)] for i in range(len(shown))], step="post",
                     alpha=0.85, linewidth=0)
    ax.step(t, [x / scale for x in tl["reserved"]], where="post", color="black", linewidth=1.6,
            label="reserved")
    # The peak of allocated: when, how much, who held it.
    pt, pv = t[peak_i], tl["allocated"][peak_i] / scale
    holders = sorted(((v[peak_i], k) for k, v in tl["tags"].items() if v[peak_i] > 0), reverse=True)[:3]
    who = ", ".join(f"{k} {v / scale:.2f} {unit}" for v, k in holders)
    ax.plot([pt], [pv], marker="v", color="black", markersize=8, linestyle="none")
    ax.annotate(f"peak allocated {pv:.2f} {unit} at {pt:.3g} {tunit}\n({who})", xy=(pt, pv),
                xytext=(0.02, 0.97), textcoords="axes fraction", va="top", fontsize=9,
                bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"},
                arrowprops={"arrowstyle": "->", "color": "0.3"})
    for i, x in enumerate(ooms):
        ax.axvline(x, color="red", linestyle="--", linewidth=1.2, label="OOM" if i == 0 else None)
    top_y = ymax / scale * 1.02
    if offloads:
        ax.plot(offloads, [top_y] * len(offloads), marker="v", color="purple", linestyle="none",
                label="offload")
    if restores:
        ax.plot(restores, [top_y] * len(restores), marker="^", color="green", linestyle="none",
                label="restore")
    ax.set_xlim(0, max(t[-1], 1e-6))
    ax.set_ylim(0, ymax / scale * 1.08)
    ax.set_xlabel(f"time ({tunit})")
    ax.set_ylabel(unit)
    ax.set_title(f"gpupool, device {tl['device']}: allocated by tag (stacked) and reserved")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    return path
