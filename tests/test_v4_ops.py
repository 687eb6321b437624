"""DeepSeek-V4 row ops (kvcache_ext.ops_v4) against the pure-torch reference (reference_v4),
byte for byte: writes into poisoned, guarded caches (every byte of the allocation compared),
reads into poisoned outputs, every bf16 value and every bf16 amax through the kernels, random
bit patterns by hypothesis, and bad input refused before anything is written."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4
from kvcache_ext import reference as ref
from kvcache_ext import reference_v4 as r4

from conftest import DEVICES, guarded
from v4_oracle import all_bf16_positive_finite, bf16_rows

NAN, INF = float("nan"), float("inf")


def pro_plan(layout: str = "BLHNC", num_blocks: int = 6) -> kvc.CachePlan:
    return kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=num_blocks,
                          layout=layout)


def split_plan(layout: str, block_size: int = 16) -> kvc.CachePlan:
    """Single-group plan of split V4 rows, for the strides of every layout."""
    specs = [kvc.CacheSpec("mla", 584, 2, split=(576, 8)),
             kvc.CacheSpec("mx", 68, 2, split=(64, 4))]
    return kvc.plan_cache(specs, num_blocks=5, block_size=block_size, layout=layout)


def special_rows(t: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[max(t + 3, 8), width] rows (strided: wider than used; rows past t ignored), every edge
    case."""
    g = torch.Generator().manual_seed(seed)
    n = max(t + 3, 8)
    x = torch.randn(n, width + 8, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
    x[0, 3], x[1, 9], x[1, 70], x[2, 40] = NAN, INF, -INF, -NAN
    x[3, :64] = 0.0                 # an all-zero tile / block: the floors
    x[4, :32] = 1e-30               # tiny: under the floors
    x[5, 64:128] = 3e38 if dtype != torch.float16 else 6e4  # the top of the range
    x[6, ::3] = -0.0
    return x.to(dtype)[:, :width]


def distinct_slots(n_slots: int, t: int, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.randperm(n_slots, generator=g)[:t].to(torch.int64)
    s[::5] = -1
    return s.to(device)


# ---- writes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_writes_match_reference_in_the_packed_v4_plan(device, layout, dtype):
    plan = pro_plan(layout)
    gc = guarded(plan, device, seed=1)
    t = 41  # not a multiple of 4: the MXFP4 kernel's last warp has dead token groups
    kv = special_rows(t, 512, dtype, seed=2)
    k = special_rows(t, 128, dtype, seed=3)
    cases = [("c4_kv", 29, "amax"), ("c128_kv", 30, "amax"), ("swa0_kv", 0, "scale"),
             ("swa1_kv", 7, "amax")]
    for i, (name, layer, floor) in enumerate(cases):
        slots = distinct_slots(plan.num_blocks * plan.rows_per_block(name), t, seed=i)
        o4.v4_mla_quant_and_cache(kv.to(device), gc.view(name, layer), slots.to(device), floor)
        r4.v4_mla_write(gc.expected_view(name, layer), slots, kv, floor)
    slots = distinct_slots(plan.num_blocks * plan.rows_per_block("c4_indexer"), t, seed=9)
    o4.mxfp4_quant_and_cache(k.to(device), gc.view("c4_indexer", 11), slots.to(device))
    r4.mxfp4_write(gc.expected_view("c4_indexer", 11), slots, k)
    assert not torch.equal(gc.whole_expected, guarded(plan, seed=1).whole_expected)
    gc.assert_matches()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_writes_match_reference_in_every_layout(layout):
    plan = split_plan(layout)
    gc = guarded(plan, seed=4)
    kv, k = special_rows(30, 512, torch.bfloat16, 5), special_rows(30, 128, torch.bfloat16, 6)
    slots = distinct_slots(plan.num_slots, 30, seed=7)
    for layer in (0, 1):
        o4.v4_mla_quant_and_cache(kv, gc.view("mla", layer), slots)
        r4.v4_mla_write(gc.expected_view("mla", layer), slots, kv)
        o4.mxfp4_quant_and_cache(k, gc.view("mx", layer), slots.flip(0))
        r4.mxfp4_write(gc.expected_view("mx", layer), slots.flip(0), k)
    gc.assert_matches()


# ---- every bf16 value, every bf16 amax ------------------------------------------------------
def every_bf16_pattern(width: int) -> torch.Tensor:
    """All 65,536 bf16 bit patterns, shuffled into rows of `width` (tiles mix magnitudes)."""
    bits = torch.arange(1 << 16, dtype=torch.int32)[torch.randperm(1 << 16,
                                                                   generator=torch.Generator().manual_seed(0))]
    pad = -(1 << 16) % width
    bits = torch.cat([bits, torch.zeros(pad, dtype=torch.int32)])
    return bits.to(torch.int16).view(torch.bfloat16).reshape(-1, width)


def every_amax(tile: int, tiles_per_row: int, width: int) -> torch.Tensor:
    """One tile per positive finite bf16 value A: A at a varying position, the others A x u
    (u in [-1, 1)), so each tile's amax is A; RoPE / unused values random."""
    a = all_bf16_positive_finite()
    n = a.numel()
    g = torch.Generator().manual_seed(1)
    vals = a.unsqueeze(1) * (torch.rand(n, tile, generator=g) * 2 - 1)
    vals[torch.arange(n), torch.arange(n) % tile] = a
    rows = -(-n // tiles_per_row)
    vals = torch.cat([vals, torch.zeros(rows * tiles_per_row - n, tile)]).reshape(rows, -1)
    extra = torch.randn(rows, width - tiles_per_row * tile, generator=g)
    return torch.cat([vals, extra], 1).to(torch.bfloat16)


def _kernel_vs_reference(x: torch.Tensor, fmt: str, floor: str = "amax", device: str = "cpu") -> None:
    """The kernel on `device` (on a GPU: the hardware fp8 conversions) against the reference."""
    rows_per_block = 64
    nb = -(-x.shape[0] // rows_per_block)
    spec = (kvc.CacheSpec("v", 584, 1, split=(576, 8)) if fmt == "mla" else
            kvc.CacheSpec("v", 68, 1, split=(64, 4)))
    plan = kvc.plan_cache([spec], num_blocks=nb, block_size=rows_per_block, layout="BLHNC")
    got = torch.zeros(plan.total_bytes, dtype=torch.uint8, device=device)
    want = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    slots = torch.arange(x.shape[0])
    if fmt == "mla":
        o4.v4_mla_quant_and_cache(x.to(device), plan.view(got, "v", 0), slots.to(device), floor)
        r4.v4_mla_write(plan.view(want, "v", 0), slots, x, floor)
    else:
        o4.mxfp4_quant_and_cache(x.to(device), plan.view(got, "v", 0), slots.to(device))
        r4.mxfp4_write(plan.view(want, "v", 0), slots, x)
    assert torch.equal(got.cpu(), want), f"{int((got.cpu() != want).sum())} bytes differ"
    view, ref_view = plan.view(got, "v", 0), plan.view(want, "v", 0)
    name = "fp8_ds_mla_v4" if fmt == "mla" else "mxfp4"
    read = r4.v4_mla_read if fmt == "mla" else r4.mxfp4_read
    for dtype, as_int in ((torch.bfloat16, torch.int16), (torch.float32, torch.int32)):
        out = o4.gather_v4_slots(view, slots.to(device), name, dtype=dtype).cpu()
        assert torch.equal(out.view(as_int), read(ref_view, slots, dtype).view(as_int)), dtype


@pytest.mark.parametrize("floor", ["amax", "scale"])
def test_every_bf16_value_and_amax_v4_mla(device, floor):
    """SPEC 10's rules end to end, kernel = reference: every bf16 value encoded (NaN -> 0x7F,
    +-448 saturation, inf tiles -> byte 255), every positive bf16 tile amax (ceil-pow2 scale
    from the bits, the 1e-4 amax or scale floor), and both decodes."""
    _kernel_vs_reference(every_bf16_pattern(512), "mla", floor, device)
    _kernel_vs_reference(every_amax(64, 7, 512), "mla", floor, device)


def test_every_bf16_value_and_amax_mxfp4(device):
    """Every bf16 value (e2m1 RNE, +-6 saturation, NaN -> 0x7, -tiny -> 0x8) and every positive
    bf16 block amax (clamped exponent, 6 x 2^-126 floor), and the decodes."""
    _kernel_vs_reference(every_bf16_pattern(128), "mxfp4", device=device)
    _kernel_vs_reference(every_amax(32, 4, 128), "mxfp4", device=device)


@pytest.mark.gpu  # loops over DEVICES: the cuda kernels too where there is a GPU
@settings(max_examples=60, deadline=None)
@given(bf16_rows(512), bf16_rows(128))
def test_property_kernels_match_reference(kv, k):
    for device in DEVICES:
        _kernel_vs_reference(kv, "mla", device=device)
        _kernel_vs_reference(k, "mxfp4", device=device)


# ---- reads -----------------------------------------------------------------------------------
def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8))


@pytest.mark.parametrize("name, fmt", [("c4_kv", "fp8_ds_mla_v4"), ("c4_indexer", "mxfp4")])
def test_reads_by_slots_and_block_table_match_reference(device, name, fmt):
    plan = pro_plan(num_blocks=5)
    gc = guarded(plan, device, seed=8)
    rows = plan.rows_per_block(name)
    n = plan.num_blocks * rows
    width = 512 if fmt == "fp8_ds_mla_v4" else 128
    x = special_rows(n, width, torch.bfloat16, seed=9)[:n]
    every = torch.arange(n)
    write = o4.v4_mla_quant_and_cache if fmt == "fp8_ds_mla_v4" else o4.mxfp4_quant_and_cache
    write(x.to(device), gc.view(name, 4), every.to(device))
    view, ref = gc.view(name, 4), gc.expected_view(name, 4)
    (r4.v4_mla_write if fmt == "fp8_ds_mla_v4" else r4.mxfp4_write)(ref, every, x)
    gc.assert_matches()
    read = r4.v4_mla_read if fmt == "fp8_ds_mla_v4" else r4.mxfp4_read
    slots = torch.tensor([[5, -1, n - 1], [0, 3 * rows + 2, 7]])
    for dtype in (torch.bfloat16, torch.float32):
        got = o4.gather_v4_slots(view, slots.to(device), fmt, dtype=dtype)
        assert got.shape == (2, 3, width) and _same(got.reshape(6, width), read(ref, slots.reshape(-1), dtype))
    raw = o4.gather_v4_slots(view, slots.to(device), fmt, raw=True)
    assert _same(raw.reshape(6, -1), torch.cat(read(ref, slots.reshape(-1), raw=True), 1))
    # through a block table: two requests, the second skipping its first rows + 1
    bt = torch.tensor([[2, 0, 4], [1, 3, -1]], dtype=torch.int32)
    cu = torch.tensor([0, 2 * rows + 5, 2 * rows + 5 + rows], dtype=torch.int32)
    starts = torch.tensor([0, rows - 7], dtype=torch.int32)
    out = torch.full((int(cu[-1]) + 3, width), -3.0, dtype=torch.bfloat16, device=device)
    o4.gather_v4(view, bt.to(device), cu.to(device), fmt, seq_starts=starts.to(device), out=out)
    want = r4.gather_slots(bt, cu, rows, starts)
    assert _same(out[: int(cu[-1])], read(ref, want))
    assert bool((out[int(cu[-1]):] == -3.0).all())            # rows past cu[-1]: the caller's


@pytest.mark.parametrize("raw, dtype", [(False, torch.bfloat16), (False, torch.float32), (True, None)])
def test_compressed_and_swa_read_matches_reference(device, raw, dtype):
    plan = pro_plan(num_blocks=12)
    gc = guarded(plan, device, seed=10)
    c_view, swa_view = gc.view("c4_kv", 3), gc.view("swa0_kv", 3)
    c_ref, swa_ref = gc.expected_view("c4_kv", 3), gc.expected_view("swa0_kv", 3)
    lens = [300, 5, 130, 0]
    bt_c = torch.tensor([[0, 1], [2, -1], [3, -1], [-1, -1]], dtype=torch.int32)
    bt_s = torch.tensor([[-1, -1, 4, 5, 6], [7, -1, -1, -1, -1], [8, 9, 10, -1, -1],
                         [-1] * 5], dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lens])
    reqs = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    kv = special_rows(len(pos), 512, torch.bfloat16, seed=11)[: len(pos)]
    c_slots = kvc.slot_mapping(bt_c, pos, 256, reqs, compress_ratio=4)
    s_slots = kvc.slot_mapping(bt_s, pos, 64, reqs)
    o4.v4_mla_quant_and_cache(kv.to(device), c_view, c_slots.to(device))
    o4.v4_mla_quant_and_cache(kv.to(device), swa_view, s_slots.to(device))
    r4.v4_mla_write(c_ref, c_slots, kv)
    r4.v4_mla_write(swa_ref, s_slots, kv)
    gc.assert_matches()
    seq = torch.tensor(lens, dtype=torch.int32)
    want, cu = r4.gather_compressed_and_swa(c_ref, bt_c, 4, swa_ref, bt_s, seq, dtype=dtype or torch.bfloat16)
    d = lambda t: t.to(device)  # noqa: E731
    out, cu_out = o4.gather_compressed_and_swa(c_view, d(bt_c), 4, swa_view, d(bt_s), d(seq),
                                               dtype=dtype, raw=raw)
    assert cu_out.cpu().tolist() == cu.tolist() == [0, 203, 209, 369, 369]
    if raw:  # raw rows: the reference's rows at the same slots
        assert out.shape == (369, 584) and bool(out[:64].any())
        back = torch.zeros(369, 512, dtype=torch.bfloat16)
        back[:] = r4.v4_mla_dequant(out[:, :576].cpu(), out[:, 576:].cpu())
        assert _same(back, want)
    else:
        assert _same(out, want)
    # into out=: rows past cu_out[-1] keep the caller's values; a freed block reads zeros
    bt_c2 = bt_c.clone()
    bt_c2[0, 1] = -1
    mine = torch.full((380, 512), 7.0, device=device)
    o4.gather_compressed_and_swa(c_view, d(bt_c2), 4, swa_view, d(bt_s), d(seq), out=mine,
                                 cu_out=d(cu.to(torch.int32)), validate=False)
    assert bool((mine[64:75] == 0).all()) and bool((mine[369:] == 7.0).all())
    assert _same(mine[:64], r4.gather_compressed_and_swa(c_ref, bt_c, 4, swa_ref, bt_s, seq,
                                                         dtype=torch.float32)[0][:64])
    with pytest.raises(IndexError, match=r"c_block_table\[0, 1\] = -1"):
        o4.gather_compressed_and_swa(c_view, d(bt_c2), 4, swa_view, d(bt_s), d(seq), out=mine,
                                     validate=True)


# ---- compressor states -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_rows_write_and_read(device, dtype):
    groups = kvc.presets.deepseek_v4("pro")
    if dtype == torch.bfloat16:  # a bf16 state row: [kv 1024 | score 1024] x 2 B
        groups = [kvc.CacheGroup("c4_states", [kvc.CacheSpec("c4_state", 4096, 30, page_align=576)], 4)]
    plan = kvc.plan_cache(groups=groups, num_blocks=6, layout="BLHNC")
    gc = guarded(plan, device, seed=12)
    g = torch.Generator().manual_seed(13)
    kv, score = torch.randn(9, 1024, generator=g).to(dtype), torch.randn(9, 1024, generator=g).to(dtype)
    score[2] = -INF
    slots = torch.tensor([0, 5, -1, 23, 9, 12, 1, 2, 3])
    o4.state_write(kv.to(device), score.to(device), gc.view("c4_state", 2), slots.to(device))
    r4.state_write(gc.expected_view("c4_state", 2), slots, kv, score)
    gc.assert_matches()
    bt = torch.tensor([[0, 1, 2], [5, 3, 4]], dtype=torch.int32)
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)
    got_kv, got_score = o4.state_read(gc.view("c4_state", 2), bt.to(device), cu.to(device), 1024,
                                      dtype=dtype)
    want = r4.state_read(gc.expected_view("c4_state", 2),
                         r4.gather_slots(bt, cu, 4), 1024, dtype)
    assert _same(got_kv, want[0]) and _same(got_score, want[1])
    with pytest.raises(TypeError, match="both be float32 or bfloat16"):
        o4.state_write(kv.float(), score.half(), gc.view("c4_state", 2), slots.to(device))


# ---- the compressed pair at a compressed slot mapping ---------------------------------------
@pytest.mark.parametrize("indexer", ["mxfp4", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_v4_dsa_write_at_compressed_slots_prefill_then_decode(device, indexer, dtype):
    """A C4 layer's main KV + indexer rows written by v4_dsa_write at kvc.slot_mapping(...,
    compress_ratio=4): a prefill of two requests, then two decode steps. Only tokens closing a
    4-token window write; every byte matches the reference writes of the same rows."""
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", indexer=indexer), num_blocks=6,
                          layout="BLHNC")
    gc = guarded(plan, device, seed=15)
    bt = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)     # 256 tokens per block
    g = torch.Generator().manual_seed(16)
    lens = [301, 7]
    steps = [(torch.cat([torch.arange(n) for n in lens]),
              torch.cat([torch.full((n,), r) for r, n in enumerate(lens)]))]
    steps += [(torch.tensor(lens) + d, torch.tensor([0, 1])) for d in (0, 1)]  # decode: 301, 7; 302, 8
    closing = 0
    for pos, req in steps:
        slots = kvc.slot_mapping(bt, pos, 256, req, compress_ratio=4)
        assert bool(((slots >= 0) == ((pos + 1) % 4 == 0)).all())
        closing += int((slots >= 0).sum())
        kv = special_rows(len(pos), 512, dtype, seed=int(pos.sum()))[: len(pos)]
        k = (torch.randn(len(pos), 128, generator=g) * 3).to(dtype)
        o4.v4_dsa_write(kv.to(device), gc.view("c4_kv", 2), k.to(device), gc.view("c4_indexer", 2),
                        slots.to(device), indexer=indexer)
        r4.v4_mla_write(gc.expected_view("c4_kv", 2), slots, kv)
        (r4.mxfp4_write if indexer == "mxfp4" else r4.v4_indexer_write)(
            gc.expected_view("c4_indexer", 2), slots, k)
    assert closing == 75 + 1 + 0 + 1 + 0                       # tokens 3, 7, ... of each request
    gc.assert_matches()
    # the rows read back through the compressed block table: row c <- token 4c + 3
    out = o4.gather_v4(gc.view("c4_kv", 2), bt.to(device), torch.tensor([0, 75, 77], dtype=torch.int32,
                                                                         device=device))
    assert _same(out, r4.v4_mla_gather(gc.expected_view("c4_kv", 2), bt, torch.tensor([0, 75, 77])))
    rows = torch.tensor([0, 1, 74, 64 + 0, 64 + 1])                 # c4 slots of rows 0, 1, 74, req 1
    slots = torch.cat([bt[0, 0] * 64 + rows[:2], bt[0, 1] * 64 + rows[2:3] - 64, bt[1, 0] * 64 + rows[3:] - 64])
    if indexer == "mxfp4":
        got = o4.gather_v4_slots(gc.view("c4_indexer", 2), slots.to(device), "mxfp4")
        assert _same(got, r4.mxfp4_read(gc.expected_view("c4_indexer", 2), slots))
    else:
        codes, scales = kvc.ops.gather_indexer_slots(gc.view("c4_indexer", 2), slots.to(device), "split")
        want_codes, want_scales = r4.v4_indexer_read(gc.expected_view("c4_indexer", 2), slots)
        assert _same(codes, want_codes) and _same(scales, want_scales)
        assert bool((torch.frexp(scales.cpu()).mantissa == 0.5).all())  # ue8m0: powers of two


def test_flashinfer_layout_rows_are_plain_rows(device):
    """The FlashInfer variant's 512-wide per-tensor e4m3 rows (pages padded to 512 B) are the
    plain K/V ops' rows: reshape_and_cache / gather_kv with a scale, byte for byte the reference;
    bf16 512-wide rows ("auto") likewise, in a 1024-B spec."""
    groups = kvc.presets.deepseek_v4("flash", mla="flashinfer_fp8")
    groups.append(kvc.CacheGroup("bf16", [kvc.CacheSpec("kv_bf16", 1024, 2, page_align=512)], 64))
    plan = kvc.plan_cache(groups=groups, num_blocks=5, layout="BLHNC")
    assert plan.spec("c4_kv").row_bytes == 512
    gc = guarded(plan, device, seed=18)
    kv = special_rows(50, 512, torch.bfloat16, seed=19)[:50]
    slots = distinct_slots(5 * 64, 50, seed=20)
    scale = torch.tensor([0.25])
    kvc.ops.reshape_and_cache(kv.unsqueeze(1).to(device), gc.view("c4_kv", 3), slots.to(device), "fp8", scale)
    ref.reshape_and_cache(kv.unsqueeze(1), gc.expected_view("c4_kv", 3), slots, "fp8", scale)
    kvc.ops.reshape_and_cache(kv.unsqueeze(1).to(device), gc.view("kv_bf16", 1), slots.to(device))
    ref.reshape_and_cache(kv.unsqueeze(1), gc.expected_view("kv_bf16", 1), slots)
    gc.assert_matches()
    bt, cu = torch.tensor([[3, 0, 4]], dtype=torch.int32), torch.tensor([0, 150], dtype=torch.int32)
    for name, sc in (("c4_kv", scale), ("kv_bf16", None)):
        got = kvc.ops.gather_kv(gc.view(name, 3 if sc is not None else 1), bt.to(device), cu.to(device),
                                scale=sc, dtype=torch.bfloat16)
        want = ref.gather_kv(gc.expected_view(name, 3 if sc is not None else 1), bt, cu,
                             torch.bfloat16, sc)
        assert _same(got, want) and bool(got.any())
    # a sparse top-k over the 512-wide rows: gather_kv_slots
    top = torch.tensor([[5, -1, 3 * 64 + 2], [4 * 64 + 63, 0, 7]])
    got = kvc.ops.gather_kv_slots(gc.view("c4_kv", 3), top.to(device), scale=scale)
    rows = ref.read_rows(gc.expected_view("c4_kv", 3), top.reshape(-1))
    want = ref.to_bf16(ref.e4m3_decode(rows) * 0.25).reshape(2, 3, 1, 512)
    assert got.shape == (2, 3, 1, 512) and _same(got, want) and bool((got[0, 1] == 0).all())
