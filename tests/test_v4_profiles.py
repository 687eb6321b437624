"""The rounding choices engines make differently in DeepSeek-V4's 584-B rows and V4.1's 528-B
records (ops/profiles.py): scale_floor ("amax" / "scale") and subnormals ("keep" / "flush"),
as arguments of the write ops and as named engine profiles. CPU kernels, the CUDA kernels on the
host and the reference give the same bytes under every choice; "flush" is checked against an
independent float64 oracle at the subnormal boundary of every scale."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4
from kvcache_ext import reference_v4 as r4
from kvcache_ext.ops.profiles import PROFILES, resolve

from conftest import guarded
from v4_oracle import expect_e4m3

TILE = 64
EXPONENTS = range(-22, 12)  # scales 2^-22 (the amax floor's) .. 2^11 (amax 448 x 2^11)


def boundary_rows() -> torch.Tensor:
    """[T, 512] bf16 rows: each 64-value NoPE tile holds its amax (448 x 2^e, so its scale is
    2^e under both floors) and values at e4m3's subnormal boundary 2^(e - 6): one bf16 ulp
    either side, the value itself, 2^-6 - 2^-10 (a tie that rounds up to the first normal
    code), subnormal ties and codes, tiny values, +-0; then random values for the RoPE part."""
    rel = torch.tensor([1.0, 1 - 2 ** -8, 1 + 2 ** -7, 1 - 2 ** -4, 1 - 2 ** -3, 0.75, 0.5,
                        0.25, 1.5 * 2 ** -3, 2 ** -3, 2 ** -4, 2 ** -9, 0.0])
    rows = []
    for i, e in enumerate(EXPONENTS):
        x = torch.randn(512, generator=torch.Generator().manual_seed(i)) * 2.0 ** (e + 4)
        for k in range(7):
            tile = x[TILE * k:TILE * (k + 1)]
            tile[0] = 448 * 2.0 ** e * (-1) ** k
            sign = torch.tensor([1.0, -1.0]).repeat(len(rel))
            vals = rel.repeat_interleave(2) * sign * 2.0 ** (e - 6)
            tile[1:1 + len(vals)] = vals
            tile[40:] = tile[40:].clamp(-448 * 2.0 ** e, 448 * 2.0 ** e)
        rows.append(x)
    return torch.stack(rows).to(torch.bfloat16)


def expected_nope_codes(kv: torch.Tensor, subnormals: str, scale_floor: str) -> torch.Tensor:
    """The 448 NoPE codes by float64: quotients by the tile's power-of-two scale, flushed below
    2^-6 when asked, then the brute-force nearest-even e4m3 search of v4_oracle."""
    t = kv.shape[0]
    e = r4.v4_mla_exponents(kv, scale_floor)
    q = kv[:, :448].double().reshape(t, 7, TILE) / torch.pow(2.0, e.double()).unsqueeze(-1)
    if subnormals == "flush":
        q = torch.where(q.abs() < 2.0 ** -6, torch.where(torch.signbit(q), -0.0, 0.0).double(), q)
    return expect_e4m3(q).reshape(t, 448)


def write(impl, fmt: str, kv, view, slots, **choices) -> None:
    if impl == "cpu":
        o4.v4_mla_quant_and_cache(kv, view, slots, fmt=fmt, **choices)
    else:  # the CUDA kernels executed on the host (tests/simt)
        impl.v4_mla_quant_and_cache(kv, view, slots, choices["scale_floor"], fmt,
                                    choices["subnormals"])


def plan_for(fmt: str, layout: str = "BLHNC") -> kvc.CachePlan:
    split = (576, 8) if fmt == "fp8_ds_mla_v4" else (512, 16)
    spec = kvc.CacheSpec("v", sum(split), 1, split=split, page_align=576 if split[1] == 8 else 512)
    return kvc.plan_cache(groups=[kvc.CacheGroup("g", (spec,), 16)], num_blocks=4, layout=layout)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v4", "v41_mxfp8"])
@pytest.mark.parametrize("subnormals", ["keep", "flush"])
@pytest.mark.parametrize("scale_floor", ["amax", "scale"])
@pytest.mark.parametrize("impl", ["cpu", "cuda_on_host"])
def test_every_choice_gives_the_reference_bytes(request, impl, fmt, subnormals, scale_floor):
    kv = boundary_rows()
    plan = plan_for(fmt)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:kv.shape[0]]
    gc = guarded(plan, seed=2)
    choices = {"scale_floor": scale_floor, "subnormals": subnormals}
    write("cpu" if impl == "cpu" else request.getfixturevalue("simt"), fmt, kv, gc.view("v", 0),
          slots, **choices)
    write_ref = r4.v4_mla_write if fmt == "fp8_ds_mla_v4" else r4.v41_write
    write_ref(gc.expected_view("v", 0), slots, kv, scale_floor, subnormals)
    gc.assert_matches()


@pytest.mark.parametrize("scale_floor", ["amax", "scale"])
def test_flush_against_a_float64_oracle(scale_floor):
    """The NoPE codes of 584-B rows under both subnormal choices equal the float64 oracle's;
    flush differs from keep exactly where |x / 2^e| < 2^-6 and the kept code is not 0."""
    kv = boundary_rows()
    plan = plan_for("fp8_ds_mla_v4")
    slots = torch.arange(kv.shape[0])
    codes = {}
    for subnormals in ("keep", "flush"):
        cache = kvc.allocate(plan, fill=0xA5)
        o4.v4_mla_quant_and_cache(kv, cache.view("v", 0), slots, scale_floor=scale_floor,
                                  subnormals=subnormals)
        data, _ = r4.read_split(cache.view("v", 0), slots, (576, 8))
        codes[subnormals] = data[:, :448]
        assert torch.equal(codes[subnormals], expected_nope_codes(kv, subnormals, scale_floor))
    differ = codes["keep"] != codes["flush"]
    kept = codes["keep"][differ]
    assert differ.sum() >= 200  # the boundary values of every tile
    assert bool(((kept & 0x7F) <= 0x08).all())  # subnormal codes, or 2^-6 reached by rounding
    assert bool(((codes["flush"][differ] & 0x7F) == 0).all())


def test_profiles_set_the_choices_and_contradictions_are_refused():
    assert resolve(None, None, None) == {"scale_floor": "amax", "subnormals": "keep"}
    assert resolve("vllm-cpu-window", None, None) == {"scale_floor": "scale", "subnormals": "flush"}
    assert resolve("vllm-cpu-window", "scale", "flush")["subnormals"] == "flush"
    assert resolve(None, "scale", None) == {"scale_floor": "scale", "subnormals": "keep"}
    with pytest.raises(ValueError, match="subnormals='keep' contradicts profile 'vllm-cpu-window'"):
        resolve("vllm-cpu-window", None, "keep")
    with pytest.raises(ValueError, match="profile must be one of"):
        resolve("vllm", None, None)
    assert {"vllm-cuda", "vllm-cpu-window", "vllm-cpu-compressor"} <= set(PROFILES)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_profile_through_both_write_ops(profile):
    """profile= gives the bytes of its explicit choices, in the single write and the pair."""
    kv = boundary_rows()[:12]
    k_idx = torch.randn(12, 128).to(torch.bfloat16)
    plan = kvc.plan_cache(groups=[kvc.CacheGroup("g", (
        kvc.CacheSpec("v", 584, 1, split=(576, 8), page_align=576, compress_ratio=4),
        kvc.CacheSpec("i", 68, 1, split=(64, 4), page_align=576, compress_ratio=4)), 64)],
        num_blocks=4, layout="BLHNC")
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:12]
    by_name, explicit = kvc.allocate(plan, fill=0), kvc.allocate(plan, fill=0)
    o4.v4_dsa_write(kv, by_name.view("v", 0), k_idx, by_name.view("i", 0), slots, profile=profile)
    o4.v4_dsa_write(kv, explicit.view("v", 0), k_idx, explicit.view("i", 0), slots,
                    **PROFILES[profile].kwargs)
    assert torch.equal(by_name.buffer, explicit.buffer)
    single = kvc.allocate(plan, fill=0)
    o4.v4_mla_quant_and_cache(kv, single.view("v", 0), slots, profile=profile)
    want = kvc.allocate(plan, fill=0)
    r4.v4_mla_write(want.view("v", 0), slots, kv, **PROFILES[profile].kwargs)
    assert torch.equal(single.buffer, want.buffer)


def test_bad_choices_are_refused_naming_the_argument():
    plan = plan_for("fp8_ds_mla_v4")
    gc = guarded(plan)
    kv, slots = boundary_rows()[:2], torch.tensor([0, 1])
    with pytest.raises(ValueError, match='subnormals must be "keep" or "flush", got "drop"'):
        o4.v4_mla_quant_and_cache(kv, gc.view("v", 0), slots, subnormals="drop")
    mx = kvc.plan_cache(groups=[kvc.CacheGroup("g", (kvc.CacheSpec("m", 68, 1, split=(64, 4)),), 16)],
                        num_blocks=4, layout="BLHNC")
    with pytest.raises(ValueError, match='subnormals must be "keep" or "flush", got "zero"'):
        o4.v4_dsa_write(kv, gc.view("v", 0), torch.zeros(2, 128, dtype=torch.bfloat16),
                        kvc.allocate(mx).view("m", 0), slots, subnormals="zero")
    with pytest.raises(ValueError, match="scale_floor='amax' contradicts profile 'vllm-cpu-window'"):
        o4.v4_mla_quant_and_cache(kv, gc.view("v", 0), slots, "amax", profile="vllm-cpu-window")
    gc.assert_unchanged()
