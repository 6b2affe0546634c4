"""The timeline summary and the kernel comparison of two traces, from made-up
Chrome traces (no GPU)."""
from __future__ import annotations

import json

import pytest

from benchmarks.timeline import compare, load, main, summarize


def _kernel(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def _trace(path, kernels: list, extra: list = ()) -> str:
    step = {"ph": "X", "cat": "gpu_user_annotation", "name": "step 0", "ts": 0.0, "dur": 10_000.0}
    path.write_text(json.dumps({"traceEvents": [step, *kernels, *extra]}))
    return str(path)


def test_summary_of_a_step(tmp_path) -> None:
    copy = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 1_000.0,
            "dur": 2_000.0, "args": {"bytes": 4_000_000_000}}
    path = _trace(tmp_path / "t.json", [_kernel("gemm", 0.0, 3_000.0), _kernel("add", 5_000.0, 3_000.0),
                                        _kernel("side", 0.0, 100.0, stream=8)], [copy])
    text = summarize(load(path), width=10)
    assert "compute stream: 7" in text
    assert "step 0: 8.0 ms on the device, compute stream busy 6.0 ms (75%)" in text
    assert "d2h: 4.00 GB in 2.0 ms (1.0..3.0 ms into the step), 100% of it under compute" in text
    assert "compute idle 2.0 ms at 3.0 ms" in text


def test_compare_counts_times_and_the_largest_differences(tmp_path) -> None:
    a = load(_trace(tmp_path / "a.json", [_kernel("gemm", 0.0, 3_000.0), _kernel("gemm", 4_000.0, 3_000.0),
                                          _kernel("add", 8_000.0, 500.0), _kernel("copy", 9_000.0, 200.0)]))
    b = load(_trace(tmp_path / "b.json", [_kernel("gemm", 0.0, 3_000.0), _kernel("gemm", 4_000.0, 3_100.0),
                                          _kernel("add", 8_000.0, 1_500.0), _kernel("scan", 9_600.0, 300.0)]))
    lines = compare(a, b, top=3, names=("A", "B")).splitlines()
    assert lines[0] == "A: 4 kernels, 6.7 ms on the device"
    assert lines[1] == "B: 4 kernels, 7.9 ms on the device"
    # add (+1.0 ms), then scan (+0.3, only in B), then copy and gemm (0.2 and 0.1 ms apart: copy first)
    assert lines[3].split() == ["0.50", "1.50", "+1.00", "1/1", "add"]
    assert lines[4].split() == ["0.00", "0.30", "+0.30", "0/1", "scan"]
    assert lines[5].split() == ["0.20", "0.00", "-0.20", "1/0", "copy"]
    assert len(lines) == 6


def test_main_compares_and_checks_its_options(tmp_path, capsys) -> None:
    a = _trace(tmp_path / "a.json", [_kernel("gemm", 0.0, 1_000.0)])
    b = _trace(tmp_path / "b.json", [_kernel("gemm", 0.0, 1_000.0)])
    assert main([a, "--against", b, "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{a}: 1 kernels, 1.0 ms on the device" in out and "+0.00" in out
    with pytest.raises(SystemExit):
        main([a, "--against", b, "--top", "-1"])
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(SystemExit, match="no kernels"):
        main([str(empty)])
