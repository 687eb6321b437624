"""CUDA-only behaviour: capture in a CUDA graph (no host synchronisation inside the ops), and
GPU results equal to the CPU kernels' bytes. Skipped without a GPU; benchmarks/gpu_check.sh
runs them on one."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import dsa_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def captured(step) -> torch.cuda.CUDAGraph:
    """`step` run once on a side stream (warm-up), then captured in a graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def test_writes_and_gathers_replay_in_a_graph():
    plan = dsa_plan("BLHNC", 64, 16)
    cache = kvc.allocate(plan, "cuda", fill=0)
    mla, idx = cache.view("mla", 1), cache.view("indexer", 1)
    t = 96
    x = torch.zeros(t, 576, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(t, 128, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(t, dtype=torch.int64, device="cuda")
    table = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
    out = torch.empty(t, 576, dtype=torch.bfloat16, device="cuda")
    codes = torch.empty(t, 128, dtype=torch.uint8, device="cuda")
    scales = torch.empty(t, device="cuda")

    def step():
        kvc.ops.dsa_write(x[:, :512], x[:, 512:], mla, k, idx, slots)
        kvc.ops.gather_mla(mla, table, cu, out=out)  # validate is off while capturing
        kvc.ops.gather_indexer(idx, table, cu, out=(codes, scales))

    graph = captured(step)

    for seed in range(3):  # new inputs in the static buffers, then replay
        g = torch.Generator().manual_seed(seed)
        hx = (torch.randn(t, 576, generator=g) * 3).to(torch.bfloat16)
        hk = torch.randn(t, 128, generator=g).to(torch.bfloat16)
        blocks = torch.randperm(16, generator=g)[:2].to(torch.int32)
        hslots = (blocks.repeat_interleave(64)[:t].to(torch.int64) * 64 + torch.arange(t) % 64)
        x.copy_(hx)
        k.copy_(hk)
        slots.copy_(hslots)
        table.copy_(blocks.view(1, 2))
        graph.replay()
        torch.cuda.synchronize()
        want = ref.mla_dequant(ref.mla_fp8_rows(hx[:, :512], hx[:, 512:]))
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
        wc, ws = ref.indexer_rows(hk)
        assert torch.equal(codes.cpu(), wc) and torch.equal(scales.cpu(), ws)


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
def test_cuda_and_cpu_kernels_give_the_same_bytes(layout):
    plan = dsa_plan(layout, 16, 64)
    on_gpu, on_cpu = kvc.allocate(plan, "cuda", fill=0x5A), kvc.allocate(plan, "cpu", fill=0x5A)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1000, 576, generator=g) * 10).to(torch.bfloat16)
    x[::17, ::3] = float("nan")
    x[::19, 5] = float("inf")
    k = (torch.randn(1000, 128, generator=g) * 1e-3).to(torch.float16)
    slots = torch.randperm(plan.num_slots, generator=g)[:1000]
    for cache, dev in ((on_gpu, "cuda"), (on_cpu, "cpu")):
        kvc.ops.dsa_write(x[:, :512].half().to(dev), x[:, 512:].half().to(dev), cache.view("mla", 0),
                          k.to(dev), cache.view("indexer", 0), slots.to(dev), "fp8_ds_mla", "ue8m0",
                          "split")
        kvc.ops.concat_and_cache_mla(x[:, :512].to(dev), x[:, 512:].to(dev), cache.view("mla", 1),
                                     slots.to(dev))
    assert torch.equal(on_gpu.buffer.cpu(), on_cpu.buffer)


def test_dsa_decode_step_replays_in_a_graph():
    """The DSA model's decode step (dsa_write + gather_indexer + top-k + gather_mla_slots +
    attention, every layer) captured once and replayed with new tokens, positions, lengths and
    blocks: the same tokens, top-k and cache bytes as eager decode. Capture fails on any host
    synchronisation, so this also shows the step needs none."""
    from kvcache_ext.models.dsa import DSAConfig, DSAModel, DSARunner, last_tokens

    model = DSAModel(DSAConfig()).cuda()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist()
               for n in (31, 14, 9)]  # requests 0 and 1 cross a block edge while replaying
    eager, graphed = (DSARunner.build(model, 24, 16, "BLHNC", "cuda", max_requests=3,
                                      max_blocks=4) for _ in range(2))
    nxt = last_tokens(eager.prefill(prompts), [len(p) for p in prompts])
    graphed.prefill(prompts)

    static = graphed.step_inputs([[t] for t in nxt])  # step 1; block_table is already static
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up runs step 1 (writes are idempotent: replay redoes it)
        model(**static, views=graphed.views)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(**static, views=graphed.views)

    for step in range(5):
        if step:  # new inputs in the static tensors (new blocks go into block_table in place)
            new = graphed.step_inputs([[t] for t in nxt])
            for name in ("tokens", "positions", "req", "ctx_lens"):
                static[name].copy_(new[name])
        graph.replay()
        want = eager.decode(nxt)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(out.topk, want.topk))
        torch.testing.assert_close(out.logits, want.logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(graphed.cache.buffer, eager.cache.buffer)
        nxt = last_tokens(want, [1, 1, 1])
    assert graphed.lens == eager.lens == [36, 19, 14]
    assert torch.equal(graphed.block_table, eager.block_table)
    assert (graphed.block_table >= 0).sum(1).tolist() == [3, 2, 1]


def test_v4_writes_and_reads_replay_in_a_graph():
    """DeepSeek-V4's ops captured once and replayed with new tokens and blocks: the compressed
    pair at compressed slots, SWA rows, the compressed + SWA read (offsets from window_rows, on
    the device) and a sparse read, equal to the reference each time."""
    from kvcache_ext import ops_v4 as o4
    from kvcache_ext import reference_v4 as r4

    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("flash"), num_blocks=8, layout="BLHNC")
    cache = kvc.allocate(plan, "cuda", fill=0)
    c4, mx, swa = cache.view("c4_kv", 2), cache.view("c4_indexer", 2), cache.view("swa0_kv", 2)
    t = 200
    kv = torch.zeros(t, 512, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(t, 128, dtype=torch.bfloat16, device="cuda")
    c_slots = torch.zeros(t, dtype=torch.int64, device="cuda")
    s_slots = torch.zeros(t, dtype=torch.int64, device="cuda")
    c_bt = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    s_bt = torch.zeros(1, 4, dtype=torch.int32, device="cuda")
    lens = torch.tensor([t], dtype=torch.int32, device="cuda")
    cu_out = o4.window_rows(lens, 4)
    out = torch.empty(t // 4 + 128, 512, dtype=torch.bfloat16, device="cuda")
    top = torch.zeros(16, dtype=torch.int64, device="cuda")
    top_out = torch.empty(16, 128, dtype=torch.bfloat16, device="cuda")

    def step():
        o4.v4_dsa_write(kv, c4, k, mx, c_slots)
        o4.v4_mla_quant_and_cache(kv, swa, s_slots)
        o4.gather_compressed_and_swa(c4, c_bt, 4, swa, s_bt, lens, out=out, cu_out=cu_out)
        o4.gather_v4_slots(mx, top, "mxfp4", out=top_out)

    graph = captured(step)

    pos = torch.arange(t)
    req = torch.zeros(t, dtype=torch.int64)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        blocks = torch.randperm(8, generator=g)[:5].to(torch.int32)  # 1 main + 4 SWA, disjoint
        hc, hs = blocks[:1].view(1, 1), blocks[1:].view(1, 4)
        hkv = (torch.randn(t, 512, generator=g) * 3).to(torch.bfloat16)
        hk = torch.randn(t, 128, generator=g).to(torch.bfloat16)
        hc_slots = kvc.slot_mapping(hc, pos, 256, req, compress_ratio=4)
        hs_slots = kvc.slot_mapping(hs, pos, 64, req)
        htop = hc_slots[hc_slots >= 0][torch.randperm(t // 4, generator=g)[:16]]
        for dst, src in ((kv, hkv), (k, hk), (c_slots, hc_slots), (s_slots, hs_slots), (c_bt, hc),
                         (s_bt, hs), (top, htop)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        host = cache.buffer.cpu()
        hplan = kvc.KVCache(plan, host)
        want, _ = r4.gather_compressed_and_swa(hplan.view("c4_kv", 2), hc, 4, hplan.view("swa0_kv", 2),
                                               hs, torch.tensor([t]))
        assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
        deq = r4.v4_mla_dequant(*r4.v4_mla_rows(hkv))
        assert torch.equal(out[: t // 4].cpu().view(torch.int16), deq[3::4].view(torch.int16))
        want_top = r4.mxfp4_read(hplan.view("c4_indexer", 2), htop)
        assert torch.equal(top_out.cpu().view(torch.int16), want_top.view(torch.int16))
