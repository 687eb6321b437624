"""The contract's sharp edges (issue 10): each test here failed before its fix.

Split pages on sliced views, spare output rows, validation before allocation, impossible sizes,
padding slots, duplicate slots, fp8 scales, one NaN, overlapping block copies and per-tensor
fp8 MLA rows (DeepSeek-V3/R1).
"""
from __future__ import annotations

import math

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import dsa_plan, guarded


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def rand(t: int, cols: int, seed: int = 0, dtype=torch.bfloat16, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, cols, generator=g) * scale).to(dtype)


# ---- 1. split placement never leaves the view --------------------------------------------------
def token_stepped(gc, name: str = "indexer") -> torch.Tensor:
    view = gc.view(name, 0)[:, :, ::2]  # every other token: token stride 264
    assert view.stride(2) == 264
    return view


@pytest.mark.parametrize("layout", ["BLHNC", "LBNHC"])
def test_split_refuses_a_view_whose_pages_are_not_contiguous(device, layout):
    gc = guarded(dsa_plan(layout, 16, 4), device)
    view = token_stepped(gc)
    k = rand(8, 128).to(device)
    slots = torch.arange(8, device=device)
    kv = rand(8, 576).to(device)
    match = r'view must have contiguous pages for placement="split" \(token stride 132'
    with pytest.raises(ValueError, match=match):
        kvc.ops.indexer_k_quant_and_cache(k, view, slots, None, "split")
    with pytest.raises(ValueError, match=match.replace("view", "indexer_view", 1)):
        kvc.ops.dsa_write(kv[:, :512], kv[:, 512:], gc.view("mla", 0), k, view, slots,
                          placement="split")
    table = torch.tensor([[0, 1]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=match):
        kvc.ops.gather_indexer(view, table, cu, "split")
    with pytest.raises(ValueError, match=match):
        kvc.ops.gather_indexer_slots(view, slots, "split")
    with pytest.raises(ValueError, match=match):  # the reference keeps the same contract
        ref.indexer_k_quant_and_cache(k.cpu(), gc.expected_view("indexer", 0)[:, :, ::2],
                                      slots.cpu(), None, "split")
    gc.assert_unchanged()


def test_row_placement_on_a_token_stepped_view_matches_the_reference(device):
    gc = guarded(dsa_plan("BLHNC", 16, 4), device)
    k = rand(20, 128, seed=1)
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(2))[:20]
    kvc.ops.indexer_k_quant_and_cache(k.to(device), token_stepped(gc), slots.to(device), "ue8m0")
    ref.indexer_k_quant_and_cache(k, gc.expected_view("indexer", 0)[:, :, ::2], slots, "ue8m0")
    gc.assert_matches()  # the reference used to write it as if the page were contiguous
    codes, scales = kvc.ops.gather_indexer_slots(token_stepped(gc), slots.to(device))
    want = ref.indexer_rows(k, "ue8m0")
    assert torch.equal(codes.cpu(), want[0]) and torch.equal(scales.cpu(), want[1])


# ---- 2. gathers leave a caller's spare output rows alone -----------------------------------------
def written_cache(device, mla_row: int = 656, kv: str = "fp8_ds_mla", scale=None):
    plan = dsa_plan("LBNHC", 16, 8, mla_row=mla_row)
    gc = guarded(plan, device)
    x = rand(128, 576, seed=3)
    k = rand(128, 128, seed=4)
    kvc.ops.concat_and_cache_mla(x[:, :512].to(device), x[:, 512:].to(device), gc.view("mla", 1),
                                 torch.arange(128, device=device), kv, scale=scale)
    kvc.ops.indexer_k_quant_and_cache(k.to(device), gc.view("indexer", 1),
                                      torch.arange(128, device=device))
    table = torch.tensor([[3, 1, 0], [2, 5, 7]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 40, 45], dtype=torch.int32, device=device)
    return gc, table, cu


@pytest.mark.parametrize("mode", ["bf16", "fp32", "raw", "auto", "fp8"])
def test_gather_mla_keeps_rows_past_the_last_token(device, mode):
    kv = {"auto": "auto", "fp8": "fp8"}.get(mode, "fp8_ds_mla")
    row = {"auto": 1152, "fp8": 576}.get(mode, 656)
    scale = 0.05 if mode == "fp8" else None
    gc, table, cu = written_cache(device, row, kv, scale)
    dtype = {"fp32": torch.float32, "raw": torch.uint8}.get(mode, torch.bfloat16)
    cols = row if mode == "raw" else 576
    out = torch.randint(0, 256, (64, cols * dtype.itemsize), dtype=torch.uint8).view(dtype)
    out = out.to(device)
    before = out.clone()
    kvc.ops.gather_mla(gc.view("mla", 1), table, cu, kv, raw=mode == "raw", out=out, scale=scale)
    want = ref.gather_mla(gc.view("mla", 1).cpu(), table.cpu(), cu.cpu(), kv,
                          raw=mode == "raw", dtype=dtype if mode != "raw" else None, scale=scale)
    assert torch.equal(bits(out[:45]), bits(want))
    assert torch.equal(bits(out[45:]), bits(before[45:]))  # vLLM: upper-bound outputs


def test_gather_indexer_keeps_rows_past_the_last_token(device):
    """vLLM's test_indexer_gather_accepts_upper_bound_output, here."""
    gc, table, cu = written_cache(device)
    codes = torch.full((64, 128), 0xAB, dtype=torch.uint8, device=device)
    scales = torch.full((64,), -3.5, device=device)
    kvc.ops.gather_indexer(gc.view("indexer", 1), table, cu, out=(codes, scales))
    want = ref.gather_indexer(gc.view("indexer", 1).cpu(), table.cpu(), cu.cpu())
    assert torch.equal(codes[:45].cpu(), want[0]) and torch.equal(scales[:45].cpu(), want[1])
    assert bool((codes[45:] == 0xAB).all()) and bool((scales[45:] == -3.5).all())


# ---- 3. gathers validate before they allocate ----------------------------------------------------
@pytest.mark.parametrize("cu,match", [
    ([0, 2**31 - 1], r"cu_seq_lens\[-1\] = 2147483647 exceeds what block_table"),
    ([0, 40, -5], r"cu_seq_lens must be non-decreasing"),
    ([0, -5], r"cu_seq_lens must be non-decreasing"),
    ([3, 10], r"cu_seq_lens\[0\] must be 0"),
])
@pytest.mark.parametrize("op", ["gather_mla", "gather_indexer"])
def test_gathers_refuse_bad_lengths_before_allocating(device, cu, match, op, monkeypatch):
    gc, table, _ = written_cache(device)
    view = gc.view("mla" if op == "gather_mla" else "indexer", 1)
    allocations = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocations.append(a) or real_empty(*a, **k))
    with pytest.raises(ValueError, match=match):
        getattr(kvc.ops, op)(view, table[: len(cu) - 1],
                             torch.tensor(cu, dtype=torch.int32, device=device))
    assert allocations == []


def test_negative_num_tokens_is_refused():
    gc, table, cu = written_cache("cpu")
    with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
        kvc.ops.gather_mla(gc.view("mla", 1), table, cu, num_tokens=-1)


# ---- 4. sizes that cannot exist ------------------------------------------------------------------
def test_plan_beyond_int64_is_refused():
    specs = [kvc.CacheSpec("mla", 656, 61), kvc.CacheSpec("indexer", 132, 61)]
    block = 61 * 788 * 64
    ok = kvc.plan_cache(specs, num_blocks=(2**63 - 1) // block, block_size=64, layout="BLHNC")
    assert ok.total_bytes <= 2**63 - 1
    with pytest.raises(ValueError, match=r"num_blocks = \d+ makes a buffer of \d+ bytes"):
        kvc.plan_cache(specs, num_blocks=(2**63 - 1) // block + 1, block_size=64)


def test_allocation_failure_is_one_line_with_size_and_device():
    plan = kvc.plan_cache([kvc.CacheSpec("kv", 2**20, 1)], num_blocks=2**22, block_size=2**10)
    with pytest.raises(MemoryError) as e:
        kvc.allocate(plan, "cpu")  # 4 PiB
    msg = str(e.value)
    assert "\n" not in msg and f"{plan.total_bytes} bytes" in msg and "on cpu" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_pinned_allocation_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match=r"^pin_memory=True needs a CUDA GPU") as e:
        kvc.allocate(dsa_plan("BLHNC", 16, 4), pin_memory=True)
    assert "\n" not in str(e.value)


# ---- 5. padding is explicit ----------------------------------------------------------------------
def test_negative_block_table_entry_gives_slot_minus_one():
    table = torch.tensor([[4, -1, 7], [-62, 2, 3]], dtype=torch.int32)
    pos = torch.tensor([0, 20, 40, 5, 17], dtype=torch.int64)
    req = torch.tensor([0, 0, 0, 1, 1])
    assert kvc.slot_mapping(table, pos, 16, req).tolist() == [64, -1, 120, -1, 33]


# ---- 6. duplicate slots --------------------------------------------------------------------------
def dup_case():
    gc = guarded(dsa_plan("BLHNC", 16, 4))
    slots = torch.tensor([5, 9, -1, 17, 9, -1, 30])
    return gc, rand(7, 576), rand(7, 128), slots


@pytest.mark.parametrize("op", ["mla", "mla_fp8", "indexer", "dsa", "plain"])
def test_duplicate_slots_are_refused_before_writing(op):
    gc, x, k, slots = dup_case()
    match = r"slot_mapping\[1\] and slot_mapping\[4\] are both slot 9"
    with pytest.raises(ValueError, match=match):
        if op == "mla":
            kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.view("mla", 0), slots)
        elif op == "mla_fp8":
            plan = dsa_plan("BLHNC", 16, 4, mla_row=576)
            gc = guarded(plan)
            kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.view("mla", 0), slots,
                                         "fp8", scale=1.0)
        elif op == "indexer":
            kvc.ops.indexer_k_quant_and_cache(k, gc.view("indexer", 0), slots)
        elif op == "dsa":
            kvc.ops.dsa_write(x[:, :512], x[:, 512:], gc.view("mla", 0), k, gc.view("indexer", 0),
                              slots)
        else:
            kvc.ops.reshape_and_cache(k.reshape(7, 1, 128)[:, :, :66].contiguous(),
                                      gc.view("indexer", 0), slots)
    gc.assert_unchanged()


def test_duplicate_check_on_a_large_sparse_view():
    """Few tokens in a view of many slots take the sorted path: the same error."""
    plan = kvc.plan_cache([kvc.CacheSpec("kv", 4, 1)], num_blocks=2**16, block_size=64)
    cache = kvc.allocate(plan, fill=0)
    slots = torch.tensor([2**22 - 1, 3, 2**22 - 1])
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] and slot_mapping\[2\] are both slot 4194303"):
        kvc.ops.reshape_and_cache(torch.ones(3, 1, 2, dtype=torch.float16), cache.view("kv", 0),
                                  slots)
    assert not cache.buffer.any()


def test_check_slot_mapping(device):
    view = dsa_plan("BLHNC", 16, 4)
    cache = kvc.allocate(view, device, fill=0)
    v = cache.view("mla", 0)
    kvc.check_slot_mapping(torch.tensor([0, 63, -1, -1, 5], device=device), v)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] and slot_mapping\[3\] are both slot 7"):
        kvc.check_slot_mapping(torch.tensor([4, 7, -1, 7, 7], device=device), v)
    with pytest.raises(IndexError, match=r"slot_mapping\[2\] = 64 is outside"):
        kvc.check_slot_mapping(torch.tensor([4, 7, 64], device=device), v)


# ---- 7. fp8 scales are sane ----------------------------------------------------------------------
BAD_SCALES = [0.0, -1.0, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("bad", BAD_SCALES)
@pytest.mark.parametrize("as_tensor", [True, False])
def test_bad_fp8_scales_are_refused(bad, as_tensor):
    plan = kvc.plan_cache([kvc.CacheSpec("k", 8, 1, 2), kvc.CacheSpec("mla", 576, 1)], 4, 16)
    gc = guarded(plan)
    scale = torch.tensor([bad]) if as_tensor else bad
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        kvc.ops.reshape_and_cache(rand(5, 16).reshape(5, 2, 8), gc.view("k", 0), torch.arange(5),
                                  "fp8", scale)
    x = rand(5, 576)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.view("mla", 0), torch.arange(5),
                                     "fp8", scale)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        kvc.ops.gather_mla_slots(gc.view("mla", 0), torch.arange(5), "fp8", scale=scale)
    gc.assert_unchanged()


def test_scale_as_python_float_gives_the_tensor_bytes():
    plan = kvc.plan_cache([kvc.CacheSpec("k", 8, 1, 2)], 4, 16)
    a, b = kvc.allocate(plan, fill=0), kvc.allocate(plan, fill=0)
    key = rand(9, 16).reshape(9, 2, 8)
    kvc.ops.reshape_and_cache(key, a.view("k", 0), torch.arange(9), "fp8", 0.25)
    kvc.ops.reshape_and_cache(key, b.view("k", 0), torch.arange(9), "fp8", torch.tensor([0.25]))
    assert torch.equal(a.buffer, b.buffer) and a.buffer.any()


# ---- 8. one NaN ----------------------------------------------------------------------------------
def test_fp32_reads_give_one_nan(device):
    """A NaN code, and a negative-NaN tile scale: x86 would keep the sign (0xFFC00000)."""
    gc, table, cu = written_cache(device)
    view = gc.view("mla", 1)
    row = view[3, 0, 0]  # slot 48: request 0's first token
    row[:4] = 0x7F
    row[512 + 4:512 + 8] = torch.tensor([-math.nan]).view(torch.uint8).to(device)
    got = kvc.ops.gather_mla(view, table, cu, dtype=torch.float32)
    nan = bits(got[0])[got[0].cpu().isnan()]
    assert nan.numel() == 4 + 128 and bool((nan == 0x7FC00000).all())
    idx = gc.view("indexer", 1)
    idx[3, 0, 0, :2] = 0xFF  # negative-NaN codes
    deq = kvc.ops.gather_indexer(idx, table, cu, dequant=torch.float32)
    nan = bits(deq[0])[deq[0].cpu().isnan()]
    assert nan.numel() == 2 and bool((nan == 0x7FC00000).all())
    want = ref.gather_mla(gc.view("mla", 1).cpu(), table.cpu(), cu.cpu(), dtype=torch.float32)
    assert torch.equal(bits(got), bits(want))


# ---- 9. block copies are never undefined ---------------------------------------------------------
def test_chained_pairs_within_one_cache_are_refused(device):
    plan = dsa_plan("BLHNC", 16, 8)
    gc = guarded(plan, device)
    with pytest.raises(ValueError, match=r"block_mapping\[1\] writes block 1, which a pair of the same call reads"):
        kvc.copy_blocks(gc.cache, gc.cache, torch.tensor([[0, 1], [1, 2]][::-1]))
    with pytest.raises(ValueError, match="both copy into block 3"):
        kvc.copy_blocks(gc.cache, kvc.allocate(plan, device), torch.tensor([[0, 3], [1, 3]]))
    gc.assert_unchanged()
    kvc.copy_blocks(gc.cache, gc.cache, torch.tensor([[0, 4], [1, 5]]))  # disjoint: fine


def test_copy_spans_refuses_overlaps():
    buf = torch.arange(64, dtype=torch.uint8)
    other = torch.zeros(64, dtype=torch.uint8)
    ops = torch.ops.kvcache_ext
    with pytest.raises(ValueError, match=r"spans\[0\] and spans\[1\] write overlapping"):
        ops.copy_spans(buf, other, torch.tensor([[0, 0, 8], [16, 4, 8]]))
    with pytest.raises(ValueError, match=r"spans\[1\] writes bytes that spans\[0\] reads"):
        ops.copy_spans(buf, buf, torch.tensor([[0, 32, 8], [40, 4, 8]]))
    with pytest.raises(ValueError, match=r"spans\[0\] writes bytes that spans\[0\] reads"):
        ops.copy_spans(buf[8:], buf[:40], torch.tensor([[0, 4, 8]]))  # views of one buffer
    assert torch.equal(buf, torch.arange(64, dtype=torch.uint8)) and not other.any()
    ops.copy_spans(buf, buf, torch.tensor([[0, 32, 8], [8, 40, 8]]))
    assert torch.equal(buf[32:48], torch.arange(16, dtype=torch.uint8))


# ---- 10. per-tensor fp8 MLA rows (DeepSeek-V3/R1) ------------------------------------------------
@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_mla_fp8_per_tensor_rows(device, layout, block_size):
    nb = max(4, 160 // block_size)
    plan = dsa_plan(layout, block_size, nb, mla_row=576)
    gc = guarded(plan, device)
    t = 70
    x = rand(t + 3, 576, seed=block_size, scale=40.0)  # 3 padding rows beyond T
    x[5, 7] = float("nan")
    x[6, 100] = float("inf")
    x[7, 530] = -1e9  # saturates
    slots = torch.randperm(plan.num_slots, generator=torch.Generator().manual_seed(1))[:t]
    slots[::9] = -1
    scale = torch.tensor([0.125])
    kvc.ops.concat_and_cache_mla(x[:, :512].to(device), x[:, 512:].to(device), gc.view("mla", 1),
                                 slots.to(device), "fp8", scale.to(device))
    ref.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.expected_view("mla", 1), slots, "fp8",
                             scale)
    gc.assert_matches()
    rows = ref.mla_fp8_tensor_rows(x[:1, :512], x[:1, 512:], 0.125)
    assert rows.shape == (1, 576)
    assert torch.equal(rows[0], ref.e4m3_encode(x[0].float() / 0.125))  # by hand: one scale
    table = torch.full((2, -(-plan.num_slots // block_size)), -1, dtype=torch.int32)
    table[0, :nb] = torch.randperm(nb, generator=torch.Generator().manual_seed(2)).to(torch.int32)
    cu = torch.tensor([0, min(50, plan.num_slots), min(50, plan.num_slots)], dtype=torch.int32)
    for dtype in (torch.bfloat16, torch.float32):
        got = kvc.ops.gather_mla(gc.view("mla", 1), table.to(device), cu.to(device), "fp8",
                                 dtype=dtype, scale=0.125)
        want = ref.gather_mla(gc.expected_view("mla", 1), table, cu, "fp8", dtype=dtype,
                              scale=0.125)
        assert got.dtype == dtype and torch.equal(bits(got), bits(want))
    live = slots[slots >= 0][:20]
    got = kvc.ops.gather_mla_slots(gc.view("mla", 1), live.to(device), "fp8", scale=scale)
    rt = ref.mla_fp8_tensor_dequant(ref.mla_fp8_tensor_rows(
        x[:t][slots >= 0][:20, :512], x[:t][slots >= 0][:20, 512:], 0.125), 0.125)
    assert torch.equal(bits(got), bits(rt))  # round trip: what was written comes back
    raw = kvc.ops.gather_mla_slots(gc.view("mla", 1), live.to(device), "fp8", raw=True,
                                   scale=scale)
    assert raw.shape == (20, 576) and torch.equal(raw.cpu(), ref.read_rows(gc.expected_view("mla", 1), live))


def test_mla_fp8_needs_its_scale_and_row():
    gc = guarded(dsa_plan("BLHNC", 16, 4, mla_row=576))
    x = rand(4, 576)
    with pytest.raises(ValueError, match='scale is required when kv_cache_dtype is "fp8"'):
        kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.view("mla", 0), torch.arange(4), "fp8")
    with pytest.raises(ValueError, match="dsa_write writes fp8_ds_mla or auto"):
        kvc.ops.dsa_write(x[:, :512], x[:, 512:], gc.view("mla", 0), x[:, :128],
                          gc.view("indexer", 0), torch.arange(4), "fp8")
    with pytest.raises(TypeError, match="scale must be float32"):
        kvc.ops.gather_mla_slots(gc.view("mla", 0), torch.arange(4), "fp8",
                                 scale=torch.tensor([1.0], dtype=torch.float64))
    gc.assert_unchanged()


def test_reference_dsa_write_refuses_split_before_writing():
    gc = guarded(dsa_plan("BLHNC", 16, 4))
    kv, k = rand(8, 576), rand(8, 128)
    with pytest.raises(ValueError, match="contiguous pages"):
        ref.dsa_write(kv[:, :512], kv[:, 512:], gc.expected_view("mla", 0), k,
                      gc.expected_view("indexer", 0)[:, :, ::2], torch.arange(8), placement="split")
    gc.assert_unchanged()  # the MLA rows were not written first


def test_a_request_longer_than_its_table_row_is_refused_before_allocating(monkeypatch):
    gc, _, _ = written_cache("cpu")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)  # 32 tokens per row
    allocations = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocations.append(a) or real_empty(*a, **k))
    with pytest.raises(ValueError, match="cu_seq_lens: request 0 has 40 tokens"):
        kvc.ops.gather_mla(gc.view("mla", 1), table, torch.tensor([0, 40, 45], dtype=torch.int32))
    assert allocations == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_allocation_without_a_driver_is_not_called_out_of_memory():
    with pytest.raises(RuntimeError, match="on cuda") as e:
        kvc.allocate(dsa_plan("BLHNC", 16, 4), "cuda")
    assert not isinstance(e.value, MemoryError) and "\n" not in str(e.value)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_plan_address_of_a_split_spec_is_where_the_op_writes(layout):
    """CachePlan.address (and the CLI's walk built on it) follows split pages."""
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2, split=(128, 4))]
    plan = kvc.plan_cache(specs, 6, 16, layout)
    cache = kvc.allocate(plan, fill=0)
    k = rand(40, 128, seed=5)
    slots = torch.randperm(plan.num_slots, generator=torch.Generator().manual_seed(6))[:40]
    kvc.ops.indexer_k_quant_and_cache(k, cache.view("indexer", 1), slots, placement="split")
    codes, scales = ref.indexer_rows(k)
    for t in (0, 7, 39):
        slot = int(slots[t])
        at = [plan.address("indexer", 1, slot, 0, b) for b in range(132)]
        assert torch.equal(cache.buffer[at[:128]], codes[t])
        assert torch.equal(cache.buffer[at[128:]], scales[t:t + 1].view(torch.uint8))
