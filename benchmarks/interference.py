"""What the fp32 fine-tune loses to PCIe traffic beside it, gpupool's offload or not.

    python -m benchmarks.interference [--reps 3] [--quick]
        [--runs none,native,expandable,reserve,h2d,d2h,both,d2d,host,trip,offload,cap,alternate]
    python -m benchmarks.interference --runs none,offload,cap --base DIR   # this build against another
    python -m benchmarks.interference --runs none,offload,cap --lengths 128..1024 --steps 30 --cap 18
    python -m benchmarks.interference --runs none,alternate,offload --steps 40
    python -m benchmarks.interference --runs none,d2h,d2h:50 --reps 4   # a copier busy half the time

The optimizer-offload goal compares the fp32 recipe (``--only finetune``)
with its state crossing PCIe each step against the recipe without.  This
measures what that traffic costs by itself: the recipe under gpupool
without offload while a thread of the same process copies 256 MiB buffers
without pause on a stream of its own -- pinned host to device (``h2d``),
device to pinned host (``d2h``), both directions at once (``both``),
device to device (``d2d``: no PCIe, the device's memory and copy kernels),
or host memory to host memory in two threads (``host``: no device, the
host memory's traffic alone); ``h2d:P`` (and so for ``d2h``, ``both`` and
``d2d``) paces that copier to P percent of the time, 1..99: after each
256 MiB copy it pauses so that the copy took P% of copy and pause:
the same bursts at a lower mean rate -- or the offload's bytes on the
offload's rhythm (``trip``: after each optimizer step, as many bytes as the
optimizer's state to pinned host memory and back, in 256 MiB pieces, then
a wait for the next step) -- with nothing of gpupool in the copies' path;
and the recipe with the optimizer offloaded (``offload``), and so at the
cap where every PyTorch mode runs out of memory (``cap``).  ``native`` runs
the recipe under PyTorch's own allocator with nothing beside it (and
``expandable`` with its expandable segments; ``reserve`` under gpupool with
the whole pool mapped at start, so that no step calls the driver): the
threads' CPU time and the phases of the step without offload under each
allocator, side by side.  ``alternate`` offloads the state behind every
other step only (gpupool's own hooks, their offload skipped every other
step): each step the state had left behind is compared with its
neighbours that ran without, a fraction of a second apart in the same
process, where the machine's drift between processes (10-25%) and within
one (over seconds) cancels.  It prices the offloaded step, not the run:
a neighbour pays part of the exchange of memory too (it maps what the
restore gave back).

``--lengths MIN..MAX``, ``--steps N`` and ``--cap GIB`` vary the recipe as a
user would: sequence lengths drawn from MIN..MAX instead of 512 each, more
timed steps (variable lengths need more to average), and the cap of the
``cap`` run.  A cap every PyTorch mode runs out of memory under at those
lengths is the user's to choose (the example with ``--allocator native``
and the same ``--cap`` says).

``--base DIR`` runs each run twice, with this checkout's gpupool and with the
one installed in DIR (first on the workers' PYTHONPATH: ``pip install
--no-build-isolation --no-deps --target DIR`` of another checkout, say the
commit before a change), interleaved, the order alternating between
repetitions; the base's rows are marked ``@base``.  Between processes the
machine moves by 10-25%: a change is judged against its base in one call.

Fresh processes, the runs interleaved, median and spread of ``--reps``; per
run the host CPU time per step of the two threads that drive the device (the
Python thread, which runs the forward pass, and autograd's, which runs the
backward pass; from /proc, Linux only), and gpupool's counters per step: the
bytes its offloads copied out and back, its maps, unmaps, waits for its
streams and pressure offloads, and the time the allocating threads spent
past the cache; and the medians of each step's phases on the host's clock:
the forward pass (from the step before's end to the first backward call),
the backward pass (to the optimizer's step) and the optimizer's step
(gpupool's restore included).  A host-bound step whose launches find the
device slower spends that time spinning in the driver: the CPU time grows
with the device's share as well as with host work.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .modes import child_env
from .workloads import _FT, _FT_QUICK, FINETUNE_CAP_GIB, FINETUNE_CAP_QUICK_GIB, ROOT

__all__ = ["RUNS", "alternate_lines", "alternate_stats", "against_base", "main", "paced", "state_bytes", "summarize"]

# run -> (what the worker adds: a copier thread of that kind, the alternating
# offload (_ALTERNATE) or nothing; extra arguments of the example, of its
# --quick shape; the example's --allocator)
_OFF = ("--offload-optimizer",)
RUNS: Dict[str, Any] = {
    "none": (None, (), (), "gpupool"),
    "native": (None, (), (), "native"),
    "expandable": (None, (), (), "expandable"),
    "reserve": (None, (), (), "gpupool-reserve"),
    "h2d": ("h2d", (), (), "gpupool"),
    "d2h": ("d2h", (), (), "gpupool"),
    "both": ("both", (), (), "gpupool"),
    "d2d": ("d2d", (), (), "gpupool"),
    "host": ("host", (), (), "gpupool"),
    "trip": ("trip", (), (), "gpupool"),
    "offload": (None, _OFF, _OFF, "gpupool"),
    "cap": (None, (*_OFF, "--cap", FINETUNE_CAP_GIB), (*_OFF, "--cap", FINETUNE_CAP_QUICK_GIB), "gpupool"),
    "alternate": ("alternate", (), (), "gpupool"),
}
_ALTERNATE = RUNS["alternate"][0]
# The copiers that copy without pause, and so can be paced (``d2h:50``).
_PACEABLE = ("h2d", "d2h", "both", "d2d")
_BASE = "@base"
_BUF = 256 << 20
_HOST_THREADS = 2
_MARK = "INTERFERENCE "


def paced(run: str) -> Tuple[str, float]:
    """A run's name without its pace, and the share of the time its copier
    copies (1.0: without pause): ``"d2h:50"`` -> ``("d2h", 0.5)``.  ValueError
    names what is wrong with a pace and what is accepted."""
    name, sep, pct = run.partition(":")
    if not sep:
        return name, 1.0
    if name not in _PACEABLE or not pct.isdigit() or not 1 <= int(pct) <= 99:
        raise ValueError(f"run {run!r}: a pace is KIND:P with KIND one of {', '.join(_PACEABLE)} and P a whole "
                         "percentage 1..99 of the time the copier copies (say d2h:50)")
    return name, int(pct) / 100


def _known(run: str) -> bool:
    try:
        return paced(run)[0] in RUNS
    except ValueError:
        return False


# ------------------------------------------------------------ the worker side

def _thread_cpu() -> Dict[str, int]:
    """CPU nanoseconds of this process's main and autograd threads so far."""
    out: Dict[str, int] = {}
    pid = str(os.getpid())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out  # (not Linux: no per-thread figures)
    for tid in tids:
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            run_ns = int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        who = "main" if tid == pid else "autograd" if name.startswith("pt_autograd") else None
        if who:
            out[who] = out.get(who, 0) + run_ns
    return out


# gpupool's counters read at the first and last timed step: what crossed PCIe
# and what the pool's calls cost the allocating threads, per step.
_COUNTERS = ("bytes_out", "bytes_in", "n_map", "n_unmap", "n_sync_pool", "ns_slow", "n_pressure", "n_alloc",
             "n_stream_waits", "n_sync", "ns_lock_wait")


def _pool_counters() -> Dict[str, int]:
    """_COUNTERS of gpupool's pool on the current device, where gpupool is in use."""
    gp = sys.modules.get("gpupool")
    if gp is None or not gp.is_enabled():
        return {}
    s = gp.stats()
    off = s.get("offload") or {}
    return {k: int(off.get(k, s.get(k, 0))) for k in _COUNTERS}


def state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors in `optimizer`'s state: what its offload moves each way."""
    import torch

    return sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor))


def _buffers(kind: str, size: int) -> Any:
    """The copier's pinned host and device buffers: ``trip``'s hold `size` bytes
    in 256 MiB pieces (pinning takes seconds: made before the timed steps)."""
    import torch

    if kind == "host":  # a source and a destination per thread, touched before the timed steps
        return [torch.ones(2 * _BUF, dtype=torch.uint8) for _ in range(_HOST_THREADS)]
    pieces = [min(_BUF, size - o) for o in range(0, size, _BUF)] if kind == "trip" else [_BUF, _BUF]
    return ([torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in pieces],
            [torch.empty(n, dtype=torch.uint8, device="cuda") for n in pieces])


def _host_copier(bufs: Any, stop: threading.Event, moved: List[float]) -> None:
    """Copy host memory to host memory in _HOST_THREADS threads until `stop`
    (ctypes.memmove lets go of the GIL)."""
    import ctypes

    counts = [0] * len(bufs)

    def one(i: int) -> None:
        src = bufs[i].data_ptr()
        while not stop.is_set():
            ctypes.memmove(src + _BUF, src, _BUF)
            counts[i] += _BUF

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(bufs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    moved.append(sum(counts) / (time.perf_counter() - t0) / 1e9)


def _copier(kind: str, bufs: Any, stop: threading.Event, moved: List[float], tick: threading.Event) -> None:
    """Copy on a stream of this thread's own until `stop`: without pause, paced
    (``d2h:50``: each copy followed by a pause, see `paced`), or for ``trip``
    all of `bufs` out and back at each `tick`; ``host`` in host memory."""
    import torch

    kind, duty = paced(kind)
    if kind == "host":
        _host_copier(bufs, stop, moved)
        return
    stream = torch.cuda.Stream()
    host, dev = bufs
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        if kind == "trip":
            if not tick.wait(0.1):
                continue
            tick.clear()
        busy = time.perf_counter()
        with torch.cuda.stream(stream):
            if kind in ("h2d", "both"):
                dev[0].copy_(host[0], non_blocking=True)
                n += _BUF
            if kind in ("d2h", "both"):
                host[1].copy_(dev[1], non_blocking=True)
                n += _BUF
            if kind == "d2d":
                dev[0].copy_(dev[1], non_blocking=True)
                n += _BUF
            if kind == "trip":
                for h, d in zip(host, dev):
                    h.copy_(d, non_blocking=True)
                for h, d in zip(host, dev):
                    d.copy_(h, non_blocking=True)
                n += 2 * sum(h.numel() for h in host)
        stream.synchronize()
        if duty < 1:
            stop.wait((time.perf_counter() - busy) * (1 - duty) / duty)
    moved.append(n / (time.perf_counter() - t0) / 1e9)


class _Steps:
    """Host-clock marks of each optimizer step: where it began (the step before
    ended), its first backward call, its optimizer step's start (before
    gpupool's restore) and end; and whether the optimizer's state had left
    behind the step before (``alternate``)."""

    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self._cur: Dict[str, Any] = {}

    def mark(self, name: str) -> None:
        self._cur.setdefault(name, time.perf_counter())

    def end(self, offloaded: bool) -> None:
        self.mark("end")
        self.rows.append(dict(self._cur, offloaded=offloaded))
        self._cur = {"start": self._cur["end"]}

    @staticmethod
    def phases(rows: Sequence[Dict[str, Any]]) -> Dict[str, float]:
        """Medians in ms over `rows` (of .rows): forward (the step's start to its
        backward call), backward (to the optimizer's step), optimizer (its
        step, the restore included) and the whole step."""
        rows = [r for r in rows if all(k in r for k in ("start", "backward", "optimizer"))]
        spans = {"forward": ("start", "backward"), "backward": ("backward", "optimizer"),
                 "optimizer": ("optimizer", "end"), "step": ("start", "end")}
        return {k: statistics.median((r[b] - r[a]) * 1e3 for r in rows) for k, (a, b) in spans.items()} if rows else {}


def alternate_stats(step_ms: Sequence[float], offloaded: Sequence[bool]) -> Dict[str, float]:
    """Steps whose optimizer state had left behind the step before against
    their neighbours that ran without: the medians of each kind, and the median
    over the offloaded steps of their neighbours' mean over them (the
    machine's drift cancels between steps a fraction of a second apart)."""
    off = [i for i, o in enumerate(offloaded) if o]
    ratios = []
    for i in off:
        near = [step_ms[j] for j in (i - 1, i + 1) if 0 <= j < len(step_ms) and not offloaded[j]]
        if near:
            ratios.append(statistics.mean(near) / step_ms[i])
    clean = [t for t, o in zip(step_ms, offloaded) if not o]
    if not ratios or not clean:
        return {}
    return {"offloaded_ms": statistics.median(step_ms[i] for i in off), "clean_ms": statistics.median(clean),
            "vs_neighbours": statistics.median(ratios), "n": len(ratios)}


class _Alternate:
    """``alternate``: gpupool's own optimizer hooks (offloadable with
    offload_after_step) whose offload behind the step is skipped every other
    step, so that each offloaded step has neighbours that ran without."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.asked = False
        self._offload = handle.offload

    def before_step(self, step: int) -> None:
        """Step `step` (from 1) offloads behind itself when even."""
        self.asked = False
        self.handle.offload = self._ask if step % 2 == 0 else self._skip

    def _ask(self, **kw: Any) -> Any:
        self.asked = True
        return self._offload(**kw)

    def _skip(self, **kw: Any) -> None:
        return None


def _worker(kind: Optional[str], warmup: int, steps: int, argv: List[str]) -> None:
    """Run the example with `argv`; the copier, the CPU count and the steps'
    phases span its timed steps.  The backward pass's start is seen through
    torch.Tensor.backward (wrapped while the example runs)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    seen = [0]
    cpu: Dict[str, Any] = {}
    stop, tick = threading.Event(), threading.Event()
    moved: List[float] = []
    bufs: List[Any] = []
    marks = _Steps()
    alt: List[_Alternate] = []
    away = [False]  # the state left behind the last step
    copier = None if kind == _ALTERNATE else kind

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        marks.mark("optimizer")
        if alt:
            alt[0].before_step(seen[0] + 1)

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        seen[0] += 1
        tick.set()
        marks.end(offloaded=away[0])
        away[0] = bool(alt) and alt[0].asked
        if seen[0] == 1 and kind == _ALTERNATE:  # (the state exists now)
            import gpupool

            alt.append(_Alternate(gpupool.offloadable(opt, "optimizer", offload_after_step=True)))
        if copier and not bufs:  # the first step: the state exists, and the timed steps are to come
            bufs.append(_buffers(paced(copier)[0], state_bytes(opt)))
        if seen[0] == warmup:
            cpu["start"], cpu["pool0"] = _thread_cpu(), _pool_counters()
            if copier:
                threading.Thread(target=_copier, args=(copier, bufs[0], stop, moved, tick), daemon=True).start()
        elif seen[0] == warmup + steps:
            end = _thread_cpu()
            cpu["ms_per_step"] = {k: (end[k] - cpu["start"].get(k, 0)) / steps / 1e6 for k in end}
            pool = _pool_counters()
            cpu["pool_per_step"] = {k: (v - cpu["pool0"].get(k, 0)) / steps for k, v in pool.items()}
            stop.set()

    backward = torch.Tensor.backward

    def backward_marked(self: Any, *a: Any, **k: Any) -> Any:
        marks.mark("backward")
        return backward(self, *a, **k)

    hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    torch.Tensor.backward = backward_marked  # type: ignore[method-assign]
    marks.mark("start")
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        for h in hooks:
            h.remove()
        stop.set()
        deadline = time.time() + 5
        while copier and not moved and time.time() < deadline and torch.cuda.is_available():
            time.sleep(0.05)
        timed = marks.rows[warmup:warmup + steps]
        print(_MARK + json.dumps({"cpu_ms_per_step": cpu.get("ms_per_step", {}),
                                  "pool_per_step": cpu.get("pool_per_step", {}),
                                  "copier_gbps": moved[0] if moved else None,
                                  "phases_ms": marks.phases(timed),
                                  "alternate": alternate_stats([(r["end"] - r["start"]) * 1e3 for r in timed],
                                                               [r["offloaded"] for r in timed]) if alt else {}}),
              flush=True)


# ------------------------------------------------------------ the parent side

def _option(argv: Sequence[str], name: str) -> int:
    return int(argv[list(argv).index(name) + 1])


def _shape(argv: Sequence[str], changes: Dict[str, str]) -> List[str]:
    """`argv` with the value after each option named in `changes` replaced."""
    out = list(argv)
    for name, value in changes.items():
        out[out.index(name) + 1] = value
    return out


def _one(run: str, quick: bool, site: Optional[str] = None,
         changes: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """One worker of `run`, with the gpupool installed in `site` where given and
    the recipe's options in `changes` (option -> value) replaced."""
    name, duty = paced(run)
    kind, extra, extra_quick, allocator = RUNS[name]
    if duty < 1:
        kind = run
    changes = dict(changes or {})
    cap = changes.pop("--cap", None)
    base = _shape(_FT_QUICK if quick else _FT, changes)
    extra = extra_quick if quick else extra
    if cap is not None and "--cap" in extra:  # (only the cap run has one)
        extra = _shape(extra, {"--cap": cap})
    path = [site, str(ROOT)] if site else [str(ROOT)]
    with tempfile.TemporaryDirectory() as d:
        js = Path(d) / "result.json"
        argv = [*base, *extra, "--allocator", allocator, "--json", str(js)]
        cmd = [sys.executable, "-m", "benchmarks.interference", "--child", kind or "-",
               str(_option(base, "--warmup")), str(_option(base, "--steps")), "--", *argv]
        p = subprocess.run(cmd, cwd=ROOT, env=child_env(os.environ, path), capture_output=True, text=True,
                           timeout=900)
        extra_out = next((json.loads(line[len(_MARK):]) for line in p.stdout.splitlines()
                          if line.startswith(_MARK)), {})
        if p.returncode or not js.exists():
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            return {"run": run, "error": " / ".join(tail) or f"exit status {p.returncode}"}
        result = json.loads(js.read_text())
    return {"run": run, "tokens_per_s": result["tokens_per_s"], "peak_reserved": result["peak_reserved"],
            **extra_out}


def summarize(results: List[Dict[str, Any]], runs: Sequence[str]) -> List[str]:
    """The table: per run the median tokens/s (spread), the ratio to the median of
    `none` of the same build (a run marked @base: the base's), the training threads'
    CPU ms per step, the copier's rate, peak reserved, gpupool's counters and the
    steps' phases (medians)."""
    def med(xs: List[float]) -> Optional[float]:
        return statistics.median(xs) if xs else None

    by = {r: [x for x in results if x["run"] == r and "tokens_per_s" in x] for r in runs}
    lines = ["| run | tokens/s median (min..max) | vs none | main CPU ms/step | autograd CPU ms/step | copier GB/s "
             "| peak reserved GiB (min..max) | offload GB out/in per step | maps/unmaps/waits/pressure per step "
             "| ms past the cache per step | allocs/cross-stream waits/syncs per step | ms lock wait per step "
             "| forward/backward/optimizer ms per step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        xs = by[r]
        none = [x["tokens_per_s"] for x in results
                if x["run"] == "none" + (_BASE if r.endswith(_BASE) else "") and "tokens_per_s" in x]
        base = med(none)
        failed = sum(1 for x in results if x["run"] == r and "error" in x)
        if not xs:
            lines.append(f"| {r} | failed ({failed}) |" + " |" * 11)
            continue
        tps = [x["tokens_per_s"] for x in xs]
        m = med(tps)
        ratio = f"{m / base:.3f}x ({min(tps) / base:.3f}..{max(tps) / base:.3f})" if base and m else ""

        def each(field: str, *keys: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
            """The medians of `keys` of the runs' `field` (a dict), joined by /."""
            vs = [med([x[field][k] for x in xs if k in x.get(field, {})]) for k in keys]
            return "" if None in vs else "/".join(fmt.format(v / scale) for v in vs)

        gbps = med([x["copier_gbps"] for x in xs if x.get("copier_gbps")])
        peaks = [x["peak_reserved"] / 2**30 for x in xs]
        lines.append(f"| {r} | {m:,.0f} ({min(tps):,.0f}..{max(tps):,.0f}){f' [{failed} failed]' if failed else ''}"
                     f" | {ratio} | {each('cpu_ms_per_step', 'main')} | {each('cpu_ms_per_step', 'autograd')}"
                     f" | {'' if gbps is None else f'{gbps:.1f}'}"
                     f" | {med(peaks):.2f} ({min(peaks):.2f}..{max(peaks):.2f})"
                     f" | {each('pool_per_step', 'bytes_out', 'bytes_in', scale=1e9, fmt='{:.2f}')}"
                     f" | {each('pool_per_step', 'n_map', 'n_unmap', 'n_sync_pool', 'n_pressure')}"
                     f" | {each('pool_per_step', 'ns_slow', scale=1e6)}"
                     f" | {each('pool_per_step', 'n_alloc', 'n_stream_waits', 'n_sync', fmt='{:.0f}')}"
                     f" | {each('pool_per_step', 'ns_lock_wait', scale=1e6, fmt='{:.2f}')}"
                     f" | {each('phases_ms', 'forward', 'backward', 'optimizer')} |")
    return lines


def alternate_lines(results: List[Dict[str, Any]]) -> List[str]:
    """For the ``alternate`` runs: the steps whose state had left against their
    neighbours, per repetition and the median of the repetitions' ratios."""
    xs = [x for x in results if x.get("alternate")]
    if not xs:
        return []
    # (The two medians do not divide to the ratio: it is the median of each
    # offloaded step against its own neighbours.)
    each = [f"clean steps {x['alternate']['clean_ms']:.1f} ms, offloaded {x['alternate']['offloaded_ms']:.1f} ms; "
            f"against their neighbours {x['alternate']['vs_neighbours']:.3f}x ({x['alternate']['n']} steps)"
            for x in xs]
    mid = statistics.median(x["alternate"]["vs_neighbours"] for x in xs)
    return [f"{x['run']}: {e}" for x, e in zip(xs, each)] + [
        f"alternate: the offloaded steps ran at {mid:.3f}x of their neighbours (median of {len(xs)})"]


def against_base(results: List[Dict[str, Any]], runs: Sequence[str]) -> List[str]:
    """Per run, this build's tokens/s over the base's: the ratio of the medians, and
    that of each repetition's pair (run one after the other, the fairest comparison)."""
    lines = []
    got = {(x["run"], x["rep"]): x["tokens_per_s"] for x in results if "tokens_per_s" in x}
    for r in runs:
        reps = sorted({rep for (run, rep) in got if run == r and (r + _BASE, rep) in got})
        if not reps:
            lines.append(f"{r}: no pair of runs to compare")
            continue
        pairs = [got[(r, rep)] / got[(r + _BASE, rep)] for rep in reps]
        heads = statistics.median([got[(r, rep)] for rep in reps])
        bases = statistics.median([got[(r + _BASE, rep)] for rep in reps])
        lines.append(f"{r}: this build / base {heads / bases:.3f}x (pairs: "
                     f"{', '.join(f'{q:.3f}' for q in pairs)})")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        kind = None if args[1] == "-" else args[1]
        _worker(kind, int(args[2]), int(args[3]), args[5:])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.interference", description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each run (default: 3)")
    p.add_argument("--runs", default="none,h2d,both,offload",
                   help=f"comma-separated, of {', '.join(RUNS)}; {'/'.join(_PACEABLE)}:P copies P%% of the time "
                        "(default: none,h2d,both,offload)")
    p.add_argument("--quick", action="store_true", help="the tiny shape (a smoke test)")
    p.add_argument("--base", metavar="DIR",
                   help="also run each run with the gpupool installed in DIR (pip install --target DIR of "
                        "another checkout), interleaved: rows marked @base")
    p.add_argument("--lengths", metavar="MIN..MAX",
                   help="sequence lengths drawn from MIN..MAX tokens (default: the recipe's 512..512)")
    p.add_argument("--steps", type=int, help="timed steps of each run (default: the recipe's)")
    p.add_argument("--cap", type=float, metavar="GIB", help=f"the cap run's cap (default: {FINETUNE_CAP_GIB})")
    a = p.parse_args(args)
    runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in runs if not _known(r)]
    if bad or a.reps < 1:
        p.error(f"unknown run(s) {', '.join(bad)}; expected some of {', '.join(RUNS)}, or "
                f"{'/'.join(_PACEABLE)}:P paced to P% of the time (1..99)" if bad
                else f"--reps must be at least 1, got {a.reps}")
    changes: Dict[str, str] = {}
    if a.lengths is not None:
        lo, sep, hi = a.lengths.partition("..")
        if not (sep and lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi)):
            p.error(f"--lengths {a.lengths!r}: expected MIN..MAX, whole numbers with 0 < MIN <= MAX (say 128..1024)")
        changes.update({"--min-len": lo, "--max-len": hi})
    if a.steps is not None:
        if a.steps < 1:
            p.error(f"--steps must be at least 1, got {a.steps}")
        changes["--steps"] = str(a.steps)
    if a.cap is not None:
        if not a.cap > 0:
            p.error(f"--cap must be a positive number of GiB, got {a.cap}")
        changes["--cap"] = f"{a.cap:g}"
    if a.base and not (Path(a.base) / "gpupool").is_dir():
        p.error(f"--base {a.base}: no gpupool package there (make it with pip install --no-build-isolation "
                f"--no-deps --target {a.base} PATH-OF-ANOTHER-CHECKOUT)")
    builds = ["", _BASE] if a.base else [""]
    results = []
    for rep in range(a.reps):
        for r in runs:
            for b in builds if rep % 2 == 0 else builds[::-1]:
                x = _one(r, a.quick, str(Path(a.base).resolve()) if b else None, changes)
                x["run"], x["rep"] = r + b, rep
                results.append(x)
                print(f"rep {rep + 1} {r + b}: " + (f"{x['tokens_per_s']:,.0f} tokens/s, peak reserved "
                                                    f"{x['peak_reserved'] / 2**30:.2f} GiB" if "tokens_per_s" in x
                                                    else f"failed: {x['error']}"), flush=True)
    print("\n".join(summarize(results, [r + b for r in runs for b in builds]) + alternate_lines(results)))
    if a.base:
        print("\n".join(against_base(results, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
