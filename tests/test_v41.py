"""DeepSeek-V4.1's 528-byte record (vLLM PR #56893, FlashMLA's V4.1 record): 512 e4m3 codes of the
whole post-RoPE vector, then 16 UE8M0 scales, one per 32 values, in split pages padded to 512 B.
Kernels (CPU, and CUDA under the host emulation) = reference = an independent float64 oracle,
byte for byte, in poisoned, guarded caches: every bf16 value, every bf16 tile amax, both floors,
the packed V4.1 slab in every block-outer layout and single-group plans in all six, every read
(slots, block table, compressed + SWA window) to bf16 / fp32 / raw rows, and the pair write."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4
from kvcache_ext import reference_v4 as r4

from conftest import DEVICES, guarded
from test_v4_ops import distinct_slots, every_amax, every_bf16_pattern, special_rows
from v4_oracle import expect_v41

FMT = "v41_mxfp8"


def v41_plan(layout: str = "BLHNC", num_blocks: int = 6, indexer: str = "mxfp4"):
    return kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", mla=FMT, indexer=indexer),
                          num_blocks=num_blocks, layout=layout)


def split_plan(layout: str, block_size: int = 16):
    return kvc.plan_cache([kvc.CacheSpec("v41", 528, 2, split=(512, 16)),
                           kvc.CacheSpec("mx", 68, 2, split=(64, 4))], num_blocks=5,
                          block_size=block_size, layout=layout)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


def test_the_preset_and_its_pages():
    """528-B rows in split (512, 16) pages padded to 512 B: a 64-row page is 33,792 B (no pad),
    C128's 2-row page 1,056 -> 1,536 B; the largest group is the C4 states (1,228,800 B)."""
    plan = v41_plan()
    assert plan.spec("c4_kv").row_bytes == 528 and plan.spec("c4_kv").split == (512, 16)
    assert plan.page_bytes("c4_kv") == 33792 and plan.page_bytes("c128_kv") == 1536
    assert plan.block_stride == 1228800
    pool = kvc.capacity.group_pool_for_budget(kvc.presets.deepseek_v4("pro", mla=FMT), 2**30, 8192)
    assert pool.block_stride == 1228800 and pool.num_blocks == 2**30 // 1228800


@pytest.mark.parametrize("floor", ["amax", "scale"])
def test_every_bf16_value_and_amax(device, floor):
    """Every bf16 value (NaN -> 0x7F, +-448 saturation, inf tiles -> byte 255) and every positive
    bf16 32-value tile amax (ceil-pow2 scale from the bits, the 1e-4 floor), kernel = reference
    = the float64 oracle, and both decodes."""
    for x in (every_bf16_pattern(512), every_amax(32, 16, 512)):
        n = x.shape[0]
        plan = kvc.plan_cache([kvc.CacheSpec("v", 528, 1, split=(512, 16))],
                              num_blocks=-(-n // 64), block_size=64, layout="BLHNC")
        got = torch.zeros(plan.total_bytes, dtype=torch.uint8, device=device)
        want = torch.zeros(plan.total_bytes, dtype=torch.uint8)
        slots = torch.arange(n)
        o4.v4_mla_quant_and_cache(x.to(device), plan.view(got, "v", 0), slots.to(device), floor,
                                  fmt=FMT)
        r4.v41_write(plan.view(want, "v", 0), slots, x, floor)
        assert torch.equal(got.cpu(), want), f"{int((got.cpu() != want).sum())} bytes differ"
        data, scales = r4.v41_read(plan.view(want, "v", 0), slots, raw=True)
        od, osc = expect_v41(x, floor)
        assert torch.equal(data, od) and torch.equal(scales, osc)
        for dtype in (torch.bfloat16, torch.float32):
            out = o4.gather_v4_slots(plan.view(got, "v", 0), slots.to(device), FMT, dtype=dtype)
            assert _same(out, r4.v41_read(plan.view(want, "v", 0), slots, dtype)), dtype


def test_scale_bytes_by_hand():
    """An all-zero tile: byte 105 (2^-22, vLLM's amax floor) or 114 with scale_floor="scale"
    (2^-13, FlashMLA's reference); amax 448: byte 127; one ulp above: 128; a tile holding inf:
    255, its finite values +-0 and the inf itself inf / inf = NaN -> 0x7F (as the 584-B row); a
    NaN value: 0x7F."""
    x = torch.zeros(1, 512)
    x[0, 32] = 448.0
    x[0, 64] = 450.0                               # the bf16 after 448
    x[0, 96:99] = torch.tensor([float("inf"), 3.0, -2.0])
    x[0, 130] = float("nan")
    x = x.to(torch.bfloat16)
    for floor, zero in (("amax", 105), ("scale", 114)):
        d, s = r4.v41_rows(x, floor)
        assert s[0, :4].tolist() == [zero, 127, 128, 255], floor
    assert d[0, 96:99].tolist() == [0x7F, 0x00, 0x80] and d[0, 130] == 0x7F
    plan = kvc.plan_cache([kvc.CacheSpec("v", 528, 1, split=(512, 16))], 1, 32)
    cache = kvc.allocate(plan, fill=0xEE)
    o4.v4_mla_quant_and_cache(x, cache.view("v", 0), torch.tensor([5]), fmt=FMT)
    page = cache.buffer
    assert torch.equal(page[5 * 512:6 * 512], r4.v41_rows(x)[0][0])     # data rows first
    assert torch.equal(page[32 * 512 + 5 * 16:32 * 512 + 6 * 16], r4.v41_rows(x)[1][0])  # then scales
    assert bool((page[:5 * 512] == 0xEE).all())                         # other rows untouched


@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC", "BHLNC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_writes_match_reference_in_the_packed_slab(device, layout, dtype):
    plan = v41_plan(layout)
    gc = guarded(plan, device, seed=1)
    t = 41
    kv = special_rows(t, 512, dtype, seed=2)
    for i, (name, layer, floor) in enumerate([("c4_kv", 29, "amax"), ("c128_kv", 30, "amax"),
                                              ("swa0_kv", 0, "scale"), ("swa1_kv", 7, "amax")]):
        slots = distinct_slots(plan.num_blocks * plan.rows_per_block(name), t, seed=i)
        o4.v4_mla_quant_and_cache(kv.to(device), gc.view(name, layer), slots.to(device), floor,
                                  fmt=FMT)
        r4.v41_write(gc.expected_view(name, layer), slots, kv, floor)
    assert not torch.equal(gc.whole_expected, guarded(plan, seed=1).whole_expected)
    gc.assert_matches()  # every byte of the allocation: guards and the C128 pages' pad included


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_writes_match_reference_in_every_layout(layout):
    plan = split_plan(layout)
    gc = guarded(plan, seed=4)
    kv, k = special_rows(30, 512, torch.bfloat16, 5), special_rows(30, 128, torch.bfloat16, 6)
    slots = distinct_slots(plan.num_slots, 30, seed=7)
    for layer in (0, 1):
        o4.v4_dsa_write(kv, gc.view("v41", layer), k, gc.view("mx", layer), slots, fmt=FMT)
        r4.v41_write(gc.expected_view("v41", layer), slots, kv)
        r4.mxfp4_write(gc.expected_view("mx", layer), slots, k)
    gc.assert_matches()


@pytest.mark.parametrize("indexer", ["mxfp4", "fp8"])
def test_the_pair_write_with_either_indexer(device, indexer):
    plan = v41_plan(indexer=indexer)
    gc = guarded(plan, device, seed=12)
    kv, k = special_rows(20, 512, torch.float32, 13), special_rows(20, 128, torch.float32, 14)
    slots = distinct_slots(plan.num_blocks * plan.rows_per_block("c4_kv"), 20, seed=15)
    o4.v4_dsa_write(kv.to(device), gc.view("c4_kv", 3), k.to(device), gc.view("c4_indexer", 3),
                    slots.to(device), indexer=indexer, fmt=FMT)
    r4.v41_write(gc.expected_view("c4_kv", 3), slots, kv)
    (r4.mxfp4_write if indexer == "mxfp4" else r4.v4_indexer_write)(
        gc.expected_view("c4_indexer", 3), slots, k)
    gc.assert_matches()


def test_reads_by_slots_block_table_and_window(device):
    plan = v41_plan(num_blocks=12)
    gc = guarded(plan, device, seed=8)
    name, rows = "c4_kv", plan.rows_per_block("c4_kv")
    n = plan.num_blocks * rows
    x = special_rows(n, 512, torch.bfloat16, seed=9)[:n]
    every = torch.arange(n)
    o4.v4_mla_quant_and_cache(x.to(device), gc.view(name, 4), every.to(device), fmt=FMT)
    r4.v41_write(gc.expected_view(name, 4), every, x)
    gc.assert_matches()
    view, ref_view = gc.view(name, 4), gc.expected_view(name, 4)
    slots = torch.tensor([[5, -1, n - 1], [0, 3 * rows + 2, 7]])
    for dtype in (torch.bfloat16, torch.float32):
        got = o4.gather_v4_slots(view, slots.to(device), FMT, dtype=dtype)
        assert got.shape == (2, 3, 512) and _same(got.reshape(6, 512),
                                                  r4.v41_read(ref_view, slots.reshape(-1), dtype))
    raw = o4.gather_v4_slots(view, slots.to(device), FMT, raw=True)
    assert raw.shape == (2, 3, 528)
    assert _same(raw.reshape(6, -1), torch.cat(r4.v41_read(ref_view, slots.reshape(-1), raw=True), 1))
    bt = torch.tensor([[2, 0, 4], [1, 3, -1]], dtype=torch.int32)
    cu = torch.tensor([0, 2 * rows + 5, 2 * rows + 5 + rows], dtype=torch.int32)
    starts = torch.tensor([0, rows - 7], dtype=torch.int32)
    out = torch.full((int(cu[-1]) + 3, 512), -3.0, dtype=torch.bfloat16, device=device)
    o4.gather_v4(view, bt.to(device), cu.to(device), FMT, seq_starts=starts.to(device), out=out)
    assert _same(out[: int(cu[-1])], r4.v41_read(ref_view, r4.gather_slots(bt, cu, rows, starts)))
    assert bool((out[int(cu[-1]):] == -3.0).all())
    # compressed rows then the SWA window, both of V4.1 rows
    swa, swa_ref = gc.view("swa0_kv", 4), gc.expected_view("swa0_kv", 4)
    s_slots = torch.arange(plan.num_blocks * plan.rows_per_block("swa0_kv"))
    xs = special_rows(len(s_slots), 512, torch.bfloat16, seed=10)[:len(s_slots)]
    o4.v4_mla_quant_and_cache(xs.to(device), swa, s_slots.to(device), fmt=FMT)
    r4.v41_write(swa_ref, s_slots, xs)
    lens = torch.tensor([300, 5, 130], dtype=torch.int32)
    bt_c = torch.tensor([[0, 1], [2, -1], [3, -1]], dtype=torch.int32)
    bt_s = torch.tensor([[-1, -1, 4, 5, 6], [7, -1, -1, -1, -1], [8, 9, 10, -1, -1]], dtype=torch.int32)
    for dtype in (torch.bfloat16, torch.float32):
        want, cu_w = r4.gather_compressed_and_swa(ref_view, bt_c, 4, swa_ref, bt_s, lens,
                                                  dtype=dtype, fmt=FMT)
        got, cu_g = o4.gather_compressed_and_swa(view, bt_c.to(device), 4, swa, bt_s.to(device),
                                                 lens.to(device), dtype=dtype, fmt=FMT)
        assert cu_g.cpu().tolist() == cu_w.tolist() and _same(got, want)


def test_formats_are_checked():
    plan = v41_plan()
    gc = guarded(plan, seed=3)
    kv = torch.randn(3, 512).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"rows must be 528 bytes \(v41_mxfp8\)"):
        o4.v4_mla_quant_and_cache(kv, gc.view("c4_indexer", 0), torch.arange(3), fmt=FMT)
    with pytest.raises(ValueError, match=r'format must be "fp8_ds_mla_v4" or "v41_mxfp8" for main-KV'):
        o4.v4_mla_quant_and_cache(kv, gc.view("c4_kv", 0), torch.arange(3), fmt="mxfp4")
    with pytest.raises(ValueError, match=r"rows must be 584 bytes"):  # a V4.1 view is not a V4 one
        o4.v4_mla_quant_and_cache(kv, gc.view("c4_kv", 0), torch.arange(3))
    gc.assert_unchanged()


@pytest.mark.parametrize("layout", ["BLHNC", "BHLNC"])
def test_the_cuda_kernels_give_the_cpu_bytes_under_the_host_emulation(simt, layout):
    plan = v41_plan(layout, num_blocks=3)
    rows = plan.num_blocks * plan.rows_per_block("c4_kv")
    t = 37
    g = torch.Generator().manual_seed(22)
    slots = torch.randperm(rows, generator=g)[:t].to(torch.int64)
    slots[::7] = -1
    slots[3] = rows
    oracle = torch.where(slots >= rows, -1, slots)
    x = special_rows(t + 30, 600, torch.bfloat16, seed=23)
    cuda_gc, cpu_gc = guarded(plan, seed=24), guarded(plan, seed=24)
    for gc, s, ops in ((cuda_gc, slots, simt), (cpu_gc, oracle, torch.ops.kvcache_ext)):
        ops.v4_mla_quant_and_cache(x[:t, :512], gc.view("c4_kv", 1), s, "amax", FMT)
        ops.v4_mla_quant_and_cache(x[:t, 9:521], gc.view("swa0_kv", 2), s.flip(0), "scale", FMT)
        ops.v4_dsa_write(x[:t, 1:513], gc.view("c4_kv", 3), x[:t, 400:528], gc.view("c4_indexer", 1),
                         s, "amax", "mxfp4", FMT)
    assert torch.equal(cuda_gc.whole, cpu_gc.whole)
    view = cpu_gc.view("c4_kv", 1)
    read = torch.tensor([5, -1, 0, rows - 1])
    for dtype, cols in ((torch.bfloat16, 512), (torch.float32, 512), (torch.uint8, 528)):
        a = torch.full((4, cols), 7, dtype=dtype)
        b = a.clone()
        simt.gather_v4(view, None, None, None, read, FMT, a)
        torch.ops.kvcache_ext.gather_v4_slots(view, read, FMT, b, True)
        assert _same(a, b), dtype
