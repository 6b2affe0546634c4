#!/usr/bin/env python3
"""LoRA fine-tuning of a Qwen2-architecture causal LM, with every CUDA tensor in gpupool.

    python examples/qwen_lora_finetune.py --allocator gpupool               # tiny model, quick
    python examples/qwen_lora_finetune.py --size 0.5b --steps 40 --json out.json
    python examples/qwen_lora_finetune.py --model /path/to/local/Qwen2-0.5B  # real weights
    python examples/qwen_lora_finetune.py --device cpu --steps 3            # smoke test, no GPU
    python examples/qwen_lora_finetune.py --size 0.5b --full --fp32-master --min-len 512 --max-len 512 \
        --offload-optimizer                                                  # mixed precision, state offloaded

The model is randomly initialised from a config (nothing is downloaded, ever;
``--model PATH`` loads weights from a local folder only). LoRA adapters
(r=8, alpha=16) sit on q_proj, k_proj and v_proj; the base weights are bf16
and frozen (float32 on the CPU, where bf16 matrix products are slow; see
``--dtype``). Each step draws one sequence length uniformly in
[--min-len, --max-len], so tensor shapes change from step to step as they do
with real, unpadded data: that is what makes a caching allocator fragment.
Tokens are random ids and the labels are the inputs (fixed seed).

``--full --fp32-master`` is the usual mixed-precision recipe of a full
fine-tune instead: fp32 master weights, the forward and backward under
``torch.autocast(bfloat16)``, fused AdamW with fp32 state, gradient
checkpointing. ``--offload-optimizer`` makes the AdamW state offloadable
(``offload_after_step=True``): it leaves the device after each step and comes
back during the next backward pass (``--prefetch-at``). ``--trace PATH``
records a torch profiler trace of two more steps after the timed ones
(Chrome trace format: chrome://tracing or Perfetto opens it; ``python -m
benchmarks.timeline PATH`` summarises it).

``--allocator`` picks the CUDA allocator of the process:

- ``gpupool``: ``gpupool.enable()`` (expandable mode), before any CUDA allocation;
- ``gpupool-reserve``: ``gpupool.enable(mode="reserve")``, the whole pool mapped at start;
- ``native``: PyTorch's caching allocator, as configured by the environment;
- ``expandable``: PyTorch's with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
- ``async``: ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` when it is imported, so this script
sets it before importing torch. At the end it prints tokens/s over the timed
steps and the peak allocated / reserved bytes as the allocator in use counts
them (``gpupool.stats()`` or ``torch.cuda.max_memory_*``); ``--json PATH``
writes them for the benchmark harness (``python -m benchmarks``).
``--snapshot x.pickle`` and ``--plot x.png`` show where the memory went, by
tag and over time (the history of every allocation is recorded meanwhile,
which slows the run).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from typing import TYPE_CHECKING, Any, ContextManager, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch

ALLOCATORS = ("gpupool", "gpupool-reserve", "native", "expandable", "async")
ALLOC_CONF = {"expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}

# Qwen2 architecture shapes. "0.5b" has the dimensions of the 0.5B Qwen
# checkpoint the benchmarks were specified with (Qwen1.5-0.5B, which
# transformers runs as Qwen2ForCausalLM): 464M parameters, embeddings tied.
SIZES: Dict[str, Dict[str, Any]] = {
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "0.5b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=True),
}


def common_parser(doc: str, batch: int, min_len: int, max_len: int, steps: int,
                  warmup: int) -> argparse.ArgumentParser:
    """The options this example shares with qwen_inference.py, with its own defaults."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=ALLOCATORS, default="gpupool",
                   help="CUDA allocator of this process (default: gpupool)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="model shape (default: tiny)")
    p.add_argument("--model", metavar="PATH", help="load weights from this local folder instead")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    p.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                   help="weights' dtype; auto: bf16 on CUDA, fp32 on the CPU (default: auto)")
    p.add_argument("--batch", type=int, default=batch, help=f"sequences per step (default: {batch})")
    p.add_argument("--min-len", type=int, default=min_len, help=f"shortest sequence (default: {min_len})")
    p.add_argument("--max-len", type=int, default=max_len, help=f"longest sequence (default: {max_len})")
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps (default: {steps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps before them (default: {warmup})")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default: 0)")
    p.add_argument("--json", metavar="PATH", help="write the results to this JSON file")
    p.add_argument("--snapshot", metavar="PATH",
                   help="record the allocation history from the start and pickle a memory snapshot here at the "
                        "end (open it at https://pytorch.org/memory_viz); any CUDA allocator")
    p.add_argument("--plot", metavar="PATH",
                   help="draw memory over time by tag into this PNG at the end (gpupool allocators; matplotlib)")
    return p


def check_common(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Reject values of the common options that cannot work; returns `args`."""
    if not 1 <= args.min_len <= args.max_len:
        p.error("need 1 <= --min-len <= --max-len")
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch and --steps must be positive, --warmup not negative")
    if (args.snapshot or args.plot) and not args.device.startswith("cuda"):
        p.error("--snapshot and --plot need a CUDA --device")
    if args.plot and not args.allocator.startswith("gpupool"):
        p.error("--plot draws gpupool's history: use --allocator gpupool or gpupool-reserve "
                "(--snapshot works with every allocator)")
    return args


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (parsed before torch is imported)."""
    p = common_parser(__doc__, batch=8, min_len=128, max_len=1024, steps=20, warmup=3)
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default: 1e-4)")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps (default: 10)")
    p.add_argument("--full", action="store_true",
                   help="train every parameter (a full fine-tune, AdamW over all of them) instead of LoRA adapters")
    p.add_argument("--offload-optimizer", action="store_true",
                   help="gpupool only: gpupool.offloadable(optimizer, offload_after_step=True): the AdamW state "
                        "leaves the device between steps and comes back for the next step")
    p.add_argument("--fp32-master", action="store_true",
                   help="with --full: fp32 master weights, torch.autocast(bfloat16), fused AdamW (fp32 state) and "
                        "gradient checkpointing")
    p.add_argument("--prefetch-at", type=float, metavar="F",
                   help="with --offload-optimizer: gpupool.offloadable's prefetch_at (default: its own)")
    p.add_argument("--trace", metavar="PATH",
                   help="after the timed steps, record two more under torch.profiler into this Chrome trace")
    p.add_argument("--cap", type=float, metavar="GIB",
                   help="cap the process's device memory at GIB (gpupool's limit, or PyTorch's "
                        "set_per_process_memory_fraction): what runs out of memory, what trains")
    args = p.parse_args(argv)
    if args.log_every < 1:
        p.error("--log-every must be positive")
    if args.offload_optimizer and not args.allocator.startswith("gpupool"):
        p.error("--offload-optimizer needs --allocator gpupool")
    if args.cap is not None and args.cap <= 0:
        p.error("--cap must be a positive number of GiB")
    if args.fp32_master and not args.full:
        p.error("--fp32-master is a recipe of the full fine-tune: add --full")
    if args.fp32_master and args.dtype == "bf16":
        p.error("--fp32-master keeps fp32 weights: leave --dtype out")
    if args.prefetch_at is not None and not args.offload_optimizer:
        p.error("--prefetch-at needs --offload-optimizer")
    if args.fp32_master:
        args.dtype = "fp32"
    return check_common(p, args)


def select_allocator(allocator: str, device: str) -> bool:
    """Set the CUDA allocator up before torch is imported; True when it is gpupool."""
    if not device.startswith("cuda"):
        if allocator != "native":
            print(f"note: --allocator {allocator} ignored on {device}")
        return False
    if allocator in ALLOC_CONF:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[allocator]
    elif allocator == "native" and os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        print(f"note: PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']} (from the environment)")
    if not allocator.startswith("gpupool"):
        return False
    import gpupool

    try:
        gpupool.enable(**({"mode": "reserve"} if allocator == "gpupool-reserve" else {}))
    except RuntimeError as e:  # no torch, no GPU: say what to do, as open_device() does
        sys.exit(f"error: {e}; run with --device cpu (the allocator then stays PyTorch's)")
    return True


def tag(use_gpupool: bool, name: str, inherit: bool = False) -> ContextManager[Any]:
    """gpupool.tag(name) when gpupool holds this process's memory, else nothing.
    inherit=True: also for threads without a tag of their own -- autograd runs
    backward on its own thread, which would otherwise allocate untagged."""
    if use_gpupool:
        import gpupool

        if hasattr(gpupool, "tag"):
            return gpupool.tag(name, inherit=inherit)
    return contextlib.nullcontext()


def dtype_kwarg() -> str:
    """transformers renamed torch_dtype= to dtype= in 4.56."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def build_model(args: argparse.Namespace, device: "torch.device") -> Any:
    """A bf16 Qwen2 causal LM on `device`: random weights from a config, or local ones."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and device.type == "cuda")
    dtype = {dtype_kwarg(): torch.bfloat16 if bf16 else torch.float32}
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, **dtype).to(device)
    config = Qwen2Config(**SIZES[args.size])
    with device:
        return AutoModelForCausalLM.from_config(config, **dtype)


def add_lora(model: Any) -> Any:
    """Wrap `model` with LoRA adapters on the attention projections; the rest is frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"],
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def batches(args: argparse.Namespace, vocab: int, n: int) -> List["torch.Tensor"]:
    """`n` batches of token ids [batch, length] on the CPU, the same for every allocator."""
    import torch

    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    out = []
    for _ in range(n):
        length = rng.randint(args.min_len, args.max_len)
        out.append(torch.randint(0, vocab, (args.batch, length), generator=gen))
    return out


def peak_memory(use_gpupool: bool, device: "torch.device") -> Tuple[Optional[int], Optional[int]]:
    """(peak allocated, peak reserved) bytes as the allocator in use counts them."""
    import torch

    if device.type != "cuda":
        return None, None
    if use_gpupool:
        import gpupool

        s = gpupool.stats(device.index)
        return int(s["allocated_peak"]), int(s["reserved_peak"])
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def alloc_calls(use_gpupool: bool, device: "torch.device") -> Optional[int]:
    """Driver allocation calls (map + unmap, or cudaMalloc + cudaFree) made so
    far by the allocator in use, where it counts them."""
    import torch

    if device.type != "cuda":
        return None
    if use_gpupool:
        import gpupool

        s = gpupool.stats(device.index)
        return int(s["n_map"] + s["n_unmap"])
    try:
        s = torch.cuda.memory_stats(device)
    except RuntimeError:  # an allocator without statistics
        return None
    if "num_device_alloc" not in s:
        return None
    return int(s["num_device_alloc"] + s.get("num_device_free", 0))


def gib(n: Optional[int]) -> str:
    """Bytes as GiB, or n/a."""
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def open_device(name: str) -> "torch.device":
    """The torch.device of --device (made current when it is CUDA); exits if there is none."""
    import torch

    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch; run with --device cpu")
    if device.index is not None:  # set_device() rejects a device without an index
        torch.cuda.set_device(device.index)
    return torch.device("cuda", torch.cuda.current_device())


def start_history(args: argparse.Namespace) -> None:
    """With --snapshot or --plot: record every allocation and free, with Python stacks, from now on.

    Through torch's own call, so that it works with every allocator: under
    gpupool it turns on gpupool's history (gpupool.record_history)."""
    if args.snapshot or args.plot:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=1_000_000)


def save_history(args: argparse.Namespace) -> None:
    """Write what start_history recorded: --snapshot's pickle and --plot's PNG."""
    if args.snapshot:
        import torch

        torch.cuda.memory._dump_snapshot(args.snapshot)
        print(f"snapshot: {args.snapshot} (drop it on https://pytorch.org/memory_viz)")
    if args.plot:
        import gpupool

        print(f"plot: {gpupool.plot(args.plot)}")


def synchronize(device: "torch.device") -> None:
    """Wait for the device's queued work, so that a clock read after it is honest."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(args: argparse.Namespace, model: Any, device: "torch.device") -> str:
    """One line naming the model, its size and where it runs."""
    n = sum(p.numel() for p in model.parameters())
    what = f"weights from {args.model}" if args.model else f"{args.size} (random init)"
    alloc = args.allocator if device.type == "cuda" else "n/a"
    return f"model: {what}, {n / 1e6:.1f}M parameters, {model.dtype}; device {device}, allocator {alloc}"


def cap_memory(args: argparse.Namespace, use_gpupool: bool, device: "torch.device") -> None:
    """--cap: the most device memory the allocator may hold."""
    if args.cap is None or device.type != "cuda":
        return
    import torch

    cap = int(args.cap * 2**30)
    if use_gpupool:
        import gpupool

        gpupool.set_limit(cap)
    else:
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(device).total_memory,
                                                   device)
    print(f"device memory capped at {args.cap:g} GiB")


def record_trace(path: str, step: Any, n: int = 2) -> None:
    """`n` more steps under torch.profiler (CPU ops and the device's kernels
    and copies on every stream, the offloader's too), as a Chrome trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    synchronize(torch.device("cuda"))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for j in range(n):
            with torch.profiler.record_function(f"step {j}"):
                step(j)
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    print(f"trace: {path} ({n} steps)")


def train(args: argparse.Namespace, use_gpupool: bool) -> Dict[str, Any]:
    """Fine-tune for --warmup + --steps steps; returns the figures of the timed steps."""
    import torch

    device = open_device(args.device)
    start_history(args)
    torch.manual_seed(args.seed)

    cap_memory(args, use_gpupool, device)
    with tag(use_gpupool, "weights"):
        model = build_model(args, device)
    if not args.full:
        with tag(use_gpupool, "lora"):
            model = add_lora(model)
    model.train()
    if args.fp32_master:
        # Activations are recomputed in the backward pass instead of kept
        # (the non-reentrant variant: the hooks see every parameter's grad).
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = [p for p in model.parameters() if p.requires_grad]
    fused = {"fused": True} if args.fp32_master and device.type == "cuda" else {}
    opt = torch.optim.AdamW(trainable, lr=args.lr, **fused)
    handle = None
    if args.offload_optimizer:
        import gpupool

        kw = {} if args.prefetch_at is None else {"prefetch_at": args.prefetch_at}
        handle = gpupool.offloadable(opt, "optimizer", offload_after_step=True, **kw)
    vocab = model.config.vocab_size
    print(describe(args, model if args.full else model.get_base_model(), device))
    what = "full fine-tune" if args.full else "LoRA r=8 on q/k/v"
    if args.fp32_master:
        what += " (fp32 master weights, autocast bf16, fused AdamW, gradient checkpointing)"
    print(f"{what}: {sum(p.numel() for p in trainable) / 1e6:.2f}M trainable parameters; "
          f"batch {args.batch}, lengths {args.min_len}..{args.max_len}, "
          f"{args.warmup} warm-up + {args.steps} timed steps"
          f"{'; AdamW state offloaded between steps' if handle else ''}")

    data = batches(args, vocab, args.warmup + args.steps)
    total = len(data)
    autocast: ContextManager[Any] = (torch.autocast(device.type, dtype=torch.bfloat16) if args.fp32_master
                                     else contextlib.nullcontext())

    def step(i: int, ids: "torch.Tensor", quiet: bool = False) -> float:
        """One optimiser step on `ids`; returns its loss when it is printed, else nan
        (`quiet`: never, so that no device sync ends the step)."""
        with tag(use_gpupool, "activations"), autocast:
            ids = ids.to(device)
            loss = model(input_ids=ids, labels=ids).loss
        with tag(use_gpupool, "backward", inherit=True):  # gradients and backward temporaries
            loss.backward()
        with tag(use_gpupool, "optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if quiet or (i % args.log_every and i != total):
            return float("nan")
        value = loss.item()  # a device sync: only on the steps that print
        print(f"step {i:4d}/{total}  len {ids.shape[1]:5d}  loss {value:.4f}")
        return value

    for i, ids in enumerate(data[:args.warmup], start=1):
        step(i, ids)
    synchronize(device)
    calls0 = alloc_calls(use_gpupool, device)
    t0 = time.perf_counter()
    tokens = 0
    for i, ids in enumerate(data[args.warmup:], start=args.warmup + 1):
        loss = step(i, ids)
        tokens += ids.numel()
    synchronize(device)
    seconds = time.perf_counter() - t0
    calls = alloc_calls(use_gpupool, device)
    peak_alloc, peak_res = peak_memory(use_gpupool, device)
    if args.trace:
        record_trace(args.trace, lambda j: step(total, data[args.warmup + j % args.steps], quiet=True))
    if handle is not None:
        handle.restore()  # the state is counted where it lives during a step
    state_bytes = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                      if torch.is_tensor(v) and v.device.type == "cuda")
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "optimizer_state_bytes": state_bytes, "offload_optimizer": bool(handle), "full": args.full,
            "cap_gib": args.cap,
            "peak_allocated": peak_alloc, "peak_reserved": peak_res, "loss": loss,
            "alloc_calls_timed": None if calls is None or calls0 is None else calls - calls0,
            "fp32_master": args.fp32_master, "prefetch_at": args.prefetch_at,
            "mode": args.allocator if device.type == "cuda" else "cpu", "steps": args.steps,
            "warmup": args.warmup, "batch": args.batch, "size": args.model or args.size,
            "dtype": str(model.dtype), "device": str(device), "torch": torch.__version__}


def finish(args: argparse.Namespace, result: Dict[str, Any], use_gpupool: bool, counted: str) -> None:
    """Print the figures of a run (and gpupool's report), and write them to --json."""
    print(f"tokens/s: {result['tokens_per_s']:.1f} ({result['tokens']} {counted} in {result['seconds']:.2f} s "
          f"over {args.steps} timed steps)")
    print(f"peak allocated: {gib(result['peak_allocated'])}, peak reserved: {gib(result['peak_reserved'])}")
    if result.get("alloc_calls_timed") is not None:
        print(f"driver allocation calls during the timed steps: {result['alloc_calls_timed']}")
    if use_gpupool:
        import gpupool

        print(gpupool.report())
    save_history(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the fine-tune and print (and optionally save) its figures."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub, even by accident
    use_gpupool = select_allocator(args.allocator, args.device)
    try:
        result = train(args, use_gpupool)
    except Exception as e:
        import torch

        # Under --cap, running out of memory is a result (what trains at the
        # cap): said, and written to --json for the benchmark harness.
        if args.cap is None or not isinstance(e, (torch.OutOfMemoryError, MemoryError)):
            raise
        print(f"out of memory at the {args.cap:g} GiB cap ({args.allocator}): {str(e).splitlines()[0][:300]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"oom": True, "mode": args.allocator, "cap_gib": args.cap, "error": str(e)[:2000]}, f)
        return 1
    finish(args, result, use_gpupool, "tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
