"""Tags and priorities on a real GPU: the LoRA example's report broken down by
tag (backward included, through the inherited context of autograd's
thread), tagged() on a model's parameters, the priority rules at the pool
limit, and the fragmentation benchmark with placement on and off.  Each
case runs in a fresh interpreter (conftest.run_py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.gpu


def test_lora_example_report_shows_tags(run_py, tmp_path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("matplotlib")
    ex = ROOT / "examples" / "qwen_lora_finetune.py"
    snap, png = tmp_path / "lora.pickle", tmp_path / "lora.png"
    r = run_py(f"""
    import json, runpy, sys
    # main() rather than __main__: the script ends in sys.exit, which would skip the check
    lora = runpy.run_path({str(ex)!r}, run_name="lora_example")
    assert lora["main"](["--allocator", "gpupool", "--size", "tiny", "--steps", "4", "--warmup", "1",
                         "--snapshot", {str(snap)!r}, "--plot", {str(png)!r}]) == 0
    import gpupool
    print("TAGS", json.dumps({{k: v["allocated_peak"] for k, v in gpupool.stats()["tags"].items()}}))
    """)
    tags = json.loads(r.stdout.split("TAGS ", 1)[1].splitlines()[0])
    for name in ("weights", "lora", "activations", "backward", "optimizer"):
        assert tags.get(name, 0) > 0, (name, tags)
        # the report's table has a row per tag
        assert any(line.startswith(name) for line in r.stdout.splitlines()), r.stdout
    # Autograd's thread allocated under the inherited "backward" tag, not untagged.
    assert tags.get("untagged", 0) < 0.1 * tags["backward"], tags
    # --snapshot: the whole run's history (from before the weights) in memory_viz's format;
    # --plot: a PNG of it.
    import pickle
    data = pickle.loads(snap.read_bytes())
    trace = data["device_traces"][0]
    assert sum(e["action"] == "alloc" for e in trace) > 100 and any(e["frames"] for e in trace)
    assert any(e["action"] == "free_completed" for e in trace)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_tagged_moves_a_models_parameters(run_py) -> None:
    run_py("""
    import gpupool
    gpupool.enable()
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024)).cuda()
    before = gpupool.stats()["tags"]["untagged"]["allocated"]
    assert gpupool.tagged(model, "weights", priority="high") is model
    s = gpupool.stats()
    nbytes = sum(gpupool.device_pool().lookup(p.data_ptr()).size for p in model.parameters())
    assert s["tags"]["weights"]["allocated"] == nbytes, (s["tags"], nbytes)
    assert s["tags"]["untagged"]["allocated"] == before - nbytes
    assert s["priorities"][2]["allocated"] == nbytes
    assert {gpupool.device_pool().lookup(p.data_ptr()).tag for p in model.parameters()} == {"weights"}
    del model
    assert gpupool.stats()["tags"]["weights"]["allocated"] == 0
    """)


def test_low_priority_cannot_displace_high_cache(run_py) -> None:
    run_py("""
    import gpupool
    gpupool.enable(limit="1GiB")
    import torch
    MiB = 1 << 20
    def empty(n, prio):
        with gpupool.tag("t", priority=prio):
            return torch.empty(n * MiB, dtype=torch.uint8, device="cuda")
    a, s1, b, s2 = empty(448, "high"), empty(64, "critical"), empty(448, "high"), empty(64, "critical")
    del a, b   # 896 MiB of high-priority cache, in two holes
    torch.cuda.synchronize()
    reserved = gpupool.stats()["reserved"]
    try:
        empty(512, "low")
        raise SystemExit("a low request displaced high-priority cache")
    except torch.OutOfMemoryError as e:
        assert "priorities above" in str(e), str(e)
    assert gpupool.stats()["reserved"] == reserved
    c = empty(512, "high")  # a high request may
    c.fill_(1)
    torch.cuda.synchronize()
    print("ok")
    """)


@pytest.mark.parametrize("placement", ["lifetime", "none"])
def test_frag_benchmark_runs_with_and_without_placement(run_py, tmp_path: Path, placement: str) -> None:
    out = tmp_path / f"frag_{placement}.json"
    run_py(f"""
    import sys
    sys.path.insert(0, {str(ROOT)!r})
    from benchmarks.frag import main
    raise SystemExit(main(["--mode", "gpupool", "--iters", "9", "--max-tokens", "4096",
                           "--optimizer", "adamw", "--placement", {placement!r}, "--json", {str(out)!r}]))
    """)
    result = json.loads(out.read_text())
    assert result["placement"] == placement and result["optimizer"] == "adamw"
    assert result["peak_reserved"] >= result["peak_allocated"] > 0


def test_placement_keeps_weights_apart(run_py) -> None:
    run_py("""
    import gpupool
    gpupool.enable()
    import torch
    with gpupool.tag("weights"):
        w = [torch.empty(3 << 20, device="cuda") for _ in range(4)]
    with gpupool.tag("activations"):
        a = [torch.empty(3 << 20, device="cuda") for _ in range(4)]
    pool = gpupool.device_pool()
    wb = [pool.lookup(t.data_ptr()) for t in w]
    ab = [pool.lookup(t.data_ptr()) for t in a]
    assert {b.lifetime for b in wb} == {"long"} and {b.lifetime for b in ab} == {"short"}
    assert min(b.addr for b in wb) > max(b.addr for b in ab)
    """)
