"""DeepSeek-V4 row ops refuse bad input with errors naming the argument and what was expected,
before anything is written (the guarded cache's every byte is compared afterwards)."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4

from conftest import guarded


def pro_plan(num_blocks: int) -> kvc.GroupPlan:
    return kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=num_blocks,
                          layout="BLHNC")


def test_bad_input_is_refused_before_writing():
    plan = pro_plan(num_blocks=3)
    gc = guarded(plan, seed=14)
    c4, mx = gc.view("c4_kv", 0), gc.view("c4_indexer", 0)
    kv = torch.randn(4, 512, dtype=torch.bfloat16)
    ok = torch.tensor([0, 1, 2, 3])
    cases = [
        (ValueError, r"rows must be 584 bytes", lambda: o4.v4_mla_quant_and_cache(kv, mx, ok)),
        (ValueError, r"contiguous pages \(token stride 584 bytes\).*got token stride 1168",
         lambda: o4.v4_mla_quant_and_cache(kv, c4[:, :, ::2], ok)),
        (ValueError, r"kv\.size\(1\) must be 512", lambda: o4.v4_mla_quant_and_cache(
            torch.zeros(4, 576, dtype=torch.bfloat16), c4, ok)),
        (TypeError, r"kv must be bfloat16 or float16 or float32", lambda: o4.v4_mla_quant_and_cache(
            kv.to(torch.int32), c4, ok)),
        (ValueError, r'scale_floor must be "amax" or "scale"', lambda: o4.v4_mla_quant_and_cache(
            kv, c4, ok, "none")),
        (ValueError, r'format must be "fp8_ds_mla_v4", "v41_mxfp8" or "mxfp4"', lambda: torch.ops.kvcache_ext.
         gather_v4_slots(c4, ok, "fp4", torch.empty(4, 512, dtype=torch.bfloat16), True)),
        (IndexError, r"slot_mapping\[2\] = 256 is outside", lambda: o4.mxfp4_quant_and_cache(
            kv[:, :128], mx, torch.tensor([0, 1, 256, 3]))),
        (ValueError, r"both slot 1", lambda: o4.v4_mla_quant_and_cache(kv, c4, torch.tensor([1, 0, 1, 2]))),
        (ValueError, r"must hold at least slot_mapping.numel\(\) = 4", lambda: o4.v4_mla_quant_and_cache(
            kv[:3], c4, ok)),
        (ValueError, r"1 head", lambda: o4.v4_mla_quant_and_cache(kv, torch.as_strided(  # a block as 2 x 32 rows
            c4, (3, 2, 32, 584), (c4.stride(0), 32 * 584, 584, 1), c4.storage_offset()), ok)),
        (ValueError, r"rows must not overlap", lambda: o4.v4_mla_quant_and_cache(kv, c4.expand(3, 2, 64, 584), ok)),
    ]
    for exc, msg, call in cases:
        with pytest.raises(exc, match=msg):
            call()
    gc.assert_unchanged()


def test_bad_read_arguments_name_what_was_expected():
    plan = pro_plan(num_blocks=3)
    buf = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    c4, swa = plan.view(buf, "c4_kv", 0), plan.view(buf, "swa0_kv", 0)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"out must be \[T, 512\] for fp8_ds_mla_v4 values"):
        o4.gather_v4_slots(c4, slots, out=torch.empty(2, 576, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out must be \[T, 68\] for mxfp4 raw rows"):
        o4.gather_v4_slots(plan.view(buf, "c4_indexer", 0), slots, "mxfp4",
                           out=torch.empty(2, 72, dtype=torch.uint8))
    with pytest.raises(TypeError, match="out must be bfloat16, float32 or uint8"):
        o4.gather_v4_slots(c4, slots, out=torch.empty(2, 512, dtype=torch.float16))
    with pytest.raises(IndexError, match=r"slots\[1\] = 256 is outside"):
        o4.gather_v4_slots(c4, torch.tensor([0, 256]))
    lens = torch.tensor([10], dtype=torch.int32)
    bt = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_out\[1\] - cu_out\[0\] must be seq_lens\[0\] // ratio"):
        o4.gather_compressed_and_swa(c4, bt, 4, swa, bt, lens,
                                     cu_out=torch.tensor([0, 11], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"out must have at least cu_out\[-1\] = 12 rows"):
        o4.gather_compressed_and_swa(c4, bt, 4, swa, bt, lens, out=torch.empty(11, 512))
    with pytest.raises(ValueError, match="ratio must be an int >= 1"):  # the wrapper's check
        o4.gather_compressed_and_swa(c4, bt, 0, swa, bt, lens, cu_out=o4.window_rows(lens, 1))
    with pytest.raises(ValueError, match="ratio must be >= 1"):  # and the op's own
        torch.ops.kvcache_ext.gather_v4_window(c4, bt, swa, bt, lens, o4.window_rows(lens, 1), 0, 128,
                                               torch.empty(20, 512), True)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] must be >= 0"):
        o4.gather_compressed_and_swa(c4, bt, 4, swa, bt, -lens, cu_out=torch.tensor([0, 0], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"swa_block_table: request 0 reads rows \[0, 70\)"):
        o4.gather_compressed_and_swa(c4, bt, 4, swa, bt, lens * 7)


def test_v4_dsa_write_refuses_mismatched_pairs():
    plan = pro_plan(num_blocks=3)
    gc = guarded(plan, seed=17)
    kv, k = torch.randn(2, 512, dtype=torch.bfloat16), torch.randn(2, 128, dtype=torch.bfloat16)
    slots = torch.tensor([0, 1])
    with pytest.raises(TypeError, match="k_idx must have the dtype of kv"):
        o4.v4_dsa_write(kv, gc.view("c4_kv", 0), k.float(), gc.view("c4_indexer", 0), slots)
    with pytest.raises(ValueError, match="must share one block table"):
        o4.v4_dsa_write(kv, gc.view("c4_kv", 0), k, gc.view("c4_indexer", 0)[:2], slots)
    with pytest.raises(ValueError, match=r"indexer_view rows must be 68 bytes"):
        o4.v4_dsa_write(kv, gc.view("c4_kv", 0), k, gc.view("c128_kv", 0), slots)
    with pytest.raises(ValueError, match='indexer must be "mxfp4" or "fp8"'):
        o4.v4_dsa_write(kv, gc.view("c4_kv", 0), k, gc.view("c4_indexer", 0), slots, indexer="fp4")
    gc.assert_unchanged()


def test_v4_dsa_write_with_fp8_indexer_checks_both_rows_before_writing():
    """indexer="fp8" runs two kernels (V4 main row, V3.2's 132-B row): a bad indexer argument
    is refused before the main rows are written, naming k_idx / indexer_view."""
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", indexer="fp8"), num_blocks=3,
                          layout="BLHNC")
    gc = guarded(plan, seed=18)
    c4, idx = gc.view("c4_kv", 0), gc.view("c4_indexer", 0)
    kv, k = torch.randn(3, 512, dtype=torch.bfloat16), torch.randn(3, 128, dtype=torch.bfloat16)
    slots = torch.tensor([0, 5, 9])
    cases = [
        (ValueError, r"k_idx\.size\(1\) must be 128", lambda: o4.v4_dsa_write(
            kv, c4, k[:, :64], idx, slots, indexer="fp8")),
        (ValueError, r"k_idx must hold at least slot_mapping\.numel\(\) = 3 rows", lambda: o4.v4_dsa_write(
            kv, c4, k[:2], idx, slots, indexer="fp8")),
        (TypeError, r"k_idx must be bfloat16, float16 or float32, got torch\.int64", lambda: o4.v4_dsa_write(
            kv, c4, k.to(torch.int64), idx, slots, indexer="fp8")),
        (ValueError, r"indexer_view rows must be 132 bytes", lambda: o4.v4_dsa_write(
            kv, c4, k, gc.view("c128_kv", 0), slots, indexer="fp8")),
        (ValueError, r"must share one block table", lambda: o4.v4_dsa_write(
            kv, c4, k, idx[:2], slots, indexer="fp8")),
        (ValueError, r'indexer must be "mxfp4" or "fp8"', lambda: torch.ops.kvcache_ext.
         v4_dsa_write(kv, c4, k, idx, slots, "amax", "fp4")),
    ]
    for exc, msg, call in cases:
        with pytest.raises(exc, match=msg):
            call()
        gc.assert_unchanged()
    o4.v4_dsa_write(kv, c4, k, idx, slots, indexer="fp8")  # the same arguments, made right, write
    with pytest.raises(AssertionError):
        gc.assert_unchanged()
