"""The codec layer's own declarations of nvCOMP 6 (csrc/codec_nvcomp.c, written
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

from gpupool._nvcomp import wheel_dir

ROOT = Path(__file__).resolve().parent.parent
CC = os.environ.get("CC", "cc")

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
    lines = ["#include <stddef.h>", '#include "nvcomp.h"', f'#include "{ROOT / "csrc" / "codec_nvcomp.c"}"']
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
                        "-Wno-unused-function", "-Wno-missing-field-initializers", f"-I{ROOT / 'csrc'}",
                        f"-I{include}", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
