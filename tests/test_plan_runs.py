"""The compiled transfer planner (TransferPlan.token_runs, csrc/ops/plan_runs.cpp) and the
regroup op (copy_runs): the runs stand for exactly token_spans' bytes -- the torch statement of
the rule -- on random plan pairs and on every layout pair in both directions with unlike block
sizes, and copy_runs writes exactly copy_spans' bytes into a poisoned cache; the exact overlap
check of interleaved runs; what copy_runs refuses, before a byte moves."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from test_transfer import transfer_cases

POISON = 0xA5


def expanded(runs: torch.Tensor) -> torch.Tensor:
    s = kvc.spans_of_runs(runs)
    return kvc.merge_spans(s[:, 0], s[:, 1], s[:, 2])


def filled(plan, seed: int) -> kvc.KVCache:
    c = kvc.allocate(plan)
    c.buffer.copy_(torch.randint(0, 256, c.buffer.shape, dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(seed)))
    return c


def same_bytes(src: kvc.KVCache, dst_plan, runs: torch.Tensor, spans: torch.Tensor) -> None:
    """copy_runs and copy_spans into two poisoned caches: every byte equal, and the moved ones
    are the source's (a run planner that moved nothing would leave the poison)."""
    by_runs, by_spans = kvc.allocate(dst_plan), kvc.allocate(dst_plan)
    by_runs.buffer.fill_(POISON)
    by_spans.buffer.fill_(POISON)
    stats = kvc.copy_runs(src, by_runs, runs)
    kvc.copy_spans(src, by_spans, spans)
    assert torch.equal(by_runs.buffer, by_spans.buffer)
    assert stats.bytes == int(spans[:, 2].sum())
    for s, d, n in spans[:8].tolist():
        assert torch.equal(by_runs.buffer[d:d + n], src.buffer[s:s + n])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfer_cases())
def test_token_runs_are_token_spans_on_random_plan_pairs(c):
    assume(not c["by_blocks"])
    g = torch.Generator().manual_seed(c["seed"])
    ns, nd, t = c["ns"], c["nd"], c["num_tokens"]
    sbn = -(-(c["src_start"] + t) // ns) + c["extra_blocks"] + 1
    dbn = -(-(c["dst_start"] + t) // nd) + (c["seed"] % 3) + 1
    src_plan = kvc.plan_cache(c["src_specs"], sbn, ns, c["src_layout"])
    dst_plan = kvc.plan_cache(c["dst_specs"], dbn, nd, c["dst_layout"])
    xp = kvc.TransferPlan(src_plan, dst_plan, specs=None if c["default_specs"] else c["moved"],
                          layers=c["layers"] or None, heads=c["heads"] or None)
    s_table = torch.randperm(sbn, generator=g).to(torch.int32)
    d_table = torch.randperm(dbn, generator=g).to(torch.int32)
    args = (s_table, d_table, t, c["src_start"], c["dst_start"])
    spans, runs = xp.token_spans(*args), xp.token_runs(*args)
    assert torch.equal(expanded(runs), spans)
    kvc.check_runs(runs, src_plan.total_bytes, dst_plan.total_bytes)
    if t:
        same_bytes(filled(src_plan, c["seed"]), dst_plan, runs, spans)


def vllm_like_specs(heads: int, split_heads: int | None = None) -> list[kvc.CacheSpec]:
    d, sh = 16 * 4, heads if split_heads is None else split_heads
    return [kvc.CacheSpec("kv", 2 * d, 3, sh, split=(d, d), channel_major=4),  # vLLM CPU
            kvc.CacheSpec("split", 2 * 24, 2, sh, split=(24, 24)),
            kvc.CacheSpec("row", 40, 2, heads)]


@pytest.mark.parametrize("ns,nd", [(16, 32), (32, 16), (8, 24)])
def test_every_layout_pair_both_directions(ns, nd):
    """6 x 6 layouts (each pair both ways), unlike block sizes, a token run starting inside a
    block on both sides, a channel-major split spec, a split and a plain one, several heads."""
    g = torch.Generator().manual_seed(ns * 100 + nd)
    n = 150
    for i, (la, lb) in enumerate(itertools.product(kvc.LAYOUTS, kvc.LAYOUTS)):
        # split pages of several heads need a page per head: one head where a layout is NHC
        specs = vllm_like_specs(3, 1 if "NH" in la + lb else 3)
        a = kvc.plan_cache(specs, -(-(n + 5) // ns) + 2, ns, la)
        b = kvc.plan_cache(specs, -(-(n + 7) // nd) + 2, nd, lb)
        ta = torch.randperm(a.num_blocks, generator=g)
        tb = torch.randperm(b.num_blocks, generator=g)
        xp = kvc.TransferPlan(a, b)
        spans, runs = xp.token_spans(ta, tb, n, 5, 7), xp.token_runs(ta, tb, n, 5, 7)
        assert torch.equal(expanded(runs), spans), (la, lb)
        assert runs.shape[0] < spans.shape[0] or la[0] == "B" or lb[0] == "B", (la, lb)
        same_bytes(filled(a, i), b, runs, spans)


def test_layer_and_head_subsets():
    """A PP stage's layers and a TP rank's heads of a larger plan, both ways."""
    g = torch.Generator().manual_seed(3)
    a = kvc.plan_cache(vllm_like_specs(4), 40, 16, "LBHNC")
    b = kvc.plan_cache(vllm_like_specs(2), 30, 32, "BHLNC")
    layers = {"kv": (1, 0, 2), "split": (0, 1, 1), "row": (1, 1, 1)}
    heads = {"kv": (2, 0, 2), "split": (1, 1, 1), "row": (0, 0, 2)}
    for src, dst, ly, hd in ((a, b, layers, heads), (b, a, {k: (v[1], v[0], v[2]) for k, v in
                             layers.items()}, {k: (v[1], v[0], v[2]) for k, v in heads.items()})):
        xp = kvc.TransferPlan(src, dst, layers=ly, heads=hd)
        ts = torch.randperm(src.num_blocks, generator=g)
        td = torch.randperm(dst.num_blocks, generator=g)
        spans, runs = xp.token_spans(ts, td, 300, 3, 0), xp.token_runs(ts, td, 300, 3, 0)
        assert torch.equal(expanded(runs), spans)
        same_bytes(filled(src, 4), dst, runs, spans)


def test_the_vllm_request_is_few_runs_and_checks_like_spans():
    """The benchmark's request (8 layers, 4 heads, head_dim 64 fp32, 8,192 tokens): 32 -> 64
    is 531,424 spans, as runs one per (layer, head, 32-token run) and part; bad tables are
    refused with token_spans' errors."""
    d = 64 * 4
    spec = kvc.CacheSpec("kv", 2 * d, 8, 4, split=(d, d), channel_major=4)
    a = kvc.plan_cache([spec], 300, 32, "LBHNC")
    b = kvc.plan_cache([spec], 150, 64, "LBHNC")
    ta, tb = torch.arange(1, 257), torch.arange(1, 129)
    xp = kvc.TransferPlan(a, b)
    runs, spans = xp.token_runs(ta, tb, 8192), xp.token_spans(ta, tb, 8192)
    assert spans.shape[0] == 8 * 4 * 256 * 65 - 8 * 127 and runs.shape[0] == 8 * 4 * 256 * 2
    assert torch.equal(expanded(runs), spans)
    for bad, err in (((ta[:10], tb, 8192), IndexError), ((ta, tb, -1), ValueError),
                     ((ta.clone().fill_(300), tb, 10), IndexError)):
        with pytest.raises(err):
            xp.token_spans(*bad)
        with pytest.raises(err):
            xp.token_runs(*bad)
    assert xp.token_runs(ta, tb, 0).shape == (0, 6)
    # the op's count-only pass (a runs table of 0 rows) gives exactly the rows the second needs:
    # one row fewer is refused, nothing past the count is left unwritten
    ops = torch.ops.kvcache_ext
    args = (xp.move_table, ta.long(), tb.long(), 32, 64, a.num_blocks, b.num_blocks, 8192, 0, 0)
    count = torch.zeros(1, dtype=torch.int64)
    ops.plan_token_runs(*args, torch.empty(0, 6, dtype=torch.int64), count)
    assert int(count) == runs.shape[0]
    with pytest.raises(RuntimeError, match="more runs than the 16383 rows given"):
        ops.plan_token_runs(*args, torch.empty(runs.shape[0] - 1, 6, dtype=torch.int64), count)


@st.composite
def interleaved_runs(draw):
    """Two runs of one destination stride (the check's arithmetic case), sometimes a third."""
    stride = draw(st.integers(1, 40))
    rows = []
    for _ in range(draw(st.integers(2, 3))):
        length = draw(st.integers(1, stride))
        rows.append([draw(st.integers(0, 50)), draw(st.integers(0, 300)), length,
                     draw(st.integers(0, 9)), stride, draw(st.integers(1, 30))])
    return torch.tensor(rows, dtype=torch.int64)


@settings(max_examples=500, deadline=None)
@given(interleaved_runs())
def test_interleaved_runs_overlap_exactly_when_their_pieces_do(runs):
    spans = kvc.spans_of_runs(runs)
    want = got = None
    try:
        kvc.check_spans(spans, 1 << 12, 1 << 12)
    except ValueError as e:
        want = e
    try:
        kvc.check_runs(runs, 1 << 12, 1 << 12)
    except ValueError as e:
        got = e
    assert (got is None) == (want is None), runs.tolist()


def test_copy_runs_refusals_write_nothing():
    plan = kvc.plan_cache([kvc.CacheSpec("kv", 64, 2, 2)], 4, 8)
    src, dst = filled(plan, 1), kvc.allocate(plan)
    dst.buffer.fill_(POISON)
    ok = [0, 0, 64, 64, 128, 4]
    for runs, err, match in (
            ([ok, [0, 1 << 20, 8, 8, 8, 2]], IndexError, r"runs\[1\] .* destination pieces"),
            ([ok, [0, 96, 64, 64, 128, 2]], ValueError, "overlapping destination"),
            ([ok, [0, 64, 8, 8, 4, 2]], ValueError, "destination stride"),
            ([ok, [0, 64, 8, 8, 8, 0]], ValueError, "count must be >= 1")):
        with pytest.raises(err, match=match):
            kvc.copy_runs(src, dst, torch.tensor(runs))
        assert bool((dst.buffer == POISON).all())
    with pytest.raises(ValueError, match="share memory"):
        torch.ops.kvcache_ext.copy_runs(src.buffer, src.buffer, torch.tensor([ok]))
    with pytest.raises(ValueError, match=r"\[R, 6\]"):
        kvc.copy_runs(src, dst, torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="KVCache"):
        kvc.copy_runs(src.buffer, dst, torch.tensor([ok]))
    assert bool((dst.buffer == POISON).all())


def test_long_pieces_and_many_short_ones_are_cut_into_items():
    """A piece longer than a CPU item and a run of a million 1-B pieces: the items cover them
    exactly once (bytes equal to copy_spans; the poison elsewhere kept)."""
    plan = kvc.plan_cache([kvc.CacheSpec("kv", 1 << 12, 1)], 2048, 16, "LBHNC")
    src, a, b = filled(plan, 2), kvc.allocate(plan), kvc.allocate(plan)
    a.buffer.fill_(POISON)
    b.buffer.fill_(POISON)
    runs = torch.tensor([[0, 1 << 20, 3 << 20, 0, 3 << 20, 1],
                         [5 << 20, 10 << 20, 1, 3, 2, 1 << 20],
                         [9 << 20, 30 << 20, 100_000, 200_000, 150_000, 7]])
    kvc.copy_runs(src, a, runs)
    spans = kvc.spans_of_runs(runs)
    torch.ops.kvcache_ext.copy_spans(src.buffer, b.buffer, spans)
    assert torch.equal(a.buffer, b.buffer)
    assert int((a.buffer != POISON).sum()) > 3 << 20


@pytest.mark.parametrize("na,nb", [(32, 64), (64, 32), (32, 6)])
def test_a_regroup_past_the_streaming_size_moves_copy_spans_bytes(na, nb):
    """16 MiB of vLLM-CPU pages (channel-major K, then V) between two block sizes, past the size
    from which copy_runs streams whole 64-B lines past the cache (8 MiB): 128-B K pieces and the
    V pages streamed; with block 6, 24-B K pieces copied as before beside streamed V pages in one
    op -- every byte equal to copy_spans into a poisoned cache, random block tables."""
    d, tokens = 64 * 4, 4096
    spec = kvc.CacheSpec("kv", 2 * d, 2, 4, split=(d, d), channel_major=4)
    ba, bb = tokens // na + 1, -(-tokens // nb) + 1
    a = kvc.plan_cache([spec], ba, na, "LBHNC")
    b = kvc.plan_cache([spec], bb, nb, "LBHNC")
    g = torch.Generator().manual_seed(na * 100 + nb)
    ta, tb = torch.randperm(ba, generator=g)[:ba - 1], torch.randperm(bb, generator=g)[:bb - 1]
    xp = kvc.TransferPlan(a, b)
    runs, spans = xp.token_runs(ta, tb, tokens), xp.token_spans(ta, tb, tokens)
    assert int(spans[:, 2].sum()) == 16 << 20
    same_bytes(filled(a, na), b, runs, spans)
