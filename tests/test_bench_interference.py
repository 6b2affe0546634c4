"""The interference benchmark's table from made-up runs (no GPU), and its options."""
from __future__ import annotations

import pytest

from benchmarks.interference import against_base, main, summarize


def _run(run: str, tps: float, main_ms: float = 80.0, gbps: object = None, peak_gib: float = 10.0,
         pool: object = None) -> dict:
    return {"run": run, "tokens_per_s": tps, "peak_reserved": int(peak_gib * 2**30),
            "cpu_ms_per_step": {"main": main_ms, "autograd": 2 * main_ms}, "copier_gbps": gbps,
            "pool_per_step": pool or {}}


def test_table_medians_ratios_and_failures() -> None:
    results = [_run("none", t) for t in (100.0, 120.0, 110.0)]
    results += [_run("h2d", t, 90.0, 48.0, g) for t, g in ((88.0, 11.5), (99.0, 12.0), (77.0, 11.0))]
    moved = {"bytes_out": 3.7e9, "bytes_in": 3.6e9, "n_map": 50, "n_unmap": 40.5, "n_sync_pool": 2, "n_pressure": 0.5,
             "ns_slow": 15e6}
    results += [_run("offload", 80.0, pool=moved), {"run": "offload", "error": "out of memory"}]
    rows = summarize(results, ["none", "h2d", "offload", "both"])
    assert rows[2] == "| none | 110 (100..120) | 1.000x (0.909..1.091) | 80.0 | 160.0 |  | 10.00 (10.00..10.00) |  |  |  |"
    assert rows[3] == ("| h2d | 88 (77..99) | 0.800x (0.700..0.900) | 90.0 | 180.0 | 48.0 | 11.50 (11.00..12.00)"
                       " |  |  |  |")
    assert rows[4].startswith("| offload | 80 (80..80) [1 failed] | 0.727x")
    assert rows[4].endswith("| 3.70/3.60 | 50.0/40.5/2.0/0.5 | 15.0 |")
    assert rows[5] == "| both | failed (0) | | | | | | | | |"


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
    import subprocess

    from benchmarks import interference

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "no GPU here")

    monkeypatch.setattr(interference.subprocess, "run", fake_run)
    assert main(["--runs", "offload,cap", "--reps", "1", "--lengths", "128..1024", "--steps", "30",
                 "--cap", "18"]) == 0
    offload, cap = (c[c.index("--") + 1:] for c in seen)
    for argv in (offload, cap):
        assert argv[argv.index("--min-len") + 1] == "128" and argv[argv.index("--max-len") + 1] == "1024"
        assert argv[argv.index("--steps") + 1] == "30"
    assert "--cap" not in offload and cap[cap.index("--cap") + 1] == "18"
    # The worker counts the same timed steps as the example runs.
    assert [c[c.index("--") - 1] for c in seen] == ["30", "30"]


def test_trip_moves_the_optimizers_state_bytes(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import subprocess

    from benchmarks import interference

    params = [torch.nn.Parameter(torch.ones(n)) for n in (3, 1000, 17)]
    opt = torch.optim.AdamW(params)
    assert interference.state_bytes(opt) == 0
    sum(p.sum() for p in params).backward()
    opt.step()
    # exp_avg and exp_avg_sq in fp32 per parameter, and AdamW's step counter each
    assert interference.state_bytes(opt) == sum(2 * 4 * p.numel() + 4 for p in params)

    seen = []
    monkeypatch.setattr(interference.subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 1, "", "no GPU"))
    assert main(["--runs", "trip", "--reps", "1"]) == 0
    assert seen[0][seen[0].index("--child") + 1] == "trip" and "--offload-optimizer" not in seen[0]
