"""Soak on the host backend (no GPU, no torch): a tag of mixed sizes goes
out and comes back 200 times, every byte checked each cycle, and nothing
the process holds may grow after the second cycle -- reserved memory,
pinned host slabs, open file descriptors and threads exactly flat, RSS
within a small bound.  The GPU's version (1,000 cycles of 1 GiB with an
offloadable module) is `python -m benchmarks --only soak`."""
from __future__ import annotations

import ctypes
import os
import random
import time
from typing import Dict, List, Tuple

import gpupool

MiB = 2**20
CYCLES = 200
# Large enough that a leak of one pinned slab (32 MiB) or of a block per
# cycle shows, small enough for well under a minute on 2 cores.
TAG_BYTES = 12 * MiB
# RSS moves a little with the Python heap and the C allocator's arenas; a
# leak of a piece's host copy per cycle would add at least 1 KiB x 200.
RSS_SLACK = 2 * MiB

_libc = ctypes.CDLL(None)
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def figures(p: gpupool.HostPool) -> Dict[str, int]:
    """What the process holds, once the slabs queued to be pinned in the
    background by then are pinned (on a loaded machine that can take a
    while, and a slab still queued counts in neither host_slabs nor RSS)."""
    deadline = time.monotonic() + 60
    while p._pool.offload_stats(False)["host_pinning"] and time.monotonic() < deadline:
        time.sleep(0.01)
    off = p._pool.offload_stats(False)
    assert not off["host_pinning"], f"slabs still being pinned after 60 s: {off}"
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"reserved": p.stats()["reserved"], "host_slabs": off["host_slabs"],
            "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "rss": rss}


WORK = (4096, 300 * 1024, 3 * MiB, 4096, 3 * MiB, 300 * 1024, 1000)


def cycle(p: gpupool.HostPool, i: int) -> None:
    """One offload/restore, in one of the ways a program makes them."""
    codec = ("raw", "auto")[i % 2]
    how = i % 4
    if how == 0:
        gpupool.offload("soak_t", codec=codec, pool=p)
        gpupool.restore("soak_t", pool=p)
    elif how == 1:  # behind the caller's back, as offload_after_step does
        gpupool.offload("soak_t", codec=codec, wait=False, pool=p)
        gpupool.restore("soak_t", pool=p)
    elif how == 2:
        gpupool.offload("soak_t", codec=codec, pool=p)
        gpupool.prefetch("soak_t", pool=p)
        gpupool.restore("soak_t", pool=p)
    else:
        with gpupool.offloaded("soak_t", codec=codec, pool=p):
            pass
    # Work between cycles: short-lived memory of another tag comes and goes
    # (the same each cycle: a cycle asking more than the last would rightly
    # map more).
    work = [p.alloc(n, tag="soak_work_t") for n in WORK]
    for a in work:
        p.free(a)


def test_offload_soak_is_flat_and_exact() -> None:
    rng = random.Random(1)
    p = gpupool.HostPool(128 * MiB, chunk="256KiB", large_chunk="1MiB")
    p._pool.offload_stats(True)
    # Mixed sizes, 1 KiB .. 2 MiB (log-uniform), random bytes.
    blocks: List[Tuple[int, ctypes.Array]] = []
    total = 0
    while total < TAG_BYTES:
        n = int(2 ** rng.uniform(10, 21))
        ref = ctypes.create_string_buffer(rng.randbytes(n), n)
        a = p.alloc(n, tag="soak_t")
        ctypes.memmove(a, ref, n)
        blocks.append((a, ref))
        total += n
    at: Dict[int, Dict[str, int]] = {}
    for i in range(1, CYCLES + 1):
        cycle(p, i)
        bad = [a for a, ref in blocks if _libc.memcmp(a, ref, len(ref)) != 0]
        assert not bad, f"cycle {i}: {len(bad)} of {len(blocks)} blocks came back different"
        if i in (2, CYCLES) or i % 50 == 0:
            at[i] = figures(p)
    p.check()
    first, last = at[2], at[CYCLES]
    for k in ("reserved", "host_slabs", "fds", "threads"):
        assert [f[k] for f in at.values()] == [first[k]] * len(at), (k, at)
    assert last["rss"] - first["rss"] <= RSS_SLACK, at
    assert p.stats()["offload"]["n_offload"] == CYCLES and p.stats()["offload"]["n_restore"] >= CYCLES
