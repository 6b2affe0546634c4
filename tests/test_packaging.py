"""What a team installs: the shared object's dependencies (the manylinux
policy), the build's header dependencies, and a wheel built from a clean
copy of the tree that installs and works in a fresh venv, from any folder
(the checkout cannot shadow it)."""
from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from typing import Dict, List, Set

import pytest

import gpupool
from conftest import ROOT

# What the manylinux policies allow an extension to need from the system,
# of what a C extension may use (auditwheel's lists hold a few more: libgcc_s,
# libstdc++, X11 and GL); anything else would have to be bundled.
ALLOWED = {"libc.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6",
           "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


def needed(so: Path) -> Set[str]:
    """The DT_NEEDED entries of a shared object (readelf -d)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    out = subprocess.run([readelf, "-d", str(so)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def symbol_versions(so: Path) -> Set[str]:
    """The versions of the undefined symbols it binds to (GLIBC_2.14, ...)."""
    out = subprocess.run([shutil.which("readelf") or "readelf", "-V", "-W", str(so)], capture_output=True,
                         text=True, check=True).stdout
    part = out.split("Version needs section")[-1] if "Version needs section" in out else ""
    return set(re.findall(r"Name: (\S+)\s+Flags", part))


def check_policy(so: Path) -> str:
    """Assert the manylinux rules on `so`; returns the glibc it needs."""
    libs = needed(so)
    assert libs <= ALLOWED, f"{so.name} needs {sorted(libs - ALLOWED)}: outside the manylinux policy"
    versions = symbol_versions(so)
    assert all(v.startswith("GLIBC_") for v in versions), sorted(versions)
    return max(versions, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)), default="GLIBC_2.0")


def test_extension_needs_only_libc() -> None:
    # libzstd and liblz4 were linked when their headers were found, so a
    # wheel built here needed them on every machine it went to.
    so = Path(gpupool._C.__file__)
    check_policy(so)
    assert not any("zstd" in n or "lz4" in n for n in needed(so)), needed(so)


def setup_kwargs() -> Dict[str, object]:
    import setuptools

    captured: Dict[str, object] = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)  # type: ignore[assignment]
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        runpy.run_path(str(ROOT / "setup.py"), run_name="not_main")
    finally:
        setuptools.setup = real  # type: ignore[assignment]
        os.chdir(cwd)
    return captured


def test_editing_a_header_rebuilds_the_extension() -> None:
    # setuptools rebuilds when a source or a `depends` file is newer than
    # the .so; with no depends, `pip install .` after editing a header
    # reused the stale build.
    (ext,) = setup_kwargs()["ext_modules"]  # type: ignore[misc]
    headers = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.h")}
    assert headers and headers <= set(ext.depends), sorted(headers - set(ext.depends))
    assert not any(lib in ("zstd", "lz4") for lib in ext.libraries), ext.libraries


def _clean_copy(dst: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    return dst


def _run(cmd: List[str], **kw: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _index_reachable(tmp: Path) -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp),
                        "setuptools>=61"], capture_output=True, timeout=120)
    return r.returncode == 0


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")
def test_wheel_installs_in_a_fresh_venv_and_cannot_be_shadowed(tmp_path: Path) -> None:
    """The README's wheel path: `pip wheel .` on a clean copy, the wheel
    checked as `auditwheel show` would (its .so needs only libc and glibc's
    symbols), installed with no index into a fresh venv, and imported there
    from the checkout's root and from the folder holding a checkout named
    gpupool, where the source once shadowed the install."""
    if not _index_reachable(tmp_path / "probe"):
        pytest.skip("the package index cannot be reached (the build fetches setuptools)")
    src = _clean_copy(tmp_path / "gpupool")  # a clone named gpupool
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = (tmp_path / "dist").glob("gpupool-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (so_name,) = [n for n in names if n.startswith("gpupool/_C") and n.endswith(".so")]
        z.extract(so_name, tmp_path / "so")
    assert "gpupool/__init__.py" in names and not any(n.startswith(("tests/", "src/", "csrc/")) for n in names)
    assert any(n.endswith("/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names
    glibc = check_policy(tmp_path / "so" / so_name)
    print(f"{wheel.name}: its .so needs libc only, symbols up to {glibc}")
    try:
        import auditwheel  # noqa: F401  (the test extra installs it)
    except ImportError:
        pass
    else:  # the real check: the manylinux tag the wheel could carry
        r = _run([sys.executable, "-m", "auditwheel", "show", str(wheel)])
        text = " ".join(r.stdout.split())
        assert re.search(r'consistent with the following platform tag: "manylinux_2_\d+_', text), text
        assert "system-provided shared libraries: libc.so.6" in text or "libc.so.6" in text, text
        print(text)

    fresh = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(fresh)
    py = str(fresh / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)])
    code = ("import gpupool; p = gpupool.HostPool(1 << 24); p.free(p.alloc(100)); "
            "print(gpupool.__file__); gpupool.enable")
    for cwd in (src, tmp_path):  # the clone's root; the folder that holds it
        r = _run([py, "-c", code], cwd=cwd)
        assert r.stdout.startswith(str(fresh)), (cwd, r.stdout)
    r = _run([py, "-m", "gpupool", "version"], cwd=tmp_path)
    assert r.stdout.startswith("gpupool ") and str(fresh) in r.stdout, r.stdout
