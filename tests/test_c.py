"""Build and run the C tests of the allocator core (tests/c) on the host
backend, under AddressSanitizer + UndefinedBehaviorSanitizer, and the thread
stress test once more under ThreadSanitizer."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The allocator core: every C file but those of the Python module and the
# CUDA backend (by what they include).
_NOT_CORE = re.compile(r'#include [<"](Python\.h|cuda\.h|module\.h|pystack\.h|torch_abi\.h)[>"]')
CORE = sorted(p.name for p in (ROOT / "csrc").glob("*.c") if not _NOT_CORE.search(p.read_text()))
CC = os.environ.get("CC", "cc")

pytestmark = pytest.mark.skipif(shutil.which(CC) is None, reason=f"no C compiler ({CC})")


def build(tmp: Path, test: str, sanitize: List[str], extra: List[str] = ()) -> Path:
    out = tmp / (Path(test).stem + "_" + "_".join(s.split("=")[-1].replace(",", "_") for s in sanitize))
    cmd = [CC, "-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
           "-Wno-missing-field-initializers", *sanitize, "-fno-omit-frame-pointer",
           f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'tests' / 'c'}", str(ROOT / "tests" / "c" / test),
           *[str(ROOT / "csrc" / c) for c in CORE], *extra, "-lpthread", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"build of {test} failed:\n{' '.join(cmd)}\n{r.stderr}"
    return out


def run(exe: Path, args: List[str], env_extra: dict) -> str:
    env = dict(os.environ, **env_extra)
    cmd = [str(exe), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0 and "unexpected memory mapping" in r.stderr and shutil.which("setarch"):
        # TSan cannot run with the high mmap randomisation of recent kernels.
        r = subprocess.run(["setarch", os.uname().machine, "-R", *cmd], capture_output=True,
                           text=True, env=env, timeout=900)
    assert r.returncode == 0, f"{exe.name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    last = r.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failed"), r.stdout
    return r.stdout


ASAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


@pytest.mark.parametrize("test,args", [
    ("test_pool.c", []),
    ("test_config.c", []),
    ("test_compat.c", []),
    ("test_prio.c", []),
    ("test_trace.c", []),
    ("test_model.c", [os.environ.get("GP_TEST_MODEL_OPS", "2000000")]),
    ("test_stress.c", ["100000"]),
    ("test_faults.c", []),
])
def test_c_asan_ubsan(tmp_path: Path, test: str, args: List[str]) -> None:
    out = run(build(tmp_path, test, ASAN), args, ASAN_ENV)
    assert "passed" in out


def test_c_stress_tsan(tmp_path: Path) -> None:
    exe = build(tmp_path, "test_stress.c", ["-fsanitize=thread"])
    run(exe, ["20000"], {"TSAN_OPTIONS": "halt_on_error=1"})


@pytest.mark.parametrize("bench", ["bench_hotpath.c", "bench_frag.c"])
def test_benchmark_build_line_works(tmp_path: Path, bench: str) -> None:
    # The command in the benchmark's header is what people copy: it must
    # still name every source the core needs (it missed trace.c once).
    text = (ROOT / "benchmarks" / bench).read_text()
    lines = text[text.index(" *   cc "):].splitlines()
    cmd = ""
    for line in lines:
        cmd += line.lstrip(" *").rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            break
    words = cmd.split("&&")[0].split()
    out = words.index("-o")
    words[out + 1] = str(tmp_path / "bench")
    r = subprocess.run([CC if w == "cc" else w for w in words], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(words)}\n{r.stderr}"
