"""Building and first use on a machine as a new user has it: no CUDA toolkit
(the build backend gets cuda.h from PyPI), no GPU (the main job says what to
do)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, child_env

# Plays a machine without the toolkit: CUDA_HOME names nothing, the system
# folders are not consulted, and (in the children below) neither are this
# venv's packages, which may hold torch's nvidia/cu13/include.
NO_TOOLKIT = {"CUDA_HOME": "/nonexistent-cuda", "GP_BUILD_CUDA_SYSTEM": "0"}

REQUIRES = """
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "build_backend"))
import gpupool_build as b
root, sites = sys.argv[1], sys.argv[2:]
b.package_sites = lambda: sites  # not this venv's: it may hold torch's nvidia packages
os.chdir(root)
print(json.dumps({"include": b.find_cuda_include(), "wheel": b.get_requires_for_build_wheel(),
                  "editable": b.get_requires_for_build_editable()}))
"""


def requires(env: dict, *site: str) -> dict:
    import json
    r = subprocess.run([sys.executable, "-c", REQUIRES, str(ROOT), *site], capture_output=True, text=True,
                       env=child_env(env), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_backend_asks_for_the_cuda_headers_only_without_them(tmp_path: Path) -> None:
    req = "nvidia-cuda-runtime>=13,<14"
    got = requires(NO_TOOLKIT)
    assert got["include"] is None and req in got["wheel"] and req in got["editable"], got
    # A toolkit (CUDA_HOME): nothing more to download.
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    (tmp_path / "cuda" / "include" / "cuda.h").write_text("/* a toolkit */\n")
    got = requires({**NO_TOOLKIT, "CUDA_HOME": str(tmp_path / "cuda")})
    assert got["include"] == str(tmp_path / "cuda" / "include") and req not in got["wheel"], got
    # The wheel pip installs into the isolated build environment, on sys.path.
    inc = tmp_path / "env" / "nvidia" / "cu13" / "include"
    inc.mkdir(parents=True)
    (inc / "cuda.h").write_text("/* nvidia-cuda-runtime */\n")
    got = requires(NO_TOOLKIT, str(tmp_path / "env"))
    assert got["include"] == str(inc) and req not in got["editable"], got


SETUP_MESSAGE = """
import os, sys
root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "build_backend"))
import gpupool_build  # setup.py finds this one in sys.modules
gpupool_build.package_sites = lambda: []
os.chdir(root)
sys.argv = ["setup.py", "build_ext", "--build-temp", out, "--build-lib", out]
import runpy
runpy.run_path("setup.py", run_name="__main__")
"""


def test_without_headers_nor_isolation_the_error_says_what_to_install(tmp_path: Path) -> None:
    # pip install --no-build-isolation fetches nothing: setup.py's message.
    r = subprocess.run([sys.executable, "-c", SETUP_MESSAGE, str(ROOT), str(tmp_path)], capture_output=True,
                       text=True, env=child_env(NO_TOOLKIT), timeout=300)
    assert r.returncode != 0
    assert "cuda.h not found; looked in:" in r.stderr and "/nonexistent-cuda/include" in r.stderr, r.stderr
    assert "pip install 'nvidia-cuda-runtime>=13,<14'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def _index_reachable(tmp: Path) -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp),
                        "nvidia-cuda-runtime>=13,<14"], capture_output=True, timeout=120)
    return r.returncode == 0


def test_isolated_build_without_the_toolkit(tmp_path: Path) -> None:
    """What `pip install -e .` / `.ci/run` does on a fresh machine: a wheel is
    built from a clean copy of the tree, with cuda.h from NVIDIA's runtime
    wheel, and it works.  Needs the package index (skipped when it cannot
    be reached)."""
    if not _index_reachable(tmp_path / "probe"):
        pytest.skip("the package index cannot be reached")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir", "-w",
                        str(tmp_path / "wheel"), str(src)], capture_output=True, text=True,
                       env={k: v for k, v in dict(os.environ, **NO_TOOLKIT).items() if k != "PYTHONPATH"},
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    compiles = [ln for ln in (r.stdout + r.stderr).splitlines() if "backend_cuda.c" in ln and " -c " in ln]
    assert compiles and "/nvidia/cu13/include" in compiles[0], compiles[:1]
    wheel = next((tmp_path / "wheel").glob("gpupool-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    code = "import gpupool; p = gpupool.HostPool(1 << 24); p.free(p.alloc(100)); print(gpupool.__file__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")), timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(str(tmp_path / "site")), r.stderr


def test_main_job_without_a_gpu_says_what_to_do() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is here")
    except ImportError:
        pass  # enable() then says it needs PyTorch: the same one-line error
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "qwen_lora_finetune.py"), "--allocator",
                        "gpupool", "--steps", "1"], capture_output=True, text=True, env=child_env(),
                       timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: gpupool.enable()") and "run with --device cpu" in r.stderr, r.stderr
