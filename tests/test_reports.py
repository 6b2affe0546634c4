"""Memory reports (issue 6) on the host backend: stats identities, the report
table, the history and snapshots in PyTorch's format (and memory_viz reading
them when torch is installed), plots (with matplotlib), the CLI and its
errors, the option table and malformed values of every option.  GPU tests
(marked gpu) do the same after a real training step."""
from __future__ import annotations

import io
import os
import pickle
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import gpupool
from conftest import ROOT, child_env
from gpupool import _C
from gpupool.__main__ import options_markdown

MiB = 1 << 20
S1, S2 = 0x1000, 0x2000


def workload(p: gpupool.HostPool, steps: int = 200, tags: int = 50, seed: int = 7,
             used: Any = None) -> List[int]:
    """Random allocations and frees under `tags` tags, two streams, a few
    priorities; returns the live addresses (and adds the tags to `used`)."""
    rng = random.Random(seed)
    live: List[int] = []
    used = set() if used is None else used
    for i in range(steps):
        if live and rng.random() < 0.45:
            p.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([512, 4096, 100_000, 3 * MiB, 9 * MiB + 123])
            tag = f"t{rng.randrange(tags)}"
            used.add(tag)
            live.append(p.alloc(size, stream=rng.choice([0, S1]), tag=tag,
                                priority=rng.choice(["low", "normal", "high"])))
        if i % 97 == 96:
            p.empty_cache()
    return live


def mapped_runs(blocks: List[gpupool.Block]) -> int:
    runs, end, arena = 0, -1, ""
    for b in blocks:
        if b.state != "unmapped" and (b.addr != end or b.arena != arena):
            runs += 1
        end, arena = (b.addr + b.size, b.arena) if b.state != "unmapped" else (-1, "")
    return runs


# ------------------------------------------------------------------ stats


def test_stats_identities() -> None:
    p = gpupool.HostPool(1 << 30)
    tags: set = set()
    live = workload(p, used=tags)
    s = p.stats()
    blocks = p.blocks()
    used = [b for b in blocks if b.state == "used"]
    free = [b for b in blocks if b.state == "free"]
    assert s["allocated"] == sum(b.size for b in used) > 0
    assert s["requested"] == sum(b.requested for b in used)
    assert s["active_blocks"] == len(used) == len(live) == s["n_alloc"] - s["n_free"]
    assert s["allocated"] == sum(t["allocated"] for t in s["tags"].values())
    assert s["allocated"] == sum(v["allocated"] for v in s["priorities"].values())
    pending = [b for b in blocks if b.state == "pending"]
    assert s["reserved"] == s["allocated"] + sum(b.size for b in free + pending)
    assert s["active"] == s["allocated"] + s["pending"]
    assert s["largest_free"] == max(b.size for b in free)
    assert s["free_blocks"] == len(free)
    assert s["segments"] == mapped_runs(blocks)
    assert s["fragmentation"] == pytest.approx(1 - s["largest_free"] / s["free_bytes"])
    assert s["cache_hit_rate"] == pytest.approx(s["cache_hits"] / s["n_alloc"])
    assert s["driver_calls"] == s["n_map"] + s["n_unmap"] + s["n_sync"] + s["n_sync_pool"] > 0
    assert s["allocated_peak"] >= s["allocated"] and s["reserved_peak"] >= s["reserved"]
    assert all(t["allocated_peak"] <= s["allocated_peak"] for t in s["tags"].values())
    assert set(s["tags"]) == tags and len(tags) > 40 and s["offloaded"] == 0
    assert s["history"] == {"max_entries": 0, "len": 0, "recorded": 0, "stacks": False}
    p.reset_peak_stats()
    r = p.stats()
    assert r["allocated_peak"] == r["allocated"] and r["reserved_peak"] == r["reserved"]
    assert all(t["allocated_peak"] == t["allocated"] for t in r["tags"].values())


def test_stats_is_cheap_enough_for_every_step() -> None:
    """~50 tags, a few hundred blocks: stats() is timed (printed with -s) and
    must stay far below a training step (a generous bound, not a benchmark)."""
    p = gpupool.HostPool(1 << 30)
    workload(p, steps=600)
    p.stats()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        p.stats()
    us = (time.perf_counter() - t0) / n * 1e6
    print(f"stats(): {us:.1f} us per call, {len(p.blocks())} blocks, {len(p.stats()['tags'])} tags")
    assert us < 2000


# ------------------------------------------------------------------ report


def test_report_table() -> None:
    p = gpupool.HostPool(1 << 30)
    a = p.alloc(300 * MiB, tag="weights", priority="high")
    b = p.alloc(3 * MiB, tag="activations")
    p.free(b)
    p.record_history(max_entries=10)
    text = p.report()
    lines = text.splitlines()
    assert lines[0].startswith("gpupool host:")
    assert "300.00 MiB" in text and "1.00 GiB" in text  # sizes readable, device size in GiB
    tag_rows = [ln for ln in lines if ln.startswith(("weights", "activations"))]
    # By peak: weights first, with its peak and its share of the pool's peak.
    assert tag_rows[0].split()[:3] == ["weights", "300.00", "MiB"]
    assert tag_rows[1].split()[1:5] == ["0", "B", "3.00", "MiB"]
    assert any(ln.startswith("high") and "300.00 MiB" in ln for ln in lines)
    assert "history: 0 of 10 events kept" in text
    assert "fragmentation" in text and "driver calls" in text
    p.free(a)


def test_report_to_file(monkeypatch: pytest.MonkeyPatch) -> None:
    p = gpupool.HostPool(1 << 30)
    p.alloc(5 * MiB, tag="kv_cache")
    monkeypatch.setattr(gpupool, "device_pool", lambda device=None: p)
    buf = io.StringIO()
    text = gpupool.report(file=buf)
    assert buf.getvalue() == text + "\n" and "kv_cache" in text


# ------------------------------------------------------- history, snapshot


def _named_workload(p: gpupool.HostPool) -> Dict[str, int]:
    """A workload with every kind of event: allocs on two streams, a free
    held by record_stream, trims (unmaps), an OOM."""
    keep = p.alloc(2 * MiB, tag="weights")
    tmp = [p.alloc(s, stream=S1, tag="acts") for s in (4096, 6 * MiB, 700_000)]
    held = p.alloc(8192, stream=S1, tag="acts")
    for x in tmp:
        p.free(x)
    p.empty_cache()
    with pytest.raises(MemoryError):
        p.alloc(1 << 40, tag="huge")
    # Pending until S2's work completes: the next device sync, on the host
    # backend (which the steps above would have made).
    p._pool.record_stream(held, S2)
    p.free(held)
    assert p.stats()["pending"] == 8192
    return {"keep": keep, "held": held}


def test_history_events() -> None:
    p = gpupool.HostPool(256 * MiB)
    p.record_history(max_entries=1000)
    t_before = time.time()
    addrs = _named_workload(p)
    ev = p.snapshot()["device_traces"][0]
    actions = [e["action"] for e in ev]
    assert set(actions) == {"alloc", "free_requested", "free_completed", "segment_map",
                            "segment_unmap", "oom"}
    assert actions.count("alloc") == 5 and actions.count("free_requested") == 4
    assert actions.count("free_completed") == 3  # the held block is still pending
    assert all(t_before - 1 <= e["time_us"] / 1e6 <= time.time() + 1 for e in ev)
    assert [e["time_us"] for e in ev] == sorted(e["time_us"] for e in ev)
    oom = ev[actions.index("oom")]
    assert oom["size"] == 1 << 40 and oom["tag"] == "huge" and 0 <= oom["device_free"] <= 256 * MiB
    first = ev[actions.index("alloc")]
    assert first["addr"] == addrs["keep"] and first["tag"] == "weights" and first["stream"] == 0
    # Python stacks, innermost first: this test's helper made the allocation.
    names = [f["name"] for f in first["frames"]]
    assert "_named_workload" in names and "test_history_events" in names
    assert names.index("_named_workload") < names.index("test_history_events")
    assert all({"filename", "line", "name"} <= set(f) for e in ev for f in e["frames"])


def test_history_ring_stacks_and_off() -> None:
    p = gpupool.HostPool(256 * MiB)
    p.record_history(max_entries=8, stacks=False)
    for _ in range(20):
        p.free(p.alloc(4096))
    h = p.stats()["history"]
    assert h == {"max_entries": 8, "len": 8, "recorded": 1 + 20 * 3, "stacks": False}
    ev = p.snapshot()["device_traces"][0]
    assert len(ev) == 8 and all(e["frames"] == [] for e in ev)
    assert ev[-1]["action"] == "free_completed"
    p.record_history(enabled=False)
    assert p.snapshot()["device_traces"] == [[]]
    assert p.stats()["history"]["max_entries"] == 0
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_entries"):
            p.record_history(max_entries=bad)
    q = gpupool.HostPool(256 * MiB, trace=True)  # GPUPOOL_TRACE as a keyword
    assert q.stats()["history"] == {"max_entries": _C.HISTORY_DEFAULT, "len": 0, "recorded": 0,
                                    "stacks": True}


def check_snapshot(snap: Dict[str, Any], device: int, stats: Dict[str, Any]) -> None:
    """The structure of torch.cuda.memory._snapshot(), and the invariants
    memory_viz relies on."""
    assert {"segments", "device_traces", "allocator_settings"} <= set(snap)
    assert len(snap["device_traces"]) == device + 1
    segs = [s for s in snap["segments"] if s["device"] == device]
    assert sum(s["total_size"] for s in segs) == stats["reserved"]
    assert sum(s["allocated_size"] for s in segs) == stats["allocated"]
    assert sum(s["requested_size"] for s in segs) == stats["requested"]
    for s in segs:
        assert set(s) >= {"device", "address", "total_size", "allocated_size", "active_size",
                          "requested_size", "stream", "segment_type", "segment_pool_id",
                          "is_expandable", "frames", "blocks"}
        assert s["segment_type"] in ("small", "large") and s["stream"] == 0
        addr = s["address"]
        for b in s["blocks"]:  # blocks tile the segment, in address order
            assert b["address"] == addr and b["size"] > 0
            assert b["state"] in ("active_allocated", "inactive", "active_pending_free")
            assert set(b) >= {"address", "size", "requested_size", "state", "frames"}
            assert b["requested_size"] <= b["size"]
            addr += b["size"]
        assert addr == s["address"] + s["total_size"]
        assert s["active_size"] == sum(b["size"] for b in s["blocks"] if b["state"] != "inactive")
    # Segments are maximal: none ends where the next starts in the same arena.
    ordered = sorted(segs, key=lambda s: s["address"])
    assert all(a["address"] + a["total_size"] != b["address"] or a["segment_type"] != b["segment_type"]
               for a, b in zip(ordered, ordered[1:]))
    replay_like_memory_viz(snap, device)


def replay_like_memory_viz(snap: Dict[str, Any], device: int) -> None:
    """What MemoryViz.js (MemoryView.simulate_memory) does to show the state
    before each event: walk the trace backwards from the snapshot's state,
    un-mapping and re-mapping segment ranges and un-allocating blocks.  It
    fails (in the browser, on an undefined segment or block) unless every
    map lies inside a segment of the state after it, every block inside a
    segment, and every free names a block -- checked here."""
    segs = sorted([[s["address"], s["total_size"]] for s in snap["segments"]
                   if s["device"] == device])
    blocks = {b["address"]: [b["size"], b["state"] == "active_pending_free"]
              for s in snap["segments"] if s["device"] == device for b in s["blocks"]
              if b["state"] in ("active_allocated", "active_pending_free")}

    def inside(addr: int, size: int) -> int:
        for i, (a, n) in enumerate(segs):
            if a <= addr and addr + size <= a + n:
                return i
        raise AssertionError(f"range {addr:#x}+{size} is in no segment")

    for e in reversed(snap["device_traces"][device]):
        a = e["action"]
        if a == "segment_map":  # before it, the range was not mapped
            i = inside(e["addr"], e["size"])
            s0, n0 = segs.pop(i)
            if e["addr"] > s0:
                segs.append([s0, e["addr"] - s0])
            if e["addr"] + e["size"] < s0 + n0:
                segs.append([e["addr"] + e["size"], s0 + n0 - e["addr"] - e["size"]])
        elif a == "segment_unmap":  # before it, the range was mapped: merge
            segs.append([e["addr"], e["size"]])
            segs.sort()
            merged: List[List[int]] = []
            for s in segs:
                if merged and merged[-1][0] + merged[-1][1] == s[0]:
                    merged[-1][1] += s[1]
                else:
                    merged.append(s)
            segs = merged
        elif a == "alloc":
            assert e["addr"] in blocks, f"alloc of {e['addr']:#x}, live after it, is not"
            del blocks[e["addr"]]
        elif a == "free_completed":
            assert e["addr"] not in blocks
            blocks[e["addr"]] = [e["size"], True]
        elif a == "free_requested":
            assert blocks[e["addr"]][1], "free_requested of a block not freed after it"
            blocks[e["addr"]][1] = False
        segs.sort()
        for addr, (size, _) in blocks.items():
            inside(addr, size)


def test_snapshot_structure() -> None:
    p = gpupool.HostPool(256 * MiB)
    p.record_history(max_entries=100_000)
    addrs = _named_workload(p)
    snap = p.snapshot()
    check_snapshot(snap, 0, p.stats())
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    held = blocks[addrs["held"]]
    assert held["state"] == "active_pending_free" and held["tag"] == "acts"
    live = workload(p, steps=300, tags=5)  # its trims complete the pending free
    snap = p.snapshot()
    check_snapshot(snap, 0, p.stats())
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    keep = blocks[addrs["keep"]]
    assert keep["state"] == "active_allocated" and keep["tag"] == "weights"
    assert keep["requested_size"] == 2 * MiB and keep["priority"] == 1 and keep["stream"] == 0
    assert "_named_workload" in [f["name"] for f in keep["frames"]]
    assert all(blocks[a]["state"] == "active_allocated" for a in live)
    assert snap["allocator_settings"]["expandable_segments"] is True
    # Filed under another device index; a dropped ring still replays.
    p.record_history(max_entries=50)
    check_snapshot(p.snapshot(device=2), 2, p.stats())


def test_snapshot_reserve_mode() -> None:
    p = gpupool.HostPool(256 * MiB, mode="reserve", reserve="64MiB", trace=True)
    x = p.alloc(5 * MiB, tag="kv_cache")
    snap = p.snapshot()
    check_snapshot(snap, 0, p.stats())
    assert snap["allocator_settings"]["expandable_segments"] is False
    assert [e["action"] for e in snap["device_traces"][0]][0] == "segment_map"
    p.free(x)


def test_memory_viz_reads_it(tmp_path: Path) -> None:
    mv = pytest.importorskip("torch.cuda._memory_viz")
    p = gpupool.HostPool(256 * MiB)
    p.record_history()
    _named_workload(p)
    workload(p, steps=200, tags=6)
    path = tmp_path / "snap.pickle"
    with open(path, "wb") as f:
        pickle.dump(p.snapshot(), f)
    snap = pickle.load(open(path, "rb"))
    s = p.stats()
    summary = mv.segsum(snap)  # asserts free + allocated == reserved itself
    assert f"segments: {len(snap['segments'])}" in summary
    text = mv.trace(snap)
    assert f"{len(snap['device_traces'][0])} entries" in text and "raise OutOfMemoryError" in text
    ident = lambda lines: lines  # noqa: E731 - flamegraph input, not the SVG
    flame = mv.segments(snap, format_flamegraph=ident)
    assert sum(int(ln.rsplit(" ", 1)[1]) for ln in flame.splitlines()) == s["reserved"]
    assert "_named_workload" in mv.memory(snap, format_flamegraph=ident)
    for html in (mv.trace_plot(snap), mv.trace_plot(snap, plot_segments=True), mv.segment_plot(snap)):
        assert "MemoryViz.js" in html and len(html) > 1000


# ------------------------------------------------------------------- plots


def _plotted_pool() -> gpupool.HostPool:
    p = gpupool.HostPool(512 * MiB)
    p.record_history()
    w = p.alloc(64 * MiB, tag="weights")
    for step in range(5):
        acts = [p.alloc((step + 1) * 4 * MiB, tag="activations") for _ in range(6)]
        g = p.alloc(64 * MiB, tag="gradients")
        for a in acts:
            p.free(a)
        p.free(g)
    with pytest.raises(MemoryError):
        p.alloc(1 << 40, tag="activations")
    p._pool.history_note(6, w, 64 * MiB, _C.tag_intern("weights"), 1)  # an offload
    return p


def test_timeline_levels() -> None:
    from gpupool._plot import timeline

    p = _plotted_pool()
    s = p.stats()
    tl = timeline(p.snapshot())
    assert tl["allocated"][-1] == s["allocated"] and max(tl["allocated"]) == s["allocated_peak"]
    assert tl["reserved"][-1] == s["reserved"] and max(tl["reserved"]) == s["reserved_peak"]
    assert max(tl["tags"]["activations"]) == s["tags"]["activations"]["allocated_peak"]
    assert len(tl["ooms"]) == 1 and len(tl["offloads"]) == 1 and tl["restores"] == []
    # A ring that kept only the newest events still ends at the true levels.
    p.record_history(max_entries=7)
    short = timeline(p.snapshot())
    assert short["allocated"][-1] == s["allocated"] and short["reserved"][-1] == s["reserved"]
    assert len(short["t"]) == 7


def test_plot_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = _plotted_pool()
    out = gpupool.plot(str(tmp_path / "mem.png"), source=p)
    data = Path(out).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    snap = p.snapshot()
    assert Path(gpupool.plot(str(tmp_path / "b.png"), source=snap, top=1)).stat().st_size > 10_000
    with pytest.raises(ValueError, match="record_history"):
        gpupool.plot(str(tmp_path / "c.png"), source=gpupool.HostPool(MiB << 4))
    with pytest.raises(ValueError, match="top"):
        gpupool.plot(str(tmp_path / "d.png"), source=p, top=0)


def test_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(ImportError, match=r"needs matplotlib: pip install matplotlib"):
        gpupool.plot(str(tmp_path / "x.png"), source=_plotted_pool())


# --------------------------------------------------------------------- CLI


def cli(*args: str, env: Dict[str, str] | None = None, path: str | None = None,
        timeout: int = 120) -> subprocess.CompletedProcess:
    e = child_env(env)
    if path:
        e["PYTHONPATH"] = path + os.pathsep + e["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "gpupool", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, timeout=timeout)


def test_cli_config_lists_every_option() -> None:
    r = cli("config", env={"GPUPOOL_LIMIT": "3GiB"})
    assert r.returncode == 0, r.stderr
    for env, key, default, accepted, help_ in gpupool.config_options():
        assert f"{env}=" in r.stdout and f"default {default}; accepts {accepted}" in r.stdout
        assert help_ in r.stdout
    assert r.stdout.split("GPUPOOL_LIMIT=")[1].splitlines()[0].endswith(" (set)")
    assert not r.stdout.split("GPUPOOL_CHUNK=")[1].splitlines()[0].endswith(" (set)")


def test_readme_option_table_is_generated() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| Variable | `enable()` keyword |")
    end = readme.index("<!-- options end -->")
    assert readme[start:end].strip() == options_markdown().strip(), \
        "README's option table is stale: paste `python -m gpupool config --markdown` into it"
    assert len(options_markdown().splitlines()) == len(gpupool.config_options()) + 2


@pytest.mark.parametrize("option", [o[0] for o in _C.config_options()])
def test_malformed_value_of_every_option(option: str) -> None:
    key = next(o[1] for o in _C.config_options() if o[0] == option)
    bad = "!!bogus!!"
    with pytest.raises(ValueError) as e:  # as an enable()/HostPool keyword
        gpupool.HostPool(64 * MiB, **{key: bad})
    assert option in str(e.value) and bad in str(e.value) and "expected" in str(e.value)
    r = cli("config", env={option: bad})  # as a variable
    assert r.returncode == 2 and option in r.stderr and bad in r.stderr and "expected" in r.stderr


def test_cli_errors(tmp_path: Path) -> None:
    r = cli("bogus")
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr
    r = cli()
    assert r.returncode == 2 and "required" in r.stderr
    r = cli("run", str(tmp_path / "missing.py"))
    assert r.returncode == 2 and "no such script" in r.stderr and "missing.py" in r.stderr
    r = cli("top", "--interval", "0")
    assert r.returncode == 2 and "--interval must be > 0" in r.stderr
    r = cli("config", env={"GPUPOOL_LIMT": "1GiB"})
    assert r.returncode == 2 and "GPUPOOL_LIMT" in r.stderr


def test_cli_run_without_a_gpu(tmp_path: Path) -> None:
    """On this machine enable() cannot work (no torch, or no GPU): `run` says
    why and does not run the script."""
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is here: tests/test_reports.py::test_gpu_cli_run covers it")
    except ImportError:
        pass
    script = tmp_path / "s.py"
    script.write_text("open('ran', 'w').write('yes')\n")
    r = cli("run", str(script))
    assert r.returncode == 2 and r.stderr.startswith("gpupool:") and not (ROOT / "ran").exists()


FAKE_NVML = '''
import types
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i):
    if i > 1: raise RuntimeError("Invalid Argument")
    return i
def nvmlDeviceGetName(h): return b"Fake GPU %d" % h
def nvmlDeviceGetMemoryInfo(h): return types.SimpleNamespace(used=(h + 1) << 30, total=80 << 30)
def nvmlDeviceGetComputeRunningProcesses(h):
    return [types.SimpleNamespace(pid=4242, usedGpuMemory=3 << 29),
            types.SimpleNamespace(pid=7, usedGpuMemory=None)] if h == 0 else []
'''


def test_cli_report_and_top(tmp_path: Path) -> None:
    r = cli("report", env={"PYTHONNOUSERSITE": "1"}, path=str(tmp_path))
    have_nvml = subprocess.run([sys.executable, "-c", "import pynvml"], capture_output=True).returncode == 0
    if not have_nvml:  # nothing to show but tenant groups, if any run on this machine
        assert "pip install nvidia-ml-py" in r.stderr
        assert r.returncode == (0 if "tenant group '" in r.stdout else 2)
    (tmp_path / "pynvml.py").write_text(FAKE_NVML)  # NVML as a GPU machine would answer
    r = cli("report", path=str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "GPU 0 Fake GPU 0: 1.00 GiB used of 80.00 GiB (1.2%)"
    assert lines[2].split()[:3] == ["4242", "1.50", "GiB"] and lines[3].split()[:2] == ["7", "?"]
    assert "GPU 1 Fake GPU 1" in r.stdout and "no processes" in r.stdout
    r = cli("top", "--interval", "0.01", "--count", "3", "--device", "1", path=str(tmp_path))
    assert r.returncode == 0 and r.stdout.count("GPU 1 Fake GPU 1") == 3 and "GPU 0" not in r.stdout
    r = cli("report", "--device", "5", path=str(tmp_path))
    assert r.returncode == 2 and "NVML failed" in r.stderr


# -------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu

TRAIN_STEP = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    x = torch.randn(64, 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
"""


@gpu
def test_gpu_reports_after_training(run_py, tmp_path: Path) -> None:
    run_py(f"""
    import io, pickle, sys, torch, gpupool
    sys.path.insert(0, {str(ROOT / 'tests')!r})
    from test_reports import check_snapshot
    gpupool.enable()
    gpupool.record_history()
    with gpupool.tag("training"):
{''.join('        ' + ln + chr(10) for ln in TRAIN_STEP.strip().splitlines())}
    s = gpupool.stats()
    assert s["allocated"] == sum(t["allocated"] for t in s["tags"].values()) > 0
    assert s["reserved"] == s["allocated"] + s["free_bytes"]
    assert s["tags"]["training"]["allocated_peak"] > 0 and s["history"]["len"] > 0
    buf = io.StringIO()
    text = gpupool.report(file=buf)
    assert "training" in text and "MiB" in text and buf.getvalue().strip() == text
    snap = gpupool.snapshot()
    check_snapshot(snap, 0, gpupool.stats())
    gpupool.dump_snapshot({str(tmp_path / 's.pickle')!r})
    snap = pickle.load(open({str(tmp_path / 's.pickle')!r}, "rb"))
    acts = [e["action"] for e in snap["device_traces"][0]]
    assert "alloc" in acts and "segment_map" in acts
    frames = [f for e in snap["device_traces"][0] for f in e["frames"]]
    assert any(f["filename"].endswith("case.py") for f in frames), "no Python stacks on the GPU"
    from torch.cuda import _memory_viz as mv
    mv.segsum(snap); mv.trace(snap); mv.trace_plot(snap); mv.segment_plot(snap)
    try:
        import matplotlib
    except ImportError:
        pass
    else:
        gpupool.plot({str(tmp_path / 'mem.png')!r})
        assert open({str(tmp_path / 'mem.png')!r}, "rb").read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
    """)


@gpu
def test_gpu_cli_run(tmp_path: Path) -> None:
    """`python -m gpupool run` on an unmodified script: gpupool serves its
    tensors, GPUPOOL_* apply, the report comes at exit."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_STEP + "import sys; print('argv', sys.argv[1:])\n")
    r = cli("run", str(script), "--lr", "3", env={"GPUPOOL_TRACE": "1", "GPUPOOL_LIMIT": "4GiB"},
            timeout=600)
    assert r.returncode == 0, r.stderr
    assert "argv ['--lr', '3']" in r.stdout
    assert "gpupool device 0:" in r.stderr and "limit 4.00 GiB" in r.stderr
    assert "history:" in r.stderr and "stacks on" in r.stderr


def test_stats_is_one_instant_while_other_threads_allocate() -> None:
    # The pool's, the tags' and the priorities' figures come from one copy:
    # taken one lock hold after another, allocations made meanwhile by other
    # threads (gp_alloc runs without the GIL) made them disagree.
    import threading
    p = gpupool.HostPool(1 << 30, chunk="256KiB")
    stop = threading.Event()

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        live: List[int] = []
        tags = [f"churn{seed}_{i}" for i in range(40)]
        while not stop.is_set():
            if live and rng.random() < 0.5:
                p.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(p.alloc(rng.choice([512, 4096, 70000]), tag=rng.choice(tags),
                                    priority=rng.randrange(4)))

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    bad, calls, deadline = [], 0, time.monotonic() + 3
    try:
        while time.monotonic() < deadline and not bad:
            s = p.stats()
            calls += 1
            for key in ("allocated", "requested", "active_blocks"):
                by_tag = sum(t[key] for t in s["tags"].values())
                if by_tag != s[key]:
                    bad.append((key, s[key], by_tag))
            if sum(v["allocated"] for v in s["priorities"].values()) != s["allocated"]:
                bad.append(("priorities", s["allocated"]))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad and calls > 100, (calls, bad[:3])
