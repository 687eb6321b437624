"""Strided runs (src, dst, length, src_stride, dst_stride, count): a TransferPlan's spans as runs
expand to exactly its spans (every plan pair of the transfer property test, V4 groups), the
runs are as few as even steps allow, and bad runs are refused -- without expanding them -- exactly
when their expanded spans would be."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from test_groups import _tables
from test_transfer import run_case, transfer_cases


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfer_cases())
def test_runs_expand_to_the_spans(c):
    src_plan, dst_plan, spans, _ = run_case(c)
    runs = kvc.runs_of_spans(spans)
    assert torch.equal(kvc.spans_of_runs(runs), spans)
    assert runs.shape[0] <= spans.shape[0]
    kvc.check_runs(runs, src_plan.total_bytes, dst_plan.total_bytes)  # valid spans, valid runs
    # greedy and maximal: no two neighbouring runs could be one
    for a, b in zip(runs[:-1].tolist(), runs[1:].tolist()):
        same = a[2] == b[2] and (a[5] == 1 or (b[0] - (a[0] + (a[5] - 1) * a[3]) == a[3]
                                               and b[1] - (a[1] + (a[5] - 1) * a[4]) == a[4]))
        assert not (same and b[5] == 1 and a[5] > 1), (a, b)


def test_plan_runs_methods_and_the_shapes_they_compress():
    # vLLM CPU's page: K channel-major, V token-major; 8 layers, 4 heads, block 32 -> 64
    d = 64 * 4
    spec = kvc.CacheSpec("kv", 2 * d, 8, 4, split=(d, d), channel_major=4)
    a = kvc.plan_cache([spec], 300, 32, "LBHNC")
    b = kvc.plan_cache([spec], 150, 64, "LBHNC")
    ta = torch.arange(1, 257, dtype=torch.int32)
    tb = torch.arange(1, 129, dtype=torch.int32)
    xp = kvc.TransferPlan(a, b)
    spans = xp.token_spans(ta, tb, 8192)
    runs = xp.token_runs(ta, tb, 8192)
    pieces = kvc.spans_of_runs(runs)  # the planner's order; merged, exactly token_spans
    assert torch.equal(kvc.merge_spans(pieces[:, 0], pieces[:, 1], pieces[:, 2]), spans)
    # per (layer, head, 32-token run): 64 K channels and V; a dst block's last V piece runs on
    # into the next one's first K channel on both sides (127 times per layer)
    assert spans.shape[0] == 8 * 4 * 256 * (64 + 1) - 8 * 127
    assert runs.shape[0] * 20 < spans.shape[0]  # the 64 channels of a run step evenly
    # block-outer to block-outer, whole blocks: one run per spec over every layer
    p = kvc.plan_cache([kvc.CacheSpec("mla", 656, 4)], 8, 16, "BLHNC")
    q = kvc.plan_cache([kvc.CacheSpec("mla", 656, 4)], 8, 16, "LBHNC")
    pairs = torch.tensor([[1, 2], [3, 5]])
    xq = kvc.TransferPlan(p, q)
    assert torch.equal(kvc.spans_of_runs(xq.block_runs(pairs)), xq.block_spans(pairs))
    assert xq.block_runs(pairs).shape[0] == 2 and xq.block_spans(pairs).shape[0] == 8


@pytest.mark.parametrize("num_tokens", [1, 300, 1000])
def test_group_runs_expand_to_the_group_spans(num_tokens):
    groups = kvc.presets.deepseek_v4("flash")
    src = kvc.plan_cache(groups=groups, num_blocks=40, layout="BLHNC")
    dst = kvc.plan_cache(groups=groups, num_blocks=36, layout="BLNHC", packing="stack")
    st_, dt = _tables(groups, num_tokens, 40, 1), _tables(groups, num_tokens, 36, 2)
    xp = kvc.GroupTransferPlan(src, dst)
    tables = {k: (st_[k], dt[k]) for k in st_}
    spans, runs = xp.token_spans(tables, num_tokens), xp.token_runs(tables, num_tokens)
    flat = kvc.spans_of_runs(runs)  # each move's runs, planned apart: merged, the spans
    assert torch.equal(kvc.merge_spans(flat[:, 0], flat[:, 1], flat[:, 2]), spans)
    kvc.check_runs(runs, src.total_bytes, dst.total_bytes)


@st.composite
def run_lists(draw):
    n = draw(st.integers(1, 6))
    rows = []
    for _ in range(n):
        length = draw(st.integers(0, 6))
        count = draw(st.integers(1, 4))
        rows.append([draw(st.integers(0, 40)), draw(st.integers(0, 40)), length,
                     draw(st.integers(0, 12)), draw(st.integers(length, length + 12)), count])
    return torch.tensor(rows, dtype=torch.int64), draw(st.integers(1, 80)), draw(st.integers(1, 80))


@settings(max_examples=400, deadline=None)
@given(run_lists())
def test_check_runs_refuses_exactly_what_check_spans_refuses(case):
    runs, src_bytes, dst_bytes = case
    spans = kvc.spans_of_runs(runs)
    try:
        kvc.check_spans(spans, src_bytes, dst_bytes)
        want = None
    except (IndexError, ValueError) as e:
        want = type(e)
    try:
        kvc.check_runs(runs, src_bytes, dst_bytes)
        got = None
    except (IndexError, ValueError) as e:
        got = type(e)
    assert got is want, (runs.tolist(), src_bytes, dst_bytes)


def test_bad_runs_are_named():
    ok = [0, 0, 4, 4, 4, 2]
    with pytest.raises(ValueError, match=r"runs\[1\] = \(0, 8, 4, 4, 4, 0\): count must be >= 1"):
        kvc.check_runs(torch.tensor([ok, [0, 8, 4, 4, 4, 0]]), 64, 64)
    with pytest.raises(ValueError, match="destination stride >= its length"):
        kvc.check_runs(torch.tensor([[0, 0, 4, 4, 2, 2]]), 64, 64)
    with pytest.raises(IndexError, match="destination pieces must lie in"):
        kvc.check_runs(torch.tensor([[0, 60, 4, 4, 4, 2]]), 64, 64)
    with pytest.raises(IndexError, match="source pieces must lie in"):
        kvc.check_runs(torch.tensor([[0, 0, 4, 2 ** 62, 4, 3]]), 64, 64)  # no wrap past 2^63
    with pytest.raises(ValueError, match=r"runs\[0\] = .* and runs\[1\] = .* write overlapping"):
        kvc.check_runs(torch.tensor([[0, 0, 4, 8, 8, 3], [0, 18, 4, 4, 4, 1]]), 64, 64)
    kvc.check_runs(torch.tensor([[0, 0, 4, 8, 8, 3], [0, 4, 4, 8, 8, 3]]), 64, 64)  # interleaved
    with pytest.raises(ValueError, match=r"must be \[R, 6\]"):
        kvc.check_runs(torch.zeros(2, 5, dtype=torch.int64), 64, 64)


@settings(max_examples=300, deadline=None)
@given(run_lists(), st.booleans())
def test_spans_of_runs_and_merge_spans_state_their_rules(case, int32):
    runs = case[0].to(torch.int32) if int32 else case[0]
    want = [[s + j * ss, d + j * ds, n] for s, d, n, ss, ds, c in runs.tolist() for j in range(c)]
    spans = kvc.spans_of_runs(runs)
    assert spans.dtype == torch.int64 and spans.tolist() == want
    # merged: sorted by (src, dst), each piece that continues the last on both sides joins it
    out: list[list[int]] = []
    for s, d, n in sorted(want, key=lambda p: (p[0], p[1])):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1][2] += n
        else:
            out.append([s, d, n])
    c = spans.to(runs.dtype)
    got = kvc.merge_spans(c[:, 0], c[:, 1], c[:, 2])
    assert got.dtype == torch.int64 and got.tolist() == out
    spans[:, 0] += 1  # a new tensor, not a view of the runs
    assert kvc.spans_of_runs(runs).tolist() == want


def test_spans_of_runs_and_merge_spans_edges():
    empty = torch.zeros(0, dtype=torch.int64)
    assert kvc.merge_spans(empty, empty, empty).shape == (0, 3)
    assert kvc.spans_of_runs(torch.zeros(0, 6, dtype=torch.int64)).shape == (0, 3)
    with pytest.raises(ValueError, match=r"runs\[1\]: count must be >= 1"):
        kvc.spans_of_runs(torch.tensor([[0, 0, 4, 4, 4, 2], [8, 8, 4, 4, 4, 0],
                                        [16, 16, 4, 4, 4, -1]]))  # the first bad run named
