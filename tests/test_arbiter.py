"""The tenant registry from Python, with real processes on the host backend:
yield points answer a C tenant's reclaim request, `report`/`top` show the
tenants, a killed tenant disappears from them, install_yield_point hooks a
step.  The protocol itself is tested in C (tests/c/test_arbiter.c)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import gpupool
from gpupool import _C
from gpupool import _arbiter

from test_c import ASAN, ASAN_ENV, build

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


@pytest.fixture
def group(request: pytest.FixtureRequest) -> Iterator[str]:
    """A group name of this test and process; its registry is removed after."""
    name = f"py-{os.getpid()}-{request.node.name[:30]}".replace("[", "-").replace("]", "")
    yield name
    _C.tenant_unlink(name, "host")


@pytest.fixture(scope="module")
def asker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/c/test_arbiter.c, whose `ask` mode is a C tenant that asks for memory."""
    return build(tmp_path_factory.mktemp("asker"), "test_arbiter.c", ASAN)


def host_tenant(group: str, priority: str, limit: str = "32MiB", swap: bool = False) -> Any:
    """A host pool in `group`, with 1 MiB chunks and every cached chunk kept; not swapped
    unless `swap` (the protocol below swaps, and exact held bytes: its offloader, made
    with the tenant when it may be swapped, holds 1 MiB)."""
    return gpupool.HostPool(256 * MiB, tenant=group, priority=priority, device_limit=limit, chunk="1MiB",
                            large_chunk="1MiB", small_size="64KiB", cache_slack="none", tenant_swap=swap)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpupool", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def only(info: Dict[str, Any], pid: int) -> Dict[str, Any]:
    (t,) = [t for t in info["tenants"] if t["pid"] == pid]
    return t


def ask_of_me(asker: Path, group: str, priority: str) -> subprocess.Popen:
    """A C tenant of `priority` asking for all 32 MiB (waiting up to 20 s), once its ask
    to this process is posted."""
    proc = subprocess.Popen([str(asker), "ask", group, priority, "32MiB", "32", "20000"],
                            env=dict(os.environ, **ASAN_ENV), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not only(_arbiter.tenants(group, "host"), os.getpid())["asked"]:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.001)
    return proc


def test_yield_point_answers_a_higher_tenant(group: str, asker: Path) -> None:
    pool = host_tenant(group, "low")
    pool.free(pool.alloc(16 * MiB))  # cached: what the asker needs
    assert _arbiter.yield_point() == 0  # nothing asked yet
    # priority 2 (high) asks for all 32 MiB, waiting up to 20 s
    proc = subprocess.Popen([str(asker), "ask", group, "2", "32MiB", "32", "20000"],
                            env=dict(os.environ, **ASAN_ENV), stderr=subprocess.PIPE, text=True)
    given = 0
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        given += _arbiter.yield_point()
        time.sleep(0.001)
    assert proc.wait(5) == 0, proc.stderr.read() if proc.stderr else ""
    assert given == 16 * MiB
    me = only(_arbiter.tenants(group, "host"), os.getpid())
    assert me["reclaims_given"] == 1 and me["bytes_given"] == 16 * MiB and me["held"] == 0
    assert me["latency_max_s"] > 0 and len(me["latencies_s"]) == 1
    assert pool.stats()["reserved"] == 0


def test_cache_given_at_a_later_yield_point_counts(group: str, asker: Path) -> None:
    """Asked while its memory is live, a tenant answers 0 B; freed and at a yield point while
    the asker still waits (backing off, no ask pending), it gives its cache, and that counts."""
    pool = host_tenant(group, "low")
    block = pool.alloc(16 * MiB)
    proc = ask_of_me(asker, group, "2")
    assert _arbiter.yield_point() == 0  # the block is live
    pool.free(block)
    assert _arbiter.yield_point() == 16 * MiB  # within the asker's 0.2 s back-off
    assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""
    me = only(_arbiter.tenants(group, "host"), os.getpid())
    assert me["reclaims_given"] == 2 and me["bytes_given"] == 16 * MiB and len(me["latencies_s"]) == 2


def test_equal_priority_waits_for_the_end_of_a_turn(group: str, asker: Path) -> None:
    """A tenant with yield points keeps its cache across steps while one of its own
    priority waits, until its turn (GPUPOOL_TENANT_TURN) is over: each handover
    unmaps and maps a step's memory.  Before, it gave it at the next allocator call."""
    pool = gpupool.HostPool(256 * MiB, tenant=group, priority="normal", device_limit="32MiB", chunk="1MiB",
                            large_chunk="1MiB", small_size="64KiB", cache_slack="none", tenant_turn="1500ms",
                            tenant_swap=False)
    pool.free(pool.alloc(16 * MiB))
    assert _arbiter.yield_point() == 0  # its turn begins
    turn = time.monotonic()
    proc = ask_of_me(asker, group, "1")
    given = 0
    while not given:
        pool.free(pool.alloc(MiB))  # allocator calls mid-step: the ask waits
        given = _arbiter.yield_point()
        assert given or time.monotonic() - turn < 1.5
        time.sleep(0.01)
    assert time.monotonic() - turn >= 1.5 and given == 16 * MiB
    assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""
    me = only(_arbiter.tenants(group, "host"), os.getpid())
    assert me["reclaims_given"] == 1 and me["bytes_given"] == 16 * MiB


def test_a_step_keeps_its_cache_until_its_yield_point(group: str, asker: Path) -> None:
    """Once a tenant has yield points, a higher priority's ask is answered at the next
    one, not by an allocator call mid-step: the step's lease counted that cache, and a
    step that gave it away outgrew its lease and stalled half way (on the H100, three
    LoRA jobs did so, each holding part of a step, until killed)."""
    pool = host_tenant(group, "low")
    pool.free(pool.alloc(16 * MiB))
    assert _arbiter.yield_point() == 0  # a step begins
    proc = ask_of_me(asker, group, "2")
    for _ in range(5):  # the step goes on, allocating from its cache
        pool.free(pool.alloc(8 * MiB))
    assert pool.stats()["reserved"] == 16 * MiB
    assert _arbiter.yield_point() == 16 * MiB
    assert proc.wait(20) == 0, proc.stderr.read() if proc.stderr else ""


PACED_TENANT = """
import sys, time, gpupool
from gpupool import _arbiter
p = gpupool.HostPool(64 << 20, tenant=sys.argv[1], priority="high")
_arbiter.yield_point()
p.free(p.alloc(1 << 20))  # a step begins with its first allocation
time.sleep(1.0)  # a first step: its length tells how long the next may be busy
_arbiter.yield_point()
p.free(p.alloc(1 << 20))
print("stepping", flush=True)
time.sleep(float(sys.argv[2]))
_arbiter.yield_point()  # and then no step: a server between requests
print("idle", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("share", ["50%", "1"])
def test_lower_tenants_pause_while_a_higher_one_steps(group: str, share: str) -> None:
    """While a higher priority is in a step, a lower tenant's yield point pauses so that
    the steps below it take at most GPUPOOL_TENANT_SHARE of the time (with 50%: as long
    as its step); with 1, or once the higher one is idle, it does not pause."""
    pool = gpupool.HostPool(64 * MiB, tenant=group, priority="low", tenant_share=share)
    high = subprocess.Popen([sys.executable, "-c", PACED_TENANT, group, "4"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert high.stdout.readline().strip() == "stepping"
        _arbiter.yield_point()
        pool.free(pool.alloc(MiB))
        time.sleep(0.4)  # a step of 0.4 s
        t = time.monotonic()
        _arbiter.yield_point()
        paused = time.monotonic() - t
        me = only(_arbiter.tenants(group, "host"), os.getpid())
        assert 0.35 <= me["step_s"] < 1.5
        if share == "1":
            assert paused < 0.2 and me["paused_s"] == 0
        else:
            assert 0.35 <= paused < 2 and me["paused_s"] >= 0.35
        assert high.stdout.readline().strip() == "idle"
        pool.free(pool.alloc(MiB))
        time.sleep(0.4)
        t = time.monotonic()
        _arbiter.yield_point()
        assert time.monotonic() - t < 0.2  # nobody above is busy
    finally:
        high.kill()
        high.wait(10)


def test_without_yield_points_the_asker_times_out(group: str, asker: Path) -> None:
    pool = host_tenant(group, "low")
    pool.free(pool.alloc(16 * MiB))
    r = subprocess.run([str(asker), "ask", group, "2", "32MiB", "32", "300"], capture_output=True, text=True,
                       env=dict(os.environ, **ASAN_ENV), timeout=60)
    assert r.returncode == 1
    assert "waited 0.3" in r.stderr and f"pid {os.getpid()} '" in r.stderr and "cached 0 B" in r.stderr
    assert pool.stats()["reserved"] == 16 * MiB  # nobody took it


def test_report_and_top_show_tenants(group: str) -> None:
    pool = host_tenant(group, "low")
    block = pool.alloc(8 * MiB)
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, gpupool
p = gpupool.HostPool(64 << 20, tenant={group!r}, priority="high", limit="16MiB", tenant_swap=False)
x = p.alloc(4 << 20)
print("ready", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "ready"
        info = _arbiter.tenants(group, "host")
        assert info["limit"] == 32 * MiB and info["registered"] == 2 and len(info["tenants"]) == 2
        assert (group, "host") in _arbiter.registries()
        theirs = only(info, child.pid)
        assert theirs["priority"] == 2 and theirs["held"] == 4 * MiB and theirs["quota"] == 16 * MiB
        r = cli("report", "--group", group)
        assert r.returncode in (0, 2), r.stderr  # 2: no NVML here, and no other group shown
        lines = r.stdout.splitlines()
        head = [i for i, ln in enumerate(lines) if ln.startswith(f"tenant group '{group}' on host")]
        assert head and "limit 32.00 MiB, held 12.00 MiB, 2 tenants" in lines[head[0]]
        rows = lines[head[0] + 2:head[0] + 4]  # by priority, highest first
        assert rows[0].split()[0] == str(child.pid) and " high " in rows[0] and "4.00 MiB" in rows[0]
        assert rows[1].split()[0] == str(os.getpid()) and " low " in rows[1] and "8.00 MiB" in rows[1]
        r = cli("top", "--group", group, "--interval", "0.01", "--count", "2")
        assert r.stdout.count(f"tenant group '{group}'") == 2
        # Killed: reclaimed at the next look, its memory counted free.
        child.kill()
        child.wait(10)
        info = _arbiter.tenants(group, "host")
        assert [t["pid"] for t in info["tenants"]] == [os.getpid()] and info["reaped"] == 1
    finally:
        child.kill()
        child.wait(10)
    pool.free(block)
    del pool  # the last tenant out removes the registry
    assert _arbiter.tenants(group, "host") is None
    assert f"tenant group '{group}' on" not in cli("report", "--group", group).stdout


def test_registry_of_dead_tenants_goes(group: str) -> None:
    child = subprocess.run([sys.executable, "-c", f"""
import os, gpupool
p = gpupool.HostPool(64 << 20, tenant={group!r})
x = p.alloc(4 << 20)
os.kill(os.getpid(), 9)
"""], cwd=ROOT, timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert (group, "host") in _arbiter.registries()  # nobody left to remove it
    assert _arbiter.tenants(group, "host") is None    # the reader does
    assert (group, "host") not in _arbiter.registries()


def registry_path(group: str) -> Path:
    return Path(f"/dev/shm/gpupool.host.{group}")


def test_arguments_are_not_shown(group: str, tmp_path: Path) -> None:
    """A tenant is named by its program, never its arguments: anyone who may read the
    registry (top, gpupool.tenants()) would see a --token=... among them."""
    (tmp_path / "t.py").write_text(f"""
import sys, gpupool
p = gpupool.HostPool(64 << 20, tenant={group!r})
x = p.alloc(4 << 20)
print("ready", flush=True)
sys.stdin.read()
""")
    child = subprocess.Popen([sys.executable, "t.py", "--token=s3cr3t"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert child.stdout.readline().strip() == "ready"
        theirs = only(_arbiter.tenants(group, "host"), child.pid)
        assert theirs["name"] == Path(sys.executable).name
        r = cli("top", "--group", group, "--interval", "0.01", "--count", "1")
        assert f"tenant group '{group}'" in r.stdout and str(child.pid) in r.stdout
        assert "s3cr3t" not in r.stdout + r.stderr
        assert b"s3cr3t" not in registry_path(group).read_bytes()
    finally:
        child.kill()
        child.wait(10)


def test_registry_open_to_others_is_refused(group: str) -> None:
    """A registry another user could open (here: made 0666 after its creation) is
    neither joined nor read, and the error says what is wrong and the way out."""
    pool = host_tenant(group, "low")
    assert registry_path(group).stat().st_mode & 0o7777 == 0o600
    os.chmod(registry_path(group), 0o666)
    try:
        r = subprocess.run([sys.executable, "-c", f"""
import gpupool
gpupool.HostPool(64 << 20, tenant={group!r})
"""], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 1
        assert f"/gpupool.host.{group} is owned by uid {os.geteuid()} with mode 0666" in r.stderr
        assert "mode 0600 is accepted" in r.stderr and f"rm /dev/shm/gpupool.host.{group}" in r.stderr
        with pytest.raises(ValueError, match="with mode 0666"):
            _arbiter.tenants(group, "host")
        out = cli("top", "--group", group, "--interval", "0.01", "--count", "1").stdout
        assert "with mode 0666" in out and "limit 32.00 MiB" not in out  # no table of it
    finally:
        os.chmod(registry_path(group), 0o600)
    assert len(_arbiter.tenants(group, "host")["tenants"]) == 1
    del pool


def test_corrupt_registry_is_an_error(group: str, asker: Path) -> None:
    """A slot holding 1 TiB in a 32 MiB group (written straight into the shared memory) is
    a corrupt registry: the reader, top and a running tenant's next map say so, naming the
    slot and the field -- no sum of it, no wait."""
    pool = host_tenant(group, "low")
    block = pool.alloc(4 * MiB)
    poke = subprocess.run([str(asker), "poke", group, str(os.getpid()), str(1 << 40)],
                          env=dict(os.environ, **ASAN_ENV), capture_output=True, text=True, timeout=60)
    assert poke.returncode == 0, poke.stderr
    what = f"pid {os.getpid()}): held = 1099511627776 bytes (1.00 TiB), above the group's limit of 32.00 MiB"
    try:
        with pytest.raises(RuntimeError, match="is corrupt") as e:
            _arbiter.tenants(group, "host")
        assert what in str(e.value) and f"rm /dev/shm/gpupool.host.{group}" in str(e.value)
        out = cli("top", "--group", group, "--interval", "0.01", "--count", "1").stdout
        assert what in out and "TiB held" not in out and "limit 32.00 MiB, held" not in out
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="is corrupt") as e:
            pool.alloc(8 * MiB)  # a map: the registry's figures
        assert what in str(e.value) and time.monotonic() - t0 < 1
    finally:
        subprocess.run([str(asker), "poke", group, str(os.getpid()), poke.stdout.strip()],
                       env=dict(os.environ, **ASAN_ENV), timeout=60, check=True)
    pool.free(pool.alloc(8 * MiB))
    pool.free(block)
    assert only(_arbiter.tenants(group, "host"), os.getpid())["held"] == 12 * MiB


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="GPUPOOL_RECLAIM_TIMEOUT='5h'.*ms, s or min"):
        gpupool.HostPool(64 * MiB, tenant="g", reclaim_timeout="5h")
    with pytest.raises(ValueError, match="GPUPOOL_DEVICE_LIMIT='lots'"):
        gpupool.HostPool(64 * MiB, tenant="g", device_limit="lots")
    with pytest.raises(ValueError, match="GPUPOOL_TENANT='a/b'"):
        gpupool.HostPool(64 * MiB, tenant="a/b")


def test_install_yield_point() -> None:
    calls: List[str] = []

    class Handle:
        def remove(self) -> None:
            calls.append("removed")

    class Optimizer:
        def register_step_post_hook(self, fn: Any) -> Handle:
            calls.append("step")
            fn(self, (), {})  # as torch calls it after step()
            return Handle()

    class Module:
        def register_forward_pre_hook(self, fn: Any) -> Handle:
            calls.append("forward")
            fn(self, ())
            return Handle()

    _arbiter.install_yield_point(Optimizer()).remove()
    _arbiter.install_yield_point(Module()).remove()
    assert calls == ["step", "removed", "forward", "removed"]
    with pytest.raises(TypeError, match="neither a torch optimizer nor an nn.Module"):
        _arbiter.install_yield_point(object())


def test_no_group_no_registry() -> None:
    before = _arbiter.registries()
    pool = gpupool.HostPool(64 * MiB)
    pool.free(pool.alloc(MiB))
    assert _arbiter.registries() == before
    assert gpupool.format_bytes(0) == "0 B"


def test_multi_tenant_example_checks_its_jobs() -> None:
    """The example's coordinator (tests/test_gpu.py runs it on a GPU) refuses a
    job it cannot start, before it imports torch."""
    script = str(ROOT / "examples" / "multi_tenant.py")
    r = subprocess.run([sys.executable, script, "--jobs", "lora:urgent"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "'lora:urgent' is not KIND:PRIORITY" in r.stderr
    r = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "GPUPOOL_TENANT" in r.stdout and "--limit" in r.stdout


# -------------------------------------------------------------------- GPU

GPU_TENANT = """
import os, sys, time, torch, gpupool
gpupool.enable()
x = torch.empty({mib} << 20, dtype=torch.uint8, device="cuda")
{then}
print("done", flush=True)
"""


@pytest.mark.gpu
def test_gpu_low_gives_cache_to_high(group: str) -> None:
    """Two processes on the GPU under a 1 GiB group limit: a high one gets the
    memory a low one cached, at the low one's yield point; then the low one
    asks again and waits (queues) until the high one is gone."""
    from conftest import child_env

    env = {"GPUPOOL_TENANT": group, "GPUPOOL_DEVICE_LIMIT": "1GiB", "GPUPOOL_RECLAIM_TIMEOUT": "60"}
    flag = Path(f"/tmp/{group}.done")
    low = subprocess.Popen([sys.executable, "-c", GPU_TENANT.format(mib=768, then="""
del x  # cached: the pool keeps it
print("cached", flush=True)
while not os.path.exists(sys.argv[1]):
    gpupool.yield_point()
    time.sleep(0.01)
y = torch.empty(768 << 20, dtype=torch.uint8, device="cuda")  # waits for the high one to go
"""), str(flag)], env=child_env(dict(env, GPUPOOL_PRIORITY="low")), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert low.stdout.readline().strip() == "cached"
        high = subprocess.run([sys.executable, "-c", GPU_TENANT.format(mib=768, then=f"""
s = gpupool.stats()
assert s["reserved"] >= 768 << 20 and s["device_total"] == 1 << 30, s
open({str(flag)!r}, "w").close()
time.sleep(1)
""")], env=child_env(dict(env, GPUPOOL_PRIORITY="high")), capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        assert high.returncode == 0, high.stderr
        assert low.stdout.readline().strip() == "done"
        assert low.wait(60) == 0
    finally:
        low.kill()
        flag.unlink(missing_ok=True)


@pytest.mark.gpu
def test_gpu_multi_tenant_example_tiny() -> None:
    """The example end to end with tiny models: every job finishes."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from conftest import child_env

    r = subprocess.run([sys.executable, str(ROOT / "examples" / "multi_tenant.py"), "--size", "tiny",
                        "--lora-batch", "2", "--lora-len", "128", "--gen-batch", "2", "--gen-len", "64",
                        "--gen-new", "8", "--limit", "1GiB", "--quota", "512MiB", "--quick"],
                       capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "all jobs finished without running out of memory" in r.stdout
