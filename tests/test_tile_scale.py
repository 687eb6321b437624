"""fp8_ds_mla tile scales (SPEC 3): "pow2" (the default, vLLM since PR #49435) and "fp32" (engines
before it), for every bf16 and fp16 tile amax, through the kernels themselves.

Every non-negative bf16 / fp16 pattern (finite, subnormal, zero, inf) and a NaN-only tile is the
amax of one tile: tile value 0 is the pattern, the other 127 values are smaller (signed, some
NaN). The stored scales are compared with
- an independent formula in exact rational arithmetic (fractions.Fraction: the smallest 2^k >=
  max(amax / 448, 1e-4), with no float rounding anywhere),
- the float arithmetic of the writers that PR #49435 changed (their CUDA form
  exp2f(ceilf(log2f(fmaxf(amax / 448.f, 1e-4f)))), the Triton form amax * (1.0 / 448.0), and
  FlashMLA's torch reference pow(2, ceil(log2(clamp_min(amax / 448, 1e-4))))),
and whole rows with the pure-torch reference. The CPU kernels run once per ISA (KVC_CPU_ISA, in
fresh processes); the CUDA kernel runs under the host emulation (tests/simt).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref

ROOT = Path(__file__).resolve().parents[1]
BF16_INF, FP16_INF = 0x7F80, 0x7C00


def amax_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every non-negative pattern of `dtype` up to +inf, then a NaN (a NaN-only tile: amax 0)."""
    inf = BF16_INF if dtype == torch.bfloat16 else FP16_INF
    bits = torch.cat([torch.arange(0, inf + 1, dtype=torch.int32), torch.tensor([inf + 1])])
    return bits.to(torch.int16).view(dtype)


def tiles_for(amaxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_c [T, 512], k_pe [T, 64]: tile i (row i // 4, tile i % 4) has max |x| = amaxes[i]."""
    n = amaxes.numel()
    t = -(-n // 4)
    a = torch.cat([amaxes, amaxes[:1].new_zeros(4 * t - n)]).float()
    g = torch.Generator().manual_seed(0)
    frac = torch.rand(4 * t, 127, generator=g) * 0.999  # below 1: the tile's max stays a[i]
    rest = torch.where(torch.rand(4 * t, 127, generator=g) < 0.5, -frac, frac) * a[:, None]
    rest = torch.where(a[:, None].isinf(), torch.zeros_like(rest), rest)  # inf * frac is inf
    rest[::5, 3] = float("nan")  # NaN counts as 0 in the amax
    tiles = torch.cat([a[:, None], rest], 1)
    nan_only = a.isnan()
    tiles[nan_only] = float("nan")
    kv_c = tiles.reshape(t, 512).to(amaxes.dtype)
    # rounding to the dtype must not lift a value above its tile's pattern (frac < 1 keeps
    # it at or below): checked here so the test cannot drift into comparing other amaxes
    assert torch.equal(ref.amax(kv_c.float().reshape(-1, 128))[:n],
                       torch.where(amaxes.float().isnan(), 0, amaxes.float()))
    k_pe = torch.linspace(-3, 3, 64).repeat(t, 1).to(amaxes.dtype)
    return kv_c, k_pe


def exact_pow2_scale(a: float) -> float:
    """The smallest power of two >= max(a / 448, 1e-4), in exact rational arithmetic."""
    if math.isnan(a):
        a = 0.0
    if math.isinf(a):
        return math.inf
    q = max(Fraction(a) / 448, Fraction(1, 10000))
    k = q.numerator.bit_length() - q.denominator.bit_length()  # 2^(k-1) < q < 2^(k+1)
    while Fraction(2) ** k < q:
        k += 1
    while Fraction(2) ** (k - 1) >= q:
        k -= 1
    return math.ldexp(1.0, k)


def writers_arithmetic(a: np.ndarray) -> dict[str, np.ndarray]:
    """Tile scales as PR #49435's writers compute them, in float32 (NaN amax counted as 0)."""
    a = np.nan_to_num(a.astype(np.float32), nan=0.0, posinf=np.inf)
    with np.errstate(over="ignore", divide="ignore"):
        cuda = np.exp2(np.ceil(np.log2(np.maximum(a / np.float32(448), np.float32(1e-4)))))
        triton = np.exp2(np.ceil(np.log2(np.maximum(a * np.float32(1.0 / 448.0),
                                                    np.float32(1e-4)))))
    t = torch.from_numpy(a)
    flashmla = torch.pow(2, torch.clamp_min(t / 448.0, 1e-4).log2().ceil()).numpy()
    return {"cuda exp2f(ceilf(log2f(.)))": cuda.astype(np.float32),
            "triton amax * (1 / 448)": triton.astype(np.float32),
            "flashmla torch reference": flashmla.astype(np.float32)}


def stored_scales(cache: kvc.KVCache, t: int) -> torch.Tensor:
    rows = cache.view("mla", 0).reshape(-1, 656)[:t]
    return rows[:, 512:528].contiguous().view(torch.float32).reshape(-1)


def write_rows(kv_c, k_pe, tile_scale, ops=None) -> kvc.KVCache:
    t = kv_c.shape[0]
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656)], num_blocks=t, block_size=1)
    cache = kvc.allocate(plan, fill=0xA5)
    slots = torch.arange(t, dtype=torch.int64)
    if ops is None:
        kvc.ops.concat_and_cache_mla(kv_c, k_pe, cache.view("mla", 0), slots, tile_scale=tile_scale)
    else:
        ops.concat_and_cache_mla(kv_c, k_pe, cache.view("mla", 0), slots, "fp8_ds_mla", None,
                                 tile_scale)
    return cache


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pow2_scales_of_every_amax_equal_the_exact_formula_and_the_writers(dtype):
    amaxes = amax_patterns(dtype)
    kv_c, k_pe = tiles_for(amaxes)
    cache = write_rows(kv_c, k_pe, None)  # the default rule is pow2
    got = stored_scales(cache, kv_c.shape[0])[:amaxes.numel()].numpy()
    a = amaxes.float().numpy()
    want = np.array([exact_pow2_scale(float(v)) for v in a], dtype=np.float32)
    bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
    assert bad.size == 0, [(float(a[i]), float(got[i]), float(want[i])) for i in bad[:8]]
    # every stored scale is a power of two (or inf for a tile holding inf)
    bits = got.view(np.uint32)
    assert np.all((bits & 0x7FFFFF) == 0)
    # the writers' float arithmetic gives the same scale for every bf16 / fp16 amax: amax / 448
    # is a power of two only at amax = 7 x 2^m, where division, the reciprocal product and
    # log2 are all exact, and is at least 1/224 of a power of two away everywhere else
    for name, w in writers_arithmetic(a).items():
        differ = np.nonzero(w.view(np.uint32) != want.view(np.uint32))[0]
        assert differ.size == 0, (name, [(float(a[i]), float(w[i]), float(want[i]))
                                         for i in differ[:8]])
    # whole rows: the kernel's bytes are the reference's (codes, scales, rope)
    rows = cache.view("mla", 0).reshape(-1, 656)
    assert torch.equal(rows, ref.mla_fp8_rows(kv_c, k_pe))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_scales_of_every_amax_are_amax_over_448_floored(dtype):
    amaxes = amax_patterns(dtype)
    kv_c, k_pe = tiles_for(amaxes)
    cache = write_rows(kv_c, k_pe, "fp32")
    got = stored_scales(cache, kv_c.shape[0])[:amaxes.numel()]
    a = torch.where(amaxes.float().isnan(), 0.0, amaxes.float())
    want = torch.clamp(a / 448.0, min=torch.finfo(torch.float32).tiny)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    rows = cache.view("mla", 0).reshape(-1, 656)
    assert torch.equal(rows, ref.mla_fp8_rows(kv_c, k_pe, "fp32"))


def test_the_boundaries_by_name():
    """amax = 448 x 2^k exactly, one ulp either side, zero, the floor, subnormal, huge, inf, NaN."""
    bf = torch.bfloat16
    cases = {  # amax -> pow2 scale
        336.0: 1.0,                # 0.75 x 448 (SPEC 3's example)
        448.0: 1.0,                # exactly 448 x 2^0
        float(torch.tensor(448.0, dtype=bf).view(torch.int16).add(1).view(bf)): 2.0,  # ulp above
        float(torch.tensor(448.0, dtype=bf).view(torch.int16).sub(1).view(bf)): 1.0,  # ulp below
        896.0: 2.0, 224.0: 0.5, 7.0: 2.0 ** -6,
        0.0: 2.0 ** -13,           # an all-zero tile: the 1e-4 floor, rounded up
        448e-4: 2.0 ** -13,        # at the floor
        float(torch.tensor(2.0 ** -130, dtype=bf)): 2.0 ** -13,  # a bf16 subnormal
        float(torch.finfo(bf).max): 2.0 ** 120,  # the largest bf16
        float("inf"): float("inf"),
        float("nan"): 2.0 ** -13,  # NaN is not an amax: the tile is all-NaN, amax 0
    }
    a = torch.tensor(list(cases), dtype=torch.float32).to(bf)
    kv_c, k_pe = tiles_for(a)
    got = stored_scales(write_rows(kv_c, k_pe, "pow2"), kv_c.shape[0])[:a.numel()].tolist()
    assert got == list(cases.values())


def test_one_tile_under_both_rules():
    """The bytes of one tile (amax 3.0) under both rules: only the 4 scale bytes and the codes
    differ. pow2: scale 2^-7 = 0.0078125 (bytes 00 00 00 3c); fp32: 3 / 448."""
    x = torch.zeros(1, 512, dtype=torch.bfloat16)
    x[0, :4] = torch.tensor([3.0, -1.5, 0.25, 1e-3])
    k_pe = torch.zeros(1, 64, dtype=torch.bfloat16)
    pow2 = write_rows(x, k_pe, "pow2").view("mla", 0).reshape(-1)
    fp32 = write_rows(x, k_pe, "fp32").view("mla", 0).reshape(-1)
    assert pow2[512:516].tolist() == [0x00, 0x00, 0x00, 0x3C]
    assert pow2[512:516].view(torch.float32).item() == 2.0 ** -7
    assert fp32[512:516].view(torch.float32).item() == torch.tensor(3.0 / 448, dtype=torch.float32).item()
    # codes: 3 / 2^-7 = 384 -> 0x7C; under fp32 the amax encodes to 448 (0x7E)
    assert pow2[:4].tolist() == [0x7C, 0xF4, 0x60, 0x20] and fp32[:4].tolist()[0] == 0x7E


def test_every_cpu_isa_stores_the_same_scales(tmp_path):
    """The same exhaustive rows through each CPU ISA's row loops, in fresh processes."""
    code = ("import sys, torch, kvcache_ext as kvc\n"
            "import test_tile_scale as t\n"
            "from kvcache_ext.ops.library import cpu_isa\n"
            "out = []\n"
            "for dtype in (torch.bfloat16, torch.float16):\n"
            "    kv_c, k_pe = t.tiles_for(t.amax_patterns(dtype))\n"
            "    for rule in ('pow2', 'fp32'):\n"
            "        out.append(t.write_rows(kv_c, k_pe, rule).buffer)\n"
            "torch.save(torch.cat(out), sys.argv[1])\n"
            "print(cpu_isa())\n")
    results = {}
    for isa in ("scalar", "avx2", "avx512"):
        path = tmp_path / f"{isa}.pt"
        r = subprocess.run([sys.executable, "-c", code, str(path)],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, KVC_CPU_ISA=isa,
                                    PYTHONPATH=os.pathsep.join([str(ROOT / "tests")] + [os.environ.get("PYTHONPATH", "")])))
        assert r.returncode == 0, r.stderr
        results[r.stdout.split()[-1]] = torch.load(path)
    first = next(iter(results.values()))
    assert first.numel() == 2 * (8161 + 7937) * 656  # both rules, every pattern
    for isa, buf in results.items():
        assert torch.equal(buf, first), isa


@pytest.mark.parametrize("rule", ["pow2", "fp32"])
def test_the_cuda_kernel_stores_the_same_scales_under_the_host_emulation(simt, rule):
    amaxes = amax_patterns(torch.bfloat16)[::7]  # a seventh of the patterns: the emulator is slow
    amaxes = torch.cat([amaxes, torch.tensor([448.0, 336.0, float("inf"), 0.0],
                                             dtype=torch.bfloat16)])
    kv_c, k_pe = tiles_for(amaxes)
    cuda = write_rows(kv_c, k_pe, rule, ops=simt)
    cpu = write_rows(kv_c, k_pe, rule)
    assert torch.equal(cuda.buffer, cpu.buffer)


@pytest.mark.parametrize("op", ["concat_and_cache_mla", "dsa_write"])
def test_tile_scale_is_checked(op):
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656), kvc.CacheSpec("auto", 1152),
                           kvc.CacheSpec("v3", 576), kvc.CacheSpec("idx", 132)], 4, 16)
    cache = kvc.allocate(plan, fill=0)
    before = cache.buffer.clone()
    x = torch.randn(3, 576).to(torch.bfloat16)
    k = torch.randn(3, 128).to(torch.bfloat16)
    slots = torch.arange(3)

    def call(view, dtype, tile_scale, scale=None):
        if op == "dsa_write":
            kvc.ops.dsa_write(x[:, :512], x[:, 512:], cache.view(view, 0), k, cache.view("idx", 0),
                              slots, dtype, tile_scale=tile_scale)
        else:
            kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], cache.view(view, 0), slots, dtype,
                                         scale, tile_scale=tile_scale)

    with pytest.raises(ValueError, match='tile_scale must be "pow2" or "fp32", got "e8m0"'):
        call("mla", "fp8_ds_mla", "e8m0")
    with pytest.raises(ValueError, match='tile_scale applies to kv_cache_dtype "fp8_ds_mla" only'):
        call("auto", "auto", "pow2")
    if op == "concat_and_cache_mla":
        with pytest.raises(ValueError, match='tile_scale applies to kv_cache_dtype "fp8_ds_mla"'):
            call("v3", "fp8", "fp32", scale=0.5)
    assert torch.equal(cache.buffer, before)  # nothing written by a refused call
