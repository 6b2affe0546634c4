"""Shared fixtures: GPU tests run their body in a fresh Python process, since
an allocator is chosen once per process, before CUDA allocates anything."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from typing import Iterator, List

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


def _check_raw(raw: object, name: str, problems: List[str]) -> None:
    """Pool.check() of a _C.Pool, its problem (if any) kept in `problems`."""
    try:
        n, first = raw.check()  # type: ignore[attr-defined]
    except Exception as e:  # (a finalizer must not raise)
        problems.append(f"{name}: check() raised {e!r}")
        return
    if n:
        problems.append(f"{name}: {n} problem(s), the first: {first}")


@pytest.fixture(autouse=True)
def check_host_pools(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every HostPool a test makes goes through Pool.check() (the pool's and
    its offloader's integrity): when the pool goes, if it goes during the
    test, else when the test ends.  A problem fails the test."""
    try:
        from gpupool import _pool
    except ImportError:
        yield
        return
    problems: List[str] = []
    made: List[weakref.finalize] = []
    init = _pool.HostPool.__init__

    @functools.wraps(init)
    def checked_init(self: "_pool.HostPool", *args: object, **kw: object) -> None:
        init(self, *args, **kw)  # type: ignore[arg-type]
        # At its death (the raw pool, which the finalizer holds, goes right
        # after), or at the test's end.
        made.append(weakref.finalize(self, _check_raw, self._pool, f"HostPool #{len(made) + 1} of the test",
                                     problems))

    monkeypatch.setattr(_pool.HostPool, "__init__", checked_init)
    yield
    for fin in made:
        left = fin.detach()  # (None once it ran)
        if left is not None:
            _check_raw(*left[2])
    assert not problems, "Pool.check() found a HostPool corrupt:\n" + "\n".join(problems)


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
