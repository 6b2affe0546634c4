"""Build and run the C tests of the allocator core (tests/c) on the host
backend, under AddressSanitizer + UndefinedBehaviorSanitizer, and the thread
stress test once more under ThreadSanitizer."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
# The allocator core, by its folders: every C file but those of the Python
# module (python/) and the CUDA backend (backend/cuda/).
_NOT_CORE = ("python/", "backend/cuda/")
CORE = sorted(str(p) for p in CSRC.rglob("*.c") if not p.relative_to(CSRC).as_posix().startswith(_NOT_CORE))
# The CUDA backend: the driver calls and the kernels it loads.
CUDA_BACKEND = sorted(str(p) for p in (CSRC / "backend" / "cuda").glob("*.c"))
# Headers are included by name: every folder that holds one, and the tests'.
INCLUDES = [f"-I{d}" for d in sorted({p.parent for p in CSRC.rglob("*.h")})] + [f"-I{ROOT / 'tests' / 'c'}"]
CC = os.environ.get("CC", "cc")

pytestmark = pytest.mark.skipif(shutil.which(CC) is None, reason=f"no C compiler ({CC})")


def build(tmp: Path, test: str, sanitize: List[str], extra: List[str] = ()) -> Path:
    out = tmp / (Path(test).stem + "_" + "_".join(s.split("=")[-1].replace(",", "_") for s in sanitize))
    cmd = [CC, "-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
           "-Wno-missing-field-initializers", *sanitize, "-fno-omit-frame-pointer",
           *INCLUDES, str(ROOT / "tests" / "c" / test), *CORE, *extra, "-lpthread", "-ldl", "-o", str(out)]
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


# The tests that offload compress (zstd on the host backend) when libzstd
# is there, as the extension does: the compressed path under the sanitizers.
COMPRESSING = {"test_offload.c", "test_offload_audit.c", "test_faults.c", "test_arbiter.c", "test_offload_stress.c"}


def zstd_flags(test: str) -> List[str]:
    import gpupool

    return ["-DGP_HAVE_ZSTD", "-lzstd"] if test in COMPRESSING and gpupool.build_info()["zstd"] else []


ASAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


@pytest.mark.parametrize("test,args", [
    ("test_pool.c", []),
    ("test_config.c", []),
    ("test_compat.c", []),
    ("test_prio.c", []),
    ("test_trace.c", []),
    ("test_offload_pool.c", []),
    ("test_offload.c", []),
    ("test_offload_audit.c", []),
    ("test_codec.c", []),  # built without libzstd: the host codecs are raw only
    ("test_arbiter.c", []),
    ("test_backend.c", ["host", "deferred", "log", "tenant"]),  # backend.h's contract, on each backend
    ("test_range_set.c", []),
    ("test_model.c", [os.environ.get("GP_TEST_MODEL_OPS", "2000000")]),
    ("test_stress.c", ["100000"]),
    ("test_faults.c", []),
    # seconds (600 by hand); "faults": injected backend failures; "deferred":
    # the backend's streams run their work as late as a GPU's may
    ("test_offload_stress.c", [os.environ.get("GP_TEST_OFFLOAD_STRESS_SECONDS", "3")]),
    ("test_offload_stress.c", [os.environ.get("GP_TEST_OFFLOAD_STRESS_SECONDS", "3"), "faults"]),
    ("test_offload_stress.c", [os.environ.get("GP_TEST_OFFLOAD_STRESS_SECONDS", "3"), "faults", "deferred"]),
])
def test_c_asan_ubsan(tmp_path: Path, test: str, args: List[str]) -> None:
    out = run(build(tmp_path, test, ASAN, zstd_flags(test)), args, ASAN_ENV)
    assert "passed" in out
    print(out)  # (the figures some tests print: pytest -s or -rP shows them)


@pytest.mark.parametrize("test,args", [("test_stress.c", ["20000"]), ("test_offload.c", []),
                                       ("test_offload_audit.c", ["prefetch,together,nested"]),
                                       ("test_offload_stress.c", ["2"]), ("test_offload_stress.c", ["2", "faults"]),
                                       ("test_offload_stress.c", ["2", "faults", "deferred"])])
def test_c_tsan(tmp_path: Path, test: str, args: List[str]) -> None:
    # The threaded parts: the pool under concurrent callers, offload's workers.
    exe = build(tmp_path, test, ["-fsanitize=thread"], zstd_flags(test))
    run(exe, args, {"TSAN_OPTIONS": "halt_on_error=1"})


def test_codec_with_zstd_and_nvcomp(tmp_path: Path) -> None:
    """The codec test as the extension is built here: with libzstd when the
    extension has it, and on the real nvCOMP library when its wheel is
    installed (loader, sizes, a launch that fails without a GPU)."""
    import gpupool
    from gpupool._nvcomp import wheel_dir

    if not gpupool.build_info()["zstd"]:
        pytest.skip("the extension was built without libzstd (install libzstd-dev)")
    env = dict(ASAN_ENV)
    lib = wheel_dir()
    if lib:
        env["GP_TEST_NVCOMP"] = str(Path(lib) / "libnvcomp.so.6")
    out = run(build(tmp_path, "test_codec.c", ASAN, ["-DGP_HAVE_ZSTD", "-lzstd"]), [], env)
    assert "zstd on planes" in out
    assert ("nvCOMP checked as absent only" in out) == (lib is None), out


@pytest.mark.parametrize("bench", ["bench_hotpath.c", "bench_frag.c", "bench_codec.c"])
def test_benchmark_build_line_works(tmp_path: Path, bench: str) -> None:
    # The command in the benchmark's header is what people copy: it must
    # still name every source the core needs (it missed trace.c once).
    text = (ROOT / "benchmarks" / bench).read_text()
    if "-lzstd" in text:
        import gpupool

        if not gpupool.build_info()["zstd"]:
            pytest.skip("libzstd is not installed (install libzstd-dev)")
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
