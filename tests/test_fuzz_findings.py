"""What differential fuzzing of the V4 and K/V ops found (issue: contract, round three), each
reproduced by hand: an input inside the view it writes that a conversion hid from the overlap
check, messages naming the op's internal arguments instead of the caller's, two outputs of one
call sharing bytes. Every call here is refused before anything is written."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4

from conftest import guarded
from test_aliasing import MATCH, carve

T = 4
SLOTS = torch.tensor([3, 17, 40, 63])


def v4_fp8_cache():
    plan = kvc.plan_cache([kvc.CacheSpec("v4", 584, 1, split=(576, 8)),
                           kvc.CacheSpec("idx", 132, 1, split=(128, 4)),
                           kvc.CacheSpec("st", 2048, 1)], num_blocks=4, block_size=16)
    return guarded(plan)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_v4_fp8_indexer_input_inside_its_view_is_refused_before_the_bf16_copy(dtype):
    """The op rounded k to bf16 before the overlap check, which then saw the copy, and the write
    overwrote the caller's k: the check now runs on the caller's tensor."""
    gc = v4_fp8_cache()
    view = gc.view("idx", 0)
    k = carve(view, dtype, T, 128)
    with pytest.raises(ValueError, match=MATCH.format(w="view", o="k")):
        o4.v4_indexer_quant_and_cache(k, view, SLOTS)
    gc.assert_unchanged()
    kv = torch.randn(T, 512).to(torch.bfloat16)
    k_idx = carve(gc.view("v4", 0), dtype, T, 128, skip=4096)
    with pytest.raises(ValueError, match=MATCH.format(w="mla_view", o="k_idx")):
        o4.v4_dsa_write(kv, gc.view("v4", 0), k_idx, gc.view("idx", 0), SLOTS, indexer="fp8")
    gc.assert_unchanged()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_v4_fp8_indexer_op_rounds_other_floats_to_bf16_itself(dtype):
    gc, ref = v4_fp8_cache(), v4_fp8_cache()
    k = torch.randn(T, 128).to(dtype) * 3
    o4.v4_indexer_quant_and_cache(k, gc.view("idx", 0), SLOTS)
    o4.v4_indexer_quant_and_cache(k.to(torch.bfloat16), ref.view("idx", 0), SLOTS)
    assert torch.equal(gc.whole, ref.whole) and not torch.equal(gc.whole, v4_fp8_cache().whole)


def test_state_write_names_the_callers_arguments():
    gc = v4_fp8_cache()
    view = gc.view("st", 0)
    kv, score = torch.randn(T, 256), torch.randn(T, 512)[:, ::2]  # a strided score
    with pytest.raises(ValueError, match=r"score must be contiguous in its last dimension"):
        o4.state_write(kv, score, view, SLOTS)
    with pytest.raises(ValueError, match=MATCH.format(w="view", o="kv")):
        o4.state_write(carve(view, torch.float32, T, 256), torch.randn(T, 256), view, SLOTS)
    gc.assert_unchanged()


@pytest.mark.parametrize("op,view,arg", [("v4_mla_quant_and_cache", "v4", "kv"),
                                         ("mxfp4_quant_and_cache", "mx", "k")])
def test_v4_writes_name_their_input_as_the_caller_does(op, view, arg):
    plan = kvc.plan_cache([kvc.CacheSpec("v4", 584, 1, split=(576, 8)),
                           kvc.CacheSpec("mx", 68, 1, split=(64, 4))], num_blocks=4, block_size=16)
    gc = guarded(plan)
    v = gc.view(view, 0)
    width = 512 if view == "v4" else 128
    with pytest.raises(ValueError, match=MATCH.format(w="view", o=arg)):
        getattr(o4, op)(carve(v, torch.bfloat16, T, width), v, SLOTS)
    with pytest.raises(ValueError, match=rf"{op}: {arg} must be on the device of view \(cpu\), got meta"):
        getattr(torch.ops.kvcache_ext, op)(torch.empty(T, width, device="meta"), v, SLOTS)
    gc.assert_unchanged()


@pytest.mark.parametrize("shift", [0, 1, 16])
def test_k_and_v_views_that_share_bytes_are_refused(shift):
    """Before, V silently won where the views overlapped. The views: the same layer's view, and
    it moved by `shift` rows (sharing all but the moved rows)."""
    plan = kvc.plan_cache([kvc.CacheSpec("k", 128, 2, 2)], num_blocks=4, block_size=16,
                          layout="BLHNC")
    gc = guarded(plan)
    k_view = gc.view("k", 0)
    v_view = torch.as_strided(k_view, k_view.shape, k_view.stride(),
                              k_view.storage_offset() + shift * k_view.stride(2))
    key = torch.randn(T, 2, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"k_view and v_view \(both written by this op\) must not "
                                         r"share memory"):
        kvc.ops.reshape_and_cache_kv(key, key, k_view, v_view, SLOTS)
    gc.assert_unchanged()


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_views_of_two_specs_or_layers_are_apart_in_every_layout(layout):
    """The exact comparison of outputs must not refuse real K and V views, nor a DSA pair, which
    interleave in block-outer layouts (their spans overlap, their bytes do not)."""
    plan = kvc.plan_cache([kvc.CacheSpec("k", 128, 2, 2), kvc.CacheSpec("v", 128, 2, 2),
                           kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)],
                          num_blocks=4, block_size=16, layout=layout)
    cache = kvc.allocate(plan, fill=0)
    key = torch.randn(T, 2, 64).to(torch.bfloat16)
    for kv in (("k", 0, "v", 0), ("k", 0, "k", 1), ("v", 1, "k", 0)):
        kvc.ops.reshape_and_cache_kv(key, key, cache.view(kv[0], kv[1]), cache.view(kv[2], kv[3]),
                                     SLOTS)
    x = torch.randn(T, 576).to(torch.bfloat16)
    kvc.ops.dsa_write(x[:, :512], x[:, 512:], cache.view("mla", 1), x[:, :128],
                      cache.view("indexer", 0), SLOTS)
