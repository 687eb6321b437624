"""Whole-block copies: identical results in every layout, coalesced spans, bounds."""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc

from conftest import GUARD, guarded

SPECS = [kvc.CacheSpec("mla", 656, 3), kvc.CacheSpec("indexer", 132, 3), kvc.CacheSpec("kv", 16, 2, 4)]


def guarded_for(plan: kvc.CachePlan, dev: str, seed: int, pin: bool):
    """A guarded cache; a CPU one in pinned memory when a GPU takes part (GPU copies need it)."""
    g = guarded(plan, dev, seed=seed)
    if pin and dev == "cpu":
        g.whole = g.whole.pin_memory()
        g.cache = kvc.KVCache(plan, g.whole[GUARD:GUARD + plan.total_bytes])
    return g


def expected_copy(src: kvc.KVCache, dst_before: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    """Reference: copy every (spec, layer, block) through the views."""
    out = kvc.KVCache(src.plan, dst_before.clone())
    for s in src.plan.specs:
        for layer in range(s.num_layers):
            sv, dv = src.view(s.name, layer).cpu(), out.view(s.name, layer)
            dv[mapping[:, 1]] = sv[mapping[:, 0]]
    return out.buffer


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("route", ["same", "to_cpu", "from_cpu"])
def test_copy_blocks(device, layout, route):
    plan = kvc.plan_cache(SPECS, num_blocks=12, block_size=16, layout=layout)
    devs = {"same": (device, device), "to_cpu": (device, "cpu"), "from_cpu": ("cpu", device)}[route]
    gpu = "cuda" in devs
    src, dst = guarded_for(plan, devs[0], 1, gpu), guarded_for(plan, devs[1], 2, gpu)
    mapping = torch.tensor([[0, 5], [1, 6], [2, 7], [9, 1], [4, 11], [11, 0]])
    want = expected_copy(src.expected, dst.expected.buffer, mapping)
    stats = kvc.copy_blocks(src.cache, dst.cache, mapping)
    if "cuda" in devs:
        torch.cuda.synchronize()
    assert torch.equal(dst.cache.buffer.cpu(), want)
    dst.expected.buffer.copy_(want)
    dst.assert_matches()  # guard bytes of dst untouched
    src.assert_matches()
    runs = 4  # (0,1,2)->(5,6,7) coalesces; the others are single blocks
    pieces = 1 if plan.block_outer else 3 + 3 + 2 * (4 if layout == "LHBNC" else 1)
    assert stats.spans == runs * pieces
    assert stats.bytes == 6 * plan.total_bytes // 12


def test_spans_count_block_outer_vs_layer_outer():
    mapping = torch.stack([torch.arange(0, 20, 2), torch.arange(0, 20, 2)], 1)
    counts = {lay: kvc.block_spans(kvc.plan_cache(SPECS, 20, 16, lay), mapping).shape[0]
              for lay in kvc.LAYOUTS}
    assert counts["BLHNC"] == counts["BLNHC"] == counts["BHLNC"] == 10
    assert counts["LBNHC"] == counts["LBHNC"] == 10 * 8
    assert counts["LHBNC"] == 10 * 14
    contiguous = torch.stack([torch.arange(20), torch.arange(20)], 1)
    assert kvc.block_spans(kvc.plan_cache(SPECS, 20, 16, "BLHNC"), contiguous).shape[0] == 1


def test_bad_mapping():
    plan = kvc.plan_cache(SPECS, num_blocks=4, block_size=16)
    a, b = kvc.allocate(plan, fill=0), kvc.allocate(plan, fill=1)
    with pytest.raises(IndexError, match="block_mapping"):
        kvc.copy_blocks(a, b, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match=r"\[M, 2\]"):
        kvc.copy_blocks(a, b, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="block_mapping"):
        kvc.copy_blocks(a, b, torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="both copy into block 1"):
        kvc.copy_blocks(a, b, torch.tensor([[0, 1], [2, 1]]))
    other = kvc.allocate(kvc.plan_cache(SPECS, num_blocks=5, block_size=8), fill=0)
    with pytest.raises(ValueError, match="equal block sizes.*token_spans"):
        kvc.copy_blocks(a, other, torch.tensor([[0, 1]]))
    fewer = kvc.allocate(kvc.plan_cache(SPECS[:2], num_blocks=5, block_size=16), fill=0)
    with pytest.raises(ValueError, match="spec 'kv' is not in src_plan"):
        kvc.copy_blocks(fewer, a, torch.tensor([[0, 1]]))
    assert torch.all(b.buffer == 1)
    with pytest.raises(IndexError, match="spans"):
        kvc.ops._ops.copy_spans(a.buffer, b.buffer, torch.tensor([[0, plan.total_bytes - 4, 8]]))


@pytest.mark.parametrize("src_layout,dst_layout", [("BLHNC", "LBNHC"), ("LHBNC", "BHLNC"),
                                                   ("LBNHC", "BLNHC")])
def test_copy_blocks_between_plans(device, src_layout, dst_layout):
    """Any two plans of one block size: other layouts, other numbers of blocks, and a
    destination that holds a subset of the source's specs."""
    src_plan = kvc.plan_cache(SPECS, num_blocks=12, block_size=16, layout=src_layout)
    dst_plan = kvc.plan_cache(SPECS[::-1][:2], num_blocks=7, block_size=16, layout=dst_layout)
    gpu = device != "cpu"
    src, dst = guarded_for(src_plan, device, 3, gpu), guarded_for(dst_plan, "cpu", 4, gpu)
    mapping = torch.tensor([[11, 0], [3, 6], [4, 2]])
    stats = kvc.copy_blocks(src.cache, dst.cache, mapping)
    stats.synchronize()
    for s in dst_plan.specs:
        for layer in range(s.num_layers):
            want = src.expected.view(s.name, layer)[mapping[:, 0]]
            dst.expected.view(s.name, layer)[mapping[:, 1]] = want
    dst.assert_matches()
    assert stats.blocks == 3 and stats.bytes == 3 * dst_plan.total_bytes // 7
    assert (stats.event is None) == (device == "cpu")
