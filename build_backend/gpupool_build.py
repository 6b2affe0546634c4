"""gpupool's build backend: setuptools, plus cuda.h from PyPI when this
machine has none.

The C extension needs cuda.h for types and prototypes only (libcuda is loaded
with dlopen at run time), so a machine without the CUDA toolkit can still
build it: when no cuda.h is found here, the build asks pip for NVIDIA's
runtime wheel, which ships the header (``nvidia/cu13/include/cuda.h``).  A
machine with the toolkit downloads nothing.  ``setup.py`` uses
``find_cuda_include`` from here, so both look in the same places.

Environment (build only; the ``GPUPOOL_*`` names are the allocator's):
``CUDA_HOME`` / ``CUDA_PATH`` are looked in first;
``GP_BUILD_CUDA_SYSTEM=0`` does not consult the system folders
(``/usr/local/cuda``, ``/usr/include``, ``/usr/local/include``), which is how
the tests play a machine without the toolkit.
"""
from __future__ import annotations

import glob
import os
import sys
import sysconfig
from typing import Dict, List, Optional

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools'

# NVIDIA's CUDA runtime wheel for CUDA 13 (the toolkit gpupool is built and
# tested with): nvidia/cu13/include/cuda.h; 2.5 MB, nothing is linked to it.
CUDA_HEADERS_REQUIREMENT = "nvidia-cuda-runtime>=13,<14"

_SYSTEM = ("/usr/local/cuda/include", "/usr/include", "/usr/local/include")


def package_sites() -> List[str]:
    """Folders that may hold pip packages: sys.path (where pip puts the
    build environment it made) and this interpreter's site-packages (a venv
    that has torch's CUDA libraries)."""
    sites = [p for p in sys.path if p and os.path.isdir(p)]
    sites += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(sites))


def cuda_include_candidates() -> List[str]:
    """Where cuda.h is looked for, in order: $CUDA_HOME, $CUDA_PATH, the
    system folders, then the include folders of NVIDIA's pip packages."""
    out = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    if os.environ.get("GP_BUILD_CUDA_SYSTEM", "1") != "0":
        out += _SYSTEM
    for site in package_sites():
        out += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    return out


def find_cuda_include() -> Optional[str]:
    """The first folder of cuda_include_candidates() holding cuda.h, or None."""
    return next((d for d in cuda_include_candidates() if os.path.isfile(os.path.join(d, "cuda.h"))), None)


def _with_headers(requires: List[str]) -> List[str]:
    return requires if find_cuda_include() else requires + [CUDA_HEADERS_REQUIREMENT]


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return _with_headers(_setuptools.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_editable(config_settings: Optional[Dict[str, object]] = None) -> List[str]:
    return _with_headers(_setuptools.get_requires_for_build_editable(config_settings))
