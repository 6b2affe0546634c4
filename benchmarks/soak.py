"""Soak worker: offload/restore cycles of one tag for ever (1,000 by default).

    python -m benchmarks.soak --mode gpupool --gib 1 --cycles 1000 --json out.json

A tag of `--gib` GiB of bf16 N(0, 1) tensors of mixed sizes (1 KiB .. 64 MiB,
log-uniform) and an offloadable ``nn.Module`` (its forward runs between
cycles, so its hooks restore it, and it is offloaded again after).  Every
cycle checks every bit of the tag against a copy kept on the device, and the
module's output against its first.  The figures -- the pool's reserved bytes,
pinned host slabs, host RSS, open file descriptors and threads -- are taken
after every cycle; the goals compare cycle 2 with the last (reserved, pinned,
fds and threads exactly; RSS within 16 MiB).  gpupool modes only.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any, Dict, List

from .modes import GPUPOOL_MODES, install

MIB = 2**20
RSS_SLACK = 16 * MIB


def figures(torch: Any, gpupool: Any) -> Dict[str, int]:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"reserved": int(gpupool.stats()["reserved"]),
            "pinned": int(gpupool.device_pool()._pool.offload_stats(False)["host_slabs"]),
            "rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "device_free": int(torch.cuda.mem_get_info()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="gpupool", choices=GPUPOOL_MODES)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--codec", default=None, help="offload codec (default: GPUPOOL_CODEC, auto)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    install(args.mode)
    import torch
    import gpupool

    torch.manual_seed(0)
    rng = random.Random(0)
    gpupool.device_pool()._pool.offload_stats(True)  # the offloader first (its 1 MiB of checksums)
    tensors: List[Any] = []
    total, want = 0, int(args.gib * 2**30)
    with gpupool.tag("soak", lifetime="long"):
        while total < want:
            n = min(int(2 ** rng.uniform(10, 26)), want - total) // 2 * 2 or 2
            tensors.append(torch.randn(n // 2, device="cuda", dtype=torch.bfloat16))
            total += n
    with gpupool.tag("soak_ref"):
        refs = [t.clone() for t in tensors]  # on the device: the check costs no copy
        x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    module = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                 torch.nn.Linear(4096, 4096)).cuda().to(torch.bfloat16)
    handle = gpupool.offloadable(module, "soak_module")
    with torch.no_grad():
        y0 = module(x).clone()
    ptrs = [t.data_ptr() for t in tensors]
    torch.cuda.synchronize()
    per: List[Dict[str, int]] = []
    bad_cycles: List[int] = []
    t0 = time.perf_counter()
    for c in range(1, args.cycles + 1):
        handle.offload()
        gpupool.offload("soak", codec=args.codec, dtype=torch.bfloat16)
        gpupool.restore("soak")
        with torch.no_grad():
            y = module(x)  # its hook restores it
        # Every bit: one flag on the device, one sync.
        diff = torch.zeros((), dtype=torch.int64, device="cuda")
        for t, r in zip(tensors, refs):
            diff += (t.view(torch.int16) != r.view(torch.int16)).sum()
        diff += (y.view(torch.int16) != y0.view(torch.int16)).sum()
        if int(diff.item()) or [t.data_ptr() for t in tensors] != ptrs:
            bad_cycles.append(c)
        del y, diff
        per.append(figures(torch, gpupool))
        if c in (1, 2, 10, 100) or c % 250 == 0:
            f = per[-1]
            print(f"cycle {c:5d}: {time.perf_counter() - t0:7.1f} s  reserved {f['reserved'] / MIB:.1f} MiB  "
                  f"pinned {f['pinned'] / MIB:.1f} MiB  RSS {f['rss'] / MIB:.1f} MiB  fds {f['fds']}  "
                  f"threads {f['threads']}  device free {f['device_free'] / MIB:.1f} MiB", flush=True)
    seconds = time.perf_counter() - t0
    at2, last = per[1], per[-1]
    later = per[1:]
    flat = {k: len({f[k] for f in later}) == 1 for k in ("reserved", "pinned", "fds", "threads")}
    flat["rss"] = max(f["rss"] for f in later) - at2["rss"] <= RSS_SLACK
    out = {"workload": "soak", "mode": args.mode, "cycles": args.cycles, "tag_bytes": total,
           "tensors": len(tensors), "module_bytes": sum(q.numel() * q.element_size() for q in module.parameters()),
           "seconds": seconds, "seconds_per_cycle": seconds / args.cycles, "bad_cycles": bad_cycles[:20],
           "n_bad": len(bad_cycles), "at2": at2, "last": last,
           "max_later": {k: max(f[k] for f in later) for k in at2},
           "min_later": {k: min(f[k] for f in later) for k in at2}, "flat": flat,
           "peak_allocated": int(gpupool.stats()["allocated_peak"]),
           "peak_reserved": int(gpupool.stats()["reserved_peak"])}
    print(json.dumps({k: out[k] for k in ("cycles", "tensors", "tag_bytes", "seconds_per_cycle", "n_bad", "flat")}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
