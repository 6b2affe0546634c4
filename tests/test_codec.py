"""The codec layer's Python side (csrc/pycodec.c, gpupool/_nvcomp.py), and its own declarations of nvCOMP 6 (csrc/codec_nvcomp.c, written
from the documentation because nvCOMP's license does not let us copy its
headers) against the headers of the installed nvidia-libnvcomp-cu13 wheel:
the option structs nvCOMP takes by value, the structs it fills and the enum
values must agree to the byte.  Compiled only; skipped without the wheel.
The round trips themselves are tests/c/test_codec.c (host) and
tests/test_offload_codec_gpu.py (GPU)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpupool import _C
from gpupool._nvcomp import register, wheel_dir
from test_c import CC, INCLUDES, ROOT


# (ours, nvCOMP's, [(our field, nvCOMP's field)])
STRUCTS = [
    ("gp_nv_properties", "nvcompProperties_t", [("version", "version"), ("cudart_version", "cudart_version")]),
    ("gp_nv_alignments", "nvcompAlignmentRequirements_t", [("input", "input"), ("output", "output"),
                                                           ("temp", "temp")]),
    ("gp_nv_ans_copts", "nvcompBatchedANSCompressOpts_t",
     [("type", "type"), ("data_type", "data_type"), ("max_sub_chunk_count", "max_sub_chunk_count"),
      ("states_per_lane", "states_per_lane"), ("histogram_reduction_log2", "histogram_reduction_log2"),
      ("reserved", "reserved")]),
    ("gp_nv_ans_dopts", "nvcompBatchedANSDecompressOpts_t",
     [("backend", "backend"), ("data_type", "data_type"), ("max_sub_chunk_count", "max_sub_chunk_count"),
      ("states_per_lane", "states_per_lane"), ("skip_validate", "skip_validate"), ("reserved", "reserved")]),
    ("gp_nv_bitcomp_copts", "nvcompBatchedBitcompCompressOpts_t",
     [("algorithm", "algorithm"), ("data_type", "data_type"), ("delta", "delta"), ("mode", "mode"),
      ("reserved", "reserved")]),
    ("gp_nv_bitcomp_dopts", "nvcompBatchedBitcompDecompressOpts_t", [("backend", "backend"),
                                                                      ("reserved", "reserved")]),
]
SAME_VALUE = [("GP_NV_CHAR", "NVCOMP_TYPE_CHAR"), ("GP_NV_UCHAR", "NVCOMP_TYPE_UCHAR"),
              ("GP_NV_FLOAT16", "NVCOMP_TYPE_FLOAT16"), ("GP_NV_FLOAT32", "NVCOMP_TYPE_FLOAT32"),
              ("GP_NV_FLOAT64", "NVCOMP_TYPE_FLOAT64"), ("0", "nvcompSuccess"), ("0", "nvcomp_rANS"),
              ("0", "BITCOMP_LOSSLESS"), ("0", "NVCOMP_DECOMPRESS_BACKEND_DEFAULT")]
SAME_SIZE = [("gp_nv_status", "nvcompStatus_t"), ("int", "nvcompType_t"), ("int", "nvcompANSType_t"),
             ("int", "bitcompMode_t"), ("int", "nvcompDecompressBackend_t")]


@pytest.mark.skipif(shutil.which(CC) is None, reason=f"no C compiler ({CC})")
def test_nvcomp_declarations_match_headers(tmp_path: Path) -> None:
    lib = wheel_dir()
    include = Path(lib).parent / "include" if lib else None
    if include is None or not (include / "nvcomp.h").is_file():
        pytest.skip("the nvidia-libnvcomp-cu13 wheel (with its headers) is not installed")
    lines = ["#include <stddef.h>", '#include "nvcomp.h"', f'#include "{ROOT / "csrc" / "offload" / "codec" / "codec_nvcomp.c"}"']
    for ours, theirs, fields in STRUCTS:
        lines.append(f"_Static_assert(sizeof({ours}) == sizeof({theirs}) && _Alignof({ours}) == _Alignof({theirs}), "
                     f'"{ours}");')
        for f, g in fields:
            lines.append(f"_Static_assert(offsetof({ours}, {f}) == offsetof({theirs}, {g}) && "
                         f"sizeof((({ours} *)0)->{f}) == sizeof((({theirs} *)0)->{g}), \"{ours}.{f}\");")
    lines += [f'_Static_assert((int)({a}) == (int)({b}), "{b}");' for a, b in SAME_VALUE]
    lines += [f'_Static_assert(sizeof({a}) == sizeof({b}), "{b}");' for a, b in SAME_SIZE]
    src = tmp_path / "abi.c"
    src.write_text("\n".join(lines) + "\n")
    r = subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                        "-Wno-unused-function", "-Wno-missing-field-initializers", *INCLUDES,
                        f"-I{include}", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


pycodec = pytest.mark.skipif(not hasattr(_C, "codec_names"),
                             reason="csrc/module.c does not call gp_pycodec_register (pycodec.c) yet")


@pycodec
def test_codec_names_and_checksum() -> None:
    assert _C.codec_names() == ("raw", "auto", "zstd", "ans", "bitcomp")
    data = bytes(range(256)) * 1000 + b"tail"
    h = _C.checksum(data, 1234)
    assert h == _C.checksum(bytearray(data), 1234) and 0 <= h < 2 ** 64
    assert h != _C.checksum(data, 1235)                     # the seed: a chunk's address
    assert h != _C.checksum(data[:-1] + b"x", 1234)
    assert _C.checksum(memoryview(data)[1:], 1234) == _C.checksum(data[1:], 1234)


@pycodec
def test_nvcomp_load_says_where_it_looked(tmp_path: Path) -> None:
    # A path given (GPUPOOL_NVCOMP) is the only place tried, loaded or not;
    # in a fresh process, since nvCOMP is loaded at most once per process.
    code = f"""
import gpupool._C as C
try:
    C.nvcomp_load({str(tmp_path)!r})
except RuntimeError as e:
    print("ERR", e)
"""
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"ERR nvCOMP 6 could not be loaded (GPUPOOL_NVCOMP set); {tmp_path}: no libnvcomp.so.6" in r.stdout
    assert "pip install nvidia-libnvcomp-cu13" in r.stdout


@pycodec
def test_register_finds_the_wheel() -> None:
    folder = register()
    if folder is None:
        pytest.skip("the nvidia-libnvcomp-cu13 wheel is not installed")
    code = "from gpupool._nvcomp import register; import gpupool._C as C; register(); print(C.nvcomp_load())"
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"('{folder}/libnvcomp.so.6', 6" in r.stdout
