"""Allocation churn: the cost of one torch.empty + free pair, in microseconds.

    python -m benchmarks.churn --mode gpupool --pairs 100000 --json out.json

A window of --window live tensors (uint8, on CUDA); each pair frees the
tensor in a random slot of the window and allocates a new one there. Sizes
are log-uniform in [--min-size, --max-size] (256 B..64 MiB by default), and
sizes and slots come from a fixed seed, so every mode sees the same
sequence. --warmup pairs run first (the allocator fills its cache), then
--pairs pairs are timed with time.perf_counter_ns. The figure includes
Python's and PyTorch's dispatch, as any real allocation does; no kernel runs.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .modes import MODES, install, peak_memory, report


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; parsing needs neither torch nor CUDA."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.churn", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True, help="allocator mode")
    p.add_argument("--pairs", type=int, default=100_000, help="timed alloc+free pairs (default: 100000)")
    p.add_argument("--warmup", type=int, default=10_000, help="untimed pairs first (default: 10000)")
    p.add_argument("--window", type=int, default=64, help="live tensors (default: 64)")
    p.add_argument("--min-size", type=int, default=256, help="smallest request in bytes (default: 256)")
    p.add_argument("--max-size", type=int, default=64 << 20, help="largest request in bytes (default: 64 MiB)")
    p.add_argument("--seed", type=int, default=0, help="seed of sizes and slots (default: 0)")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.pairs < 1 or args.warmup < 0 or args.window < 1:
        p.error("--pairs and --window must be positive, --warmup not negative")
    if not 1 <= args.min_size <= args.max_size:
        p.error("need 1 <= --min-size <= --max-size")
    return args


def sequence(seed: int, n: int, window: int, lo: int, hi: int) -> Tuple[List[int], List[int]]:
    """`n` sizes, log-uniform in [lo, hi], and `n` window slots, uniform."""
    rng = random.Random(seed)
    a, b = math.log(lo), math.log(hi)
    sizes = [min(hi, max(lo, round(math.exp(rng.uniform(a, b))))) for _ in range(n)]
    return sizes, [rng.randrange(window) for _ in range(n)]


def churn(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the warm-up and the timed pairs; returns the figures."""
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: the churn benchmark needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    sizes, slots = sequence(args.seed, args.window + args.warmup + args.pairs, args.window,
                            args.min_size, args.max_size)
    empty, u8 = torch.empty, torch.uint8
    window: List[Optional[torch.Tensor]] = [empty(s, dtype=u8, device=device) for s in sizes[:args.window]]

    def run(first: int, n: int) -> int:
        """Pairs first..first+n; returns the nanoseconds they took."""
        size, slot = sizes[first:first + n], slots[first:first + n]
        torch.cuda.synchronize(device)
        t0 = time.perf_counter_ns()
        for s, j in zip(size, slot):
            window[j] = None
            window[j] = empty(s, dtype=u8, device=device)
        torch.cuda.synchronize(device)
        return time.perf_counter_ns() - t0

    run(args.window, args.warmup)
    ns = run(args.window + args.warmup, args.pairs)
    peak_alloc, peak_res = peak_memory(args.mode, device.index)
    return {"us_per_pair": ns / args.pairs / 1e3, "pairs": args.pairs, "warmup": args.warmup,
            "window": args.window, "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "mode": args.mode, "torch": torch.__version__}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Put the mode in place, run, print and optionally save the figures."""
    args = parse_args(argv)
    install(args.mode)
    result = churn(args)
    return report(result, f"{args.mode}: {result['us_per_pair']:.2f} us per alloc+free pair over {args.pairs} pairs, "
                  f"peak allocated {result['peak_allocated'] / 2**20:.1f} MiB, "
                  f"peak reserved {result['peak_reserved'] / 2**20:.1f} MiB", args.json)


if __name__ == "__main__":
    sys.exit(main())
