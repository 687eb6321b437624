"""A grouped (DeepSeek-V4) request's runs planned in compiled code (GroupTransferPlan.token_runs:
each move's rows by its own planner, TransferPlan.plan_into, into one table): exactly
token_spans' bytes -- the torch statement of the rule -- between random plan pairs, prefix hits
and kept windows, and copy_runs writes exactly copy_spans' bytes into a poisoned cache; the
argument errors, naming the group; reserve_runs faults in the one table a long request then
plans in."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from kvcache_ext.transfer import groups as groups_mod
from test_groups import request_tables, shuffled, window_firsts
from test_plan_runs import POISON, expanded


def flash_request(n: int):
    """A V4-Flash plan pair (one plan), its GroupTransferPlan, a request's tables and pairs."""
    groups = kvc.presets.deepseek_v4("flash")
    plan = kvc.plan_cache(groups=groups, num_blocks=40, layout="BLHNC")
    t = request_tables(groups, n, shuffled(40, torch.Generator().manual_seed(0)))
    return kvc.GroupTransferPlan(plan, plan), t, {k: (v, v) for k, v in t.items()}


@st.composite
def group_cases(draw):
    preset = draw(st.sampled_from(["flash", "pro"]))
    groups = kvc.presets.deepseek_v4(preset)
    n = draw(st.integers(1, 1400))
    start = draw(st.integers(0, n))
    kept = {}  # a kept window: whole blocks from the window's rule, or from an earlier block
    for grp in groups:
        if grp.window is not None:
            rule = max(n - grp.window, 0) // grp.block_size
            kept[grp.name] = draw(st.integers(max(rule - 2, 0), rule)) * grp.block_size
    # overlay: a block is one group's; only the kept blocks need one
    need = sum(-(-n // g.block_size) - kept.get(g.name, 0) // g.block_size for g in groups)
    plans = []
    for _ in range(2):
        layout = draw(st.sampled_from(kvc.LAYOUTS))
        packing = "stack" if layout.startswith("L") else draw(st.sampled_from(["overlay",
                                                                                "stack"]))
        plans.append(kvc.plan_cache(groups=groups, num_blocks=need + draw(st.integers(0, 3)),
                                    layout=layout, packing=packing))
    firsts = kept if draw(st.booleans()) else None  # else the window rule (whole blocks too)
    if firsts is None:
        kept = window_firsts(groups, n)
    return plans, n, start, kept, firsts, draw(st.integers(0, 2**31))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group_cases())
def test_group_token_runs_are_token_spans_and_copy_the_same_bytes(case):
    (src_plan, dst_plan), n, start, kept, firsts, seed = case
    g = torch.Generator().manual_seed(seed)
    st_ = request_tables(src_plan.groups, n, shuffled(src_plan.num_blocks, g), kept)
    dt = request_tables(dst_plan.groups, n, shuffled(dst_plan.num_blocks, g), kept)
    tables = {k: (st_[k], dt[k]) for k in st_}
    xp = kvc.GroupTransferPlan(src_plan, dst_plan)
    spans = xp.token_spans(tables, n, start, firsts)
    runs = xp.token_runs(tables, n, start, firsts)
    assert runs.dtype == torch.int64 and runs.shape[1] == 6
    assert torch.equal(expanded(runs), spans)
    src = kvc.allocate(src_plan)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8, generator=g))
    by_runs, by_spans = kvc.allocate(dst_plan, fill=POISON), kvc.allocate(dst_plan, fill=POISON)
    stats = kvc.copy_runs(src, by_runs, runs)
    kvc.copy_spans(src, by_spans, spans)
    assert torch.equal(by_runs.buffer, by_spans.buffer)
    assert stats.bytes == int(spans[:, 2].sum())
    for s, d, k in spans[:8].tolist():  # moved bytes are the source's, not the poison
        assert torch.equal(by_runs.buffer[d:d + k], src.buffer[s:s + k])


def test_group_token_runs_check_their_arguments_as_token_spans_do():
    xp, t, tables = flash_request(300)
    for f in (xp.token_spans, xp.token_runs):
        with pytest.raises(ValueError, match=r"block_tables has no \(src, dst\) tables for "
                                             r"groups \['main'\]"):
            f({k: v for k, v in tables.items() if k != "main"}, 300)
        with pytest.raises(ValueError, match=r"start must be an int in \[0, num_tokens = 300\]"):
            f(tables, 300, 301)
        with pytest.raises(ValueError, match=r"firsts names groups that are not moved"):
            f(tables, 300, 0, {"nope": 0})
    assert xp.token_runs(tables, 0).shape == (0, 6)
    bad = dict(tables, main=(torch.tensor([3, 40], dtype=torch.int32), tables["main"][1]))
    with pytest.raises(IndexError, match=r"block_tables\['main'\]: src_table\[1\] = 40 is "
                                         r"outside \[0, 40\)"):  # the group named, its entry
        xp.token_runs(bad, 300)


def test_group_reserve_runs_faults_in_the_table_a_long_request_then_plans_in(monkeypatch):
    """reserve_runs(N): one slab of the plan's pool faulted in, which a request of N tokens then
    plans in (no fresh slab); at most RESERVE_BYTES (a smaller budget: a smaller slab)."""
    groups = kvc.presets.deepseek_v4("flash")
    n = 60_000
    # kept windows from one block before the window rule (an engine keeps whole blocks)
    kept = {k: max(v - groups[[g.name for g in groups].index(k)].block_size, 0)
            for k, v in window_firsts(groups, n).items()}
    need = sum(-(-n // g.block_size) - kept.get(g.name, 0) // g.block_size for g in groups)
    plan = kvc.plan_cache(groups=groups, num_blocks=need, layout="BLHNC")  # never allocated
    other = kvc.plan_cache(groups=groups, num_blocks=need, layout="BLNHC", packing="stack")
    g = torch.Generator().manual_seed(3)
    st_ = request_tables(groups, n, shuffled(need, g), kept)
    dt = request_tables(groups, n, shuffled(need, g), kept)
    tables = {k: (st_[k], dt[k]) for k in st_}
    xp = kvc.GroupTransferPlan(plan, other)
    xp.reserve_runs(n)
    assert xp.tables.made == 1 and xp.tables.faulted >= 64 << 10
    runs = xp.token_runs(tables, n, 0, kept)
    assert xp.tables.made == 1  # planned in the reserved slab
    assert runs.untyped_storage().nbytes() <= xp.tables.faulted
    assert torch.equal(expanded(runs), xp.token_spans(tables, n, 0, kept))
    small = kvc.GroupTransferPlan(plan, other)
    monkeypatch.setattr(groups_mod, "RESERVE_BYTES", 128 << 10)
    small.reserve_runs(n)
    assert 0 < small.tables.faulted <= 128 << 10
    small.token_runs(tables, n)  # a larger table than reserved: a fresh slab
    assert small.tables.made == 2
    with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
        xp.reserve_runs(-1)


def test_group_token_runs_name_the_group_and_the_value_of_a_bad_argument():
    xp, t, tables = flash_request(300)
    with pytest.raises(ValueError, match=r"firsts\['swa0'\] must be an int >= 0 \(a token\), "
                                         r"got 236\.0"):
        xp.token_runs(tables, 300, 0, {"swa0": 236.0})
    with pytest.raises(TypeError, match=r"block_tables\['main'\] must be a \(src_block_table, "
                                        r"dst_block_table\) pair, got Tensor"):
        xp.token_runs(dict(tables, main=t["main"]), 300)
    short = dict(tables, swa0=(t["swa0"], t["swa0"][:4]))
    with pytest.raises(IndexError, match=r"block_tables\['swa0'\]\[1\] \(dst\) has 4 entries, "
                                         r"but 300 tokens span 5 blocks of 64"):
        xp.token_runs(short, 300)
