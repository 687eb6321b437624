"""Plain [T, H, D] rows: kernels against the reference on every layout, and bad inputs."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

from conftest import guarded, random_slots

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def kv_plan(layout: str, block_size: int, num_blocks: int, heads: int, row: int) -> kvc.CachePlan:
    specs = [kvc.CacheSpec("k", row, 2, heads), kvc.CacheSpec("v", row, 2, heads),
             kvc.CacheSpec("other", 12, 1, 1)]
    return kvc.plan_cache(specs, num_blocks=num_blocks, block_size=block_size, layout=layout)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("num_tokens", [0, 1, 37, 4096])
def test_matches_reference(device, layout, block_size, num_tokens):
    heads, dim, dtype = 2, 16, DTYPES[num_tokens % 3]
    num_blocks = max(1, -(-(num_tokens + 40) // block_size))
    plan = kv_plan(layout, block_size, num_blocks, heads, dim * dtype.itemsize)
    gc = guarded(plan, device)
    g = torch.Generator().manual_seed(num_tokens)
    # A strided key: rows of a wider [T, 3, H, D] projection (token stride > H x D).
    qkv = torch.randn(num_tokens + 3, 3, heads, dim, generator=g).to(dtype)
    key = qkv[:, 1]
    slots = random_slots(num_tokens, plan.num_slots, seed=block_size, pad_every=5)
    kvc.ops.reshape_and_cache(key.to(device), gc.view("k", 1), slots.to(device))
    ref.reshape_and_cache(key, gc.expected_view("k", 1), slots)
    gc.assert_matches()


@pytest.mark.parametrize("layout", ["LBNHC", "BLHNC", "LHBNC"])
def test_fp8_per_tensor_scale(device, layout):
    plan = kv_plan(layout, 16, 8, 4, 32)
    gc = guarded(plan, device)
    key = torch.randn(100, 4, 32, dtype=torch.bfloat16) * 50
    scale = torch.tensor([0.07])
    slots = random_slots(100, plan.num_slots)
    kvc.ops.reshape_and_cache(key.to(device), gc.view("v", 0), slots.to(device), "fp8",
                              scale.to(device))
    ref.reshape_and_cache(key, gc.expected_view("v", 0), slots, "fp8", scale)
    gc.assert_matches()


def test_heads_order_differs_between_nhc_and_hnc():
    spec = [kvc.CacheSpec("k", 8, 1, 2)]
    key = torch.arange(2 * 2 * 4, dtype=torch.float16).view(2, 2, 4)
    bufs = {}
    for layout in ("LBNHC", "LBHNC"):
        cache = kvc.allocate(kvc.plan_cache(spec, 1, 2, layout), fill=0)
        kvc.ops.reshape_and_cache(key, cache.view("k", 0), torch.tensor([0, 1]))
        bufs[layout] = cache.buffer.view(torch.float16).view(-1, 4)[:, 0].tolist()
    assert bufs["LBNHC"] == [0.0, 4.0, 8.0, 12.0]   # token-major: t0h0 t0h1 t1h0 t1h1
    assert bufs["LBHNC"] == [0.0, 8.0, 4.0, 12.0]   # head-major: t0h0 t1h0 t0h1 t1h1


def bad_case(device):
    plan = kv_plan("BLHNC", 16, 4, 2, 32)
    gc = guarded(plan, device)
    key = torch.randn(8, 2, 16, dtype=torch.bfloat16, device=device)
    slots = torch.arange(8, device=device)
    return gc, key, slots


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda k, v, s: (k.float(), v, s), ValueError, "view rows"),
    (lambda k, v, s: (k.to(torch.int32), v, s), TypeError, "key must be"),
    (lambda k, v, s: (k, v.view(torch.int8), s), TypeError, "view must be a torch.uint8"),
    (lambda k, v, s: (k[:, :, :8], v, s), ValueError, "view rows must be"),
    (lambda k, v, s: (k, v, s.int()), TypeError, "slot_mapping must be int64"),
    (lambda k, v, s: (k, v, torch.cat([s, s])), ValueError, "key must hold at least"),
    (lambda k, v, s: (k[:, :1], v, s), ValueError, "key.size"),
    (lambda k, v, s: (k, v, s.view(2, 4)), ValueError, "slot_mapping must be 1-D"),
])
def test_bad_inputs_name_the_argument(device, mutate, exc, match):
    gc, key, slots = bad_case(device)
    k, v, s = mutate(key, gc.view("k", 0), slots)
    with pytest.raises(exc, match=match):
        kvc.ops.reshape_and_cache(k, v, s)
    gc.assert_unchanged()


def test_slot_out_of_range_writes_nothing():
    gc, key, slots = bad_case("cpu")
    slots = slots.clone()
    slots[-1] = gc.plan.num_slots  # the last token is bad; earlier ones must not be written
    with pytest.raises(IndexError, match=r"slot_mapping\[7\]"):
        kvc.ops.reshape_and_cache(key, gc.view("k", 0), slots)
    gc.assert_unchanged()


def test_devices_must_match():
    gc, key, slots = bad_case("cpu")
    with pytest.raises((ValueError, RuntimeError), match="device"):
        kvc.ops.reshape_and_cache(key.to("meta"), gc.view("k", 0), slots)
    gc.assert_unchanged()
