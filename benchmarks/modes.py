"""The allocator modes the benchmarks compare, and how a worker process puts one in place.

A mode is chosen once per process, before torch is imported:

==================  ==========================================================
``native``          PyTorch's caching allocator, default settings
``expandable``      PyTorch's, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
``async``           ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``
``gpupool``         ``gpupool.enable()`` (expandable mode)
``gpupool-reserve`` ``gpupool.enable(mode="reserve")``: the pool mapped at start
==================  ==========================================================

The example scripts take the same names with ``--allocator``."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

PYTORCH_MODES: Tuple[str, ...] = ("native", "expandable", "async")
GPUPOOL_MODES: Tuple[str, ...] = ("gpupool", "gpupool-reserve")
MODES: Tuple[str, ...] = PYTORCH_MODES + GPUPOOL_MODES
ALLOC_CONF: Dict[str, str] = {"expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}

# Inherited variables that would change what a mode means; the mode sets its own.
SCRUBBED_ENV: Tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GPUPOOL_MODE")


def child_env(base: Mapping[str, str], pythonpath: Sequence[str]) -> Dict[str, str]:
    """The environment of a worker: `base` without SCRUBBED_ENV, `pythonpath` first on
    PYTHONPATH, unbuffered output and no Hugging Face hub access."""
    env = {k: v for k, v in base.items() if k not in SCRUBBED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [base.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def install(mode: str) -> None:
    """Make `mode` this process's CUDA allocator. Call before torch is imported
    (PyTorch reads PYTORCH_CUDA_ALLOC_CONF when it is loaded)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode in ALLOC_CONF:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[mode]
    elif mode in GPUPOOL_MODES:
        import gpupool

        if mode == "gpupool-reserve":
            gpupool.enable(mode="reserve")
        else:
            gpupool.enable()


def peak_memory(mode: str, device: Optional[int] = None) -> Tuple[int, int]:
    """(peak allocated, peak reserved) bytes as the allocator of `mode` counts them."""
    if mode in GPUPOOL_MODES:
        import gpupool

        s = gpupool.stats(device)
        return int(s["allocated_peak"]), int(s["reserved_peak"])
    import torch

    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def report(result: Mapping[str, Any], line: str, json_path: Optional[str]) -> int:
    """A worker's end: its one-line summary printed, its figures written to
    `json_path` when given; returns the exit status 0."""
    print(line)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0
