"""Build gpupool._C: every C file under csrc/, linked with nothing but libc, pthread,
libdl and librt; libzstd (optional) is loaded at run time with dlopen.

CUDA is loaded at run time with dlopen; the build needs only cuda.h for types,
found by build_backend/gpupool_build.py (the PEP 517 backend, which gets it
from PyPI when this machine has none).
"""
import glob
import os
import re
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "build_backend"))
from gpupool_build import CUDA_HEADERS_REQUIREMENT, cuda_include_candidates, find_cuda_include  # noqa: E402


def cuda_include() -> str:
    inc = find_cuda_include()
    if inc is None:
        sys.exit(
            "gpupool: cuda.h not found; looked in:\n  " + "\n  ".join(cuda_include_candidates()) +
            "\nThe build needs the header only (nothing is linked to CUDA). Build with pip's build "
            "isolation (the default), which fetches it, or install it into this environment: "
            f"pip install '{CUDA_HEADERS_REQUIREMENT}' (or the CUDA toolkit, with CUDA_HOME set)."
        )
    return inc


# libzstd is loaded with dlopen at run time (csrc/codec_zstd.c declares the
# part of its API it uses), never linked: the extension needs nothing beyond
# libc, libpthread, libdl and librt, as the manylinux policy asks, and builds
# without zstd's headers.  GP_BUILD_NO_ZSTD=1 leaves zstd support out.
macros = [] if os.environ.get("GP_BUILD_NO_ZSTD") == "1" else [("GP_HAVE_ZSTD", "1")]


def project_version() -> str:
    """pyproject.toml's version: the one number of the package, which the
    extension reports (GP_VERSION, build_info()) and gpupool.__version__
    reads back from it."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    project = text[text.index("\n[project]\n"):]
    m = re.search(r'^version\s*=\s*"([^"]+)"\s*$', project, re.MULTILINE)
    if not m:
        sys.exit("gpupool: no version in the [project] table of pyproject.toml")
    return m.group(1)


macros.append(("GP_VERSION", '"%s"' % project_version()))
libraries = ["pthread", "dl", "rt"]  # rt: shm_open (in libc itself from glibc 2.34)

class BuildExt(build_ext):
    """cuda.h is looked for when the extension is built, not when setup.py
    is read: pip first asks the backend what the build needs (setup.py runs
    then too), and on a machine without the header that answer is what
    brings it."""

    def build_extensions(self) -> None:
        for e in self.extensions:
            e.include_dirs.append(cuda_include())
        super().build_extensions()


# csrc/ in folders by layer (pool, backend, offload, tenant, python); headers
# are included by name, so every folder that holds one is on the path.
HEADERS = sorted(glob.glob("csrc/**/*.h", recursive=True))
ext = Extension(
    "gpupool._C",
    sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
    # Every header, so that editing one rebuilds the extension (setuptools
    # otherwise compares the .c files alone with a built .so and keeps it).
    depends=HEADERS,
    include_dirs=sorted({os.path.dirname(h) for h in HEADERS}),
    define_macros=macros + [("_GNU_SOURCE", "1")],
    libraries=libraries,
    extra_compile_args=["-std=c11", "-O2", "-fexceptions", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
