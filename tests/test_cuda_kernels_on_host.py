"""The CUDA kernels, executed on the host (tests/simt/), give the CPU kernels' bytes.

CI has no GPU, so without this the code in csrc/cuda/*_kernels.cuh would only be compiled.
tests/simt/simt_host.h runs each CUDA thread as a host thread (warp shuffles included) through
the same dispatch functions the CUDA ops use, on CPU tensors. Every write lands in a poisoned,
guarded allocation and is compared byte for byte, guard bytes included, with the CPU op's;
gathers write into poisoned, strided outputs. The CUDA semantics differ from the CPU ops' in
one way, by design: a slot outside the view is skipped instead of rejected, so the CPU oracle
gets those tokens as padding (-1). Duplicate slots are a caller error on both paths, so the
slots here are distinct. On a GPU, tests/test_cuda_graphs.py checks the real thing.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kvcache_ext as kvc

from conftest import guarded

ROOT = Path(__file__).resolve().parent.parent
BAD = 10**9  # a slot far outside any view


def plan_for(layout: str, block_size: int) -> kvc.CachePlan:
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2),
             kvc.CacheSpec("mla_auto", 1152, 1), kvc.CacheSpec("kv", 2 * 64, 1, 2),
             kvc.CacheSpec("kv_odd", 2 * 5, 1, 3), kvc.CacheSpec("kv8", 5, 1, 3),
             kvc.CacheSpec("mla8", 576, 1), kvc.CacheSpec("vv", 2 * 64, 1, 2),
             kvc.CacheSpec("vv8", 5, 1, 3), kvc.CacheSpec("indexer2", 132, 1)]
    return kvc.plan_cache(specs, num_blocks=max(4, 160 // block_size), block_size=block_size,
                          layout=layout)


def slots_for(plan: kvc.CachePlan, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(CUDA slots with padding and out-of-range entries, the CPU oracle's slots)."""
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(plan.num_slots, generator=g)[:t].to(torch.int64)
    slots[::7] = -1
    slots[3::11] = plan.num_slots + torch.arange(len(slots[3::11]))  # just past the view
    slots[5::13] = BAD + torch.arange(len(slots[5::13]))
    # -1 - t keeps the oracle's padding distinct (not needed: negative slots are never compared)
    oracle = torch.where(slots >= plan.num_slots, -1, slots)
    return slots, oracle


def inputs(t: int, seed: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, 600, generator=g) * 5).to(dtype)  # rows wider than used: strided inputs
    x[::9, ::5] = 0
    x[4, 7] = float("nan")
    x[6, 100:110] = float("inf")
    x[8, :128] = 1e-30  # an all-tiny tile
    k = (torch.randn(t, 128, generator=g) * 2).to(dtype)
    k[2] = 0
    return x[:, :512], x[:, 512:576], k


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_writes_give_the_cpu_bytes(simt, layout, block_size, dtype):
    plan = plan_for(layout, block_size)
    t = 67
    slots, oracle = slots_for(plan, t, seed=block_size)
    kv_c, k_pe, k = inputs(t, seed=1, dtype=dtype)
    x_odd = torch.cat([kv_c, k_pe], 1).flip(0).contiguous()
    x_odd = torch.cat([x_odd[:, :1], x_odd], 1)[:, 1:]  # a row stride of 577 elements
    k_odd = torch.cat([k[:, :1], k.flip(0)], 1)[:, 1:]
    g = torch.Generator().manual_seed(2)
    key = torch.randn(t, 2, 64, generator=g).to(dtype)
    key_odd = torch.randn(t, 3, 8, generator=g).to(dtype)[:, :, :5]  # strided heads
    key8 = torch.randn(t, 3, 5, generator=g)
    scale = torch.tensor([0.5])
    mla_scale = torch.tensor([0.0625])
    cuda_gc, cpu_gc = guarded(plan, seed=3), guarded(plan, seed=3)
    for gc, s, ops in ((cuda_gc, slots, simt), (cpu_gc, oracle, kvc.ops)):
        ops.dsa_write(kv_c, k_pe, gc.view("mla", 0), k, gc.view("indexer", 0), s, "fp8_ds_mla",
                      "ue8m0", "split")
        ops.dsa_write(kv_c, k_pe, gc.view("mla_auto", 0), k, gc.view("indexer", 1), s, "auto",
                      None, "row")
        ops.concat_and_cache_mla(kv_c, k_pe, gc.view("mla", 1), s, "fp8_ds_mla", None)
        # inputs 2 bytes off 16-B alignment: the kernels' generic (run-time tested) variants
        ops.dsa_write(x_odd[:, :512], x_odd[:, 512:576], gc.view("mla", 1), k_odd,
                      gc.view("indexer", 0), s, "fp8_ds_mla", "ue8m0", "split")
        ops.concat_and_cache_mla(kv_c, k_pe, gc.view("mla8", 0), s, "fp8", mla_scale)
        ops.indexer_k_quant_and_cache(k[:40], gc.view("indexer", 1), s[:40], None, "split")
        ops.indexer_k_quant_and_cache(k, gc.view("indexer2", 0), s, "ue8m0", "row")  # T = 67
        ops.reshape_and_cache(key, gc.view("kv", 0), s, "auto", None)
        ops.reshape_and_cache(key_odd, gc.view("kv_odd", 0), s, "auto", None)
        ops.reshape_and_cache(key8, gc.view("kv8", 0), s, "fp8", scale)
        ops.reshape_and_cache_kv(key, key * 3, gc.view("kv", 0), gc.view("vv", 0), s, "auto",
                                 None, None)
        ops.reshape_and_cache_kv(key8, -key8, gc.view("kv8", 0), gc.view("vv8", 0), s, "fp8",
                                 torch.tensor([0.5, 0.25, 4.0]), scale)
    written = cpu_gc.whole != guarded(plan, seed=3).whole
    assert written.sum() > t * 656  # the oracle wrote rows: an emulator doing nothing would fail
    if not torch.equal(cuda_gc.whole, cpu_gc.whole):
        diff = torch.nonzero(cuda_gc.whole != cpu_gc.whole).squeeze(1)
        raise AssertionError(f"{diff.numel()} bytes differ, first at {diff[:8].tolist()}")


def poisoned(*shape: int, dtype: torch.dtype, pad: int) -> torch.Tensor:
    """An output [*shape] whose rows sit inside wider poisoned rows (row stride not 16-B aligned)."""
    whole = torch.randint(0, 256, (*shape[:-1], (shape[-1] + pad) * torch.empty(0, dtype=dtype).element_size()),
                          dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    return whole.view(dtype)[..., 1:1 + shape[-1]]


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_gathers_give_the_cpu_bytes(simt, layout, block_size):
    plan = plan_for(layout, block_size)
    gc = guarded(plan, seed=4)
    n = plan.num_slots
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(n, 576, generator=g) * 4).to(torch.bfloat16)
    k = torch.randn(n, 128, generator=g).to(torch.bfloat16)
    every = torch.arange(n)
    kvc.ops.dsa_write(x[:, :512], x[:, 512:], gc.view("mla", 1), k, gc.view("indexer", 1), every,
                      "fp8_ds_mla", "ue8m0", "split")
    kvc.ops.dsa_write(x[:, :512], x[:, 512:], gc.view("mla_auto", 0), k, gc.view("indexer", 0),
                      every, "auto", None, "row")
    kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], gc.view("mla8", 0), every, "fp8", 0.03125)
    # NaN codes and a negative-NaN scale: x86 arithmetic would keep the NaN's sign and payload,
    # a GPU gives 0x7FFFFFFF; both kernels must select the canonical 0x7FC00000 themselves.
    row = gc.view("mla", 1)[0, 0, 0]
    row[:5] = 0x7F
    row[512 + 4:512 + 8] = torch.tensor([-float("nan")]).view(torch.uint8)
    gc.view("mla8", 0)[0, 0, 0, :3] = 0xFF
    nb = plan.num_blocks
    # Three requests (one empty), a table with entries outside the view, and skipped prefixes.
    lens = [min(70, n // 3), 0, min(45, n // 4)]
    width = -(-max(lens) // block_size) + 3
    table = torch.randint(-2, nb + 2, (3, width), generator=g, dtype=torch.int32)
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    starts = torch.tensor([0, 0, 2 * block_size - 1], dtype=torch.int32)
    total = int(cu[-1]) + 5  # rows past the last request keep the caller's poison
    slots = torch.randint(-1, n + 3, (40,), generator=g)
    slots[7] = BAD
    g2 = torch.Generator().manual_seed(6)
    kvc.ops.reshape_and_cache(torch.randn(n, 2, 64, generator=g2).to(torch.bfloat16),
                              gc.view("kv", 0), every)
    kvc.ops.reshape_and_cache(torch.randn(n, 3, 5, generator=g2) * 9, gc.view("vv8", 0), every,
                              "fp8", torch.tensor([1.0, 0.5, 2.0]))
    for kv_name, heads, d, kv_scale, kv_dtype in (
            ("kv", 2, 64, None, torch.bfloat16),
            ("vv8", 3, 5, torch.tensor([0.5, 0.25, 4.0]), torch.float16),
            ("vv8", 3, 5, torch.tensor([0.75]), torch.float32)):
        got = poisoned(total, heads, d, dtype=kv_dtype, pad=3)
        want = got.clone()
        simt.gather_kv(gc.view(kv_name, 0), table, cu, starts, got, kv_scale)
        kvc.ops.gather_kv(gc.view(kv_name, 0), table, cu, seq_starts=starts, scale=kv_scale,
                          out=want, validate=False)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (kv_name, kv_dtype)
        assert got[: int(cu[-1])].view(torch.uint8).any()
        got = poisoned(slots.numel(), heads, d, dtype=kv_dtype, pad=3)  # by explicit slots
        want = got.clone()
        simt.gather_kv(gc.view(kv_name, 0), None, None, None, got, kv_scale, slots)
        kvc.ops.gather_kv_slots(gc.view(kv_name, 0), slots, scale=kv_scale, out=want, validate=False)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (kv_name, kv_dtype, "slots")
    slots[9] = 0  # the row with NaN codes
    sc = torch.tensor([0.03125])
    mla_modes = [("mla", "fp8_ds_mla", torch.bfloat16, 576, None),
                 ("mla", "fp8_ds_mla", torch.float32, 576, None),
                 ("mla", "fp8_ds_mla", torch.uint8, 656, None),
                 ("mla_auto", "auto", torch.bfloat16, 576, None),
                 ("mla8", "fp8", torch.bfloat16, 576, sc), ("mla8", "fp8", torch.float32, 576, sc),
                 ("mla8", "fp8", torch.uint8, 576, sc)]
    for name, kv, dtype, width_out, scale in mla_modes:
        view = gc.view(name, 1 if name == "mla" else 0)
        for src in ((table, cu, starts, None, total), (None, None, None, slots, slots.numel())):
            table_, cu_, starts_, slots_, rows = src
            got = poisoned(rows, width_out, dtype=dtype, pad=3)
            want = got.clone()
            before = got.clone()
            simt.gather_mla(view, table_, cu_, starts_, slots_, kv, got, scale)
            if slots_ is None:
                kvc.ops.gather_mla(view, table_, cu_, kv, seq_starts=starts_, out=want,
                                   validate=False, scale=scale)
                # Rows past cu_seq_lens[-1] are the caller's: untouched on both paths.
                assert torch.equal(got[int(cu[-1]):].view(torch.uint8),
                                   before[int(cu[-1]):].view(torch.uint8))
            else:
                kvc.ops.gather_mla_slots(view, slots_, kv, out=want, validate=False, scale=scale)
                if dtype == torch.float32:  # slot 0 (row 9) holds the NaNs
                    nan_bits = got[9].contiguous().view(torch.int32)[got[9].isnan()]
                    assert nan_bits.numel() >= 3 and bool((nan_bits == 0x7FC00000).all())
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (name, kv, dtype, src[3] is None)
    for placement, layer in (("split", 1), ("row", 0)):
        view = gc.view("indexer", layer)
        for table_, cu_, starts_, slots_, rows in ((table, cu, starts, None, total),
                                                   (None, None, None, slots, slots.numel())):
            got = (poisoned(rows, 128, dtype=torch.uint8, pad=5), torch.full((rows,), -7.0))
            want = (got[0].clone(), got[1].clone())
            if slots_ is None:  # rows past the last request keep their poison
                kept = (got[0][int(cu[-1]):].clone(), got[1][int(cu[-1]):].clone())
            simt.gather_indexer(view, table_, cu_, starts_, slots_, placement, *got)
            if slots_ is None:
                kvc.ops.gather_indexer(view, table_, cu_, placement, seq_starts=starts_, out=want,
                                       validate=False)
            else:
                kvc.ops.gather_indexer_slots(view, slots_, placement, out=want, validate=False)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.int32),
                                                                want[1].view(torch.int32))
            assert (got[0] != 0).any()  # real rows were read, not only zero rows
            if slots_ is None:
                assert torch.equal(got[0][int(cu[-1]):], kept[0])
                assert bool((got[1][int(cu[-1]):] == -7.0).all())


@pytest.mark.parametrize("chunk", [48, 4096])
def test_span_copy_kernel_gives_the_cpu_bytes(simt, chunk):
    """copy_spans' one-launch kernel: spans of every alignment, cut into chunks (a small chunk
    size here, so spans span several thread blocks), against the CPU op."""
    g = torch.Generator().manual_seed(11)
    src = torch.randint(0, 256, (1 << 14,), dtype=torch.uint8, generator=g)
    spans = torch.tensor([[0, 0, 4096], [4096 + 3, 5000, 700], [8192, 9000, 132], [12288, 12288, 16],
                          [16000, 15000, 1], [10000, 7000, 0], [13000, 13333, 999]])
    got = torch.randint(0, 256, (1 << 14,), dtype=torch.uint8, generator=g)
    want = got.clone()
    simt.copy_spans(src, got, spans, chunk)
    torch.ops.kvcache_ext.copy_spans(src, want, spans)
    assert torch.equal(got, want)
    assert torch.equal(got[5000:5700], src[4099:4799])
    with pytest.raises(ValueError, match="write overlapping"):
        simt.copy_spans(src, got, torch.tensor([[0, 0, 8], [8, 4, 8]]), chunk)


def test_nan_code_fix_touches_only_0xff_bytes(simt):
    """The paired hardware e4m3 conversion's NaN bytes (0xFF or 0x7F) become 0x7F, word-wide;
    every other byte value, in every position, is kept."""
    g = torch.Generator().manual_seed(12)
    words = torch.randint(0, 256, (4, 256, 4), generator=g, dtype=torch.int64)
    for pos in range(4):
        words[pos, :, pos] = torch.arange(256)
    packed = (words[..., 0] | (words[..., 1] << 8) | (words[..., 2] << 16) | (words[..., 3] << 24))
    got = simt.canonical_nan_codes(packed.to(torch.uint32).view(torch.int32)).view(torch.uint32)
    got = got.to(torch.int64)
    want = torch.where(words == 0xFF, 0x7F, words)
    for b in range(4):
        assert torch.equal((got >> (8 * b)) & 0xFF, want[..., b])


def test_exact_reciprocal_only_for_powers_of_two(simt):
    """x * exact_recip(s) == x / s whenever exact_recip(s) != 0, and it is 0 otherwise."""
    pow2 = torch.tensor([2.0 ** e for e in range(-125, 126)])
    others = torch.tensor([0.3, 1.5, 3.0, 2.0 ** -126, 2.0 ** 127, float("inf"), 1e-45, 0.75])
    r = simt.exact_recip(torch.cat([pow2, others]))
    assert bool((r[: len(pow2)] != 0).all()) and bool((r[len(pow2):] == 0).all())
    x = torch.randn(10000, generator=torch.Generator().manual_seed(3)) * 1e3
    x = torch.cat([x, torch.tensor([1e-40, 3e38, -0.0, float("inf"), float("nan")])])
    for s, rs in zip(pow2[::7], r[: len(pow2)][::7]):
        assert torch.equal((x * rs).view(torch.int32)[~x.isnan()], (x / s).view(torch.int32)[~x.isnan()])


def v4_inputs(t: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(t, 530, generator=g) * torch.logspace(-2, 2, t).unsqueeze(1)).to(dtype)
    x[1, 3], x[2, 70], x[3, 130] = float("nan"), float("inf"), float("-inf")
    x[4, :64] = 0
    return x


@pytest.mark.parametrize("layout", ["BLHNC", "BLNHC"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_v4_writes_give_the_cpu_bytes(simt, layout, dtype):
    """DeepSeek-V4's 584-B and MXFP4 rows in the packed V4-Pro slab; the MXFP4 input starts 7
    elements into each row (no 16-B aligned loads)."""
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=3, layout=layout)
    rows = plan.num_blocks * plan.rows_per_block("c4_kv")
    t = 37
    g = torch.Generator().manual_seed(22)
    slots = torch.randperm(rows, generator=g)[:t].to(torch.int64)
    slots[::7] = -1
    slots[3], slots[5] = rows, BAD
    oracle = torch.where(slots >= rows, -1, slots)
    x = v4_inputs(t, dtype)
    cuda_gc, cpu_gc = guarded(plan, seed=23), guarded(plan, seed=23)
    for gc, s, ops in ((cuda_gc, slots, simt), (cpu_gc, oracle, torch.ops.kvcache_ext)):
        ops.v4_mla_quant_and_cache(x[:, :512], gc.view("c4_kv", 1), s, "amax")
        ops.v4_mla_quant_and_cache(x[:, 9:521], gc.view("swa0_kv", 2), s.flip(0), "scale")
        ops.mxfp4_quant_and_cache(x[:, 7:135], gc.view("c4_indexer", 0), s)
        ops.v4_dsa_write(x[:, 1:513], gc.view("c4_kv", 3), x[:, 400:528], gc.view("c4_indexer", 1),
                         s, "amax")
    assert (cpu_gc.whole != guarded(plan, seed=23).whole).sum() > t * 584
    if not torch.equal(cuda_gc.whole, cpu_gc.whole):
        diff = torch.nonzero(cuda_gc.whole != cpu_gc.whole).squeeze(1)
        raise AssertionError(f"{diff.numel()} bytes differ, first at {diff[:8].tolist()}")
    # a buffer 3 bytes off any alignment: every store takes the byte-wise fallback
    bufs = [torch.randint(0, 256, (plan.total_bytes + 8,), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(26)) for _ in range(2)]
    for buf, s, ops in ((bufs[0], slots, simt), (bufs[1], oracle, torch.ops.kvcache_ext)):
        cache = kvc.KVCache(plan, buf[3:3 + plan.total_bytes])
        ops.v4_mla_quant_and_cache(x[:, :512], cache.view("c4_kv", 1), s, "amax")
        ops.v4_dsa_write(x[:, 1:513], cache.view("c4_kv", 3), x[:, 400:528], cache.view("c4_indexer", 1),
                         s, "amax")
    assert torch.equal(bufs[0], bufs[1])


@pytest.mark.parametrize("layout", ["BLHNC", "BHLNC"])
def test_v4_pair_with_fp8_indexer_gives_the_cpu_bytes(simt, layout):
    """v4_dsa_write(indexer="fp8"): the V4 main row and V3.2's 132-B split indexer row (bf16
    k, ue8m0) by the two kernels the CUDA branch launches."""
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", indexer="fp8"), num_blocks=3,
                          layout=layout)
    rows = plan.num_blocks * plan.rows_per_block("c4_kv")
    g = torch.Generator().manual_seed(27)
    slots = torch.randperm(rows, generator=g)[:41].to(torch.int64)
    slots[::6] = -1
    slots[2] = rows
    oracle = torch.where(slots >= rows, -1, slots)
    x = v4_inputs(41, torch.bfloat16)
    cuda_gc, cpu_gc = guarded(plan, seed=28), guarded(plan, seed=28)
    for gc, s, ops in ((cuda_gc, slots, simt), (cpu_gc, oracle, torch.ops.kvcache_ext)):
        ops.v4_dsa_write(x[:, 1:513], gc.view("c4_kv", 2), x[:, 400:528], gc.view("c4_indexer", 1),
                         s, "amax", "fp8")
    assert (cpu_gc.whole != guarded(plan, seed=28).whole).sum() > 30 * (584 + 132)
    assert torch.equal(cuda_gc.whole, cpu_gc.whole)


def test_v4_gathers_give_the_cpu_bytes(simt):
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=4, layout="BLHNC")
    gc = guarded(plan, seed=24)
    rows = plan.num_blocks * 64
    x = v4_inputs(rows, torch.bfloat16)
    every = torch.arange(rows)
    for name in ("c4_kv", "swa0_kv"):
        kvc.ops_v4.v4_mla_quant_and_cache(x[:, :512], gc.view(name, 0), every)
    kvc.ops_v4.mxfp4_quant_and_cache(x[:, :128], gc.view("c4_indexer", 0), every)
    gc.view("c4_kv", 0)[0, 0, 0, :3] = 0x7F                       # NaN codes
    g = torch.Generator().manual_seed(25)
    table = torch.randint(-2, 6, (2, 5), generator=g, dtype=torch.int32)  # entries outside the view
    cu = torch.tensor([0, 70, 110], dtype=torch.int32)
    starts = torch.tensor([3, 60], dtype=torch.int32)
    slots = torch.randint(-1, rows + 3, (30,), generator=g)
    slots[4], slots[6] = BAD, 0
    for name, fmt, width in (("c4_kv", "fp8_ds_mla_v4", 512), ("c4_indexer", "mxfp4", 128)):
        view = gc.view(name, 0)
        for dtype, cols in ((torch.bfloat16, width), (torch.float32, width),
                            (torch.uint8, kvc.ops_v4.V4_ROW_BYTES[fmt])):
            for by_table in (True, False):
                n = int(cu[-1]) + 3 if by_table else slots.numel()
                got = poisoned(n, cols, dtype=dtype, pad=3)
                want = got.clone()
                if by_table:
                    simt.gather_v4(view, table, cu, starts, None, fmt, got)
                    torch.ops.kvcache_ext.gather_v4(view, table, cu, starts, fmt, want, False)
                else:
                    simt.gather_v4(view, None, None, None, slots, fmt, got)
                    torch.ops.kvcache_ext.gather_v4_slots(view, slots, fmt, want, False)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (fmt, dtype, by_table)
                assert got.view(torch.uint8).any()
    lens = torch.tensor([150, 3, 0, 70], dtype=torch.int32)
    c_bt = torch.tensor([[0], [1], [-1], [9]], dtype=torch.int32)
    s_bt = torch.tensor([[0, 1, 2], [3, -1, -1], [-1, -1, -1], [2, 1, -1]], dtype=torch.int32)
    cu_out = kvc.ops_v4.window_rows(lens, 4)
    for dtype, cols in ((torch.bfloat16, 512), (torch.float32, 512), (torch.uint8, 584)):
        got = poisoned(int(cu_out[-1]) + 2, cols, dtype=dtype, pad=1)
        want = got.clone()
        simt.gather_v4_window(gc.view("c4_kv", 0), c_bt, gc.view("swa0_kv", 0), s_bt, lens, cu_out,
                              4, 128, got)
        torch.ops.kvcache_ext.gather_v4_window(gc.view("c4_kv", 0), c_bt, gc.view("swa0_kv", 0),
                                               s_bt, lens, cu_out, 4, 128, want, False)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), dtype


@pytest.mark.parametrize("chunk", [40, 4096])
def test_run_copy_kernel_gives_the_cpu_bytes(simt, chunk):
    """copy_runs' one-launch kernel (the regroup): runs of every alignment and width class
    (16-, 8-, 4- and 1-byte words), short pieces stepping apart, a piece longer than an item,
    interleaved runs of one stride, against the CPU op; unwritten bytes keep their poison."""
    g = torch.Generator().manual_seed(13)
    src = torch.randint(0, 256, (1 << 15,), dtype=torch.uint8, generator=g)
    runs = torch.tensor([[0, 0, 128, 128, 256, 16],        # channel-major: 32 -> 64 tokens
                         [2048, 128, 128, 128, 256, 16],   # the other half, interleaved
                         [4096, 8192, 24, 40, 56, 9],      # 8-byte words
                         [6000, 9000, 12, 20, 12, 7],      # 4-byte words, adjacent pieces
                         [7001, 10001, 5, 9, 7, 11],       # bytes
                         [8000, 12000, 5000, 0, 5000, 1],  # one long piece
                         [20000, 20000, 0, 0, 0, 3]])      # empty
    got = torch.full((1 << 15,), 0xA5, dtype=torch.uint8)
    want = got.clone()
    simt.copy_runs(src, got, runs, chunk)
    torch.ops.kvcache_ext.copy_runs(src, want, runs)
    assert torch.equal(got, want)
    spans = kvc.spans_of_runs(runs)
    by_spans = torch.full((1 << 15,), 0xA5, dtype=torch.uint8)
    torch.ops.kvcache_ext.copy_spans(src, by_spans, spans)
    assert torch.equal(got, by_spans)
    assert torch.equal(got[256:384], src[128:256]) and int((got == 0xA5).sum()) > 1000
    with pytest.raises(ValueError, match="write overlapping"):
        simt.copy_runs(src, got, torch.tensor([[0, 0, 8, 8, 16, 4], [64, 36, 8, 8, 16, 2]]), chunk)
