"""Plain K/V ops a GQA model needs: reshape_and_cache_kv (K and V by one launch, vLLM's
reshape_and_cache_flash) and gather_kv (vLLM's cp_gather_cache), byte-exact against the
reference in every layout, "auto" and fp8 with per-tensor and per-head scales."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import guarded, requests

H, D = 3, 40


def kv_plan(layout: str, block_size: int, row: int, num_blocks: int = 0) -> kvc.CachePlan:
    specs = [kvc.CacheSpec("k", row, 2, H), kvc.CacheSpec("v", row, 2, H)]
    return kvc.plan_cache(specs, num_blocks or max(4, 160 // block_size), block_size, layout)


def kv_inputs(t: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kv = (torch.randn(t, 2, H, D + 8, generator=g) * 30).to(dtype)  # strided: wider rows
    kv[3, 0, 1, 5] = float("nan")
    kv[4, 1, 2, :4] = float("inf")
    kv[5, 0, 0] = 1e-6  # tiny values, fp8 subnormals
    return kv[:, 0, :, :D], kv[:, 1, :, :D]


def slots_for(plan: kvc.CachePlan, t: int, seed: int = 1) -> torch.Tensor:
    slots = torch.randperm(plan.num_slots, generator=torch.Generator().manual_seed(seed))[:t]
    slots[::7] = -1
    return slots


SCALES = {"tensor": torch.tensor([0.25]), "head": torch.tensor([0.5, 0.125, 2.0]), "float": 0.75}


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_auto_rows(device, layout, block_size, dtype):
    plan = kv_plan(layout, block_size, D * dtype.itemsize)
    gc = guarded(plan, device)
    key, value = kv_inputs(50, dtype)
    slots = slots_for(plan, 50)
    kvc.ops.reshape_and_cache_kv(key.to(device), value.to(device), gc.view("k", 1), gc.view("v", 1),
                                 slots.to(device))
    ref.reshape_and_cache_kv(key, value, gc.expected_view("k", 1), gc.expected_view("v", 1), slots)
    gc.assert_matches()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("scale", list(SCALES))
def test_fp8_rows(device, layout, scale):
    plan = kv_plan(layout, 16, D)
    gc = guarded(plan, device)
    key, value = kv_inputs(60, torch.bfloat16, seed=2)
    slots = slots_for(plan, 60, seed=3)
    k_scale = SCALES[scale]
    v_scale = 1.5 if scale == "float" else torch.tensor([4.0])
    dev = lambda s: s.to(device) if isinstance(s, torch.Tensor) and s.numel() > 1 else s  # noqa: E731
    kvc.ops.reshape_and_cache_kv(key.to(device), value.to(device), gc.view("k", 0), gc.view("v", 0),
                                 slots.to(device), "fp8", dev(k_scale), dev(v_scale))
    ref.reshape_and_cache_kv(key, value, gc.expected_view("k", 0), gc.expected_view("v", 0), slots,
                             "fp8", k_scale, v_scale)
    gc.assert_matches()
    # By hand: head h of token t is e4m3(x / k_scale[h]).
    s = slots[0].item() if slots[0] >= 0 else slots[1].item()
    t = 0 if slots[0] >= 0 else 1
    h_scale = torch.as_tensor(k_scale, dtype=torch.float32).reshape(-1).expand(H)
    b, p = divmod(s, 16)
    for h in range(H):
        want = ref.e4m3_encode(key[t, h].float() / h_scale[h])
        assert torch.equal(gc.view("k", 0)[b, h, p].cpu(), want)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gather_kv_round_trip(device, layout, dtype):
    plan = kv_plan(layout, 16, D * dtype.itemsize, num_blocks=12)
    cache = kvc.allocate(plan, device, fill=0)
    key, value = kv_inputs(plan.num_slots, dtype, seed=4)
    every = torch.arange(plan.num_slots)
    kvc.ops.reshape_and_cache_kv(key.to(device), value.to(device), cache.view("k", 0),
                                 cache.view("v", 0), every.to(device))
    table, cu = requests(16, 12, [37, 0, 50], seed=5)
    slots = ref.gather_slots(table, cu, 16)
    for name, x in (("k", key), ("v", value)):
        got = kvc.ops.gather_kv(cache.view(name, 0), table.to(device), cu.to(device), dtype=dtype)
        assert got.shape == (87, H, D) and got.dtype == dtype
        assert torch.equal(bits(got), bits(x[slots]))  # what was written comes back


@pytest.mark.parametrize("layout", ["LBNHC", "BHLNC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale", list(SCALES))
def test_gather_kv_dequantizes_fp8(device, layout, dtype, scale):
    plan = kv_plan(layout, 16, D, num_blocks=12)
    gc = guarded(plan, device)
    key, _ = kv_inputs(plan.num_slots, torch.float32, seed=6)
    k_scale = SCALES[scale]
    dev = (k_scale.to(device) if isinstance(k_scale, torch.Tensor) and k_scale.numel() > 1
           else k_scale)
    kvc.ops.reshape_and_cache_kv(key.to(device), key.to(device), gc.view("k", 0), gc.view("v", 0),
                                 torch.arange(plan.num_slots, device=device), "fp8", dev, dev)
    table, cu = requests(16, 12, [37, 50], seed=7)
    out = torch.full((100, H, D), 3.0, dtype=dtype, device=device)  # an upper-bound buffer
    before = out.clone()
    got = kvc.ops.gather_kv(gc.view("k", 0), table.to(device), cu.to(device), scale=dev, out=out)
    want = ref.gather_kv(gc.view("k", 0).cpu(), table, cu, dtype=dtype, scale=k_scale)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(bits(out[:87]), bits(want))
    assert torch.equal(bits(out[87:]), bits(before[87:]))  # spare rows untouched


def test_gather_kv_invalid_entries_read_as_zeros():
    plan = kv_plan("LBNHC", 16, 2 * D, num_blocks=6)
    cache = kvc.allocate(plan, fill=7)
    table = torch.tensor([[0, -1, 99]], dtype=torch.int32)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    got = kvc.ops.gather_kv(cache.view("k", 0), table, cu, validate=False)
    assert bool((got[:16].view(torch.uint8) == 7).all()) and not got[16:].view(torch.uint8).any()
    with pytest.raises(IndexError, match=r"block_table\[0, 1\] = -1"):
        kvc.ops.gather_kv(cache.view("k", 0), table, cu)


BOTH, AUTO, FP8 = (False, True), (False,), (True,)
KV_BAD = [  # (mutation, error, message, caches it applies to: auto rows and/or fp8 rows)
    (lambda a: a | {"value": a["value"][:, :2]}, ValueError, r"value.size\(1\) must be 3", BOTH),
    (lambda a: a | {"v_view": a["v_view"][:5]}, ValueError, "k_view and v_view must share one block table", BOTH),
    (lambda a: a | {"k_scale": None}, ValueError, "k_scale is required", FP8),
    (lambda a: a | {"k_scale": 1.0}, ValueError, "k_scale is only used", AUTO),
    (lambda a: a | {"v_scale": torch.tensor([1.0, 2.0])},
     ValueError, r"v_scale must hold one value or one per head \[3\]", FP8),
    (lambda a: a | {"k_scale": torch.tensor([1.0, -2.0, 1.0])},
     ValueError, r"k_scale\[1\] must be finite and > 0", FP8),
    (lambda a: a | {"slot_mapping": torch.tensor([3, 3, 4])}, ValueError, "both slot 3", BOTH),
    (lambda a: a | {"slot_mapping": torch.tensor([3, 999, 4])}, IndexError, r"slot_mapping\[1\] = 999", BOTH),
]


@pytest.mark.parametrize("mutate,exc,match,fp8", [
    (mutate, exc, match, fp8) for mutate, exc, match, caches in KV_BAD for fp8 in caches])
def test_kv_write_bad_inputs(mutate, exc, match, fp8):
    """Each bad argument raises, naming it, and nothing is written (checked before writing)."""
    gc = guarded(kv_plan("BLHNC", 16, D if fp8 else 2 * D))
    key, value = kv_inputs(6, torch.bfloat16)  # more rows than tokens: allowed
    base = {"key": key, "value": value, "k_view": gc.view("k", 0), "v_view": gc.view("v", 0),
            "slot_mapping": torch.arange(3)}
    if fp8:
        base |= {"kv_cache_dtype": "fp8", "k_scale": 1.0, "v_scale": 1.0}
    with pytest.raises(exc, match=match):
        kvc.ops.reshape_and_cache_kv(**mutate(base))
    gc.assert_unchanged()
