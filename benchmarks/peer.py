"""Copies between the GPUs of one process: what the first one costs on a full device, and their rate.

    python -m benchmarks.peer --mode gpupool --gib 40 --json out.json

Device 0 is filled with --gib GiB of --tensor-mib MiB tensors. The first
copy from device 1 to device 0 is timed: PyTorch asks the allocator for
device 1's access to device 0's memory before it (gpupool then sets that
access on every mapping device 0 holds; PyTorch's own modes enable the
contexts' peer access). Then copies of --copy-mib MiB each way are timed
(median of --copies), and device 0's allocations are freed down to half,
the cache emptied and the half allocated again: every new mapping now
carries the peer's access too (gpupool), so its cost per tensor is
compared with the fill's. The first copy, the last of each way and a tensor
mapped after them are checked whole. Needs two CUDA devices.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .modes import MODES, install, peak_memory, report


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; parsing needs neither torch nor CUDA."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True, help="allocator mode")
    p.add_argument("--gib", type=float, default=40.0, help="GiB device 0 holds before the first copy (default: 40)")
    p.add_argument("--tensor-mib", type=float, default=2.0, help="size of each of those tensors (default: 2 MiB)")
    p.add_argument("--copy-mib", type=float, default=1024.0, help="size of the timed copies (default: 1024 MiB)")
    p.add_argument("--copies", type=int, default=5, help="timed copies each way (default: 5)")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.gib <= 0 or args.tensor_mib <= 0 or args.copy_mib <= 0 or args.copies < 1:
        p.error("--gib, --tensor-mib, --copy-mib and --copies must be positive")
    if args.tensor_mib * 2**20 > args.gib * 2**30:
        p.error("--tensor-mib must not exceed --gib")
    return args


def fill(torch: Any, n: int, nbytes: int) -> List[Any]:
    """`n` uint8 tensors of `nbytes` on device 0."""
    return [torch.empty(nbytes, dtype=torch.uint8, device="cuda:0") for _ in range(n)]


def timed(torch: Any, fn: Any) -> float:
    """Seconds `fn()` takes, both devices idle before and after."""
    for d in (0, 1):
        torch.cuda.synchronize(d)
    t0 = time.perf_counter()
    fn()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    return time.perf_counter() - t0


def peer(args: argparse.Namespace) -> Dict[str, Any]:
    """Fill, first copy, timed copies, refill; returns the figures."""
    import torch

    if torch.cuda.device_count() < 2:
        sys.exit(f"error: the peer benchmark needs 2 CUDA devices, this machine has {torch.cuda.device_count()}")
    nbytes = int(args.tensor_mib * 2**20)
    n = int(args.gib * 2**30) // nbytes
    held: List[Any] = []
    fill_s = timed(torch, lambda: held.extend(fill(torch, n, nbytes)))
    probe = torch.arange(1 << 20, dtype=torch.int32, device="cuda:1")
    got: List[Any] = []
    first_s = timed(torch, lambda: got.append(probe.to("cuda:0")))
    assert torch.equal(got[0].cpu(), probe.cpu()), "the first copy from device 1 to device 0 differs"

    count = int(args.copy_mib * 2**20) // 4
    rates = {}
    for src, dst in ((0, 1), (1, 0)):
        x = torch.arange(count, dtype=torch.int32, device=f"cuda:{src}")
        out = torch.empty_like(x, device=f"cuda:{dst}")
        out.copy_(x)  # once untimed: PyTorch's peer access for this direction
        times = [timed(torch, lambda: out.copy_(x)) for _ in range(args.copies)]
        assert torch.equal(out.cpu(), x.cpu()), f"a copy from device {src} to device {dst} differs"
        rates[f"copy_{src}_to_{dst}_gbps"] = count * 4 / statistics.median(times) / 1e9

    del held[n // 2:]
    torch.cuda.empty_cache()
    refill = n - n // 2
    refill_s = timed(torch, lambda: held.extend(fill(torch, refill, nbytes)))
    last = held[-1]
    last.fill_(7)
    assert torch.equal(last.to("cuda:1").cpu(), last.cpu()), "a tensor mapped after the first copy differs on device 1"
    peak_alloc, peak_res = peak_memory(args.mode, 0)
    return {"first_copy_s": first_s, **rates,
            "fill_us_per_tensor": fill_s / n * 1e6, "refill_us_per_tensor": refill_s / refill * 1e6,
            "tensors": n, "tensor_bytes": nbytes, "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "mode": args.mode, "torch": torch.__version__}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Put the mode in place, run, print and optionally save the figures."""
    args = parse_args(argv)
    install(args.mode)
    r = peer(args)
    return report(r, f"{args.mode}: first copy 1->0 with {r['tensors']} tensors on device 0: "
                  f"{r['first_copy_s'] * 1e3:.1f} ms; copies {r['copy_0_to_1_gbps']:.0f} GB/s 0->1, "
                  f"{r['copy_1_to_0_gbps']:.0f} GB/s 1->0; {r['fill_us_per_tensor']:.1f} us per tensor before, "
                  f"{r['refill_us_per_tensor']:.1f} after", args.json)


if __name__ == "__main__":
    sys.exit(main())
