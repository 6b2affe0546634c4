#!/usr/bin/env python3
"""Batched greedy generation with a Qwen2-architecture causal LM, with every CUDA tensor in gpupool.

    python examples/qwen_inference.py --allocator gpupool                 # tiny model, quick
    python examples/qwen_inference.py --size 0.5b --json out.json
    python examples/qwen_inference.py --model /path/to/local/Qwen2-0.5B    # real weights
    python examples/qwen_inference.py --device cpu --steps 3              # smoke test, no GPU

The model, its sizes and the --allocator choices are those of
qwen_lora_finetune.py (randomly initialised, bf16, fully offline unless
``--model PATH`` names a local folder). Each step is one ``model.generate()``
call on a batch of prompts of random token ids whose lengths are drawn
uniformly in [--min-len, --max-len], left-padded with an attention mask, and
produces exactly --new-tokens tokens per prompt (greedy). The KV cache grows
token by token and its size changes from batch to batch: a typical pattern
for an allocator. At the end it prints the generated tokens/s over the timed
steps and the peak allocated / reserved bytes as the allocator in use counts
them; ``--json PATH`` writes them for the benchmark harness.
"""
from __future__ import annotations

import os
import random
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from qwen_lora_finetune import (alloc_calls, build_model, check_common, common_parser, describe, finish,
                                open_device, peak_memory, select_allocator, start_history, synchronize, tag)

if TYPE_CHECKING:
    import argparse

    import torch


def parse_args(argv: Optional[Sequence[str]] = None) -> "argparse.Namespace":
    """The command line (parsed before torch is imported)."""
    p = common_parser(__doc__, batch=4, min_len=64, max_len=512, steps=5, warmup=1)
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt (default: 64)")
    args = p.parse_args(argv)
    if args.new_tokens < 1:
        p.error("--new-tokens must be positive")
    return check_common(p, args)


def prompts(args: "argparse.Namespace", vocab: int, pad_id: int,
            n: int) -> List[Tuple["torch.Tensor", "torch.Tensor"]]:
    """`n` left-padded batches (token ids, attention mask) on the CPU, the same for every allocator.

    The random ids avoid `pad_id`, so that no prompt looks right-padded."""
    import torch

    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    out = []
    for _ in range(n):
        lengths = [rng.randint(args.min_len, args.max_len) for _ in range(args.batch)]
        width = max(lengths)
        ids = torch.full((args.batch, width), pad_id, dtype=torch.long)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        for row, length in enumerate(lengths):
            tokens = torch.randint(0, vocab - 1, (length,), generator=gen)
            ids[row, width - length:] = tokens + (tokens >= pad_id).long()
            mask[row, width - length:] = 1
        out.append((ids, mask))
    return out


def generate(args: "argparse.Namespace", use_gpupool: bool) -> Dict[str, Any]:
    """Run --warmup + --steps generate() calls; returns the figures of the timed ones."""
    import torch

    device = open_device(args.device)
    start_history(args)
    torch.manual_seed(args.seed)
    with tag(use_gpupool, "weights"):
        model = build_model(args, device)
    model.eval()
    config = model.config
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    print(describe(args, model, device))
    print(f"batch {args.batch}, prompts of {args.min_len}..{args.max_len} tokens, {args.new_tokens} new "
          f"tokens each (greedy), {args.warmup} warm-up + {args.steps} timed generate() calls")

    def step(i: int, ids: "torch.Tensor", mask: "torch.Tensor") -> int:
        """One generate() call; returns the number of tokens it generated."""
        with tag(use_gpupool, "generate"), torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=pad_id)
        new = (out.shape[1] - ids.shape[1]) * ids.shape[0]
        print(f"step {i:3d}/{args.warmup + args.steps}  prompt width {ids.shape[1]:4d}  {new} new tokens")
        return new

    data = prompts(args, config.vocab_size, pad_id, args.warmup + args.steps)
    for i, (ids, mask) in enumerate(data[:args.warmup], start=1):
        step(i, ids, mask)
    synchronize(device)
    calls0 = alloc_calls(use_gpupool, device)
    t0 = time.perf_counter()
    tokens = sum(step(i, ids, mask) for i, (ids, mask) in enumerate(data[args.warmup:], start=args.warmup + 1))
    synchronize(device)
    seconds = time.perf_counter() - t0
    calls = alloc_calls(use_gpupool, device)
    peak_alloc, peak_res = peak_memory(use_gpupool, device)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "alloc_calls_timed": None if calls is None or calls0 is None else calls - calls0,
            "mode": args.allocator if device.type == "cuda" else "cpu", "steps": args.steps,
            "warmup": args.warmup, "batch": args.batch, "new_tokens": args.new_tokens,
            "size": args.model or args.size, "dtype": str(model.dtype), "device": str(device),
            "torch": torch.__version__}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the generation benchmark and print (and optionally save) its figures."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, even by accident
    use_gpupool = select_allocator(args.allocator, args.device)
    finish(args, generate(args, use_gpupool), use_gpupool, "new tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
