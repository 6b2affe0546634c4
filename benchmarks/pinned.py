"""Pinned host memory of an offload against the bytes it stores (gpupool only).

    python -m benchmarks.pinned --block-mib 12 --codec raw
    python -m benchmarks.pinned --block-mib 12 --codec auto

One tag of 1 GiB of bf16 N(0, 0.02) weights in blocks of ``--block-mib``
(blocks that do not divide the 32 MiB pinned slabs are the hard case),
offloaded and restored ``--cycles`` times in a fresh process.  Per cycle:
the host bytes the offload stores, the pinned slabs the offloader holds,
the growth of the process's resident memory, and both directions' GB/s.
PyTorch has no counterpart (a user's pinned copy pins exactly the raw
bytes), so this is not one of the side-by-side workloads of
``python -m benchmarks``.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List

from .offload import rss

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block-mib", type=int, default=12, help="size of each tensor, MiB (default 12)")
    p.add_argument("--codec", default="raw", help="gpupool.offload codec (default raw)")
    p.add_argument("--gib", type=float, default=1.0, help="size of the tag, GiB (default 1)")
    p.add_argument("--cycles", type=int, default=3)
    a = p.parse_args()
    import gpupool

    gpupool.enable()
    import torch

    size = a.block_mib * MIB
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    with gpupool.tag("weights"):
        ts = [torch.randn(size // 2, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
              for _ in range(int(a.gib * 2**30) // size)]
    torch.cuda.synchronize()
    before = [t.clone() for t in ts[:4]] + [t.clone() for t in ts[-4:]]
    rows: List[Dict[str, Any]] = []
    for _ in range(a.cycles):
        r0 = rss()
        t0 = time.perf_counter()
        info = gpupool.offload("weights", codec=a.codec, dtype=torch.bfloat16)
        t1 = time.perf_counter()
        r1 = rss()
        slabs = gpupool.stats()["offload"]["host_slabs"]
        t2 = time.perf_counter()
        gpupool.restore("weights")
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        rows.append({"codec": info["codec"], "host_bytes_mib": round(info["host_bytes"] / MIB, 1),
                     "pinned_mib": round(slabs / MIB, 1),
                     "pinned_over_host_mib": round((slabs - info["host_bytes"]) / MIB, 1),
                     "rss_grew_mib": round((r1 - r0) / MIB, 1),
                     "offload_gbps": round(info["bytes"] / (t1 - t0) / 1e9, 1),
                     "restore_gbps": round(info["bytes"] / (t3 - t2) / 1e9, 1)})
    same = all(torch.equal(x, y) for x, y in zip(before, ts[:4] + ts[-4:]))
    print(json.dumps({"block_mib": a.block_mib, "tensors": len(ts), "same_bytes": same, "cycles": rows}))


if __name__ == "__main__":
    main()
