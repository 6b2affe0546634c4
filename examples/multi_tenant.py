#!/usr/bin/env python3
"""Several jobs share one GPU through gpupool's tenant group: quotas that add up
to more than the device, and priorities that decide who gives memory back.

    python examples/multi_tenant.py                        # 4 jobs of ~12 GB under a 24 GiB limit
    python examples/multi_tenant.py --limit 24GiB --jobs gen:high lora:low lora:normal lora:normal
    python examples/multi_tenant.py --size tiny --lora-batch 2 --lora-len 128 --gen-batch 2 --limit 2GiB --quick

Each job is a process with its own gpupool, started with
``GPUPOOL_TENANT=<group>`` (one group for all), ``GPUPOOL_DEVICE_LIMIT=--limit``
(the whole group sees a device of that size), ``GPUPOOL_PRIORITY`` and
``GPUPOOL_LIMIT=--quota`` (its own cap). ``lora`` jobs fine-tune a
Qwen2-shaped model with LoRA (examples/qwen_lora_finetune.py) and make every
optimizer step a yield point; ``gen`` jobs serve ``generate()`` calls
(examples/qwen_inference.py), a yield point before each. With the defaults
(0.5B shape, LoRA batch 4 of 864 tokens, generate batch 40 of 1536 + 256
tokens) each job should peak at 10-11.5 GiB, under its 12 GiB quota (check
the "peak alone" column; the batches are options): four of them cannot all
be at their peak within 24 GiB. A job short of memory asks lower-priority
jobs to give theirs back, and waits (``GPUPOOL_RECLAIM_TIMEOUT``, long here
so that a low job queues rather than fails). A job keeps its memory across
its steps for a turn (``GPUPOOL_TENANT_TURN``) while one of its own
priority waits; while the high job is in a step, the jobs below it pause at
their yield points so that together they compute at most
``GPUPOOL_TENANT_SHARE`` of the time (``--share``, 25% here: without MPS
the GPU time-slices, and a LoRA step beside ``generate()`` slows it). At a yield point a job takes
a lease on the memory its next step will hold at its peak (what it held
alone, measured in the first phase): it starts the step only once the group
can give that, so that two steps never both stall half way.

First every job runs alone (its throughput alone), then all together. The
script prints who gave memory back and when (it watches the registry, as
``python -m gpupool top`` does), and at the end a table: each job's
throughput alone and shared, its waits, the reclaims it gave and received
with their latency, and the wall time of the shared run against the jobs
run one after another. ``--json PATH`` writes all of it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("lora", "gen")
PRIORITIES = ("low", "normal", "high", "critical")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", nargs="+", default=["gen:high", "lora:low", "lora:normal", "lora:normal"],
                   help="KIND:PRIORITY per job, KIND lora or gen (default: gen:high lora:low lora:normal "
                        "lora:normal)")
    p.add_argument("--limit", default="24GiB", help="GPUPOOL_DEVICE_LIMIT of the group (default: 24GiB)")
    p.add_argument("--quota", default="12GiB", help="GPUPOOL_LIMIT of each job (default: 12GiB)")
    p.add_argument("--timeout", default="10min", help="GPUPOOL_RECLAIM_TIMEOUT of each job (default: 10min)")
    p.add_argument("--share", default="25%",
                   help="GPUPOOL_TENANT_SHARE of each job: the compute time the jobs below a busy higher one "
                        "get, together (default: 25%%; the library's is 50%%)")
    p.add_argument("--size", default="0.5b", help="model shape of qwen_lora_finetune.py (default: 0.5b)")
    p.add_argument("--lora-batch", type=int, default=4, help="sequences per LoRA step (default: 4)")
    p.add_argument("--lora-len", type=int, default=864, help="tokens per sequence (default: 864)")
    p.add_argument("--lora-steps", type=int, default=150,
                   help="timed LoRA steps (default: 150, about as long alone as the generate() job)")
    p.add_argument("--gen-batch", type=int, default=40, help="prompts per generate() call (default: 40)")
    p.add_argument("--gen-len", type=int, default=1536, help="tokens per prompt (default: 1536)")
    p.add_argument("--gen-new", type=int, default=256, help="tokens generated per prompt (default: 256)")
    p.add_argument("--gen-steps", type=int, default=6, help="timed generate() calls (default: 6)")
    p.add_argument("--quick", action="store_true", help="a third of the steps")
    p.add_argument("--skip-alone", action="store_true", help="only the shared run")
    p.add_argument("--max-wall", type=float, default=0,
                   help="stop the jobs of a run still going after this many seconds (default: 0, never)")
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--need", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for job in args.jobs:
        kind, _, prio = job.partition(":")
        if kind not in KINDS or prio not in PRIORITIES:
            p.error(f"--jobs: {job!r} is not KIND:PRIORITY with KIND in {KINDS} and PRIORITY in {PRIORITIES}")
    if args.quick:
        args.lora_steps = max(3, args.lora_steps // 3)
        args.gen_steps = max(2, args.gen_steps // 3)
    return args


# ------------------------------------------------------------------ worker

def tenant_row(group: str) -> Optional[Dict[str, Any]]:
    """This process's row of its group's registry."""
    import gpupool

    for g, device in gpupool.registries():
        info = gpupool.tenants(g, device) if g == group else None
        for t in info["tenants"] if info else ():
            if t["self"]:
                return t
    return None


def worker(args: argparse.Namespace) -> int:
    """One job: the environment names its group, priority and quota."""
    sys.path.insert(0, HERE)
    import gpupool
    from qwen_lora_finetune import select_allocator

    select_allocator("gpupool", "cuda")
    import torch

    result: Dict[str, Any] = {"name": args.name, "kind": args.worker}
    t0 = time.perf_counter()
    try:
        if args.worker == "lora":
            result.update(run_lora(args))
        else:
            result.update(run_gen(args))
        result["ok"] = True
    except torch.cuda.OutOfMemoryError as e:
        result.update(ok=False, error=str(e))
    result["wall"] = time.perf_counter() - t0
    s = gpupool.stats()
    result.update(peak_allocated=s["allocated_peak"], peak_reserved=s["reserved_peak"],
                  tenant=tenant_row(os.environ["GPUPOOL_TENANT"]))
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0 if result["ok"] else 1


def model_args(args: argparse.Namespace, batch: int, length: int, steps: int, warmup: int) -> argparse.Namespace:
    """The namespace qwen_lora_finetune's helpers read."""
    return argparse.Namespace(size=args.size, model=None, device="cuda", dtype="auto", batch=batch,
                              min_len=length, max_len=length, steps=steps, warmup=warmup, seed=0, lr=1e-4)


def run_lora(args: argparse.Namespace) -> Dict[str, Any]:
    """LoRA fine-tune steps; every optimizer step is a yield point."""
    import torch

    import gpupool
    from qwen_lora_finetune import add_lora, batches, build_model, open_device

    m = model_args(args, args.lora_batch, args.lora_len, args.lora_steps, 2)
    device = open_device("cuda")
    torch.manual_seed(0)
    with gpupool.tag("weights"):
        model = add_lora(build_model(m, device))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=m.lr)
    gpupool.yield_point(args.need)  # a lease for the first step
    gpupool.install_yield_point(opt, args.need)  # and after every step, for the next
    data = batches(m, model.config.vocab_size, m.warmup + m.steps)
    tokens, seconds, spans = 0, 0.0, []
    for i, ids in enumerate(data):
        torch.cuda.synchronize()
        t = time.perf_counter()
        ids = ids.to(device)
        with gpupool.tag("backward", inherit=True):
            model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        spans.append((t, time.perf_counter()))
        if i >= m.warmup:
            seconds += spans[-1][1] - t
            tokens += ids.numel()
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "spans": spans}


def run_gen(args: argparse.Namespace) -> Dict[str, Any]:
    """generate() calls, a yield point after each."""
    import torch

    import gpupool
    from qwen_inference import prompts
    from qwen_lora_finetune import build_model, open_device

    m = model_args(args, args.gen_batch, args.gen_len, args.gen_steps, 1)
    m.new_tokens = args.gen_new
    device = open_device("cuda")
    torch.manual_seed(0)
    with gpupool.tag("weights"):
        model = build_model(m, device)
    model.eval()
    pad = model.config.eos_token_id if model.config.eos_token_id is not None else 0
    data = prompts(m, model.config.vocab_size, pad, m.warmup + m.steps)
    tokens, seconds, spans = 0, 0.0, []
    with torch.no_grad():
        for i, (ids, mask) in enumerate(data):
            torch.cuda.synchronize()
            t = time.perf_counter()
            gpupool.yield_point(args.need)
            with gpupool.tag("kv_cache"):
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     max_new_tokens=m.new_tokens, min_new_tokens=m.new_tokens,
                                     do_sample=False, pad_token_id=pad)
            torch.cuda.synchronize()
            del out
            spans.append((t, time.perf_counter()))
            if i >= m.warmup:
                seconds += spans[-1][1] - t
                tokens += m.batch * m.new_tokens
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "spans": spans}


# ------------------------------------------------------------- coordinator

def start(args: argparse.Namespace, name: str, kind: str, prio: str, group: str, out: str,
          need: int) -> subprocess.Popen:
    env = dict(os.environ, GPUPOOL_TENANT=group, GPUPOOL_DEVICE_LIMIT=args.limit, GPUPOOL_PRIORITY=prio,
               GPUPOOL_LIMIT=args.quota, GPUPOOL_RECLAIM_TIMEOUT=args.timeout, GPUPOOL_TENANT_SHARE=args.share,
               HF_HUB_OFFLINE="1")
    # --name first: `top` shows the start of the command line.
    cmd = [sys.executable, os.path.abspath(__file__), "--name", name, "--worker", kind, "--out", out,
           "--size", args.size, "--lora-batch", str(args.lora_batch), "--lora-len", str(args.lora_len),
           "--lora-steps", str(args.lora_steps), "--gen-batch", str(args.gen_batch), "--gen-len",
           str(args.gen_len), "--gen-new", str(args.gen_new), "--gen-steps", str(args.gen_steps),
           "--need", str(need)]
    return subprocess.Popen(cmd, env=env)


def watch(group: str, procs: Dict[str, subprocess.Popen], names: Dict[int, str],
          t0: float, max_wall: float) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Poll the group's registry until every job ended; print and return who
    gave memory back, to whom and when, and who waited; and the timeline of
    each job's held, cached and wanted bytes (every 50 ms)."""
    import gpupool

    seen: Dict[int, Dict[str, Any]] = {}
    log: List[str] = []
    timeline: List[Dict[str, Any]] = []
    while any(p.poll() is None for p in procs.values()):
        if max_wall and time.perf_counter() - t0 > max_wall:
            print(f"--max-wall {max_wall:g} s passed: stopping the jobs", flush=True)
            for p in procs.values():
                p.kill()
        for g, device in gpupool.registries():
            info = gpupool.tenants(g, device) if g == group else None
            if info:
                timeline.append({"t": round(time.perf_counter() - t0, 3), **{
                    names.get(t["pid"], str(t["pid"])): [t["held"], t["cached"], t["wanted"], t["lease"]]
                    for t in info["tenants"]}})
            for t in info["tenants"] if info else ():
                old = seen.get(t["pid"], {"reclaims_given": 0, "bytes_given": 0, "wanted": 0, "waits": 0})
                who = names.get(t["pid"], str(t["pid"]))
                line = None
                if t["reclaims_given"] > old["reclaims_given"]:
                    line = (f"{time.perf_counter() - t0:7.1f}s  {who} gave back "
                            f"{gpupool.format_bytes(t['bytes_given'] - old['bytes_given'])} "
                            f"({t['reclaims_given'] - old['reclaims_given']} answers, last in "
                            f"{1e3 * t['latencies_s'][-1]:.0f} ms)")
                elif t["wanted"] and not old["wanted"]:
                    line = f"{time.perf_counter() - t0:7.1f}s  {who} waits for {gpupool.format_bytes(t['wanted'])}"
                if line:
                    print(line, flush=True)
                    log.append(line)
                seen[t["pid"]] = t
        time.sleep(0.05)
    return log, timeline


def run_jobs(args: argparse.Namespace, jobs: List[Dict[str, str]], group: str, tmp: str,
             needs: Dict[str, int]) -> Dict[str, Any]:
    """Start `jobs` together in `group` (each leasing needs[name] bytes per
    step); their results and the wall time."""
    t0 = time.perf_counter()
    for j in jobs:  # a job that dies writes nothing: no result of an earlier run may stand in
        if os.path.exists(os.path.join(tmp, j["name"] + ".json")):
            os.remove(os.path.join(tmp, j["name"] + ".json"))
    procs = {j["name"]: start(args, j["name"], j["kind"], j["prio"], group,
                              os.path.join(tmp, j["name"] + ".json"), needs.get(j["name"], 0))
             for j in jobs}
    names = {p.pid: n for n, p in procs.items()}
    log, timeline = watch(group, procs, names, t0, args.max_wall)
    wall = time.perf_counter() - t0
    results = {}
    for n, p in procs.items():
        path = os.path.join(tmp, n + ".json")
        results[n] = json.load(open(path)) if os.path.exists(path) else {"ok": False, "error": f"exit {p.returncode}"}
    # (spans: each step's start and end on the clock of t0, shared by the processes)
    return {"t0": t0, "wall": wall, "jobs": results, "log": log, "timeline": timeline}


def gpu_or_exit() -> None:
    """The jobs need PyTorch and a CUDA GPU: say so in one line before any
    starts (without a GPU, eight children failed and the table was nan)."""
    why = None
    try:
        import torch
    except ImportError:
        why = "it needs PyTorch and a CUDA GPU (pip install torch)"
    else:
        if not torch.cuda.is_available():
            why = "no CUDA device visible to torch"
    if why:
        print(f"error: multi_tenant.py: {why}; it has no CPU mode (its jobs share one GPU's memory through "
              "gpupool): run it on a machine with an NVIDIA GPU", file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    gpu_or_exit()
    jobs = []
    for i, spec in enumerate(args.jobs):
        kind, _, prio = spec.partition(":")
        jobs.append({"name": f"{kind}-{prio}-{i}", "kind": kind, "prio": prio})
    group = f"multi-tenant-{os.getpid()}"
    print(f"{len(jobs)} jobs, quota {args.quota} each, group limit {args.limit}: "
          + ", ".join(f"{j['name']}" for j in jobs))
    with tempfile.TemporaryDirectory() as tmp:
        alone: Dict[str, Any] = {}
        if not args.skip_alone:
            for j in jobs:
                print(f"--- {j['name']} alone")
                alone[j["name"]] = run_jobs(args, [j], f"{group}-alone-{j['name']}", tmp, {})
        # What each step holds at its peak, as measured alone: the lease.
        needs = {n: r["jobs"][n].get("peak_reserved", 0) for n, r in alone.items()}
        print("--- all together")
        shared = run_jobs(args, jobs, group, tmp, needs)
    fmt_rate = lambda r: f"{r['tokens_per_s']:9.1f}" if r.get("ok") else "   failed"  # noqa: E731
    print(f"\n{'job':<16} {'prio':<7} {'tok/s alone':>11} {'tok/s shared':>12} {'ratio':>6} "
          f"{'waits':>6} {'waited':>8} {'paused':>7} {'gave':>16} {'received':>16} {'peak alone':>11} {'shared':>10}")
    lats: List[float] = []
    moved = 0
    for j in jobs:
        s = shared["jobs"][j["name"]]
        a = alone.get(j["name"], {}).get("jobs", {}).get(j["name"], {})
        t = s.get("tenant") or {}
        lats += t.get("latencies_s", [])
        moved += t.get("bytes_given", 0)
        ratio = s["tokens_per_s"] / a["tokens_per_s"] if s.get("ok") and a.get("ok") else float("nan")
        gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
        print(f"{j['name']:<16} {j['prio']:<7} {fmt_rate(a) if a else '        -':>11} {fmt_rate(s):>12} "
              f"{ratio:6.2f} {t.get('waits', 0):6d} {t.get('wait_s', 0.0):7.1f}s {t.get('paused_s', 0.0):6.1f}s "
              f"{t.get('reclaims_given', 0):4d} {gib(t.get('bytes_given', 0)):>11} "
              f"{t.get('reclaims_received', 0):4d} {gib(t.get('bytes_received', 0)):>11} "
              f"{gib(a.get('peak_reserved', 0)):>11} {gib(s.get('peak_reserved', 0)):>10}")
        if not s.get("ok"):
            print(f"    {j['name']} failed: {s.get('error', '')[:400]}")
    serial = sum(r["wall"] for r in alone.values())
    print(f"\nshared wall {shared['wall']:.1f} s" + (f", one after another {serial:.1f} s" if alone else ""))
    if lats:
        print(f"reclaims: {len(lats)} answers (latest kept per job), latency median "
              f"{1e3 * statistics.median(lats):.0f} ms, worst {1e3 * max(lats):.0f} ms; "
              f"{moved / 2**30:.2f} GiB given back")
    ok = all(r.get("ok") for r in shared["jobs"].values())
    print("all jobs finished without running out of memory" if ok else "SOME JOBS FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "alone": alone, "shared": shared}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
