"""Runs tables lent from memory an earlier request touched (kvcache_ext/transfer/scratch.py): a
slab is lent again only once nothing holds its table (views, numpy arrays, other threads), the
tables hold the same runs as fresh ones, and reserve_runs makes a request's first table warm."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

import kvcache_ext as kvc
import kvcache_ext.transfer.plan as kvc_plan
from kvcache_ext.transfer.scratch import TablePool

SPEC = kvc.CacheSpec("kv", 2 * 256, 8, 4, split=(256, 256), channel_major=4)  # vLLM-CPU's page


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a1 <= b0 or b1 <= a0


def test_a_slab_is_lent_again_only_when_nothing_holds_its_table():
    pool = TablePool()
    t = pool.int64(4096, 6)  # 192 KiB: pooled
    first = _span(t)[0]
    col, arr, tail = t[:, 1], t.numpy(), t[100:]
    del t
    seen = set()
    for held in (col, torch.from_numpy(arr), tail):  # any one of them keeps the slab lent
        u = pool.int64(4096, 6)
        assert _apart(u, held)
        seen.add(_span(u)[0])
        del u
    assert pool.lent == 1 and pool.made == 2 and len(seen) == 1  # the second slab, reused
    del col, arr, held
    assert pool.lent == 1  # tail still holds it
    del tail
    assert pool.lent == 0
    a, b = pool.int64(4096, 6), pool.int64(4096, 6)
    assert {_span(a)[0], _span(b)[0]} == {first, *seen} and pool.made == 2  # no slab made


def test_small_tables_are_not_pooled_and_the_pool_keeps_a_bounded_amount():
    pool = TablePool(keep=2, keep_bytes=1 << 20)
    small = pool.int64(10, 6)
    assert small.shape == (10, 6) and pool.lent == 0 and pool.made == 0
    held = [pool.int64(4096, 6) for _ in range(5)]  # 5 x 192 KiB at once
    assert pool.made == 5
    for i, a in enumerate(held):
        for b in held[i + 1:]:
            assert _apart(a, b)
    del held, a, b
    assert pool.lent == 0
    assert len(pool._free) <= 2 and sum(len(s) for s in pool._free) <= 1 << 20
    big = pool.int64(1 << 16, 6)  # 3 MiB: kept slabs too small, a new one
    assert pool.made == 6 and big.shape == (1 << 16, 6)
    del big  # over keep_bytes alone: freed, the two small ones stay
    assert sorted(len(s) for s in pool._free) == [192 << 10] * 2
    roomy = TablePool(keep=2, keep_bytes=8 << 20)
    small, large, mid = roomy.int64(4096, 6), roomy.int64(1 << 16, 6), roomy.int64(8192, 6)
    del small, mid, large  # three returned, the largest last: two kept, the largest (they
    assert sorted(len(s) for s in roomy._free) == [384 << 10, 3 << 20]  # serve smaller ones)
    pinned = TablePool(keep_bytes=1 << 20)
    pinned.reserve(3 << 20)  # over keep_bytes: kept all the same (what reserve_runs asks for)
    assert [len(s) for s in pinned._free] == [3 << 20] and pinned.keep_bytes == 3 << 20
    t = pinned.int64(1 << 16, 6)
    assert pinned.made == 1 and pinned.lent == 1
    del t
    assert pinned.lent == 0 and len(pinned._free) == 1


def _pair(sb: int, db: int) -> kvc.TransferPlan:
    return kvc.TransferPlan(kvc.plan_cache([SPEC], 8192 // sb * 2, sb, "LBHNC"),
                            kvc.plan_cache([SPEC], 8192 // db * 2, db, "LBHNC"))


@pytest.mark.parametrize("sb,db", [(32, 64), (64, 32), (32, 32)])
def test_runs_in_lent_tables_equal_the_spans_and_the_first_request_is_warm(sb, db, monkeypatch):
    xp = _pair(sb, db)
    calls = []
    real = kvc_plan._ops.plan_token_runs
    monkeypatch.setattr(kvc_plan, "_ops", SimpleNamespace(
        plan_token_runs=lambda *a: calls.append(a[-2].shape) or real(*a)))
    xp.reserve_runs(8192)
    assert xp.tables.made == 1  # faulted in here (like pages too: the bound's rows, pooled)
    assert len(calls) == 1 and calls[0][0] > 0  # and one planner pass, into that table
    monkeypatch.undo()
    g = torch.Generator().manual_seed(sb * 100 + db)
    # starts on a block, inside one (a prefix hit), and not in step between the two sides
    for s0, d0, count in ((0, 0, 8192), (64, 64, 8000), (17, 17, 8000), (32, 32, 8000),
                          (16, 0, 8000), (5, 27, 8100), (0, 0, 8192)):
        st = torch.randperm(xp.src_plan.num_blocks, generator=g)[:-(-(s0 + count) // sb)]
        dt = torch.randperm(xp.dst_plan.num_blocks, generator=g)[:-(-(d0 + count) // db)]
        runs = xp.token_runs(st, dt, count, s0, d0)
        want = xp.token_spans(st, dt, count, s0, d0)
        assert torch.equal(kvc.merge_spans(*kvc.spans_of_runs(runs).unbind(1)), want)
        del runs
    assert xp.tables.made == 1 and xp.tables.lent == 0  # every request planned in that table


def test_tables_planned_in_threads_at_once_never_share_memory():
    xp = _pair(32, 64)
    g = torch.Generator().manual_seed(3)
    jobs = [(torch.randperm(512, generator=g)[:128], torch.randperm(256, generator=g)[:64])
            for _ in range(4)]
    want = [xp.token_runs(s, d, 4096).clone() for s, d in jobs]
    bad: list[str] = []

    def plan(i: int) -> None:
        for _ in range(25):
            runs = xp.token_runs(*jobs[i], 4096)
            runs_again = runs.clone()  # another thread's table over this one would show here
            if not torch.equal(runs, want[i]) or not torch.equal(runs_again, want[i]):
                bad.append(f"thread {i}")

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [] and xp.tables.lent == 0


def test_reserve_runs_takes_a_token_count():
    xp = _pair(32, 64)
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
            xp.reserve_runs(bad)
    xp.reserve_runs(0)
    assert xp.tables.made == 0


def test_reserve_runs_faults_in_at_most_reserve_bytes_and_longer_prompts_still_plan(monkeypatch):
    """A long max_model_len on a large model would reserve GBs: at most RESERVE_BYTES are
    faulted in, and a prompt past them plans right in a table of its own."""
    whole = _pair(32, 64)
    whole.reserve_runs(8192)
    need = whole._runs_bound(8192) * 48
    assert whole.tables.faulted >= need > 512 << 10  # under the cap: all of it
    monkeypatch.setattr(kvc_plan, "RESERVE_BYTES", 256 << 10)
    capped = _pair(32, 64)
    capped.reserve_runs(8192)
    assert 0 < capped.tables.faulted <= (256 << 10) + (64 << 10)  # a slab's alignment over
    short = 8192 * (256 << 10) // need - 64  # a prompt whose table fits: the reserved slab
    g = torch.Generator().manual_seed(9)
    for count in (short, 8192):
        st = torch.randperm(capped.src_plan.num_blocks, generator=g)[:-(-(17 + count) // 32)]
        dt = torch.randperm(capped.dst_plan.num_blocks, generator=g)[:-(-(5 + count) // 64)]
        runs = capped.token_runs(st, dt, count, 17, 5)
        want = capped.token_spans(st, dt, count, 17, 5)
        assert torch.equal(kvc.merge_spans(*kvc.spans_of_runs(runs).unbind(1)), want)
        del runs
        assert capped.tables.made == (1 if count == short else 2)
    faulted = whole.tables.faulted
    whole.reserve_runs(8192)  # again (another producer of this pair): in already
    assert whole.tables.faulted == faulted and whole.tables.made == 1
