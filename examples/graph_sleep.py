#!/usr/bin/env python3
"""A model and its captured CUDA graph go to sleep together and wake up
without being captured again.

    python examples/graph_sleep.py                   # 12 layers of d=2048: about 1.9 GB of weights and KV cache
    python examples/graph_sleep.py --layers 4 --cycles 2

A transformer decode step (random weights, a static KV cache, RMSNorm,
attention over the cache, a SwiGLU MLP, the LM head) is captured as a CUDA
graph under gpupool.  Sleep: ``gpupool.offload`` of the weights, the KV
cache and the tag the capture allocated under (``with
gpupool.tag("decode_graph"): ... torch.cuda.graph(g)``): the graph's
output, workspace and the scratch freed inside the capture leave the device
with them.  Wake: ``gpupool.restore`` brings it all back at the same
addresses and ``g.replay()`` runs at once.  The other way -- drop the
graph, bring the weights back, warm up and capture again -- is timed in the
same process for comparison (cuBLAS's choices and PyTorch's caches are warm
by then, so it is the cheapest re-capture there is).  Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

SLEEPERS = ["weights", "kv_cache", "decode_graph"]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12, help="transformer layers (default: 12)")
    p.add_argument("--dim", type=int, default=2048, help="model width (default: 2048)")
    p.add_argument("--heads", type=int, default=16, help="attention heads (default: 16)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary (default: 32000)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded at once (default: 8)")
    p.add_argument("--max-len", type=int, default=1024, help="KV cache length (default: 1024)")
    p.add_argument("--warmup", type=int, default=3, help="eager steps before a capture (default: 3)")
    p.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles timed each way (default: 3)")
    p.add_argument("--allocator", default="gpupool", choices=("gpupool",),
                   help="gpupool only: the graph's memory is what sleeps")
    p.add_argument("--json", metavar="PATH", help="write the figures here")
    return p.parse_args(argv)


def build(torch: Any, a: argparse.Namespace) -> Dict[str, Any]:
    """Weights (tag weights), KV cache (kv_cache), static inputs (io)."""
    import gpupool

    d, f, L = a.dim, (8 * a.dim // 3 + 127) // 128 * 128, a.layers
    hd = d // a.heads
    bf = torch.bfloat16

    def w(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=bf) * (shape[-1] ** -0.5)

    with gpupool.tag("weights", lifetime="long"):
        W = {"emb": w(a.vocab, d), "head": w(a.vocab, d), "norm": torch.ones(d, device="cuda", dtype=bf),
             "layers": [{"qkv": w(3 * d, d), "o": w(d, d), "up": w(2 * f, d), "down": w(d, f),
                         "n1": torch.ones(d, device="cuda", dtype=bf), "n2": torch.ones(d, device="cuda", dtype=bf)}
                        for _ in range(L)]}
    with gpupool.tag("kv_cache", lifetime="long"):
        kv = torch.zeros(L, 2, a.batch, a.heads, a.max_len, hd, device="cuda", dtype=bf)
    with gpupool.tag("io"):
        tok = torch.randint(0, a.vocab, (a.batch,), device="cuda")
        pos = torch.tensor([a.max_len // 2], device="cuda")
        ar = torch.arange(a.max_len, device="cuda")
    return {"W": W, "kv": kv, "tok": tok, "pos": pos, "ar": ar, "hd": hd, "heads": a.heads}


def step(torch: Any, m: Dict[str, Any]) -> Any:
    """One decode step: logits of the next token; writes this position's K, V."""
    F = torch.nn.functional
    W, kv, pos, hd, H = m["W"], m["kv"], m["pos"], m["hd"], m["heads"]
    x = F.embedding(m["tok"], W["emb"])  # [B, d]
    B = x.shape[0]
    mask = (m["ar"] <= pos).view(1, 1, 1, -1)
    for i, lw in enumerate(W["layers"]):
        h = F.rms_norm(x, (x.shape[-1],), lw["n1"])
        q, k, v = (h @ lw["qkv"].t()).view(B, 3, H, 1, hd).unbind(1)
        kv[i, 0].index_copy_(2, pos, k)
        kv[i, 1].index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, kv[i, 0], kv[i, 1], attn_mask=mask)
        x = x + att.reshape(B, -1) @ lw["o"].t()
        h = F.rms_norm(x, (x.shape[-1],), lw["n2"])
        g, u = (h @ lw["up"].t()).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ lw["down"].t()
    return F.rms_norm(x, (x.shape[-1],), W["norm"]) @ W["head"].t()


def capture(torch: Any, m: Dict[str, Any], warmup: int) -> Any:
    """Warm up on a side stream, then capture the step under tag decode_graph."""
    import gpupool

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(warmup):
            step(torch, m)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with gpupool.tag("decode_graph"), torch.no_grad(), torch.cuda.graph(g):
        out = step(torch, m)
    return g, out


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: this example needs PyTorch with CUDA: pip install -e '.[torch]'", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: this example needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import gpupool

    gpupool.enable()
    torch.manual_seed(0)
    gpupool.device_pool()._pool.offload_stats(True)  # the offloader first (its 1 MiB of checksums)
    m = build(torch, a)
    g, out = capture(torch, m, a.warmup)
    g.replay()
    torch.cuda.synchronize()
    ref = out.clone()
    tags = gpupool.stats()["tags"]
    sizes = {t: tags[t]["allocated"] for t in SLEEPERS}
    print("live bytes: " + ", ".join(f"{t} {gpupool.format_bytes(n)}" for t, n in sizes.items()))

    wake: List[float] = []
    identical = True
    freed: List[int] = []
    for _ in range(a.cycles):
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        info = gpupool.offload(SLEEPERS, dtype=torch.bfloat16)
        freed.append(torch.cuda.mem_get_info()[0] - free0)
        t0 = time.perf_counter()
        gpupool.restore(SLEEPERS)
        g.replay()
        torch.cuda.synchronize()
        wake.append(time.perf_counter() - t0)
        identical &= torch.equal(out.view(torch.int16), ref.view(torch.int16))
    print(f"sleep: {gpupool.format_bytes(info['bytes'])} offloaded ({gpupool.format_bytes(info['host_bytes'])} "
          f"on the host, codec {info['codec']}), device memory freed {gpupool.format_bytes(min(freed))}")

    # The other way: the graph is dropped, the weights and cache sleep and
    # come back, and the step is warmed up and captured again.
    del g, out
    recap: List[float] = []
    recap_identical = True
    for _ in range(a.cycles):
        torch.cuda.synchronize()
        gpupool.offload(["weights", "kv_cache"], dtype=torch.bfloat16)
        t0 = time.perf_counter()
        gpupool.restore(["weights", "kv_cache"])
        g2, out2 = capture(torch, m, a.warmup)
        g2.replay()
        torch.cuda.synchronize()
        recap.append(time.perf_counter() - t0)
        recap_identical &= torch.equal(out2.view(torch.int16), ref.view(torch.int16))
        del g2, out2
    w, r = statistics.median(wake), statistics.median(recap)
    print(f"wake (restore + first replay): {1e3 * w:.1f} ms (median of {a.cycles}: "
          f"{', '.join(f'{1e3 * x:.1f}' for x in wake)})")
    print(f"re-capture (restore weights and cache, {a.warmup} warm-up steps, capture, first replay): "
          f"{1e3 * r:.1f} ms ({', '.join(f'{1e3 * x:.1f}' for x in recap)})")
    print(f"{'PASS' if identical else 'FAIL'}  identical output after every wake")
    print(f"{'PASS' if w < r else 'FAIL'}  wake faster than re-capture: {r / w:.2f}x")
    if a.json:
        s = gpupool.stats()
        with open(a.json, "w") as fh:
            json.dump({"workload": "graph", "bytes": sizes, "offloaded": info["bytes"],
                       "host_bytes": info["host_bytes"], "device_freed": min(freed), "wake_s": wake,
                       "recapture_s": recap, "wake_median_s": w, "recapture_median_s": r, "identical": identical,
                       "recapture_identical": recap_identical, "peak_allocated": s["allocated_peak"],
                       "peak_reserved": s["reserved_peak"]}, fh)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
