#!/usr/bin/env python3
"""Two Qwen2-shaped models take turns at generate() on a memory budget that
holds one of them: the idle one is offloaded to host memory (compressed on the
GPU when nvCOMP is installed) and comes back, at the same addresses, for its
turn.

    python examples/two_models.py                       # 0.5B shape, two rounds
    python examples/two_models.py --size tiny --rounds 3
    python examples/two_models.py --auto                # let the pool decide (priorities)

With ``--budget`` unset the budget is what one model needs plus a working
margin, so that both models never fit at once.  Each switch prints how long
the offload and the restore took and how many bytes crossed PCIe.

``--auto``: no explicit offload.  Each model is ``gpupool.offloadable`` with its
own priority (the one generating now is raised), so the pool offloads the
idle one when the other needs the room, and its forward hook brings it back.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from qwen_lora_finetune import SIZES, build_model, open_device


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="0.5b", help="model shape (default: 0.5b)")
    p.add_argument("--model", metavar="PATH", help="load weights from this local folder instead")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (default: cuda)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto", help="weights' dtype (auto: bf16)")
    p.add_argument("--rounds", type=int, default=2, help="turns of each model (default: 2)")
    p.add_argument("--batch", type=int, default=4, help="prompts per generate() (default: 4)")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (default: 256)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per turn (default: 32)")
    p.add_argument("--budget", type=float, metavar="GIB", help="gpupool's limit (default: one model + margin)")
    p.add_argument("--margin", type=float, default=1.0, metavar="GIB",
                   help="room for generate()'s working memory in the default budget (default: 1)")
    p.add_argument("--auto", action="store_true", help="offload by priorities under pressure, not by hand")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.batch < 1 or args.new_tokens < 1:
        p.error("--rounds, --batch and --new-tokens must be positive")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    import gpupool

    try:
        gpupool.enable()
    except RuntimeError as e:
        sys.exit(f"error: {e} (this example needs a CUDA GPU)")
    import torch

    device = open_device(args.device)
    torch.manual_seed(args.seed)
    models: Dict[str, Any] = {}
    for name in ("model_a", "model_b"):
        with gpupool.tag(name, lifetime="long"):
            models[name] = build_model(args, device).eval()
        if not args.auto and len(models) == 1:
            gpupool.offload(name, dtype=models[name].dtype)  # only one fits the budget
    one = sum(p.numel() * p.element_size() for p in models["model_a"].parameters())
    budget = int((args.budget if args.budget is not None else one / 2**30 + args.margin) * 2**30)
    print(f"two models of {one / 2**30:.2f} GiB each ({args.size}, {models['model_a'].dtype}); "
          f"budget {budget / 2**30:.2f} GiB")
    handles = {}
    if args.auto:
        for name, m in models.items():
            handles[name] = gpupool.offloadable(m, name, priority="low")
        gpupool.offload("model_a")
    gpupool.set_limit(budget)
    vocab = models["model_a"].config.vocab_size
    g = torch.Generator(device=device).manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.batch, args.prompt_len), device=device, generator=g)
    rows: List[Dict[str, Any]] = []
    for r in range(args.rounds):
        for name in ("model_b", "model_a"):
            other = "model_a" if name == "model_b" else "model_b"
            t0 = time.perf_counter()
            if args.auto:
                # The one whose turn it is matters more: the pool offloads the
                # other when room is needed, and its forward hook restores it.
                handles[other].set_priority("low")
                handles[name].set_priority("high")
                gpupool.restore(name)  # (its first forward would, through the hook)
            else:
                off = gpupool.offload(other, dtype=models[other].dtype)
                back = gpupool.restore(name)
            torch.cuda.synchronize(device)
            switch = time.perf_counter() - t0
            t1 = time.perf_counter()
            with torch.no_grad(), gpupool.tag("generate", priority="high"):
                out = models[name].generate(ids, max_new_tokens=args.new_tokens, do_sample=False,
                                            pad_token_id=0)
            torch.cuda.synchronize(device)
            gen = time.perf_counter() - t1
            row = {"round": r + 1, "model": name, "switch_s": switch, "generate_s": gen,
                   "tokens": int(out.shape[0] * (out.shape[1] - ids.shape[1]))}
            if not args.auto:
                row.update(out_gib=off["copied"] / 2**30, host_gib=off["host_bytes"] / 2**30, codec=off["codec"],
                           offload_s=off["seconds"], restore_s=back["seconds"])
            rows.append(row)
            extra = (f"offload {row['offload_s'] * 1e3:.0f} ms ({row['out_gib']:.2f} GiB -> {row['host_gib']:.2f} "
                     f"GiB host, {row['codec']}), restore {row['restore_s'] * 1e3:.0f} ms" if not args.auto else "")
            print(f"round {r + 1} {name}: switch {switch * 1e3:.0f} ms {extra}; generate {gen:.2f} s "
                  f"({row['tokens'] / gen:.0f} tokens/s)")
    s = gpupool.stats()
    print(f"peak reserved {s['reserved_peak'] / 2**30:.2f} GiB within the budget of {budget / 2**30:.2f} GiB; "
          f"{s['offload']['n_offload']} offloads, {s['offload']['n_restore']} restores, "
          f"{s['offload']['n_pressure']} by the pool under pressure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
