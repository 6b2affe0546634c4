"""Cold offload: the first offload of a fresh process, where host memory must be pinned.

    python -m benchmarks.offload_cold --mode gpupool --gib 8 --json out.json

Each case runs in a fresh interpreter of its own (a subprocess of this
worker): its CUDA context, its allocator and its pinned memory are new.
In it, `--gib` of bf16 N(0, 0.02) in 64 MiB tensors, then one timed
offload (raw but where named):

* ``none``: no preparation: the offload pins as it goes (gpupool pins
  slabs on several threads while the first are copied into).
* ``default``: the same with the codec a user gets without naming one
  (``GPUPOOL_CODEC``, ``auto``: ANS for bf16 where nvCOMP is installed):
  the host room of each piece is known once it is compressed, and the
  slabs for the rest are pinned ahead at the ratio so far.
* ``ready``: the tensors were made offloadable (``gpupool.offloadable``)
  ``--wait`` seconds before the offload: their host bytes are pinned in
  the background meanwhile.
* PyTorch's modes: what a user does without gpupool the first time:
  ``torch.empty(pin_memory=True)`` and copies into it, timed together.
* ``tms`` (with the ``native`` mode, where torch_memory_saver is installed):
  its ``pause`` of a region made with ``enable_cpu_backup=True`` (its
  default hook mode: its library preloaded into the fresh process), then
  ``resume``: the same first sleep and wake with another library.

Then, in the same process, the yardstick: pinned copies between buffers
that exist already (benchmarks.offload.pinned_copy), and the bytes are
checked after a restore.  The JSON's ``offload_gbps`` is the ``none`` case's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from .modes import GPUPOOL_MODES, MODES, install
from .offload import GIB, PIECE, checksum, fill, pinned_copy, rss


def one_case(mode: str, gib: float, case: str, wait: float) -> Dict[str, Any]:
    """The case, in this (fresh) process."""
    install(mode)
    import torch

    nbytes = int(gib * GIB) // PIECE * PIECE
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    row: Dict[str, Any] = {"case": case, "gib": nbytes / GIB}
    if mode in GPUPOOL_MODES:
        import gpupool

        tag = "cold_weights"
        with gpupool.tag(tag):
            ts = fill(torch, nbytes, "bf16", g)
        torch.cuda.synchronize()
        sums = checksum(torch, ts)
        ptrs = [t.data_ptr() for t in ts]
        if case == "ready":
            module = torch.nn.Module()
            module.weights = torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in ts])
            gpupool.offloadable(module, tag)
            time.sleep(wait)
        off0 = gpupool.stats().get("offload") or {}
        rss0 = rss()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = gpupool.offload(tag, codec=None if case == "default" else "raw", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        off1 = gpupool.stats()["offload"]
        row.update(pins=off1["n_pin"] - off0.get("n_pin", 0), pinned_before=off0.get("host_slabs", 0),
                   rss_grew=rss() - rss0, codec=res["codec"], host_bytes=res["host_bytes"])
        t2 = time.perf_counter()
        gpupool.restore(tag)
        torch.cuda.synchronize()
        row["restore_gbps"] = nbytes / (time.perf_counter() - t2) / 1e9
        row["same_bytes"] = checksum(torch, ts) == sums and [t.data_ptr() for t in ts] == ptrs
    elif case == "tms":
        from torch_memory_saver import torch_memory_saver as tms

        with tms.region(tag="cold", enable_cpu_backup=True):
            ts = fill(torch, nbytes, "bf16", g)
        torch.cuda.synchronize()
        sums, ptrs = checksum(torch, ts), [t.data_ptr() for t in ts]
        rss0 = rss()
        t0 = time.perf_counter()
        tms.pause("cold")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        row.update(pins=0, pinned_before=0, rss_grew=rss() - rss0)
        t2 = time.perf_counter()
        tms.resume("cold")
        torch.cuda.synchronize()
        row["restore_gbps"] = nbytes / (time.perf_counter() - t2) / 1e9
        row["same_bytes"] = checksum(torch, ts) == sums and [t.data_ptr() for t in ts] == ptrs
    else:
        ts = fill(torch, nbytes, "bf16", g)
        torch.cuda.synchronize()
        sums = checksum(torch, ts)
        rss0 = rss()
        t0 = time.perf_counter()
        hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in ts]
        for h, t in zip(hosts, ts):
            h.copy_(t, non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        row.update(pins=len(hosts), pinned_before=0, rss_grew=rss() - rss0)
        row["same_bytes"] = checksum(torch, [h.cuda() for h in hosts]) == sums
        del hosts
    row["offload_s"] = t1 - t0
    row["offload_gbps"] = nbytes / (t1 - t0) / 1e9
    del ts
    torch.cuda.empty_cache()
    row.update(pinned_copy(torch, min(nbytes, 2 * GIB)))  # (the link's speed: 2 GiB tell it)
    row["vs_pinned"] = row["offload_gbps"] / row["pinned_d2h_gbps"]
    return row


def tms_installed() -> bool:
    """Whether torch_memory_saver can be imported here (its case runs then)."""
    try:
        import torch_memory_saver  # noqa: F401
    except ImportError:
        return False
    return True


def tms_env() -> Dict[str, str]:
    """The environment of torch_memory_saver's case: its hook library preloaded."""
    from torch_memory_saver.utils import get_binary_path_from_package

    return dict(os.environ, LD_PRELOAD=str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--gib", type=float, default=8.0)
    p.add_argument("--wait", type=float, default=1.5, help="seconds between offloadable() and the offload")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # (the fresh process's own)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    if a.case:
        with open(a.json, "w") as f:
            json.dump(one_case(a.mode, a.gib, a.case, a.wait), f)
        return
    cases = ("none", "default", "ready") if a.mode in GPUPOOL_MODES else ("none",)
    cases += ("tms",) if a.mode == "native" and tms_installed() else ()
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpupool-cold-") as tmp:
        for case in cases:
            out = os.path.join(tmp, f"{case}.json")
            r = subprocess.run([sys.executable, "-m", "benchmarks.offload_cold", "--mode", a.mode, "--gib",
                                str(a.gib), "--wait", str(a.wait), "--case", case, "--json", out],
                               capture_output=True, text=True, env=tms_env() if case == "tms" else None)
            if r.returncode != 0:
                raise SystemExit(f"cold case {case} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
            with open(out) as f:
                rows.append(json.load(f))
    res = {"mode": a.mode, "cold": rows, "offload_gbps": rows[0]["offload_gbps"],
           "tms": "installed" if tms_installed() else "not installed"}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
