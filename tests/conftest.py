"""Shared fixtures: GPU tests run their body in a fresh Python process, since
an allocator is chosen once per process, before CUDA allocates anything."""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import textwrap
import time
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


@pytest.fixture
def run_ranks(tmp_path: Path):
    """run_ranks(code, world, timeout=600) -> [CompletedProcess]: the code in
    `world` fresh interpreters at once, each told its rank as torchrun tells
    the ranks of a job (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT); asserts each exits 0.  A rank that fails stops the others
    (they would wait for it in a collective).  Skips where the machine has
    fewer GPUs than ranks."""

    def run(code: str, world: int, timeout: int = 600) -> list:
        import torch

        if torch.cuda.device_count() < world:
            pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
        script = tmp_path / "case.py"
        script.write_text(textwrap.dedent(code))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs, logs = [], []
        for rank in range(world):
            env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            out, err = (open(tmp_path / f"rank{rank}.{n}", "w+") for n in ("out", "err"))
            logs.append((out, err))
            procs.append(subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=err, text=True,
                                          env=child_env(env), cwd=tmp_path))
        deadline = time.monotonic() + timeout
        late = False
        try:
            while any(p.poll() is None for p in procs):
                if any(p.returncode not in (None, 0) for p in procs):
                    break
                if time.monotonic() > deadline:
                    late = True
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        done = []
        for rank, (p, (out, err)) in enumerate(zip(procs, logs)):
            out.seek(0)
            err.seek(0)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()))
            out.close()
            err.close()
        # (the rank that failed first, not one killed after it)
        bad = sorted((r.returncode == -9, rank) for rank, r in enumerate(done) if r.returncode != 0)
        if bad:
            rank = bad[0][1]
            r = done[rank]
            why = f"still running after {timeout} s" if late else f"exit {r.returncode}"
            pytest.fail(f"rank {rank} of {world}: {why}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return done

    return run
