"""What a CUDA graph's replay costs the launching thread, the allocator's part included.

    python -m benchmarks.replay --mode gpupool --json out.json

A small step (--layers Linear layers of --dim, batch 1: the host's launch
cost, not the device, sets its pace) is captured once, while the pool holds
--tensors live tensors of 64 KiB-4 MiB beside it. Replays are timed in
--rounds rounds of --replays each (the device synchronised at each round's
end); the median round gives the microseconds per replay. Under gpupool the
model is offloadable (as one module, or each layer apart with --handles
layers, as a model streamed layer by layer is), so each replay also holds
it resident (restored first, were it offloaded) and asks whether the
graph's own memory is away. Once, between two timed parts, gpupool
offloads the model and the next replay must bring it back: that replay is
timed apart. The output is checked against the first replay after each
part.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .modes import GPUPOOL_MODES, MODES, install, peak_memory, report


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; parsing needs neither torch nor CUDA."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True, help="allocator mode")
    p.add_argument("--layers", type=int, default=8, help="Linear layers in the step (default: 8)")
    p.add_argument("--dim", type=int, default=1024, help="their width (default: 1024)")
    p.add_argument("--tensors", type=int, default=4000, help="live tensors beside the graph (default: 4000)")
    p.add_argument("--replays", type=int, default=2000, help="replays per timed round (default: 2000)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (default: 5)")
    p.add_argument("--handles", choices=("model", "layers"), default="model",
                   help="gpupool: the model offloadable as one module or each layer apart (default: model)")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if min(args.layers, args.dim, args.replays, args.rounds) < 1 or args.tensors < 0:
        p.error("--layers, --dim, --replays and --rounds must be positive, --tensors not negative")
    return args


def replay(args: argparse.Namespace) -> Dict[str, Any]:
    """Build, capture, time; returns the figures."""
    import torch

    gp = args.mode in GPUPOOL_MODES
    torch.manual_seed(0)
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20]
    held = [torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device="cuda") for i in range(args.tensors)]
    model = torch.nn.Sequential(*[torch.nn.Linear(args.dim, args.dim) for _ in range(args.layers)]).cuda()
    handles = []
    if gp:
        import gpupool

        parts = list(model) if args.handles == "layers" else [model]
        handles = [gpupool.offloadable(m, f"replay_model_{i}") for i, m in enumerate(parts)]
    x = torch.randn(1, args.dim, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = model(x)
    g.replay()
    ref = y.clone()

    def rounds() -> List[float]:
        out = []
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.replays):
                g.replay()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) / args.replays * 1e6)
        assert torch.equal(y, ref), "a replay's output differs from the first"
        return out

    times = rounds()
    wake_ms = None
    if handles:
        for h in handles:
            h.offload()
        y.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()  # restores the model first
        torch.cuda.synchronize()
        wake_ms = (time.perf_counter() - t0) * 1e3
        assert torch.equal(y, ref), "the replay after an offload differs from the first"
    times += rounds()
    del held
    peak_alloc, peak_res = peak_memory(args.mode)
    return {"us_per_replay": statistics.median(times), "us_min": min(times), "us_max": max(times),
            "replay_after_offload_ms": wake_ms, "tensors": args.tensors, "layers": args.layers,
            "dim": args.dim, "handles": len(handles), "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "mode": args.mode, "torch": torch.__version__}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Put the mode in place, run, print and optionally save the figures."""
    args = parse_args(argv)
    install(args.mode)
    r = replay(args)
    wake = "" if r["replay_after_offload_ms"] is None else \
        f"; a replay with the model offloaded first {r['replay_after_offload_ms']:.2f} ms"
    return report(r, f"{args.mode}: {r['us_per_replay']:.2f} us per replay ({r['us_min']:.2f}..{r['us_max']:.2f}), "
                  f"{r['tensors']} tensors live, {r['handles']} offloadable{wake}", args.json)


if __name__ == "__main__":
    sys.exit(main())
