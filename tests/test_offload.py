"""Offload through the Python API on a HostPool (no GPU needed): addresses
and bytes survive, figures and reports know offloaded memory, failures are
clean, and the pressure path offloads idle lower-priority tags only."""
from __future__ import annotations

import ctypes

import pytest

import gpupool
from gpupool import _C
from gpupool._context import tag_id

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
    info = gpupool.offload("weights_t", pool=p)
    assert set(info) >= {"bytes", "host_bytes", "seconds", "codec", "copied", "released", "kept"}
    assert info["codec"] == "raw" and info["bytes"] > 0 and info["seconds"] > 0
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
    with pytest.raises(RuntimeError, match="checksum.*'crc_t'|'crc_t'.*checksum"):
        gpupool.restore("crc_t", pool=p)
    assert p.lookup(a).state == "offloaded"
    p._pool._offload_corrupt_for_test(tag_id("crc_t"))
    gpupool.restore("crc_t", pool=p)
    assert same(a, 8 * MiB, 11)
