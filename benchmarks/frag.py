"""Fragmentation: peak reserved against peak allocated while tensor shapes keep changing.

    python -m benchmarks.frag --mode gpupool --iters 240 --json out.json

A small transformer-like stack (attention written out, so that the
[batch, heads, seq, seq] scores change size with the shape, and an MLP) on
bf16 [batch, seq, --hidden] activations runs forward and backward. The
number of tokens per iteration (batch x seq) follows a schedule that grows
from --min-tokens to --max-tokens and shrinks back, twice, with a new shape
every --hold iterations; the sequence length of each shape is drawn at
random (fixed seed) and the batch size fills the token count. An allocator
that cannot reuse the blocks of earlier shapes for new ones reserves more
than it hands out: the figure of merit is peak reserved / peak allocated.

Under gpupool the memory is tagged: the model's weights "weights" and the
optimizer's state "optimizer" (long-lived), the forward's activations
"activations" and everything backward makes "backward" (short-lived; the
backward runs on autograd's own thread, which inherits the tag). With
lifetime placement (``--placement lifetime``, gpupool's default) the
long-lived blocks come from a region of their own; ``--placement none``
turns it off, so that the two can be compared:

    python -m benchmarks.frag --mode gpupool --optimizer adamw --placement lifetime
    python -m benchmarks.frag --mode gpupool --optimizer adamw --placement none
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import sys
import time
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

from .modes import GPUPOOL_MODES, MODES, install, peak_memory, report

SEQ_LENS = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
HEAD_DIM = 64


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; parsing needs neither torch nor CUDA."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.frag", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True, help="allocator mode")
    p.add_argument("--iters", type=int, default=240, help="iterations (default: 240)")
    p.add_argument("--hold", type=int, default=3, help="iterations per shape (default: 3)")
    p.add_argument("--hidden", type=int, default=1024, help="model width, a multiple of 64 (default: 1024)")
    p.add_argument("--layers", type=int, default=2, help="blocks in the stack (default: 2)")
    p.add_argument("--min-tokens", type=int, default=1024, help="fewest batch x seq (default: 1024)")
    p.add_argument("--max-tokens", type=int, default=32768, help="most batch x seq (default: 32768)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shapes (default: 0)")
    p.add_argument("--optimizer", choices=("none", "adamw"), default="none",
                   help="none: forward+backward only; adamw: an AdamW step each iteration, whose state "
                        "appears after the first backward (default: none)")
    p.add_argument("--placement", choices=("lifetime", "none"), default=None,
                   help="gpupool modes: GPUPOOL_PLACEMENT, lifetime-aware placement on or off "
                        "(default: gpupool's own, lifetime)")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    args = p.parse_args(argv)
    if args.iters < 1 or args.hold < 1 or args.layers < 1:
        p.error("--iters, --hold and --layers must be positive")
    if args.hidden < HEAD_DIM or args.hidden % HEAD_DIM:
        p.error(f"--hidden must be a positive multiple of {HEAD_DIM}")
    if not SEQ_LENS[0] <= args.min_tokens <= args.max_tokens:
        p.error(f"need {SEQ_LENS[0]} <= --min-tokens <= --max-tokens")
    if args.placement is not None and args.mode not in GPUPOOL_MODES:
        p.error(f"--placement applies to gpupool modes ({', '.join(GPUPOOL_MODES)}), not {args.mode}")
    return args


def tag(mode: str, name: str, inherit: bool = False) -> ContextManager[Any]:
    """gpupool.tag(name) under a gpupool mode, else nothing."""
    if mode not in GPUPOOL_MODES:
        return contextlib.nullcontext()
    import gpupool

    return gpupool.tag(name, inherit=inherit)


def schedule(seed: int, iters: int, hold: int, lo: int, hi: int) -> List[Tuple[int, int]]:
    """(batch, seq) of each iteration: tokens on a triangle wave lo -> hi -> lo, two periods."""
    rng = random.Random(seed)
    shapes = []
    n = math.ceil(iters / hold)
    for k in range(n):
        phase = (2 * k / max(1, n - 1)) % 1.0
        wave = 1 - abs(2 * phase - 1)  # 0 -> 1 -> 0 over a period
        tokens = round(lo + (hi - lo) * wave)
        seq = rng.choice([s for s in SEQ_LENS if s <= tokens])
        shapes.extend([(max(1, tokens // seq), seq)] * hold)
    return shapes[:iters]


def build(hidden: int, layers: int, device: Any) -> Any:
    """The stack: `layers` blocks of (attention, MLP), pre-norm, residual, bf16."""
    import torch
    from torch import nn

    class Block(nn.Module):
        """Pre-norm attention (scores materialised) and a 4x MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, -1, HEAD_DIM).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2)) * HEAD_DIM ** -0.5
            att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, hidden)
            x = x + self.out(att)
            return x + self.mlp(self.norm2(x))

    return nn.Sequential(*[Block() for _ in range(layers)]).to(device, torch.bfloat16)


def frag(args: argparse.Namespace) -> Dict[str, Any]:
    """Run the schedule; returns the peaks and the time per iteration."""
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: the frag benchmark needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)
    with tag(args.mode, "weights"):
        model = build(args.hidden, args.layers, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if args.optimizer == "adamw" else None
    shapes = schedule(args.seed, args.iters, args.hold, args.min_tokens, args.max_tokens)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for b, s in shapes:
        with tag(args.mode, "activations"):
            x = torch.randn(b, s, args.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
            loss = model(x).float().square().mean()
        with tag(args.mode, "backward", inherit=True):
            loss.backward()
        if opt is not None:
            with tag(args.mode, "optimizer"):
                opt.step()
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    peak_alloc, peak_res = peak_memory(args.mode, device.index)
    return {"peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "reserved_over_allocated": peak_res / peak_alloc, "ms_per_iter": seconds / args.iters * 1e3,
            "iters": args.iters, "shapes": len(set(shapes)), "mode": args.mode, "torch": torch.__version__,
            "optimizer": args.optimizer, "placement": placement(args.mode)}


def placement(mode: str) -> Optional[str]:
    """The lifetime placement gpupool runs with (None under PyTorch's allocators)."""
    if mode not in GPUPOOL_MODES:
        return None
    import gpupool

    return str(gpupool.config()["placement"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Put the mode in place, run, print and optionally save the figures."""
    args = parse_args(argv)
    if args.placement is not None:
        os.environ["GPUPOOL_PLACEMENT"] = args.placement  # read by gpupool.enable()
    install(args.mode)
    result = frag(args)
    return report(result, f"{args.mode}: peak allocated {result['peak_allocated'] / 2**30:.2f} GiB, "
                  f"peak reserved {result['peak_reserved'] / 2**30:.2f} GiB "
                  f"(x{result['reserved_over_allocated']:.3f}), {result['ms_per_iter']:.1f} ms per iteration, "
                  f"{result['shapes']} shapes, optimizer {args.optimizer}"
                  + (f", placement {result['placement']}" if result["placement"] else ""), args.json)


if __name__ == "__main__":
    sys.exit(main())
