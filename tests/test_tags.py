"""Tags and priorities from Python, over the host backend: the context
(nesting, exceptions, threads, decorator, inheritance by threads without a
context), the default priority, the tag table's limit, re-tagging existing
memory (tagged()), lifetime placement, limits and the priority rules, and
per-tag accounting after random workloads.  Needs neither torch nor a GPU."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
from typing import Any, Dict, List, Tuple

import pytest

import gpupool
from conftest import child_env
from gpupool import HostPool

MiB = 1 << 20


def pool(**options: Any) -> HostPool:
    """A host pool with small chunks that keeps its cache (exact figures)."""
    return HostPool(256 * MiB, chunk="256KiB", large_chunk="256KiB", cache_slack="none", **options)


# ------------------------------------------------------------------ context


def test_default_priority_is_normal_or_the_configured_one() -> None:
    p = pool()
    a = p.alloc(4096)
    assert p.lookup(a).priority == gpupool.priority_value("normal")
    assert p.stats()["priorities"] == {1: {"allocated": 4096, "allocated_peak": 4096}}
    q = pool(priority="high")
    assert q.lookup(q.alloc(4096)).priority == 2
    with gpupool.tag("t", priority="low"):
        assert q.lookup(q.alloc(4096)).priority == 0  # the context wins over the default
        with gpupool.tag("u"):  # no priority: the enclosing one
            assert q.lookup(q.alloc(4096)).priority == 0


def test_context_restored_after_exceptions_and_nesting() -> None:
    p = pool()
    with pytest.raises(RuntimeError):
        with gpupool.tag("a", priority="high"):
            with gpupool.tag("b"):
                raise RuntimeError("boom")
    assert gpupool.current_tag() == "untagged"
    assert p.lookup(p.alloc(512)).priority == 1


def test_one_tag_object_entered_by_many_threads() -> None:
    """The saved contexts are per thread: threads entering the same object
    concurrently each get their own previous context back."""
    shared = gpupool.tag("shared", priority="high")
    p = pool()
    errors: List[str] = []
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        with gpupool.tag(f"own{i}"):
            barrier.wait()
            for _ in range(200):
                with shared:
                    if p.lookup(p.alloc(512)).tag != "shared":
                        errors.append("inside")
                if gpupool.current_tag() != f"own{i}":
                    errors.append(f"restored to {gpupool.current_tag()}")
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_decorator_is_reentrant() -> None:
    p = pool()
    seen: List[str] = []

    @gpupool.tag("rec", priority="critical")
    def rec(n: int) -> None:
        seen.append(p.lookup(p.alloc(512)).tag)
        if n:
            rec(n - 1)
        seen.append(gpupool.current_tag())

    rec(3)
    assert seen == ["rec"] * 8 and gpupool.current_tag() == "untagged"


def test_threads_without_a_context_inherit() -> None:
    """Autograd's backward threads never enter gpupool.tag(): they allocate
    under the inherited context that tag(..., inherit=True) sets."""
    p = pool()
    got: Dict[str, Any] = {}

    def bare(key: str) -> None:  # a thread that never sets a context
        b = p.lookup(p.alloc(512))
        got[key] = (b.tag, b.priority, gpupool.current_tag())

    def run(key: str) -> None:
        t = threading.Thread(target=bare, args=(key,))
        t.start()
        t.join()

    run("before")
    with gpupool.tag("backward", priority="high", inherit=True):
        run("inside")
        with gpupool.tag("inner"):  # not inherited: threads keep "backward"
            run("nested")
    run("after")
    with gpupool.tag("plain"):  # without inherit, other threads see nothing
        run("plain")

    def own() -> None:  # a thread with its own context keeps it
        with gpupool.tag("mine"):
            with gpupool.tag("backward2", inherit=True):
                pass
            got["own"] = p.lookup(p.alloc(512)).tag

    t = threading.Thread(target=own)
    t.start()
    t.join()
    assert got["before"] == ("untagged", 1, "untagged")
    assert got["inside"] == ("backward", 2, "backward")
    assert got["nested"] == ("backward", 2, "backward")
    assert got["after"] == ("untagged", 1, "untagged")
    assert got["plain"] == ("untagged", 1, "untagged")
    assert got["own"] == "mine"


def test_tag_exited_on_another_thread_is_a_clear_error() -> None:
    t = gpupool.tag("crossed")
    t.__enter__()
    errors: List[BaseException] = []

    def other() -> None:
        try:
            t.__exit__(None, None, None)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "'crossed'" in str(errors[0]) and "same thread" in str(errors[0])
    assert gpupool.current_tag() == "crossed"  # the entering thread's context is untouched
    t.__exit__(None, None, None)
    assert gpupool.current_tag() == "untagged"
    with pytest.raises(RuntimeError, match="more often than entered"):
        t.__exit__(None, None, None)


def test_tag_table_holds_1024_then_a_clear_error() -> None:
    code = """
import gpupool
names = [f"tag{i}" for i in range(2000)]
n = 1
try:
    for name in names:
        gpupool.tag(name)
        n += 1
except RuntimeError as e:
    print(n, e)
gpupool.tag("tag5")  # known names still resolve
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    count, message = r.stdout.split(" ", 1)
    assert int(count) == 1024 >= 255
    assert "cannot create tag 'tag1023'" in message and "reuse names" in message
    assert "RuntimeError" in gpupool._context.tag_id.__doc__  # what the docstring promises


# -------------------------------------------------------------- tagged()


class FakeDevice:
    def __init__(self, kind: str, index: int = 0) -> None:
        self.type, self.index = kind, index


class FakeTensor:
    """What tagged() reads of a tensor: data_ptr() and device."""

    def __init__(self, addr: int, kind: str = "cuda") -> None:
        self.addr, self.device = addr, FakeDevice(kind)

    def data_ptr(self) -> int:
        return self.addr


class FakeWrapper:
    """A tensor subclass that wraps others (DTensor, a quantised tensor):
    torch's __tensor_flatten__ names its inner tensors; it has no storage,
    and its data_ptr() raises, as a wrapper's does."""

    def __init__(self, **inner: Any) -> None:
        self.__dict__.update(inner)
        self.device = FakeDevice("cuda")

    def __tensor_flatten__(self) -> Tuple[List[str], Any]:
        return sorted(k for k in self.__dict__ if k != "device"), None

    def data_ptr(self) -> int:
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")


class FakeModule:
    def __init__(self, params: List[FakeTensor], buffers: List[FakeTensor]) -> None:
        self._p, self._b = params, buffers

    def parameters(self) -> List[FakeTensor]:
        return self._p

    def buffers(self) -> List[FakeTensor]:
        return self._b


def test_tagged_rehomes_existing_memory_exactly() -> None:
    p = pool()
    with gpupool.tag("loading", priority="low"):
        w = [p.alloc(s) for s in (3 * MiB, 5000, 1 * MiB)]
        buf = p.alloc(700)
        other = p.alloc(9000)
    sizes = {a: p.lookup(a).size for a in (*w, buf, other)}
    model = FakeModule([FakeTensor(w[0]), FakeTensor(w[1]), FakeTensor(w[2] + 4096)],  # a view
                       [FakeTensor(buf), FakeTensor(w[0])])  # tied: one block counted once
    assert gpupool.tagged(model, "weights", priority="high", pool=p) is model
    s = p.stats()
    moved = sizes[w[0]] + sizes[w[1]] + sizes[w[2]] + sizes[buf]
    assert s["tags"]["weights"]["allocated"] == moved and s["tags"]["weights"]["active_blocks"] == 4
    assert s["tags"]["weights"]["requested"] == 3 * MiB + 5000 + 1 * MiB + 700
    assert s["tags"]["loading"]["allocated"] == sizes[other]
    assert s["priorities"][2]["allocated"] == moved and s["priorities"][0]["allocated"] == sizes[other]
    assert {p.lookup(a).tag for a in (*w, buf)} == {"weights"}
    # None (a missing .grad) is skipped, other iterables work, priority kept.
    gpupool.tagged([None, FakeTensor(other)], "grads", pool=p)
    assert p.lookup(other).tag == "grads" and p.lookup(other).priority == 0
    # All or nothing: a foreign address changes nothing.
    with pytest.raises(ValueError, match="no live block"):
        gpupool.tagged([FakeTensor(w[1]), FakeTensor(12345 * 4096)], "x", pool=p)
    assert p.lookup(w[1]).tag == "weights"
    # Past the tag's limit: MemoryError, nothing moved.
    p.set_limit(1000, tag="small")
    with pytest.raises(MemoryError, match="limit"):
        gpupool.tagged([FakeTensor(w[0])], "small", pool=p)
    assert p.lookup(w[0]).tag == "weights"
    with pytest.raises(TypeError, match="Module, a tensor or an iterable"):
        gpupool.tagged(42, "x", pool=p)
    with pytest.raises(TypeError, match="must be a tensor"):
        gpupool.tagged(["w"], "x", pool=p)
    # Freed after the move: counted against the new tag.
    for a in (*w, buf, other):
        p.free(a)
    s = p.stats()
    assert all(t["allocated"] == 0 and t["active_blocks"] == 0 for t in s["tags"].values())


def test_tagged_reaches_the_tensors_a_subclass_wraps() -> None:
    # FSDP2's parameters and an optimizer's state under it are DTensors: the
    # memory is that of the tensors they wrap, at any depth.
    p = pool()
    a, b, c = (p.alloc(s) for s in (1 * MiB, 5000, 70000))
    loose = p.alloc(4096)
    nested = FakeWrapper(_local_tensor=FakeWrapper(qdata=FakeTensor(b), scale=FakeTensor(c)))
    model = FakeModule([FakeWrapper(_local_tensor=FakeTensor(a)), nested], [])
    gpupool.tagged(model, "shards", pool=p)
    assert {p.lookup(x).tag for x in (a, b, c)} == {"shards"} and p.lookup(loose).tag != "shards"
    gpupool.tagged([FakeTensor(loose), FakeWrapper(t=FakeTensor(a))], "state", pool=p)
    assert p.lookup(loose).tag == p.lookup(a).tag == "state"
    for x in (a, b, c, loose):
        p.free(x)


def test_tagged_device_tensors_need_gpupool_enabled() -> None:
    with pytest.raises(RuntimeError, match="not enabled"):
        gpupool.tagged([FakeTensor(4096)], "weights")
    gpupool.tagged([FakeTensor(4096, kind="cpu")], "weights")  # not on a GPU: left alone


# -------------------------------------------------------------- placement


def test_tag_lifetimes() -> None:
    assert gpupool.tag_lifetime("weights") == "long" and gpupool.tag_lifetime("kv_cache") == "long"
    assert gpupool.tag_lifetime("activations") == "short" and gpupool.tag_lifetime("untagged") == "short"
    gpupool.tag("my_cache", lifetime="long")
    assert gpupool.tag_lifetime("my_cache") == "long"
    assert gpupool.tag_lifetime("my_cache", "short") == "short" == gpupool.tag_lifetime("my_cache")
    with pytest.raises(ValueError, match="'short' or 'long'"):
        gpupool.tag_lifetime("my_cache", "forever")


@pytest.mark.parametrize("placement", ["lifetime", "none"])
def test_placement_separates_long_from_short(placement: str) -> None:
    p = pool(placement=placement)
    rng = random.Random(1)
    long_, short = [], []
    for _ in range(40):
        with gpupool.tag("weights"):
            long_.append(p.alloc(rng.choice([4096, 300_000, 2 * MiB])))
        with gpupool.tag("activations"):
            short.append(p.alloc(rng.choice([4096, 300_000, 2 * MiB])))
    for arena in ("small", "large"):
        w = [p.lookup(a) for a in long_ if p.lookup(a).arena == arena]
        s = [p.lookup(a) for a in short if p.lookup(a).arena == arena]
        if placement == "lifetime":
            assert {b.lifetime for b in w} == {"long"} and {b.lifetime for b in s} == {"short"}
            assert min(b.addr for b in w) > max(b.addr for b in s)
        else:
            assert {b.lifetime for b in w + s} == {"short"}
            assert min(b.addr for b in w) < max(b.addr for b in s)  # interleaved
    # A freed long block is not handed to a short request under placement.
    freed = long_.pop(0)
    size = p.lookup(freed).requested
    p.free(freed)
    with gpupool.tag("activations"):
        again = p.alloc(size)
    assert (again != freed) == (placement == "lifetime")
    assert any(o[1] == "placement" for o in gpupool.config_options())


def test_bad_placement_is_an_error() -> None:
    with pytest.raises(ValueError, match="lifetime or none"):
        HostPool(64 * MiB, placement="sometimes")


# ------------------------------------------------------ limits and priority


def make_cache(p: HostPool, prio1: str, prio2: str) -> List[int]:
    """Two free 3 MiB blocks (priorities prio1, prio2) held apart by live
    1 MiB blocks; returns the addresses [hole1, hole2]."""
    h1 = p.alloc(3 * MiB, priority=prio1)
    p.alloc(MiB, priority="critical")
    h2 = p.alloc(3 * MiB, priority=prio2)
    p.alloc(MiB, priority="critical")
    p.free(h1)
    p.free(h2)
    return [h1, h2]


def state(p: HostPool, addr: int) -> str:
    return next(b.state for b in p.blocks() if b.addr == addr)


def test_high_displaces_low_cache_never_the_reverse() -> None:
    p = pool(limit="10MiB")
    hole_normal, hole_low = make_cache(p, "normal", "low")
    assert p.stats()["reserved"] == 8 * MiB
    p.alloc(4 * MiB, priority="high")  # 2 MiB over the limit: the low cache goes first, 2 MiB of it
    assert state(p, hole_low) == "free" and state(p, hole_low + MiB) == "unmapped"
    assert state(p, hole_normal) == "free" and p.stats()["reserved"] == 10 * MiB
    with pytest.raises(MemoryError, match="priorities above"):
        p.alloc(4 * MiB, priority="low")  # may not release the normal cache
    assert state(p, hole_normal) == "free"
    p.alloc(4 * MiB, priority="normal")  # its own priority's cache: yes
    assert state(p, hole_normal) != "free"

    q = pool(limit="8MiB")
    make_cache(q, "high", "high")
    for prio in ("low", "normal"):
        with pytest.raises(MemoryError, match="limit"):
            q.alloc(4 * MiB, priority=prio)
    assert q.stats()["reserved"] == 8 * MiB
    q.alloc(4 * MiB, priority="critical")


def test_tag_limits() -> None:
    p = pool()
    p.set_limit(2 * MiB, tag="kv")
    with gpupool.tag("kv", priority="critical"):
        a = p.alloc(MiB)
        with pytest.raises(MemoryError, match="tag 'kv' is limited"):
            p.alloc(2 * MiB)  # a tag's limit binds whatever its priority
    with gpupool.tag("other"):
        b = p.alloc(4 * MiB)
    assert p.stats()["tags"]["kv"]["limit"] == 2 * MiB
    p.set_limit(None, tag="kv")
    with gpupool.tag("kv"):
        c = p.alloc(2 * MiB)
    for x in (a, b, c):
        p.free(x)


# -------------------------------------------------------------- accounting


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_tag_accounting_after_random_workloads(seed: int) -> None:
    """Random allocations, frees and re-tags under random tags and priorities
    (some over a limit, failing): every figure per tag and per priority equals
    what the live blocks add up to."""
    rng = random.Random(seed)
    p = pool(limit="96MiB", placement=rng.choice(["lifetime", "none"]))
    tags = ["weights", "activations", "kv_cache", "optimizer", "untagged", "tmp"]
    prios = ["low", "normal", "high", "critical", 7]
    live: Dict[int, int] = {}  # addr -> requested
    n_alloc: Dict[str, int] = {}
    for _ in range(3000):
        r = rng.random()
        if r < 0.55 or not live:
            name, prio = rng.choice(tags), rng.choice(prios)
            size = int(2 ** rng.uniform(8, 23))
            with gpupool.tag(name, priority=prio):
                try:
                    addr = p.alloc(size)
                except MemoryError:
                    continue
            live[addr] = size
            n_alloc[name] = n_alloc.get(name, 0) + 1
        elif r < 0.9:
            addr = rng.choice(list(live))
            p.free(addr)
            del live[addr]
        else:
            some = rng.sample(list(live), min(len(live), rng.randint(1, 5)))
            p.retag(some, rng.choice(tags), rng.choice([None, *prios]))
    blocks = [b for b in p.blocks() if b.state == "used"]
    assert {b.addr for b in blocks} == set(live)
    s = p.stats()
    for name in tags:
        mine = [b for b in blocks if b.tag == name]
        t = s["tags"].get(name, {"allocated": 0, "active_blocks": 0, "requested": 0, "n_alloc": 0})
        assert t["allocated"] == sum(b.size for b in mine)
        assert t["active_blocks"] == len(mine)
        assert t["requested"] == sum(live[b.addr] for b in mine)
        assert t["n_alloc"] == n_alloc.get(name, 0)
    by_prio: Dict[int, int] = {}
    for b in blocks:
        by_prio[b.priority] = by_prio.get(b.priority, 0) + b.size
    assert {k: v["allocated"] for k, v in s["priorities"].items() if v["allocated"]} == by_prio
    assert s["allocated"] == sum(b.size for b in blocks)
    for addr in list(live):
        p.free(addr)
    s = p.stats()
    assert all(t["allocated"] == 0 for t in s["tags"].values())
    assert all(v["allocated"] == 0 for v in s["priorities"].values())
