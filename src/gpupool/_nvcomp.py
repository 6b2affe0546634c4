"""Where pip put nvCOMP: the folder of libnvcomp.so.6 in the
nvidia-libnvcomp-cu13 wheel (the nvcomp extra), which the C
loader (csrc/codec_nvcomp.c) searches after GPUPOOL_NVCOMP and before the
system's library.  Found without importing the wheel's package."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

__all__ = ["SONAME", "wheel_dir", "register"]

SONAME = "libnvcomp.so.6"


def wheel_dir() -> Optional[str]:
    """The installed wheel's lib64 folder holding libnvcomp.so.6, or None."""
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = os.path.join(base, "lib64")
        if os.path.isfile(os.path.join(folder, SONAME)):
            return folder
    return None


def register() -> Optional[str]:
    """Tell the C loader about the installed wheel (once is enough; calling
    again is harmless); returns its folder, or None when it is not installed.
    Call before the first offload: nvCOMP is loaded when a codec first
    needs it."""
    folder = wheel_dir()
    if folder is not None:
        from gpupool import _C

        _C.nvcomp_search_dir(folder)
    return folder
