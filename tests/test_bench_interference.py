"""The interference benchmark's table from made-up runs (no GPU), its options,
and its worker's step marks on a CPU model."""
from __future__ import annotations

import json

import pytest

from benchmarks.interference import against_base, alternate_lines, alternate_stats, main, summarize


def _commands(monkeypatch, argv: list) -> list:
    """The worker commands `main(argv)` runs, none of them run (each fails: no GPU)."""
    import subprocess

    from benchmarks import interference

    seen: list = []
    monkeypatch.setattr(interference.subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 1, "", "no GPU"))
    assert main(argv) == 0
    return seen


def _run(run: str, tps: float, main_ms: float = 80.0, gbps: object = None, peak_gib: float = 10.0,
         pool: object = None, phases: object = None) -> dict:
    return {"run": run, "tokens_per_s": tps, "peak_reserved": int(peak_gib * 2**30),
            "cpu_ms_per_step": {"main": main_ms, "autograd": 2 * main_ms}, "copier_gbps": gbps,
            "pool_per_step": pool or {}, "phases_ms": phases or {}}


def test_table_medians_ratios_and_failures() -> None:
    results = [_run("none", t) for t in (100.0, 120.0, 110.0)]
    results += [_run("h2d", t, 90.0, 48.0, g) for t, g in ((88.0, 11.5), (99.0, 12.0), (77.0, 11.0))]
    moved = {"bytes_out": 3.7e9, "bytes_in": 3.6e9, "n_map": 50, "n_unmap": 40.5, "n_sync_pool": 2, "n_pressure": 0.5,
             "ns_slow": 15e6, "n_alloc": 4000, "n_stream_waits": 3, "n_sync": 1, "ns_lock_wait": 2.5e6}
    phases = [{"forward": 60.0, "backward": 120.0, "optimizer": 3.0, "step": 183.0},
              {"forward": 80.0, "backward": 150.0, "optimizer": 4.0, "step": 234.0},
              {"forward": 70.0, "backward": 130.0, "optimizer": 2.0, "step": 202.0}]
    results += [_run("offload", 80.0, pool=moved, phases=ph) for ph in phases]
    results += [{"run": "offload", "error": "out of memory"}]
    rows = summarize(results, ["none", "h2d", "offload", "both"])
    assert rows[2] == ("| none | 110 (100..120) | 1.000x (0.909..1.091) | 80.0 | 160.0 |  | 10.00 (10.00..10.00)"
                       " |  |  |  |  |  |  |")
    assert rows[3] == ("| h2d | 88 (77..99) | 0.800x (0.700..0.900) | 90.0 | 180.0 | 48.0 | 11.50 (11.00..12.00)"
                       " |  |  |  |  |  |  |")
    assert rows[4].startswith("| offload | 80 (80..80) [1 failed] | 0.727x")
    assert rows[4].endswith("| 3.70/3.60 | 50.0/40.5/2.0/0.5 | 15.0 | 4000/3/1 | 2.50 | 70.0/130.0/3.0 |")
    assert rows[5] == "| both | failed (0) | | | | | | | | | | | |"
    assert all(r.count("|") == rows[0].count("|") for r in rows)


def test_bad_options_are_named() -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "none,sideways"])
    with pytest.raises(SystemExit):
        main(["--reps", "0"])


def test_a_base_build_has_rows_and_pairs_of_its_own() -> None:
    results = [dict(_run("none", 100.0), rep=0), dict(_run("none@base", 50.0), rep=0),
               dict(_run("offload", 90.0), rep=0), dict(_run("offload@base", 40.0), rep=0),
               dict(_run("offload", 80.0), rep=1), {"run": "offload@base", "rep": 1, "error": "killed"}]
    rows = summarize(results, ["none", "none@base", "offload", "offload@base"])
    assert rows[4].startswith("| offload | 85 (80..90) | 0.850x")
    assert rows[5].startswith("| offload@base | 40 (40..40) [1 failed] | 0.800x")
    assert against_base(results, ["none", "offload", "cap"]) == [
        "none: this build / base 2.000x (pairs: 2.000)", "offload: this build / base 2.250x (pairs: 2.250)",
        "cap: no pair of runs to compare"]


def test_a_base_without_gpupool_is_named(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "none", "--base", str(tmp_path)])


@pytest.mark.parametrize("option", [["--lengths", "1024..128"], ["--lengths", "512"], ["--lengths", "0..8"],
                                    ["--steps", "0"], ["--cap", "0"], ["--cap", "-1"]])
def test_bad_shapes_are_named(option, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "none", *option])
    assert option[0] in capsys.readouterr().err


def test_lengths_steps_and_cap_reach_the_example(monkeypatch) -> None:
    seen = _commands(monkeypatch, ["--runs", "offload,cap", "--reps", "1", "--lengths", "128..1024", "--steps", "30",
                                   "--cap", "18"])
    offload, cap = (c[c.index("--") + 1:] for c in seen)
    for argv in (offload, cap):
        assert argv[argv.index("--min-len") + 1] == "128" and argv[argv.index("--max-len") + 1] == "1024"
        assert argv[argv.index("--steps") + 1] == "30"
    assert "--cap" not in offload and cap[cap.index("--cap") + 1] == "18"
    # The worker counts the same timed steps as the example runs.
    assert [c[c.index("--") - 1] for c in seen] == ["30", "30"]


def test_trip_moves_the_optimizers_state_bytes(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from benchmarks import interference

    params = [torch.nn.Parameter(torch.ones(n)) for n in (3, 1000, 17)]
    opt = torch.optim.AdamW(params)
    assert interference.state_bytes(opt) == 0
    sum(p.sum() for p in params).backward()
    opt.step()
    # exp_avg and exp_avg_sq in fp32 per parameter, and AdamW's step counter each
    assert interference.state_bytes(opt) == sum(2 * 4 * p.numel() + 4 for p in params)

    seen = _commands(monkeypatch, ["--runs", "trip", "--reps", "1"])
    assert seen[0][seen[0].index("--child") + 1] == "trip" and "--offload-optimizer" not in seen[0]


def test_offloaded_steps_are_priced_against_their_neighbours() -> None:
    # steps 0..5; 1 and 3 had the state away; 5 too, with one neighbour only
    steps = [100.0, 125.0, 110.0, 120.0, 100.0, 150.0]
    away = [False, True, False, True, False, True]
    got = alternate_stats(steps, away)
    assert got["n"] == 3 and got["offloaded_ms"] == 125.0 and got["clean_ms"] == 100.0
    assert got["vs_neighbours"] == pytest.approx(105.0 / 125.0)  # the median of 105/125, 105/120, 100/150
    assert alternate_stats([100.0, 120.0], [False, False]) == {}
    assert alternate_stats([120.0], [True]) == {}
    lines = alternate_lines([{"run": "alternate", "alternate": got}, {"run": "none"}])
    assert lines == ["alternate: clean steps 100.0 ms, offloaded 125.0 ms; against their neighbours 0.840x "
                     "(3 steps)",
                     "alternate: the offloaded steps ran at 0.840x of their neighbours (median of 1)"]
    assert alternate_lines([{"run": "none"}]) == []


def test_alternate_skips_the_offload_behind_every_other_step() -> None:
    from benchmarks.interference import _Alternate

    class Handle:
        def __init__(self) -> None:
            self.calls: list = []

        def offload(self, **kw: object) -> object:
            self.calls.append(kw)
            return kw

    h = Handle()
    alt = _Alternate(h)
    for step in (2, 3, 4, 5):
        alt.before_step(step)
        h.offload(wait=False, max_bytes=None)  # what the step's post hook asks
        assert alt.asked == (step % 2 == 0)
    assert h.calls == [{"wait": False, "max_bytes": None}] * 2


def test_the_alternate_run_offloads_through_the_worker_not_the_example(monkeypatch) -> None:
    seen = _commands(monkeypatch, ["--runs", "alternate", "--reps", "1"])
    assert seen[0][seen[0].index("--child") + 1] == "alternate" and "--offload-optimizer" not in seen[0]


def test_the_worker_marks_each_steps_phases(tmp_path, capsys) -> None:
    torch = pytest.importorskip("torch")
    from benchmarks import interference

    script = tmp_path / "train.py"
    script.write_text("""
import time, torch
m = torch.nn.Linear(16, 16)
opt = torch.optim.AdamW(m.parameters())
for i in range(6):
    time.sleep(0.02)  # the forward pass's part
    loss = m(torch.ones(4, 16)).sum()
    loss.backward()
    time.sleep(0.01)  # between the backward pass and the step
    opt.step()
    opt.zero_grad()
""")
    from torch.optim import optimizer as torch_optimizer

    backward = torch.Tensor.backward
    hooks = (len(torch_optimizer._global_optimizer_pre_hooks), len(torch_optimizer._global_optimizer_post_hooks))
    interference._worker(None, 2, 4, [str(script)])
    out = [json.loads(line[len(interference._MARK):]) for line in capsys.readouterr().out.splitlines()
           if line.startswith(interference._MARK)]
    phases = out[0]["phases_ms"]
    assert phases["forward"] >= 20.0 and phases["backward"] >= 10.0 and phases["optimizer"] >= 0.0
    assert phases["step"] == pytest.approx(phases["forward"] + phases["backward"] + phases["optimizer"], rel=0.2)
    assert out[0]["alternate"] == {}
    # The worker leaves torch as it found it: no hook stays, backward is torch's own.
    assert torch.Tensor.backward is backward
    assert hooks == (len(torch_optimizer._global_optimizer_pre_hooks),
                     len(torch_optimizer._global_optimizer_post_hooks))


def test_the_worker_alternates_through_the_handles_own_post_hook(tmp_path, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import gpupool
    from benchmarks import interference

    class Handle:  # what offloadable(offload_after_step=True) does behind each step, on the CPU
        def __init__(self, opt: object) -> None:
            self.asked: list = []
            self.hook = opt.register_step_post_hook(lambda *a: self.offload(wait=False, max_bytes=None))

        def offload(self, **kw: object) -> None:
            self.asked.append(len(self.asked))

    made: list = []
    monkeypatch.setattr(gpupool, "offloadable",
                        lambda opt, tag, **kw: made.append(Handle(opt)) or made[-1], raising=True)
    script = tmp_path / "train.py"
    script.write_text("""
import time, torch
m = torch.nn.Linear(16, 16)
opt = torch.optim.AdamW(m.parameters())
for i in range(9):
    loss = m(torch.ones(4, 16)).sum()
    loss.backward()
    opt.step()
    time.sleep(0.03 if i % 2 == 1 else 0.01)  # (falls in the next step: odd steps, those after an offload)
""")
    interference._worker("alternate", 2, 7, [str(script)])
    out = [json.loads(line[len(interference._MARK):]) for line in capsys.readouterr().out.splitlines()
           if line.startswith(interference._MARK)][0]
    # Steps 2, 4, 6 and 8 offloaded behind themselves: steps 3, 5, 7 and 9 are the offloaded ones.
    assert len(made) == 1 and len(made[0].asked) == 4
    alt = out["alternate"]
    assert alt["n"] == 4 and alt["offloaded_ms"] > alt["clean_ms"] and alt["vs_neighbours"] < 0.8
    made[0].hook.remove()


def test_host_copier_copies_host_memory_in_its_threads(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import threading
    import time

    from benchmarks import interference

    monkeypatch.setattr(interference, "_BUF", 1 << 16)
    bufs = interference._buffers("host", 0)
    assert len(bufs) == interference._HOST_THREADS
    assert all(b.device.type == "cpu" and b.numel() == 2 * interference._BUF for b in bufs)
    for i, b in enumerate(bufs):
        b[: interference._BUF] = torch.arange(interference._BUF, dtype=torch.int64).to(torch.uint8) + i
        b[interference._BUF:] = 0
    stop, moved = threading.Event(), []
    t = threading.Thread(target=interference._copier, args=("host", bufs, stop, moved, threading.Event()))
    t.start()
    time.sleep(0.2)
    stop.set()
    t.join(5)
    assert not t.is_alive()
    for b in bufs:  # each thread copied the first half of its buffer to the second
        assert torch.equal(b[interference._BUF:], b[: interference._BUF])
    assert len(moved) == 1 and moved[0] > 0


def test_native_run_uses_pytorchs_allocator(monkeypatch) -> None:
    seen = _commands(monkeypatch, ["--runs", "none,native", "--reps", "1"])
    assert [c[c.index("--allocator") + 1] for c in seen] == ["gpupool", "native"]
    assert all(c[c.index("--child") + 1] == "-" and "--offload-optimizer" not in c for c in seen)


@pytest.mark.parametrize("run", ["d2h:0", "d2h:100", "d2h:", "d2h:x", "d2h:5.5", "trip:50", "host:50", "none:50",
                                 "offload:50"])
def test_bad_paces_are_named(run, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--runs", f"none,{run}"])
    err = capsys.readouterr().err
    assert run in err and "1..99" in err


def test_a_paced_run_reaches_the_worker(monkeypatch) -> None:
    from benchmarks import interference

    assert interference.paced("both:25") == ("both", 0.25) and interference.paced("d2h") == ("d2h", 1.0)
    seen = _commands(monkeypatch, ["--runs", "d2h,d2h:50", "--reps", "1"])
    assert [c[c.index("--child") + 1] for c in seen] == ["d2h", "d2h:50"]


class _Stop:
    """threading.Event's is_set and wait for a copier: set from the `n`-th look on,
    the waits' timeouts recorded."""

    def __init__(self, n: int) -> None:
        self.timeouts: list = []
        self.looks = 0
        self.n = n

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks >= self.n

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return False


@pytest.mark.parametrize("run", ["d2h", "d2h:25", "h2d:50"])
def test_a_paced_copier_pauses_for_its_share_of_the_time(run, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import contextlib
    import threading
    import time

    from benchmarks import interference

    class Stream:  # each copy "runs" for 20 ms
        def synchronize(self) -> None:
            time.sleep(0.02)

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(interference, "_BUF", 64)
    bufs = ([torch.ones(64, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8)],
            [torch.zeros(64, dtype=torch.uint8), torch.full((64,), 7, dtype=torch.uint8)])
    stop, moved = _Stop(4), []
    interference._copier(run, bufs, stop, moved, threading.Event())
    name, duty = interference.paced(run)
    assert torch.equal(bufs[1][0], bufs[0][0]) if name == "h2d" else torch.equal(bufs[0][1], bufs[1][1])
    # Three copies; after each a pause of (1 - duty) / duty of its 20 ms or more; none unpaced.
    assert len(stop.timeouts) == (0 if duty == 1 else 3)
    assert all(t >= 0.02 * (1 - duty) / duty for t in stop.timeouts)
    assert len(moved) == 1 and moved[0] > 0
