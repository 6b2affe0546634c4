"""GPU tests (marked gpu) of the allocator core's hardening (issue 14) on a
real device: a hopeless request fails from the driver's figures without
mapping, pending record_stream blocks are given back by empty_cache, a trim
waits for the pool's streams and not the device, and a forked child gets a
clear error from its parent's pool.  Each body runs in its own process
(conftest.run_py)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_hopeless_request_maps_nothing(run_py) -> None:
    # More than the device has free: gpupool used to map 64 MiB units up to
    # the device's capacity, unmap them all, and do so three times.
    run_py("""
    import time, torch, gpupool
    gpupool.enable()
    keep = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    free, total = torch.cuda.mem_get_info()
    s0 = gpupool.stats()
    t = time.perf_counter()
    try:
        torch.empty(free + (1 << 30), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        assert "device lacks" in str(e), str(e)
    else:
        raise SystemExit("no OOM")
    dt = time.perf_counter() - t
    s1 = gpupool.stats()
    assert s1["n_map"] == s0["n_map"] and s1["n_map_fail"] == s0["n_map_fail"], (s0, s1)
    assert s1["reserved"] == s0["reserved"], (s0, s1)
    print(f"hopeless request failed in {dt * 1e3:.2f} ms")
    assert dt < 0.5, dt
    # What fits still fits.
    x = torch.ones(free // 2, dtype=torch.uint8, device="cuda")
    assert int(x[-4096:].sum()) == 4096 and int(keep[-4096:].sum()) == 4096
    """)


def test_empty_cache_frees_pending_blocks(run_py) -> None:
    # The only cache is a block waiting for a record_stream stream:
    # empty_cache synchronises and gives it back.
    run_py("""
    import torch, gpupool
    gpupool.enable()
    s = torch.cuda.Stream()
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        x.add_(1)
    x.record_stream(s)
    del x
    st = gpupool.stats()
    assert st["pending"] == 256 << 20 and st["allocated"] == 0, st
    freed = gpupool.empty_cache()
    st = gpupool.stats()
    assert freed >= 256 << 20 and st["pending"] == 0 and st["reserved"] < 8 << 20, (freed, st)
    """)


def test_trim_does_not_wait_for_other_streams(run_py) -> None:
    # A trim waits for the streams the pool knows (the last users of its
    # cache), not for the device: work on a stream that allocates nothing
    # from the pool (the offloader's copies beside a training step, a
    # user's copier) runs on.  It used to be a device sync, under the lock.
    run_py("""
    import torch, gpupool
    gpupool.enable()
    other = torch.cuda.Stream()
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x
    with torch.cuda.stream(other):
        torch.cuda._sleep(4_000_000_000)  # about 2 s; allocates nothing
    s0 = gpupool.stats()
    freed = gpupool.empty_cache()
    busy = not other.query()
    s1 = gpupool.stats()
    other.synchronize()
    assert freed >= 256 << 20, (freed, s1)
    assert busy, "empty_cache waited for a stream that holds none of the pool's memory"
    assert s1["n_sync"] == s0["n_sync"] and s1["n_sync_pool"] == s0["n_sync_pool"] + 1, (s0, s1)
    """)


def test_forked_child_gets_a_clear_error(run_py) -> None:
    r = run_py("""
    import os, torch, gpupool
    gpupool.enable()
    x = torch.ones(1 << 20, device="cuda")
    pool = gpupool.device_pool(0)
    pid = os.fork()
    if pid == 0:
        try:
            pool._pool.alloc(4096)
        except ValueError as e:
            print("child:", e, flush=True)
            os._exit(0 if "forked child" in str(e) and "spawn" in str(e) else 1)
        os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    y = x * 2  # the parent's pool is its own
    assert float(y.sum()) == 2 * (1 << 20)
    """, timeout=120)
    assert "belongs to process" in r.stdout
