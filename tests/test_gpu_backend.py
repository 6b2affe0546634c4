"""The backend conformance suite (tests/c/test_backend.c) on the CUDA
backend: the same checks of backend.h's contract that tests/test_c.py runs
on the host backend and its adaptors, here on device 0."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_c import CC, CORE, CUDA_BACKEND, INCLUDES, ROOT
from test_offload_codec_gpu import _cuda_include

pytestmark = pytest.mark.gpu


def test_cuda_backend_conforms(tmp_path: Path) -> None:
    inc = _cuda_include()
    if inc is None:
        pytest.skip("cuda.h not found (CUDA_HOME, nvcc's toolkit, /usr/local/cuda)")
    exe = tmp_path / "test_backend_cuda"
    cmd = [CC, "-std=c11", "-D_GNU_SOURCE", "-DGP_TEST_CUDA", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
           "-Wno-missing-field-initializers", *INCLUDES, f"-I{inc}",
           str(ROOT / "tests" / "c" / "test_backend.c"), *CORE, *CUDA_BACKEND, "-lpthread", "-ldl", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    # The host variants too, in the same binary: the suite is one.
    r = subprocess.run([str(exe), "cuda", "host", "tenant"], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and "cuda: conforms" in r.stdout, f"{r.stdout}\n{r.stderr}"
