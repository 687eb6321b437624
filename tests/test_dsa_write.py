"""DSA writes: fp8_ds_mla / auto MLA rows, indexer rows, and the fused one-launch write."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import dsa_plan, guarded, random_slots

SIZES = [0, 1, 63, 4096]


def inputs(num_tokens: int, seed: int, dtype=torch.bfloat16, extra_rows: int = 2):
    """kv_c and k_pe as slices of one [T, 576] projection, as models produce them."""
    g = torch.Generator().manual_seed(seed)
    fused = (torch.randn(num_tokens + extra_rows, 576, generator=g) * 4).to(dtype)
    k_idx = (torch.randn(num_tokens + extra_rows, 128, generator=g) * 2).to(dtype)
    return fused[:, :512], fused[:, 512:], k_idx


def plan_for(layout: str, block_size: int, num_tokens: int, mla_row: int = 656):
    num_blocks = max(2, -(-(num_tokens + 50) // block_size))
    return dsa_plan(layout, block_size, num_blocks, mla_row=mla_row)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_tokens", SIZES)
def test_mla_fp8_ds_mla(device, layout, block_size, num_tokens):
    plan = plan_for(layout, block_size, num_tokens)
    gc = guarded(plan, device, seed=num_tokens)
    kv_c, k_pe, _ = inputs(num_tokens, block_size)
    slots = random_slots(num_tokens, plan.num_slots, seed=7, pad_every=9)
    kvc.ops.concat_and_cache_mla(kv_c.to(device), k_pe.to(device), gc.view("mla", 1),
                                 slots.to(device))
    ref.concat_and_cache_mla(kv_c, k_pe, gc.expected_view("mla", 1), slots)
    gc.assert_matches()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mla_auto(device, layout, dtype):
    plan = plan_for(layout, 16, 100, mla_row=576 * dtype.itemsize)
    gc = guarded(plan, device)
    kv_c, k_pe, _ = inputs(100, 3, dtype)
    slots = random_slots(100, plan.num_slots, pad_every=4)
    kvc.ops.concat_and_cache_mla(kv_c.to(device), k_pe.to(device), gc.view("mla", 0),
                                 slots.to(device), "auto")
    ref.concat_and_cache_mla(kv_c, k_pe, gc.expected_view("mla", 0), slots, "auto")
    gc.assert_matches()


def test_mla_fp16_input(device):
    plan = plan_for("BLHNC", 16, 64)
    gc = guarded(plan, device)
    kv_c, k_pe, _ = inputs(64, 5, torch.float16)
    slots = random_slots(64, plan.num_slots)
    kvc.ops.concat_and_cache_mla(kv_c.to(device), k_pe.to(device), gc.view("mla", 0), slots.to(device))
    ref.concat_and_cache_mla(kv_c, k_pe, gc.expected_view("mla", 0), slots)
    gc.assert_matches()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_tokens", SIZES)
@pytest.mark.parametrize("placement", ["row", "split"])
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_indexer(device, layout, block_size, num_tokens, placement, scale_fmt):
    plan = plan_for(layout, block_size, num_tokens)
    gc = guarded(plan, device, seed=block_size)
    _, _, k = inputs(num_tokens, num_tokens)
    slots = random_slots(num_tokens, plan.num_slots, seed=3, pad_every=7)
    kvc.ops.indexer_k_quant_and_cache(k.to(device), gc.view("indexer", 1), slots.to(device),
                                      scale_fmt, placement)
    ref.indexer_k_quant_and_cache(k, gc.expected_view("indexer", 1), slots, scale_fmt, placement)
    gc.assert_matches()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("placement", ["row", "split"])
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_indexer_strided_input(device, dtype, placement, scale_fmt):
    """k as a slice of wider rows (the CPU kernel reads tokens in batches, tiles k_stride apart),
    token counts that leave partial batches in each thread's share, padding slots."""
    plan = plan_for("BLHNC", 16, 301)
    gc = guarded(plan, device, seed=4)
    g = torch.Generator().manual_seed(8)
    wide = (torch.randn(301, 160, generator=g) * 3).to(dtype)
    wide[5, 7] = float("nan")
    wide[6, 0] = float("-inf")
    wide[9] = 0.0
    k = wide[:, 16:144]
    slots = random_slots(301, plan.num_slots, seed=6, pad_every=5)
    kvc.ops.indexer_k_quant_and_cache(k.to(device), gc.view("indexer", 1), slots.to(device),
                                      scale_fmt, placement)
    ref.indexer_k_quant_and_cache(k, gc.expected_view("indexer", 1), slots, scale_fmt, placement)
    gc.assert_matches()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 64])
@pytest.mark.parametrize("placement", ["row", "split"])
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fused_dsa_write(device, layout, block_size, placement, scale_fmt):
    plan = plan_for(layout, block_size, 300)
    gc = guarded(plan, device)
    kv_c, k_pe, k = inputs(300, 11)
    slots = random_slots(300, plan.num_slots, seed=5, pad_every=13)
    d = lambda t: t.to(device)  # noqa: E731
    kvc.ops.dsa_write(d(kv_c), d(k_pe), gc.view("mla", 1), d(k), gc.view("indexer", 1), d(slots),
                      "fp8_ds_mla", scale_fmt, placement)
    ref.dsa_write(kv_c, k_pe, gc.expected_view("mla", 1), k, gc.expected_view("indexer", 1), slots,
                  "fp8_ds_mla", scale_fmt, placement)
    gc.assert_matches()


EDGE_ROWS = {
    "zeros": torch.zeros(576),
    "tiny": torch.full((576,), 1e-30),
    "saturate": torch.tensor([448.0, -448.0, 1e4, -1e4] * 144),
    "mixed_inf_nan": torch.tensor([float("inf"), float("nan"), -float("inf"), 1.0] * 144),
    "one_nan": torch.cat([torch.tensor([float("nan")]), torch.linspace(-3, 3, 575)]),
    "subnormal_codes": torch.cat([torch.tensor([1000.0]), torch.full((575,), 0.01)]),
}


@pytest.mark.parametrize("case", EDGE_ROWS)
def test_edge_values_all_paths_agree(device, case):
    plan = plan_for("BLHNC", 16, 8)
    gc = guarded(plan, device)
    row = EDGE_ROWS[case].to(torch.bfloat16)
    fused = torch.stack([row, row.flip(0)])
    kv_c, k_pe, k = fused[:, :512], fused[:, 512:], fused[:, 100:228]
    slots = torch.tensor([3, 17])
    kvc.ops.dsa_write(kv_c.to(device), k_pe.to(device), gc.view("mla", 0), k.to(device),
                      gc.view("indexer", 0), slots.to(device), "fp8_ds_mla", "ue8m0", "split")
    ref.dsa_write(kv_c, k_pe, gc.expected_view("mla", 0), k, gc.expected_view("indexer", 0), slots,
                  "fp8_ds_mla", "ue8m0", "split")
    gc.assert_matches()


def test_row_format_by_hand():
    """One token spelled out byte by byte against SPEC 3."""
    plan = dsa_plan("BLHNC", 64, 8)
    cache = kvc.allocate(plan, fill=0)
    kv_c = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv_c[0, 0], kv_c[0, 128], kv_c[0, 300] = 448.0, -2.0, 0.5   # tiles 0, 1, 2; tile 3 zero
    k_pe = torch.arange(64, dtype=torch.bfloat16).view(1, 64)
    kvc.ops.concat_and_cache_mla(kv_c, k_pe, cache.view("mla", 1), torch.tensor([322]))
    row = cache.buffer[547616:547616 + 656]
    # the default tile scales are powers of two: 2^ceil(log2(max(amax / 448, 1e-4)))
    assert row[512:528].view(torch.float32).tolist() == [1.0, 2.0 ** -7, 2.0 ** -9, 2.0 ** -13]
    assert row[0] == 0x7E and row[128] == 0xF8 and row[300] == 0x78 and row[1] == 0  # 448, -256, 256
    kvc.ops.concat_and_cache_mla(kv_c, k_pe, cache.view("mla", 1), torch.tensor([322]),
                                 tile_scale="fp32")
    scales = row[512:528].view(torch.float32)
    want = torch.tensor([448.0, 2.0, 0.5, 0.0]) / 448.0
    want[3] = torch.finfo(torch.float32).tiny
    assert torch.equal(scales, want)
    assert row[0] == 0x7E and row[128] == 0xFE and row[300] == 0x7E and row[1] == 0
    assert torch.equal(row[528:].view(torch.bfloat16), k_pe[0])
    k = torch.zeros(1, 128, dtype=torch.bfloat16)
    k[0, 5] = -3.0
    kvc.ops.indexer_k_quant_and_cache(k, cache.view("indexer", 1), torch.tensor([322]))
    irow = cache.buffer[597000:597000 + 132]
    assert irow[5] == 0xFE
    assert torch.equal(irow[128:].view(torch.float32), torch.tensor([3.0]) / 448.0)


# ---- bad inputs: an error naming the argument, and nothing written --------------------------
def bad_setup(device):
    plan = plan_for("BLHNC", 16, 32)
    gc = guarded(plan, device)
    kv_c, k_pe, k = inputs(32, 1)
    return gc, kv_c.to(device), k_pe.to(device), k.to(device), torch.arange(32, device=device)


MLA_BAD = [
    (lambda a: a | {"kv_c": a["kv_c"].float(), "k_pe": a["k_pe"].float()}, TypeError, "kv_c must be"),
    (lambda a: a | {"k_pe": a["k_pe"].half()}, TypeError, "k_pe must have the dtype"),
    (lambda a: a | {"kv_c": a["kv_c"][:, :256]}, ValueError, r"kv_c.size\(1\) must be 512"),
    (lambda a: a | {"k_pe": a["k_pe"][:, :32]}, ValueError, r"k_pe.size\(1\) must be 64"),
    (lambda a: a | {"view": a["indexer_view"]}, ValueError, "view rows must be 656"),
    (lambda a: a | {"slot_mapping": torch.cat([a["slot_mapping"]] * 2)}, ValueError, "kv_c must hold at least"),
    (lambda a: a | {"kv_cache_dtype": "fp4"}, ValueError, "kv_cache_dtype"),
    (lambda a: a | {"kv_cache_dtype": "fp8", "scale": 1.0}, ValueError, "view rows must be 576"),
    (lambda a: a | {"scale": 1.0}, ValueError, "scale is only used with kv_cache_dtype"),
    (lambda a: a | {"view": a["view"][:, :, :, :100]}, ValueError, "view rows must be 656"),
]


@pytest.mark.parametrize("mutate,exc,match", MLA_BAD)
def test_mla_bad_inputs(device, mutate, exc, match):
    gc, kv_c, k_pe, _, slots = bad_setup(device)
    a = mutate({"kv_c": kv_c, "k_pe": k_pe, "view": gc.view("mla", 0), "slot_mapping": slots,
                "kv_cache_dtype": "fp8_ds_mla", "indexer_view": gc.view("indexer", 0)})
    a.pop("indexer_view")
    with pytest.raises(exc, match=match):
        kvc.ops.concat_and_cache_mla(**a)
    gc.assert_unchanged()


INDEXER_BAD = [
    (lambda a: a | {"k": a["k"].float()}, TypeError, "k must be bfloat16 or float16"),
    (lambda a: a | {"k": a["k"][:, :64]}, ValueError, r"k.size\(1\) must be 128"),
    (lambda a: a | {"view": a["mla_view"]}, ValueError, "view rows must be 132"),
    (lambda a: a | {"placement": "rows"}, ValueError, "placement"),
    (lambda a: a | {"scale_fmt": "e8m0"}, ValueError, "scale_fmt"),
    (lambda a: a | {"slot_mapping": a["slot_mapping"][:, None]}, ValueError, "slot_mapping must be 1-D"),
]


@pytest.mark.parametrize("mutate,exc,match", INDEXER_BAD)
def test_indexer_bad_inputs(device, mutate, exc, match):
    gc, _, _, k, slots = bad_setup(device)
    a = mutate({"k": k, "view": gc.view("indexer", 0), "slot_mapping": slots, "scale_fmt": None,
                "placement": "row", "mla_view": gc.view("mla", 0)})
    a.pop("mla_view")
    with pytest.raises(exc, match=match):
        kvc.ops.indexer_k_quant_and_cache(**a)
    gc.assert_unchanged()


@pytest.mark.parametrize("op", ["mla", "indexer", "fused"])
def test_slot_out_of_range_is_checked_before_writing(op):
    gc, kv_c, k_pe, k, slots = bad_setup("cpu")
    slots = slots.clone()
    slots[20] = gc.plan.num_slots + 5
    with pytest.raises(IndexError, match=r"slot_mapping\[20\]"):
        if op == "mla":
            kvc.ops.concat_and_cache_mla(kv_c, k_pe, gc.view("mla", 0), slots)
        elif op == "indexer":
            kvc.ops.indexer_k_quant_and_cache(k, gc.view("indexer", 0), slots)
        else:
            kvc.ops.dsa_write(kv_c, k_pe, gc.view("mla", 0), k, gc.view("indexer", 0), slots)
    gc.assert_unchanged()


def test_fused_views_must_share_the_block_table():
    gc, kv_c, k_pe, k, slots = bad_setup("cpu")
    other = dsa_plan("BLHNC", 16, 3)
    small = kvc.allocate(other, fill=0)
    with pytest.raises(ValueError, match="share one block table"):
        kvc.ops.dsa_write(kv_c, k_pe, gc.view("mla", 0), k, small.view("indexer", 0), slots)
    gc.assert_unchanged()


def test_mismatched_devices():
    gc, kv_c, k_pe, k, slots = bad_setup("cpu")
    with pytest.raises(ValueError, match="kv_c must be on the device of view"):
        kvc.ops.concat_and_cache_mla(kv_c.to("meta"), k_pe, gc.view("mla", 0), slots)
    with pytest.raises(ValueError, match="slot_mapping must be on the device"):
        kvc.ops.indexer_k_quant_and_cache(k, gc.view("indexer", 0), slots.to("meta"))
    gc.assert_unchanged()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_out_of_range_slot_is_skipped_not_written():
    gc, kv_c, k_pe, k, slots = bad_setup("cuda")
    slots = slots.clone()
    slots[5] = gc.plan.num_slots * 3
    ok = slots.clone().cpu()
    ok[5] = -1
    kvc.ops.dsa_write(kv_c, k_pe, gc.view("mla", 0), k, gc.view("indexer", 0), slots)
    ref.dsa_write(kv_c.cpu(), k_pe.cpu(), gc.expected_view("mla", 0), k.cpu(),
                  gc.expected_view("indexer", 0), ok)
    gc.assert_matches()


def test_buffers_beyond_4_gib():
    """64-bit addressing: rows past the 4 GiB mark land where plan.address says."""
    plan = dsa_plan("LBNHC", 64, 60000)  # 6.05 GB; untouched pages cost no memory
    assert plan.total_bytes > 1 << 32
    cache = kvc.allocate(plan)
    slots = torch.tensor([plan.num_slots - 1, plan.num_slots - 64, 59000 * 64 + 7])
    kv_c, k_pe, k = inputs(3, 0)
    kvc.ops.dsa_write(kv_c, k_pe, cache.view("mla", 1), k, cache.view("indexer", 1), slots)
    rows = ref.mla_fp8_rows(kv_c[:3], k_pe[:3])
    codes, scales = ref.indexer_rows(k[:3])
    for i, slot in enumerate(slots.tolist()):
        a = plan.address("mla", 1, slot)
        assert a > 1 << 32
        assert torch.equal(cache.buffer[a:a + 656], rows[i])
        b = plan.address("indexer", 1, slot)
        assert torch.equal(cache.buffer[b:b + 128], codes[i])
    got = kvc.ops.gather_mla_slots(cache.view("mla", 1), slots, raw=True)
    assert torch.equal(got, rows)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(kvc.LAYOUTS), block_size=st.integers(1, 70),
       num_tokens=st.integers(0, 150), pad_every=st.integers(0, 6),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), log_scale=st.integers(-30, 12),
       placement=st.sampled_from(["row", "split"]), scale_fmt=st.sampled_from([None, "ue8m0"]),
       seed=st.integers(0, 2 ** 16))
def test_fused_write_property(layout, block_size, num_tokens, pad_every, dtype, log_scale,
                              placement, scale_fmt, seed):
    """Any block size (odd ones misalign rows), magnitude, dtype and padding: kernel == reference."""
    plan = dsa_plan(layout, block_size, max(1, -(-(num_tokens + 3) // block_size)))
    gc = guarded(plan, "cpu", seed=seed)
    g = torch.Generator().manual_seed(seed)
    limit = 60000.0 if dtype == torch.float16 else 3e38
    fused = (torch.randn(num_tokens, 704, generator=g) * 2.0 ** log_scale).clamp(-limit, limit).to(dtype)
    slots = random_slots(num_tokens, plan.num_slots, seed=seed, pad_every=pad_every)
    args = (fused[:, :512], fused[:, 512:576], gc.view("mla", 1), fused[:, 576:], gc.view("indexer", 0))
    kvc.ops.dsa_write(*args, slots, "fp8_ds_mla", scale_fmt, placement)
    ref.dsa_write(fused[:, :512], fused[:, 512:576], gc.expected_view("mla", 1), fused[:, 576:],
                  gc.expected_view("indexer", 0), slots, "fp8_ds_mla", scale_fmt, placement)
    gc.assert_matches()
