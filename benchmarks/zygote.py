"""Start benchmark workers without paying for ``import torch, transformers`` each time.

A worker is a fresh process per run (an allocator is chosen once per process),
and importing torch, transformers and peft takes about 10 s of a 25 s LoRA run
on the benchmark machine. A zygote is a process per allocator mode that
imports them once, with the mode's environment in place before torch is
loaded (PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` then), and forks one worker
per run. No CUDA call happens in the zygote -- the CUDA driver cannot be used
in a child forked after it was initialised -- so each worker creates its own
CUDA context, as a fresh interpreter would; ``PYTORCH_NVML_BASED_CUDA_CHECK``
keeps a library's ``torch.cuda.is_available()`` at import from initialising it.

Protocol on the zygote's stdin/stdout, a JSON object per line: the zygote
says ``{"ready": 1}`` once its imports are done; the harness
sends ``{"argv": [...], "log": path}`` (argv as after ``python``: a script
path or ``-m module``, then its arguments); the zygote answers
``{"pid": n}`` once the worker runs, then ``{"rc": n}`` when it has exited
(negative: killed by that signal).

    python -m benchmarks.zygote torch transformers peft   # modules to preload
"""
from __future__ import annotations

import importlib
import json
import os
import queue
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# The zygote's environment: the mode's, plus this (see the module's doc).
ZYGOTE_ENV: Dict[str, str] = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def _run_worker(argv: List[str], log: str) -> None:
    """In the forked child: run `argv` as ``python argv...`` would, with its
    output in `log`, and exit with its status. Never returns."""
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))  # as `python script.py` does
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: B902 - the worker's failure is reported through its log and status
        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Preload the modules named in `argv` (one that does not import is left to
    the worker that needs it to report), then serve requests until stdin closes."""
    for name in (sys.argv[1:] if argv is None else argv):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the worker that needs it will say so, in its own log

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    answers.write(json.dumps({"ready": 1}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            answers.close()
            _run_worker(list(req["argv"]), str(req["log"]))
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
    return 0


class Zygote:
    """The harness's handle on one zygote process (see the module's doc)."""

    def __init__(self, preload: Sequence[str], env: Dict[str, str], cwd: Path, log: Path) -> None:
        """Start a zygote preloading `preload` in `env` (the mode's environment)."""
        self._log = open(log, "w")
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.zygote", *preload], cwd=cwd,
                                      env={**env, **ZYGOTE_ENV}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, bufsize=1)
        # A thread reads the answers, so that waiting for one can time out.
        self._answers: "queue.Queue[Optional[dict]]" = queue.Queue()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        self.log = log

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._answers.put(json.loads(line))
        self._answers.put(None)  # the zygote is gone

    def _answer(self, key: str, timeout: Optional[float]) -> int:
        a = self._answers.get(timeout=timeout)
        if a is None:
            tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-10:])
            raise RuntimeError(f"the benchmark zygote exited with status {self._proc.wait()}: {tail}")
        return int(a[key])

    def ready(self, timeout: float = 300.0) -> None:
        """Wait until the zygote has imported its modules (raises if it failed)."""
        self._answer("ready", timeout)

    def start(self, argv: Sequence[str], log: Path) -> int:
        """Fork a worker running `argv` (as after ``python``), its output in `log`; its pid."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"argv": list(argv), "log": str(log)}) + "\n")
        self._proc.stdin.flush()
        return self._answer("pid", 120.0)

    def wait(self, pid: int, timeout: float) -> Optional[int]:
        """The worker's exit status, or None if it ran past `timeout` seconds (it is then killed)."""
        try:
            return self._answer("rc", timeout)
        except queue.Empty:
            os.kill(pid, signal.SIGKILL)
            self._answer("rc", None)
            return None

    def close(self) -> None:
        """Stop the zygote (it exits when its stdin closes)."""
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait()
        self._log.close()


if __name__ == "__main__":
    sys.exit(main())
