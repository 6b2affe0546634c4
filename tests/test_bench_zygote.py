"""The benchmark harness's zygote (benchmarks/zygote.py) runs workers as
``python ...`` would: their argv, sys.path, output, exit status, and a timeout
that kills the worker, not the zygote."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.zygote import Zygote

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["ZYGOTE_TEST_MARK"] = "from-the-mode"
    return env


def test_zygote_runs_scripts_and_modules_like_python(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 41\n")
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, os, sys, helper_mod\n"
        "print('hello from', os.getpid())\n"
        "json.dump({'argv': sys.argv, 'value': helper_mod.VALUE + 1, 'mark': os.environ['ZYGOTE_TEST_MARK'],\n"
        "           'name': __name__}, open(sys.argv[1], 'w'))\n"
        "sys.exit(int(sys.argv[2]))\n")
    z = Zygote(["json"], _env(), tmp_path, tmp_path / "zygote.log")
    try:
        z.ready()
        out, log = tmp_path / "out.json", tmp_path / "w.log"
        pid = z.start([str(script), str(out), "3"], log)
        assert pid != os.getpid()
        assert z.wait(pid, 60) == 3
        r = json.loads(out.read_text())
        assert r == {"argv": [str(script), str(out), "3"], "value": 42, "mark": "from-the-mode",
                     "name": "__main__"}
        assert f"hello from {pid}" in log.read_text()

        # -m module, and a worker that raises: status 1 and the traceback in its log
        pid = z.start(["-m", "benchmarks.zygote_missing_module"], log)
        assert z.wait(pid, 60) == 1
        assert "No module named" in log.read_text()

        # sys.exit("message"): status 1, the message in the log
        script.write_text("import sys\nsys.exit('error: bad worker argument')\n")
        assert z.wait(z.start([str(script)], log), 60) == 1
        assert "error: bad worker argument" in log.read_text()
    finally:
        z.close()


def test_zygote_timeout_kills_the_worker_and_keeps_serving(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import sys, time\nif sys.argv[1] == 'sleep':\n    time.sleep(60)\n")
    z = Zygote([], _env(), tmp_path, tmp_path / "zygote.log")
    try:
        z.ready()
        t0 = time.monotonic()
        assert z.wait(z.start([str(script), "sleep"], tmp_path / "a.log"), 0.5) is None
        assert time.monotonic() - t0 < 30
        assert z.wait(z.start([str(script), "quick"], tmp_path / "b.log"), 60) == 0
    finally:
        z.close()


def test_zygote_that_dies_is_reported(tmp_path: Path) -> None:
    env = _env()
    env["PYTHONPATH"] = str(tmp_path)  # no benchmarks package: the zygote cannot start
    z = Zygote([], env, tmp_path, tmp_path / "zygote.log")
    try:
        z.ready()
    except RuntimeError as e:
        assert "zygote exited with status 1" in str(e) and "benchmarks" in str(e)
    else:
        raise AssertionError("a zygote that cannot start must raise")
    finally:
        z.close()
