"""Summarise a torch profiler Chrome trace: does the offloader's traffic run under compute?

    python -m benchmarks.timeline trace.json [--width 100]
    python -m benchmarks.timeline a.json --against b.json [--top 25]

``examples/qwen_lora_finetune.py --trace trace.json`` records one. For each
step (the ``step N`` ranges the example marks) it prints the step's span on
the device, how long the compute stream (the stream with the most kernel
time) was busy, the device-to-host and host-to-device copies (bytes, time,
and how much of that time the compute stream was busy too), the compute
stream's idle gaps over 1 ms with the host ranges of gpupool's hooks
(``gpupool.*``) under way then, and a bar per stream kind:

    compute  ####################.####################
    d2h      ....>>>>>>>>>>...........................
    h2d      ......................<<<<<<<<<<<<.......

One column is 1/width of the step; a mark means busy for part of it.

``--against`` compares the device's work of two traces of the same steps
(say the example under two allocators): the kernels each ran and their
time on the device in all, then the kernels whose time differs most.
Where the counts and the times match, what separates the two runs is not
the device's work.
"""
from __future__ import annotations

import argparse
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

Span = Tuple[float, float]  # [start, end) in microseconds


def union(spans: Sequence[Span]) -> List[Span]:
    """The spans merged where they overlap, in order."""
    out: List[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: Sequence[Span]) -> float:
    return sum(b - a for a, b in spans)


def clip(spans: Sequence[Span], lo: float, hi: float) -> List[Span]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def overlap(x: Sequence[Span], y: Sequence[Span]) -> float:
    """Time both unions cover (each merged first)."""
    x, y = union(x), union(y)
    i = j = 0
    t = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            t += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return t


def gaps(spans: Sequence[Span], lo: float, hi: float, least: float) -> List[Span]:
    """Stretches of [lo, hi) no span covers, of `least` us or more."""
    out, at = [], lo
    for a, b in union(clip(spans, lo, hi)):
        if a - at >= least:
            out.append((at, a))
        at = max(at, b)
    if hi - at >= least:
        out.append((at, hi))
    return out


def bar(spans: Sequence[Span], lo: float, hi: float, width: int, mark: str) -> str:
    cols = ["."] * width
    w = (hi - lo) / width
    for a, b in clip(spans, lo, hi):
        for c in range(int((a - lo) / w), min(width, int((b - lo) / w) + 1)):
            cols[c] = mark
    return "".join(cols)


def load(path: str) -> Dict[str, Any]:
    """The trace's events, sorted into what the summary needs."""
    with open(path) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    kernels: Dict[Any, List[Span]] = {}
    by_name: Dict[str, List[float]] = {}  # kernel name -> [count, microseconds]
    copies: Dict[str, List[Tuple[float, float, int]]] = {"d2h": [], "h2d": []}
    steps: Dict[str, List[Span]] = {}
    hooks: List[Tuple[str, float, float]] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cat == "kernel":
            kernels.setdefault(e.get("args", {}).get("stream", e.get("tid")), []).append(span)
            tally = by_name.setdefault(name, [0, 0.0])
            tally[0] += 1
            tally[1] += span[1] - span[0]
        elif cat == "gpu_memcpy":
            kind = "d2h" if "DtoH" in name else "h2d" if "HtoD" in name else None
            if kind:
                copies[kind].append((*span, int(e.get("args", {}).get("bytes", 0))))
        elif re.fullmatch(r"step \d+", name) and cat in ("gpu_user_annotation", "user_annotation"):
            # The device's range where the trace has one (the host runs ahead).
            if cat == "gpu_user_annotation" or name not in steps:
                steps[name] = [span]
        elif name.startswith("gpupool.") and cat == "user_annotation":
            hooks.append((name, *span))
    if not kernels:
        raise SystemExit(f"{path}: no kernels in the trace (was it recorded with the CUDA activity?)")
    compute = max(kernels, key=lambda s: length(union(kernels[s])))
    return {"compute": union(kernels[compute]), "stream": compute, "copies": copies, "steps": steps, "hooks": hooks,
            "by_name": by_name}


def compare(a: Dict[str, Any], b: Dict[str, Any], top: int = 25, names: Tuple[str, str] = ("a", "b")) -> str:
    """The kernels of traces `a` and `b` (of `load`): count and device time of
    each, then the `top` kernels whose time differs most (ms in a, in b, b - a)."""
    out = []
    for label, t in zip(names, (a, b)):
        n = sum(c for c, _ in t["by_name"].values())
        us = sum(d for _, d in t["by_name"].values())
        out.append(f"{label}: {n} kernels, {us / 1e3:.1f} ms on the device")

    def us(t: Dict[str, Any], k: str) -> float:
        return t["by_name"].get(k, (0, 0.0))[1]

    ks = sorted(set(a["by_name"]) | set(b["by_name"]), key=lambda k: (-abs(us(b, k) - us(a, k)), k))[:top]
    out.append(f"kernels whose time differs most (ms in {names[0]}, in {names[1]}, difference; count in each):")
    for k in ks:
        ca, cb = a["by_name"].get(k, (0, 0.0))[0], b["by_name"].get(k, (0, 0.0))[0]
        out.append(f"  {us(a, k) / 1e3:9.2f} {us(b, k) / 1e3:9.2f} {(us(b, k) - us(a, k)) / 1e3:+8.2f}  "
                   f"{ca}/{cb}  {k[:100]}")
    return "\n".join(out)


def summarize(t: Dict[str, Any], width: int = 100) -> str:
    """The text the command prints."""
    out = [f"compute stream: {t['stream']}"]
    names = sorted(t["steps"], key=lambda n: int(n.split()[1]))
    starts = [min(a for a, _ in t["steps"][n]) for n in names]
    # A step on the device: from its first kernel to the next step's first
    # (the last: to the last kernel or copy).
    ends_all = max(b for _, b in t["compute"])
    for k, name in enumerate(names):
        lo = max(starts[k], 0.0)
        first = [a for a, _ in t["compute"] if a >= lo]
        if not first:
            continue
        lo = first[0]
        nxt: Optional[float] = None
        if k + 1 < len(names):
            later = [a for a, _ in t["compute"] if a >= starts[k + 1]]
            nxt = later[0] if later else None
        hi = nxt if nxt is not None else ends_all
        busy = length(clip(t["compute"], lo, hi))
        out.append(f"\n{name}: {(hi - lo) / 1e3:.1f} ms on the device, compute stream busy {busy / 1e3:.1f} ms "
                   f"({100 * busy / (hi - lo):.0f}%)")
        for kind in ("d2h", "h2d"):
            cs = [(a, b) for a, b, _ in t["copies"][kind] if a < hi and b > lo]
            if not cs:
                continue
            nbytes = sum(n for a, b, n in t["copies"][kind] if a < hi and b > lo)
            u = union(clip(cs, lo, hi))
            under = overlap(u, clip(t["compute"], lo, hi))
            out.append(f"  {kind}: {nbytes / 1e9:.2f} GB in {length(u) / 1e3:.1f} ms "
                       f"({u[0][0] / 1e3 - lo / 1e3:.1f}..{u[-1][1] / 1e3 - lo / 1e3:.1f} ms into the step), "
                       f"{100 * under / max(length(u), 1e-9):.0f}% of it under compute")
        for a, b in gaps(t["compute"], lo, hi, 1000.0):
            during = sorted({n for n, x, y in t["hooks"] if x < b and y > a - 5000.0})
            out.append(f"  compute idle {(b - a) / 1e3:.1f} ms at {(a - lo) / 1e3:.1f} ms"
                       f"{' (host: ' + ', '.join(during) + ')' if during else ''}")
        out.append(f"  compute  {bar(t['compute'], lo, hi, width, '#')}")
        for kind, mark in (("d2h", ">"), ("h2d", "<")):
            out.append(f"  {kind:8s} {bar([(a, b) for a, b, _ in t['copies'][kind]], lo, hi, width, mark)}")
    for name in sorted({n for n, _, _ in t["hooks"]}):
        ds = [(b - a) / 1e3 for n, a, b in t["hooks"] if n == name]
        out.append(f"host {name}: {len(ds)} calls, {sum(ds):.2f} ms in all, longest {max(ds):.2f} ms")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a Chrome trace of torch.profiler (export_chrome_trace)")
    p.add_argument("--width", type=int, default=100, help="columns of a step's bars (default: 100)")
    p.add_argument("--against", metavar="TRACE", help="compare the kernels of the trace with this one's")
    p.add_argument("--top", type=int, default=25, help="with --against: the kernels listed (default: 25)")
    a = p.parse_args(argv)
    if a.top < 0:
        p.error(f"--top {a.top}: a count of kernels, 0 or more")
    if a.against:
        print(compare(load(a.trace), load(a.against), a.top, (a.trace, a.against)))
    else:
        print(summarize(load(a.trace), a.width))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
