"""GPU tests (marked gpu): gpupool as PyTorch's allocator on a real device.
Each body runs in its own process (conftest.run_py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = """
import torch, sys
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
out = {}
for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(512, 384, device="cuda", dtype=dtype)
    b = torch.randn(384, 256, device="cuda", dtype=dtype)
    out[f"mm_{dtype}"] = (a @ b).float().cpu()
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True).cuda().to(dtype)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x = torch.randn(8, 33, 128, device="cuda", dtype=dtype, requires_grad=True)
    for step in range(3):
        y = layer(x)
        loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    out[f"loss_{dtype}"] = loss.detach().cpu()
    out[f"grad_{dtype}"] = x.grad.float().cpu()
    out[f"w_{dtype}"] = next(layer.parameters()).detach().float().cpu()
torch.save(out, sys.argv[1] if len(sys.argv) > 1 else "out.pt")
"""


def test_same_results_as_native(run_py, tmp_path: Path) -> None:
    import torch

    native = tmp_path / "native.py"
    native.write_text(WORKLOAD.replace('sys.argv[1] if len(sys.argv) > 1 else "out.pt"', '"native.pt"'))
    run_py(f"import runpy; runpy.run_path({str(native)!r})")
    run_py("import gpupool; gpupool.enable()\n"
           + WORKLOAD.replace('sys.argv[1] if len(sys.argv) > 1 else "out.pt"', '"gp.pt"')
           + "s = gpupool.stats(); assert s['n_alloc'] > 100, s\n")
    a, b = torch.load(tmp_path / "native.pt"), torch.load(tmp_path / "gp.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs: max {(a[k] - b[k]).abs().max()}"


def test_cross_stream_reuse_waits(run_py) -> None:
    # x is freed while a kernel on s1 still has to read it; a block reused on
    # s2 must not be written before that read.  Without the event wait, z's
    # fill lands first and y would hold 7s.
    run_py("""
    import torch, gpupool
    gpupool.enable()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    n = 1 << 22
    with torch.cuda.stream(s1):
        x = torch.full((n,), 3.0, device="cuda")
        torch.cuda._sleep(200_000_000)
        y = x.clone()
    px = x.data_ptr()
    del x
    with torch.cuda.stream(s2):
        z = torch.empty(n, device="cuda")
        assert z.data_ptr() == px, "the block was not reused: the test proves nothing"
        z.fill_(7.0)
    torch.cuda.synchronize()
    assert bool((y == 3.0).all()), "stale read: s2 overwrote memory s1 was still reading"
    assert gpupool.stats()["n_stream_waits"] >= 1
    """)


def test_reserve_mode_makes_no_driver_calls(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable(mode="reserve", reserve="8GiB")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    def step(bs):
        x = torch.randn(bs, 1024, device="cuda")
        model(x).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
    step(64)
    before = gpupool.stats()
    for i in range(50):
        step(16 + (i * 37) % 256)
    torch.cuda.synchronize()
    after = gpupool.stats()
    assert after["n_map"] == before["n_map"] and after["n_unmap"] == 0, (before, after)
    assert after["n_alloc"] > before["n_alloc"] + 1000
    print(gpupool.report())
    """)


def test_oom_raises_and_process_goes_on(run_py) -> None:
    r = run_py("""
    import torch, gpupool
    gpupool.enable(limit="2GiB")
    keep = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        print("OOM raised")
    else:
        raise SystemExit("no OOM")
    rep = gpupool.last_oom_report()
    assert "out of memory" in rep and "limit" in rep, rep
    # Inside an operator too, and again and again: nothing leaks, nothing breaks.
    a = torch.ones(4096, 4096, device="cuda")
    for _ in range(20):
        try:
            torch.cat([a] * 40)
        except torch.OutOfMemoryError as e:
            assert "CUDA out of memory" in str(e)
        else:
            raise SystemExit("no OOM from cat")
    assert gpupool.stats()["n_oom"] == 21
    x = torch.ones(1 << 20, device="cuda") * 2
    assert float(x.sum()) == 2 * (1 << 20)
    assert int(keep[-4096:].sum()) == 4096
    """)
    assert "OOM raised" in r.stdout
    assert "gpupool: out of memory" in r.stderr


def test_enable_after_cuda_use_is_a_clear_error(run_py) -> None:
    r = run_py("""
    import torch, gpupool
    torch.ones(1, device="cuda")
    gpupool.enable()
    """, check=False)
    assert r.returncode != 0 and "before the first CUDA allocation" in r.stderr


def test_empty_cache_gives_memory_back(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable()
    xs = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del xs
    s = gpupool.stats()
    assert s["allocated"] == 0 and s["reserved"] >= 512 << 20
    freed = gpupool.empty_cache()
    assert freed >= 512 << 20 and gpupool.stats()["reserved"] < 8 << 20
    """)


def test_devices(run_py) -> None:
    run_py("""
    import torch, gpupool
    gpupool.enable()
    n = torch.cuda.device_count()
    for d in range(n):
        x = torch.arange(1000, device=f"cuda:{d}")
        assert int(x.sum()) == 499500
        assert gpupool.stats(d)["active_blocks"] >= 1
    from gpupool import _C
    assert _C.devices() == list(range(n))
    try:
        _C.device_pool(n, True)
    except RuntimeError as e:
        assert "device" in str(e)
    else:
        raise SystemExit("a pool for a device that does not exist")
    """)


def test_ddp_two_ranks_two_gpus(run_py) -> None:
    # One process per GPU, each with its own gpupool: NCCL's buffers and
    # DDP's gradient buckets come from gpupool, and both ranks end equal.
    r = run_py("""
    import os, socket, torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def rank_main(rank, port):
        import gpupool
        gpupool.enable()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", rank=rank, world_size=2, device_id=dev)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 512)).to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        g = torch.Generator(device=dev).manual_seed(rank)
        for _ in range(5):
            loss = ddp(torch.randn(64, 512, device=dev, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        both = [torch.empty_like(flat) for _ in range(2)]
        dist.all_gather(both, flat)
        assert torch.equal(both[0], both[1]), "ranks diverged"
        s = gpupool.stats(rank)
        assert s["n_alloc"] > 20 and s["allocated_peak"] > 4 << 20, s
        print("rank", rank, "ok", s["allocated_peak"], flush=True)
        dist.destroy_process_group()

    if __name__ == "__main__":
        if torch.cuda.device_count() < 2:
            print("SKIP one GPU")
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(rank_main, args=(port,), nprocs=2)
    """)
    if "SKIP" in r.stdout:
        pytest.skip("needs two GPUs")
    assert "rank 0 ok" in r.stdout and "rank 1 ok" in r.stdout, r.stdout


def test_lora_example_runs(run_py) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    ex = ROOT / "examples" / "qwen_lora_finetune.py"
    r = run_py(f"""
    import runpy, sys
    sys.argv = [{str(ex)!r}, "--allocator", "gpupool", "--size", "tiny", "--steps", "4", "--warmup", "1"]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """)
    assert "tokens/s" in r.stdout and "allocated" in r.stdout


def test_cli_run_unmodified_script(run_py, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("import torch\nx = torch.ones(1 << 20, device='cuda')\nprint(float(x.sum()))\n")
    import subprocess

    from conftest import child_env
    r = subprocess.run([sys.executable, "-m", "gpupool", "run", str(script)], capture_output=True,
                       text=True, env=child_env())
    assert r.returncode == 0, r.stderr
    assert "1048576.0" in r.stdout and "gpupool device 0" in r.stderr
