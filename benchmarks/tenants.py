"""Tenants benchmark: four LoRA jobs share a 28 GiB group; a parked tenant is swapped out whole.

    python -m benchmarks.tenants --reps 3 --json tenants.json   # or: python -m benchmarks --only tenants
    python -m benchmarks.tenants --dry                          # the job commands, nothing run (no GPU needed)

Jobs: LoRA fine-tunes of the Qwen2-0.5B shape (examples/qwen_lora_finetune.py's
build_model/add_lora/batches: random bf16 weights, peft LoRA), batch 4, a random
length in [--min-len, --max-len] per step (seeded per job), 3 warm-up steps then
--steps timed ones; processes with GPUPOOL_TENANT=<group>, GPUPOOL_DEVICE_LIMIT=28GiB,
GPUPOOL_LIMIT=14GiB, GPUPOOL_PRIORITY high, normal, normal, low, every other
GPUPOOL_* setting the default (inherited ones are dropped). Three call
gpupool.yield_point() after each step; 'normal-plain' only calls gpupool.enable().
A step that raises OutOfMemoryError/MemoryError/RuntimeError counts as an OOM (a
real job would die); 'crashed': a non-zero exit, no result, or killed by --max-wall.

Per rep: (a) the high job alone in a group of its own, (b) the four together,
(c) the swap case: L (low, cap 24GiB) holds ~--swap-gib of random bf16 tensors,
then allocates 1 MiB every 10 ms; H (high) starts once L is ready, takes
--h-gib for 2 s and exits, so L is swapped out and back in. Rep 1 also runs the
three other jobs alone: 'one after another' is the sum of the four alone walls
of rep 1, reused for every rep. Goals are printed PASS/FAIL.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .modes import child_env
from .workloads import EXAMPLES, ROOT

GIB = 2**30
MIB = 2**20
WARMUP = 3
TAG = "GPUPOOL_BENCH_RESULT "  # a job's one result line on stdout
# (name, priority, yield points, data seed): the scenario's four jobs
JOBS = (("high", "high", True, 1), ("normal", "normal", True, 2), ("normal-plain", "normal", False, 3),
        ("low", "low", True, 4))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tenants", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default: 3)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per job, after 3 warm-up ones (default: 60)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default: 4)")
    p.add_argument("--min-len", type=int, default=512, help="shortest sequence (default: 512)")
    p.add_argument("--max-len", type=int, default=1024, help="longest sequence (default: 1024)")
    p.add_argument("--device-limit", default="28GiB", help="GPUPOOL_DEVICE_LIMIT of a group (default: 28GiB)")
    # (12 GiB, the first default, is below the high job's own peak at 1024 tokens on torch 2.11: it ran
    # out of memory alone, in its own group)
    p.add_argument("--limit", default="14GiB", help="GPUPOOL_LIMIT of each LoRA job (default: 14GiB)")
    p.add_argument("--swap-gib", type=float, default=11.0, help="L's live tensors in the swap case (default: 11)")
    p.add_argument("--h-gib", type=int, default=20, help="what H takes in the swap case, GiB (default: 20)")
    p.add_argument("--no-swap-case", action="store_true", help="skip the swap-latency case")
    p.add_argument("--max-wall", type=float, default=600.0,
                   help="kill a run's jobs still going after this many seconds; they count as crashed (default: 600)")
    p.add_argument("--quick", action="store_true", help="10 timed steps (a smoke run)")
    p.add_argument("--dry", action="store_true", help="print the runs' commands and environments; run nothing")
    p.add_argument("--json", metavar="PATH", help="also write every run and the goals here")
    # a job's own options (the harness starts `python -m benchmarks.tenants --name N --worker KIND ...`)
    for opt, kw in (("--name", {}), ("--worker", {"choices": ("lora", "swap-low", "swap-high")}), ("--ready", {}),
                    ("--plain", {"action": "store_true"}), ("--seed", {"type": int, "default": 0}),
                    ("--low-pid", {"type": int, "default": 0})):
        p.add_argument(opt, help=argparse.SUPPRESS, **kw)  # type: ignore[arg-type]
    a = p.parse_args(argv)
    if a.quick:
        a.steps = min(a.steps, 10)
    if a.reps < 1 or a.steps < 1 or a.batch < 1 or not 1 <= a.min_len <= a.max_len:
        p.error("need --reps, --steps, --batch >= 1 and 1 <= --min-len <= --max-len")
    return a


# ------------------------------------------------------------------ jobs (torch imported here only)

def tenant_row(group: str, pid: int = 0) -> Optional[Dict[str, Any]]:
    """The row of `group`'s registry of process `pid` (0: this process), or None."""
    import gpupool

    for g, device in gpupool.registries():
        info = gpupool.tenants(g, device) if g == group else None
        for t in info["tenants"] if info else ():
            if (t["pid"] == pid) if pid else t["self"]:
                return dict(t)
    return None


def lora_job(a: argparse.Namespace, t_start: float) -> None:
    """A LoRA fine-tune; with a.plain, a plain script that only calls gpupool.enable()."""
    import gpupool

    gpupool.enable()  # at the top, before torch allocates anything
    import torch

    sys.path.insert(0, str(EXAMPLES))
    from qwen_lora_finetune import add_lora, batches, build_model, open_device

    oom_types = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), MemoryError, RuntimeError)
    m = argparse.Namespace(size="0.5b", model=None, dtype="bf16", batch=a.batch, min_len=a.min_len,
                           max_len=a.max_len, seed=a.seed, lr=1e-4)
    device = open_device("cuda")
    torch.manual_seed(0)  # the same weights in every job; the data's seed is the job's
    model = add_lora(build_model(m, device))
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=m.lr)
    data = batches(m, model.config.vocab_size, WARMUP + a.steps)
    ooms, errors, tokens, t_timed = 0, [], 0, 0.0
    for i, ids in enumerate(data):
        if i == WARMUP:
            torch.cuda.synchronize()
            t_timed = time.perf_counter()
        try:
            ids = ids.to(device)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            tokens += ids.numel() if i >= WARMUP else 0
        except oom_types as e:  # a real job would die here
            ooms += 1
            errors.append(f"step {i} (length {ids.shape[-1]}): {str(e).splitlines()[0][:300]}")
        opt.zero_grad(set_to_none=True)
        if not a.plain:
            gpupool.yield_point()
    torch.cuda.synchronize()
    timed = time.perf_counter() - t_timed
    s = gpupool.stats()
    print(TAG + json.dumps({"name": a.name, "ooms": ooms, "errors": errors[:5], "tokens": tokens,
                            "timed_s": timed, "tokens_per_s": tokens / timed, "wall_s": time.perf_counter() - t_start,
                            "peak_allocated": s["allocated_peak"], "peak_reserved": s["reserved_peak"],
                            "tenant": tenant_row(os.environ["GPUPOOL_TENANT"])}), flush=True)


def swap_low(a: argparse.Namespace, t_start: float) -> None:
    """L: ~a.swap_gib of random bf16 tensors of mixed sizes, checksummed; then 1 MiB
    allocations every 10 ms until it was swapped out and back (or 30 s); check the bytes."""
    import gpupool

    gpupool.enable()
    import torch

    from .offload import checksum

    rng, gen = random.Random(a.seed), torch.Generator(device="cuda").manual_seed(a.seed)
    ts, left = [], int(a.swap_gib * GIB)
    while left > 0:
        n = min(rng.choice((256 * 1024, MIB, 4 * MIB, 16 * MIB, 64 * MIB)), left)
        ts.append(torch.randn(n // 2, dtype=torch.bfloat16, device="cuda", generator=gen))
        left -= n
    torch.cuda.synchronize()
    sums, ptrs = checksum(torch, ts), [t.data_ptr() for t in ts]
    torch.cuda.empty_cache()  # what stays is the live tensors
    group = os.environ["GPUPOOL_TENANT"]
    Path(a.ready).write_text(str(os.getpid()))
    t_end, longest, after, i = time.perf_counter() + 30.0, 0.0, 0, 0
    while time.perf_counter() < t_end and after < 10:
        t = time.perf_counter()
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        longest = max(longest, time.perf_counter() - t)
        del x
        i += 1
        if after or (i % 10 == 0 and ((tenant_row(group) or {}).get("swaps_in") or 0) >= 1):
            after += 1
        time.sleep(0.01)
    torch.cuda.synchronize()
    same = checksum(torch, ts) == sums and [t.data_ptr() for t in ts] == ptrs
    print(TAG + json.dumps({"name": a.name, "bytes": sum(t.numel() * 2 for t in ts), "tensors": len(ts),
                            "same_bytes": same, "longest_alloc_s": longest, "allocs": i,
                            "wall_s": time.perf_counter() - t_start, "tenant": tenant_row(group)}), flush=True)


def swap_high(a: argparse.Namespace, t_start: float) -> None:
    """H: take a.h_gib (1 GiB tensors), read L's row (its swap out is done), hold 2 s, free all."""
    import gpupool

    gpupool.enable()
    import torch

    t = time.perf_counter()
    ts = [torch.ones(GIB, dtype=torch.uint8, device="cuda") for _ in range(a.h_gib)]
    torch.cuda.synchronize()
    alloc_s = time.perf_counter() - t
    group = os.environ["GPUPOOL_TENANT"]
    # L's swap out is done (its memory is H's) a moment before L records it in its row.
    t_end, low = time.perf_counter() + 5.0, tenant_row(group, a.low_pid)
    while time.perf_counter() < t_end and not (low or {}).get("swaps_out"):
        time.sleep(0.01)
        low = tenant_row(group, a.low_pid)
    time.sleep(2.0)
    del ts
    torch.cuda.empty_cache()
    gpupool.empty_cache()
    print(TAG + json.dumps({"name": a.name, "alloc_s": alloc_s, "low_after_alloc": low,
                            "wall_s": time.perf_counter() - t_start, "tenant": tenant_row(group)}), flush=True)


# ------------------------------------------------------------------ harness (no torch)

@dataclass
class Job:
    """A job process to start: its name, command and environment (GPUPOOL_* shown apart)."""

    name: str
    cmd: List[str]
    gp_env: Dict[str, str]
    proc: Optional[subprocess.Popen] = None
    log: Optional[Path] = None
    result: Dict[str, Any] = field(default_factory=dict)


def base_env() -> Dict[str, str]:
    """The parent's environment without inherited GPUPOOL_* settings (the scenario's are the defaults)."""
    env = child_env(os.environ, [str(ROOT)])
    return {k: v for k, v in env.items() if not k.startswith("GPUPOOL_")}


def job(a: argparse.Namespace, name: str, kind: str, group: str, prio: str, limit: str,
        extra: Sequence[str] = ()) -> Job:
    """A job of `kind` named `name` in `group` (--name first: `python -m gpupool top` shows it)."""
    cmd = [sys.executable, "-m", "benchmarks.tenants", "--name", name, "--worker", kind, "--steps", str(a.steps),
           "--batch", str(a.batch), "--min-len", str(a.min_len), "--max-len", str(a.max_len),
           "--swap-gib", str(a.swap_gib), "--h-gib", str(a.h_gib), *extra]
    return Job(name, cmd, {"GPUPOOL_TENANT": group, "GPUPOOL_DEVICE_LIMIT": a.device_limit,
                           "GPUPOOL_LIMIT": limit, "GPUPOOL_PRIORITY": prio})


def lora_jobs(a: argparse.Namespace, group: str, names: Sequence[str]) -> List[Job]:
    return [job(a, n, "lora", group, prio, a.limit, ["--seed", str(seed)] + (["--plain"] if not y else []))
            for n, prio, y, seed in JOBS if n in names]


def start(j: Job, tmp: Path, env: Dict[str, str]) -> None:
    j.log = tmp / f"{j.name}-{time.monotonic_ns()}.log"
    with open(j.log, "w") as f:
        j.proc = subprocess.Popen(j.cmd, cwd=ROOT, env={**env, **j.gp_env}, stdout=f, stderr=subprocess.STDOUT)


def finish(jobs: List[Job], t0: float, max_wall: float) -> float:
    """Wait for `jobs` (killing those past max_wall), parse their results; the wall time since t0."""
    while any(j.proc and j.proc.poll() is None for j in jobs) and time.perf_counter() - t0 < max_wall:
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    for j in jobs:
        killed = bool(j.proc and j.proc.poll() is None)
        if j.proc and killed:
            j.proc.kill()
        rc = j.proc.wait() if j.proc else None
        text = j.log.read_text(errors="replace") if j.log and j.log.exists() else ""
        lines = [ln for ln in text.splitlines() if ln.startswith(TAG)]
        j.result = json.loads(lines[-1][len(TAG):]) if lines else {}
        j.result.update(name=j.name, exit=rc, killed=killed, crashed=bool(rc != 0 or killed or not lines))
        if j.result["crashed"]:
            why = f"killed after --max-wall {max_wall:g} s" if killed else f"exit {rc}"
            j.result["error"] = why + ": " + " | ".join(text.strip().splitlines()[-8:])
            print(f"    {j.name} CRASHED ({why})", flush=True)
    return wall


def run_together(jobs: List[Job], tmp: Path, env: Dict[str, str], max_wall: float) -> Dict[str, Any]:
    t0 = time.perf_counter()
    for j in jobs:
        start(j, tmp, env)
    wall = finish(jobs, t0, max_wall)
    return {"wall_s": wall, "jobs": {j.name: j.result for j in jobs}}


def swap_jobs(a: argparse.Namespace, group: str, ready: str, low_pid: str) -> List[Job]:
    """The swap case's L (low) and H (high), both capped at 24GiB."""
    return [job(a, "swap-L", "swap-low", group, "low", "24GiB", ["--ready", ready, "--seed", "7"]),
            job(a, "swap-H", "swap-high", group, "high", "24GiB", ["--low-pid", low_pid])]


def run_swap(a: argparse.Namespace, group: str, tmp: Path, env: Dict[str, str]) -> Dict[str, Any]:
    """L, then H once L holds its tensors; L's swap out latency (as H reads it) and in."""
    ready = tmp / f"{group}.ready"
    low = swap_jobs(a, group, str(ready), "0")[0]
    t0 = time.perf_counter()
    start(low, tmp, env)
    while not ready.exists() and low.proc and low.proc.poll() is None and time.perf_counter() - t0 < a.max_wall:
        time.sleep(0.05)
    jobs = [low]
    if ready.exists():
        jobs.append(swap_jobs(a, group, str(ready), str(low.proc.pid))[1])
        start(jobs[1], tmp, env)
    finish(jobs, t0, a.max_wall)
    lr, hr = low.result, jobs[-1].result if len(jobs) > 1 else {}
    lt, seen = lr.get("tenant") or {}, hr.get("low_after_alloc") or {}
    out = {"low": lr, "high": hr, "swapped_bytes": seen.get("swapped"), "swaps_out": lt.get("swaps_out"),
           "swaps_in": lt.get("swaps_in"), "swap_s": lt.get("swap_s"), "swap_max_s": lt.get("swap_max_s"),
           "out_s": seen.get("swap_s") if seen.get("swaps_out") else None, "h_alloc_s": hr.get("alloc_s"),
           "h_wait_s": (hr.get("tenant") or {}).get("wait_s"), "same_bytes": bool(lr.get("same_bytes")),
           "crashed": any(j.result.get("crashed") for j in jobs) or len(jobs) < 2}
    out["in_s"] = out["swap_s"] - out["out_s"] if out["out_s"] is not None and out["swap_s"] is not None else None
    return out


def f(x: Optional[float], spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def median(xs: List[float]) -> float:
    """The median; nan if any is nan (a crashed run: its goal fails)."""
    return statistics.median(xs) if all(x == x for x in xs) else float("nan")


def rate(r: Dict[str, Any]) -> float:
    return float("nan") if r.get("crashed") or "tokens_per_s" not in r else r["tokens_per_s"]


def job_lines(title: str, res: Dict[str, Any]) -> List[str]:
    """A line per job of a run: throughput, OOMs, waits and swaps."""
    out = [f"  {title}: wall {res['wall_s']:.1f} s"]
    for n, r in res["jobs"].items():
        t = r.get("tenant") or {}
        out.append(f"    {n:13s} {f(rate(r), '.0f'):>7} tok/s  OOMs {r.get('ooms', '-')}  "
                   f"{'CRASHED' if r['crashed'] else 'exit 0'}  wall {f(r.get('wall_s'), '.1f')} s  "
                   f"peak {f((r.get('peak_reserved') or 0) / GIB)} GiB  waits {t.get('waits', '-')} "
                   f"({t.get('wait_failures', '-')} failed, {f(t.get('wait_s'), '.1f')} s)  swaps "
                   f"{t.get('swaps_out', '-')}/{t.get('swaps_in', '-')} ({f(t.get('swap_s'))} s, max "
                   f"{f(t.get('swap_max_s'))} s, swapped {f(t.get('swapped_s'), '.1f')} s)")
        out += [f"      {e}" for e in r.get("errors", [])[:3]]
    return out


def run_case(a: argparse.Namespace, show: bool = True) -> Dict[str, Any]:
    """Every rep, printing progress (and with `show` the tables and goals); returns all of
    it: reps, table, goals, ok (every goal passed), crashed (jobs that crashed)."""
    env, pid = base_env(), os.getpid()
    names = [n for n, *_ in JOBS]
    dropped = sorted(k for k in os.environ if k.startswith("GPUPOOL_"))
    if dropped:
        print(f"note: inherited {', '.join(dropped)} dropped: every other setting is the default")
    if a.dry:
        plan = [("rep 1: each job alone, one after another, each in a group of its own (rep k > 1: high only)",
                 [j for n in names for j in lora_jobs(a, f"bt{pid}-r1-alone-{n}", [n])]),
                ("rep k: the four together, started at once", lora_jobs(a, f"bt{pid}-r1-all", names)),
                ("rep k: the swap case (H starts once L is ready)", swap_jobs(a, f"bt{pid}-r1-swap", "READY", "PID"))]
        for what, js in plan:
            print(f"# {what}")
            for j in js:
                print(" ".join(f"{k}={v}" for k, v in j.gp_env.items()) + " " + shlex.join(j.cmd))
        print(f"# {a.reps} reps; --max-wall {a.max_wall:g} s per run")
        return {"dry": True}
    reps: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpupool-tenants-") as tmp_s:
        tmp = Path(tmp_s)
        for k in range(1, a.reps + 1):
            rep: Dict[str, Any] = {"rep": k}
            for n in (names if k == 1 else ["high"]):  # alone: a group of its own each
                r = run_together(lora_jobs(a, f"bt{pid}-r{k}-alone-{n}", [n]), tmp, env, a.max_wall)
                print("\n".join(job_lines(f"rep {k} {n} alone", r)), flush=True)
                rep.setdefault("alone", {})[n] = r
            rep["together"] = run_together(lora_jobs(a, f"bt{pid}-r{k}-all", names), tmp, env, a.max_wall)
            print("\n".join(job_lines(f"rep {k} together", rep["together"])), flush=True)
            if not a.no_swap_case:
                s = rep["swap"] = run_swap(a, f"bt{pid}-r{k}-swap", tmp, env)
                print(f"  rep {k} swap case: {f((s['swapped_bytes'] or 0) / GIB)} GiB swapped, out {f(s['out_s'], '.3f')}"
                      f" s, in {f(s['in_s'], '.3f')} s, H alloc {f(s['h_alloc_s'], '.2f')} s, bytes identical "
                      f"{s['same_bytes']}{' CRASHED' if s['crashed'] else ''}", flush=True)
            hi_alone, hi_all = rate(rep["alone"]["high"]["jobs"]["high"]), rate(rep["together"]["jobs"]["high"])
            rep["high_ratio"] = hi_all / hi_alone if hi_alone == hi_alone and hi_alone > 0 else float("nan")
            reps.append(rep)
    serial = sum(r["wall_s"] for r in reps[0]["alone"].values())  # rep 1 ran each job alone
    res = {"args": {k: v for k, v in vars(a).items() if k not in ("worker", "name", "ready", "low_pid", "plain")},
           "reps": reps, "one_after_another_s": serial}
    res["table"] = tables(reps, serial, a)
    res["goals"] = goals(reps, serial, a)
    if show:
        print("\n" + res["table"] + "\n\nGoals (tenants):\n" + "\n".join(res["goals"]))
    res["ok"] = all(ln.startswith("PASS") for ln in res["goals"])
    res["crashed"] = sum(bool(j["crashed"]) for r in reps for x in [r["together"], *r["alone"].values()]
                         for j in x["jobs"].values())
    res["crashed"] += sum(bool(r["swap"]["crashed"]) for r in reps if "swap" in r)
    return res


def tables(reps: List[Dict[str, Any]], serial: float, a: argparse.Namespace) -> str:
    """The README tables (Markdown): a row per rep, and the swap case's."""
    lines = [f"### tenants: 4 LoRA jobs (Qwen2-0.5B shape, batch {a.batch}, {a.min_len}..{a.max_len} tokens, "
             f"{a.steps} steps), caps {a.limit}, group {a.device_limit}, priorities high/normal/normal(no yield "
             f"point)/low", "", "| rep | high tok/s shared / alone (ratio) | OOMs high/normal/plain/low | crashed "
             "| wall together / one after another* | swaps out/in (s, max s) |", "|---|---|---|---|---|---|"]
    for r in reps:
        js = r["together"]["jobs"]
        ts = [j.get("tenant") or {} for j in js.values()]
        lines.append(f"| {r['rep']} | {f(rate(js['high']), ',.0f')} / {f(rate(r['alone']['high']['jobs']['high']), ',.0f')}"
                     f" ({f(r['high_ratio'], '.3f')}) | {'/'.join(str(j.get('ooms', '-')) for j in js.values())} "
                     f"| {sum(bool(j['crashed']) for j in js.values())} | {r['together']['wall_s']:.1f} s / "
                     f"{serial:.1f} s | {sum(t.get('swaps_out', 0) for t in ts)}/{sum(t.get('swaps_in', 0) for t in ts)}"
                     f" ({f(sum(t.get('swap_s', 0.0) for t in ts))}, {f(max(t.get('swap_max_s', 0.0) for t in ts))}) |")
    lines.append("\n*one after another: the four jobs' alone walls, measured in rep 1 only and reused for every rep.")
    sw = [r for r in reps if "swap" in r]
    if sw:
        lines += ["", f"swap case: L (low) holds {a.swap_gib:g} GiB of random bf16, H (high) takes {a.h_gib} GiB "
                  "for 2 s", "", "| rep | swapped GiB | out s | in s | out + in s | H allocation s (wait s) "
                  "| bytes identical |", "|---|---|---|---|---|---|---|"]
        for r in sw:
            s = r["swap"]
            lines.append(f"| {r['rep']} | {f((s['swapped_bytes'] or 0) / GIB)} | {f(s['out_s'], '.3f')} | "
                         f"{f(s['in_s'], '.3f')} | {f(s['swap_s'], '.3f')} | {f(s['h_alloc_s'], '.2f')} "
                         f"({f(s['h_wait_s'], '.2f')}) | {s['same_bytes']} |")
    return "\n".join(lines)


def goals(reps: List[Dict[str, Any]], serial: float, a: argparse.Namespace) -> List[str]:
    out: List[str] = []

    def check(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}  {text}")

    for r in reps:
        runs = [r["together"]] + list(r["alone"].values())
        ooms = sum(j.get("ooms", 0) for x in runs for j in x["jobs"].values())
        crashed = [n for x in runs for n, j in x["jobs"].items() if j["crashed"]]
        check(ooms == 0 and not crashed, f"rep {r['rep']}: {ooms} OOMs, {len(crashed)} crashed"
              f"{''.join(' ' + c for c in crashed)} (alone and together runs; goal: 0 and 0)")
    ratios = [r["high_ratio"] for r in reps]
    med = median(ratios)
    check(med >= 0.90, f"high job tokens/s together / alone: median {f(med, '.3f')} (reps "
          f"{', '.join(f(x, '.3f') for x in ratios)}; spread {f(min(ratios), '.3f')}..{f(max(ratios), '.3f')}; "
          f"goal >= 0.90)")
    wall = statistics.median(r["together"]["wall_s"] for r in reps)
    check(wall < serial, f"group wall median {wall:.1f} s vs one after another {serial:.1f} s (rep 1's alone "
          f"walls; goal: less)")
    sw = [r["swap"] for r in reps if "swap" in r]
    if sw:
        tot = [s["swap_s"] / s["swaps_out"] if s["swaps_out"] and s["swaps_in"] and not s["crashed"] else float("nan")
               for s in sw]  # (per swap, out + in: L is swapped once unless H's allocations ask twice)
        check(median(tot) <= 0.5, f"swap of {a.swap_gib:g} GiB out + in: median "
              f"{f(median(tot), '.3f')} s (reps {', '.join(f(x, '.3f') for x in tot)}; goal <= 0.5 s; "
              f"nan: no swap out and in, or a crash)")
        check(all(s["same_bytes"] for s in sw), "swap case: bytes and data_ptr identical after the swap, every rep")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    t_start = time.perf_counter()
    a = parse_args(argv)
    if a.worker:
        {"lora": lora_job, "swap-low": swap_low, "swap-high": swap_high}[a.worker](a, t_start)
        return 0
    if not a.dry:
        from .__main__ import machine  # (a throwaway process asks torch; this one never imports it)

        info = machine()
        if "error" in info:
            print(f"error: the tenants benchmark needs PyTorch and a CUDA GPU: {info['error']}", file=sys.stderr)
            return 2
        print(f"machine: {json.dumps(info)}", flush=True)
    res = run_case(a)
    if a.json and not a.dry:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
        print(f"wrote {a.json}")
    return 0 if res.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
