"""Arguments sharing memory with what an op writes are refused before anything is written.

A gather whose out lies in the cache it reads would overwrite rows; a write whose inputs or
slot_mapping lie in the cache it writes would read bytes it is changing. Every op compares each
tensor it writes with every other argument (torch's rule for out= arguments) and names both.
"""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4

from conftest import guarded

T = 4
MATCH = r"{w} \(written by this op\) must not share memory with {o}: their bytes overlap"


def carve(view: torch.Tensor, dtype: torch.dtype, *shape: int, skip: int = 0) -> torch.Tensor:
    """A tensor over the view's own bytes, from its first byte + skip."""
    n = torch.Size(shape).numel() * dtype.itemsize
    raw = torch.as_strided(view, (n,), (1,), view.storage_offset() + skip)
    return raw.view(dtype).view(*shape)


def dsa_cache(device: str):
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 1), kvc.CacheSpec("indexer", 132, 1),
                           kvc.CacheSpec("kv", 256, 2, 2)], num_blocks=4, block_size=16)
    return guarded(plan, device)


def v4_cache(device: str):
    plan = kvc.plan_cache([kvc.CacheSpec("v4", 584, 1, split=(576, 8)),
                           kvc.CacheSpec("mx", 68, 1, split=(64, 4))], num_blocks=4, block_size=16)
    return guarded(plan, device)


def inputs(device: str):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, 576, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(T, 128, generator=g).to(torch.bfloat16).to(device)
    slots = torch.tensor([3, 17, 40, 63], device=device)
    return x, k, slots


WRITES = ["reshape_and_cache", "reshape_and_cache_kv", "concat_and_cache_mla", "indexer",
          "dsa_write", "slot_mapping", "v4_quant_and_cache", "v4_dsa_write"]


@pytest.mark.parametrize("op", WRITES)
def test_write_inputs_inside_the_cache_are_refused(device, op):
    x, k, slots = inputs(device)
    gc = v4_cache(device) if op.startswith("v4") else dsa_cache(device)
    if op == "reshape_and_cache":
        view = gc.view("kv", 0)
        call = lambda: kvc.ops.reshape_and_cache(carve(view, torch.bfloat16, T, 2, 128), view, slots)  # noqa: E731
        w, o = "view", "key"
    elif op == "reshape_and_cache_kv":  # value inside k_view, which the same call writes
        k_view, v_view = gc.view("kv", 0), gc.view("kv", 1)
        call = lambda: kvc.ops.reshape_and_cache_kv(  # noqa: E731
            x[:, :256].reshape(T, 2, 128), carve(k_view, torch.bfloat16, T, 2, 128), k_view, v_view, slots)
        w, o = "k_view", "value"
    elif op == "concat_and_cache_mla":
        view = gc.view("mla", 0)
        call = lambda: kvc.ops.concat_and_cache_mla(carve(view, torch.bfloat16, T, 512, skip=1024),  # noqa: E731
                                                    x[:, 512:], view, slots)
        w, o = "view", "kv_c"
    elif op == "indexer":
        view = gc.view("indexer", 0)
        call = lambda: kvc.ops.indexer_k_quant_and_cache(carve(view, torch.bfloat16, T, 128), view, slots)  # noqa: E731
        w, o = "view", "k"
    elif op == "dsa_write":  # k_idx inside the MLA view, which the same call writes
        call = lambda: kvc.ops.dsa_write(x[:, :512], x[:, 512:], gc.view("mla", 0),  # noqa: E731
                                         carve(gc.view("mla", 0), torch.bfloat16, T, 128),
                                         gc.view("indexer", 0), slots)
        w, o = "mla_view", "k_idx"
    elif op == "slot_mapping":
        view = gc.view("mla", 0)
        bad = carve(view, torch.int64, T, skip=8 * 656)
        bad.copy_(slots)  # valid slots, so only the overlap is wrong
        gc.whole_expected.copy_(gc.whole.cpu())
        call = lambda: kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], view, bad)  # noqa: E731
        w, o = "view", "slot_mapping"
    elif op == "v4_quant_and_cache":
        view = gc.view("v4", 0)
        call = lambda: o4.v4_mla_quant_and_cache(carve(view, torch.bfloat16, T, 512), view, slots)  # noqa: E731
        w, o = "view", "kv"  # the caller's name (the generic op of old said "x")
    else:  # the MLA input inside the indexer view of the same call
        call = lambda: o4.v4_dsa_write(carve(gc.view("mx", 0), torch.bfloat16, T, 512), gc.view("v4", 0),  # noqa: E731
                                       k, gc.view("mx", 0), slots)
        w, o = "indexer_view", "kv"
    with pytest.raises(ValueError, match=MATCH.format(w=w, o=o)):
        call()
    gc.assert_unchanged()


GATHERS = ["gather_mla", "gather_mla_slots", "gather_kv", "gather_kv_slots", "gather_indexer",
           "gather_indexer_slots", "codes_over_scales", "gather_v4", "gather_v4_slots",
           "gather_v4_window"]


@pytest.mark.parametrize("op", GATHERS)
def test_gather_outputs_inside_what_they_read_are_refused(device, op):
    x, k, slots = inputs(device)
    table = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    gc = v4_cache(device) if "v4" in op else dsa_cache(device)
    w, o = "out", "view"
    if op == "gather_mla":
        view = gc.view("mla", 0)
        call = lambda: kvc.ops.gather_mla(view, table, cu, out=carve(view, torch.bfloat16, T, 576))  # noqa: E731
    elif op == "gather_mla_slots":
        view = gc.view("mla", 0)
        call = lambda: kvc.ops.gather_mla_slots(view, slots, out=carve(view, torch.float32, T, 576, skip=656 * 20))  # noqa: E731
    elif op == "gather_kv":
        view = gc.view("kv", 0)
        call = lambda: kvc.ops.gather_kv(view, table, cu, out=carve(view, torch.bfloat16, T, 2, 128))  # noqa: E731
    elif op == "gather_kv_slots":  # the slots tensor is what out overlaps
        view = gc.view("kv", 0)
        buf = torch.zeros(T * 2 * 128, dtype=torch.bfloat16, device=device)
        over = buf.view(torch.int64)[:T]
        over.copy_(slots)
        call = lambda: kvc.ops.gather_kv_slots(view, over, out=buf.view(T, 2, 128))  # noqa: E731
        o = "slots"
    elif op == "gather_indexer":
        view = gc.view("indexer", 0)
        call = lambda: kvc.ops.gather_indexer(  # noqa: E731
            view, table, cu, out=(carve(view, torch.uint8, T, 128), torch.empty(T, device=device)))
        w = "codes"
    elif op == "gather_indexer_slots":
        view = gc.view("indexer", 0)
        call = lambda: kvc.ops.gather_indexer_slots(  # noqa: E731
            view, slots, out=(torch.empty(T, 128, dtype=torch.uint8, device=device),
                              carve(view, torch.float32, T, skip=132 * 5)))
        w = "scales"
    elif op == "codes_over_scales":
        view = gc.view("indexer", 0)
        both = torch.empty(T * 128, dtype=torch.uint8, device=device)
        call = lambda: kvc.ops.gather_indexer_slots(  # noqa: E731
            view, slots, out=(both.view(T, 128), both[64:64 + 4 * T].view(torch.float32)))
        w, o = "codes", "scales"
    elif op == "gather_v4":
        view = gc.view("v4", 0)
        call = lambda: o4.gather_v4(view, table, cu, out=carve(view, torch.bfloat16, T, 512))  # noqa: E731
    elif op == "gather_v4_slots":
        view = gc.view("mx", 0)
        call = lambda: o4.gather_v4_slots(view, slots, "mxfp4", out=carve(view, torch.float32, T, 128))  # noqa: E731
    else:
        lens = torch.tensor([8], dtype=torch.int32, device=device)
        call = lambda: o4.gather_compressed_and_swa(  # noqa: E731
            gc.view("v4", 0), table, 4, gc.view("v4", 0), table, lens,
            out=carve(gc.view("v4", 0), torch.bfloat16, 10, 512, skip=584 * 30))
        o = "c_view"
    match = (r"codes and scales \(both written by this op\) must not share memory"
             if op == "codes_over_scales" else MATCH.format(w=w, o=o))
    with pytest.raises(ValueError, match=match):
        call()
    gc.assert_unchanged()


def test_separate_tensors_next_to_the_view_are_accepted(device):
    """The check is of overlap, not of neighbourhood: an out right after the view's last byte,
    in the same allocation, is written and the cache is not."""
    x, k, slots = inputs(device)
    gc = dsa_cache(device)
    view = gc.view("indexer", 0)
    kvc.ops.indexer_k_quant_and_cache(k, view, slots)
    gc.whole_expected.copy_(gc.whole.cpu())
    end = view.storage_offset() + (view.shape[0] - 1) * view.stride(0) + (view.shape[2] - 1) * view.stride(2) + 132
    after = torch.as_strided(gc.whole, (T * 128,), (1,), end)
    codes, scales = kvc.ops.gather_indexer_slots(view, slots, out=(after.view(T, 128), torch.empty(T, device=device)))
    want_codes, _ = kvc.ops.gather_indexer_slots(view, slots)
    assert torch.equal(codes.cpu(), want_codes.cpu())
    gc.whole_expected[end:end + T * 128] = want_codes.cpu().flatten()
    gc.assert_matches()


def test_a_view_whose_rows_overlap_is_refused(device):
    """A hand-made view whose token stride is shorter than a row (or whose blocks repeat, as
    expand() gives) would let one row's write change another's."""
    x, k, slots = inputs(device)
    gc = dsa_cache(device)
    view = gc.view("indexer", 0)
    short = torch.as_strided(view, view.shape, (view.stride(0), view.stride(1), 100, 1), view.storage_offset())
    with pytest.raises(ValueError, match=r"view rows must not overlap one another: strides \[2112, 132, 100, 1\] "
                                         r"step over less than the dimensions inside them cover"):
        kvc.ops.indexer_k_quant_and_cache(k, short, slots)
    repeated = view[:1].expand(4, -1, -1, -1)
    with pytest.raises(ValueError, match="view rows must not overlap one another"):
        kvc.ops.indexer_k_quant_and_cache(k, repeated, slots)
    with pytest.raises(ValueError, match="view rows must not overlap one another"):
        kvc.ops.gather_indexer_slots(repeated, slots)
    gc.assert_unchanged()


def test_an_out_whose_rows_share_memory_is_refused(device):
    x, k, slots = inputs(device)
    gc = dsa_cache(device)
    repeated = torch.empty(1, 576, dtype=torch.bfloat16, device=device).expand(T, 576)
    buf = torch.empty(T * 576, dtype=torch.bfloat16, device=device)
    shingled = torch.as_strided(buf, (T, 576), (300, 1))  # row t + 1 starts inside row t
    for out in (repeated, shingled):
        with pytest.raises(ValueError, match=r"out \(written by this op\) must not have elements sharing memory"):
            kvc.ops.gather_mla_slots(gc.view("mla", 0), slots, out=out)
