"""The finetune benchmarks' verdicts from their runs (no GPU: the runs are
made up): a run out of memory under the cap is a result, not a failure, and
the goals compare the offloaded runs with gpupool's run without offload."""
from __future__ import annotations

from typing import Any, Dict, List

from benchmarks.__main__ import (cold_goals, finetune_goals, graph_goals, offload_goals, parse_args, soak_goals,
                                 summarize, table)
from benchmarks.workloads import WORKLOADS


def _run(workload: str, mode: str, tps: float = 0.0, oom: bool = False) -> Dict[str, Any]:
    result = {"oom": True, "error": "CUDA out of memory"} if oom else {"tokens_per_s": tps, "peak_allocated": 1,
                                                                       "peak_reserved": 1}
    return {"workload": workload, "mode": mode, "rep": 0, "result": result}


def _summaries(offloaded: float, capped: float, native_cap_oom: bool = True) -> Dict[str, Any]:
    runs: List[Dict[str, Any]] = []
    for tps in (100.0, 110.0, 90.0):
        runs += [_run("finetune_base", "gpupool", tps), _run("finetune_base", "native", tps)]
        runs += [_run("finetune_offload", "gpupool", offloaded), _run("finetune_cap", "gpupool", capped)]
        runs += [_run("finetune_cap", "native", 50.0, oom=native_cap_oom), _run("finetune_cap", "async", oom=True)]
    return {name: summarize(runs, WORKLOADS[name]) for name in ("finetune_base", "finetune_offload", "finetune_cap")}


def test_finetune_goals_and_out_of_memory_rows() -> None:
    s = _summaries(offloaded=90.0, capped=80.0)
    goals = finetune_goals(s)
    assert goals[0].startswith("PASS  finetune_offload gpupool") and "0.900x" in goals[0]
    assert goals[1].startswith("FAIL  finetune_cap gpupool") and "0.800x" in goals[1]
    assert "PASS  finetune_cap native: out of memory at the cap (goal: out of memory)" in goals
    assert "PASS  finetune_cap async: out of memory at the cap (goal: out of memory)" in goals
    rows = table(WORKLOADS["finetune_cap"], s["finetune_cap"], ["native", "expandable", "async", "gpupool"])
    assert "| native | out of memory (3 of 3 runs) |" in rows and "| expandable | failed |" in rows
    assert "| gpupool | 80 |" in rows
    # A PyTorch mode that trains at the cap: the cap is not one where every PyTorch mode runs out.
    assert "FAIL  finetune_cap native: trains at the cap (goal: out of memory)" in finetune_goals(
        _summaries(offloaded=90.0, capped=90.0, native_cap_oom=False))


def test_finetune_group_and_default() -> None:
    assert parse_args(["--only", "finetune"]).only == ["finetune_base", "finetune_offload", "finetune_cap"]
    assert not any(w.startswith("finetune") for w in parse_args([]).only)


def test_every_goal_list_is_a_list_without_runs() -> None:
    # The harness adds them up (graph_goals once returned None: every run's
    # summary failed with a TypeError).
    for goals in (offload_goals, cold_goals, soak_goals, graph_goals):
        assert goals([]) == []


def test_cold_goals_judge_the_default_codec_as_the_raw_case() -> None:
    # The first offload with the codec a user gets without naming one has
    # the goal of the raw one: a compressed offload once pinned its slabs
    # one at a time, at half the raw case's speed, and no goal said so.
    def case(name: str, gbps: float) -> Dict[str, Any]:
        return {"case": name, "gib": 8.0, "offload_gbps": gbps, "vs_pinned": gbps / 50.0, "same_bytes": True,
                "codec": "ans" if name == "default" else "raw"}

    runs = [{"workload": "offload_cold", "mode": "gpupool", "rep": i,
             "result": {"cold": [case("none", 24.0), case("default", d), case("ready", 48.0)]}}
            for i, d in enumerate((10.6, 11.0, 25.0))]
    goals = cold_goals(runs)
    assert "PASS  offload_cold gpupool 8 GiB raw, fresh process, no preparation: 24.0" in goals[0]
    assert goals[1].startswith("FAIL  offload_cold gpupool 8 GiB with the default codec (ans), fresh process, "
                               "no preparation: 11.0 [10.6-25.0, 3 reps] GB/s"), goals[1]
    assert goals[2].startswith("PASS  offload_cold gpupool 8 GiB raw, made offloadable before: 0.96 [")
