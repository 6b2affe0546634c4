"""The codec layer of offload on a GPU with nvCOMP (tests/c/gpu_codec.c): 256
MiB of bf16 N(0, 0.02), fp32 squares (like AdamW's exp_avg_sq) and random
bytes go out through ANS and Bitcomp and come back identical; prints the
ratio and the rates against raw pinned copies of the same run.

nvCOMP is found as the codec layer finds it: GPUPOOL_NVCOMP (the path of
libnvcomp.so.6 or its folder) if set, else the installed
nvidia-libnvcomp-cu13 wheel (`pip install "gpupool[nvcomp]"`, or
`pip install --no-deps nvidia_libnvcomp_cu13-6.*.whl` on a machine without
network); without either the test is skipped, saying so.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

import pytest

from gpupool._nvcomp import wheel_dir
from test_c import CC, CORE, CUDA_BACKEND, INCLUDES, ROOT

pytestmark = pytest.mark.gpu


def _cuda_include() -> Optional[str]:
    """cuda.h for backend_cuda.c: $CUDA_HOME, the toolkit of nvcc, /usr/local/cuda."""
    nvcc = shutil.which("nvcc")
    for inc in [os.path.join(os.environ.get("CUDA_HOME", ""), "include"),
                os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include") if nvcc else "",
                "/usr/local/cuda/include"]:
        if inc and os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc
    return None


def _nvcomp() -> str:
    path = os.environ.get("GPUPOOL_NVCOMP") or wheel_dir()
    if not path:
        pytest.skip("nvCOMP not found: set GPUPOOL_NVCOMP to libnvcomp.so.6 or install the "
                    "nvidia-libnvcomp-cu13 wheel")
    return path


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inc = _cuda_include()
    if inc is None:
        pytest.skip("cuda.h not found (CUDA_HOME, nvcc's toolkit, /usr/local/cuda)")
    out = tmp_path_factory.mktemp("gpu_codec") / "gpu_codec"
    cmd = [CC, "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror",
           "-Wno-missing-field-initializers", *INCLUDES, f"-I{inc}",
           str(ROOT / "tests" / "c" / "gpu_codec.c"), *CORE, *CUDA_BACKEND, "-lpthread", "-ldl", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


def _run(driver: Path, codec: str, elem: int, data: str, mib: int = 256) -> Dict[str, float]:
    r = subprocess.run([str(driver), codec, str(elem), data, str(mib), _nvcomp()], capture_output=True,
                       text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    fields["raw_chunks"] = fields["raw_chunks"].split("/")[0]  # "raw/all"
    assert fields["identical"] == "1"
    return {k: float(v) for k, v in fields.items() if re.fullmatch(r"[0-9.]+", v)}


@pytest.mark.parametrize("codec", ["ans", "bitcomp"])
def test_bf16_round_trip(driver: Path, codec: str) -> None:
    res = _run(driver, codec, 2, "bf16")
    # DESIGN.md measured ANS at 1.46-1.51 on this data.
    assert res["ratio"] > (1.4 if codec == "ans" else 1.1)
    assert res["raw_chunks"] == 0


@pytest.mark.parametrize("codec", ["ans", "bitcomp"])
def test_fp32_squares_round_trip(driver: Path, codec: str) -> None:
    res = _run(driver, codec, 4, "fp32sq")
    assert res["ratio"] > 1.07


def test_random_bytes_are_stored_raw(driver: Path) -> None:
    res = _run(driver, "auto", 2, "random")
    assert res["ratio"] == 1.0 and res["trial"] < 1.07


def test_odd_size_and_bytes(driver: Path) -> None:
    # 1 MiB of bf16 through ANS with the bytes data type (element size 1).
    res = _run(driver, "ans", 1, "bf16", mib=1)
    assert res["ratio"] > 1.0
