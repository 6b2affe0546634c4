"""Offload benchmark worker: move a tag of bf16 weights to host memory and back.

    python -m benchmarks.offload --mode gpupool --gib 1,8 --cycles 3 --json out.json

For each size the weights are tensors of 64 MiB of bf16 N(0, 0.02) (a
transformer's layers).  In the same process, first the yardstick: pinned
copies of the same bytes between device and host buffers that exist already
(the PCIe limit as PyTorch sees it).  Then `--cycles` offload/restore cycles:

* gpupool: ``gpupool.offload(tag)`` / ``gpupool.restore(tag)``; the tensors
  keep their addresses (``data_ptr``) and bytes, which is checked.
* a PyTorch allocator mode: what a PyTorch user does without gpupool -- copy
  each tensor into a pinned host buffer kept from one cycle to the next,
  free the device tensors and ``empty_cache()``; then new device tensors and
  copies back (new addresses).

Per cycle it records the wall time of each direction (synchronised), the
device's free memory before and after (``mem_get_info``), the process's
resident host memory, and for gpupool its pinning count.  The JSON's headline
``offload_gbps`` is the largest size's median offload bandwidth; the ratios
to the pinned copies are what the issue's goals are stated in.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Dict, List

from .modes import GPUPOOL_MODES, MODES, install

GIB = 2**30
PIECE = 64 * 2**20


def rss() -> int:
    """Resident host memory of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def checksum(torch: Any, ts: List[Any]) -> List[int]:
    """Per tensor, a sum of its bits (as int16) weighted by position: any byte
    that changes, changes it."""
    out = []
    for t in ts:
        v = t.view(torch.int16).to(torch.int64)
        w = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
        out.append(int((v * w).sum().item()))
    return out


def pinned_copy(torch: Any, nbytes: int, reps: int = 3) -> Dict[str, float]:
    """GB/s of device->host and host->device copies of `nbytes` in PIECE-sized
    copies between buffers that exist already (median of `reps`)."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h, h2d = [], []
    for _ in range(reps + 1):  # the first warms up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for o in range(0, nbytes, PIECE):
            host[o:o + PIECE].copy_(dev[o:o + PIECE], non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for o in range(0, nbytes, PIECE):
            dev[o:o + PIECE].copy_(host[o:o + PIECE], non_blocking=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        d2h.append(nbytes / (t1 - t0) / 1e9)
        h2d.append(nbytes / (t2 - t1) / 1e9)
    del dev, host
    torch.cuda.empty_cache()
    return {"pinned_d2h_gbps": statistics.median(d2h[1:]), "pinned_h2d_gbps": statistics.median(h2d[1:])}


def run_size(torch: Any, mode: str, gib: float, cycles: int) -> Dict[str, Any]:
    import gpupool

    nbytes = int(gib * GIB) // PIECE * PIECE
    res: Dict[str, Any] = {"gib": gib, **pinned_copy(torch, nbytes)}
    use_gpupool = mode in GPUPOOL_MODES
    tag = f"weights_{gib:g}g"
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    if use_gpupool:
        gpupool.device_pool()._pool.offload_stats(True)  # the offloader first: it takes 1 MiB for checksums
        with gpupool.tag(tag):
            ts = [torch.randn(PIECE // 2, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
                  for _ in range(nbytes // PIECE)]
    else:
        ts = [torch.randn(PIECE // 2, dtype=torch.bfloat16, device="cuda", generator=g) * 0.02
              for _ in range(nbytes // PIECE)]
    torch.cuda.synchronize()
    sums = checksum(torch, ts)
    ptrs = [t.data_ptr() for t in ts]
    hosts = None
    rows = []
    for _ in range(cycles):
        row: Dict[str, Any] = {}
        free0 = torch.cuda.mem_get_info()[0]
        rss0 = rss()
        pins0 = (gpupool.stats().get("offload") or {}).get("n_pin", 0) if use_gpupool else 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if use_gpupool:
            info = gpupool.offload(tag)
            row.update(host_bytes=info["host_bytes"], bytes=info["bytes"], released=info["released"])
        else:
            if hosts is None:  # pinned once, kept: the fair version of the user's loop
                hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in ts]
            for h, t in zip(hosts, ts):
                h.copy_(t, non_blocking=True)
            torch.cuda.synchronize()
            ts = []
            torch.cuda.empty_cache()
            row.update(host_bytes=nbytes, bytes=nbytes, released=nbytes)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        free1 = torch.cuda.mem_get_info()[0]
        rss1 = rss()
        t2 = time.perf_counter()
        if use_gpupool:
            gpupool.restore(tag)
        else:
            ts = [torch.empty(h.shape, dtype=h.dtype, device="cuda") for h in hosts]
            for h, t in zip(hosts, ts):
                t.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        pins1 = (gpupool.stats().get("offload") or {}).get("n_pin", 0) if use_gpupool else 0
        row.update(offload_s=t1 - t0, restore_s=t3 - t2, offload_gbps=nbytes / (t1 - t0) / 1e9,
                   restore_gbps=nbytes / (t3 - t2) / 1e9, device_freed=free1 - free0, rss_grew=rss1 - rss0,
                   pins=pins1 - pins0)
        row["same_ptrs"] = [t.data_ptr() for t in ts] == ptrs
        row["same_bytes"] = checksum(torch, ts) == sums
        rows.append(row)
    res["cycles"] = rows
    later = rows[1:] or rows  # the first cycle pins; the goals are about the steady state
    for k in ("offload_gbps", "restore_gbps"):
        res[k] = statistics.median(r[k] for r in later)
    res["offload_vs_pinned"] = res["offload_gbps"] / res["pinned_d2h_gbps"]
    res["restore_vs_pinned"] = res["restore_gbps"] / res["pinned_h2d_gbps"]
    res["same_bytes"] = all(r["same_bytes"] for r in rows)
    res["same_ptrs"] = all(r["same_ptrs"] for r in rows)
    res["pins_after_first"] = sum(r["pins"] for r in rows[1:])
    # The first cycle also pins the host slabs, for which the driver keeps a
    # little device memory: reported apart from the steady state.
    res["first_device_freed_minus_bytes"] = rows[0]["device_freed"] - rows[0]["bytes"]
    res["min_device_freed_minus_bytes"] = min(r["device_freed"] - r["bytes"] for r in later)
    res["max_rss_over_host_bytes"] = max(r["rss_grew"] - r["host_bytes"] for r in rows[:1])
    res["max_rss_grew_later"] = max((r["rss_grew"] for r in rows[1:]), default=0)
    del ts
    torch.cuda.empty_cache()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--gib", default="1,8", help="comma-separated sizes of the tag, GiB (default 1,8)")
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    install(a.mode)
    import torch

    sizes = [float(x) for x in a.gib.split(",") if x]
    results = [run_size(torch, a.mode, s, a.cycles) for s in sizes]
    out = {"mode": a.mode, "sizes": results, "offload_gbps": results[-1]["offload_gbps"],
           "restore_gbps": results[-1]["restore_gbps"]}
    from .modes import peak_memory

    out["peak_allocated"], out["peak_reserved"] = peak_memory(a.mode)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "cycles"}))


if __name__ == "__main__":
    main()
