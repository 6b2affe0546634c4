"""The workloads: what each runs in its worker process and which figure it is judged by.

Budget of the default run on an H100 (5 modes x 3 repetitions): lora and
inference about a third each, then frag and churn. Workers are forked from a
zygote per mode that has imported torch and transformers (benchmarks/zygote.py),
so a worker's start-up is its CUDA context and its model, not the imports.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from .modes import GPUPOOL_MODES, PYTORCH_MODES

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Workload:
    """One benchmark: its worker's arguments and the figure in its JSON that ranks modes."""

    name: str
    description: str
    metric: str  # key of the worker's JSON result
    unit: str  # as printed, after dividing by `scale`
    scale: float
    higher_is_better: bool
    argv: Tuple[str, ...]  # after the interpreter; --allocator/--mode and --json are added
    quick_argv: Tuple[str, ...]
    mode_flag: str  # the worker's option naming the allocator mode
    preload: Tuple[str, ...]  # modules a zygote imports for it (benchmarks/zygote.py)
    gpupool_argv: Tuple[str, ...] = ()  # added in gpupool's modes (what only gpupool can do)
    # The modes it runs in (empty: every mode asked for).  Offloading a tag,
    # or a graph's memory, is gpupool's alone: PyTorch's modes have nothing
    # to compare.
    modes: Tuple[str, ...] = ()
    in_default: bool = True  # run without --only (the soak and the finetune group take minutes)

    def command(self, mode: str, json_path: Path, quick: bool) -> List[str]:
        """The worker's command line for `mode`, writing its results to `json_path`."""
        extra = self.gpupool_argv if mode in GPUPOOL_MODES else ()
        return [sys.executable, *(self.quick_argv if quick else self.argv), *extra, self.mode_flag, mode,
                "--json", str(json_path)]


_LORA = str(EXAMPLES / "qwen_lora_finetune.py")
# The full fine-tune's mixed-precision recipe (fp32 master weights, autocast
# bf16, fused AdamW with 3.68 GiB of fp32 state, gradient checkpointing).
_FT = (_LORA, "--size", "0.5b", "--full", "--fp32-master", "--batch", "8", "--min-len", "512", "--max-len", "512",
       "--warmup", "3", "--steps", "15")
_FT_QUICK = (_LORA, "--size", "tiny", "--full", "--fp32-master", "--batch", "4", "--min-len", "128",
             "--max-len", "128", "--warmup", "2", "--steps", "5")
# A cap under the peak of every PyTorch mode on the recipe (about 14 GiB),
# above what it needs with the optimizer's state off the device.
FINETUNE_CAP_GIB = "11.49"
FINETUNE_CAP_QUICK_GIB = "0.25"  # the same for the --quick shape
_INFERENCE = str(EXAMPLES / "qwen_inference.py")
# transformers loads a model's code on first use: name it so that the zygote loads it.
_HF = ("torch", "transformers", "transformers.models.auto.modeling_auto", "transformers.models.qwen2.modeling_qwen2",
       "peft")

WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("lora", "LoRA fine-tune, Qwen2 0.5B shape, batch 8, lengths 128..1024",
             "tokens_per_s", "tokens/s", 1.0, True,
             (_LORA, "--size", "0.5b", "--batch", "8", "--min-len", "128", "--max-len", "1024",
              "--warmup", "5", "--steps", "40"),
             (_LORA, "--size", "tiny", "--batch", "4", "--min-len", "64", "--max-len", "256",
              "--warmup", "2", "--steps", "5"),
             "--allocator", _HF),
    Workload("finetune_base", "full fine-tune, fp32 master weights, autocast bf16, fused AdamW, checkpointing, "
             "Qwen2 0.5B shape, batch 8 x 512", "tokens_per_s", "tokens/s", 1.0, True, _FT, _FT_QUICK,
             "--allocator", _HF, in_default=False),
    Workload("finetune_offload", "the same with gpupool.offloadable(optimizer, offload_after_step=True)",
             "tokens_per_s", "tokens/s", 1.0, True, _FT, _FT_QUICK, "--allocator", _HF,
             gpupool_argv=("--offload-optimizer",), modes=("gpupool",), in_default=False),
    Workload("finetune_cap", f"the same at a {FINETUNE_CAP_GIB} GiB cap (gpupool: optimizer offloaded)",
             "tokens_per_s", "tokens/s", 1.0, True, (*_FT, "--cap", FINETUNE_CAP_GIB),
             (*_FT_QUICK, "--cap", FINETUNE_CAP_QUICK_GIB), "--allocator", _HF, gpupool_argv=("--offload-optimizer",),
             modes=(*PYTORCH_MODES, "gpupool"), in_default=False),
    Workload("inference", "generate(), Qwen2 0.5B shape, batch 4, prompts 64..512, 64 new tokens",
             "tokens_per_s", "tokens/s", 1.0, True,
             (_INFERENCE, "--size", "0.5b", "--batch", "4", "--min-len", "64", "--max-len", "512",
              "--new-tokens", "64", "--warmup", "1", "--steps", "2"),
             (_INFERENCE, "--size", "tiny", "--batch", "4", "--min-len", "64", "--max-len", "256",
              "--new-tokens", "16", "--warmup", "1", "--steps", "2"),
             "--allocator", _HF),
    Workload("churn", "torch.empty + del, 64 live tensors, 256 B..64 MiB log-uniform",
             "us_per_pair", "us/pair", 1.0, False,
             ("-m", "benchmarks.churn", "--pairs", "100000", "--warmup", "10000"),
             ("-m", "benchmarks.churn", "--pairs", "5000", "--warmup", "1000"),
             "--mode", ("torch",)),
    Workload("offload", "offload + restore of 1 and 8 GiB of bf16 weights (gpupool.offload, or pinned copies, "
             "free and empty_cache in PyTorch's modes)",
             "offload_gbps", "GB/s out", 1.0, True,
             ("-m", "benchmarks.offload", "--gib", "1,8", "--cycles", "3"),
             ("-m", "benchmarks.offload", "--gib", "0.25", "--cycles", "2"),
             "--mode", ("torch",)),
    Workload("offload_cold", "the first offload of a fresh process, 8 GiB of bf16: raw unprepared, with the "
             "default codec unprepared, and raw with the tag made offloadable 1.5 s before (gpupool); pin_memory "
             "tensors and copies (PyTorch's modes)",
             "offload_gbps", "GB/s out", 1.0, True,
             ("-m", "benchmarks.offload_cold", "--gib", "8"),
             ("-m", "benchmarks.offload_cold", "--gib", "0.5"),
             "--mode", ("torch",)),
    Workload("frag", "fwd+bwd on [b, s, 1024], b*s 1k..32k tokens up and down",
             "peak_reserved", "GiB reserved", float(2**30), False,
             ("-m", "benchmarks.frag", "--iters", "240", "--max-tokens", "32768"),
             ("-m", "benchmarks.frag", "--iters", "30", "--max-tokens", "8192"),
             "--mode", ("torch",)),
    Workload("soak", "1,000 offload/restore cycles of 1 GiB of bf16 tensors 1 KiB..64 MiB and an offloadable "
             "module; every bit checked each cycle, figures flat after cycle 2",
             "seconds_per_cycle", "s/cycle", 1.0, False,
             ("-m", "benchmarks.soak", "--gib", "1", "--cycles", "1000"),
             ("-m", "benchmarks.soak", "--gib", "0.25", "--cycles", "50"),
             "--mode", ("torch",), modes=("gpupool",), in_default=False),
    Workload("graph", "a decode step's CUDA graph sleeps with its weights and KV cache: wake (restore + first "
             "replay) against re-capture (examples/graph_sleep.py)",
             "wake_median_s", "ms wake", 1e-3, False,
             (str(EXAMPLES / "graph_sleep.py"),),
             (str(EXAMPLES / "graph_sleep.py"), "--layers", "2", "--cycles", "2"),
             "--allocator", ("torch",), modes=("gpupool",), in_default=False),
    Workload("replay", "a CUDA graph's replay on the host: a small step replayed beside 4,000 live tensors "
             "(gpupool: the model offloadable, held resident through each replay)",
             "us_per_replay", "us/replay", 1.0, False,
             ("-m", "benchmarks.replay"),
             ("-m", "benchmarks.replay", "--tensors", "200", "--replays", "100", "--rounds", "2"),
             "--mode", ("torch",), in_default=False),
    Workload("peer", "two GPUs of one process: the first copy from device 1 to device 0 while device 0 holds "
             "40 GiB in 2 MiB tensors (gpupool grants device 1 every mapping then)",
             "first_copy_s", "ms first copy", 1e-3, False,
             ("-m", "benchmarks.peer", "--gib", "40"),
             ("-m", "benchmarks.peer", "--gib", "1", "--copy-mib", "64", "--copies", "2"),
             "--mode", ("torch",), in_default=False),
]}

# Names `--only` takes for several workloads at once.
GROUPS: Dict[str, Tuple[str, ...]] = {"finetune": ("finetune_base", "finetune_offload", "finetune_cap")}
# What runs without --only (in_default: not the soak, the graph case or the
# finetune group, which takes as long again as the rest).
DEFAULT: Tuple[str, ...] = tuple(n for n, w in WORKLOADS.items() if w.in_default)
