"""Build the libFuzzer targets of tests/fuzz with clang (ASan + UBSan), replay
each one's seed corpus and every past finding (tests/fuzz/regress), then fuzz
each for a bounded time (GP_FUZZ_SECONDS, 60 by default).  Skips, saying what
to install, where clang cannot link -fsanitize=fuzzer."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from test_c import CORE, CSRC, INCLUDES, ROOT

FUZZ = ROOT / "tests" / "fuzz"
CLANG = os.environ.get("GP_FUZZ_CC", "clang")
SECONDS = int(os.environ.get("GP_FUZZ_SECONDS", "60"))
TARGETS = sorted(p.stem for p in FUZZ.glob("fuzz_*.c"))
FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
         "-Wno-missing-field-initializers", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
         *INCLUDES]
# The integrity checker runs after nearly every operation; its loops would
# dominate the coverage feedback and the time, and say nothing about which
# inputs reach new states of the pool: it is built without coverage.
UNGUIDED = [str(CSRC / "pool" / "check.c")]
# Targets whose codecs compress (zstd on the host backend) when the
# extension was built with libzstd, as tests/test_c.py builds its offload
# tests: the compressed paths are fuzzed too.
COMPRESSING = {"fuzz_offload"}


def zstd_flags(target: str) -> List[str]:
    import gpupool

    return ["-DGP_HAVE_ZSTD"] if target in COMPRESSING and gpupool.build_info()["zstd"] else []


def corpus(target: str) -> Path:
    return FUZZ / "corpus" / target.removeprefix("fuzz_")


def findings(target: str) -> Path:
    return FUZZ / "regress" / target.removeprefix("fuzz_")


@pytest.fixture(scope="module")
def clang_fuzzer(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which(CLANG) is None:
        pytest.skip(f"no {CLANG}: install clang and libFuzzer's runtime (Debian: clang libclang-rt-dev) "
                    "to run the fuzzers")
    tmp = tmp_path_factory.mktemp("probe")
    src = tmp / "probe.c"
    src.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                   "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
    r = subprocess.run([CLANG, "-fsanitize=fuzzer,address,undefined", str(src), "-o", str(tmp / "probe")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{CLANG} cannot link -fsanitize=fuzzer (Debian: apt-get install libclang-rt-dev): "
                    f"{r.stderr.strip()[-300:]}")
    return CLANG


def build(tmp: Path, target: str) -> Path:
    exe = tmp / target
    zstd = zstd_flags(target)
    objs: List[str] = []
    for c in UNGUIDED:
        obj = tmp / (Path(c).stem + ".o")
        cmd = [CLANG, *FLAGS, "-fsanitize=address,undefined", "-c", c, "-o", str(obj)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
        objs.append(str(obj))
    guided = [c for c in CORE if c not in UNGUIDED]
    cmd = [CLANG, *FLAGS, *zstd, "-fsanitize=fuzzer,address,undefined", str(FUZZ / f"{target}.c"), *guided, *objs,
           *(["-lzstd"] if zstd else []), "-lpthread", "-ldl", "-lm", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"build of {target} failed:\n{' '.join(cmd)}\n{r.stderr}"
    return exe


def fuzz(exe: Path, args: List[str], timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def built(clang_fuzzer: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("fuzz")
    return {t: build(tmp, t) for t in TARGETS}


def test_every_fuzzer_has_a_seed_corpus() -> None:
    assert TARGETS
    for t in TARGETS:
        assert len(list(corpus(t).iterdir())) >= 5, f"{corpus(t)}: too few seeds"
        assert all(p.stat().st_size <= 4096 for p in corpus(t).iterdir()), "seeds are small files"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzer_replays_its_corpus_and_findings(built: dict, target: str, tmp_path: Path) -> None:
    dirs = [str(d) for d in (corpus(target), findings(target)) if d.is_dir()]
    r = fuzz(built[target], ["-runs=0", f"-artifact_prefix={tmp_path}/", *dirs], timeout=600)
    assert r.returncode == 0, r.stderr[-6000:]
    n = sum(len(list(Path(d).iterdir())) for d in dirs)
    assert "corp: " in r.stderr and n > 0


@pytest.mark.parametrize("target", TARGETS)
def test_fuzzer_finds_nothing(built: dict, target: str, tmp_path: Path) -> None:
    work = tmp_path / "corpus"
    shutil.copytree(corpus(target), work)
    r = fuzz(built[target], [f"-max_total_time={SECONDS}", "-max_len=2048", "-timeout=30",
                             f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", str(work)],
             timeout=SECONDS + 300)
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert r.returncode == 0 and not found, (
        f"{target} found {found} (in {tmp_path}); keep it as a regression: copy it to "
        f"{findings(target).relative_to(ROOT)}/ and fix the cause\n" + r.stderr[-6000:])
    stats = [line for line in r.stderr.splitlines() if line.startswith("stat::") or
             (line.startswith("#") and "DONE" in line)]
    print(f"{target}: " + " | ".join(stats[-8:]))
