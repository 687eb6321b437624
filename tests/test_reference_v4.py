"""DeepSeek-V4 row formats (SPEC 10): the torch reference's rounding rules, byte for byte.

Expected bytes come from tests/v4_oracle.py (float64 frexp exponents, brute-force nearest-even
codes) and addresses from plan.address (layout.split_address, not reference_v4's strided pages).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import kvcache_ext as kvc
from kvcache_ext import reference as ref
from kvcache_ext import reference_v4 as r4
from v4_oracle import (F32, INF, NAN, all_bf16_positive_finite, bf16_rows, ceil_exp64,
                       expect_e2m1, expect_mla, expect_mxfp4)


# ---- (a) ceil-pow2 from the bits ---------------------------------------------------------------
@pytest.mark.parametrize("floor, div", [(1e-4, 448.0), (6 * 2.0 ** -126, 6.0)],
                         ids=["mla", "mxfp4"])
def test_ceil_log2_every_bf16_amax(floor, div):
    """SPEC 10: exact from the bits; for every bf16 amax equals float64's ceil and vLLM's float
    ceil(log2(amax / 448)); and 2^e covers amax, so no finite tile reaches the +-448 / +-6 clamp."""
    a = all_bf16_positive_finite()
    s = torch.maximum(a, torch.tensor(floor, dtype=F32)) / div
    e = r4.ceil_log2(s)
    assert torch.equal(e, ceil_exp64(s))
    s64 = s.double()
    assert bool(((2.0 ** (e - 1).double() < s64) & (s64 <= 2.0 ** e.double())).all())
    assert torch.equal(e, torch.ceil(torch.log2(s)).to(torch.int64))  # SPEC 10's claim
    assert bool((a.double() / 2.0 ** e.double() <= div).all())


def test_v4_mla_scale_byte_for_every_bf16_amax():
    """The public encoder: one tile per bf16 amax (at varying index and sign), byte = e + 127."""
    a = all_bf16_positive_finite()
    n = a.numel()
    t = -(-n // 7)
    tiles = torch.zeros(t * 7, 64)
    idx = torch.arange(n)
    tiles[idx, idx % 64] = torch.where(idx % 2 == 0, a, -a)
    kv = torch.cat([tiles.reshape(t, 448), torch.zeros(t, 64)], 1).to(torch.bfloat16)
    _, scales = r4.v4_mla_rows(kv)
    want = ceil_exp64(torch.maximum(a, torch.tensor(1e-4, dtype=F32)) / 448) + 127
    assert torch.equal(scales[:, :7].reshape(-1)[:n].to(torch.int64), want)
    assert bool((scales[:, :7].reshape(-1)[n:] == 105).all()) and bool((scales[:, 7] == 0).all())


def test_ceil_log2_vs_exp2_log2_at_one_ulp_above_powers():
    """SPEC 3/10: exp2(ceil(log2(s))) differs at 2^k (1 + 2^-23): fp32 log2 rounds to k."""
    ks = torch.tensor([-100, -20, -8, 8, 20, 100])
    s = torch.ldexp(torch.full((6,), 1 + 2.0 ** -23, dtype=torch.float64), ks.double()).float()
    assert torch.equal(r4.ceil_log2(s), ks + 1)
    naive = torch.exp2(torch.ceil(torch.log2(s)))
    assert torch.equal(naive, torch.ldexp(torch.ones(6), ks.float()))   # 2^k < s: too small
    edge = torch.tensor([2.0 ** -149, 3 * 2.0 ** -149, 2.0 ** -127, 1.0, 0.75, 2.0 ** 127, INF])
    assert r4.ceil_log2(edge).tolist() == [-149, -147, -127, 0, 0, 127, 128]


# ---- (b) floors ---------------------------------------------------------------------------------
def test_amax_floors_exact_bytes():
    kv = torch.zeros(2, 512, dtype=torch.bfloat16)
    kv[1, 64:128] = 5e-5        # below the 1e-4 amax floor
    kv[1, 128:192] = NAN        # NaN-only tile: amax 0 (NaN ignored) -> floor; codes 0x7F
    data, scales = r4.v4_mla_rows(kv)
    assert scales.tolist() == [[105] * 7 + [0]] * 2     # SPEC 10: all-zero tile gets byte 105
    assert bool((data[1, 128:192] == 0x7F).all()) and bool((data[0, :448] == 0).all())
    assert bool((data[1, 64:128] == 0x75).all())        # 5e-5 / 2^-22 = 209.7 -> 208 = 0x75
    _, s2 = r4.v4_mla_rows(kv, scale_floor="scale")     # CuTe DSL compressor: scale floor
    assert s2[0].tolist() == [114] * 7 + [0]
    with pytest.raises(ValueError, match="scale_floor"):
        r4.v4_mla_rows(kv, scale_floor="none")
    k = torch.zeros(2, 128, dtype=torch.bfloat16)
    k[1, 32:64] = NAN
    k[1, 64] = torch.tensor(2.0 ** -133).to(torch.bfloat16)    # smallest bf16 -> still byte 1
    k[1, 96] = -k[1, 64]                                        # tiny negative -> -0 (0x8)
    packed, sc = r4.mxfp4_rows(k)
    assert sc.tolist() == [[1] * 4] * 2                 # SPEC 10: all-zero block gets byte 1
    assert bool((packed[0] == 0).all()) and bool((packed[1, 16:32] == 0x77).all())
    assert int(packed[1, 32]) == 0x00 and int(packed[1, 48]) == 0x08
    assert r4.V4_AMAX_FLOOR == ref.INDEXER_AMAX_FLOOR == 1e-4   # V4 fp8 indexer: V3.2's floor
    codes, scale = r4.v4_indexer_rows(torch.zeros(1, 128, dtype=torch.bfloat16))
    assert scale.view(torch.int32).tolist() == [(127 - 22) << 23] and bool((codes == 0).all())


# ---- (c) saturation, NaN and inf ---------------------------------------------------------------
def test_mla_saturation_nan_inf_exact_bytes():
    kv = torch.zeros(1, 512)
    kv[0, :4] = torch.tensor([448.0, -448.0, 447.0, 1.0])                 # tile 0: byte 127
    kv[0, 64:71] = torch.tensor([464.0, 232.0, NAN, -NAN, -0.0, 2.0 ** -10, 480.0])  # byte 128
    kv[0, 128:136] = torch.tensor([INF, 1.0, -1.0, NAN, -INF, 0.0, -0.0, 3e38])  # tile 2: inf
    kv = kv.to(torch.bfloat16)
    data, scales = r4.v4_mla_rows(kv)
    assert scales[0].tolist() == [127, 128, 255, 105, 105, 105, 105, 0]
    assert data[0, :4].tolist() == [0x7E, 0xFE, 0x7E, 0x38]
    # scale 2: 464 -> 232, a tie between 224 (0x76) and 240 (0x77) -> even 0x76; 232 -> 116,
    # a tie between 112 (0x6E) and 120 (0x6F) -> 0x6E; 2^-11 -> +0; 480 -> 240 = 0x77
    assert data[0, 64:71].tolist() == [0x76, 0x6E, 0x7F, 0x7F, 0x80, 0x00, 0x77]
    # inf tile: scale 2^128 = inf; finite -> +-0, +-inf and NaN -> 0x7F (inf / inf = NaN)
    assert data[0, 128:136].tolist() == [0x7F, 0x00, 0x80, 0x7F, 0x7F, 0x00, 0x80, 0x00]
    top = torch.zeros(1, 512, dtype=torch.bfloat16)
    top.view(torch.int16)[0, 0] = 0x7F7F                            # bf16 max, 2^128 (1 - 2^-8)
    d_top, s_top = r4.v4_mla_rows(top)
    assert int(d_top[0, 0]) == 0x78 and int(s_top[0, 0]) == 247     # 255.99 -> 256 at 2^120
    assert r4.v4_mla_dequant(d_top, s_top)[0, 0].item() == INF      # 256 x 2^120 = 2^128
    out = r4.v4_mla_dequant(data, scales)
    assert bool(out[0, 128:192].isnan().all())           # code x inf: NaN (0 x inf) or inf
    assert bool((out[0, 128:192].view(torch.int16) == 0x7FC0).all())
    assert out[0, :4].float().tolist() == [448.0, -448.0, 448.0, 1.0]


def test_mxfp4_saturation_nan_inf_exact_bytes():
    k = torch.zeros(1, 128)
    k[0, :8] = torch.tensor([6.0, -6.0, 5.9, -5.0, NAN, -NAN, -0.0, -0.2])     # byte 127
    k[0, 32:40] = torch.tensor([INF, 1.0, -INF, NAN, 1.5 * 2.0 ** 126, 2.0 ** 125,
                                -1.5 * 2.0 ** 125, 3.0 * 2.0 ** 126])         # inf block
    packed, scales = r4.mxfp4_rows(k.to(torch.bfloat16))
    assert scales[0].tolist() == [127, 254, 1, 1]
    # (6, -6) -> 7 | F<<4; (5.9, -5) -> 7 | E<<4 (5 ties to 4); NaN -> 7 either sign; -0, -0.2 -> 8
    assert packed[0, :4].tolist() == [0xF7, 0xE7, 0x77, 0x88]
    # inf block, e = 127: +-inf -> +-6; 1 * 2^-127 -> 0; NaN -> 7; 1.5*2^126 -> 0.75 -> 1.0 (2);
    # 2^125 -> 0.25 -> 0; -1.5*2^125 -> -0.375 -> -0.5 (9); 3*2^126 -> 1.5 (3)
    assert packed[0, 16:20].tolist() == [0x07, 0x7F, 0x02, 0x39]
    out = r4.mxfp4_dequant(packed, scales, torch.float32)
    assert out[0, 32:34].tolist() == [INF, 0.0] and out[0, 34].item() == -INF


# ---- (d) e2m1 round to nearest even ------------------------------------------------------------
def test_e2m1_every_midpoint_and_saturation():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert r4.e2m1_encode(mids).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert r4.e2m1_encode(-mids).tolist() == [8, 10, 10, 12, 12, 14, 14]
    up = torch.nextafter(mids, torch.full_like(mids, 10.0))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    assert r4.e2m1_encode(up).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert r4.e2m1_encode(down).tolist() == [0, 1, 2, 3, 4, 5, 6]
    sat = torch.tensor([6.0, 6.5, 7.0, 1e30, INF, -6.5, -INF, NAN, -NAN, -0.0, -1e-30])
    assert r4.e2m1_encode(sat).tolist() == [7, 7, 7, 7, 7, 15, 15, 7, 7, 8, 8]
    grid = torch.tensor(r4.E2M1_VALUES)
    decoded = r4.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert torch.equal(decoded, torch.cat([grid, -grid]))
    x = torch.cat([torch.linspace(-8, 8, 40001), mids, -mids, up, down])  # vs brute force
    assert torch.equal(r4.e2m1_encode(x), expect_e2m1(x))
    k = torch.zeros(1, 128)          # through the rows: element 2i low nibble, 2i+1 high
    k[0, :10] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0])
    packed, scales = r4.mxfp4_rows(k.to(torch.bfloat16))
    assert packed[0, :5].tolist() == [0x07, 0x22, 0x44, 0x66, 0x21] and scales[0, 0] == 127


# ---- (e) round trips -----------------------------------------------------------------------------
def test_mla_round_trip_error_bound():
    g = torch.Generator().manual_seed(0)
    mag = torch.ldexp(torch.ones(32, 1), torch.randint(-30, 30, (32, 1), generator=g).float())
    kv = (torch.randn(32, 512, generator=g) * mag).to(torch.bfloat16)
    data, scales = r4.v4_mla_rows(kv)
    out = r4.v4_mla_dequant(data, scales)
    assert torch.equal(out[:, 448:].view(torch.int16), kv[:, 448:].view(torch.int16))
    x = kv[:, :448].float().reshape(32, 7, 64)
    scale = 2.0 ** (scales[:, :7].float() - 127).unsqueeze(-1)
    err = (out[:, :448].float().reshape(32, 7, 64) - x).abs()
    assert bool((err <= torch.maximum(x.abs() * 2.0 ** -4, scale * 2.0 ** -10)).all())
    assert torch.equal(out, r4.v4_mla_dequant(data, scales, torch.float32).to(torch.bfloat16))


def test_mla_encode_of_dequant_is_identity_for_every_code():
    """Every finite code (each row holds all 254) at scale bytes 105 (the amax floor) .. 246
    (448 x 2^119, bf16's top); column 0 of every tile holds +-448 so the scale comes back."""
    g = torch.Generator().manual_seed(2)
    finite = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
    bytes_ = [105, 106, 127, 200, 246]
    rest = torch.stack([torch.cat([finite, finite[:7 * 63 - 254]])[torch.randperm(441, generator=g)]
                        for _ in bytes_]).reshape(-1, 7, 63)
    top = torch.tensor([0x7E, 0xFE] * 3 + [0x7E], dtype=torch.uint8).reshape(7, 1)
    top = top.expand(len(bytes_), 7, 1)
    rope = torch.randint(0, 256, (len(bytes_), 128), generator=g, dtype=torch.uint8)
    data = torch.cat([torch.cat([top, rest], 2).reshape(-1, 448), rope], 1)
    data[:, 448:].view(torch.int16)[data[:, 448:].view(torch.bfloat16).isnan()] = 0x7FC0
    scales = torch.tensor([[b] * 7 + [0] for b in bytes_], dtype=torch.uint8)
    d2, s2 = r4.v4_mla_rows(r4.v4_mla_dequant(data, scales))
    assert torch.equal(d2, data) and torch.equal(s2, scales)


def test_mxfp4_round_trip_error_bound_and_identity():
    g = torch.Generator().manual_seed(1)
    mag = torch.ldexp(torch.ones(32, 1), torch.randint(-100, 100, (32, 1), generator=g).float())
    k = (torch.randn(32, 128, generator=g) * mag).to(torch.bfloat16)
    packed, scales = r4.mxfp4_rows(k)
    out = r4.mxfp4_dequant(packed, scales, torch.float32).reshape(32, 4, 32)
    x = k.float().reshape(32, 4, 32)
    scale = 2.0 ** (scales.double() - 127).unsqueeze(-1)
    v = x.double().abs() / scale
    half_gap = torch.where(v <= 2, 0.25, torch.where(v <= 4, 0.5, 1.0))
    assert bool(((out.double() - x.double()).abs() <= half_gap * scale).all())
    # every code at every scale byte whose 6 x 2^e is a finite bf16 re-encodes to itself
    codes = torch.randint(0, 16, (252, 128), generator=g, dtype=torch.uint8)
    codes[:, ::32] = torch.tensor([7, 15]).repeat(252, 2)          # each block holds +-6
    codes[:16, 1:17] = torch.arange(16, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = torch.arange(1, 253, dtype=torch.uint8).reshape(252, 1).repeat(1, 4)
    p2, s2 = r4.mxfp4_rows(r4.mxfp4_dequant(packed, scales))
    assert torch.equal(p2, packed) and torch.equal(s2, scales)


# ---- (f) pages of a real V4 plan -----------------------------------------------------------------
def _poisoned(plan, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (plan.total_bytes,), dtype=torch.uint8, generator=g)


def _expected(plan, buf, name, layer, slots, rows_bytes):
    """Bytes at plan.address (the split rule of layout.split_address), checked inside the page."""
    want = buf.clone()
    s = plan.spec(name)
    a = s.split[0] if s.split else s.row_bytes
    rows = plan.rows_per_block(name)
    for slot, row in zip(slots.tolist(), rows_bytes):
        if slot < 0:
            continue
        page = plan.address(name, layer, slot - slot % rows)
        first, last = plan.address(name, layer, slot), plan.address(name, layer, slot, byte=a - 1)
        assert page <= first and last < page + rows * s.row_bytes <= page + plan.page_bytes(name)
        start, end = plan.group_region(name, slot // rows)
        assert start <= page and page + plan.page_bytes(name) <= end
        want[first:first + a] = row[:a]
        if s.split:
            b0 = plan.address(name, layer, slot, byte=a)
            assert b0 == page + rows * a + (slot % rows) * s.split[1]    # footer after all data
            want[b0:b0 + s.split[1]] = row[a:]
    return want


@pytest.mark.parametrize("name, layer, slots", [
    ("c4_kv", 29, [0, 63, -1, 64, 255, 130]), ("c128_kv", 30, [0, 1, 7, -5, 4]),
    ("swa1_kv", 0, [3, 200, -1, 64])])
def test_v4_mla_writes_land_in_split_pages(name, layer, slots):
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=4, layout="BLHNC")
    buf = _poisoned(plan)
    slots = torch.tensor(slots)
    g = torch.Generator().manual_seed(len(slots))
    kv = torch.randn(len(slots) + 2, 512, generator=g).to(torch.bfloat16)   # extra rows ignored
    data, scales = r4.v4_mla_rows(kv[:len(slots)])
    want = _expected(plan, buf, name, layer, slots, torch.cat([data, scales], 1))
    view = plan.view(buf, name, layer)
    r4.v4_mla_write(view, slots, kv)
    assert torch.equal(buf, want)
    d, s = r4.v4_mla_read(view, slots, raw=True)
    keep = slots >= 0
    assert torch.equal(d[keep], data[keep]) and torch.equal(s[keep], scales[keep])
    assert bool((d[~keep] == 0).all()) and bool((s[~keep] == 0).all())
    out = r4.v4_mla_read(view, slots)
    assert torch.equal(out[keep], r4.v4_mla_dequant(data, scales)[keep])
    assert bool((out[~keep] == 0).all())


def test_v4_golden_addresses():
    """c4_kv layer 0, slot 65 = block 1 row 1: data at 1,315,008 + 576, scales at
    1,315,008 + 64 x 576 + 8 (SPEC 10's stride, split (576, 8))."""
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=4, layout="BLHNC")
    buf = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    kv = torch.full((1, 512), 448.0).to(torch.bfloat16)
    r4.v4_mla_write(plan.view(buf, "c4_kv", 0), torch.tensor([65]), kv)
    assert buf[1_315_584] == 0x7E and buf[1_351_880] == 127 and buf[1_351_887] == 0
    assert int(buf.count_nonzero()) == 448 + 128 + 7  # RoPE: 64 x bf16 448 = 0x43E0


def test_mxfp4_and_fp8_indexer_and_states_land_in_pages():
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=4, layout="BLHNC")
    slots = torch.tensor([0, 64, -1, 255, 17])
    k = torch.randn(5, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    buf = _poisoned(plan, 1)
    want = _expected(plan, buf, "c4_indexer", 5, slots, torch.cat(r4.mxfp4_rows(k), 1))
    view = plan.view(buf, "c4_indexer", 5)
    r4.mxfp4_write(view, slots, k)
    assert torch.equal(buf, want)
    assert torch.equal(r4.mxfp4_read(view, slots)[[0, 1, 3, 4]],
                       r4.mxfp4_dequant(*r4.mxfp4_rows(k))[[0, 1, 3, 4]])
    assert bool((r4.mxfp4_read(view, slots)[2] == 0).all())
    # V4 fp8 indexer: V3.2's ue8m0 row, split (128, 4)
    plan8 = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", indexer="fp8"), num_blocks=4,
                           layout="BLHNC")
    buf = _poisoned(plan8, 2)
    codes, scales = r4.v4_indexer_rows(k)
    c2, s2 = ref.indexer_rows(k, "ue8m0")
    assert torch.equal(codes, c2) and torch.equal(scales, s2)
    assert bool((torch.frexp(scales).mantissa == 0.5).all())       # powers of two
    want = _expected(plan8, buf, "c4_indexer", 5, slots,
                     torch.cat([codes, scales.view(torch.uint8).reshape(5, 4)], 1))
    view = plan8.view(buf, "c4_indexer", 5)
    r4.v4_indexer_write(view, slots, k)
    assert torch.equal(buf, want)
    assert torch.equal(r4.v4_indexer_read(view, slots)[0][[0, 1, 3, 4]], codes[[0, 1, 3, 4]])
    # compressor states: [kv | score] rows copied as they are, empty score -inf
    buf = _poisoned(plan, 3)
    st_slots = torch.tensor([0, 5, -1, 15])
    kv, score = torch.randn(4, 1024), torch.randn(4, 1024)
    score[1] = -INF
    rows = r4.state_rows(kv, score)
    assert rows.shape == (4, plan.spec("c4_state").row_bytes)
    want = _expected(plan, buf, "c4_state", 2, st_slots, rows)
    view = plan.view(buf, "c4_state", 2)
    r4.state_write(view, st_slots, kv, score)
    assert torch.equal(buf, want)
    kv2, sc2 = r4.state_read(view, st_slots, 1024)
    live = [0, 1, 3]
    assert torch.equal(kv2[live], kv[live]) and torch.equal(sc2[live], score[live])


def test_empty_state_row_and_state_dtypes():
    row = r4.empty_state_row(512)
    assert row.shape == (1, 4096) and bool((row[0, :2048] == 0).all())
    assert row[0, 2048:2052].tolist() == [0x00, 0x00, 0x80, 0xFF]   # -inf fp32, little endian
    assert r4.empty_state_row(256, torch.bfloat16)[0, 512:514].tolist() == [0x80, 0xFF]
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        r4.state_rows(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"\[T, 512\]"):
        r4.v4_mla_rows(torch.zeros(1, 576))
    with pytest.raises(ValueError, match="one head"):
        r4.write_split(torch.zeros(2, 2, 4, 584, dtype=torch.uint8), torch.tensor([0]),
                       torch.zeros(1, 576, dtype=torch.uint8), torch.zeros(1, 8, dtype=torch.uint8))


# ---- reads through block tables; compressed rows + SWA window ----------------------------------
def test_gather_compressed_and_swa():
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=12, layout="BLHNC")
    buf = _poisoned(plan)
    c_view, swa_view = plan.view(buf, "c4_kv", 3), plan.view(buf, "swa0_kv", 3)
    lens = [300, 5, 130]
    bt_c = torch.tensor([[0, 1], [2, -1], [3, -1]], dtype=torch.int32)       # 256 tokens/block
    bt_s = torch.tensor([[-1, -1, 4, 5, 6], [7, -1, -1, -1, -1], [8, 9, 10, -1, -1]],
                        dtype=torch.int32)                                   # 64; freed -> -1
    pos = torch.cat([torch.arange(n) for n in lens])
    reqs = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    kv = torch.randn(len(pos), 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    r4.v4_mla_write(c_view, kvc.slot_mapping(bt_c, pos, 256, reqs, compress_ratio=4), kv)
    r4.v4_mla_write(swa_view, kvc.slot_mapping(bt_s, pos, 64, reqs), kv)
    out, cu = r4.gather_compressed_and_swa(c_view, bt_c, 4, swa_view, bt_s, torch.tensor(lens))
    deq = r4.v4_mla_dequant(*r4.v4_mla_rows(kv))
    want, start = [], 0
    for n in lens:
        mine = deq[start:start + n]
        want += [mine[3::4][: n // 4], mine[max(0, n - 128):]]   # row c <- token 4c + 3
        start += n
    assert cu.tolist() == [0, 75 + 128, 203 + 1 + 5, 209 + 32 + 128]
    assert torch.equal(out, torch.cat(want))
    # a block-table entry < 0 reads zero rows
    bt_c2 = bt_c.clone()
    bt_c2[0, 1] = -1
    out2, _ = r4.gather_compressed_and_swa(c_view, bt_c2, 4, swa_view, bt_s, torch.tensor(lens))
    assert bool((out2[64:75] == 0).all()) and torch.equal(out2[:64], out[:64])
    # v4_mla_gather: block table + cu_seq_lens over the SWA view (tokens 172..299 of request 0)
    g = r4.v4_mla_gather(swa_view, bt_s[:1], torch.tensor([0, 128]), torch.tensor([172]))
    assert torch.equal(g, deq[172:300])


# ---- (g) properties over random bf16 bit patterns ----------------------------------------------
@settings(max_examples=80, deadline=None)
@given(bf16_rows(512))
def test_property_v4_mla_rows(kv):
    data, scales = r4.v4_mla_rows(kv)
    wd, ws = expect_mla(kv)
    assert torch.equal(scales, ws) and torch.equal(data, wd)
    out = r4.v4_mla_dequant(data, scales, torch.float32)[:, :448].reshape(-1, 7, 64)
    x = kv[:, :448].float().reshape(-1, 7, 64)
    # finite tiles; |x| >= 248 x 2^120 rounds to code 256 at e = 120: 2^128 overflows (below)
    ok = torch.isfinite(x).all(dim=-1, keepdim=True).expand_as(x) & (x.abs() < 248 * 2.0 ** 120)
    bound = torch.maximum(x.abs() * 2.0 ** -4, 2.0 ** (scales[:, :7, None].float() - 137))
    assert bool(((out - x).abs() <= bound)[ok].all())


@settings(max_examples=80, deadline=None)
@given(bf16_rows(128))
def test_property_mxfp4_rows(k):
    packed, scales = r4.mxfp4_rows(k)
    wp, ws = expect_mxfp4(k)
    assert torch.equal(scales, ws) and torch.equal(packed, wp)
    assert bool(((scales >= 1) & (scales <= 254)).all())
