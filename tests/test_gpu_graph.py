"""A captured CUDA graph sleeps with its model: the weights' tag and the tag
its capture allocated under go to host RAM, device memory is given back,
both come back at the same addresses and the graph replays bit-identical,
without being captured again.  Each case in a fresh process (conftest.run_py);
skipped without torch and a CUDA device."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_captured_graph_offloads_and_replays_identical(run_py) -> None:
    r = run_py("""
        import torch, gpupool
        gpupool.enable()
        torch.manual_seed(0)
        p = gpupool.device_pool()
        p._pool.offload_stats(True)  # the offloader (1 MiB for checksums) before any figure
        sleepers = ["weights", "io", "decode_graph"]
        with gpupool.tag("weights", lifetime="long"):
            m = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),
                                    torch.nn.Linear(8192, 2048)).cuda().to(torch.bfloat16)
        with gpupool.tag("io"):
            x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
            x2 = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16)
            x1 = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):  # warm-up (cuBLAS picks its kernels)
                m(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with gpupool.tag("decode_graph"), torch.no_grad(), torch.cuda.graph(g):
            y = m(x)  # the 8 MiB hidden activation is freed inside the capture
        g.replay()
        y_a = y.cpu()  # (on the host: a device copy could share a mapping unit with the graph's memory)
        x.copy_(x2)
        g.replay()
        y_b = y.cpu()
        torch.cuda.synchronize()
        ptrs = [q.data_ptr() for q in m.parameters()] + [y.data_ptr()]
        graph_live = gpupool.stats()["tags"]["decode_graph"]["allocated"]
        free0 = torch.cuda.mem_get_info()[0]
        # The graph's memory shares mapping units (64 MiB) with what the
        # capturing stream had cached and handed on, among them the static
        # inputs: they sleep together, in one call, or the shared units stay.
        # Raw: a compressing codec's first use maps its staging (up to
        # 160 MiB) from the pool, which the driver's figure would net out.
        info = gpupool.offload(sleepers, codec="raw")
        free1 = torch.cuda.mem_get_info()[0]
        st = gpupool.stats()
        # The graph's live blocks (its output, cuBLAS's workspace) went, and
        # its scratch freed inside the capture was given back too (not copied).
        # (What stays shares a 64 MiB unit with memory of no sleeping tag:
        # the warm-up stream's cuBLAS workspace; 8 MiB on the H100.)
        off = st["tags"]["decode_graph"]["offloaded"]
        assert graph_live > 0 and off >= 0.9 * graph_live and off >= graph_live - info["kept"], (st["tags"], info)
        assert info["kept"] <= 16 * 2**20, info
        away = [b for b in p.blocks() if b.state == "free_offloaded"]
        assert sum(b.size for b in away) >= 6 * 2**20, away
        assert info["released"] >= info["bytes"], info
        assert free1 - free0 >= info["released"] - 4 * 2**20, (free1 - free0, info)
        assert info["released"] >= 60 * 2**20 + graph_live, info
        gpupool.restore(sleepers)
        assert [q.data_ptr() for q in m.parameters()] + [y.data_ptr()] == ptrs
        assert all(b.state != "free_offloaded" for b in p.blocks())
        x.copy_(x1)
        g.replay()  # no re-capture
        assert torch.equal(y.cpu().view(torch.int16), y_a.view(torch.int16))
        x.copy_(x2)
        g.replay()
        assert torch.equal(y.cpu().view(torch.int16), y_b.view(torch.int16))
        # Again, several times: it stays so.
        for _ in range(3):
            gpupool.offload(sleepers)
            gpupool.restore(sleepers)
            g.replay()
            assert torch.equal(y.cpu().view(torch.int16), y_b.view(torch.int16))
        gpupool.check()
        del g
        torch.cuda.synchronize()
        print("OK", info["released"], info["bytes"], graph_live)
    """)
    assert "OK" in r.stdout


# The warm-up before a capture, as PyTorch's documentation has it: three
# passes of model `m` on input `x` on a side stream.
_WARM_UP = """\
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                m(x)
        torch.cuda.current_stream().wait_stream(s)
"""


def test_a_graph_holds_the_offloadable_modules_its_capture_ran(run_py) -> None:
    # A replay runs none of a module's hooks: a graph captured over an
    # offloadable module read its weights where they had been, offloaded
    # by the user or, idle between replays, by the pool under pressure
    # (the CUDA context lost), and one whose own tag was offloaded read
    # its memory where it had been.  The modules whose hooks ran inside the
    # capture are held resident through each replay, restored first, and
    # the graph's own tags are restored.  A capture over an offloaded module
    # raises an error that says so.
    r = run_py("""
        import torch, gpupool
        gpupool.enable()
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(16)]).cuda()  # 256 MiB
        other = torch.nn.Linear(4096, 8192).cuda()  # made offloadable, never in the graph (128 MiB)
        h = gpupool.offloadable(m, "graph_model")
        ho = gpupool.offloadable(other, "graph_other")
        with gpupool.tag("graph_mem"):
            x = torch.randn(256, 2048, device="cuda")
""" + _WARM_UP + """\
        with torch.no_grad():
            ref = m(x).cpu()
        g = torch.cuda.CUDAGraph()
        with gpupool.tag("graph_mem"), torch.no_grad(), torch.cuda.graph(g):
            y = m(x)
        g.replay()
        assert torch.equal(y.cpu(), ref)
        w = m[0].weight.data_ptr()
        p = gpupool.device_pool()
        ho.offload()  # (replays must leave it away: it is not the graph's)
        assert p.lookup(other.weight.data_ptr()).state == "offloaded"
        # Offloaded by the user: the replay restores it.
        h.offload()
        assert p.lookup(w).state == "offloaded"
        y.zero_()
        g.replay()
        assert torch.equal(y.cpu(), ref), "replay after offload"
        assert p.lookup(w).state == "used"
        # Offloaded under pressure between replays (idle), then replayed.
        for i in range(3):
            gpupool.empty_cache()
            gpupool.set_limit(gpupool.stats()["reserved"] + 64 * 2**20)
            hog = torch.empty(192 * 2**20, dtype=torch.uint8, device="cuda")  # (normal: above the module's low)
            assert p.lookup(w).state == "offloaded", i
            del hog
            y.zero_()
            g.replay()
            assert torch.equal(y.cpu(), ref), i
            gpupool.set_limit(None)
        # The graph's own memory (its tag) offloaded by the user: the replay
        # restores it first.
        info = gpupool.offload("graph_mem")
        assert gpupool.stats()["tags"]["graph_mem"]["offloaded"] > 0, info
        g.replay()
        assert gpupool.stats()["tags"]["graph_mem"]["offloaded"] == 0
        assert torch.equal(y.cpu(), ref), "replay after its own tag's offload"
        # Only the modules the capture ran are held: the other one stayed away.
        assert p.lookup(other.weight.data_ptr()).state == "offloaded"
        # A capture over the module while it is offloaded: an error that says
        # so (a restore inside it invalidated the capture, naming no cause);
        # restored first, it captures.
        h.offload()
        g2 = torch.cuda.CUDAGraph()
        try:
            with torch.no_grad(), torch.cuda.graph(g2):
                m(x)
            raise AssertionError("captured over offloaded memory")
        except RuntimeError as e:
            assert "being captured" in str(e), e
        h.restore()
        g3 = torch.cuda.CUDAGraph()
        with gpupool.tag("graph_mem"), torch.no_grad(), torch.cuda.graph(g3):
            y3 = m(x)
        g3.replay()
        assert torch.equal(y3.cpu(), ref)
        print("OK")
    """, env={"GPUPOOL_CODEC": "raw"})  # (no codec staging mapped under the limit)
    assert "OK" in r.stdout


def test_a_replay_and_a_step_over_per_layer_modules_restore_them_in_one_call(run_py) -> None:
    # A model made offloadable layer by layer: a replay of its graph held
    # and restored each of the 24 modules apart (a restore call each, about
    # 36 us of a 50 us replay on an H200), as did an optimizer's step over
    # their parameters.  Each does one restore of all of them now, and
    # still brings back whatever was offloaded.
    r = run_py("""
        import torch, gpupool
        from gpupool import _offloadable
        gpupool.enable()
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(24)]).cuda()
        hs = [gpupool.offloadable(layer, f"layer_{i}") for i, layer in enumerate(m)]
        x = torch.randn(8, 256, device="cuda")
""" + _WARM_UP + """\
        with torch.no_grad():
            ref = m(x).clone()
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = m(x)
        calls = []
        real = _offloadable.restore
        def counted(tag, **kw):
            calls.append(tag)
            return real(tag, **kw)
        _offloadable.restore = counted
        g.replay()
        assert len(calls) == 1 and sorted(calls[0]) == sorted(h.tag for h in hs), calls
        assert torch.equal(y, ref)
        for h in hs:
            h.offload()
        p = gpupool.device_pool()
        assert p._pool == gpupool.device_pool()._pool and len({p._pool, gpupool.device_pool()._pool}) == 1
        assert all(p.lookup(l.weight.data_ptr()).state == "offloaded" for l in m)
        calls.clear()
        y.zero_()
        g.replay()
        assert len(calls) == 1 and torch.equal(y, ref), calls
        assert all(p.lookup(l.weight.data_ptr()).state == "used" for l in m)
        # An optimizer's step over all of them (after their backward passes,
        # when their hooks have made them idle), the state offloaded first.
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(x).square().mean().backward()
        for h in hs:
            h.offload()
        calls.clear()
        opt.step()
        assert len(calls) == 1, calls
        assert all(p.lookup(l.weight.data_ptr()).state == "used" for l in m)
        assert all(h._holds == 0 for h in hs)
        torch.cuda.synchronize()
        print("OK")
    """)
    assert "OK" in r.stdout, r.stdout


def test_replay_benchmark_runs_in_gpupool_and_native(tmp_path) -> None:
    # The replay's cost on the host (the hold of an offloadable model, the
    # check of the graph's memory) comes from this workload, which checks
    # the output of every timed part and of a replay with the model offloaded.
    import json
    import subprocess
    import sys

    from conftest import ROOT, child_env

    out = tmp_path / "replay.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "replay", "--modes", "native,gpupool", "--reps",
                        "1", "--quick", "--json", str(out)], capture_output=True, text=True, env=child_env(),
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0 and "FAILED" not in r.stdout, (r.stdout, r.stderr)
    runs = {x["mode"]: x["result"] for x in json.loads(out.read_text())["runs"]}
    assert runs["native"]["us_per_replay"] > 0 and runs["native"]["replay_after_offload_ms"] is None, runs
    assert runs["gpupool"]["us_per_replay"] > 0 and runs["gpupool"]["replay_after_offload_ms"] > 0, runs


def test_a_transformers_decode_graph_sleeps_with_its_static_cache(run_py) -> None:
    # Work not written for gpupool: a Hugging Face causal LM decoding into
    # transformers' StaticCache, one step captured with torch.cuda.graph as
    # engines do.  The weights, the cache and the capture's memory sleep
    # together in the middle of a sequence and wake at the same addresses;
    # the tokens after the wake, read from the cache written before the
    # sleep, equal those the graph gave without sleeping.  Each wake is
    # followed by new writes to the cache, so the next sleep must copy it
    # again (no clean host copy may stand in for it).
    pytest.importorskip("transformers")
    r = run_py("""
        import torch, gpupool
        gpupool.enable()
        from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache
        torch.manual_seed(0)
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
        B, P, N = 4, 17, 16
        with gpupool.tag("model"):
            m = Qwen2ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
        prompts = [torch.randint(0, 1000, (B, P), device="cuda") for _ in range(3)]
        sleepers = ["model", "kv", "graph"]
        with gpupool.tag("kv"):
            cache = StaticCache(config=cfg, max_cache_len=64)
            tok = torch.zeros(B, 1, dtype=torch.long, device="cuda")
            pos = torch.tensor([P], device="cuda")

        def at(n):  # transformers 5 counts a static layer's positions on the device
            for layer in getattr(cache, "layers", []):
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length.fill_(n)

        @torch.no_grad()
        def prefill(prompt):
            at(0)
            with gpupool.tag("kv"):  # (the first call makes the cache's tensors)
                out = m(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(P, device="cuda"),
                        use_cache=True)
            return out.logits[:, -1].argmax(-1, keepdim=True)

        prefill(prompts[0])
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    at(P)
                    m(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True)
            torch.cuda.current_stream().wait_stream(s)
            at(P)
            g = torch.cuda.CUDAGraph()
            with gpupool.tag("graph"), torch.cuda.graph(g):
                logits = m(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        infos = []

        def decode(prompt, sleep_at=None):
            t = prefill(prompt)
            toks = [t]
            at(P)
            for i in range(N):
                if i == sleep_at:
                    torch.cuda.synchronize()
                    free0 = torch.cuda.mem_get_info()[0]
                    info = gpupool.offload(sleepers)
                    freed = torch.cuda.mem_get_info()[0] - free0
                    assert info["released"] >= 0.75 * info["bytes"] and info["lost"] == 0, info
                    # (The codec's first use maps its staging from the device, which the
                    # driver's figure nets out: from the second sleep on, it shows all.)
                    assert not infos or freed >= info["released"] - 16 * 2**20, (freed, info)
                    infos.append(info)
                    gpupool.restore(sleepers)
                tok.copy_(t)
                pos.fill_(P + i)
                g.replay()
                t = logits[:, -1].argmax(-1, keepdim=True)
                toks.append(t)
            return torch.cat(toks, 1).cpu()

        ref = [decode(q) for q in prompts]
        assert len({tuple(r.flatten().tolist()) for r in ref}) == 3, ref
        tensors = list(m.parameters()) + [logits] + [
            t for layer in getattr(cache, "layers", []) for t in vars(layer).values()
            if isinstance(t, torch.Tensor) and t.is_cuda]
        ptrs = [t.data_ptr() for t in tensors]
        for cycle in range(4):
            got = decode(prompts[cycle % 3], sleep_at=N // 2)
            assert torch.equal(got, ref[cycle % 3]), (cycle, got, ref[cycle % 3])
            assert [t.data_ptr() for t in tensors] == ptrs
            assert infos[-1]["copied"] > 0, infos  # (the cache changed since the last wake)
        tags = gpupool.stats()["tags"]
        assert all(tags[t]["offloaded"] == 0 for t in sleepers), tags
        assert tags["kv"]["allocated"] >= 4 * 2 * B * 2 * 64 * 64 * 2, tags["kv"]  # the cache lies under its tag
        gpupool.check()
        print("OK", infos[-1])
    """)
    assert "OK" in r.stdout
