"""The examples' and the benchmarks' commands on a machine without a GPU:
one clear line and exit status 2, no children started, nothing written."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env


def _gpu_here() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = pytest.mark.skipif(_gpu_here(), reason="a GPU is here: the GPU tests run these commands")


def test_benchmarks_without_a_gpu_say_so_and_write_nothing(tmp_path: Path) -> None:
    # It printed a flattened traceback and left benchmark-results.json here.
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "churn", "--reps", "1"], capture_output=True,
                       text=True, env=child_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: python -m benchmarks needs PyTorch and a CUDA GPU: "), \
        r.stderr
    assert "Traceback" not in r.stderr and "machine:" not in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_multi_tenant_without_a_gpu_says_so_before_starting_jobs(tmp_path: Path) -> None:
    # It ran eight failing children and printed a table of nan, suggesting
    # a --device cpu it does not have.
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "multi_tenant.py"), "--size", "tiny"],
                       capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no CPU mode" in lines[0], r.stderr
    assert "--device cpu" not in r.stderr and "nan" not in r.stdout and "alone" not in r.stdout, r.stdout
