"""Record a workload's allocation trace on a GPU, replay it on gpupool's host backend.

    python -m benchmarks.trace record trace.txt.gz -- examples/qwen_lora_finetune.py --size 0.5b
    python -m benchmarks.trace replay trace.txt.gz [--option placement=none ...]

``record`` runs a script under PyTorch's native allocator with its memory
history on, and writes every allocation and free the script made, in order:
one line per event, ``a <id> <bytes> <stream>`` or ``f <id>``. ``replay``
feeds that sequence to a :class:`gpupool.HostPool` (no GPU, no torch) and
prints what gpupool would have reserved: peak reserved against peak
allocated, mapped/unmapped chunks, device synchronisations. Placement and
release policies can so be compared on a real workload's trace, in seconds,
on any machine.
"""
from __future__ import annotations

import argparse
import gzip
import os
import runpy
import sys
import time
from typing import Dict, List, Optional, Sequence, TextIO


def record(out: str, script: List[str]) -> int:
    """Run `script` (path and arguments) with the native allocator's history on; write the trace."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=50_000_000, context=None, stacks="python")
    sys.argv = list(script)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))  # as `python script.py` does
    try:
        runpy.run_path(script[0], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snap["device_traces"] for e in trace]
    ids: Dict[int, int] = {}
    n = 0
    with gzip.open(out, "wt") as f:
        for e in events:
            if e["action"] == "alloc":
                ids[e["addr"]] = n
                f.write(f"a {n} {e['size']} {e['stream']}\n")
                n += 1
            elif e["action"] == "free_requested" and e["addr"] in ids:
                f.write(f"f {ids.pop(e['addr'])}\n")
    print(f"wrote {n} allocations to {out} ({len(ids)} still live at the end)")
    return 0


def replay(path: str, options: Dict[str, str], capacity: int) -> Dict[str, float]:
    """Replay the trace at `path` on a HostPool; returns its figures."""
    import gpupool

    pool = gpupool.HostPool(capacity=capacity, **options)
    live: Dict[int, int] = {}
    streams: Dict[int, int] = {}
    t0 = time.perf_counter()
    f: TextIO
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if parts[0] == "a":
                s = streams.setdefault(int(parts[3]), len(streams))
                live[int(parts[1])] = pool.alloc(int(parts[2]), stream=s)
            else:
                pool.free(live.pop(int(parts[1])))
    seconds = time.perf_counter() - t0
    s = pool.stats()
    return {"peak_allocated": s["allocated_peak"], "peak_reserved": s["reserved_peak"],
            "reserved_over_allocated": s["reserved_peak"] / max(1, s["allocated_peak"]),
            "n_alloc": s["n_alloc"], "n_map": s["n_map"], "n_unmap": s["n_unmap"], "n_sync": s["n_sync"],
            "seconds": seconds}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The two commands."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run a script on the GPU and write its allocation trace")
    r.add_argument("out", help="trace file to write (.gz)")
    r.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py args...")
    q = sub.add_parser("replay", help="replay a trace on the host backend")
    q.add_argument("trace", help="trace file (.gz)")
    q.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a pool option, as for gpupool.enable() (repeatable)")
    q.add_argument("--capacity", default=str(80 << 30), help="device size to pretend (bytes; default 80 GiB)")
    args = p.parse_args(argv)
    if args.cmd == "record":
        script = args.script[1:] if args.script[:1] == ["--"] else args.script
        if not script:
            p.error("record needs a script: record OUT -- script.py args...")
        return record(args.out, script)
    options = {}
    for kv in args.option:
        key, sep, value = kv.partition("=")
        if not sep:
            p.error(f"--option takes KEY=VALUE, got {kv!r}")
        options[key] = value
    res = replay(args.trace, options, int(args.capacity))
    gib = 2.0**30
    print(f"peak allocated {res['peak_allocated'] / gib:.2f} GiB, peak reserved {res['peak_reserved'] / gib:.2f} GiB "
          f"(x{res['reserved_over_allocated']:.3f}); {res['n_alloc']} allocations, {res['n_map']} maps, "
          f"{res['n_unmap']} unmaps, {res['n_sync']} device syncs; replayed in {res['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
