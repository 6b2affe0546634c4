"""python -m gpupool: run a script on gpupool, or show the configuration.

  python -m gpupool run script.py [args...]   enable gpupool (GPUPOOL_* apply),
                                              run the unmodified script, print
                                              the report at exit
  python -m gpupool config                    every GPUPOOL_* option: value,
                                              default, accepted values, meaning
  python -m gpupool version                   version and build information
"""
from __future__ import annotations

import argparse
import atexit
import os
import runpy
import sys
from typing import List, Optional

import gpupool
from gpupool import _C


def _config() -> int:
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
    sub.add_parser("config", help="show every GPUPOOL_* option")
    sub.add_parser("version", help="version and build information")
    a = p.parse_args(argv)
    if a.cmd == "run":
        if not os.path.isfile(a.script):
            print(f"gpupool: no such script: {a.script}", file=sys.stderr)
            return 2
        return _run(a.script, a.args)
    if a.cmd == "config":
        return _config()
    print(f"gpupool {gpupool.__version__} {gpupool.build_info()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
