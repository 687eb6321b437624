"""Gathers by block table and by slot: bit-exact against the reference, round trips, bounds."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import dsa_plan, guarded, requests


def bits(t: torch.Tensor) -> torch.Tensor:
    """Compare floats by their bits (NaN patterns are canonical in both paths)."""
    t = t.cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def filled(layout: str, block_size: int, num_blocks: int, device: str, seed: int = 0,
           mla_row: int = 656, dtype=torch.bfloat16):
    """A cache whose every slot of layer 1 holds written rows (plus random other bytes)."""
    plan = dsa_plan(layout, block_size, num_blocks, mla_row=mla_row)
    gc = guarded(plan, device, seed)
    n = plan.num_slots
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, 576, generator=g) * 3).to(dtype)
    k = torch.randn(n, 128, generator=g).to(torch.bfloat16)
    slots = torch.arange(n)
    kv = "fp8_ds_mla" if mla_row == 656 else "auto"
    for view in (gc.view, gc.expected_view):
        dev = view("mla", 1).device
        ref.concat_and_cache_mla(x[:, :512].to(dev), x[:, 512:].to(dev), view("mla", 1),
                                 slots.to(dev), kv)
    return gc, x, k


LENS = [[0], [1], [5, 0, 70, 1], [130, 64, 3]]


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("lens", range(len(LENS)))
def test_gather_mla_fp8(device, layout, block_size, lens):
    lens = LENS[lens]
    nb = max(4, sum(-(-n // block_size) for n in lens) + 2)
    gc, x, _ = filled(layout, block_size, nb, device, seed=block_size)
    table, cu = requests(block_size, nb, lens, seed=len(lens))
    view, eview = gc.view("mla", 1), gc.expected_view("mla", 1)
    want = ref.gather_mla(eview, table, cu)
    got = kvc.ops.gather_mla(view, table.to(device), cu.to(device))
    assert got.shape == (sum(lens), 576) and got.dtype == torch.bfloat16
    assert torch.equal(bits(got), bits(want))
    raw = kvc.ops.gather_mla(view, table.to(device), cu.to(device), raw=True)
    assert torch.equal(raw.cpu(), ref.gather_mla(eview, table, cu, raw=True))
    f32 = kvc.ops.gather_mla(view, table.to(device), cu.to(device), dtype=torch.float32)
    assert torch.equal(f32.cpu(), ref.gather_mla(eview, table, cu, dtype=torch.float32))
    # Round trip: what was written comes back as the reference dequantization of the input.
    slots = ref.gather_slots(table, cu, block_size)
    rt = ref.mla_dequant(ref.mla_fp8_rows(x[slots, :512], x[slots, 512:]))
    assert torch.equal(bits(got), bits(rt))
    gc.assert_matches()  # reads write nothing


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gather_mla_auto_round_trip(device, layout, dtype):
    gc, x, _ = filled(layout, 16, 12, device, mla_row=576 * dtype.itemsize, dtype=dtype)
    table, cu = requests(16, 12, [40, 17], seed=2)
    got = kvc.ops.gather_mla(gc.view("mla", 1), table.to(device), cu.to(device), "auto", dtype=dtype)
    slots = ref.gather_slots(table, cu, 16)
    assert got.dtype == dtype and torch.equal(bits(got), bits(x[slots]))


def test_gather_with_seq_starts_and_out(device):
    gc, x, _ = filled("BLHNC", 16, 20, device)
    table, _ = requests(16, 20, [100, 150], seed=4)
    starts = torch.tensor([90, 20], dtype=torch.int32)
    cu = torch.tensor([0, 10, 140], dtype=torch.int32)  # request 0: positions 90..99, 1: 20..149
    out = torch.full((140, 576), 7.0, dtype=torch.bfloat16, device=device)
    got = kvc.ops.gather_mla(gc.view("mla", 1), table.to(device), cu.to(device),
                             seq_starts=starts.to(device), out=out)
    assert got.data_ptr() == out.data_ptr()
    want = ref.gather_mla(gc.expected_view("mla", 1), table, cu, seq_starts=starts)
    assert torch.equal(bits(got), bits(want))
    slots = ref.gather_slots(table, cu, 16, starts)
    assert slots[0] == table[0, 5] * 16 + 10


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("placement", ["row", "split"])
def test_gather_indexer_round_trip(device, layout, block_size, placement):
    nb = max(4, 200 // block_size + 2)
    plan = dsa_plan(layout, block_size, nb)
    gc = guarded(plan, device)
    lens = [0, 1, 77, 64]
    table, cu = requests(block_size, nb, lens, seed=block_size)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(plan.num_slots, 128, generator=g).to(torch.bfloat16)
    kvc.ops.indexer_k_quant_and_cache(k.to(device), gc.view("indexer", 0),
                                      torch.arange(plan.num_slots, device=device), "ue8m0", placement)
    codes, scales = kvc.ops.gather_indexer(gc.view("indexer", 0), table.to(device), cu.to(device),
                                           placement)
    slots = ref.gather_slots(table, cu, block_size)
    want_codes, want_scales = ref.indexer_rows(k[slots], "ue8m0")
    assert torch.equal(codes.cpu(), want_codes) and torch.equal(scales.cpu(), want_scales)
    deq = kvc.ops.gather_indexer(gc.view("indexer", 0), table.to(device), cu.to(device), placement,
                                 dequant=torch.float32)
    assert torch.equal(deq.cpu(), ref.indexer_dequant(want_codes, want_scales))


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC", "BHLNC"])
def test_gather_by_slots(device, layout):
    gc, x, _ = filled(layout, 16, 16, device)
    g = torch.Generator().manual_seed(9)
    slots = torch.randint(0, 256, (3, 40), generator=g)
    slots[1, 5] = -1
    got = kvc.ops.gather_mla_slots(gc.view("mla", 1), slots.to(device))
    assert got.shape == (3, 40, 576)
    want = ref.gather_mla_slots(gc.expected_view("mla", 1), slots)
    assert torch.equal(bits(got), bits(want))
    assert not got[1, 5].any()
    raw = kvc.ops.gather_mla_slots(gc.view("mla", 1), slots.to(device), raw=True)
    assert torch.equal(raw.cpu(), ref.gather_mla_slots(gc.expected_view("mla", 1), slots, raw=True))
    kvc.ops.indexer_k_quant_and_cache(x[:256, :128].to(device), gc.view("indexer", 1),
                                      torch.arange(256, device=device), None, "split")
    codes, scales = kvc.ops.gather_indexer_slots(gc.view("indexer", 1), slots.to(device), "split")
    wc, ws = ref.indexer_rows(x[slots.clamp(min=0).reshape(-1), :128])
    wc[5 + 40] = 0
    ws[5 + 40] = 0
    assert torch.equal(codes.cpu().reshape(-1, 128), wc) and torch.equal(scales.cpu().reshape(-1), ws)


# ---- bounds ---------------------------------------------------------------------------------
def bounds_case(device):
    gc, _, _ = filled("BLHNC", 16, 8, device)
    table, cu = requests(16, 8, [40, 20], seed=1)
    return gc, table.to(device), cu.to(device)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda t, c: (t.clone().index_fill_(1, torch.tensor([0], device=t.device), 8), c), IndexError, r"block_table\[0, 0\] = 8"),
    (lambda t, c: (t.clone().index_fill_(1, torch.tensor([1], device=t.device), -3), c), IndexError, r"block_table\[0, 1\]"),
    (lambda t, c: (t, torch.tensor([0, 10, 60], dtype=torch.int32, device=c.device)), IndexError, "block_table holds"),
    (lambda t, c: (t, torch.tensor([1, 40, 60], dtype=torch.int32, device=c.device)), ValueError, r"cu_seq_lens\[0\] must be 0"),
    (lambda t, c: (t, torch.tensor([0, 40, 30], dtype=torch.int32, device=c.device)), ValueError, "non-decreasing"),
    (lambda t, c: (t.long(), c), TypeError, "block_table must be int32"),
    (lambda t, c: (t, c[:2]), ValueError, "cu_seq_lens must be 1-D with 3 entries"),
])
def test_gather_bounds(device, mutate, exc, match):
    gc, table, cu = bounds_case(device)
    t, c = mutate(table, cu)
    with pytest.raises(exc, match=match):
        kvc.ops.gather_mla(gc.view("mla", 1), t, c, num_tokens=60)
    gc.assert_matches()


def test_slot_gather_bounds(device):
    gc, _, _ = bounds_case(device)
    with pytest.raises(IndexError, match=r"slots\[3\]"):
        kvc.ops.gather_mla_slots(gc.view("mla", 1), torch.tensor([0, 1, 2, 128], device=device))
    with pytest.raises(TypeError, match="slots must be int64"):
        kvc.ops.gather_indexer_slots(gc.view("indexer", 1), torch.tensor([0], dtype=torch.int32,
                                                                         device=device))


def test_unvalidated_reads_stay_inside_the_view(device):
    """With validate=False bad entries must not be read: they come back as zero rows."""
    gc, table, cu = bounds_case(device)
    bad = table.clone()
    bad[0, 1] = 1 << 30
    bad[1, 0] = -5
    got = kvc.ops.gather_mla(gc.view("mla", 1), bad, cu, validate=False)
    good = kvc.ops.gather_mla(gc.view("mla", 1), table, cu)
    zero = torch.zeros(576, dtype=torch.bfloat16)
    for t in range(60):
        r, pos = (0, t) if t < 40 else (1, t - 40)
        if (r, pos // 16) in ((0, 1), (1, 0)):
            assert torch.equal(got[t].cpu(), zero)
        else:
            assert torch.equal(bits(got[t]), bits(good[t]))
    slots = torch.tensor([0, 1 << 40, -(1 << 40), 5], device=device)
    got = kvc.ops.gather_mla_slots(gc.view("mla", 1), slots, validate=False)
    assert not got[1].any() and not got[2].any() and got[3].any()
