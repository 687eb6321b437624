"""fp8 / bf16 / ue8m0 encodings: kernels and the torch reference give the same bytes."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from kvcache_ext import reference as ref

SPECIAL = [0.0, -0.0, 1.0, -1.0, 448.0, -448.0, 449.0, 463.9, 464.0, 465.0, 1e6, -1e6,
           float("inf"), float("-inf"), float("nan"), -float("nan"), 2.0 ** -9, 2.0 ** -10,
           1.5 * 2.0 ** -10, 2.0 ** -6, 0.9 * 2.0 ** -6, 1e-30, -1e-30, 1e-45, 3.0e-39, 0.0625 + 2.0 ** -8]


def kernel_encode(values: torch.Tensor, device: str) -> torch.Tensor:
    """Encode fp32 values with the kernels' fp8 path (reshape_and_cache, scale 1)."""
    n = values.numel()
    plan = kvc.plan_cache([kvc.CacheSpec("x", n)], num_blocks=1, block_size=1)
    cache = kvc.allocate(plan, device=device, fill=0xAA)
    kvc.ops.reshape_and_cache(values.view(1, 1, n).to(device), cache.view("x", 0),
                              torch.zeros(1, dtype=torch.int64, device=device), "fp8",
                              torch.ones(1, device=device))
    return cache.buffer.cpu()


def test_special_values(device):
    x = torch.tensor(SPECIAL, dtype=torch.float32)
    got = kernel_encode(x, device)
    assert torch.equal(got, ref.e4m3_encode(x))
    assert got[14] == 0x7F and got[15] == 0x7F            # NaN of either sign
    assert got[12] == 0x7E and got[11] == 0xFE            # +inf, -1e6 saturate
    assert got[1] == 0x80 and got[7] == 0x7E              # -0 keeps its sign; 463.9 -> 448


def test_every_fp8_value_and_midpoint(device):
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fn).float()
    finite = values[~values.isnan()].unique()
    mids = (finite[1:] + finite[:-1]) / 2
    x = torch.cat([finite, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                   torch.nextafter(mids, torch.full_like(mids, -1e9))])
    assert torch.equal(kernel_encode(x, device), ref.e4m3_encode(x))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_random_floats_cpu(values):
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(kernel_encode(x, "cpu"), ref.e4m3_encode(x))


def test_bulk_random_bits(device):
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 16,), generator=g, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    assert torch.equal(kernel_encode(x, device), ref.e4m3_encode(x))


def test_ue8m0_is_exact_power_of_two_round_up():
    s = torch.tensor([1.0, 1.0000001, 0.75, 3.0, 2.0 ** -20, 2.0 ** -20 * 1.5, 448.0],
                     dtype=torch.float32)
    got = ref.ue8m0_round_up(s)
    assert got.tolist() == [1.0, 2.0, 1.0, 4.0, 2.0 ** -20, 2.0 ** -19, 512.0]


def test_bf16_rounding_canonical_nan():
    x = torch.tensor([1.0, float("nan"), -float("nan"), 1.00390625, 3.0e38], dtype=torch.float32)
    out = ref.to_bf16(x).view(torch.int16)
    assert int(out[1]) == 0x7FC0 and int(out[2]) == 0x7FC0
    assert out[0] == torch.tensor(1.0, dtype=torch.bfloat16).view(torch.int16)
