"""Shared fixtures: GPU tests run their body in a fresh Python process, since
an allocator is chosen once per process, before CUDA allocates anything."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def child_env(extra: dict | None = None) -> dict:
    """The environment for a child Python: the gpupool under test is the one
    this interpreter imports (installed, editable or not: the package lives
    in src/, so no folder of the checkout can shadow it); the checkout comes
    last on the path, for `benchmarks` and `examples` alone."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **(extra or {}))


def pytest_report_header(config: pytest.Config) -> str:
    try:
        import gpupool
    except ImportError as e:
        return f"gpupool: not importable ({e}); install it first: pip install -e . (or pip install .)"
    return f"gpupool under test: {os.path.dirname(gpupool.__file__)}"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs torch with a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def run_py(tmp_path: Path):
    """run_py(code, env=None, timeout=600) -> CompletedProcess; asserts exit 0
    unless check=False.  The code runs in a fresh interpreter in tmp_path."""

    def run(code: str, env: dict | None = None, timeout: int = 600, check: bool = True):
        script = tmp_path / "case.py"
        script.write_text(textwrap.dedent(code))
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=child_env(env), cwd=tmp_path, timeout=timeout)
        if check:
            assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
        return r

    return run
