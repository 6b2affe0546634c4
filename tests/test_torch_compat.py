"""PyTorch's memory APIs under gpupool (issue 8).  The GPU tests (marked gpu)
run each body in a fresh process (conftest.run_py); the others check the
pure-Python parts and the C hooks on host pools, without CUDA."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import gpupool
from gpupool import _C, _torch_patch

gpu = pytest.mark.gpu
MiB = 1 << 20


# ------------------------------------------------------------ CPU, host pools

def test_key_mapping_follows_the_pool() -> None:
    p = gpupool.HostPool(256 * MiB, chunk="2MiB")
    a = p.alloc(3 * MiB + 5)
    b = p.alloc(1000)
    p.free(b)
    t = _torch_patch.torch_memory_stats(p.stats())
    s = p.stats()
    assert t["allocated_bytes.all.current"] == s["allocated"] > 3 * MiB
    assert t["allocated_bytes.all.peak"] == s["allocated_peak"] >= t["allocated_bytes.all.current"] + 1000
    assert t["allocated_bytes.all.allocated"] - t["allocated_bytes.all.freed"] == s["allocated"]
    assert t["requested_bytes.all.current"] == 3 * MiB + 5
    assert t["requested_bytes.all.allocated"] == 3 * MiB + 5 + 1000
    assert t["requested_bytes.all.freed"] == 1000
    assert t["reserved_bytes.all.current"] == s["reserved"] >= t["allocated_bytes.all.current"]
    assert t["reserved_bytes.all.allocated"] - t["reserved_bytes.all.freed"] == s["reserved"]
    assert t["allocation.all.current"] == 1 and t["allocation.all.allocated"] == 2
    assert t["allocation.all.freed"] == 1
    assert t["num_device_alloc"] == s["n_map"] > 0 and t["num_ooms"] == 0
    assert list(t) == sorted(t)
    # reset_accumulated_memory_stats: cumulative figures restart at zero,
    # current ones do not.
    base = _torch_patch._accumulated(p.stats())
    p.free(a)
    t = _torch_patch.torch_memory_stats(p.stats(), base)
    assert t["allocation.all.allocated"] == 0 and t["allocation.all.freed"] == 1
    assert t["allocated_bytes.all.allocated"] == 0
    assert t["allocated_bytes.all.freed"] == s["allocated"]
    assert t["allocated_bytes.all.current"] == 0


# The keys of torch.cuda.memory_stats() that gpupool gives (PyTorch's names).
TORCH_KEYS = {
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "requested_bytes.all.current", "requested_bytes.all.peak",
    "requested_bytes.all.allocated", "requested_bytes.all.freed", "reserved_bytes.all.current",
    "reserved_bytes.all.peak", "reserved_bytes.all.allocated", "reserved_bytes.all.freed",
    "active_bytes.all.current", "active_bytes.all.allocated", "active_bytes.all.freed",
    "allocation.all.current", "allocation.all.peak", "allocation.all.allocated", "allocation.all.freed",
    "inactive_split_bytes.all.current", "inactive_split.all.current", "segment.all.current",
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
    "max_split_size",
}


def test_figures_come_from_one_list() -> None:
    # gpupool.h's GP_STATS_FIELDS / GP_TAG_STATS_FIELDS make the C structs,
    # the dicts of stats() and PyTorch's key mapping.
    p = gpupool.HostPool(256 * MiB, chunk="2MiB")
    a = p.alloc(3 * MiB, tag="w")
    p.free(p.alloc(5000, stream=7))
    raw = p._pool.stats(True)
    names = [name for name, _, _ in _C.STATS_FIELDS]
    assert list(raw) == names + ["tags", "priorities", "history"]
    assert list(raw["priorities"][1]) == [name for name, _, _ in _C.PRIO_STATS_FIELDS]
    assert {kind for _, kind, _ in _C.STATS_FIELDS} == {"current", "peak", "total"}
    assert list(raw["tags"]["w"]) == [name for name, _, _ in _C.TAG_STATS_FIELDS]
    assert "offloaded" in raw["tags"]["w"]
    # A device without a pool yet reports every figure, as zeros.
    assert list(_torch_patch._ZERO) == names and not any(_torch_patch._ZERO.values())
    zero = _torch_patch.torch_memory_stats(dict(_torch_patch._ZERO))
    assert set(zero) == TORCH_KEYS and all(v == 0 for k, v in zero.items() if k != "max_split_size")
    t = _torch_patch.torch_memory_stats(raw)
    assert set(t) == TORCH_KEYS
    for name, _, key in _C.STATS_FIELDS:
        if key is not None:
            assert t[key] == raw[name], key
    # After reset_accumulated_memory_stats every PyTorch counter made from a
    # cumulative figure restarts at 0; levels and peaks do not.
    t = _torch_patch.torch_memory_stats(raw, _torch_patch._accumulated(raw))
    for name, kind, key in _C.STATS_FIELDS:
        if key is not None:
            assert t[key] == (0 if kind == "total" else raw[name]), key
    assert t["allocated_bytes.all.freed"] == t["requested_bytes.all.freed"] == 0
    # reset_peak_stats sets every peak of the list to its level.
    p.free(a)
    p.reset_peak_stats()
    s = p.stats()
    for fields, figures in ((_C.STATS_FIELDS, [s]), (_C.TAG_STATS_FIELDS, list(s["tags"].values())),
                           (_C.PRIO_STATS_FIELDS, list(s["priorities"].values()))):
        peaks = [name for name, kind, _ in fields if kind == "peak"]
        assert peaks and all(name.endswith("_peak") for name in peaks)
        for f in figures:
            assert all(f[name] == f[name[:-len("_peak")]] for name in peaks), f


def test_record_stream_on_a_host_pool() -> None:
    p = gpupool.HostPool(64 * MiB)
    x = p.alloc(4096, stream=1)
    p._pool.record_stream(x, 2)
    p.free(x)
    assert p.stats()["pending"] == 4096
    assert [b.state for b in p.blocks() if b.addr == x] == ["pending"]
    t = _torch_patch.torch_memory_stats(p.stats())
    assert t["active_bytes.all.current"] == 4096 and t["allocated_bytes.all.current"] == 0
    # The host backend's stream 2 never finishes on its own: x stays out
    # until the pool synchronises (trim).
    y = p.alloc(4096, stream=1)
    assert y != x
    p.empty_cache()
    assert p.stats()["pending"] == 0
    with pytest.raises(ValueError, match="did not allocate"):
        p._pool.record_stream(12345 * 4096, 2)


def test_graph_pool_on_a_host_pool() -> None:
    p = gpupool.HostPool(64 * MiB)
    p._pool.capture_prepare(1)
    p._pool.capture_begin(5, 1)
    a = p.alloc(MiB, stream=1)
    p.free(a)
    p._pool.capture_end(1)
    assert [b.addr for b in p.blocks() if b.state == "free" and b.addr == a] == [a]
    assert all(p.alloc(MiB, stream=s) != a for s in (1, 3))
    with pytest.raises(ValueError, match="not capturing"):
        p._pool.capture_end(1)
    p._pool.capture_release(5)
    with pytest.raises(ValueError, match="holds no graph"):
        p._pool.capture_release(5)
    assert p.alloc(MiB, stream=1) == a


def test_fraction_is_checked_like_pytorch() -> None:
    with pytest.raises(ValueError, match="0..1"):
        _torch_patch.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError, match="float"):
        _torch_patch.set_per_process_memory_fraction("half")  # type: ignore[arg-type]


# ----------------------------------------------------------------- GPU rows

@gpu
def test_patches_off_show_what_a_pluggable_allocator_breaks(run_py) -> None:
    # The table's first rows, as PyTorch leaves them: what gpupool fixes.
    code = """
    import torch, gpupool
    gpupool.enable()
    x = torch.ones(1 << 20, device="cuda")
    for f in (torch.cuda.memory_allocated, torch.cuda.max_memory_allocated,
              torch.cuda.memory_reserved, torch.cuda.memory_stats,
              torch.cuda.reset_peak_memory_stats):
        try:
            f()
        except RuntimeError as e:
            print("RAISES", f.__name__, str(e).splitlines()[0][:60])
        else:
            print("WORKS", f.__name__)
    """
    off = run_py(code, env={"GPUPOOL_TORCH_PATCH": "0"}).stdout
    assert off.count("RAISES") == 5, off
    on = run_py(code).stdout
    assert on.count("WORKS") == 5, on
    # disable_torch_patches() at run time gives PyTorch's behaviour back.
    r = run_py("""
    import torch, gpupool
    gpupool.enable()
    x = torch.ones(1 << 20, device="cuda")
    assert torch.cuda.memory_allocated() >= 4 << 20
    gpupool.disable_torch_patches()
    try:
        torch.cuda.memory_allocated()
    except RuntimeError:
        print("RAISES")
    # cacheInfo is PyTorch's again: cuDNN's benchmark mode fails as it does
    # under a bare pluggable allocator.
    torch.backends.cudnn.benchmark = True
    try:
        torch.nn.Conv2d(16, 32, 3, padding=1).cuda()(torch.randn(8, 16, 64, 64, device="cuda"))
        torch.cuda.synchronize()
    except RuntimeError as e:
        print("CACHEINFO RAISES", "cacheInfo" in str(e))
    """)
    assert "RAISES" in r.stdout and "CACHEINFO RAISES True" in r.stdout, r.stdout


@gpu
def test_statistics_functions(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable()
    torch.cuda.reset_peak_memory_stats()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    s = gpupool.stats()
    for mod in (torch.cuda, torch.cuda.memory):
        assert mod.memory_allocated() == s["allocated"] >= 64 << 20
        assert mod.max_memory_allocated() >= mod.memory_allocated()
        assert mod.memory_reserved() == s["reserved"] >= mod.memory_allocated()
        assert mod.max_memory_reserved() >= mod.memory_reserved()
        assert mod.memory_allocated(0) == mod.memory_allocated(torch.device("cuda:0"))
    st = torch.cuda.memory_stats()
    for k in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
              "allocated_bytes.all.freed", "reserved_bytes.all.current", "reserved_bytes.all.peak",
              "active_bytes.all.current", "requested_bytes.all.current", "num_alloc_retries",
              "num_ooms", "num_device_alloc", "num_device_free", "segment.all.current",
              "allocation.all.current"):
        assert k in st, k
    assert st["requested_bytes.all.current"] == 64 << 20
    assert torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["current"] == s["allocated"]
    assert "gpupool device 0" in torch.cuda.memory_summary()
    try:
        torch.empty(1 << 44, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    assert torch.cuda.memory_stats()["num_ooms"] == st["num_ooms"] + 1, torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    assert 0 < free < total and total == s["device_total"], (free, total, s["device_total"])
    """)


@gpu
def test_reset_peaks(run_py) -> None:
    run_py("""
    import torch, gpupool, warnings
    gpupool.enable()
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x
    assert torch.cuda.max_memory_allocated() >= 256 << 20
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() < 256 << 20
    y = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.reset_max_memory_allocated()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    z = torch.empty(10, device="cuda")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 1
    """)


@gpu
def test_snapshot_and_history(run_py, tmp_path) -> None:
    run_py(f"""
    import pickle, torch, gpupool
    gpupool.enable()
    torch.cuda.memory._record_memory_history(max_entries=1000)
    x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    y = torch.empty(1000, device="cuda")
    del y
    segs = torch.cuda.memory_snapshot()
    blocks = [b for s in segs for b in s["blocks"]]
    assert any(b["state"] == "active_allocated" and b["address"] == x.data_ptr() for b in blocks), blocks[:4]
    assert all(s["device"] == 0 and s["total_size"] == sum(b["size"] for b in s["blocks"]) for s in segs)
    torch.cuda.memory._dump_snapshot({str(tmp_path / 'snap.pickle')!r})
    snap = pickle.load(open({str(tmp_path / 'snap.pickle')!r}, "rb"))
    assert snap["segments"] and "device_traces" in snap
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert "alloc" in actions and "free_completed" in actions, actions[:10]
    here = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["addr"] == x.data_ptr()]
    assert here and any(f["filename"].endswith("case.py") for f in here[0]["frames"]), here
    torch.cuda.memory._record_memory_history(enabled=None)
    assert not any(torch.cuda.memory._snapshot()["device_traces"])
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1 << 62)  # PyTorch's "unbounded"
    assert gpupool.stats()["history"]["max_entries"] == 100000, gpupool.stats()["history"]
    torch.cuda.memory._record_memory_history(enabled=None)
    """)


@gpu
def test_empty_cache_releases(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable()
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    del x
    free0, _ = torch.cuda.mem_get_info()
    assert torch.cuda.memory_reserved() >= 1 << 30
    torch.cuda.empty_cache()
    free1, _ = torch.cuda.mem_get_info()
    assert torch.cuda.memory_reserved() < 64 << 20, torch.cuda.memory_reserved()
    assert free1 - free0 >= (1 << 30) - (64 << 20), (free0, free1)
    """)


@gpu
def test_memory_fraction_sets_the_limit(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable()
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.05)
    assert gpupool.stats()["limit"] == int(0.05 * total)
    small = torch.empty(int(0.02 * total), dtype=torch.uint8, device="cuda")
    try:
        torch.empty(int(0.06 * total), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("the fraction did not limit the allocation")
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        assert abs(torch.cuda.get_per_process_memory_fraction() - 0.05) < 1e-9
    torch.cuda.set_per_process_memory_fraction(1.0)
    big = torch.empty(int(0.06 * total), dtype=torch.uint8, device="cuda")
    """)


@gpu
def test_record_stream_keeps_the_block_for_the_side_stream(run_py) -> None:
    # x is filled on the main stream and read on a side stream that is still
    # sleeping when x is freed.  Without record_stream honoured, the next
    # allocation of the same size on the main stream reuses x's block at once
    # and overwrites it with 7s before the side stream reads it.
    run_py("""
    import torch, gpupool
    gpupool.enable()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    n = 1 << 22
    x = torch.full((n,), 3.0, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(300_000_000)
        y = x.clone()
    x.record_stream(side)
    px = x.data_ptr()
    del x
    z = torch.empty(n, device="cuda")
    assert z.data_ptr() != px, "the block was reused while the side stream still had to read it"
    z.fill_(7.0)
    torch.cuda.synchronize()
    assert bool((y == 3.0).all()), "stale read: the side stream read overwritten memory"
    # Once the side stream is done, the block is reused.
    ws = [torch.empty(n, device="cuda") for _ in range(4)]
    assert px in [w.data_ptr() for w in ws], "the recorded block never came back"
    # Views record their storage's block.
    v = torch.ones(2 * n, device="cuda")[n:]
    v.record_stream(side)
    """)


GRAPH_BLOCK = """
import torch, gpupool
gpupool.enable()
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True).cuda().eval()
static_x = torch.randn(8, 64, 256, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s), torch.no_grad():
    for _ in range(3):
        layer(static_x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(g):
    static_y = layer(static_x)
import os
stats = gpupool.stats()
print("capture maps", stats["n_capture_maps"])
if os.environ.get("GPUPOOL_MODE") == "reserve":
    assert stats["n_capture_maps"] == 0, "the capture called the driver to map memory"
# Memory handed out after the capture must not be the graph's: fill it with
# junk, replay, and check both the junk and the results.
junk = [torch.full((int(n),), -1.0, device="cuda") for n in (1e3, 1e5, 3e5, 1e6, 4e6) for _ in range(4)]
for i in range(200):
    x = torch.randn(8, 64, 256, device="cuda")
    static_x.copy_(x)
    g.replay()
    with torch.no_grad():
        ref = layer(x)
    torch.testing.assert_close(static_y, ref, rtol=1e-5, atol=1e-5)
assert all(bool((j == -1.0).all()) for j in junk), "the graph wrote into memory handed out after capture"
del g
torch.cuda.synchronize()
out = static_y.clone()
"""


@gpu
def test_captured_transformer_block_replays_equal_to_eager(run_py) -> None:
    # Expandable mode: memory the warm-up's peak did not cover (cuBLAS's
    # workspace for the capture stream) is mapped during the capture, in
    # relaxed capture mode, as PyTorch's allocator does with cudaMalloc.
    r = run_py(GRAPH_BLOCK)
    print(r.stdout)
    # Reserve mode: the capture is served from the reserve, no driver call.
    r = run_py(GRAPH_BLOCK, env={"GPUPOOL_MODE": "reserve", "GPUPOOL_RESERVE": "4GiB"})
    assert "capture maps 0" in r.stdout


MAKE_GRAPHED = """
import copy, sys, torch
if sys.argv[1] == "gpupool":
    import gpupool
    gpupool.enable()
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).cuda()
eager = copy.deepcopy(model)
x0 = torch.randn(32, 128, device="cuda", requires_grad=True)
graphed = torch.cuda.make_graphed_callables(model, (x0,))
opt_g = torch.optim.SGD(model.parameters(), lr=0.1)
opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
for step in range(20):
    x = torch.randn(32, 128, device="cuda", requires_grad=True)
    for net, opt in ((graphed, opt_g), (eager, opt_e)):
        opt.zero_grad(set_to_none=False)
        net(x).pow(2).mean().backward()
        opt.step()
diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), eager.parameters()))
print(sys.argv[1], "graphed vs eager max diff", diff)
torch.save([p.detach().cpu() for p in model.parameters()], sys.argv[1] + ".pt")
"""


@gpu
def test_make_graphed_callables_trains_like_native(run_py, tmp_path) -> None:
    # The graphed model trained under gpupool ends where it ends under
    # PyTorch's own allocator.
    (tmp_path / "mg.py").write_text(MAKE_GRAPHED)
    out = ""
    for mode in ("native", "gpupool"):
        out += run_py(f"import sys, runpy; sys.argv = ['mg.py', {mode!r}]; runpy.run_path('mg.py')").stdout
    print(out)
    import torch
    a, b = torch.load(tmp_path / "native.pt"), torch.load(tmp_path / "gpupool.pt")
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@gpu
def test_trainer_style_loop_logs_memory_every_step(run_py) -> None:
    r = run_py("""
    import torch, gpupool
    gpupool.enable()
    model = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True).cuda()
    opt = torch.optim.AdamW(model.parameters())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    log = []
    for step in range(20):
        torch.cuda.reset_peak_memory_stats()
        x = torch.randn(16, 128, 256, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        st = torch.cuda.memory_stats()
        log.append((torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
                    torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved(),
                    st["num_alloc_retries"], st["num_ooms"]))
        if step % 5 == 0:
            torch.cuda.empty_cache()
    for alloc, peak, res, res_peak, retries, ooms in log:
        assert params <= alloc <= peak <= res_peak and alloc <= res <= res_peak
        assert ooms == 0
    # Steady state: the same memory every step after the optimizer's state exists.
    assert len({a for a, *_ in log[2:]}) == 1, log
    print("steps", len(log), "allocated", log[-1][0], "peak", log[-1][1])
    """)
    assert "steps 20" in r.stdout


@gpu
def test_compile_sdpa_cudnn_and_ddp_still_work(run_py) -> None:
    # The last row of issue 8's table, under gpupool with its memory:
    # torch.compile, SDPA's flash backward and DDP over NCCL, which work under
    # a bare pluggable allocator, and cuDNN's benchmark mode, which does not
    # (measured on an H100 with torch 2.11: cacheInfo unsupported).
    run_py("""
    import os, socket, torch, gpupool
    gpupool.enable()
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)

    def f(x, w):
        return F.gelu(x @ w).sum(-1)
    x, w = torch.randn(64, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    torch.testing.assert_close(torch.compile(f)(x, w), f(x, w), rtol=2e-3, atol=2e-2)

    q, k, v = (torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).float().pow(2).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v))

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(128, 128).cuda(), device_ids=[0])
    model(torch.randn(32, 128, device="cuda")).sum().backward()
    assert model.module.weight.grad.abs().sum() > 0
    t = torch.full((1 << 20,), 2.0, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t.sum().item() == 2.0 * (1 << 20)
    dist.destroy_process_group()
    # cuDNN's benchmark asks the allocator's cacheInfo(), which a bare
    # pluggable allocator throws from ("does not yet support cacheInfo").
    assert gpupool._C.set_cache_info(True) is None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
    img = torch.randn(8, 16, 64, 64, device="cuda")
    out = conv(img)
    out.sum().backward()
    ref = F.conv2d(img.cpu(), conv.weight.detach().cpu(), conv.bias.detach().cpu(), padding=1)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert conv.weight.grad is not None
    # All of it in gpupool's memory.
    s = gpupool.stats()
    assert s["n_alloc"] > 50 and s["allocated_peak"] > (1 << 22), s
    """)


@gpu
def test_compile_with_cuda_graphs_says_what_works_and_the_way_round_works(run_py) -> None:
    # mode="reduce-overhead" records with CUDA graph trees, which need the
    # caching allocator's own calls: under gpupool a clear error; with
    # cudagraph_trees off, each graph captured through torch.cuda.graph into
    # gpupool's graph pools, equal to eager over varying shapes, and trains.
    r = run_py("""
    import torch, gpupool
    gpupool.enable()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, 512)).cuda()
    x = torch.randn(8, 512, device="cuda")
    try:
        with torch.no_grad():
            torch.compile(m, mode="reduce-overhead")(x)
        raise AssertionError("CUDA graph trees ran under gpupool")
    except RuntimeError as e:
        assert str(e).startswith("gpupool: torch.compile's CUDA graphs") and "cudagraph_trees = False" in str(e), e
    torch.compiler.reset()
    torch._inductor.config.triton.cudagraph_trees = False
    f = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for n in [8, 8, 8, 16, 16, 16, 8, 32, 32, 8]:
            x = torch.randn(n, 512, device="cuda")
            torch.testing.assert_close(f(x).clone(), m(x), rtol=1e-4, atol=1e-4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for n in [8, 8, 8, 16, 16, 8]:
        loss = f(torch.randn(n, 512, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    # A graph per shape, each in a graph pool of gpupool's (3 for inference,
    # then forward and backward graphs of the training shapes).
    assert len(gpupool._torch_patch._graph_keys) >= 5, gpupool._torch_patch._graph_keys
    print("OK")
    """)
    assert "OK" in r.stdout


@gpu
def test_cudnn_benchmark_fails_under_a_bare_pluggable_allocator(run_py) -> None:
    # The "bare" column of the cuDNN row: the same allocator functions, handed
    # to PyTorch without gpupool.enable() (so cacheInfo is not routed).
    r = run_py("""
    import torch
    from gpupool import _C
    torch.cuda.memory.change_current_allocator(
        torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, "gpupool_malloc", "gpupool_free"))
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda()
    try:
        conv(torch.randn(8, 16, 64, 64, device="cuda"))
        torch.cuda.synchronize()
    except RuntimeError as e:
        print("RAISES", str(e).splitlines()[0])
    else:
        print("WORKS")
    """)
    assert "RAISES" in r.stdout and "cacheInfo" in r.stdout, r.stdout


def test_cache_info_hook_says_what_it_lacks() -> None:
    # Without PyTorch's CUDA library in the process there is no vtable to
    # patch: the call must say which symbol is missing, not crash or pretend.
    import sys
    if "torch" in sys.modules:
        pytest.skip("torch is loaded in this process")
    why = _C.set_cache_info(True)
    assert isinstance(why, str) and "CUDAPluggableAllocator" in why, why


def test_graph_trees_allocator_calls_say_what_works_under_gpupool() -> None:
    # torch.compile's CUDA graphs (reduce-overhead, max-autotune) call the
    # caching allocator's checkpoint functions; under a pluggable allocator
    # torch's error asks to file an issue with torch.  While gpupool routes
    # the API they raise one that names what works; uninstalled, torch's own.
    torch = pytest.importorskip("torch")
    names = [n for n in _torch_patch._GRAPH_TREE_CALLS if hasattr(torch._C, n)]
    if not names:
        pytest.skip("this torch build has no CUDA graph trees")
    theirs = {n: getattr(torch._C, n) for n in names}
    _torch_patch.install_api()
    try:
        for n in names:
            with pytest.raises(RuntimeError, match=r"gpupool: torch.compile's CUDA graphs .*cudagraph_trees = False"):
                getattr(torch._C, n)(0, (0, 0), set())
    finally:
        _torch_patch.uninstall_api()
    assert {n: getattr(torch._C, n) for n in names} == theirs


# What both vtable scripts start with: PyTorch's CUDA libraries, its own
# method `sym` of CUDAPluggableAllocator, gpupool plugged in as PyTorch's
# allocator (the object C++ calls, and its class's vtable), and the vtable's
# entries.
VTABLE_PRELUDE = """
import ctypes, os, torch
from gpupool import _C, _torch_patch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
cuda = ctypes.CDLL(os.path.join(lib, "libtorch_cuda.so"))
c10c = ctypes.CDLL(os.path.join(lib, "libc10_cuda.so"))
def method(sym):
    name = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator" + sym
    return ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value
def plug():
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, "gpupool_malloc", "gpupool_free")
    torch.cuda.memory.change_current_allocator(alloc)
    cur = ctypes.c_void_p.in_dll(c10c, "_ZN3c104cuda20CUDACachingAllocator9allocatorE").value
    return cur, ctypes.c_void_p.from_address(cur).value
def entries():
    return [ctypes.c_void_p.from_address(vt + 8 * i).value for i in range(200)]
"""


CACHE_INFO_THROUGH_VTABLE = VTABLE_PRELUDE + """
theirs = method("9cacheInfoEaPm")
on_gpu = torch.cuda.is_available()
if not on_gpu:
    _C.use_host_backend(256 << 20)  # device pools over host memory: there is no GPU
_C.configure({"mode": "reserve", "reserve": "50%"})
cur, vt = plug()
before = entries()
slot = before.index(theirs)
maps = open("/proc/self/maps").read()
assert _torch_patch.install_api() is None and _C.set_cache_info(True) is None  # idempotent
after = entries()
assert after[slot] != theirs and [a for i, a in enumerate(after) if i != slot] == \\
    [b for i, b in enumerate(before) if i != slot], "exactly the cacheInfo entry is rewritten"
assert open("/proc/self/maps").read() == maps, "page protections are restored"
# A virtual call, as cuDNN's makes it: PyTorch's would throw (through ctypes: abort).
call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_byte, ctypes.POINTER(ctypes.c_size_t))(after[slot])
def ask(given):
    largest = ctypes.c_size_t(given)
    call(cur, 0, ctypes.byref(largest))
    return largest.value
# No pool on the device: the hook makes none (in reserve mode that would map
# half the device) and answers as PyTorch's allocator with nothing cached:
# what it was given, or the driver's free memory when given 0.
assert ask(12345) == 12345
free = ask(0)
assert free > (1 << 30 if on_gpu else 200 << 20), free
assert _C.devices() == [], "cacheInfo made a pool"
# With a pool: its headroom (reserve mode: its largest free block).
p = _C.device_pool(0, True)
a = p.alloc(1 << 20)
reserved = p.stats(False)["reserved"]
assert ask(0) == reserved - (1 << 20) and ask(1 << 62) == 1 << 62, (ask(0), reserved)
# disable_torch_patches() gives PyTorch's entry back, and protections.
_torch_patch.uninstall_api()
assert entries() == before, "PyTorch's cacheInfo is back"
def mapping(addr):
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line
assert mapping(vt + 8 * slot) in maps.splitlines(keepends=True), "the vtable's protection is restored"
print("ok", slot, free)
"""


def test_cache_info_is_answered_through_the_vtable(run_py) -> None:
    # Needs PyTorch's CUDA build (its libraries), not a GPU.
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip("a CPU-only build of torch has no CUDAPluggableAllocator")
    assert "ok" in run_py(CACHE_INFO_THROUGH_VTABLE).stdout


PEER_ACCESS_THROUGH_VTABLE = VTABLE_PRELUDE + """
theirs = {"peer": method("16enablePeerAccessEaa"), "copy": method("11memcpyAsyncEPviPKvimP11CUstream_stb")}
_C.use_host_backend(64 << 20)  # two "devices" over host memory: no CUDA call is made
cur, vt = plug()
before = entries()
slots = {n: before.index(a) for n, a in theirs.items()}
assert _torch_patch.install_safety() is None and _C.set_peer_access(True) is None  # idempotent
after = entries()
assert [i for i in range(200) if after[i] != before[i]] == sorted(slots.values()), "exactly the two entries"
enable = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_byte, ctypes.c_byte)(after[slots["peer"]])
copy = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                        ctypes.c_size_t, ctypes.c_void_p, ctypes.c_bool)(after[slots["copy"]])
# Device 1 asks for device 0's memory before device 0 has a pool: kept, and
# granted when the pool is made; device 0 asks for device 1's with a pool there.
enable(cur, 1, 0)
assert _C.device_peers(0) == [1] and _C.devices() == []
p0, p1 = _C.device_pool(0, True), _C.device_pool(1, True)
assert _C.device_peers(0) == [1] and _C.device_peers(1) == []
enable(cur, 0, 1)
enable(cur, 0, 1)
assert _C.device_peers(1) == [0] and _C.device_peers(0) == [1]
# A copy between devices without a peer-to-peer path: not PyTorch's
# cudaMemcpyAsync (which cannot reach cuMemMap'd memory of another device).
a, b = p0.alloc(8192), p1.alloc(8192)
data = bytes(range(256)) * 32
ctypes.memmove(a, data, 8192)
assert copy(cur, b, 1, a, 0, 8192, None, False) == 0
assert ctypes.string_at(b, 8192) == data
p0.free(a)
p1.free(b)
_C.set_peer_access(False)
assert entries() == before, "PyTorch's entries are back"
print("ok", sorted(slots.values()))
"""


def test_peer_access_is_answered_through_the_vtable(run_py) -> None:
    # nn.DataParallel and tensor.to("cuda:1") failed with "invalid argument":
    # PyTorch's pluggable allocator enables the contexts' peer access, which
    # does not reach memory mapped with cuMemMap.  Needs PyTorch's CUDA build,
    # not a GPU (device pools over the host backend).
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip("a CPU-only build of torch has no CUDAPluggableAllocator")
    assert "ok" in run_py(PEER_ACCESS_THROUGH_VTABLE).stdout


def _two_gpus() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")


# The start of a script over two GPUs of one process: gpupool first, exact
# float32 matmuls (results compared with the CPU's or another run's).
# Indented as the scripts it starts, which run_py dedents.
TWO_GPUS = """
    import torch, gpupool
    gpupool.enable()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
"""


@gpu
def test_copies_and_data_parallel_across_two_gpus_of_one_process(run_py) -> None:
    # One process driving two GPUs (nn.DataParallel, which transformers'
    # Trainer uses when it sees several; tensor.to("cuda:1")) failed with
    # "CUDA error: invalid argument": the second device could not reach
    # memory gpupool maps for the first.  Every byte checked against the CPU.
    _two_gpus()
    r = run_py(TWO_GPUS + """
    from gpupool import _C
    x = torch.randn(1000, 300, device="cuda:0")
    ref = x.cpu()
    assert torch.equal(x.to("cuda:1").cpu(), ref)             # contiguous: the allocator's copy
    assert torch.equal(x.t().to("cuda:1").cpu(), ref.t())     # strided: a copy kernel across devices
    back = torch.empty(300, 1000, device="cuda:0")
    back.copy_(x.t().contiguous().to("cuda:1"))               # device 1 -> device 0
    assert torch.equal(back.cpu(), ref.t())
    big = torch.randn(64 << 20, device="cuda:1")              # new mappings after the grant
    assert torch.equal(big.to("cuda:0").cpu(), big.cpu())
    p2p = torch.cuda.can_device_access_peer(0, 1)
    assert not p2p or (_C.device_peers(1) == [0] and _C.device_peers(0) == [1]), (_C.device_peers(0), _C.device_peers(1))
    model = torch.nn.Sequential(torch.nn.Linear(300, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    cpu_model = torch.nn.Sequential(torch.nn.Linear(300, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    cpu_model.load_state_dict(model.state_dict())
    dp = torch.nn.DataParallel(model.cuda(), device_ids=[0, 1])
    for step in range(3):
        inp = torch.randn(64, 300)
        dp(inp.cuda()).square().sum().backward()
        cpu_model(inp).square().sum().backward()
    for a, b in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()
    print("ok", p2p)
    """)
    assert "ok" in r.stdout, r.stdout


@gpu
def test_data_parallel_over_an_offloaded_module(run_py) -> None:
    # nn.DataParallel (and its functional form) copies its module's weights
    # to the second GPU before any hook of the module runs, and its first
    # replica computes on the module's own weights: offloaded, they were read unmapped (the CUDA
    # context lost).  Offloaded before each forward and again between the
    # forward and the backward, the module trains as one without offload.
    _two_gpus()
    r = run_py(TWO_GPUS + """
    import copy
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 16)).cuda()
    plain = copy.deepcopy(model)
    h = gpupool.offloadable(model, "dp_model")
    w = model[0].weight.data_ptr()
    dp, dp_plain = torch.nn.DataParallel(model, device_ids=[0, 1]), torch.nn.DataParallel(plain, device_ids=[0, 1])
    opt, opt_plain = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(plain.parameters(), lr=0.1)
    for step, n in enumerate((64, 40, 96, 64)):  # varying batch sizes
        x = torch.randn(n, 512, device="cuda")
        assert h.offload()["bytes"] > 0
        out = dp(x) if step % 2 else torch.nn.parallel.data_parallel(model, x, device_ids=[0, 1])  # (its functional form)
        loss = out.square().mean()
        h.offload()  # (as pressure may, between the forward and the backward)
        loss.backward()
        dp_plain(x).square().mean().backward()
        opt.step(); opt_plain.step(); opt.zero_grad(); opt_plain.zero_grad()
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert gpupool.device_pool(0).lookup(w).tag == "dp_model"
    gpupool.check(0)
    torch.cuda.synchronize()
    print("ok")
    """)
    assert "ok" in r.stdout, (r.stdout, r.stderr)


@gpu
def test_peer_benchmark_runs_in_gpupool_and_native(tmp_path) -> None:
    # The figures of the grant (every mapping of a device at once) and of
    # copies between devices come from this workload; each copy is checked in it.
    _two_gpus()
    from conftest import ROOT, child_env

    out = tmp_path / "peer.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "peer", "--modes", "native,gpupool", "--reps",
                        "1", "--quick", "--json", str(out)], capture_output=True, text=True, env=child_env(),
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0 and "FAILED" not in r.stdout, (r.stdout, r.stderr)
    runs = {x["mode"]: x["result"] for x in json.loads(out.read_text())["runs"]}
    for mode in ("native", "gpupool"):
        res = runs[mode]
        assert res["tensors"] == 512 and res["first_copy_s"] > 0, res
        assert res["copy_0_to_1_gbps"] > 1 and res["copy_1_to_0_gbps"] > 1, res
        assert f"peer {mode}: " in r.stdout, r.stdout


# PyTorch's bindings turn c10::OutOfMemoryError into torch.OutOfMemoryError
# and any other c10::Error into RuntimeError (torch/csrc/Exceptions.h,
# CATCH_CORE_ERRORS, in this order).  This C++ caller catches as they do.
CATCHER = r"""
#include <c10/util/Exception.h>
#include <cstdio>
#include <sys/types.h>
typedef void *(*malloc_fn)(ssize_t, int, void *);
extern "C" int call(malloc_fn fn, long size, int device, void *stream, char *out, size_t n) {
    try {
        std::snprintf(out, n, "%p", fn(size, device, stream));
        return 0;
    } catch (const c10::OutOfMemoryError &e) {
        std::snprintf(out, n, "%s", e.what_without_backtrace());
        return 1;
    } catch (const c10::Error &e) {
        std::snprintf(out, n, "%s", e.what_without_backtrace());
        return 2;
    } catch (...) {
        return 3;
    }
}
"""

MALLOC_THROWS = """
import ctypes, sys, torch
from gpupool import _C
catcher = ctypes.CDLL(sys.argv[1])
malloc = ctypes.cast(ctypes.CDLL(_C.__file__).gpupool_malloc, ctypes.c_void_p)
def call(size, device=0, stream=0):
    out = ctypes.create_string_buffer(4096)
    kind = catcher.call(malloc, ctypes.c_long(size), device, ctypes.c_void_p(stream), out, 4096)
    return ("ok", "OutOfMemoryError", "RuntimeError", "other")[kind], out.value.decode()
if sys.argv[2] == "cuda":
    # No GPU here: the pool cannot be made, which is no OOM.
    kind, msg = call(1 << 20)
    assert kind == "RuntimeError" and "cannot create the pool of device 0" in msg, (kind, msg)
    print("ok")
    sys.exit()
_C.use_host_backend(64 << 20)
_C.configure({"chunk": "2MiB", "limit": "32MiB"})
assert call(1 << 20)[0] == "ok"
kind, msg = call(48 << 20)               # over the pool's limit
assert kind == "OutOfMemoryError" and msg.startswith("CUDA out of memory.") and "limit" in msg, (kind, msg)
kind, msg = call(1 << 20, device=99)     # no such device
assert kind == "RuntimeError" and "device 99" in msg, (kind, msg)
for s in range(1, 200):                  # every stream gets bins: at most 64
    kind, msg = call(4096, stream=s)
    if kind != "ok":
        break
assert kind == "RuntimeError" and "stream" in msg and "out of memory" not in msg, (s, kind, msg)
print("ok")
"""


@pytest.mark.parametrize("backend", ["host", "cuda"])
def test_allocation_failures_reach_pytorch_as_the_right_exception(run_py, tmp_path, backend) -> None:
    # Only running out of memory (or a limit) may be torch.OutOfMemoryError,
    # which callers catch to retry with less; a driver error or too many
    # streams is a RuntimeError.  gpupool_malloc is called as PyTorch's
    # CUDAPluggableAllocator calls it, from C++ that catches as PyTorch does.
    torch = pytest.importorskip("torch")
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    if backend == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is here: the pool can be made (test_gpu.py covers the CUDA path)")
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    (tmp_path / "catcher.cpp").write_text(CATCHER)
    so = tmp_path / "catcher.so"
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", f"-I{os.path.dirname(torch.__file__)}/include",
                    str(tmp_path / "catcher.cpp"), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(so),
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"], check=True)
    code = f"import sys; sys.argv = ['x', {str(so)!r}, {backend!r}]\n" + MALLOC_THROWS
    assert run_py(code).stdout.strip() == "ok"


@gpu
def test_gpu_non_oom_failures_are_runtime_errors(run_py) -> None:
    # Too many streams is no lack of memory: RuntimeError, not
    # torch.OutOfMemoryError (which a batch-size finder would answer by
    # retrying smaller, forever); the process goes on working.
    r = run_py("""
    import torch, gpupool
    gpupool.enable()
    import ctypes
    x = torch.ones(1 << 20, device="cuda")
    # torch.cuda.Stream() hands out a ring of 32 per priority: make distinct ones.
    cuda = ctypes.CDLL("libcuda.so.1")
    def raw_stream():
        h = ctypes.c_void_p()
        assert cuda.cuStreamCreate(ctypes.byref(h), 1) == 0
        return torch.cuda.ExternalStream(h.value)
    streams = [raw_stream() for _ in range(200)]
    kept = []
    for i, s in enumerate(streams):
        try:
            with torch.cuda.stream(s):
                kept.append(torch.empty(4096, device="cuda"))
        except torch.OutOfMemoryError as e:
            raise AssertionError(f"stream {i}: OutOfMemoryError for a failure that is no OOM: {e}")
        except RuntimeError as e:
            assert "stream" in str(e), e
            print("RUNTIME ERROR at stream", i)
            break
    else:
        raise AssertionError("200 streams were all served")
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        assert str(e).startswith("CUDA out of memory."), e
    y = torch.ones(1 << 20, device="cuda") + x
    assert y.sum().item() == 2 * (1 << 20)
    """)
    assert "RUNTIME ERROR at stream" in r.stdout, r.stdout


def test_record_memory_history_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.cuda.memory._record_memory_history's arguments, as gpupool.record_history takes them.
    from gpupool import _history
    calls = []
    monkeypatch.setattr(_history, "record_history", lambda *a: calls.append(a))
    rmh = _torch_patch._record_memory_history
    rmh()                                            # PyTorch's defaults: all, Python stacks
    rmh(max_entries=2 ** 63 - 1)                     # sys.maxsize: "unbounded"
    rmh("state", stacks="python", max_entries=5000)
    rmh(True, context=None)                          # no context: no stacks
    rmh(enabled=None)                                # off
    rmh(trace_alloc_max_entries=77)                  # the pre-2.1 keyword
    assert calls == [(True, _C.HISTORY_DEFAULT, True, None), (True, _C.HISTORY_DEFAULT, True, None),
                     (True, 5000, True, None), (True, _C.HISTORY_DEFAULT, False, None),
                     (False, _C.HISTORY_DEFAULT, True, None), (True, 77, True, None)]
    for bad in (0, -3, 1.5, "10"):
        with pytest.raises(ValueError, match="max_entries must be an int > 0"):
            rmh(max_entries=bad)
