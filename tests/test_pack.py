"""The packed read (kvcache_ext/transfer/pack.py): a producer re-tiles a request's tokens into the
consumer's page form part by part, the consumer reads the parts into place; the bytes that land
equal a direct copy_spans between the two plans, in every pair of layouts, both directions of a
block-size change, any start, and every part's runs stay inside that part."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext.ops.library import ops
import kvcache_ext.transfer.pack as kvc_pack
from kvcache_ext.transfer.pack import PackPlans, pack_layout, packed_read, split_runs

SPECS = [kvc.CacheSpec("kv", 32, 3, 1, split=(16, 16), channel_major=4),  # vLLM-CPU's K | V page
         kvc.CacheSpec("x", 12, 3, 3)]


def _cache(layout: str, block: int, blocks: int, seed: int | None) -> kvc.KVCache:
    plan = kvc.plan_cache(SPECS, blocks, block, layout)
    g = torch.Generator().manual_seed(seed or 0)
    buf = (torch.randint(0, 256, (plan.total_bytes,), dtype=torch.uint8, generator=g)
           if seed is not None else torch.full((plan.total_bytes,), 0xA5, dtype=torch.uint8))
    return kvc.KVCache(plan, buf)


def _extent(runs: torch.Tensor, col: int) -> tuple[int, int]:
    r = runs.numpy()
    last = r[:, col] + (r[:, 5] - 1) * r[:, 3 + col]
    return int(np.minimum(r[:, col], last).min()), int((np.maximum(r[:, col], last) + r[:, 2]).max())


def _packed_move(src: kvc.KVCache, dst: kvc.KVCache, src_table, dst_table, start: int,
                 count: int, part_bytes: int) -> int:
    pr = packed_read(dst.plan, start, count, part_bytes)
    pack = kvc.TransferPlan(src.plan, pr.plan).token_runs(src_table, pr.table(), count, start, start)
    read = kvc.TransferPlan(pr.plan, dst.plan).token_runs(pr.table(), dst_table, count, start, start)
    packed = torch.full((pr.nbytes,), 0x5A, dtype=torch.uint8)
    parts_a, parts_b = split_runs(pack, 1, pr.bounds), split_runs(read, 0, pr.bounds)
    assert len(parts_a) == len(parts_b) == pr.parts
    for p, (a, b) in enumerate(zip(parts_a, parts_b)):
        for runs, col in ((a, 1), (b, 0)):
            if runs.numel():
                lo, hi = _extent(runs, col)
                assert pr.bounds[p] <= lo and hi <= pr.bounds[p + 1], (p, lo, hi)
        if a.numel():
            ops.copy_runs(src.buffer, packed, a)
        if b.numel():
            ops.copy_runs(packed, dst.buffer, b)
    # the parts hold the same bytes as the unsplit runs
    assert sum(int((x[:, 2] * x[:, 5]).sum()) for x in parts_a) == int((pack[:, 2] * pack[:, 5]).sum())
    return pr.parts


@pytest.mark.parametrize("src_layout,dst_layout", list(itertools.product(kvc.LAYOUTS, repeat=2)))
def test_packed_read_lands_the_bytes_of_a_direct_move(src_layout, dst_layout):
    for (sb, db), start, count, part in (((4, 8), 0, 37, 700), ((8, 4), 8, 29, 333),
                                         ((6, 4), 4, 1, 64), ((4, 6), 6, 40, 1 << 20)):
        src = _cache(src_layout, sb, 16, seed=sb * 7 + db)
        src_table = torch.randperm(16)[: -(-(start + count) // sb)].to(torch.int64)
        dst_table = torch.randperm(16)[: -(-(start + count) // db)].to(torch.int64)
        want = _cache(dst_layout, db, 16, seed=None)
        spans = kvc.TransferPlan(src.plan, want.plan).token_spans(src_table, dst_table, count,
                                                                  start, start)
        kvc.copy_spans(src, want, spans)
        got = _cache(dst_layout, db, 16, seed=None)
        parts = _packed_move(src, got, src_table, dst_table, start, count, part)
        assert torch.equal(got.buffer, want.buffer), (sb, db, start, count, part, parts)


def test_pack_layout_keeps_the_page_form():
    assert [pack_layout(x) for x in kvc.LAYOUTS] == ["LBHNC", "LBNHC", "LHBNC", "LBHNC",
                                                     "LBNHC", "LBHNC"]
    pr = packed_read(kvc.plan_cache(SPECS, 64, 32, "BLNHC"), 64, 100, 1000)
    assert pr.plan.layout == "LBNHC" and pr.plan.num_blocks == 4  # logical blocks 2..5
    assert pr.table().tolist() == [0, 0, 0, 1, 2, 3]
    assert pr.bounds[0] == 0 and pr.bounds[-1] == pr.nbytes and pr.parts == -(-pr.nbytes // 1000)


def test_split_runs_cuts_runs_and_pieces_at_the_bounds():
    runs = torch.tensor([[0, 1000, 10, 16, 10, 4],     # pieces at 0, 16, 32, 48: cut between
                         [100, 2000, 50, 0, 0, 1]], dtype=torch.int64)  # one piece across 120
    parts = split_runs(runs, 0, [0, 40, 120, 200])
    assert [p.tolist() for p in parts] == [
        [[0, 1000, 10, 10, 10, 1], [16, 1010, 10, 10, 10, 1], [32, 1020, 8, 8, 8, 1]],
        [[48, 1030, 10, 10, 10, 1], [100, 2000, 20, 20, 20, 1], [40, 1028, 2, 2, 2, 1]],
        [[120, 2020, 30, 30, 30, 1]]]
    # order_col: the same runs in each part, sorted by that column (here part 1's source order)
    ordered = split_runs(runs, 0, [0, 40, 120, 200], order_col=0)
    assert [p.tolist() for p in ordered] == [
        [[0, 1000, 10, 10, 10, 1], [16, 1010, 10, 10, 10, 1], [32, 1020, 8, 8, 8, 1]],
        [[40, 1028, 2, 2, 2, 1], [48, 1030, 10, 10, 10, 1], [100, 2000, 20, 20, 20, 1]],
        [[120, 2020, 30, 30, 30, 1]]]
    by_dst = split_runs(runs, 0, [0, 40, 120, 200], order_col=1)
    assert [p[:, 1].tolist() for p in by_dst] == [[1000, 1010, 1020], [1028, 1030, 2000], [2020]]
    # the producer's case: cut on the destination, each part in source order, where a later
    # part holds smaller sources than an earlier one (one sort of all runs by source fails it)
    back = torch.tensor([[500, 0, 10, 10, 10, 1], [100, 10, 10, 10, 10, 1],
                         [50, 20, 10, 10, 10, 1], [10, 30, 10, 10, 10, 1]], dtype=torch.int64)
    assert [p[:, 0].tolist() for p in split_runs(back, 1, [0, 20, 40], order_col=0)] == [
        [100, 500], [10, 50]]
    with pytest.raises(ValueError, match="outside the bounds"):
        split_runs(runs, 1, [0, 40])
    with pytest.raises(ValueError, match="col"):
        split_runs(runs, 2, [0, 40])
    with pytest.raises(ValueError, match="start"):
        packed_read(kvc.plan_cache(SPECS, 4, 4), -1, 3)


def test_pack_plans_are_made_once_per_block_count_and_are_packed_read(monkeypatch):
    cons = kvc.plan_cache(SPECS, 40, 8, "LBHNC")
    prod = kvc.plan_cache(SPECS, 40, 4, "BLHNC")
    mine = PackPlans(cons, own_is_src=False, keep=2)
    pr, xp = mine.get(cons, 8, 29, 333)  # blocks 1..4 of the consumer: 4 packed blocks
    assert pr == packed_read(cons, 8, 29, 333)
    assert xp.src_plan == pr.plan and xp.dst_plan == cons
    pr2, xp2 = mine.get(cons, 0, 32, 333)  # 4 blocks again: the same plans
    assert xp2 is xp and pr2 == packed_read(cons, 0, 32, 333)
    made = []
    real = kvc_pack._packed_read  # what a miss makes (its arguments checked once, by get)
    monkeypatch.setattr(kvc_pack, "_packed_read", lambda *a: made.append(a) or real(*a))
    assert mine.get(cons, 4 * 8, 32, 333)[1] is xp and made == []  # a hit plans nothing
    assert mine.get(cons, 0, 40, 333)[1] is not xp and len(made) == 1  # 5 blocks: a miss
    pr5, xp5 = mine.get(cons, 4, 32, 333)  # 32 tokens from inside a block: 5 blocks as well
    assert pr5.plan.num_blocks == 5 and xp5 is not xp and len(made) == 1
    monkeypatch.undo()
    assert mine.get(cons, 0, 32, 64)[1] is not xp  # another part size: other bounds
    assert mine.get(cons, 0, 37, 333)[1] is not xp  # 5 blocks
    assert mine.get(cons, 0, 33, 333)[1] is mine.get(cons, 0, 37, 333)[1]  # 5 blocks each
    assert mine.get(cons, 8, 29, 333)[1] is not xp  # kept only the last 2: made again
    # one runs-table pool for every length: a prompt of a new length plans in a slab an
    # earlier one touched (2,000 runs: above the pool's floor)
    big = kvc.plan_cache(SPECS, 2000, 8, "LBHNC")
    lengths = PackPlans(big, own_is_src=False)
    for count in (3000, 3100, 2900, 3050):  # four block counts: four plan pairs
        pr4, xp4 = lengths.get(big, 0, count)
        runs = xp4.token_runs(pr4.table(), torch.randperm(2000)[:400], count)  # page by page
        assert runs.numel() * 8 >= 64 << 10 and xp4.tables is lengths.tables
        del runs
    assert lengths.tables.made == 1 and lengths.tables.lent == 0
    with pytest.raises(ValueError, match="dst_plan must be `own`"):
        mine.get(prod, 0, 8)
    theirs = PackPlans(prod, own_is_src=True)
    pr3, xp3 = theirs.get(cons, 8, 29, 333)
    assert pr3 == pr and xp3.src_plan == prod and xp3.dst_plan == pr.plan
    assert theirs.get(cons, 0, 32, 333)[1] is xp3
    with pytest.raises(ValueError, match="count must be an int >= 1"):
        theirs.get(cons, 0, 0)
    with pytest.raises(TypeError, match="own must be a CachePlan"):
        PackPlans("plan", own_is_src=True)


def test_a_consumers_reserve_warms_the_table_of_every_packed_read_up_to_its_length(monkeypatch):
    cons = kvc.plan_cache(SPECS, 3000, 8, "LBHNC")
    mine = PackPlans(cons, own_is_src=False)
    passes, planned = [], []
    real, real_runs = kvc_pack.TransferPlan.reserve_runs, kvc_pack.TransferPlan.token_runs
    monkeypatch.setattr(kvc_pack.TransferPlan, "reserve_runs",
                        lambda self, n, **kw: passes.append((n, kw)) or real(self, n, **kw))
    monkeypatch.setattr(kvc_pack.TransferPlan, "token_runs",
                        lambda self, *a: planned.append(a[2]) or real_runs(self, *a))
    mine.reserve(20000)
    assert passes == [(20000, {"in_step": True})] and mine.tables.made == 1
    assert planned and planned[0] <= 8  # one read planned ahead, of a block's tokens
    # sized for reads whose starts agree within a block (a packed read's): about half the
    # table of unknown starts
    xp = mine.get(cons, 0, 20000)[1]
    assert mine.tables.faulted == -(-xp._runs_bound(20000, in_step=True) * 48 // (64 << 10)) * (
        64 << 10)
    assert 2 * mine.tables.faulted > xp._runs_bound(20000) * 48 > 1.9 * mine.tables.faulted
    g = torch.Generator().manual_seed(5)
    # shorter, then as long, from a block's first token and from inside one (one block more):
    # without the reservation the first would make a slab too small for the last
    for start, count in ((5, 12345), (0, 9000), (0, 20000), (7, 19999)):
        pr, xp = mine.get(cons, start, count)
        dst = torch.randperm(3000, generator=g)[:-(-(start + count) // 8)]
        runs = xp.token_runs(pr.table(), dst, count, start, start)
        assert runs.numel() * 8 >= 64 << 10  # pooled, not a small heap table
        del runs
    assert mine.tables.made == 1 and mine.tables.lent == 0  # all planned in the reserved slab
    faulted = mine.tables.faulted
    mine.reserve(20000)  # another producer's handshake: the slab is in already
    assert mine.tables.faulted == faulted and mine.tables.made == 1
    mine.reserve(0)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
            mine.reserve(bad)
    with pytest.raises(ValueError, match="reserve is a consumer's"):
        PackPlans(cons, own_is_src=True).reserve(100)
