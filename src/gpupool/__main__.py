"""python -m gpupool: run a script on gpupool, or show the configuration.

  python -m gpupool run script.py [args...]   enable gpupool (GPUPOOL_* apply),
                                              run the unmodified script, print
                                              the report at exit
  python -m gpupool report [--group G]        the tenants of gpupool's groups
                            [--device N]      (GPUPOOL_TENANT: priority, held,
                                              offloaded, wanted, waits, reclaims)
                                              and the processes on the GPUs with
                                              their memory (NVML), once
  python -m gpupool top [--interval S]        the same, refreshed every S seconds
  python -m gpupool config [--markdown]       every GPUPOOL_* option: value,
                                              default, accepted values, meaning
  python -m gpupool version                   version and build information
"""
from __future__ import annotations

import argparse
import atexit
import os
import runpy
import sys
import time
from typing import Any, List, Optional, TextIO, Tuple

import gpupool
from gpupool import _arbiter, _C


def options_markdown() -> str:
    """The README's option table, made from the C option table (the README
    is checked against it by the tests, so the two cannot diverge)."""
    rows = ["| Variable | `enable()` keyword | Default | Accepted | Meaning |",
            "|---|---|---|---|---|"]
    for env, key, default, accepted, help_ in gpupool.config_options():
        rows.append(f"| `{env}` | `{key}` | {default} | {accepted} | {help_} |".replace("\n", " "))
    return "\n".join(rows)


def _config(markdown: bool) -> int:
    if markdown:
        print(options_markdown())
        return 0
    try:
        _C.configure(None)  # validates the environment as enable() would
    except ValueError as e:
        print(f"gpupool: {e}", file=sys.stderr)
        return 2
    current = gpupool.config()
    for env, key, default, accepted, help_ in gpupool.config_options():
        set_ = " (set)" if env in os.environ else ""
        print(f"{env}={current.get(key, '')}{set_}\n    default {default}; accepts {accepted}\n    {help_}")
    return 0


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
        return " ".join(w.decode(errors="replace") for w in words if w)[:60] or "?"
    except OSError:
        return "?"


def _gpu_table(nvml: Any, devices: Optional[List[int]]) -> str:
    """One block per GPU: used/total memory, then each process's memory."""
    fb = gpupool.format_bytes
    lines = []
    for i in devices if devices is not None else range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name = nvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        lines.append(f"GPU {i} {name}: {fb(mem.used)} used of {fb(mem.total)} "
                     f"({100 * mem.used / mem.total:.1f}%)")
        procs = sorted(nvml.nvmlDeviceGetComputeRunningProcesses(h),
                       key=lambda p: -(p.usedGpuMemory or 0))
        if not procs:
            lines.append("    no processes")
            continue
        lines.append(f"    {'pid':>8}  {'memory':>12}  command")
        for p in procs:
            used = fb(p.usedGpuMemory) if p.usedGpuMemory is not None else "?"
            lines.append(f"    {p.pid:>8}  {used:>12}  {_process_name(p.pid)}")
    return "\n".join(lines)


def _nvml() -> Tuple[Any, str]:
    """(pynvml initialised, "") or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "the GPUs' processes need NVML: pip install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError: no driver, no GPU
        return None, f"NVML cannot be initialised ({e}): is there an NVIDIA driver and GPU?"
    return pynvml, ""


def _tenant_tables(group: Optional[str]) -> List[str]:
    """A table per tenant registry on this machine (of `group` only, if given)."""
    tables = []
    for g, device in _arbiter.registries():
        if group not in (None, g):
            continue
        try:
            info = _arbiter.tenants(g, device)
        except (RuntimeError, ValueError) as e:  # a registry of another version, a stuck one
            tables.append(f"tenant group '{g}' on {device}: {e}")
            continue
        if info is not None:
            tables.append(_arbiter.format_tenants(info, gpupool.format_bytes))
    return tables


def _watch(devices: Optional[List[int]], group: Optional[str], interval: Optional[float],
           count: Optional[int], out: TextIO) -> int:
    nvml, why = _nvml()
    try:
        n = 0
        while True:
            parts = []
            if nvml is not None:
                try:
                    parts.append(_gpu_table(nvml, devices))
                except Exception as e:  # pynvml.NVMLError: a bad device index, a lost GPU
                    print(f"gpupool: NVML failed: {e}", file=sys.stderr)
                    return 2
            tenants = _tenant_tables(group)
            if nvml is None and n == 0:
                print(f"gpupool: {why}", file=sys.stderr)
                if not tenants:
                    return 2  # nothing at all to show
            parts += tenants or [f"no gpupool tenant group{f' {group!r}' if group else ''} on this "
                                 f"machine (processes join one with GPUPOOL_TENANT=<group>)"]
            table = "\n".join(parts)
            if interval is not None and out.isatty():
                out.write("\x1b[H\x1b[2J")  # home, clear: a live view
            print(time.strftime("%H:%M:%S ") + table if interval is not None else table, file=out)
            out.flush()
            n += 1
            if interval is None or (count is not None and n >= count):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()


def _driver() -> str:
    """The NVIDIA driver as this process would load it (libcuda.so.1, as
    gpupool does), without creating a context: 'none (why)' when absent."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "none (libcuda.so.1 not found: no NVIDIA driver here)"
    v = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return "libcuda.so.1 found, but cuDriverGetVersion failed"
    text = f"supports CUDA {v.value // 1000}.{v.value % 1000 // 10}"
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
        release = next(w for w in words if w[:1].isdigit() and "." in w)
        text = f"{release}, {text}"
    except (OSError, StopIteration):
        pass
    return text


def _torch() -> str:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "not installed (pip install torch)"
    try:
        import torch
    except Exception as e:  # a broken install: say so, the report goes on
        return f"installed, but import failed: {e}"
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
    return f"{torch.__version__} ({cuda})"


def _nvcomp() -> str:
    from gpupool._nvcomp import register

    register()
    try:
        path, version = _C.nvcomp_load()[:2]
    except (RuntimeError, AttributeError) as e:
        return f"not loaded: {str(e).splitlines()[0]}"
    return f"version code {version}, {path}"


def version_report() -> str:
    """`python -m gpupool version`: the package, the build and what it
    finds here (torch, the NVIDIA driver, nvCOMP), one per line."""
    import platform

    info = gpupool.build_info()
    zstd = "yes (libzstd.so.1, loaded at run time)" if info["zstd"] else "no (libzstd.so.1 not found)"
    rows = [
        ("gpupool", f"{gpupool.__version__} ({os.path.dirname(gpupool.__file__)})"),
        ("built with", f"gcc {info['compiler']}" if info["compiler"][:1].isdigit() else info["compiler"]),
        ("host codec zstd", zstd),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()}, {platform.system()} "
                   f"{platform.machine()})"),
        ("torch", _torch()),
        ("NVIDIA driver", _driver()),
        ("nvCOMP", _nvcomp()),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _run(script: str, args: List[str]) -> int:
    try:
        gpupool.enable()
    except (RuntimeError, ValueError) as e:
        print(f"gpupool: {e}", file=sys.stderr)
        return 2

    def _report() -> None:
        try:
            for d in _C.devices():
                print(gpupool.report(d), file=sys.stderr)
        except Exception as e:  # the script's own exit status matters more
            print(f"gpupool: no report: {e}", file=sys.stderr)

    atexit.register(_report)
    sys.argv = [script] + args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpupool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a Python script with gpupool enabled")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    for cmd, what in (("report", "the tenants of gpupool's groups and the GPUs' processes, once"),
                      ("top", "the tenants of gpupool's groups and the GPUs' processes, refreshed")):
        q = sub.add_parser(cmd, help=what)
        q.add_argument("--device", type=int, action="append",
                       help="a GPU index for the process list (repeat for several; default: all)")
        q.add_argument("--group", help="only this tenant group (GPUPOOL_TENANT)")
        if cmd == "top":
            q.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
            q.add_argument("--count", type=int, default=None, help="stop after this many refreshes")
    c = sub.add_parser("config", help="show every GPUPOOL_* option")
    c.add_argument("--markdown", action="store_true", help="the option table of the README")
    sub.add_parser("version", help="version and build information")
    a = p.parse_args(argv)
    if a.cmd == "run":
        if not os.path.isfile(a.script):
            print(f"gpupool: no such script: {a.script}", file=sys.stderr)
            return 2
        return _run(a.script, a.args)
    if a.cmd == "report":
        return _watch(a.device, a.group, None, None, sys.stdout)
    if a.cmd == "top":
        if a.interval <= 0 or (a.count is not None and a.count < 1):
            p.error("top: --interval must be > 0 seconds and --count >= 1")
        return _watch(a.device, a.group, a.interval, a.count, sys.stdout)
    if a.cmd == "config":
        return _config(a.markdown)
    print(version_report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
