"""Build gpupool._C: every csrc/*.c, linked with nothing but libc, pthread and
libdl, plus libzstd / liblz4 when this machine can build against them.

CUDA is loaded at run time with dlopen; the build needs only cuda.h for types,
looked for in $CUDA_HOME, /usr/local/cuda and the NVIDIA pip packages.
"""
import glob
import os
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def find_cuda_include() -> str:
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    candidates.append("/usr/local/cuda/include")
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    for inc in candidates:
        if os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc
    sys.exit(
        "gpupool: cuda.h not found (looked in $CUDA_HOME/include, /usr/local/cuda/include and "
        "site-packages/nvidia/*/include). Install the CUDA toolkit headers (e.g. the "
        "'cuda-toolkit' or 'nvidia-cuda-runtime' package) or set CUDA_HOME."
    )


def can_link(header: str, lib: str, call: str) -> bool:
    """True when a program using `header` and -l`lib` compiles and links here."""
    cc = os.environ.get("CC", sysconfig.get_config_var("CC") or "cc").split()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "t.c")
        with open(src, "w") as f:
            f.write(f"#include <{header}>\nint main(void) {{ return (int)({call}); }}\n")
        r = subprocess.run(cc + [src, "-o", os.path.join(tmp, "t"), f"-l{lib}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0


macros = []
libraries = ["pthread", "dl"]
if os.environ.get("GP_BUILD_NO_ZSTD") != "1" and can_link("zstd.h", "zstd", "ZSTD_versionNumber()"):
    macros.append(("GP_HAVE_ZSTD", "1"))
    libraries.append("zstd")
if os.environ.get("GP_BUILD_NO_LZ4") != "1" and can_link("lz4.h", "lz4", "LZ4_versionNumber()"):
    macros.append(("GP_HAVE_LZ4", "1"))
    libraries.append("lz4")

ext = Extension(
    "gpupool._C",
    sources=sorted(glob.glob("csrc/*.c")),
    include_dirs=["csrc", find_cuda_include()],
    define_macros=macros + [("_GNU_SOURCE", "1")],
    libraries=libraries,
    extra_compile_args=["-std=c11", "-O2", "-fexceptions", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)

setup(ext_modules=[ext])
