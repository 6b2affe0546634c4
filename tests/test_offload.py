"""Offload through the Python API on a HostPool (no GPU needed): addresses
and bytes survive, figures and reports know offloaded memory, failures are
clean, and the pressure path offloads idle lower-priority tags only."""
from __future__ import annotations

import ctypes
import re
import textwrap
import time
from typing import Any, Sequence

import pytest

import gpupool
from gpupool import _C
from gpupool._context import priority_value, tag_id

MiB = 2**20


def pool(capacity: int = 256 * MiB, **kw: object) -> gpupool.HostPool:
    p = gpupool.HostPool(capacity, chunk="256KiB", large_chunk="1MiB", **kw)
    p._pool.offload_stats(True)  # the offloader (it takes 1 MiB for checksums) before any figure
    return p


def fill(addr: int, n: int, seed: int) -> None:
    buf = (ctypes.c_ubyte * n).from_address(addr)
    for i in range(0, n, 4093):
        buf[i] = (seed * 131 + i) & 0xFF


def same(addr: int, n: int, seed: int) -> bool:
    buf = (ctypes.c_ubyte * n).from_address(addr)
    return all(buf[i] == (seed * 131 + i) & 0xFF for i in range(0, n, 4093))


def test_offload_restore_keeps_addresses_and_bytes() -> None:
    p = pool()
    addrs = [p.alloc(3 * MiB + 512 * i, tag="weights_t") for i in range(8)]
    for i, a in enumerate(addrs):
        fill(a, 3 * MiB, i)
    other = p.alloc(2 * MiB, tag="other_t")
    fill(other, 2 * MiB, 99)
    before = p.stats()
    info = gpupool.offload("weights_t", codec="raw", pool=p)
    assert set(info) >= {"bytes", "host_bytes", "seconds", "codec", "copied", "released", "kept"}
    assert info["codec"] in ("raw", "zstd") and info["bytes"] > 0 and info["seconds"] > 0
    s = p.stats()
    assert s["offloaded"] == info["bytes"] and s["reserved"] == before["reserved"] - info["released"]
    assert s["host_bytes"] == info["host_bytes"] and s["tags"]["weights_t"]["host_bytes"] == info["host_bytes"]
    assert s["tags"]["weights_t"]["offloaded"] == info["bytes"]
    assert {b.state for b in p.blocks() if b.tag == "weights_t"} <= {"offloaded", "used"}
    assert "offloaded" in p.report() and same(other, 2 * MiB, 99)
    back = gpupool.restore("weights_t", pool=p)
    assert back["bytes"] == info["bytes"] and back["copied"] == info["copied"]
    assert all(same(a, 3 * MiB, i) for i, a in enumerate(addrs))
    assert p.stats()["offloaded"] == 0 and p.stats()["host_bytes"] == 0
    # Restoring what is resident does nothing.
    assert gpupool.restore("weights_t", pool=p)["bytes"] == 0


def test_offloaded_context_and_keep_false() -> None:
    p = pool()
    a = p.alloc(5 * MiB, tag="ctx_t")
    fill(a, 5 * MiB, 7)
    with gpupool.offloaded("ctx_t", pool=p) as info:
        assert info["bytes"] >= 5 * MiB and p.lookup(a).state == "offloaded"
    assert p.lookup(a).state == "used" and same(a, 5 * MiB, 7)
    with pytest.raises(RuntimeError):  # an exception inside still restores
        with gpupool.offloaded("ctx_t", pool=p):
            raise RuntimeError("inside")
    assert p.lookup(a).state == "used"
    dropped = gpupool.offload("ctx_t", keep=False, pool=p)
    assert dropped["copied"] == 0 and dropped["host_bytes"] == 0 and dropped["released"] > 0
    gpupool.restore("ctx_t", pool=p)
    assert p.lookup(a).state == "used"


def test_free_and_prefetch_while_offloaded() -> None:
    p = pool()
    a, b = p.alloc(4 * MiB, tag="pf_t"), p.alloc(6 * MiB, tag="pf_t")
    fill(b, 6 * MiB, 3)
    gpupool.offload("pf_t", pool=p)
    p.free(a)  # freeing offloaded memory is fine
    with pytest.raises(ValueError, match="freed twice"):
        p.free(a)
    gpupool.prefetch("pf_t", pool=p)
    gpupool.restore("pf_t", pool=p)  # waits for the prefetch
    assert same(b, 6 * MiB, 3) and p.stats()["offloaded"] == 0


def test_bad_input_and_host_limit() -> None:
    p = pool(host_limit="64MiB")
    with pytest.raises(ValueError, match="codec"):
        gpupool.offload("x_t", codec="lz77", pool=p)
    p.alloc(1 * MiB, tag="x_t")
    with pytest.raises(ValueError, match="ans"):  # no nvCOMP on the host backend
        gpupool.offload("x_t", codec="ans", pool=p)
    with pytest.raises(ValueError, match="element size"):
        gpupool.offload("x_t", dtype=3, pool=p)
    with pytest.raises(ValueError, match="no tag"):
        gpupool.offload([], pool=p)
    with pytest.raises(TypeError):
        gpupool.offload(3, pool=p)  # type: ignore[arg-type]
    a = p.alloc(100 * MiB, tag="big_t")
    fill(a, 100 * MiB, 5)
    reserved = p.stats()["reserved"]
    with pytest.raises(MemoryError, match="GPUPOOL_HOST_LIMIT"):
        gpupool.offload("big_t", pool=p)
    assert p.lookup(a).state == "used" and p.stats()["reserved"] == reserved and same(a, 100 * MiB, 5)


def test_background_offload_is_waited_for_and_reports_failure() -> None:
    p = pool(host_limit="64MiB")
    a = p.alloc(8 * MiB, tag="bg_t")
    fill(a, 8 * MiB, 4)
    assert gpupool.offload("bg_t", codec="raw", wait=False, pool=p) is None
    back = gpupool.restore("bg_t", pool=p)  # waits for the offload queued before it, then restores
    assert back["bytes"] >= 8 * MiB and p.lookup(a).state == "used" and same(a, 8 * MiB, 4)
    assert p.stats()["offload"]["n_offload"] == 1 and p.stats()["offload"]["n_restore"] == 1
    gpupool.offload("bg_t", wait=False, pool=p)
    gpupool.prefetch("bg_t", pool=p)  # queued after it: finds the record the offload made
    assert gpupool.restore("bg_t", pool=p)["bytes"] == 0 and same(a, 8 * MiB, 4)
    assert p.stats()["offload"]["n_restore"] == 2
    # A background offload that fails leaves the memory where it was; the
    # next restore says why, once.
    big = p.alloc(100 * MiB, tag="bg_big_t")
    fill(big, 100 * MiB, 6)
    reserved = p.stats()["reserved"]
    gpupool.offload("bg_big_t", codec="raw", wait=False, pool=p)
    with pytest.raises(MemoryError, match="GPUPOOL_HOST_LIMIT"):
        gpupool.restore("bg_big_t", pool=p)
    assert p.lookup(big).state == "used" and p.stats()["reserved"] == reserved and same(big, 100 * MiB, 6)
    assert gpupool.restore("bg_big_t", pool=p)["bytes"] == 0
    with pytest.raises(ValueError, match="codec"):  # bad input is refused before anything is queued
        gpupool.offload("bg_t", codec="lz77", wait=False, pool=p)


def test_prefetch_behind_a_background_offload_is_queued_not_waited_for() -> None:
    # The optimizer's prefetch is started by a gradient hook, on the thread
    # that queues the backward pass, while the offload behind the last step
    # may still be copying: waiting for it there stopped feeding the device.
    # The prefetch is queued behind the offload instead and returns at once.
    import os

    p = pool(256 * MiB, host_limit="256MiB")
    n = 96 * MiB
    a = p.alloc(n, tag="bgp_t")
    ctypes.memmove(a, os.urandom(n), n)  # (incompressible: zstd takes its time on it)
    want = bytes((ctypes.c_ubyte * n).from_address(a))
    gpupool.offload("bgp_t", codec="zstd", wait=False, pool=p)
    gpupool.prefetch("bgp_t", pool=p)
    # Before the offload was published: the prefetch did not wait for it.
    assert p.stats()["offload"]["n_offload"] == 0
    deadline = time.monotonic() + 30
    while p.stats()["offload"]["n_restore"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # The queued prefetch found the record the offload made and brought it
    # back by itself; the restore finds nothing left to do.
    assert p.stats()["offload"]["n_restore"] == 1 and p.stats()["offload"]["n_offload"] == 1
    assert gpupool.restore("bgp_t", pool=p)["bytes"] == 0
    assert bytes((ctypes.c_ubyte * n).from_address(a)) == want
    # A restore (or prefetch) asked after it waits for the queued prefetch
    # to take its records: an offload after that restore is not undone by
    # the prefetch asked before it.
    gpupool.offload("bgp_t", codec="raw", wait=False, pool=p)
    gpupool.prefetch("bgp_t", pool=p)
    gpupool.restore("bgp_t", pool=p)
    gpupool.offload("bgp_t", codec="raw", pool=p)
    time.sleep(0.05)
    assert p.lookup(a).state == "offloaded" and p.stats()["offload"]["n_restore"] == 2
    gpupool.restore("bgp_t", pool=p)
    assert bytes((ctypes.c_ubyte * n).from_address(a)) == want


def test_allocation_waits_for_a_background_offload() -> None:
    # The optimizer hook offloads behind the step while the next forward
    # allocates: under a limit, a request that finds no room must wait for
    # the memory on its way out, not fail.  Same priority, not registered:
    # nothing else the pressure path could give up.
    p = pool(64 * MiB, limit="48MiB")
    a = p.alloc(36 * MiB, tag="bgw_t")
    fill(a, 36 * MiB, 2)
    gpupool.offload("bgw_t", codec="zstd", wait=False, pool=p)  # compressing takes a while
    x = p.alloc(36 * MiB, tag="bgw_next_t")
    assert p.lookup(a).state == "offloaded"
    p.free(x)
    gpupool.restore("bgw_t", pool=p)
    assert same(a, 36 * MiB, 2)


def test_restore_takes_the_place_of_cache() -> None:
    # An optimizer's state goes between steps; the backward pass meanwhile
    # leaves cache behind.  The restore gives back that cache rather than
    # map on top of it, so the peak falls by what was offloaded.
    p = pool(cache_slack="0")
    state = p.alloc(16 * MiB, tag="opt_t")
    fill(state, 16 * MiB, 8)
    gpupool.offload("opt_t", codec="raw", pool=p)
    acts = [p.alloc(4 * MiB, tag="acts_t") for _ in range(8)]  # 32 MiB of activations, then cache
    for x in acts:
        p.free(x)
    before = p.stats()
    assert before["reserved"] - before["allocated"] >= 32 * MiB
    back = gpupool.restore("opt_t", pool=p)
    after = p.stats()
    assert same(state, 16 * MiB, 8) and after["reserved"] <= before["reserved"]
    assert after["reserved"] - after["allocated"] <= before["reserved"] - before["allocated"] - back["released"]
    assert after["reserved_peak"] == before["reserved_peak"]
    # Below the peak the cache stays: a trim costs a device sync, and the
    # memory would be mapped again.
    gpupool.offload("opt_t", codec="raw", pool=p)
    before = p.stats()
    assert before["reserved"] + back["released"] <= before["reserved_peak"]
    gpupool.restore("opt_t", pool=p)
    after = p.stats()
    assert after["reserved"] - after["allocated"] == before["reserved"] - before["allocated"]
    assert same(state, 16 * MiB, 8) and after["reserved_peak"] == before["reserved_peak"]


@pytest.mark.parametrize("refill", [False, True])
def test_an_offload_behind_a_step_maps_back_the_cache_its_restore_gave_back(refill: bool) -> None:
    # The restore of an optimizer's state gave the backward pass's cache
    # back to stay under the peak; with refill_cache the offload behind the
    # next step maps that cache again as the state's memory goes, so that
    # the next forward pass finds it where it was and maps nothing itself.
    p = pool(cache_slack="0")
    state = p.alloc(16 * MiB, tag="opt_t")
    fill(state, 16 * MiB, 5)
    gpupool.offload("opt_t", codec="raw", pool=p)
    acts = [p.alloc(4 * MiB, tag="acts_t") for _ in range(8)]
    for x in acts:
        p.free(x)
    back = gpupool.restore("opt_t", pool=p)
    assert back["released"] == 16 * MiB and same(state, 16 * MiB, 5)  # (cache given back)
    before = p.stats()
    info = gpupool.offload("opt_t", codec="raw", pool=p, refill_cache=refill)
    after = p.stats()
    refilled = after["refilled_total"] - before["refilled_total"]
    assert refilled == (16 * MiB if refill else 0)
    assert after["reserved"] == before["reserved"] - info["released"] + refilled
    again = [p.alloc(4 * MiB, tag="acts_t") for _ in range(8)]
    maps = p.stats()["n_map"] - after["n_map"]
    if refill:  # the same cache, at the same addresses
        assert maps == 0 and sorted(again) == sorted(acts)
    else:
        assert maps > 0
    for x in again:
        p.free(x)
    gpupool.restore("opt_t", pool=p)
    assert same(state, 16 * MiB, 5)


def test_host_limit_option_is_validated() -> None:
    with pytest.raises(ValueError, match="GPUPOOL_HOST_LIMIT"):
        pool(host_limit="lots")
    assert "host_limit" in {k for _, k, *_ in gpupool.config_options()}


def test_pressure_offloads_idle_lower_priority_tags() -> None:
    p = pool(64 * MiB)
    low = p.alloc(20 * MiB, tag="low_t", priority="low")
    fill(low, 20 * MiB, 1)
    raw = p._pool
    raw.offload_register(tag_id("low_t"), 0)
    raw.offload_use(tag_id("low_t"), True)  # busy: not taken
    with pytest.raises(MemoryError):
        p.alloc(50 * MiB, tag="hungry_t", priority="normal")
    assert p.lookup(low).state == "used"
    raw.offload_use(tag_id("low_t"), False)  # idle: taken
    x = p.alloc(50 * MiB, tag="hungry_t", priority="normal")
    assert p.lookup(low).state == "offloaded" and p.stats()["offload"]["n_pressure"] == 1
    p.free(x)
    gpupool.restore("low_t", pool=p)
    assert same(low, 20 * MiB, 1)


def test_offloadable_rejects_other_objects() -> None:
    p = pool()
    with pytest.raises(TypeError, match="nn.Module"):
        gpupool.offloadable(object(), "o_t", pool=p)


class _FakeOptimizer:
    """What offloadable() needs of a torch.optim.Optimizer: its step hooks and state."""

    def __init__(self, params: Sequence[object] = ()) -> None:
        self.state: dict = {}
        self.param_groups = [{"params": list(params)}]
        self.hooks: dict = {"pre": [], "post": [], "load": []}
        self.seen: tuple = ()

    def _register(self, kind: str, fn: object) -> object:
        hooks = self.hooks[kind]
        hooks.append(fn)

        class Handle:
            def remove(self) -> None:
                hooks.remove(fn)
        return Handle()

    def register_step_pre_hook(self, fn: object) -> object:
        return self._register("pre", fn)

    def register_step_post_hook(self, fn: object) -> object:
        return self._register("post", fn)

    def register_load_state_dict_post_hook(self, fn: object) -> object:
        return self._register("load", fn)

    def load_state_dict(self, state: dict) -> None:
        self.state = state
        for f in self.hooks["load"]:
            f(self)

    def step(self) -> None:
        for f in self.hooks["pre"]:
            f(self, (), {})
        self.seen = _C.get_context()  # what the step's new state would be allocated under
        for f in self.hooks["post"]:
            f(self, (), {})


def test_optimizer_step_allocates_under_its_tag_at_the_callers_priority() -> None:
    # The first step makes the state: at the handle's low priority it could
    # not displace the caller's cache under a limit (a full fine-tune under
    # a cap failed there with 21 GiB of cache).  Under the tag, for placement.
    p = pool()
    opt = _FakeOptimizer()
    h = gpupool.offloadable(opt, "fake_opt_t", priority="low", pool=p)
    with gpupool.tag("caller_t", priority="high"):
        opt.step()
        assert opt.seen[:2] == (tag_id("fake_opt_t"), priority_value("high"))
        assert _C.get_context()[:2] == (tag_id("caller_t"), priority_value("high"))  # and back after it
    h.remove()


class _FakeParam:
    """A parameter whose gradient hooks the test fires by hand."""

    requires_grad = True

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.hooks: list = []

    def numel(self) -> int:
        return self.nbytes // 2

    def element_size(self) -> int:
        return 2

    def register_post_accumulate_grad_hook(self, fn: object) -> object:
        self.hooks.append(fn)
        hooks = self.hooks

        class Handle:
            def remove(self) -> None:
                hooks.remove(fn)
        return Handle()

    def grad_done(self) -> None:
        for f in self.hooks:
            f(self)


def test_optimizer_state_is_prefetched_during_the_backward_pass() -> None:
    p = pool()
    params = [_FakeParam(n * MiB) for n in (4, 3, 2, 1)]  # the backward pass meets them in this order
    opt = _FakeOptimizer(params)
    h = gpupool.offloadable(opt, "pf_opt_t", offload_after_step=True, prefetch_at=0.6, pool=p)
    state = p.alloc(8 * MiB, tag="pf_opt_t")
    fill(state, 8 * MiB, 9)
    opt.step()  # offloads the state behind the step
    gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
    assert p.lookup(state).state == "offloaded"
    params[0].grad_done()  # 40% of the bytes: not yet
    time.sleep(0.05)
    assert p.lookup(state).state == "offloaded"
    params[1].grad_done()  # 70%: the prefetch starts
    # (Its blocks are marked used before the restore is counted: wait for both.)
    deadline = time.monotonic() + 10
    while (p.lookup(state).state != "used" or p.stats()["offload"]["n_restore"] < 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.lookup(state).state == "used" and p.stats()["offload"]["n_restore"] == 1 and same(state, 8 * MiB, 9)
    params[2].grad_done()  # (once per backward pass)
    opt.step()  # offloaded again; the next backward pass prefetches again
    for q in params[:2]:
        q.grad_done()
    gpupool.restore("pf_opt_t", pool=p)
    assert p.stats()["offload"]["n_restore"] == 2
    h.remove()
    assert not any(q.hooks for q in params)
    with pytest.raises(ValueError, match="prefetch_at"):
        gpupool.offloadable(opt, "pf_opt_t", prefetch_at=1.5, pool=p)


def _floats_over(addr: int, rows: int, cols: int) -> "torch.Tensor":
    """A float32 CPU tensor over a HostPool block's memory (no copy)."""
    import torch

    buf = (ctypes.c_ubyte * (rows * cols * 4)).from_address(addr)
    return torch.frombuffer(buf, dtype=torch.float32).view(rows, cols)


def test_a_module_follows_tensors_that_replace_its_own() -> None:
    # A real torch module over a HostPool's memory: load_state_dict(assign=True)
    # puts the loaded tensors in the parameters' place (its hook takes them
    # into the tag at once); a tensor swapped in by other means joins at the
    # handle's offload().  Neither was ever offloaded before.
    torch = pytest.importorskip("torch")
    p = pool(codec="raw")

    def over(tag: str, seed: int) -> "torch.Tensor":
        a = p.alloc(MiB, tag=tag)
        fill(a, MiB, seed)
        return _floats_over(a, 512, 512)

    m = torch.nn.Linear(512, 512, bias=False)
    m.weight = torch.nn.Parameter(over("mod_made_t", 50), requires_grad=False)
    h = gpupool.offloadable(m, "mod_t", pool=p)
    made = m.weight.data_ptr()
    assert p.lookup(made).tag == "mod_t"
    m.load_state_dict({"weight": over("mod_loaded_t", 51)}, assign=True)
    loaded = m.weight.data_ptr()
    p.free(made)  # (what torch frees once nothing holds the old weight)
    assert p.lookup(loaded).tag == "mod_t" and same(loaded, MiB, 51)
    m.weight.data = over("mod_swapped_t", 52)
    p.free(loaded)
    swapped = m.weight.data_ptr()
    info = h.offload()
    assert info["bytes"] == MiB and p.lookup(swapped).state == "offloaded"
    h.restore()
    assert same(swapped, MiB, 52)
    h.remove()
    assert not m._forward_pre_hooks and not m._load_state_dict_post_hooks


def test_a_module_is_not_taken_under_pressure_while_its_state_dict_lives() -> None:
    # The state dict's tensors are the module's own: under a limit, cloning
    # them (an allocation at a higher priority) made the pool offload the
    # idle weights the clones were about to read ("invalid argument" from
    # the copies on the GPU).  Busy while the dict lives, idle after it.
    torch = pytest.importorskip("torch")
    import gc

    p = pool(64 * MiB, codec="raw")
    a = p.alloc(20 * MiB, tag="sd_made_t", priority="low")
    fill(a, 20 * MiB, 60)
    m = torch.nn.Linear(1024, 1024, bias=False)
    m.weight = torch.nn.Parameter(_floats_over(a, 1024, 1024), requires_grad=False)
    h = gpupool.offloadable(m, "sd_mod_t", priority="low", pool=p)
    sd = m.state_dict()
    with pytest.raises(MemoryError):
        p.alloc(50 * MiB, tag="sd_hungry_t", priority="normal")
    assert p.lookup(a).state == "used"
    with torch.no_grad():
        m(torch.zeros(1, 1024))  # (its hooks' own busy and idle leave the hold alone)
    with pytest.raises(MemoryError):
        p.alloc(50 * MiB, tag="sd_hungry_t", priority="normal")
    del sd
    gc.collect()
    x = p.alloc(50 * MiB, tag="sd_hungry_t", priority="normal")
    assert p.lookup(a).state == "offloaded" and p.stats()["offload"]["n_pressure"] == 1
    p.free(x)
    h.remove()  # (restores)
    assert same(a, 20 * MiB, 60) and not m._state_dict_hooks


def test_an_optimizer_is_not_taken_under_pressure_while_its_state_dict_lives() -> None:
    # The state dict's tensors are the optimizer's own state: under a limit,
    # cloning them (copy.deepcopy of the dict, a checkpoint kept on the
    # device) made the pool offload the idle state the clones were about to
    # read.  Busy while the dict lives, idle after it; the dict saves and
    # loads as torch's does (an OrderedDict: a plain dict cannot be weakly
    # referenced, which the hold needs).
    torch = pytest.importorskip("torch")
    import gc
    import io

    p = pool(64 * MiB, codec="raw")
    w = torch.nn.Parameter(torch.zeros(5120, 1024))
    opt = torch.optim.SGD([w], lr=0.1, momentum=1.0)  # (a step by a zero gradient keeps the state)
    a = p.alloc(20 * MiB, tag="sd_opt_made_t", priority="low")
    fill(a, 20 * MiB, 61)
    opt.state[w] = {"momentum_buffer": _floats_over(a, 5120, 1024)}
    kept = opt.state[w]["momentum_buffer"].clone()
    h = gpupool.offloadable(opt, "sd_opt_t", priority="low", pool=p)
    assert p.lookup(a).tag == "sd_opt_t"
    h.offload()
    sd = opt.state_dict()
    assert p.lookup(a).state == "used" and isinstance(sd, dict)
    with pytest.raises(MemoryError):
        p.alloc(50 * MiB, tag="sd_opt_hungry_t", priority="normal")
    assert p.lookup(a).state == "used"
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert back["param_groups"] == sd["param_groups"]
    assert bool((back["state"][0]["momentum_buffer"] == sd["state"][0]["momentum_buffer"]).all())
    torch.optim.SGD([w], lr=0.1, momentum=1.0).load_state_dict(back)
    del sd
    gc.collect()
    x = p.alloc(50 * MiB, tag="sd_opt_hungry_t", priority="normal")
    assert p.lookup(a).state == "offloaded" and p.stats()["offload"]["n_pressure"] == 1
    p.free(x)
    opt.state_dict()  # (dropped at once: held no longer)
    x = p.alloc(50 * MiB, tag="sd_opt_hungry_t", priority="normal")
    p.free(x)
    h.remove()  # (restores)
    assert same(a, 20 * MiB, 61)

    # Held until the next step at most, which moves the state on (a dict
    # kept in a variable of the loop would keep the pool from it for
    # good): the offload behind that step runs, and pressure may take the
    # state after it.
    h = gpupool.offloadable(opt, "sd_opt_t", priority="low", offload_after_step=True, prefetch_at=None, pool=p)
    w.grad = torch.zeros_like(w)
    sd = opt.state_dict()
    with pytest.raises(MemoryError):
        p.alloc(50 * MiB, tag="sd_opt_hungry_t", priority="normal")
    opt.step()
    gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
    assert p.lookup(a).state == "offloaded"
    gpupool.restore("sd_opt_t", pool=p)
    x = p.alloc(50 * MiB, tag="sd_opt_hungry_t", priority="normal")
    assert p.lookup(a).state == "offloaded"
    p.free(x)
    del sd
    gc.collect()  # (released at the step: not again)
    assert h._holds == 0
    h.remove()
    assert torch.equal(opt.state[w]["momentum_buffer"], kept)


def _module_over(p: gpupool.HostPool, tag: str, rows: int, value: float) -> "torch.nn.Linear":
    """A torch module whose weight (rows x 1024 floats, all `value`) lies in
    a block of the HostPool, made offloadable at low priority as `tag`."""
    import torch

    a = p.alloc(rows * 4096, tag=tag + "_made", priority="low")
    m = torch.nn.Linear(1024, rows, bias=False)
    m.weight = torch.nn.Parameter(_floats_over(a, rows, 1024))
    with torch.no_grad():
        m.weight.fill_(value)
    m.handle = gpupool.offloadable(m, tag, priority="low", pool=p)
    return m


def test_a_state_dict_that_raised_is_released_by_the_next_of_its_thread() -> None:
    # state_dict()'s pre hook holds the object, its post hook hands the hold
    # to the dict; a state_dict() that raised between them (a user's pre
    # hook, a submodule) left the hold for good: pressure never took the
    # object again.  The next state_dict() of the same thread releases it;
    # another thread's does not (its own call may lie between the hooks).
    torch = pytest.importorskip("torch")
    import gc
    import threading

    p = pool(64 * MiB, codec="raw")
    m = _module_over(p, "sd_raise_t", 5120, 3.0)  # (20 MiB)
    w = torch.nn.Parameter(torch.zeros(256, 1024))
    opt = torch.optim.SGD([w], lr=0.1, momentum=1.0)
    opt.state[w] = {"momentum_buffer": _floats_over(p.alloc(MiB, tag="sd_raise_opt_made_t"), 256, 1024)}
    handles = [m.handle, gpupool.offloadable(opt, "sd_raise_opt_t", priority="low", pool=p)]
    fail = [True]

    def user_pre(*args: object) -> None:
        if fail[0]:
            raise RuntimeError("a user's state_dict hook failed")

    for obj, h in zip((m, opt), handles):
        obj.register_state_dict_pre_hook(user_pre)  # (after the handle's: its hold is taken)
        fail[0] = True
        with pytest.raises(RuntimeError, match="user's state_dict hook"):
            obj.state_dict()
        assert h._holds == 1
        fail[0] = False
        t = threading.Thread(target=lambda: obj.state_dict())
        t.start()
        t.join()
        gc.collect()
        assert h._holds == 1  # (another thread's call leaves this thread's alone)
        sd = obj.state_dict()
        assert h._holds == 1  # (the dict's own)
        del sd
        gc.collect()
        assert h._holds == 0
    x = p.alloc(50 * MiB, tag="sd_raise_hungry_t", priority="normal")
    assert p.lookup(m.weight.data_ptr()).state == "offloaded"
    p.free(x)
    for h in handles:
        h.remove()
    assert bool((m.weight == 3.0).all())


def test_an_optimizer_wrapper_without_hooks_of_its_own_offloads_the_optimizer_it_wraps() -> None:
    # accelerate's AcceleratedOptimizer (what transformers' Trainer hands its
    # callbacks as `optimizer`) subclasses torch's Optimizer without running
    # its __init__: registering a step hook on it raised AttributeError from
    # torch's internals.  Its step(), state_dict() and load_state_dict() call
    # the wrapped optimizer's, so the handle hooks that one.
    torch = pytest.importorskip("torch")

    class Wrapper(torch.optim.Optimizer):  # (accelerate's shape, no accelerate needed)
        def __init__(self, optimizer: "torch.optim.Optimizer") -> None:
            self.optimizer = optimizer

        @property
        def state(self) -> Any:
            return self.optimizer.state

        @property
        def param_groups(self) -> Any:
            return self.optimizer.param_groups

        def state_dict(self) -> Any:
            return self.optimizer.state_dict()

        def step(self, closure: Any = None) -> Any:
            return self.optimizer.step(closure)

    p = pool(64 * MiB, codec="raw")
    w = torch.nn.Parameter(torch.ones(1024, 1024))
    ref = torch.nn.Parameter(torch.ones(1024, 1024))
    opt, ref_opt = (torch.optim.SGD([q], lr=0.1, momentum=0.9) for q in (w, ref))
    a = p.alloc(4 * MiB, tag="wrap_opt_made_t")
    opt.state[w] = {"momentum_buffer": _floats_over(a, 1024, 1024)}
    opt.state[w]["momentum_buffer"].fill_(0.5)
    ref_opt.state[ref] = {"momentum_buffer": torch.full((1024, 1024), 0.5)}
    wrapped = Wrapper(Wrapper(opt))
    h = gpupool.offloadable(wrapped, "wrap_opt_t", offload_after_step=True, prefetch_at=None, pool=p)
    assert p.lookup(a).tag == "wrap_opt_t"
    for i in range(3):
        for q in (w, ref):
            q.grad = torch.full_like(q, float(i + 1))
        wrapped.step()
        ref_opt.step()
        gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
        assert p.lookup(a).state == "offloaded"
    sd = wrapped.state_dict()
    assert p.lookup(a).state == "used"
    assert torch.equal(sd["state"][0]["momentum_buffer"], ref_opt.state[ref]["momentum_buffer"])
    assert torch.equal(w, ref)
    del sd
    h.remove()

    class Hookless(torch.optim.Optimizer):
        def __init__(self) -> None:
            self.state = {}

    with pytest.raises(TypeError, match=r"Hookless subclasses torch.optim.Optimizer without running its __init__"):
        gpupool.offloadable(Hookless(), "wrap_none_t", pool=p)


def test_an_optimizer_step_holds_the_offloadable_modules_it_updates() -> None:
    # The step comes after the module's backward pass, when the module is
    # idle: an allocation of the step (foreach temporaries, new state) could
    # make the pool offload the parameters the step's kernels are about to
    # write (on a GPU: the CUDA context lost).  Any optimizer's step restores
    # the offloadable modules whose parameters it updates and holds them;
    # a module it does not update stays fair game.
    torch = pytest.importorskip("torch")
    p = pool(64 * MiB, codec="raw")  # (1 MiB of it the offloader's checksums)
    m = _module_over(p, "step_mod_t", 2048, 1.0)  # 8 MiB each
    other = _module_over(p, "step_other_t", 2048, 3.0)
    w = m.weight.data_ptr()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m.weight.grad = torch.ones(2048, 1024)
    m.handle.offload()
    seen = []

    def inside(o: object, args: object, kwargs: object) -> None:
        seen.append(p.lookup(w).state)
        x = p.alloc(52 * MiB, tag="step_hungry_t")  # fits once the other module is away
        assert p.lookup(other.weight.data_ptr()).state == "offloaded"
        p.free(x)
        with pytest.raises(MemoryError):
            p.alloc(60 * MiB, tag="step_hungry_t")  # would need the module's too

    hook = opt.register_step_pre_hook(inside)
    opt.step()
    assert seen == ["used"]

    def fail(o: object, args: object, kwargs: object) -> None:
        raise RuntimeError("a step that raised")

    failing = opt.register_step_pre_hook(fail)
    with pytest.raises(RuntimeError):
        opt.step()
    failing.remove()
    with pytest.raises(MemoryError):  # (the step that raised left the module held)
        p.alloc(60 * MiB, tag="step_hungry_t")
    hook.remove()
    opt.zero_grad(set_to_none=False)  # (a step by zero: the values stay)
    opt.step()  # releases what the step that raised held
    x = p.alloc(60 * MiB, tag="step_hungry_t")
    assert p.lookup(w).state == "offloaded"
    p.free(x)
    m.handle.remove()
    other.handle.remove()
    assert bool((m.weight == 0.5).all()) and bool((other.weight == 3.0).all())


def test_a_step_over_many_offloadable_modules_restores_them_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model made offloadable layer by layer (24 handles) and trained: the
    # step held each module it updates and restored it, one restore call
    # per module (a C call, a result and a wait apiece).  All are held first, then
    # restored together, one call for the pool; under a limit that cannot
    # hold them all, the step raises MemoryError and holds none (what came
    # back before the room ran out stays, idle, as it did one by one).
    torch = pytest.importorskip("torch")
    from gpupool import _offloadable

    p = pool(64 * MiB, codec="raw")
    layers = [_module_over(p, f"many_step_t{i}", 256, float(i)) for i in range(24)]  # 1 MiB each
    opt = torch.optim.SGD([m.weight for m in layers], lr=1.0)
    for m in layers:
        m.weight.grad = torch.ones(256, 1024)
        m.handle.offload()
    calls: list = []
    real = _offloadable.restore

    def counted(tag: object, **kw: object) -> object:
        calls.append([tag] if isinstance(tag, str) else list(tag))  # type: ignore[arg-type]
        return real(tag, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_offloadable, "restore", counted)
    opt.step()
    assert calls == [[f"many_step_t{i}" for i in range(24)]], calls
    for i, m in enumerate(layers):
        assert p.lookup(m.weight.data_ptr()).state == "used"
        assert bool((m.weight == i - 1.0).all()), i
        assert m.handle._holds == 0, i  # (released by the step's post hook)
    # A limit below the 24 MiB they need together: none stays held.
    for m in layers:
        m.handle.offload()
    p.set_limit(16 * MiB)
    with pytest.raises(MemoryError):
        opt.step()
    assert all(m.handle._holds == 0 for m in layers)
    p.set_limit(None)
    opt.step()
    for i, m in enumerate(layers):
        assert bool((m.weight == i - 2.0).all()), i
        m.handle.remove()


def test_many_tags_go_and_come_back_in_one_call() -> None:
    # Restoring or prefetching what several offloads took: the bindings
    # once refused more than 16 tags.  One offload of many tags: it once
    # took at most 16; it is one record, which a restore of any of them
    # brings back whole.
    p = pool(64 * MiB, codec="raw")
    tags = [f"many_t{i}" for i in range(24)]
    blocks = [p.alloc(MiB, tag=t) for t in tags]
    for i, (a, t) in enumerate(zip(blocks, tags)):
        fill(a, MiB, 70 + i)
        gpupool.offload(t, pool=p)
    gpupool.prefetch(tags, pool=p)
    gpupool.restore(tags, pool=p)
    for i, a in enumerate(blocks):
        assert p.lookup(a).state == "used" and same(a, MiB, 70 + i), i
    gpupool.offload(tags + tags[:3], pool=p)
    assert all(p.lookup(a).state == "offloaded" for a in blocks)
    gpupool.restore(tags[-1], pool=p)
    for i, a in enumerate(blocks):
        assert p.lookup(a).state == "used" and same(a, MiB, 70 + i), i
        p.free(a)


def test_a_move_to_where_the_module_already_is_leaves_it_offloaded() -> None:
    # model.to(device) before use (pipelines, trainers, loops) converts
    # nothing, yet it restored an offloaded module in full; under a limit
    # that restore may displace what needed the room.  Now it returns the
    # module as it is.
    torch = pytest.importorskip("torch")
    p = pool(64 * MiB, codec="raw")
    m = _module_over(p, "to_mod_t", 1024, 1.5)  # 4 MiB
    w = m.weight.data_ptr()
    m.handle.offload()
    for args, kwargs in [(("cpu",), {}), ((torch.float32,), {}), (("cpu", torch.float32), {}), ((), {}),
                         ((torch.zeros(1),), {}), ((), {"device": torch.device("cpu"), "non_blocking": True}),
                         ((), {"dtype": torch.float32})]:
        assert m.to(*args, **kwargs) is m and p.lookup(w).state == "offloaded", (args, kwargs)
    assert m.cpu() is m and p.lookup(w).state == "offloaded"
    with pytest.raises(TypeError):
        m.to(torch.int64)  # (what torch says of it, as before)
    m.handle.remove()  # (a real conversion: the GPU test, whose new tensors come from the pool)
    assert bool((m.weight == 1.5).all()) and not {"to", "cpu", "cuda"} & set(vars(m))


def test_in_use_holds_an_offloadable_module_resident() -> None:
    # Reads that no hook sees (m.weight.norm(), an EMA of the weights) hold
    # the module with the handle's in_use(): restored at the start, never
    # offloaded under pressure inside the block, fair game after it, also
    # after the block raised.
    pytest.importorskip("torch")
    p = pool(64 * MiB, codec="raw")
    m = _module_over(p, "use_mod_t", 4096, 2.0)  # 16 MiB
    w = m.weight.data_ptr()
    m.handle.offload()
    with m.handle.in_use() as held:
        assert held is m.handle and p.lookup(w).state == "used"
        with pytest.raises(MemoryError):
            p.alloc(50 * MiB, tag="use_hungry_t")
        assert float(m.weight.detach().sum()) == 2.0 * 4096 * 1024
    with pytest.raises(RuntimeError):
        with m.handle.in_use():
            raise RuntimeError("raised inside the block")
    x = p.alloc(50 * MiB, tag="use_hungry_t")
    assert p.lookup(w).state == "offloaded"
    p.free(x)
    m.handle.remove()
    assert bool((m.weight == 2.0).all())


# The set-up of the module tests that run in a fresh process (the failures
# they guard against are crashes): a HostPool, float tensors over its
# blocks, and a bias-free Linear whose weight lies in one.
_FRESH = """
import copy, ctypes, io, warnings, torch, gpupool
p = gpupool.HostPool(64 << 20, chunk="256KiB", large_chunk="1MiB", codec="raw")

def saved(obj):  # torch.save, then torch.load (of a whole object)
    f = io.BytesIO()
    torch.save(obj, f)
    f.seek(0)
    return torch.load(f, weights_only=False)

def floats(n, tag=None, priority=None):
    a = p.alloc(n * 4, tag=tag, priority=priority)
    return torch.frombuffer((ctypes.c_ubyte * (n * 4)).from_address(a), dtype=torch.float32)

def linear_over(tag, weight):
    m = torch.nn.Linear(1024, 1024, bias=False)
    w = floats(1024 * 1024, tag, "low").view(1024, 1024).copy_(weight)
    m.weight = torch.nn.Parameter(w, requires_grad=False)
    return m
"""


def test_a_conversion_holds_an_offloadable_module_and_its_result_joins_the_tag(run_py) -> None:
    # module.to(), .half(), .cpu() run Module._apply, which no hook saw: on
    # a module offloaded (or taken under pressure by the conversion's own
    # allocations) its reads hit unmapped memory (a segfault here, the CUDA
    # context lost on a GPU), and the tensors that replaced the module's
    # stayed outside the tag.  _apply here does what .to() does on a GPU:
    # each new tensor comes from the pool and is read from the old one.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        def doubled(t):
            return floats(t.numel()).view_as(t).copy_(t).mul_(2)

        m = linear_over("conv_made_t", torch.full((1024, 1024), 1.5))
        first = m.weight.data_ptr()
        h = gpupool.offloadable(m, "conv_t", pool=p)
        h.offload()
        m._apply(doubled)  # reads the offloaded weight
        p.free(first)  # (what torch frees once nothing holds the old weight)
        w = m.weight.data_ptr()
        assert bool((m.weight == 3.0).all())
        assert p.lookup(w).tag == "conv_t" and p.lookup(w).priority == h.priority
        assert h.offload()["bytes"] == 4 << 20 and p.lookup(w).state == "offloaded"

        # Idle, low priority, and the conversion's allocations (the caller's
        # priority) need its room: held, the conversion runs out of memory
        # instead of reading what the pool took, and the module is intact.
        hog = p.alloc(56 << 20, tag="hog_t", priority="normal")
        try:
            m._apply(doubled)
            raise AssertionError("converted without room for the copy")
        except MemoryError:
            pass
        assert p.lookup(w).state == "used" and m.weight.data_ptr() == w
        p.free(hog)
        h.offload()
        assert p.lookup(w).state == "offloaded"
        h.remove()
        assert "_apply" not in vars(m) and bool((m.weight == 3.0).all())
        print("OK")
    """))
    assert "OK" in r.stdout


def test_a_module_outside_that_shares_its_memory_holds_the_offloadable_one(run_py) -> None:
    # A tied embedding holds the very weight of lm_head: with only lm_head
    # offloadable, the embedding's forward read offloaded memory (a segfault
    # here, the CUDA context lost on a GPU).  Modules outside that hold one
    # of its tensors or a view of one, and submodules another module holds
    # as a child too, now hold it resident through their forward and their
    # part of the backward pass; idle after, as the module itself is.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        def rows_over(tag, rows, value):
            m = torch.nn.Linear(1024, rows, bias=False)
            w = floats(rows * 1024, tag, "low").view(rows, 1024).copy_(value)
            m.weight = torch.nn.Parameter(w, requires_grad=False)
            return m

        ref = torch.randn(4096, 1024)
        head = rows_over("tie_made_t", 4096, ref)  # 16 MiB
        emb = torch.nn.Embedding(4096, 1024)
        emb.weight = head.weight  # tied: the same Parameter
        view = torch.nn.Linear(1024, 512, bias=False)
        view.weight = torch.nn.Parameter(head.weight.detach()[512:1024], requires_grad=False)
        h = gpupool.offloadable(head, "tie_t", pool=p)
        w = head.weight.data_ptr()

        def room():  # what fits only with the module offloaded
            hog = p.alloc(50 << 20, tag="tie_hog_t", priority="normal")
            assert p.lookup(w).state == "offloaded"
            p.free(hog)

        h.offload()
        idx = torch.tensor([0, 7, 4095])
        assert torch.equal(emb(idx), ref[idx]) and p.lookup(w).state == "used"
        room()  # (idle after the forward: no hold left behind)

        def pressed(mod, args):  # runs inside the forward's hold
            try:
                p.alloc(50 << 20, tag="tie_hog_t", priority="normal")
                raise AssertionError("offloaded under pressure while a sharer's forward ran")
            except MemoryError:
                pass
        probe = view.register_forward_pre_hook(pressed)
        x = torch.ones(3, 1024, requires_grad=True)
        y = view(x)
        probe.remove()
        assert torch.allclose(y, (x @ ref[512:1024].t()).detach(), atol=1e-4)
        h.offload()  # between the forward and the backward pass, which reads the weight
        y.sum().backward()
        assert torch.allclose(x.grad, ref[512:1024].sum(0).expand(3, 1024), atol=1e-4), x.grad
        assert p.lookup(w).state == "used", p.lookup(w).state
        room()
        try:
            view(torch.ones(3, 7))  # a forward that raised
            raise AssertionError("the shapes should not match")
        except RuntimeError:
            pass
        room()

        def failing():
            raise RuntimeError("restore failed")
        h.restore = failing  # (a pre-hook that raised took no hold: the forward hook releases none)
        try:
            view(x)
            raise AssertionError("the restore should have failed")
        except RuntimeError as e:
            assert "restore failed" in str(e)
        del h.restore
        with torch.no_grad():
            view(x)
        room()

        # A submodule another module holds too (an encoder-decoder's shared embedding).
        shared = rows_over("tie_shared_made_t", 1024, ref[:1024])
        enc = torch.nn.Sequential(shared, torch.nn.ReLU())
        dec = torch.nn.Sequential(torch.nn.Identity(), shared)
        h2 = gpupool.offloadable(enc, "tie_enc_t", pool=p)
        h2.offload()
        s = shared.weight.data_ptr()
        assert torch.allclose(dec(torch.ones(2, 1024)), ref[:1024].sum(1).expand(2, 1024), atol=1e-4) and p.lookup(s).state == "used"
        h.remove()
        h2.remove()
        assert not emb._forward_pre_hooks and not view._forward_hooks and not shared._forward_pre_hooks
        assert not head._forward_pre_hooks and not enc._forward_pre_hooks
        print("OK")
    """))
    assert "OK" in r.stdout


def test_data_parallel_holds_the_offloadable_modules_it_replicates(run_py) -> None:
    # nn.DataParallel over several GPUs, and its functional form, copy the
    # module's tensors to the other devices (replicate) before any hook of
    # the module runs, and the first replica computes on the module's own
    # tensors; the module's hooks do nothing on replicas.  An offloaded
    # module read unmapped memory there (a segfault here, the CUDA context
    # lost on a GPU).  Both now hold the offloadable modules inside through
    # the forward and, from the output's gradient, through the backward
    # pass.  Here torch's own forward of each runs over two CPU "devices":
    # scatter, replicate, parallel_apply and gather do on the CPU what they
    # do across GPUs (the second replica's weight is a copy, read at
    # replicate).
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        import sys
        dpm = sys.modules["torch.nn.parallel.data_parallel"]  # (the module: its name in torch.nn.parallel is the function)

        def trainable_over(tag, value):
            m = torch.nn.Linear(1024, 1024, bias=False)
            w = floats(1024 * 1024, tag, "low").view(1024, 1024).copy_(value)
            m.weight = torch.nn.Parameter(w)
            return m

        lin = trainable_over("dp_made_t", torch.full((1024, 1024), 0.25))
        model = torch.nn.Sequential(lin, torch.nn.Tanh())
        ref = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Tanh())
        ref[0].weight = torch.nn.Parameter(torch.full((1024, 1024), 0.25))
        dp = torch.nn.DataParallel(model)  # (no CUDA here: made as a pass-through, set to two devices below)
        dp.device_ids, dp.output_device, dp.src_device_obj, dp.dim = [0, 1], 0, torch.device("cpu"), 0
        w = lin.weight.data_ptr()
        seen = []

        def scatter_kwargs(inputs, kwargs, ids, dim=0):
            return [(c,) for c in inputs[0].chunk(len(ids))], [{} for _ in ids]

        def replicate(module, ids, detach=False):
            replicas = []
            for i in range(len(ids)):
                r = module[0]._replicate_for_data_parallel()
                r._parameters = {"weight": module[0].weight if i == 0 else module[0].weight.clone(), "bias": None}
                replicas.append(torch.nn.Sequential(r, torch.nn.Tanh()))
            return replicas

        def parallel_apply(replicas, inputs, kwargs, devices=None):
            seen.append(p.lookup(w).state)
            try:  # held: the pool cannot take the module for this allocation
                p.alloc(60 << 20, tag="dp_hungry_t")
                seen.append("allocated")
            except MemoryError:
                seen.append("refused")
            return [r(*x, **k) for r, x, k in zip(replicas, inputs, kwargs)]

        dpm.scatter_kwargs, dpm.replicate, dpm.parallel_apply = scatter_kwargs, replicate, parallel_apply
        dpm.gather = lambda outputs, device, dim=0: torch.cat(outputs)
        dpm._get_available_device_type, dpm._get_device_index = lambda: "cpu", lambda d, optional=False: None
        h = gpupool.offloadable(model, "dp_t", pool=p)
        forms = (dp, lambda x: torch.nn.parallel.data_parallel(model, x, [0, 1]),
                 lambda x: torch.nn.parallel.data_parallel(model, (x,), device_ids=[0, 1]))
        for step in range(6):
            x = torch.linspace(-1, 1, 8 * 1024).view(8, 1024).mul(step + 1).requires_grad_()
            h.offload()
            assert p.lookup(w).state == "offloaded"
            out = forms[step % 3](x)
            assert seen[-2:] == ["used", "refused"], (step, seen)
            h.offload()  # (as pressure may, between the forward and the backward)
            out.square().sum().backward()
            xr = x.detach().clone().requires_grad_()
            ref(xr).square().sum().backward()
            assert torch.allclose(out, ref(x.detach()), atol=1e-5)
            assert torch.allclose(x.grad, xr.grad, atol=1e-4) and torch.allclose(lin.weight.grad, ref[0].weight.grad, atol=1e-3)
            assert h._holds == 0
        assert h.offload()["bytes"] == 4 << 20  # idle after: nothing left held
        # One device: both call the module itself, whose own hooks restore it.
        dp.device_ids = [0]
        assert torch.allclose(dp(torch.ones(2, 1024)), ref(torch.ones(2, 1024)), atol=1e-5)
        h.offload()
        assert torch.allclose(torch.nn.parallel.data_parallel(model, torch.ones(2, 1024), [0]), ref(torch.ones(2, 1024)), atol=1e-5)
        h.remove()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_ddp_holds_the_offloadable_modules_it_broadcasts(run_py) -> None:
    # DistributedDataParallel broadcasts its module's buffers before each
    # forward (broadcast_buffers=True, its default), before any hook of the
    # module runs: a BatchNorm's running statistics offloaded were read
    # unmapped there (a segfault here, the CUDA context lost on a GPU).
    # Its buffer sync now holds the offloadable modules whose buffers it
    # syncs, and its making (a broadcast of the module's parameters and
    # buffers) those of its module.  One rank of gloo on the CPU; the module
    # offloaded before DDP is made and before each forward trains as a
    # plain one, its running statistics too.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        import os
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=0, world_size=1)

        def model(stats):
            lin = torch.nn.Linear(1024, 1024, bias=False)
            bn = torch.nn.BatchNorm1d(1024, affine=False)
            bn.num_batches_tracked = None
            if stats:  # weights and statistics in the pool's memory
                lin.weight = torch.nn.Parameter(floats(1024 * 1024, "ddp_made_t", "low").view(1024, 1024))
                bn.running_mean = floats(1024, "ddp_made_t", "low")
                bn.running_var = floats(1024, "ddp_made_t", "low")
            with torch.no_grad():
                lin.weight.copy_(torch.linspace(-0.01, 0.01, 1024 * 1024).view(1024, 1024))
                bn.running_mean.zero_()
                bn.running_var.fill_(1.0)
            return torch.nn.Sequential(lin, bn)

        m, ref = model(True), model(False)
        h = gpupool.offloadable(m, "ddp_t", pool=p)
        mean = m[1].running_mean.data_ptr()
        h.offload()  # (DDP's making broadcasts the module's tensors too)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        assert ddp.will_sync_module_buffers() and h._holds == 0
        for step in range(3):
            x = torch.linspace(-1, 1, 16 * 1024).view(16, 1024).mul(step + 1)
            h.offload()
            assert p.lookup(mean).state == "offloaded"
            ddp(x).square().sum().backward()
            ref(x).square().sum().backward()
            assert h._holds == 0
        assert torch.allclose(m[1].running_mean, ref[1].running_mean, atol=1e-6)
        assert torch.allclose(m[1].running_var, ref[1].running_var, atol=1e-5)
        assert torch.allclose(m[0].weight.grad, ref[0].weight.grad, rtol=1e-4, atol=1e-4)
        assert h.offload()["bytes"] > 0  # idle after: nothing left held
        h.remove()
        dist.destroy_process_group()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_an_ema_holds_the_offloadable_module_it_averages(run_py) -> None:
    # torch.optim.swa_utils.AveragedModel (an EMA of the weights) reads the
    # model it averages in update_parameters, where no hook of the model
    # runs: offloaded (as the pool may take an idle module between steps),
    # it was read unmapped (a segfault here, the CUDA context lost on a
    # GPU).  update_parameters now holds it; the average is the plain one.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        m = torch.nn.Sequential(linear_over("ema_made_t", torch.full((1024, 1024), 1.0)))
        ref = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False))
        ref[0].weight = torch.nn.Parameter(torch.full((1024, 1024), 1.0), requires_grad=False)
        h = gpupool.offloadable(m, "ema_t", pool=p)
        ema = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.5))
        ema_ref = AveragedModel(ref, multi_avg_fn=get_ema_multi_avg_fn(0.5))
        assert not ema.module._forward_pre_hooks  # (the averaged copy is a plain module)
        w = m[0].weight.data_ptr()
        for step in range(3):
            with h.in_use():
                m[0].weight.add_(1.0)
            ref[0].weight.add_(1.0)
            h.offload()
            assert p.lookup(w).state == "offloaded"
            ema.update_parameters(m)
            ema_ref.update_parameters(model=ref)
            assert h._holds == 0
        assert torch.equal(ema.module[0].weight, ema_ref.module[0].weight)
        assert h.offload()["bytes"] == 4 << 20  # idle after: nothing left held
        h.remove()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_peft_merge_and_unload_hold_the_offloadable_module_they_merge_into(run_py) -> None:
    # PEFT's merge_adapter, unmerge_adapter and merge_and_unload (what a LoRA
    # fine-tune ends with) add each adapter's product to its base layer's
    # weight, where no hook of the module runs: an offloaded base layer was
    # read and written unmapped (a segfault here, the CUDA context lost on a
    # GPU).  Each layer is now held while PEFT merges it (its onload_layer),
    # and only that layer: merge_and_unload enters the model's root first,
    # whose hold would restore every layer at once.  The merged weights are
    # those of the same model without offload.
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    r = run_py(_FRESH + textwrap.dedent("""
        # (a module made offloadable before peft is imported: the next offloadable() wraps peft)
        early = gpupool.offloadable(linear_over("early_made_t", torch.ones(1024, 1024)), "early_t", pool=p)
        import peft

        def lora(base):
            torch.manual_seed(0)  # (the same adapter weights for both)
            return peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["0", "2"], init_lora_weights=False))

        bases = [torch.full((1024, 1024), 0.5), torch.full((1024, 1024), -0.25)]
        m = torch.nn.Sequential(linear_over("lora_made_t", bases[0]), torch.nn.Tanh(), linear_over("lora_made_t", bases[1]))
        ref = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Tanh(),
                                  torch.nn.Linear(1024, 1024, bias=False))
        for i in (0, 2):
            ref[i].weight = torch.nn.Parameter(bases[i // 2].clone(), requires_grad=False)
        ws = [m[i].weight.data_ptr() for i in (0, 2)]
        pm, pr = lora(m), lora(ref)
        layers, seen = [m[0], m[2]], []
        for i, layer in enumerate(layers):
            for t in (layer.lora_A["default"].weight, layer.lora_B["default"].weight):  # (the adapter in the pool too)
                t.data = floats(t.numel(), "lora_made_t", "low").view_as(t).copy_(t)
            # (what PEFT's merge reads first: the states of both layers' weights then)
            delta = layer.get_delta_weight
            layer.get_delta_weight = lambda name, i=i, delta=delta: (
                seen.append((i, [p.lookup(w).state for w in ws])), delta(name))[1]
        hs = [gpupool.offloadable(layer, f"lora{i}_t", pool=p) for i, layer in enumerate(layers)]
        x = torch.linspace(-1, 1, 4 * 1024).view(4, 1024)

        def offload():
            for h in hs:
                h.offload()
            assert [p.lookup(w).state for w in ws] == ["offloaded"] * 2
            seen.clear()

        for merge in ("merge_adapter", "unmerge_adapter"):
            offload()
            getattr(pm, merge)()
            getattr(pr, merge)()
            assert seen[0] == (0, ["used", "offloaded"]) and seen[1][0] == 1 and seen[1][1][1] == "used", (merge, seen)
            assert all(h._holds == 0 for h in hs)
            for i in (0, 2):
                assert torch.equal(m[i].base_layer.weight, ref[i].base_layer.weight), (merge, i)
            with torch.no_grad():
                assert torch.allclose(pm(x), pr(x), atol=1e-5)
        offload()
        merged, merged_ref = pm.merge_and_unload(safe_merge=True), pr.merge_and_unload(safe_merge=True)
        assert seen[0] == (0, ["used", "offloaded"]) and seen[1][1][1] == "used", seen
        assert all(h._holds == 0 for h in hs)
        for i in (0, 2):
            assert type(merged[i]) is torch.nn.Linear and not torch.equal(merged[i].weight, bases[i // 2])
            assert torch.equal(merged[i].weight, merged_ref[i].weight), i
        for h in hs:
            h.remove()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_resize_token_embeddings_holds_the_offloadable_embeddings_it_copies(run_py) -> None:
    # transformers' resize_token_embeddings copies the old embeddings into
    # new ones (and, by default, samples the new rows from their mean and
    # covariance), where no hook of the embedding runs: offloaded, they were
    # read unmapped (a segfault here, the CUDA context lost on a GPU).  It
    # now holds the offloadable modules of the input and output embeddings;
    # the resized model is that of the same model without offload.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    r = run_py(_FRESH + textwrap.dedent("""
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        torch.manual_seed(0)
        m = Qwen2ForCausalLM(cfg).eval()
        ref = copy.deepcopy(m)
        emb = m.get_input_embeddings()
        emb.weight = torch.nn.Parameter(floats(1000 * 64, "emb_made_t", "low").view(1000, 64).copy_(emb.weight))
        w = emb.weight.data_ptr()
        h = gpupool.offloadable(emb, "emb_t", pool=p)
        h.offload()
        assert p.lookup(w).state == "offloaded"
        for model in (m, ref):
            torch.manual_seed(1)  # (the same new rows for both)
            model.resize_token_embeddings(1100)
        assert h._holds == 0 and m.get_input_embeddings().weight.shape == (1100, 64)
        assert torch.equal(m.get_input_embeddings().weight, ref.get_input_embeddings().weight)
        assert torch.equal(m.get_output_embeddings().weight, ref.get_output_embeddings().weight)
        ids = torch.tensor([[1, 5, 1050, 1099]])
        with torch.no_grad():
            assert torch.equal(m(ids).logits, ref(ids).logits)
        h.remove()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_peft_and_transformers_imported_after_the_last_offloadable_module_hold_it(run_py) -> None:
    # A fine-tune may import PEFT only to merge, once training is done, and
    # a program may make its own modules offloadable before it imports
    # transformers.  The readers of both were wrapped at each offloadable()
    # only, so an import after the last one left PEFT's merge and
    # transformers' resize reading offloaded modules unmapped (a segfault
    # here, the CUDA context lost on a GPU).  They are now wrapped as the
    # module loads; the results are those of the same modules without offload.
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    r = run_py(_FRESH + textwrap.dedent("""
        import sys
        torch.manual_seed(0)
        emb = torch.nn.Embedding(1000, 64)
        emb.weight = torch.nn.Parameter(floats(1000 * 64, "late_emb_made_t", "low").view(1000, 64).copy_(emb.weight))
        w0 = torch.linspace(-1, 1, 1024 * 1024).view(1024, 1024)
        base = linear_over("late_lora_made_t", w0)
        ref_emb, ref_base = copy.deepcopy(emb), copy.deepcopy(base)
        hs = [gpupool.offloadable(emb, "late_emb_t", pool=p), gpupool.offloadable(base, "late_lora_t", pool=p)]
        assert not [n for n in sys.modules if n.split(".")[0] in ("peft", "transformers")]
        import peft
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        torch.manual_seed(1)
        m = Qwen2ForCausalLM(cfg).eval()
        ref = copy.deepcopy(m)
        m.set_input_embeddings(emb)
        ref.set_input_embeddings(ref_emb)
        hs[0].offload()
        assert p.lookup(emb.weight.data_ptr()).state == "offloaded"
        for model in (m, ref):
            torch.manual_seed(2)  # (the same new rows for both)
            model.resize_token_embeddings(1100)
        assert torch.equal(m.get_input_embeddings().weight, ref.get_input_embeddings().weight)

        def lora(layer):
            torch.manual_seed(3)  # (the same adapter weights for both)
            return peft.get_peft_model(torch.nn.Sequential(layer), peft.LoraConfig(
                r=4, target_modules=["0"], init_lora_weights=False))

        pm, pr = lora(base), lora(ref_base)
        hs[1].offload()
        assert p.lookup(base.weight.data_ptr()).state == "offloaded"
        merged, merged_ref = pm.merge_and_unload(), pr.merge_and_unload()
        assert torch.equal(merged[0].weight, merged_ref[0].weight)
        assert not torch.equal(merged[0].weight, w0)  # (the adapter was merged)
        assert all(h._holds == 0 for h in hs)
        for h in hs:
            h.remove()
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_the_readers_finder_twice_on_the_import_path_still_finds_the_module(run_py) -> None:
    # Two threads making their first offloadable modules at once could each
    # put the readers' finder on sys.meta_path, and a finder after it may
    # ask the import path for the same name again: each finder asked the
    # other, without end (RecursionError on import).  Now a finder skips
    # its kind and answers nothing for a name it is finding already.
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    r = run_py(_FRESH + textwrap.dedent("""
        import importlib.util, sys
        from gpupool import _offloadable

        class Asker:  # (a finder that asks the import path again, once, as some import hooks do)
            asking = False

            def find_spec(self, name, path=None, target=None):
                if name != "peft.tuners.tuners_utils" or self.asking:
                    return None
                self.asking = True
                try:
                    return importlib.util.find_spec(name)
                finally:
                    self.asking = False

        _offloadable._wrap_readers()
        sys.meta_path[1:1] = [_offloadable._ReaderImports(), Asker()]
        import peft.tuners.tuners_utils as tuners
        assert hasattr(tuners.onload_layer, "__wrapped__") and type(tuners.__loader__).__name__ == "SourceFileLoader"
        print("OK")
    """))
    assert "OK" in r.stdout, (r.stdout, r.stderr)


def test_module_apply_holds_an_offloadable_module_and_keeps_what_fn_keeps_apart(run_py) -> None:
    # Module.apply(fn) (a weight initialisation, a re-scaling) runs user
    # code over every submodule where no hook saw it: on an offloaded
    # module fn wrote unmapped memory (a segfault here, the CUDA context
    # lost on a GPU).  Now it runs with the module held resident; a tensor
    # fn puts in the module's place joins the tag after it, and one fn keeps
    # apart stays in the caller's tag (it must not leave with the module).
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        m = torch.nn.Sequential(linear_over("applied_made_t", torch.full((1024, 1024), 1.0)))
        h = gpupool.offloadable(m, "applied_t", pool=p)
        kept = []

        def rescale(mod):
            if isinstance(mod, torch.nn.Linear):
                with torch.no_grad():
                    mod.weight.mul_(3)
                kept.append(floats(1024).fill_(7))

        h.offload()
        m.apply(rescale)  # writes the offloaded weight
        assert bool((m[0].weight == 3.0).all())
        assert p.lookup(kept[0].data_ptr()).tag != "applied_t"

        def replace(mod):
            if isinstance(mod, torch.nn.Linear):
                mod.weight = torch.nn.Parameter(floats(1024 * 1024).view(1024, 1024).fill_(5), requires_grad=False)

        h.offload()
        first = m[0].weight.data_ptr()
        m.apply(replace)
        p.free(first)  # (what torch frees once nothing holds the old weight)
        w = m[0].weight.data_ptr()
        assert p.lookup(w).tag == "applied_t" and h.offload()["bytes"] == 4 << 20
        assert p.lookup(w).state == "offloaded" and p.lookup(kept[0].data_ptr()).state == "used"
        h.remove()
        assert "apply" not in vars(m) and bool((m[0].weight == 5.0).all())
        print("OK")
    """))
    assert "OK" in r.stdout


def test_an_offloadable_module_pickles_as_a_plain_one(run_py) -> None:
    # torch.save(model) pickles the module, hooks and all: the handle's
    # hooks and methods are functions pickle cannot name ("Can't pickle
    # local object"), and an offloaded module's tensors would be read where
    # no hook sees it (after the pickle is made, when torch.save writes
    # them).  Now the module, or one holding it, pickles as a plain module,
    # restored first and held while what pickling took of it lives.
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    r = run_py(_FRESH + textwrap.dedent("""
        import gc, numpy
        m = linear_over("pickled_made_t", torch.full((1024, 1024), 0.25))
        m.meta = {"scale": numpy.ones(2)}  # (a dict attribute whose values compare elementwise)
        h = gpupool.offloadable(m, "pickled_t", pool=p)
        w = m.weight.data_ptr()
        for obj in (m, torch.nn.Sequential(m)):
            h.offload()
            back = saved(obj)
            assert p.lookup(w).state == "used"
            plain = back if isinstance(back, torch.nn.Linear) else back[0]
            assert bool((plain.weight == 0.25).all()) and plain.weight.data_ptr() != w
            assert not plain._forward_pre_hooks and not plain._forward_hooks and not plain._state_dict_pre_hooks
            assert not {"_apply", "apply", "__deepcopy__", "__getstate__"} & set(vars(plain))
        assert len(m._forward_pre_hooks) == 1 and "__getstate__" in vars(m)
        c = copy.copy(m)
        assert not c._forward_pre_hooks and not {"_apply", "__getstate__"} & set(vars(c))

        # Held while the state lives: the pool does not take the module for
        # an allocation of a higher priority; after it, it may.
        state = m.__getstate__()
        try:
            p.alloc(60 << 20, tag="pickled_hog_t", priority="normal")
            raise AssertionError("the module was taken while its state lived")
        except MemoryError:
            pass
        del state
        gc.collect()
        hog = p.alloc(60 << 20, tag="pickled_hog_t", priority="normal")
        assert p.lookup(w).state == "offloaded"
        p.free(hog)
        h.remove()
        assert not m._forward_pre_hooks and "__getstate__" not in vars(m) and bool((m.weight == 0.25).all())
        print("OK")
    """))
    assert "OK" in r.stdout


def test_an_offloaded_optimizer_pickles_and_deep_copies_with_its_state(run_py) -> None:
    # torch.save(optimizer) and copy.deepcopy(optimizer) read the state
    # where no hook sees it: of an offloaded state, unmapped memory (a
    # segfault here, the CUDA context lost on a GPU).  Now the state is
    # restored first and held while what pickling took of it lives.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        w = torch.nn.Parameter(torch.zeros(1024, 1024))
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        buf = floats(1024 * 1024, "pickled_opt_made_t", "low").view(1024, 1024).fill_(0.75)
        opt.state[w] = {"momentum_buffer": buf}
        h = gpupool.offloadable(opt, "pickled_opt_t", pool=p)
        a = buf.data_ptr()
        h.offload()
        back = saved(opt)
        assert p.lookup(a).state == "used"
        got = next(iter(back.state.values()))["momentum_buffer"]
        assert bool((got == 0.75).all()) and got.data_ptr() != a and "__getstate__" not in vars(back)
        h.offload()
        c = copy.deepcopy(opt)
        got = next(iter(c.state.values()))["momentum_buffer"]
        assert bool((got == 0.75).all()) and got.data_ptr() != a and not c._optimizer_step_pre_hooks
        h.remove()
        assert "__getstate__" not in vars(opt)
        print("OK")
    """))
    assert "OK" in r.stdout


def test_a_deep_copy_of_an_offloaded_module_holds_it_and_the_copy_is_its_own(run_py) -> None:
    # copy.deepcopy (a reference model, an EMA) clones every tensor where no
    # hook sees it: of an offloaded module it read unmapped memory (a
    # segfault here), and the copy carried the hooks, whose forward then
    # restored the original.  Now the copy is made with the module held, and
    # on the copy the hooks do nothing; its conversions are plain.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        m = torch.nn.Sequential(linear_over("copied_made_t", torch.full((1024, 1024), 0.5)))
        a = m[0].weight.data_ptr()
        h = gpupool.offloadable(m, "copied_t", pool=p)
        h.offload()
        c = copy.deepcopy(m)
        assert bool((c[0].weight == 0.5).all()) and c[0].weight.data_ptr() != a
        assert p.lookup(a).state == "used" and not {"_apply", "__deepcopy__"} & set(vars(c))
        h.offload()
        with torch.no_grad():
            assert float(c(torch.ones(2, 1024)).sum()) == 2 * 1024 * 512.0
        sd = c.state_dict()
        c.double()
        assert p.lookup(a).state == "offloaded"  # (the copy's hooks left the original alone)
        with torch.no_grad():
            assert float(m(torch.ones(2, 1024)).sum()) == 2 * 1024 * 512.0  # the original's still work
        assert p.lookup(a).state == "used" and m[0].weight.dtype == torch.float32
        h.remove()
        assert not {"_apply", "__deepcopy__"} & set(vars(m))
        print("OK")
    """))
    assert "OK" in r.stdout


def test_code_compiled_before_a_module_was_made_offloadable_is_dropped(run_py) -> None:
    # torch.compile does not guard on module hooks: code compiled for a
    # module of the same structure before the hooks existed ran without them
    # and read the offloaded weights (a segfault here, the CUDA context lost
    # on a GPU).  offloadable() drops compiled code, with a warning.
    pytest.importorskip("torch")
    r = run_py(_FRESH + textwrap.dedent("""
        def seeded(seed):
            return torch.randn(1024, 1024, generator=torch.Generator().manual_seed(seed))

        x = torch.randn(4, 1024)
        torch.compile(linear_over("plain_t", seeded(0)), backend="eager")(x)  # compiled before any hook
        m = linear_over("compiled_made_t", seeded(1))
        want = m(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h = gpupool.offloadable(m, "compiled_t", pool=p)
            gpupool.offloadable(linear_over("second_made_t", seeded(2)), "second_t", pool=p)
        said = [w for w in caught if "torch.compiler.reset()" in str(w.message)]
        assert len(said) == 1 and said[0].filename == __file__, [str(w.message) for w in caught]
        h.offload()
        assert torch.equal(torch.compile(m, backend="eager")(x), want)
        assert p.lookup(m.weight.data_ptr()).state == "used"
        print("OK")
    """))
    assert "OK" in r.stdout


def test_offload_of_at_most_max_bytes_takes_the_first_blocks() -> None:
    p = pool()
    blocks = [p.alloc(4 * MiB, tag="part_t") for _ in range(4)]
    for i, b in enumerate(blocks):
        fill(b, 4 * MiB, 20 + i)
    order = sorted(blocks)
    info = gpupool.offload("part_t", codec="raw", max_bytes=6 * MiB, pool=p)
    # Whole blocks, in address order, until they hold max_bytes.
    assert info["bytes"] == 8 * MiB
    assert [p.lookup(b).state for b in order] == ["offloaded", "offloaded", "used", "used"]
    gpupool.offload("part_t", codec="raw", max_bytes=1, pool=p)  # the next one
    assert [p.lookup(b).state for b in order] == ["offloaded"] * 3 + ["used"]
    gpupool.restore("part_t", pool=p)
    assert all(p.lookup(b).state == "used" and same(b, 4 * MiB, 20 + i) for i, b in enumerate(blocks))
    with pytest.raises(ValueError, match="max_bytes"):
        gpupool.offload("part_t", max_bytes=0, pool=p)


class _FakeTensor:
    """An optimizer's state tensor over a block of a HostPool."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.addr, self.nbytes = addr, nbytes

    def data_ptr(self) -> int:
        return self.addr

    def numel(self) -> int:
        return self.nbytes // 4

    def element_size(self) -> int:
        return 4


@pytest.mark.parametrize("how", ["load_state_dict", "replaced"])
def test_a_state_loaded_from_a_checkpoint_joins_the_tag(how: str) -> None:
    # Going back to a checkpoint in the same process (load_state_dict)
    # replaces the optimizer's state with new tensors, as many as before,
    # allocated outside the tag.  They must join it: else the offload behind
    # every later step moves nothing, and under a cap the job runs out of
    # memory.  load_state_dict's hook takes them at once (the pool may then
    # offload them under pressure before the next step); state replaced by
    # other means joins at the next step.
    p = pool(codec="raw")
    tag = f"ckpt_opt_{how}_t"
    opt = _FakeOptimizer()
    h = gpupool.offloadable(opt, tag, offload_after_step=True, prefetch_at=None, pool=p)
    made = [p.alloc(4 * MiB, tag=tag) for _ in range(2)]
    opt.state = {i: {"exp_avg": _FakeTensor(a, 4 * MiB)} for i, a in enumerate(made)}
    opt.step()
    gpupool.restore(tag, pool=p)  # (waits for the background offload)
    loaded = [p.alloc(4 * MiB, tag="ckpt_load_t") for _ in range(2)]
    for i, a in enumerate(loaded):
        fill(a, 4 * MiB, 40 + i)
    state = {i: {"exp_avg": _FakeTensor(a, 4 * MiB)} for i, a in enumerate(loaded)}
    if how == "load_state_dict":
        opt.load_state_dict(state)
        assert [p.lookup(a).tag for a in loaded] == [tag] * 2
    else:
        opt.state = state
    for a in made:
        p.free(a)
    opt.step()
    gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
    assert [p.lookup(a).state for a in loaded] == ["offloaded"] * 2
    assert p.stats()["tags"][tag]["offloaded"] == 8 * MiB
    gpupool.restore(tag, pool=p)
    assert all(same(a, 4 * MiB, 40 + i) for i, a in enumerate(loaded))
    h.remove()
    assert not any(opt.hooks.values())


def test_under_a_limit_the_optimizer_offloads_only_the_part_the_limit_needs() -> None:
    # A fine-tune under a cap: behind the step only as much of the state
    # leaves as the step's peak (the activations, measured when the
    # prefetch starts in the backward pass) leaves no room for, with 1/16
    # of the limit spare; without a limit, all of it.
    for limit in ("64MiB", None):
        p = pool(256 * MiB, codec="raw", **({"limit": limit} if limit else {}))
        own = p.stats()["allocated"]  # (the offloader's checksums)
        if limit:
            # An earlier pressure offload, of another tag, is not one the
            # optimizer's part must make room for.
            low = p.alloc(40 * MiB, tag="cap_low_t", priority="low")
            p._pool.offload_register(tag_id("cap_low_t"), 0)
            p.free(p.alloc(40 * MiB, tag="cap_hungry_t"))
            assert p.stats()["offload"]["n_pressure"] == 1
            gpupool.restore("cap_low_t", pool=p)
            p._pool.offload_register(tag_id("cap_low_t"), -1)
            p.free(low)
        params = [_FakeParam(MiB) for _ in range(2)]
        opt = _FakeOptimizer(params)
        tag = f"cap_opt_{limit}_t"
        h = gpupool.offloadable(opt, tag, offload_after_step=True, prefetch_at=0.0, pool=p)
        state = [p.alloc(4 * MiB, tag=tag) for _ in range(4)]
        opt.state = {i: {"exp_avg": _FakeTensor(a, 4 * MiB)} for i, a in enumerate(state)}
        for step in range(3):
            opt.step()  # (the first makes the state: it joins the tag)
            gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
            away = p.stats()["tags"][tag]["offloaded"]
            if step == 0 or limit is None:
                assert away == 16 * MiB, (limit, step, away)
            else:
                # the rest peaks at 50 MiB: 50 + 16 + 64/16 - 64 = 6 MiB must go, two blocks
                assert away == 8 * MiB, (limit, step, away)
            acts = p.alloc(50 * MiB - own, tag="acts_cap_t")  # the forward's peak
            p.free(acts)
            params[0].grad_done()  # the backward pass: measured, then prefetched
            gpupool.restore(tag, pool=p)
        h.remove()


def test_under_a_limit_what_the_pool_took_under_pressure_leaves_behind_the_next_steps() -> None:
    # `allocated` does not show cache the limit counts and a trim cannot
    # give back (pieces of chunks between live blocks).  The part measured
    # from it then left too little room: the forward pass's largest request
    # found none, and the pool offloaded more of the state on the thread
    # that allocated, every step (the fp32 recipe at its cap: 28 ms, every
    # other step).  What it took beyond the measure is kept as a margin.
    p = pool(256 * MiB, codec="raw", limit="64MiB")
    own = p.stats()["allocated"]  # (the offloader's checksums)
    params = [_FakeParam(MiB)]
    opt = _FakeOptimizer(params)
    tag = "margin_opt_t"
    h = gpupool.offloadable(opt, tag, offload_after_step=True, prefetch_at=0.0, pool=p)
    state = [p.alloc(4 * MiB, tag=tag) for _ in range(4)]
    for i, a in enumerate(state):
        fill(a, 4 * MiB, 60 + i)
    opt.state = {i: {"exp_avg": _FakeTensor(a, 4 * MiB)} for i, a in enumerate(state)}
    pressed, behind = [], []
    for step in range(5):
        opt.step()
        gpupool.restore("nothing_t", pool=p)  # (waits for the background offload)
        behind.append(p.stats()["tags"][tag]["offloaded"])
        before = p.stats()["offload"]["n_pressure"]
        # The forward pass: 1.5 MiB blocks, every other one freed (half a
        # chunk of each hole cannot be given back), then its largest request.
        acts = [p.alloc(3 * MiB // 2, tag="margin_acts_t") for _ in range(20)]
        for a in acts[::2]:
            p.free(a)
        big = p.alloc(37 * MiB - own, tag="margin_big_t")
        pressed.append(p.stats()["offload"]["n_pressure"] - before)
        p.free(big)
        for a in acts[1::2]:
            p.free(a)
        params[0].grad_done()  # the backward pass: measured, then prefetched
        gpupool.restore(tag, pool=p)
    h.remove()
    assert all(same(a, 4 * MiB, 60 + i) for i, a in enumerate(state))
    # The first step takes all of it; the second finds the measure short
    # once; after that the part behind the step holds what was needed (the
    # pressure took the rest of the tag: all of it here), and nothing more
    # goes under pressure.
    assert sum(pressed[1:]) >= 1 and pressed[3:] == [0, 0], pressed
    assert all(b > behind[1] for b in behind[3:]), behind
    # The offload under pressure took no codec staging from the pool it
    # was relieving (it displaced the room the request waited for).
    assert p.stats()["tags"]["gpupool"]["allocated"] == own


def test_pressure_offloads_raw_where_the_pools_codec_cannot_run() -> None:
    # GPUPOOL_CODEC names a codec this machine lacks (ans on the host
    # backend, or on a GPU without nvCOMP), and an offload of another codec
    # has opened the staging: the pressure path offloaded with the pool's
    # codec, each tag's offload was refused, and the request ran out of
    # memory with idle memory of a lower priority in the pool.
    p = pool(256 * MiB, codec="ans", limit="128MiB")
    keep = p.alloc(2 * MiB, tag="codec_open_t")
    with pytest.raises(ValueError, match="ans needs a CUDA device"):
        gpupool.offload("codec_open_t", pool=p)
    gpupool.offload("codec_open_t", pool=p, codec="zstd")  # (the staging opens)
    gpupool.restore("codec_open_t", pool=p)
    low = p.alloc(40 * MiB, tag="codec_low_t", priority="low")
    fill(low, 40 * MiB, 7)
    p._pool.offload_register(tag_id("codec_low_t"), 0)
    p.free(p.alloc(60 * MiB, tag="codec_hungry_t"))  # (the staging holds 32 MiB of the limit)
    assert p.stats()["offload"]["n_pressure"] == 1
    assert p.stats()["tags"]["codec_low_t"]["offloaded"] == 40 * MiB
    gpupool.restore("codec_low_t", pool=p)
    assert same(low, 40 * MiB, 7)
    p._pool.offload_register(tag_id("codec_low_t"), -1)
    p.free(low)
    p.free(keep)


def test_snapshot_of_an_offloaded_pool() -> None:
    p = pool()
    p.alloc(4 * MiB, tag="snap_t")
    gpupool.offload("snap_t", pool=p)
    snap = p.snapshot()
    assert snap["segments"] is not None
    gpupool.restore("snap_t", pool=p)
    assert _C.tag_name(tag_id("snap_t")) == "snap_t"


def test_corrupt_host_copy_is_caught_and_memory_stays_offloaded() -> None:
    p = pool()
    a = p.alloc(8 * MiB, tag="crc_t")
    fill(a, 8 * MiB, 11)
    gpupool.offload("crc_t", pool=p)
    p._pool._offload_corrupt_for_test(tag_id("crc_t"))
    # (the device checksum, or the codec itself, finds it)
    with pytest.raises(RuntimeError, match="'crc_t'.*stays offloaded"):
        gpupool.restore("crc_t", pool=p)
    assert p.lookup(a).state == "offloaded"
    p._pool._offload_corrupt_for_test(tag_id("crc_t"))
    gpupool.restore("crc_t", pool=p)
    assert same(a, 8 * MiB, 11)


def test_compressed_offload_takes_fewer_host_bytes() -> None:
    if not gpupool.build_info()["zstd"]:
        pytest.skip("built without libzstd: the host codec is raw")
    import random
    import struct

    p = pool(512 * MiB)
    n = 24 * MiB
    a = p.alloc(n, tag="bf16_t")
    rng = random.Random(5)
    # bf16 N(0, 0.02): the high halves of float32 normals
    words = [struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, 0.02)))[0] >> 16 for _ in range(n // 2 // 64)]
    block = struct.pack(f"<{len(words)}H", *words)
    buf = (ctypes.c_ubyte * n).from_address(a)
    for off in range(0, n, len(block)):
        ctypes.memmove(ctypes.addressof(buf) + off, block, min(len(block), n - off))
    before = bytes(buf[: 1 << 20])
    info = gpupool.offload("bf16_t", dtype=2, pool=p)
    assert info["codec"] == "zstd" and info["host_bytes"] < 0.8 * info["copied"], info
    assert p.stats()["tags"]["bf16_t"]["host_bytes"] == info["host_bytes"]
    gpupool.restore("bf16_t", pool=p)
    assert bytes(buf[: 1 << 20]) == before


def test_lost_bytes_come_back_only_with_consent() -> None:
    # The second block's copy out fails, and the undo cannot map the first
    # block's chunks back: the offload stays offloaded and says what it
    # lost; a restore refuses to hand back those bytes unless told to.
    p = pool()
    addrs = [p.alloc(4 * MiB, tag="lost_t") for _ in range(3)]
    for i, a in enumerate(addrs):
        fill(a, 4 * MiB, i)
    p._pool._host_fail_for_test("copy", 2)
    p._pool._host_fail_for_test("map", 1, True)
    with pytest.raises(RuntimeError, match=r"stays offloaded and (\d+) bytes") as err:
        gpupool.offload("lost_t", codec="raw", pool=p)
    p._pool._host_fail_for_test("map", 0)
    lost = int(re.search(r"stays offloaded and (\d+) bytes", str(err.value)).group(1))
    assert lost == 8 * MiB
    with pytest.raises(RuntimeError, match="were lost.*accept_loss"):
        gpupool.restore("lost_t", pool=p)
    assert any(p.lookup(a).state == "offloaded" for a in addrs)
    gpupool.prefetch("lost_t", pool=p)  # (cannot consent: leaves it to the restore)
    with pytest.warns(RuntimeWarning, match="uninitialised"):
        info = gpupool.restore("lost_t", accept_loss=True, pool=p)
    assert info["lost"] == lost and all(p.lookup(a).state == "used" for a in addrs)
    # The block whose copy ran came back whole.
    assert same(addrs[0], 4 * MiB, 0)
    with pytest.raises(ValueError, match="no backend function 'nope'"):
        p._pool._host_fail_for_test("nope", 1)


def test_block_retagged_while_offloaded_comes_back_by_its_new_tag() -> None:
    p = pool()
    a = p.alloc(6 * MiB, tag="before_t")
    fill(a, 6 * MiB, 21)
    gpupool.offload("before_t", codec="raw", pool=p)
    p.retag([a], "after_t")
    info = gpupool.restore("after_t", pool=p)
    assert info["bytes"] == 6 * MiB and p.lookup(a).state == "used" and same(a, 6 * MiB, 21)


def test_graph_pool_memory_goes_with_its_tag() -> None:
    # A captured graph keeps the addresses of every block its capture
    # allocated, also of those freed inside the capture (their memory is
    # the graph's scratch).  Offloading the tag the capture allocated under
    # must give all of it back and map it again at the same addresses.
    p = pool()
    static = p.alloc(2 * MiB, tag="gstatic_t")
    fill(static, 2 * MiB, 1)
    p._pool.capture_prepare(1)
    p._pool.capture_begin(9, 1)
    out = p.alloc(3 * MiB, stream=1, tag="graph_t")  # an output the caller keeps
    scratch = p.alloc(4 * MiB, stream=1, tag="graph_t")
    p.free(scratch)  # freed inside the capture: still the graph's
    with pytest.raises(ValueError, match="captur"):  # a capture may not synchronise
        gpupool.offload("graph_t", pool=p)
    p._pool.capture_end(1)
    fill(out, 3 * MiB, 2)
    reserved = p.stats()["reserved"]
    info = gpupool.offload("graph_t", codec="raw", pool=p)
    assert p.lookup(out).state == "offloaded" and info["bytes"] >= 3 * MiB and info["kept"] == 0
    # The scratch's chunks left too (it is free: not copied), and the
    # output's: at least both blocks' whole inner chunks (1 MiB large chunks).
    assert info["released"] >= 7 * MiB and info["copied"] < 4 * MiB, info
    assert p.stats()["reserved"] == reserved - info["released"]
    assert [b.state for b in p.blocks() if b.addr == scratch] == ["free_offloaded"]
    p.check()
    back = gpupool.restore("graph_t", pool=p)
    assert back["bytes"] == info["bytes"] and p.stats()["reserved"] == reserved
    assert p.lookup(out).state == "used" and same(out, 3 * MiB, 2) and same(static, 2 * MiB, 1)
    # The scratch is mapped again and still the graph's: no allocation
    # outside the graph gets it until the graph is released.
    assert [b.state for b in p.blocks() if b.addr == scratch] == ["free"]
    assert all(p.alloc(4 * MiB, stream=s) != scratch for s in (1, 3))
    p.check()
    p._pool.capture_release(9)
    assert p.alloc(4 * MiB, stream=1) == scratch


def test_an_offload_of_a_graphs_memory_syncs_the_device() -> None:
    # An offload waits for a fence of the streams the pool knows, not for
    # the device; a graph replays on whatever stream its caller names, one
    # the pool may never have seen, so an offload that takes a graph's
    # memory syncs the device instead.
    p = pool()
    plain = p.alloc(2 * MiB, tag="plain_sync_t")
    p._pool.capture_prepare(1)
    p._pool.capture_begin(13, 1)
    g = p.alloc(3 * MiB, stream=1, tag="graph_sync_t")
    p._pool.capture_end(1)
    syncs = p.stats()["n_sync"]
    gpupool.offload("plain_sync_t", codec="raw", pool=p)
    assert p.lookup(plain).state == "offloaded" and p.stats()["n_sync"] == syncs
    gpupool.offload("graph_sync_t", codec="raw", pool=p)
    assert p.lookup(g).state == "offloaded" and p.stats()["n_sync"] == syncs + 1
    gpupool.restore(["plain_sync_t", "graph_sync_t"], pool=p)
    p.check()
    p._pool.capture_release(13)


def test_graph_pool_with_only_freed_memory_offloads() -> None:
    # A capture that freed everything it allocated (outputs copied into
    # static tensors): the tag has no live block, yet the graph's memory
    # must go and come back.
    p = pool()
    p._pool.capture_prepare(1)
    p._pool.capture_begin(11, 1)
    a = p.alloc(6 * MiB, stream=1, tag="graph_free_t")
    p.free(a)
    p._pool.capture_end(1)
    reserved = p.stats()["reserved"]
    info = gpupool.offload("graph_free_t", pool=p)
    assert info["bytes"] == 0 and info["released"] >= 6 * MiB and p.stats()["reserved"] == reserved - info["released"]
    assert p.stats()["tags"]["graph_free_t"]["offloaded"] == 0  # no live bytes away
    gpupool.restore("graph_free_t", pool=p)
    assert p.stats()["reserved"] == reserved
    assert [b.state for b in p.blocks() if b.addr == a] == ["free"]
    p.check()
    p._pool.capture_release(11)


def test_what_a_replay_restores_first() -> None:
    # A replay reads and writes its graph's memory at the capture's
    # addresses: the graph pool's tags are what it restores first once an
    # offload took any of that memory, its scratch alone included (a tag
    # whose every block was freed inside the capture), and only then.
    p = pool()
    p._pool.capture_prepare(1)
    p._pool.capture_begin(15, 1)
    out = p.alloc(3 * MiB, stream=1, tag="replay_out_t")
    scratch = p.alloc(4 * MiB, stream=1, tag="replay_scratch_t")
    p.free(scratch)
    p._pool.capture_end(1)
    fill(out, 3 * MiB, 5)
    other = p.alloc(2 * MiB, tag="replay_other_t")
    gpupool.offload("replay_other_t", pool=p)  # not the graph's
    assert p._pool.capture_away(15) == []
    for tag in ("replay_scratch_t", "replay_out_t"):
        gpupool.offload(tag, codec="raw", pool=p)
        away = p._pool.capture_away(15)
        assert sorted(away) == ["replay_out_t", "replay_scratch_t"], (tag, away)
        gpupool.restore(away, pool=p)
        assert p._pool.capture_away(15) == [] and same(out, 3 * MiB, 5)
        assert [b.state for b in p.blocks() if b.addr == scratch] == ["free"]
    assert p.lookup(other).state == "offloaded"
    p.check()
    with pytest.raises(ValueError, match="graph pool 16 is not live"):
        p._pool.capture_away(16)
    p._pool.capture_release(15)
    with pytest.raises(ValueError, match="not live"):
        p._pool.capture_away(15)


def settled(p: gpupool.HostPool, timeout: float = 30.0) -> dict:
    """The offloader's figures once background pinning has finished."""
    end = time.monotonic() + timeout
    while True:
        off = p._pool.offload_stats()
        if off["host_pinning"] == 0 or time.monotonic() > end:
            return off
        time.sleep(0.005)


def test_a_tag_made_offloadable_is_pinned_ahead_within_the_limit() -> None:
    p = pool(host_limit="96MiB")
    a = p.alloc(40 * MiB, tag="ahead_t")
    fill(a, 40 * MiB, 60)
    assert settled(p)["host_slabs"] == 0
    p._pool.offload_register(tag_id("ahead_t"), 0)
    off = settled(p)
    assert off["host_slabs"] == 64 * MiB and off["n_pin"] == 2, off  # 40 MiB in 32 MiB slabs
    gpupool.offload("ahead_t", codec="raw", pool=p)
    assert p._pool.offload_stats()["n_pin"] <= 3  # its slabs were ready (at most one grown ahead after)
    gpupool.restore("ahead_t", pool=p)
    assert same(a, 40 * MiB, 60)
    # More than the limit: pinned up to it, never past it.
    b = p.alloc(200 * MiB, tag="big_t")
    fill(b, 200 * MiB, 61)
    p._pool.offload_register(tag_id("big_t"), 0)
    off = settled(p)
    assert off["host_slabs"] == 96 * MiB and off["host_slabs"] + off["host_pinning"] <= off["host_limit"], off
    with pytest.raises(MemoryError, match="host limit"):
        gpupool.offload("big_t", codec="raw", pool=p)
    assert same(b, 200 * MiB, 61) and p.lookup(b).state == "used"
    p.check()


def test_host_reserve_is_pinned_at_start_and_checked_against_the_limit() -> None:
    p = pool(host_reserve="128MiB")
    off = settled(p)
    assert off["host_slabs"] == 128 * MiB and off["n_pin"] == 4, off
    a = p.alloc(60 * MiB, tag="res_t")
    fill(a, 60 * MiB, 62)
    gpupool.offload("res_t", codec="raw", pool=p)
    assert p._pool.offload_stats()["n_pin"] == 4  # the reserve's slabs
    gpupool.restore("res_t", pool=p)
    assert same(a, 60 * MiB, 62)
    with pytest.raises(ValueError, match=r"GPUPOOL_HOST_RESERVE=128MiB .* above GPUPOOL_HOST_LIMIT=64MiB"):
        gpupool.HostPool(256 * MiB, host_limit="64MiB", host_reserve="128MiB")
    # Destroyed while pinning its reserve: no hang, nothing left.
    for _ in range(3):
        q = pool(host_reserve="1GiB")
        del q


@pytest.mark.parametrize("fn", ["host_register", "host_populate"])
@pytest.mark.parametrize("ahead", [False, True])
def test_a_host_that_refuses_to_pin_leaves_the_offloader_working(fn: str, ahead: bool) -> None:
    p = pool(512 * MiB)
    a = p.alloc(70 * MiB, tag="refuse_t")
    fill(a, 70 * MiB, 63)
    # Once: whoever pins the slab next (the copy that needs it) pins it.
    p._pool._host_fail_for_test(fn, 1)
    if ahead:
        p._pool.offload_register(tag_id("refuse_t"), 0)
        settled(p)
    gpupool.offload("refuse_t", codec="raw", pool=p)
    gpupool.restore("refuse_t", pool=p)
    assert same(a, 70 * MiB, 63)
    # From now on: the offload fails undone, every byte in place.
    b = p.alloc(200 * MiB, tag="refuse2_t")  # (more than the slabs held: some must be pinned)
    fill(b, 200 * MiB, 64)
    p._pool._host_fail_for_test(fn, 1, True)
    with pytest.raises((RuntimeError, MemoryError), match="injected failure.*undone"):
        gpupool.offload("refuse2_t", codec="raw", pool=p)
    assert p.lookup(b).state == "used" and same(b, 200 * MiB, 64)
    p._pool._host_fail_for_test(fn, 0)
    gpupool.offload("refuse2_t", codec="raw", pool=p)
    gpupool.restore("refuse2_t", pool=p)
    assert same(b, 200 * MiB, 64) and same(a, 70 * MiB, 63)
    p.check()


def test_the_gather_counts_a_dtensor_as_held_by_the_state_alone(run_py) -> None:
    # A loaded state is copied into the tag only where the state alone
    # holds it (code that keeps a tensor elsewhere must go on seeing the
    # state's updates); a tensor that wraps others (FSDP2's DTensor) where
    # nothing else holds the wrapper nor the tensors it wraps.  The counts
    # a DTensor shows, as the state holds it, are those of the stand-in
    # the gather compares with; a reference to its local tensor or to it
    # shows.  (A CPU DTensor on a one-rank gloo group.)
    pytest.importorskip("torch")
    r = run_py("""
        import os, socket, torch
        import torch.distributed as dist
        from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
        from gpupool._offloadable import _Wraps, _refcounts

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
        dist.init_process_group("gloo", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        probe = {0: _Wraps()}
        v = probe[0]
        alone = _refcounts(v)[0]
        state = {"exp_avg": distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])}
        state["exp_avg_sq"] = state["exp_avg"].clone()
        for k in state:
            v = state[k]
            assert _refcounts(v)[0] == alone, (k, _refcounts(v)[0], alone)
        local = v.to_local()  # (other code that holds its local tensor)
        counts = _refcounts(v)[0]
        assert counts[0] == alone[0] and counts[1] > alone[1], (counts, alone)
        del local
        kept = v  # (other code that holds the DTensor itself)
        counts = _refcounts(v)[0]
        assert counts[0] > alone[0] and counts[1] == alone[1], (counts, alone)
        plain = {0: torch.zeros(3)}
        v = plain[0]
        assert _refcounts(v)[0] == alone[:1]
        dist.destroy_process_group()
        print("OK")
    """)
    assert "OK" in r.stdout


def test_blocks_moved_apart_leave_with_their_tag_alone() -> None:
    # The bindings offloadable() copies a module apart with: which blocks of
    # a tag share a mapping unit with other memory, blocks in units of their
    # own, and the hand-out's end, which frees the blocks no allocation took.
    p = pool()
    tid = tag_id("apart_t")
    a = p.alloc(300 * 1024, tag="apart_t")
    b = p.alloc(300 * 1024, tag="apart_other")
    assert p._pool.tag_mixed(tid) == ([a], 0)
    ptrs = p._pool.apart_begin([300 * 1024, 200 * 1024], tid, priority_value("low"), 0)
    assert len(ptrs) == 2 and ptrs[1] == ptrs[0] + 300 * 1024
    blocks = {x.addr: x for x in p.blocks()}
    assert blocks[ptrs[0]].tag == "apart_t" and blocks[ptrs[0]].priority == priority_value("low")
    with pytest.raises(RuntimeError, match="apart_end first"):
        p._pool.apart_begin([512], tid, 0, 0)
    fill(ptrs[0], 300 * 1024, 5)
    p.free(a)
    assert p._pool.tag_mixed(tid) == ([], 0)
    info = gpupool.offload("apart_t", codec="raw", pool=p)
    assert info["kept"] == 0 and info["released"] == 512 * 1024, info  # (the 256 KiB units of the small arena)
    gpupool.restore("apart_t", pool=p)
    assert same(ptrs[0], 300 * 1024, 5)
    # No allocation of the pool's device took them (a HostPool has none):
    # the end frees both.
    assert p._pool.apart_end() == 0
    assert p.stats()["tags"].get("apart_t", {}).get("allocated", 0) == 0
    with pytest.raises(RuntimeError, match="hands out no blocks"):
        p._pool.apart_end()
    with pytest.raises(ValueError, match="1..1048576 sizes"):
        p._pool.apart_begin([], tid, 0, 0)
    with pytest.raises(MemoryError, match="apart"):
        p._pool.apart_begin([1 << 50], tid, 0, 0)
    with pytest.raises(ValueError, match="never interned"):
        p._pool.tag_mixed(60000)
    p.free(b)
    p.check()  # (raises when the pool is inconsistent)
