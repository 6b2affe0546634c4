"""python -m benchmarks: run the workloads in every mode, interleaved, and print the table.

See the package's doc (benchmarks/__init__.py) for what is measured."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .modes import ALLOC_CONF, GPUPOOL_MODES, MODES, PYTORCH_MODES, child_env
from .nvml import INTERVAL_S, Nvml, PeakSampler
from .workloads import DEFAULT, GROUPS, ROOT, WORKLOADS, Workload
from .zygote import Zygote

GIB = float(2**30)
# Cases of their own, not run per mode (each its own module); only when named in --only.
CASES = ("tenants",)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(DEFAULT),
                   help=f"comma-separated workloads of {','.join(WORKLOADS)}, or groups of them "
                        f"({', '.join(f'{g}: {chr(44).join(ws)}' for g, ws in GROUPS.items())}; default: "
                        f"{','.join(DEFAULT)}); also {','.join(CASES)}, only when named (benchmarks/tenants.py: "
                        "LoRA jobs sharing a GPU as tenants)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated modes (default: {','.join(MODES)})")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each (workload, mode) (default: 3)")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one worker may run (default: 300)")
    p.add_argument("--nvml-interval", type=float, default=INTERVAL_S, metavar="SECONDS",
                   help=f"NVML sampling period of the workers' device memory; 0: no NVML figures "
                        f"(default: {INTERVAL_S})")
    p.add_argument("--fresh", action="store_true",
                   help="start each worker as a fresh interpreter instead of forking it from a zygote "
                        "that has imported torch (slower; the same figures)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write every run and the summary to PATH as JSON (default: nothing is written)")
    args = p.parse_args(argv)
    args.only = [x for w in args.only.split(",") if w for x in GROUPS.get(w, (w,))]
    args.modes = [m for m in args.modes.split(",") if m]
    for w in args.only:
        if w not in WORKLOADS and w not in CASES:
            p.error(f"unknown workload {w!r}; expected some of {', '.join((*WORKLOADS, *CASES))}")
    args.cases = [w for w in args.only if w in CASES]
    args.only = [w for w in args.only if w in WORKLOADS]
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; expected some of {', '.join(MODES)}")
    if args.reps < 1:
        p.error("--reps must be positive")
    if args.nvml_interval < 0:
        p.error("--nvml-interval must be >= 0 (0 turns NVML sampling off)")
    return args


def nvml_for_workers() -> Nvml:
    """NVML on the GPU the workers use as their device 0: CUDA_VISIBLE_DEVICES' first
    entry (a UUID or an index in PCI bus order, which the workers are told to use)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith("GPU-"):
        return Nvml(first)
    return Nvml(None, int(first) if first.isdigit() else 0)


def mode_env(env: Dict[str, str], mode: str) -> Dict[str, str]:
    """A worker's environment for `mode`: PyTorch's allocator settings must be in
    place when torch is loaded, which in a zygote is before the worker exists."""
    return {**env, "PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF[mode]} if mode in ALLOC_CONF else dict(env)


def run_worker(w: Workload, mode: str, quick: bool, timeout: float, nvml: Optional[Nvml],
               interval: float, env: Dict[str, str], workdir: Path,
               zygote: Optional[Zygote]) -> Dict[str, Any]:
    """One worker process (forked by `zygote`, or a fresh interpreter without one);
    its JSON result plus the NVML peak, or {"error": ...}."""
    out = workdir / f"{w.name}-{mode}-{time.monotonic_ns()}.json"
    log = out.with_suffix(".log")
    cmd = w.command(mode, out, quick)
    sampler = PeakSampler(nvml, interval) if nvml and nvml.available else None
    t0 = time.perf_counter()
    rc: Optional[int]
    if zygote:
        pid = zygote.start(cmd[1:], log)
        if sampler:
            sampler.start(pid)
        rc = zygote.wait(pid, timeout)
    else:
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=mode_env(env, mode), stdout=f, stderr=subprocess.STDOUT)
            if sampler:
                sampler.start(proc.pid)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
    seen = sampler.stop() if sampler else {}
    wall = time.perf_counter() - t0
    if rc != 0 and out.exists() and json.loads(out.read_text()).get("oom"):
        # Out of memory under a cap: a result (what runs at the cap), not a failure.
        return {**json.loads(out.read_text()), **seen, "wall_s": wall}
    if rc != 0 or not out.exists():
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        why = f"timed out after {timeout:.0f} s" if rc is None else f"exit status {rc}"
        return {"error": f"{why}: {' | '.join(tail)}", "wall_s": wall}
    result = json.loads(out.read_text())
    result.update(seen)
    result["wall_s"] = wall
    return result


def summarize(runs: List[Dict[str, Any]], w: Workload) -> Dict[str, Dict[str, Any]]:
    """Per mode: median, min and max of the workload's metric, and medians of the memory figures."""
    by_mode: Dict[str, List[Dict[str, Any]]] = {}
    oom: Dict[str, int] = {}
    for r in runs:
        if r["workload"] == w.name and r["result"].get("oom"):
            oom[r["mode"]] = oom.get(r["mode"], 0) + 1
        elif r["workload"] == w.name and "error" not in r["result"]:
            by_mode.setdefault(r["mode"], []).append(r["result"])
    out: Dict[str, Dict[str, Any]] = {m: {"oom": n, "median": None} for m, n in oom.items() if m not in by_mode}
    for mode, results in by_mode.items():
        values = [r[w.metric] for r in results]

        def med(key: str) -> Optional[float]:
            xs = [r[key] for r in results if r.get(key) is not None]
            return statistics.median(xs) if xs else None

        s = {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
             "peak_allocated": med("peak_allocated"), "peak_reserved": med("peak_reserved"),
             "nvml_peak": med("nvml_peak"), "alloc_calls_timed": med("alloc_calls_timed")}
        pa, pr = s["peak_allocated"], s["peak_reserved"]
        s["reserved_over_allocated"] = pr / pa if pa and pr else None
        s["oom"] = oom.get(mode, 0)
        out[mode] = s
    best = [out[m]["median"] for m in PYTORCH_MODES if m in out and out[m]["median"] is not None]
    if best:
        ref = max(best) if w.higher_is_better else min(best)
        for s in out.values():
            if s["median"] is not None:
                s["vs_best_pytorch"] = s["median"] / ref
    if out.get("native", {}).get("median"):
        for s in out.values():
            if s["median"] is not None:
                s["vs_native"] = s["median"] / out["native"]["median"]
    return out


def fmt(x: Optional[float], spec: str, scale: float = 1.0) -> str:
    """A figure, or '-' where there is none."""
    return "-" if x is None else format(x / scale, spec)


def table(w: Workload, summary: Dict[str, Dict[str, Any]], modes: Sequence[str]) -> str:
    """The workload's rows, as a Markdown table."""
    lines = [f"### {w.name}: {w.description}", "",
             f"| mode | {w.unit} median | spread (min..max) | vs best PyTorch | vs native | peak alloc GiB "
             f"| peak reserved GiB | reserved/alloc | NVML peak GiB | driver alloc calls (timed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    spec = ".3f" if w.scale != 1.0 or w.unit.startswith("us") else ".0f"
    for m in modes:
        s = summary.get(m)
        if w.modes and m not in w.modes:
            continue
        if s is None:
            lines.append(f"| {m} | failed | | | | | | | | |")
            continue
        if s["median"] is None:
            lines.append(f"| {m} | out of memory ({s['oom']} of {s['oom']} runs) | | | | | | | | |")
            continue
        lines.append(
            f"| {m} | {fmt(s['median'], spec, w.scale)} | {fmt(s['min'], spec, w.scale)}.."
            f"{fmt(s['max'], spec, w.scale)} (n={s['n']}) | {fmt(s.get('vs_best_pytorch'), '.3f')} "
            f"| {fmt(s.get('vs_native'), '.3f')} | {fmt(s['peak_allocated'], '.2f', GIB)} "
            f"| {fmt(s['peak_reserved'], '.2f', GIB)} | {fmt(s['reserved_over_allocated'], '.3f')} "
            f"| {fmt(s['nvml_peak'], '.2f', GIB)} | {fmt(s['alloc_calls_timed'], '.0f')} |")
    return "\n".join(lines)


def goals(summaries: Dict[str, Dict[str, Dict[str, Any]]]) -> List[str]:
    """The issue's goals, each with the figures that decide it: 'PASS ...' or 'FAIL ...'."""
    out: List[str] = []

    def check(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}  {text}")

    for mode in GPUPOOL_MODES:
        lora = summaries.get("lora", {})
        g = lora.get(mode)
        if g and g.get("vs_best_pytorch") is not None:
            check(g["vs_best_pytorch"] >= 1.0, f"lora {mode}: tokens/s {g['vs_best_pytorch']:.3f}x the best "
                  f"PyTorch mode (goal >= 1.00)")
            if mode == "gpupool" and g["reserved_over_allocated"] is not None:  # reserve maps all by design
                check(g["reserved_over_allocated"] <= 1.05, f"lora {mode}: peak reserved / peak allocated "
                      f"{g['reserved_over_allocated']:.3f} (goal <= 1.05)")
            others = [lora[m]["nvml_peak"] for m in PYTORCH_MODES if m in lora and lora[m]["nvml_peak"]]
            if mode == "gpupool" and g["nvml_peak"] and others:
                check(g["nvml_peak"] < min(others), f"lora {mode}: NVML peak {g['nvml_peak'] / GIB:.2f} GiB, "
                      f"lowest PyTorch mode {min(others) / GIB:.2f} GiB (goal: below every PyTorch mode)")
        c = summaries.get("churn", {}).get(mode)
        if c and c.get("vs_native") is not None:
            check(c["vs_native"] <= 0.9, f"churn {mode}: {c['vs_native']:.3f}x native's us per pair (goal <= 0.90)")
        i = summaries.get("inference", {}).get(mode)
        if i and i.get("vs_native") is not None:
            check(i["vs_native"] >= 1.0, f"inference {mode}: tokens/s {i['vs_native']:.3f}x native (goal >= 1.00)")
            if mode == "gpupool" and i["reserved_over_allocated"] is not None:
                check(i["reserved_over_allocated"] <= 1.05, f"inference {mode}: peak reserved / peak allocated "
                      f"{i['reserved_over_allocated']:.3f} (goal <= 1.05)")
    out += finetune_goals(summaries)
    for name, s in summaries.items():
        r = s.get("gpupool-reserve")
        if r and r.get("alloc_calls_timed") is not None:
            check(r["alloc_calls_timed"] == 0, f"{name} gpupool-reserve: {r['alloc_calls_timed']:.0f} driver "
                  f"allocation calls after warm-up (goal: 0)")
    return out


def finetune_goals(summaries: Dict[str, Dict[str, Dict[str, Any]]]) -> List[str]:
    """The optimizer's round trip under compute: the fp32 recipe with its state
    offloaded trains at >= 0.85x the tokens/s of gpupool without offload,
    uncapped and at a cap where every PyTorch mode runs out of memory."""
    out: List[str] = []
    base = summaries.get("finetune_base", {}).get("gpupool", {}).get("median")
    if not base:
        return out
    for name, what in (("finetune_offload", "uncapped"), ("finetune_cap", "at the cap")):
        g = summaries.get(name, {}).get("gpupool")
        if g is None:
            continue
        ratio = (g["median"] or 0.0) / base
        spread = "" if g["median"] is None else f", spread {g['min'] / base:.3f}..{g['max'] / base:.3f}"
        out.append(f"{'PASS' if ratio >= 0.85 else 'FAIL'}  {name} gpupool (optimizer offloaded, {what}): "
                   f"{ratio:.3f}x the tokens/s of gpupool without offload{spread} (goal >= 0.85)")
    cap = summaries.get("finetune_cap", {})
    for m in PYTORCH_MODES:
        if m in cap:
            ok = cap[m]["median"] is None
            out.append(f"{'PASS' if ok else 'FAIL'}  finetune_cap {m}: "
                       f"{'out of memory' if ok else 'trains'} at the cap (goal: out of memory)")
    return out


def _offload_variants(runs: List[Dict[str, Any]], mode: str) -> Dict[tuple, List[Dict[str, Any]]]:
    """The offload workload's results of `mode`, by (GiB, codec, data), over the repetitions."""
    out: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in runs:
        if r["workload"] == "offload" and r["mode"] == mode and "error" not in r["result"]:
            for v in r["result"]["sizes"]:
                out.setdefault((v["gib"], v["codec"], v["data"]), []).append(v)
    return out


def offload_table(runs: List[Dict[str, Any]], modes: Sequence[str]) -> str:
    """The offload workload's figures per mode, size, codec and data, medians over the repetitions."""
    lines = ["| mode | GiB | codec (used) | data | out GB/s | back GB/s | pinned D2H / H2D GB/s | out / pinned "
             "| back / pinned | host / bytes | same data_ptr | same bytes | pins after 1st | device freed - bytes "
             "MiB (1st) | RSS - host bytes MiB (1st) | RSS growth later MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        for (gib, codec, data), per in _offload_variants(runs, mode).items():
            def med(k: str) -> float:
                return statistics.median(float(x[k]) for x in per)

            lines.append(f"| {mode} | {gib:g} | {codec} ({per[-1]['codec_used']}) | {data} | {med('offload_gbps'):.1f} "
                         f"| {med('restore_gbps'):.1f} | {med('pinned_d2h_gbps'):.1f} / {med('pinned_h2d_gbps'):.1f} "
                         f"| {med('offload_vs_pinned'):.2f} | {med('restore_vs_pinned'):.2f} "
                         f"| {med('host_over_bytes'):.3f} | {all(x['same_ptrs'] for x in per)} "
                         f"| {all(x['same_bytes'] for x in per)} | {max(x['pins_after_first'] for x in per)} "
                         f"| {min(x['min_device_freed_minus_bytes'] for x in per) / 2**20:.1f} "
                         f"({min(x['first_device_freed_minus_bytes'] for x in per) / 2**20:.1f}) "
                         f"| {max(x['max_rss_over_host_bytes'] for x in per) / 2**20:.1f} "
                         f"| {max(x['max_rss_grew_later'] for x in per) / 2**20:.1f} |")
    return "\n".join(lines)


def offload_goals(runs: List[Dict[str, Any]]) -> List[str]:
    """Issue 15's goals, from the gpupool runs of the offload workload."""
    out: List[str] = []
    var = _offload_variants(runs, "gpupool")

    def check(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}  {text}")

    def med(per: List[Dict[str, Any]], k: str) -> float:
        return statistics.median(float(x[k]) for x in per)

    for (gib, codec, data), per in sorted(var.items()):
        g = f"offload gpupool {gib:g} GiB {codec} {data}:"
        if codec == "raw" and data == "bf16":
            check(med(per, "offload_vs_pinned") >= 0.85, f"{g} offload {med(per, 'offload_vs_pinned'):.2f}x the pinned "
                  f"copy (goal >= 0.85)")
            check(med(per, "restore_vs_pinned") >= 0.85, f"{g} restore {med(per, 'restore_vs_pinned'):.2f}x the pinned "
                  f"copy (goal >= 0.85)")
            freed = min(x["min_device_freed_minus_bytes"] for x in per)
            check(freed >= -2 * 2**20, f"{g} device free memory grew by the offloaded bytes {freed / 2**20:+.1f} MiB "
                  f"(goal >= -2 MiB)")
            over = max(x["max_rss_over_host_bytes"] for x in per)
            check(over <= 64 * 2**20, f"{g} host RSS grew by the host bytes {over / 2**20:+.1f} MiB (goal <= +64 MiB)")
            later = max(x["max_rss_grew_later"] for x in per)
            check(later <= 16 * 2**20, f"{g} later cycles grew host RSS by {later / 2**20:.1f} MiB (goal: nothing)")
        if codec == "auto" and data == "bf16" and per[-1]["codec_used"] != "raw":
            check(med(per, "host_over_bytes") <= 0.70, f"{g} host bytes {med(per, 'host_over_bytes'):.3f} of raw "
                  f"(goal <= 0.70)")
            check(med(per, "offload_vs_pinned") >= 1.2, f"{g} offload {med(per, 'offload_vs_pinned'):.2f}x the pinned "
                  f"copy (goal >= 1.2)")
            check(med(per, "restore_vs_pinned") >= 1.3, f"{g} restore {med(per, 'restore_vs_pinned'):.2f}x the pinned "
                  f"copy (goal >= 1.3)")
            # (beside the staging: the 1 MiB of checksums the offloader takes at start)
            own = max(x.get("max_own_device", 0) for x in per) - 2**20
            check(own <= 160 * 2**20, f"{g} staging {own / 2**20:.1f} MiB of device memory (goal <= 160 MiB)")
        if codec == "auto" and data == "random" and (gib, "raw", "random") in var:
            raw = var[(gib, "raw", "random")]
            slower = 1 - med(per, "offload_gbps") / med(raw, "offload_gbps")
            check(slower <= 0.05, f"{g} offload {100 * slower:+.1f}% slower than raw on incompressible data "
                  f"(goal <= 5%)")
        check(all(x["same_ptrs"] and x["same_bytes"] for x in per), f"{g} data_ptr unchanged and bytes identical")
        check(max(x["pins_after_first"] for x in per) == 0, f"{g} no pinned allocation after the first cycle")
    return out


def _results(runs: List[Dict[str, Any]], name: str) -> List[Dict[str, Any]]:
    return [r["result"] for r in runs if r["workload"] == name and "error" not in r["result"]]


def soak_lines(runs: List[Dict[str, Any]]) -> List[str]:
    """The soak's figures at cycle 2 and at the last cycle, per run."""
    out = []
    for x in _results(runs, "soak"):
        for label, f in (("cycle 2", x["at2"]), (f"cycle {x['cycles']}", x["last"])):
            out.append(f"soak {label:10s}: reserved {f['reserved'] / 2**20:.1f} MiB, pinned {f['pinned'] / 2**20:.1f} MiB, "
                       f"RSS {f['rss'] / 2**20:.1f} MiB, fds {f['fds']}, threads {f['threads']}, "
                       f"device free {f['device_free'] / 2**20:.1f} MiB")
        out.append(f"soak: {x['tensors']} tensors, {x['tag_bytes'] / 2**30:.2f} GiB, {x['seconds_per_cycle'] * 1e3:.1f} ms "
                   f"per cycle")
    return out


def peer_lines(runs: List[Dict[str, Any]], modes: Sequence[str]) -> List[str]:
    """The peer workload's other figures per mode: copy rates, and the cost of a tensor
    mapped before and after the first copy between the devices (medians)."""
    out = []
    for m in modes:
        per = [r["result"] for r in runs if r["workload"] == "peer" and r["mode"] == m and "error" not in r["result"]]
        if per:
            med = {k: statistics.median(x[k] for x in per) for k in
                   ("copy_0_to_1_gbps", "copy_1_to_0_gbps", "fill_us_per_tensor", "refill_us_per_tensor")}
            out.append(f"peer {m}: {med['copy_0_to_1_gbps']:.0f} GB/s 0->1, {med['copy_1_to_0_gbps']:.0f} GB/s 1->0; "
                       f"{med['fill_us_per_tensor']:.1f} us per tensor before the first copy, "
                       f"{med['refill_us_per_tensor']:.1f} after ({per[-1]['tensors']} tensors)")
    return out


def soak_goals(runs: List[Dict[str, Any]]) -> List[str]:
    """Bytes identical every cycle; every figure flat after cycle 2."""
    out: List[str] = []
    for x in _results(runs, "soak"):
        out.append(f"{'PASS' if x['n_bad'] == 0 else 'FAIL'}  soak: bytes identical every cycle "
                   f"({x['n_bad']} of {x['cycles']} cycles differed)")
        grew = {k: x["max_later"][k] - x["at2"][k] for k in ("reserved", "pinned", "rss", "fds", "threads")}
        out.append(f"{'PASS' if all(x['flat'].values()) else 'FAIL'}  soak: flat after cycle 2 (reserved, pinned, fds, "
                   f"threads exactly; RSS within 16 MiB): largest rise " + ", ".join(f"{k} {v:+d}" for k, v in grew.items()))
    return out


def graph_goals(runs: List[Dict[str, Any]]) -> List[str]:
    out: List[str] = []
    for x in _results(runs, "graph"):
        w, r = x["wake_median_s"], x["recapture_median_s"]
        out.append(f"{'PASS' if x['identical'] else 'FAIL'}  graph: identical output after every wake")
        out.append(f"{'PASS' if w < r else 'FAIL'}  graph: wake {w * 1e3:.1f} ms faster than re-capture "
                   f"{r * 1e3:.1f} ms ({r / w:.2f}x)")
    return out


def _cold_cases(runs: List[Dict[str, Any]], mode: str) -> Dict[str, List[Dict[str, Any]]]:
    """The cold offload's cases of `mode`, by case, over the repetitions."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for r in runs:
        if r["workload"] == "offload_cold" and r["mode"] == mode and "error" not in r["result"]:
            for c in r["result"]["cold"]:
                out.setdefault(c["case"], []).append(c)
    return out


def cold_table(runs: List[Dict[str, Any]], modes: Sequence[str]) -> str:
    """The cold offload's figures per mode and case: median [min-max] over the repetitions."""
    lines = ["| mode | case | GiB | out GB/s [min-max] | back GB/s | pinned D2H GB/s | out / pinned | pinned before MiB "
             "| slabs pinned in the call | RSS growth MiB | same bytes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        for case, per in _cold_cases(runs, mode).items():
            def med(k: str) -> float:
                return statistics.median(float(x[k]) for x in per)

            gb = [x["offload_gbps"] for x in per]
            lines.append(f"| {mode} | {case} | {per[-1]['gib']:g} | {med('offload_gbps'):.1f} [{min(gb):.1f}-"
                         f"{max(gb):.1f}] | {med('restore_gbps') if 'restore_gbps' in per[-1] else float('nan'):.1f} "
                         f"| {med('pinned_d2h_gbps'):.1f} | {med('vs_pinned'):.2f} "
                         f"| {med('pinned_before') / 2**20:.0f} | {med('pins'):.0f} | {med('rss_grew') / 2**20:.0f} "
                         f"| {all(x['same_bytes'] for x in per)} |")
    tms = sorted({r["result"].get("tms", "") for r in runs if r["workload"] == "offload_cold"
                  and "error" not in r["result"]})
    lines.append(f"\ntorch_memory_saver: {', '.join(t for t in tms if t) or 'not installed'} (its case: native, tms;"
                 " back: the restore, or its resume, right after)")
    return "\n".join(lines)


def cold_goals(runs: List[Dict[str, Any]]) -> List[str]:
    """The cold offload's goals, from the gpupool runs."""
    out: List[str] = []
    cases = _cold_cases(runs, "gpupool")

    def check(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}  {text}")

    def spread(per: List[Dict[str, Any]], k: str, fmt: str) -> str:
        xs = [float(x[k]) for x in per]
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}, {len(xs)} reps]"

    if "none" in cases:
        per = cases["none"]
        check(statistics.median(x["offload_gbps"] for x in per) >= 20.0,
              f"offload_cold gpupool {per[-1]['gib']:g} GiB raw, fresh process, no preparation: "
              f"{spread(per, 'offload_gbps', '.1f')} GB/s (goal >= 20)")
    if "default" in cases:
        per = cases["default"]
        check(statistics.median(x["offload_gbps"] for x in per) >= 20.0,
              f"offload_cold gpupool {per[-1]['gib']:g} GiB with the default codec ({per[-1].get('codec', '?')}), "
              f"fresh process, no preparation: {spread(per, 'offload_gbps', '.1f')} GB/s (goal >= 20)")
    if "ready" in cases:
        per = cases["ready"]
        check(statistics.median(x["vs_pinned"] for x in per) >= 0.85,
              f"offload_cold gpupool {per[-1]['gib']:g} GiB raw, made offloadable before: "
              f"{spread(per, 'vs_pinned', '.2f')}x the pinned copy (goal >= 0.85)")
    for case, per in cases.items():
        check(all(x["same_bytes"] for x in per), f"offload_cold gpupool {case}: data_ptr unchanged and bytes identical")
    return out


def machine() -> Dict[str, Any]:
    """Where the figures come from: GPU, driver, torch (asked of a throwaway process, so that
    this one never creates a CUDA context)."""
    probe = ("import json, sys\n"
             "try:\n    import torch\nexcept ImportError:\n"
             "    sys.exit(print(json.dumps({'error': 'PyTorch is not installed (pip install torch)'})))\n"
             "if not torch.cuda.is_available():\n"
             "    sys.exit(print(json.dumps({'error': 'no CUDA device visible to torch ' + repr(torch.__version__)})))\n"
             "p = torch.cuda.get_device_properties(0)\n"
             "print(json.dumps({'gpu': p.name, 'gpu_memory_gib': round(p.total_memory / 2**30, 1), "
             "'torch': torch.__version__, 'cuda': torch.version.cuda}))\n")
    try:
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except subprocess.SubprocessError as e:
        return {"error": f"the probe of the GPU failed: {e}"}
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "the probe of the GPU failed: " + (r.stderr.strip().splitlines() or ["no output"])[-1]}
    if "error" in info:
        return info
    info.update({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "python": platform.python_version(), "host": platform.machine()})
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run every (workload, mode) --reps times, modes interleaved, then print and save the table."""
    args = parse_args(argv)
    env = child_env(os.environ, [str(ROOT)])
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's order: so that both name the same device
    info = machine()
    if "error" in info:  # one line, before any worker starts and before any file is written
        print(f"error: python -m benchmarks needs PyTorch and a CUDA GPU: {info['error']}", file=sys.stderr)
        return 2
    print(f"machine: {json.dumps(info)}", flush=True)
    nvml = nvml_for_workers() if args.nvml_interval > 0 else None
    if nvml and nvml.note:
        print(f"note: {nvml.note}")
    runs: List[Dict[str, Any]] = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        zygotes: Dict[str, Zygote] = {}
        if not args.fresh and args.only:
            preload = sorted({m for name in args.only for m in WORKLOADS[name].preload})
            zygotes = {mode: Zygote(preload, mode_env(env, mode), ROOT, Path(tmp) / f"zygote-{mode}.log")
                       for mode in args.modes}
            for z in zygotes.values():  # imported in parallel, before any timed run
                z.ready()
        for rep in range(args.reps):
            for name in args.only:
                w = WORKLOADS[name]
                # Rotate the order each repetition, so that no mode always runs first (warm clocks).
                k = rep % len(args.modes)
                for mode in args.modes[k:] + args.modes[:k]:
                    if w.modes and mode not in w.modes:
                        continue
                    r = run_worker(w, mode, args.quick, args.timeout, nvml, args.nvml_interval, env, Path(tmp),
                                   zygotes.get(mode))
                    runs.append({"workload": name, "mode": mode, "rep": rep, "result": r})
                    shown = "out of memory" if r.get("oom") else (r.get("error") or
                                                                  f"{r[w.metric] / w.scale:.3f} {w.unit}")
                    print(f"[rep {rep + 1}/{args.reps}] {name:9s} {mode:15s} {r['wall_s']:6.1f} s  {shown}",
                          flush=True)
        for z in zygotes.values():
            z.close()
    cases: Dict[str, Dict[str, Any]] = {}
    if "tenants" in args.cases:  # its own processes, after the workloads (it needs the GPU to itself)
        from . import tenants

        cases["tenants"] = tenants.run_case(tenants.parse_args(["--reps", str(args.reps)] + ["--quick"] * args.quick),
                                            show=False)
    if nvml:
        nvml.close()
    summaries = {name: summarize(runs, WORKLOADS[name]) for name in args.only}
    print(f"\n## gpupool benchmarks, {info.get('date')}: {info.get('gpu', '?')}, torch {info.get('torch', '?')}, "
          f"median of {args.reps} interleaved runs{' (--quick)' if args.quick else ''}\n")
    for name in args.only:
        print(table(WORKLOADS[name], summaries[name], args.modes) + "\n")
        if name == "offload":
            print(offload_table(runs, args.modes) + "\n")
        if name == "soak":
            print("\n".join(soak_lines(runs)) + "\n")
        if name == "offload_cold":
            print(cold_table(runs, args.modes) + "\n")
        if name == "peer":
            print("\n".join(peer_lines(runs, args.modes)) + "\n")
    for c in cases.values():
        print(c["table"] + "\n")
    verdicts = (goals(summaries) + offload_goals(runs) + cold_goals(runs) + soak_goals(runs) + graph_goals(runs)
                + [v for c in cases.values() for v in c["goals"]])
    if verdicts:
        print("Goals:\n" + "\n".join(verdicts))
    failed = [r for r in runs if "error" in r["result"] and not r["result"].get("oom")]
    for r in failed:
        print(f"FAILED {r['workload']} {r['mode']} rep {r['rep'] + 1}: {r['result']['error']}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "args": {k: v for k, v in vars(args).items()}, "runs": runs,
                       "summary": summaries, "cases": cases,
                       "goals": verdicts}, f, indent=2)
        print(f"wrote {args.json}")
    return 1 if failed or any(c["crashed"] for c in cases.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
