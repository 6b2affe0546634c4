"""The Python API over the host backend: pools, statistics, reports, tags and
priorities, configuration errors.  Needs neither torch nor a GPU."""
from __future__ import annotations

import subprocess
import sys
import threading
from typing import Dict, List, Set

import pytest

import gpupool
from conftest import child_env
from gpupool import HostPool, _C

MiB = 1 << 20


def test_import_needs_no_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; import gpupool; "
            "p = gpupool.HostPool(1 << 24); a = p.alloc(100); p.free(a); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_build_info() -> None:
    info = gpupool.build_info()
    assert info["version"] == gpupool.__version__
    assert isinstance(info["zstd"], bool) and "lz4" not in info  # lz4 was linked, and used by nothing


def test_version_is_pyproject_s() -> None:
    # One number: pyproject.toml's, built into the extension (setup.py) and
    # read back by the package; the installed metadata says the same.
    import importlib.metadata
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text[text.index("\n[project]\n"):], re.MULTILINE)
    assert m and gpupool.__version__ == m.group(1)
    assert importlib.metadata.version("gpupool") == gpupool.__version__


def test_priority_names_are_the_c_list() -> None:
    from gpupool._context import PRIORITY_NAMES, priority_name

    assert PRIORITY_NAMES == ("low", "normal", "high", "critical")
    assert [gpupool.priority_value(n) for n in PRIORITY_NAMES] == list(range(len(PRIORITY_NAMES)))
    assert priority_name(2) == "high" and priority_name(7) == "7"


def test_public_names_are_all_and_only_all() -> None:
    # `Any`, `Dict`, `Optional` and `annotations` were exported by accident.
    public = {n for n in dir(gpupool) if not n.startswith("_")}
    assert public == set(gpupool.__all__) - {"__version__"}, sorted(public ^ set(gpupool.__all__))


@pytest.mark.parametrize("capacity", [1.5, 64.0 * MiB, "64MiB", True, None])
def test_host_pool_capacity_must_be_an_integer(capacity: object) -> None:
    # HostPool(1.5) once made a 1-byte pool (int() cut it).
    with pytest.raises(TypeError, match=r"HostPool capacity must be an integer number of bytes.*got " +
                       repr(capacity).replace(".", r"\.").replace("(", r"\(")):
        HostPool(capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("capacity", [2**63 + 5, 2**64 - 1, 2**50 + 1])
def test_host_pool_beyond_what_the_bins_hold_is_refused(capacity: int) -> None:
    # 2^63 < c < 2^64 once overflowed the arenas' size and wrote past the
    # bins (an abort, from Python too).
    with pytest.raises(ValueError, match=f"a device of {capacity} bytes.*1 PiB"):
        HostPool(capacity)


def test_host_pool_capacity_takes_integer_types() -> None:
    class Bytes:
        def __index__(self) -> int:
            return 16 * MiB

    assert HostPool(Bytes()).stats()["reserved"] == 0
    with pytest.raises(ValueError, match="must be > 0 bytes, got 0"):
        HostPool(0)


@pytest.mark.parametrize("env,words", [
    ({"GPUPOOL_CHUNK": "4MiB", "GPUPOOL_LARGE_CHUNK": "2MiB"},
     ["GPUPOOL_LARGE_CHUNK=2MiB is less than GPUPOOL_CHUNK=4MiB", "at least 4MiB"]),
    ({"GPUPOOL_DEVICE_LIMIT": "24GiB"}, ["GPUPOOL_DEVICE_LIMIT=24GiB is set without GPUPOOL_TENANT"]),
    ({"GPUPOOL_TENANT": "lab", "GPUPOOL_DEVICE_LIMIT": "2"}, ["GPUPOOL_DEVICE_LIMIT=2 is 2 bytes", "at least 2MiB"]),
    ({"GPUPOOL_HOST_LIMIT": "2"}, ["GPUPOOL_HOST_LIMIT='2' is not valid", "at least 32MiB"]),
    ({"GPUPOOL_RECLAIM_TIMEOUT": "1.5ms"}, ["GPUPOOL_RECLAIM_TIMEOUT='1.5ms'", "whole number of milliseconds"]),
    ({"GPUPOOL_RECLAIM_TIMEOUT": "0.000000001"}, ["whole number of milliseconds"]),
    ({"GPUPOOL_TENANT_TURN": "0.0001s"}, ["GPUPOOL_TENANT_TURN='0.0001s'", "whole number of milliseconds"]),
    ({"GPUPOOL_NVCOMP": "/etc/passwd"}, ["GPUPOOL_NVCOMP='/etc/passwd'", "not a shared library"]),
    ({"GPUPOOL_NVCOMP": "."}, ["GPUPOOL_NVCOMP='.'", "holds no libnvcomp.so.6"]),
])
def test_options_that_were_accepted_silently_are_refused(env: Dict[str, str], words: List[str]) -> None:
    # As variables (what `python -m gpupool config` and enable() read) ...
    r = subprocess.run([sys.executable, "-m", "gpupool", "config"], capture_output=True, text=True,
                       env=child_env(env))
    assert r.returncode == 2 and all(w in r.stderr for w in words), r.stderr
    assert "Traceback" not in r.stderr
    # ... and as keywords.
    opts = {k[len("GPUPOOL_"):].lower(): v for k, v in env.items()}
    with pytest.raises(ValueError) as e:
        _C.configure(opts)
    _C.configure(None)
    assert all(w in str(e.value) for w in words[1:]), str(e.value)


def test_cli_version_is_a_readable_report() -> None:
    r = subprocess.run([sys.executable, "-m", "gpupool", "version"], capture_output=True, text=True,
                       env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) if not line.startswith(("built with", "host codec", "NVIDIA driver"))
                 else (line[:15].strip(), line[15:].strip()) for line in r.stdout.splitlines())
    assert "{" not in r.stdout, r.stdout  # it printed a raw dict
    assert lines["gpupool"].startswith(gpupool.__version__), r.stdout
    for label in ("torch", "NVIDIA driver", "nvCOMP", "Python"):
        assert any(line.startswith(label) for line in r.stdout.splitlines()), (label, r.stdout)


def test_alloc_free_stats() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    a = p.alloc(1000)
    b = p.alloc(3 * MiB)
    assert a % 512 == 0 and b % 512 == 0
    s = p.stats()
    assert s["active_blocks"] == 2 and s["requested"] == 1000 + 3 * MiB
    assert s["allocated"] >= s["requested"] and s["reserved"] >= s["allocated"]
    assert s["tags"]["untagged"]["active_blocks"] == 2
    p.free(a)
    p.free(b)
    s = p.stats()
    assert s["allocated"] == 0 and s["n_free"] == 2 and s["allocated_peak"] >= 3 * MiB
    assert p.empty_cache() == s["reserved"]
    assert p.stats()["reserved"] == 0


def test_reuse_is_a_cache_hit() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    a = p.alloc(5000)
    p.free(a)
    maps = p.stats()["n_map"]
    assert p.alloc(5000) == a
    s = p.stats()
    assert s["n_map"] == maps and s["cache_hits"] >= 1


def test_errors_are_exceptions_with_reasons() -> None:
    p = HostPool(8 * MiB, chunk="256KiB")
    a = p.alloc(4096)
    p.free(a)
    with pytest.raises(ValueError, match="freed twice"):
        p.free(a)
    with pytest.raises(ValueError, match="did not allocate"):
        p.free(12345 * 4096)
    with pytest.raises(ValueError, match="> 0"):
        p.alloc(0)
    with pytest.raises(MemoryError, match="out of memory"):
        p.alloc(64 * MiB)
    assert "largest free block" in p.last_oom_report()
    with pytest.raises(ValueError, match="capacity"):
        HostPool(0)


def test_limits() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    p.set_limit(2 * MiB)
    with pytest.raises(MemoryError, match="limit"):
        p.alloc(3 * MiB)
    p.set_limit(None)
    p.set_limit(MiB, tag="kv")
    a = p.alloc(700 * 1024, tag="kv")
    with pytest.raises(MemoryError, match="kv"):
        p.alloc(700 * 1024, tag="kv")
    p.free(a)
    with pytest.raises(ValueError):
        p.set_limit(-1)


def test_report_names_tags() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    w = p.alloc(4 * MiB, tag="weights")
    x = p.alloc(MiB, tag="activations")
    text = p.report()
    assert "allocated" in text and "reserved" in text
    assert text.index("weights") < text.index("activations")  # biggest first
    assert "4.00 MiB" in text
    p.free(w)
    p.free(x)


def test_blocks_and_lookup() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    a = p.alloc(10000, tag="t1", priority="high")
    blk = p.lookup(a + 100)
    assert blk.addr == a and blk.requested == 10000 and blk.tag == "t1" and blk.priority == 2
    assert blk.state == "used" and blk.arena == "small"
    blocks = p.blocks()
    assert any(b.addr == a for b in blocks)
    assert sum(b.size for b in blocks if b.state != "unmapped") == p.stats()["reserved"]
    p.free(a)


def test_tag_context_nests_and_restores() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    assert gpupool.current_tag() == "untagged"
    with gpupool.tag("outer", priority="low"):
        a = p.alloc(1000)
        with gpupool.tag("inner"):
            b = p.alloc(1000)
        c = p.alloc(1000)
    assert gpupool.current_tag() == "untagged"
    assert [p.lookup(x).tag for x in (a, b, c)] == ["outer", "inner", "outer"]
    assert p.lookup(b).priority == 0  # inherits the enclosing priority
    with pytest.raises(KeyError):
        with gpupool.tag("boom"):
            raise KeyError("x")
    assert gpupool.current_tag() == "untagged"
    for x in (a, b, c):
        p.free(x)


def test_tag_is_per_thread_and_a_decorator() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    seen = {}

    @gpupool.tag("worker")
    def work() -> None:
        seen["thread"] = p.lookup(p.alloc(512)).tag

    with gpupool.tag("main"):
        t = threading.Thread(target=work)
        t.start()
        t.join()
        seen["main"] = p.lookup(p.alloc(512)).tag
    assert seen == {"thread": "worker", "main": "main"}


def test_bad_tags_and_priorities() -> None:
    with pytest.raises(ValueError, match="printable"):
        gpupool.tag("has space")
    with pytest.raises(ValueError):
        gpupool.tag("x", priority="urgent")
    with pytest.raises(TypeError):
        gpupool.tag("x", priority=1.5)
    assert gpupool.priority_value("critical") == 3 and gpupool.priority_value(200) == 200


def test_streams_wait_before_reuse() -> None:
    p = HostPool(64 * MiB, chunk="256KiB")
    a = p.alloc(MiB, stream=1)
    p.free(a)
    b = p.alloc(MiB, stream=2)
    assert b == a and p.lookup(b).stream == 2
    assert p.stats()["n_stream_waits"] == 1


def test_reserve_mode() -> None:
    p = HostPool(64 * MiB, mode="reserve", reserve="50%")
    s = p.stats()
    assert s["reserved"] == 32 * MiB
    addrs = [p.alloc(MiB) for _ in range(20)]
    for a in addrs:
        p.free(a)
    assert p.stats()["n_map"] == s["n_map"]
    assert p.empty_cache() == 0


@pytest.mark.parametrize("key,value", [
    ("limit", "12XB"), ("mode", "fast"), ("chunk", "3MiB"), ("priority", "urgent"),
    ("log", "verbose"), ("nonsense", "1"),
])
def test_bad_options_name_the_option(key: str, value: str) -> None:
    with pytest.raises(ValueError) as e:
        HostPool(MiB, **{key: value})
    assert value in str(e.value) or key in str(e.value).lower()


def test_bad_environment_is_an_error() -> None:
    code = "import gpupool._C as c; c.configure(None)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env({"GPUPOOL_LIMT": "1GiB"}))
    assert r.returncode != 0 and "GPUPOOL_LIMT" in r.stderr


def test_parse_size() -> None:
    assert _C.parse_size("512MiB") == (512 * MiB, 0.0)
    assert _C.parse_size("80%") == (0, pytest.approx(0.8))
    with pytest.raises(ValueError):
        _C.parse_size("0.8", False)


def test_cli_config_lists_every_option() -> None:
    r = subprocess.run([sys.executable, "-m", "gpupool", "config"], capture_output=True, text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    for env, *_ in gpupool.config_options():
        assert env in r.stdout


def test_enable_without_torch_is_a_clear_error() -> None:
    code = "import sys; sys.modules['torch'] = None; import gpupool; gpupool.enable()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert r.returncode != 0 and "needs PyTorch" in r.stderr


def test_blocks_survive_a_collector_that_frees_pool_memory() -> None:
    # blocks() builds a tuple per block; on CPython <= 3.11 the cyclic
    # collector may run inside any of those allocations.  A finalizer that
    # frees pool memory then calls gp_free: if blocks() still held the
    # pool's lock, the process froze there.
    code = """
import gc, gpupool
p = gpupool.HostPool(64 << 20, chunk="256KiB")
live = [p.alloc(4096) for _ in range(200)]
freed = []
class Holder:
    def __init__(self, addr):
        self.addr, self.me = addr, self   # a reference cycle: only the collector frees it
    def __del__(self):
        p.free(self.addr)
        freed.append(self.addr)
gc.set_threshold(50)
for _ in range(5):
    gc.collect()              # counts at 0: the next collection comes ~50 tuples into blocks()
    Holder(live.pop())
    p._pool.blocks()
assert len(freed) == 5, freed
used = {b.addr for b in p.blocks() if b.state == "used"}
assert used == set(live), (len(used), len(live))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                       timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_reserve_implies_reserve_mode() -> None:
    p = HostPool(64 * MiB, reserve="50%")  # no mode given
    assert p.stats()["reserved"] == 32 * MiB
    code = ("import gpupool._C as c; c.configure(None); cfg = c.config(); "
            "print(cfg['mode'], cfg['reserve'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env({"GPUPOOL_RESERVE": "85%"}))
    assert r.returncode == 0 and r.stdout.split() == ["reserve", "85%"], r.stderr
    # A reserve with an explicit expandable mode contradicts it: refused,
    # in either order, naming both.
    for opts in ({"mode": "expandable", "reserve": "50%"}, {"reserve": "50%", "mode": "expandable"}):
        with pytest.raises(ValueError, match="GPUPOOL_RESERVE.*GPUPOOL_MODE=expandable"):
            HostPool(64 * MiB, **opts)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env({"GPUPOOL_RESERVE": "85%", "GPUPOOL_MODE": "expandable"}))
    assert r.returncode != 0 and "GPUPOOL_MODE=expandable" in r.stderr, r.stderr
    # An explicit reserve mode and an explicit "none" reserve stay as given.
    assert HostPool(64 * MiB, mode="reserve", reserve="none").stats()["reserved"] >= 48 * MiB  # 80%
    assert HostPool(64 * MiB, mode="expandable", reserve="none").stats()["reserved"] == 0


LOG_RUN = """
import ctypes, sys
sys.modules["torch"] = None          # gpupool_malloc then returns NULL instead of throwing
from gpupool import _C
_C.use_host_backend(64 << 20)        # device pools over host memory: no GPU needed
_C.configure({"chunk": "2MiB", "large_chunk": "2MiB"})
malloc = ctypes.CDLL(_C.__file__).gpupool_malloc
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free = ctypes.CDLL(_C.__file__).gpupool_free
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
a = malloc(5 << 20, 0, None)
free(a, 5 << 20, 0, None)
print("HOT", file=sys.stderr)
for _ in range(100):                 # cache hits: the hot path prints nothing
    free(malloc(5 << 20, 0, None), 5 << 20, 0, None)
print("TRIM", file=sys.stderr)
_C.device_pool(0).trim()
assert malloc(1 << 30, 0, None) is None
"""


@pytest.mark.parametrize("level", ["off", "oom", "all"])
def test_log_levels(level: str) -> None:
    r = subprocess.run([sys.executable, "-c", LOG_RUN], capture_output=True, text=True,
                       env=child_env({"GPUPOOL_LOG": level}), timeout=60)
    assert r.returncode == 0, r.stderr
    err = r.stderr
    oom = "gpupool: out of memory on device 0 allocating 1.00 GiB" in err
    assert oom == (level != "off"), err
    created = "gpupool: device 0 pool created (expandable mode" in err
    maps = [ln for ln in err.splitlines() if ": map " in ln]
    assert created == bool(maps) == (level == "all"), err
    if level == "all":
        before, hot, after = err.partition("HOT")[0], err.split("HOT")[1].split("TRIM")[0], err.split("TRIM")[1]
        assert "device 0: map 2.00 MiB at 0x" in before and before.count(": map ") == 3, before
        assert hot.strip() == "", hot
        # (The trim waits for the pool's stream, not the device.)
        assert "event wait" in after and "device synchronize" not in after, after
        assert after.count(": unmap 2.00 MiB") == 3, after
    elif level == "off":
        assert err.replace("HOT", "").replace("TRIM", "").strip() == "", err


def test_out_of_range_ints_are_refused_not_cut() -> None:
    # 2**64 + n used to become n (PyArg "K" masks): an 8 MiB pool, a 1-byte
    # limit, a 1-byte trim.
    big = 2 ** 64 + 8 * MiB
    with pytest.raises(OverflowError, match=f"capacity {big} is out of range: 1..{2 ** 64 - 1}"):
        HostPool(big)
    p = HostPool(64 * MiB, chunk="2MiB")
    a = p.alloc(3 * MiB, tag="kept")
    with pytest.raises(OverflowError, match=f"tag limit {2 ** 64 + 1} is out of range"):
        p.set_limit(2 ** 64 + 1, tag="kept")
    with pytest.raises(OverflowError, match=f"limit {2 ** 64 + 1} is out of range"):
        p.set_limit(2 ** 64 + 1)
    p.free(a)
    with pytest.raises(OverflowError, match=f"trim: bytes {2 ** 64 + 1} is out of range"):
        p.trim(2 ** 64 + 1)
    s = p.stats()
    assert s["limit"] == 0 and s["tags"]["kept"]["limit"] == 0 and s["reserved"] > 0  # nothing changed
    with pytest.raises(OverflowError, match="stream"):
        p._pool.alloc(4096, 2 ** 64 + 1)
    with pytest.raises(ValueError, match="tag id 65541 is out of range"):
        p._pool.alloc(4096, 0, 2 ** 16 + 5)  # a cast to uint16 made it tag 5
    with pytest.raises(OverflowError, match="graph pool key"):
        p._pool.capture_begin(2 ** 64 + 5, 1)
    assert p.stats()["n_alloc"] == 1


def test_a_never_interned_tag_id_is_refused_and_reports_keep_working() -> None:
    p = HostPool(64 * MiB)
    a = p.alloc(4096, tag="real")
    unused = next(i for i in range(_C.MAX_TAGS - 1, 0, -1) if not _interned(i))
    with pytest.raises(ValueError, match=f"tag id {unused} .*must be interned"):
        p._pool.alloc(4096, 0, unused)
    assert [b.tag for b in p.blocks() if b.state == "used"] == ["real"]
    snap = p.snapshot()
    assert [b["tag"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"] \
        == ["real"]
    assert "real" in p.report() and p.stats()["n_alloc"] == 1
    p.free(a)


def _interned(tag_id: int) -> bool:
    try:
        _C.tag_name(tag_id)
    except ValueError:
        return False
    return True


def test_limits_below_one_chunk_are_refused() -> None:
    # GPUPOOL_LIMIT=2 meant 2 bytes: every allocation failed.  A fraction
    # that resolved to 0 bytes meant no limit at all.
    for limit in ("2", "1MiB", "0.000000001", "3%"):
        with pytest.raises(ValueError, match=r"less than one chunk \(GPUPOOL_CHUNK=2MiB\).*at least 2MiB"):
            HostPool(64 * MiB, chunk="2MiB", limit=limit)
    assert HostPool(64 * MiB, chunk="512KiB", limit="1MiB").stats()["limit"] == MiB
    assert HostPool(64 * MiB, chunk="1MiB", limit="3%").stats()["limit"] == int(0.03 * 64 * MiB)
    r = subprocess.run([sys.executable, "-m", "gpupool", "config"], capture_output=True, text=True,
                       env=child_env({"GPUPOOL_LIMIT": "2"}))
    assert r.returncode == 2 and "GPUPOOL_LIMIT=2 is 2 bytes" in r.stderr, r.stderr
    # A fraction is checked against the device, when its pool is made.
    code = ("from gpupool import _C\n_C.use_host_backend(64 << 20)\n_C.configure({'limit': '0.01'})\n"
            "try:\n    _C.device_pool(0, True)\nexcept RuntimeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert "cannot create the pool of device 0: GPUPOOL_LIMIT=1% is 671088 bytes on a device of 64MiB" \
        in r.stdout, (r.stdout, r.stderr)


# Values of every option, to print and parse back.
OPTION_SAMPLES = {
    "mode": ["expandable", "reserve"],
    "reserve": ["85%", "20GiB", "0.000000001", "12.345678912345%", "none", "123456789"],
    "limit": ["3GiB", "0.5", "0.000000001", "37.5%", "none", "123456789"],
    "priority": ["low", "critical", "200"],
    "codec": ["raw", "auto", "zstd", "ans", "bitcomp"],
    "nvcomp": ["none"],
    "offload_threads": ["1", "64"],
    "tenant": ["none", "team-a.b_1"],
    "log": ["off", "oom", "all"],
    "trace": ["1", "no"],
    "chunk": ["64KiB", "1GiB"],
    "small_size": ["4KiB", "5000"],
    "torch_patch": ["0", "on"],
    "placement": ["none", "lifetime"],
    "large_chunk": ["2MiB", "128MiB"],
    "cache_slack": ["0", "0%", "none", "0.000000001", "5%", "33.3333333%"],
    "host_limit": ["50%", "0.000000001", "64GiB", "none"],
    "host_reserve": ["0", "12.5%", "1GiB", "none"],
    "debug": ["0", "yes"],
    "device_limit": ["24GiB", "0.3", "none"],
    "reclaim_timeout": ["0", "30s", "500ms", "2min"],
    "tenant_turn": ["0", "1s", "250ms"],
    "tenant_share": ["1", "100%", "0.25", "33.3333333%"],
    "tenant_swap": ["0", "on"],
}


def test_every_option_prints_what_it_parses_back() -> None:
    # `python -m gpupool config` printed 0%, 1e-07% and an empty tenant,
    # which no parser took back.
    keys = [o[1] for o in _C.config_options()]
    assert sorted(OPTION_SAMPLES) == sorted(keys), "give every option sample values"
    try:
        _C.configure({})
        defaults = _C.config()
        for key in keys:
            for value in [defaults[key]] + OPTION_SAMPLES[key]:
                # small limits are refused below a chunk; a device limit needs a tenant group
                opts = {"chunk": "64KiB"} if key == "limit" else {"tenant": "t"} if key == "device_limit" else {}
                _C.configure({**opts, key: value})
                printed = _C.config()
                _C.configure({**opts, key: printed[key]})
                assert _C.config() == printed, (key, value, printed[key])
    finally:
        _C.configure(None)


def test_cli_config_output_is_accepted_as_input() -> None:
    env = {"GPUPOOL_LIMIT": "0.000000001", "GPUPOOL_CACHE_SLACK": "0", "GPUPOOL_CHUNK": "64KiB",
           "GPUPOOL_RESERVE": "12.5%"}

    def printed(extra: dict) -> dict:
        r = subprocess.run([sys.executable, "-m", "gpupool", "config"], capture_output=True, text=True,
                           env=child_env(extra))
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("GPUPOOL_")]
        return dict(ln.removesuffix(" (set)").split("=", 1) for ln in lines)

    first = printed(env)
    assert first["GPUPOOL_CACHE_SLACK"] == "0" and first["GPUPOOL_TENANT"] == "none"
    assert first["GPUPOOL_LIMIT"] == "0.0000001%" and first["GPUPOOL_MODE"] == "reserve"
    assert printed(first) == first  # every printed value, given back as the variable


def _gpupool_imports() -> Dict[str, Set[str]]:
    """Module -> the gpupool modules it imports, anywhere in it (functions
    too: an import deferred into a function still runs the other way),
    except under `if TYPE_CHECKING:`, which never runs.  "gpupool" is the
    package's __init__."""
    import ast
    from pathlib import Path

    pkg = Path(gpupool.__file__).parent
    graph: Dict[str, Set[str]] = {}
    for path in sorted(pkg.glob("*.py")):
        name = "gpupool" if path.stem == "__init__" else path.stem
        deps: Set[str] = set()
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpupool"):
                sub = node.module.split(".")[1:]
                deps |= {sub[0]} if sub else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] if "." in a.name else "gpupool"
                         for a in node.names if a.name.split(".")[0] == "gpupool"}
        graph[name] = deps - {name}
    return graph


def test_package_imports_run_one_way() -> None:
    graph = _gpupool_imports()
    assert "_registry" in graph and graph["_context"] <= {"_C"}, graph
    state: Dict[str, int] = {}

    def visit(m: str, path: List[str]) -> None:
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if state.get(m) == 2 or m not in graph:
            return
        state[m] = 1
        for d in sorted(graph[m]):
            visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_every_module_imports_first_and_alone() -> None:
    # Each module is imported first in a fresh interpreter, under a bare
    # package (its __init__, which imports everything, does not run): what
    # it needs at import time must come in on its own, without torch.
    from pathlib import Path

    pkg = str(Path(gpupool.__file__).parent)
    modules = sorted(m for m in _gpupool_imports() if m not in ("gpupool", "__main__"))
    code = ("import importlib, sys, types\nsys.modules['torch'] = None\n"
            "pkg = types.ModuleType('gpupool'); pkg.__path__ = [sys.argv[1]]; sys.modules['gpupool'] = pkg\n"
            "importlib.import_module('gpupool.' + sys.argv[2])\n"
            "print(' '.join(sorted(m[8:] for m in sys.modules if m.startswith('gpupool.'))))\n")
    graph = _gpupool_imports()
    for m in modules:
        r = subprocess.run([sys.executable, "-c", code, pkg, m], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (m, r.stderr)
        loaded = set(r.stdout.split())
        assert m in loaded and loaded <= _closure(graph, m), (m, loaded)
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; import gpupool"],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 0, r.stderr


def _closure(graph: Dict[str, Set[str]], m: str) -> Set[str]:
    seen, todo = set(), [m]
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo += graph.get(x, ())
    return seen


CHECK_RUN = """
import sys
sys.modules["torch"] = None
import gpupool
from gpupool import _C, _registry
_C.use_host_backend(64 << 20)          # device pools over host memory: no GPU needed
_registry.mark_enabled()
pool = _C.device_pool(0, True)
a = pool.alloc(3 << 20)
assert gpupool.check(0) is None and gpupool.check() is None
pool.free(a)
print("OK")
"""


def test_check_of_pools() -> None:
    # A HostPool, used, with an offloader: consistent (the fixture checks it too).
    p = HostPool(64 * MiB)
    addrs = [p.alloc(3 * MiB, tag="check_t") for _ in range(3)]
    assert p.check() is None
    gpupool.offload("check_t", codec="raw", pool=p)
    assert p.check() is None
    gpupool.restore("check_t", pool=p)
    for a in addrs:
        p.free(a)
    assert p.check() is None
    # A device pool, through gpupool.check().
    r = subprocess.run([sys.executable, "-c", CHECK_RUN], capture_output=True, text=True, env=child_env(),
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr


def test_check_names_the_first_problem() -> None:
    class Corrupt:
        def check(self) -> tuple:
            return 2, "free block 0x1000 is in the bins of size class 3, should be 4"

    view = gpupool.PoolView(Corrupt(), "host")  # type: ignore[arg-type]
    with pytest.raises(gpupool.PoolCorruptError, match=r"2 problem\(s\), the first: free block 0x1000") as e:
        view.check()
    assert isinstance(e.value, RuntimeError) and e.value.problems == 2
