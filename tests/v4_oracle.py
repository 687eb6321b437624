"""Independent oracle of DeepSeek-V4's row formats (SPEC 10) for tests/test_reference_v4.py.

Exponents from float64 frexp (not the fp32 bits), codes from a brute-force nearest-even search
over each format's value grid (not thresholds or torch's fp8 cast), and a hypothesis strategy
of bf16 rows with NaN / inf / edge values sprinkled.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

F32 = torch.float32
NAN, INF = float("nan"), float("inf")


# ---- independent helpers ----------------------------------------------------------------------
def all_bf16_positive_finite() -> torch.Tensor:
    """Every positive finite bf16 value (0x0001 .. 0x7F7F) as fp32."""
    return torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()


def ceil_exp64(s: torch.Tensor) -> torch.Tensor:
    """ceil(log2(s)) via float64 frexp: s = m 2^x, m in [0.5, 1); exact power of two iff m = 0.5."""
    m, x = torch.frexp(s.double())
    return torch.where(m == 0.5, x - 1, x).to(torch.int64)


def nearest_even(v: torch.Tensor, grid: list[float]) -> torch.Tensor:
    """Index of the grid value nearest |v| (ties to the even index), saturating at the top."""
    g = torch.tensor(grid, dtype=torch.float64)
    a = v.double().abs().clamp(max=1e6).reshape(-1, 1)   # above both grids, still resolvable
    d = (a - g).abs()
    cand = d == d.min(dim=1, keepdim=True).values
    score = cand.to(torch.int64) * (2 - torch.arange(len(grid)) % 2)
    return score.argmax(dim=1).reshape(v.shape)


E4M3_GRID = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]   # SPEC 10: e2m1 magnitudes


def expect_e4m3(v: torch.Tensor) -> torch.Tensor:
    """SPEC 3: RNE, saturate +-448 (and +-inf), NaN -> 0x7F, sign kept."""
    code = nearest_even(v, E4M3_GRID) | (torch.signbit(v).to(torch.int64) << 7)
    return torch.where(v.isnan(), 0x7F, code).to(torch.uint8)


def expect_e2m1(v: torch.Tensor) -> torch.Tensor:
    """SPEC 10: RNE, saturate +-6, NaN -> 0x7 (+6), sign kept (-0 / small negatives -> 0x8)."""
    code = nearest_even(v, E2M1_GRID) | (torch.signbit(v).to(torch.int64) << 3)
    return torch.where(v.isnan(), 0x7, code).to(torch.uint8)


def nan_free_amax(x: torch.Tensor) -> torch.Tensor:
    a = x.double().abs()
    return torch.where(a.isnan(), 0.0, a).amax(dim=-1)


def expect_mla(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SPEC 10 V4 fp8_ds_mla from float64: (data [T, 576], scales [T, 8])."""
    t = kv.shape[0]
    x = kv[:, :448].double().reshape(t, 7, 64)
    a = nan_free_amax(x)
    s = (torch.maximum(a.float(), torch.tensor(1e-4, dtype=F32)) / 448).double()
    e = torch.where(a.isinf(), 128, ceil_exp64(s))
    scale = torch.ldexp(torch.ones((), dtype=torch.float64), e.double())
    scale = torch.where(a.isinf(), INF, scale)                       # fp32 2^128 is inf
    v = x / scale.unsqueeze(-1)
    rope = kv[:, 448:].contiguous().view(torch.uint8)
    data = torch.cat([expect_e4m3(v).reshape(t, 448), rope], 1)
    footer = torch.zeros(t, 1, dtype=torch.uint8)
    scales = torch.cat([(e + 127).clamp(0, 255).to(torch.uint8), footer], 1)
    return data, scales


def expect_v41(kv: torch.Tensor, floor: str = "amax") -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4.1's 528-B record from float64 (vLLM PR #56893's writer: amax floor 1e-4;
    floor="scale": the scale floored instead): (data [T, 512], scales [T, 16])."""
    t = kv.shape[0]
    x = kv.double().reshape(t, 16, 32)
    a = nan_free_amax(x)
    if floor == "amax":
        s = (torch.maximum(a.float(), torch.tensor(1e-4, dtype=F32)) / 448).double()
    else:
        s = torch.maximum((a.float() / 448), torch.tensor(1e-4, dtype=F32)).double()
    e = torch.where(a.isinf(), 128, ceil_exp64(s))
    scale = torch.where(a.isinf(), INF, torch.ldexp(torch.ones((), dtype=torch.float64), e.double()))
    data = expect_e4m3(x / scale.unsqueeze(-1)).reshape(t, 512)
    return data, (e + 127).clamp(0, 255).to(torch.uint8)


def expect_mxfp4(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = k.shape[0]
    x = k.double().reshape(t, 4, 32)
    a = nan_free_amax(x)
    s = (torch.maximum(a.float(), torch.tensor(6 * 2.0 ** -126, dtype=F32)) / 6).double()
    e = torch.where(a.isinf(), 127, ceil_exp64(s).clamp(-127, 127))
    inv = torch.ldexp(torch.ones((), dtype=torch.float64), -e.double())
    codes = expect_e2m1(x * inv.unsqueeze(-1)).reshape(t, 64, 2)
    return codes[..., 0] | (codes[..., 1] << 4), (e + 127).to(torch.uint8)


SPECIALS = [0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0000, 0x8000, 0x0001, 0x7F7F, 0xFF7F]


@st.composite
def bf16_rows(draw, width):
    """[T, width] bf16: random bit patterns or scaled normals, NaN / inf / edge values sprinkled."""
    t = draw(st.integers(1, 4))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31)))
    if draw(st.booleans()):
        bits = torch.randint(0, 1 << 16, (t, width), generator=g, dtype=torch.int32)
    else:
        exp = torch.randint(-130, 125, (t, 1), generator=g).float()
        x = torch.ldexp(torch.randn(t, width, generator=g), exp).to(torch.bfloat16)
        bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    for pos, b in draw(st.lists(st.tuples(st.integers(0, t * width - 1),
                                          st.sampled_from(SPECIALS)), max_size=12)):
        bits.view(-1)[pos] = b
    return bits.to(torch.int16).view(torch.bfloat16)
