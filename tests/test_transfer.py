"""Transfer plans between any two plans (SPEC 8): every moved byte against an independent
per-token loop, nothing else in the destination touched, the fewest spans the plans allow."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from conftest import guarded
from transfer_oracle import (expected_dst, min_spans, min_spans_rows, moved_rows,
                             token_pairs_of_blocks, token_pairs_of_tables)

BLOCK_SIZES = [1, 2, 3, 4, 8]
HNC_LAYOUTS = [x for x in kvc.LAYOUTS if x.endswith("NC")]  # N right inside C: a page per head


# ---- random plan pairs ----------------------------------------------------------------------
@st.composite
def transfer_cases(draw):
    n_specs = draw(st.integers(1, 3))
    src_specs, dst_specs, layers, heads, names = [], [], {}, {}, []
    hnc_only = False  # a split spec with several heads needs a page per head
    for i in range(n_specs):
        name = f"s{i}"
        row = draw(st.integers(1, 9))
        sl, dl = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        split, major = None, None
        sh, dh = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        if row >= 2 and draw(st.booleans()):
            a = draw(st.integers(1, row - 1))
            split = (a, row - a)
            if draw(st.booleans()):  # the first part channel-major (vLLM CPU's K)
                major = draw(st.sampled_from([e for e in (1, 2, 3) if a % e == 0]))
            if draw(st.booleans()):
                sh = dh = 1
            hnc_only |= sh > 1 or dh > 1
        src_specs.append(kvc.CacheSpec(name, row, sl, sh, split=split, channel_major=major))
        dst_specs.append(kvc.CacheSpec(name, row, dl, dh, split=split, channel_major=major))
        for given_, src_n, dst_n in ((layers, sl, dl), (heads, sh, dh)):
            if src_n != dst_n or draw(st.booleans()):  # a range (PP stage / TP rank)
                count = draw(st.integers(1, min(src_n, dst_n)))
                given_[name] = (draw(st.integers(0, src_n - count)),
                                draw(st.integers(0, dst_n - count)), count)
        names.append(name)
    if draw(st.booleans()):  # the source holds a spec the destination does not
        src_specs.insert(draw(st.integers(0, len(src_specs))), kvc.CacheSpec("extra", 3, 2))
    moved = names if draw(st.booleans()) else draw(st.lists(st.sampled_from(names), min_size=1,
                                                            max_size=len(names), unique=True))
    layers = {k: v for k, v in layers.items() if k in moved}
    heads = {k: v for k, v in heads.items() if k in moved}
    by_blocks = draw(st.booleans())
    ns = draw(st.sampled_from(BLOCK_SIZES))
    nd = ns if by_blocks else draw(st.sampled_from(BLOCK_SIZES))
    return dict(src_specs=src_specs, dst_specs=dst_specs, moved=moved, layers=layers,
                heads=heads, by_blocks=by_blocks, ns=ns, nd=nd,
                src_layout=draw(st.sampled_from(HNC_LAYOUTS if hnc_only else kvc.LAYOUTS)),
                dst_layout=draw(st.sampled_from(HNC_LAYOUTS if hnc_only else kvc.LAYOUTS)),
                default_specs=moved == names, seed=draw(st.integers(0, 2**16)),
                num_tokens=draw(st.integers(0, 24)), src_start=draw(st.integers(0, 9)),
                dst_start=draw(st.integers(0, 9)), extra_blocks=draw(st.integers(0, 3)),
                num_pairs=draw(st.integers(0, 4)))


def run_case(c):
    g = torch.Generator().manual_seed(c["seed"])
    ns, nd = c["ns"], c["nd"]
    if c["by_blocks"]:
        m = c["num_pairs"]
        sbn, dbn = m + c["extra_blocks"] + 1, m + (c["seed"] % 3) + 1
    else:
        t = c["num_tokens"]
        s_need = -(-(c["src_start"] + t) // ns) if t else 0
        d_need = -(-(c["dst_start"] + t) // nd) if t else 0
        sbn, dbn = s_need + c["extra_blocks"] + 1, d_need + (c["seed"] % 3) + 1
    src_plan = kvc.plan_cache(c["src_specs"], sbn, ns, c["src_layout"])
    dst_plan = kvc.plan_cache(c["dst_specs"], dbn, nd, c["dst_layout"])
    xp = kvc.TransferPlan(src_plan, dst_plan, specs=None if c["default_specs"] else c["moved"],
                          layers=c["layers"] or None, heads=c["heads"] or None)
    if c["by_blocks"]:
        src_blocks = torch.randperm(sbn, generator=g)[:c["num_pairs"]]
        dst_blocks = torch.randperm(dbn, generator=g)[:c["num_pairs"]]
        pairs = torch.stack([src_blocks, dst_blocks], 1)
        spans = xp.block_spans(pairs)
        tokens = token_pairs_of_blocks(pairs.tolist(), ns)
    else:
        s_table = torch.randperm(sbn, generator=g).to(torch.int32)
        d_table = torch.randperm(dbn, generator=g).to(torch.int32)
        spans = xp.token_spans(s_table, d_table, c["num_tokens"], src_start=c["src_start"],
                               dst_start=c["dst_start"])
        tokens = token_pairs_of_tables(s_table, d_table, c["num_tokens"], c["src_start"],
                                       c["dst_start"], ns, nd)
    return src_plan, dst_plan, spans, moved_rows(src_plan, dst_plan, c["moved"], c["layers"],
                                                 c["heads"], tokens)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfer_cases())
def test_random_plan_pairs_move_exactly_the_rows(c):
    src_plan, dst_plan, spans, rows = run_case(c)
    src, dst = guarded(src_plan, seed=1), guarded(dst_plan, seed=2)  # random (poisoned) bytes
    stats = kvc.copy_spans(src.cache, dst.cache, spans)
    want = expected_dst(src.expected.buffer, dst.expected.buffer, rows)
    dst.expected.buffer.copy_(want)
    dst.assert_matches()  # every moved byte, every other byte and the guard bytes
    src.assert_matches()
    assert stats.bytes == sum(n for _, _, n in rows) and stats.event is None
    assert spans.shape[0] == stats.spans == min_spans(rows)  # the fewest the plans allow


# ---- the counts the model promises ------------------------------------------------------------
SEED = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)]


def seed_plan(layout, block_size=64, num_blocks=8, specs=SEED):
    return kvc.plan_cache(specs, num_blocks, block_size, layout)


@pytest.mark.parametrize("src,dst,want", [
    ("BLHNC", "BLHNC", 2), ("LBNHC", "LBNHC", 8), ("BLHNC", "LBNHC", 12), ("LBNHC", "BLHNC", 12)])
def test_seed_request_counts(src, dst, want):
    """The README's worked example: the seed request's blocks 0, 1, 5 into blocks 0, 1, 2."""
    xp = kvc.TransferPlan(seed_plan(src), seed_plan(dst))
    pairs = torch.tensor([[0, 0], [1, 1], [5, 2]])
    assert xp.block_spans(pairs).shape[0] == want
    table_s, table_d = torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([0, 1, 2],
                                                                                dtype=torch.int32)
    assert xp.token_spans(table_s, table_d, 192).shape[0] == want


def test_block_outer_runs_are_one_span_each():
    xp = kvc.TransferPlan(seed_plan("BLHNC", num_blocks=40), seed_plan("BHLNC", num_blocks=30))
    pairs = torch.tensor([[3, 10], [4, 11], [5, 12], [9, 0], [20, 1], [21, 2], [30, 29]])
    spans = xp.block_spans(pairs)
    block = 2 * 64 * (656 + 132)
    assert spans.tolist() == [[3 * block, 10 * block, 3 * block], [9 * block, 0, block],
                              [20 * block, block, 2 * block], [30 * block, 29 * block, block]]


DSV32 = [kvc.CacheSpec("mla", 656, 61), kvc.CacheSpec("indexer", 132, 61)]
BENCH_CASES = [("BLHNC", 64, "BLHNC", 64), ("LBNHC", 64, "LBNHC", 64), ("BLHNC", 64, "LBNHC", 64),
               ("BLHNC", 64, "BLHNC", 16)]


@pytest.mark.parametrize("case", BENCH_CASES, ids=lambda c: f"{c[0]}{c[1]}-{c[2]}{c[3]}")
def test_benchmark_requests_reach_the_minimum(case):
    """The benchmark's plans (DeepSeek-V3.2's 61 layers), a request on random block ids:
    the span count equals an independent count of the fewest spans."""
    sl, sn, dl, dn = case
    tokens = 640
    g = torch.Generator().manual_seed(3)
    src_plan = kvc.plan_cache(DSV32, 64, sn, sl)
    dst_plan = kvc.plan_cache(DSV32, 64 * 64 // dn, dn, dl)
    s_table = torch.randperm(src_plan.num_blocks, generator=g)[:tokens // sn].to(torch.int32)
    d_table = torch.randperm(dst_plan.num_blocks, generator=g)[:tokens // dn].to(torch.int32)
    spans = kvc.TransferPlan(src_plan, dst_plan).token_spans(s_table, d_table, tokens)
    rows = moved_rows(src_plan, dst_plan, ["mla", "indexer"], {}, {},
                      token_pairs_of_tables(s_table, d_table, tokens, 0, 0, sn, dn))
    assert spans.shape[0] == min_spans_rows(rows)
    assert int(spans[:, 2].sum()) == tokens * 61 * 788
    per_page = 2 * 61
    want = {("BLHNC", "BLHNC", 64): tokens // 64}.get((sl, dl, dn), tokens // min(sn, dn) * per_page)
    assert spans.shape[0] == want  # random blocks: nothing continues across blocks


def test_pp_stage_and_tp_rank_ranges():
    """A PP stage holds layers 2..4 of 6; a TP rank holds heads 4..7 of a GQA cache's 8."""
    full = kvc.plan_cache([kvc.CacheSpec("k", 32, 6, 8), kvc.CacheSpec("v", 32, 6, 8)], 4, 4,
                          "LBHNC")
    stage = kvc.plan_cache([kvc.CacheSpec("k", 32, 3, 4), kvc.CacheSpec("v", 32, 3, 4)], 4, 4,
                           "BLHNC")
    ranges = {"k": (2, 0, 3), "v": (2, 0, 3)}
    heads = {"k": (4, 0, 4), "v": (4, 0, 4)}
    xp = kvc.TransferPlan(full, stage, layers=ranges, heads=heads)
    src, dst = guarded(full, seed=5), guarded(stage, seed=6)
    spans = xp.block_spans(torch.tensor([[1, 2], [2, 3]]))
    kvc.copy_spans(src.cache, dst.cache, spans)
    for name in ("k", "v"):
        for i in range(3):
            got = dst.cache.view(name, i)[[2, 3]]
            assert torch.equal(got, src.cache.view(name, 2 + i)[[1, 2], 4:8])
    # LBHNC heads 4..7 of one block are contiguous (block 2's start with heads 0..3): one span
    # per (spec, layer, block)
    assert spans.shape[0] == 2 * 3 * 2 == min_spans(moved_rows(
        full, stage, ["k", "v"], ranges, heads, token_pairs_of_blocks([(1, 2), (2, 3)], 4)))


def test_split_pages_move_as_two_pieces():
    """A split indexer page (128 codes per token, then 4-byte scales) between block sizes:
    each token run moves as its codes and its scales, and the gathers agree."""
    specs = [kvc.CacheSpec("indexer", 132, 1, split=(128, 4))]
    src_plan = kvc.plan_cache(specs, 4, 64, "BLHNC")
    dst_plan = kvc.plan_cache(specs, 16, 16, "LBNHC")
    src, dst = kvc.allocate(src_plan, fill=0), kvc.allocate(dst_plan, fill=0)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(100, 128, generator=g).to(torch.bfloat16)
    s_table, d_table = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([9, 3, 12, 5, 1, 7, 8],
                                                                             dtype=torch.int32)
    slots = kvc.slot_mapping(s_table, torch.arange(100), 64)
    kvc.ops.indexer_k_quant_and_cache(k, src.view("indexer", 0), slots, placement="split")
    spans = kvc.TransferPlan(src_plan, dst_plan).token_spans(s_table, d_table, 100)
    assert spans.shape[0] == 2 * 7  # 7 runs of <= 16 tokens, codes and scales
    kvc.copy_spans(src, dst, spans)
    cu = torch.tensor([0, 100], dtype=torch.int32)
    want = kvc.ops.gather_indexer(src.view("indexer", 0), s_table[None], cu, placement="split")
    got = kvc.ops.gather_indexer(dst.view("indexer", 0), d_table[None], cu, placement="split")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("placement", ["row", "split"])
def test_dsa_request_round_trip_through_the_gathers(placement):
    """A DSA request BLHNC/64 -> LBNHC/16 and back, locally, checked through the gathers."""
    split = (128, 4) if placement == "split" else None
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2, split=split)]
    a_plan, b_plan = kvc.plan_cache(specs, 6, 64, "BLHNC"), kvc.plan_cache(specs, 24, 16, "LBNHC")
    a, b = kvc.allocate(a_plan, fill=0), kvc.allocate(b_plan, fill=0)
    tokens, g = 150, torch.Generator().manual_seed(1)
    a_table = torch.tensor([4, 1, 3], dtype=torch.int32)
    b_table = torch.randperm(24, generator=g)[:10].to(torch.int32)
    slots = kvc.slot_mapping(a_table, torch.arange(tokens), 64)
    for layer in range(2):
        kv_c = torch.randn(tokens, 512, generator=g).to(torch.bfloat16)
        k_pe = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
        k_idx = torch.randn(tokens, 128, generator=g).to(torch.bfloat16)
        kvc.ops.dsa_write(kv_c, k_pe, a.view("mla", layer), k_idx, a.view("indexer", layer),
                          slots, placement=placement)
    there = kvc.TransferPlan(a_plan, b_plan).token_spans(a_table, b_table, tokens)
    kvc.copy_spans(a, b, there)
    back_table = torch.tensor([0, 5, 2], dtype=torch.int32)
    back = kvc.TransferPlan(b_plan, a_plan).token_spans(b_table, back_table, tokens)
    kvc.copy_spans(b, a, back)
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    for layer in range(2):
        want = kvc.ops.gather_mla(a.view("mla", layer), a_table[None], cu)
        for cache, table in ((b, b_table), (a, back_table)):
            assert torch.equal(kvc.ops.gather_mla(cache.view("mla", layer), table[None], cu), want)
            got = kvc.ops.gather_indexer(cache.view("indexer", layer), table[None], cu,
                                         placement=placement)
            ref = kvc.ops.gather_indexer(a.view("indexer", layer), a_table[None], cu,
                                         placement=placement)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_token_spans_offsets_and_empty():
    src_plan, dst_plan = seed_plan("LBNHC", 4, 16), seed_plan("BLNHC", 8, 8)
    xp = kvc.TransferPlan(src_plan, dst_plan)
    t = torch.arange(8, dtype=torch.int32)
    assert xp.token_spans(t, t, 0).shape == (0, 3)
    spans = xp.token_spans(t.flip(0), t, 5, src_start=3, dst_start=6)
    # tokens 3..7 of blocks 7, 6 (block size 4) -> 6..10 of blocks 0, 1 (block size 8)
    rows = moved_rows(src_plan, dst_plan, ["mla", "indexer"], {}, {},
                      token_pairs_of_tables(t.flip(0), t, 5, 3, 6, 4, 8))
    assert spans.shape[0] == min_spans(rows)
    assert xp.bytes_per_token() == 2 * (656 + 132)


# ---- bad input --------------------------------------------------------------------------------
def test_incompatible_plans_are_refused():
    a = seed_plan("BLHNC")
    with pytest.raises(ValueError, match=r"'indexer' differs in row_bytes"):
        kvc.TransferPlan(a, kvc.plan_cache([SEED[0], kvc.CacheSpec("indexer", 128, 2)], 8, 64))
    with pytest.raises(ValueError, match=r"'indexer' differs in split"):
        kvc.TransferPlan(a, kvc.plan_cache([SEED[0], kvc.CacheSpec("indexer", 132, 2,
                                                                   split=(128, 4))], 8, 64))
    with pytest.raises(ValueError, match=r"'kv' is not in src_plan"):
        kvc.TransferPlan(a, kvc.plan_cache([kvc.CacheSpec("kv", 4)], 8, 64))
    with pytest.raises(ValueError, match=r"'mla' is not in dst_plan"):
        kvc.TransferPlan(a, kvc.plan_cache([SEED[1]], 8, 64), specs=["mla"])
    three = kvc.plan_cache([kvc.CacheSpec("mla", 656, 3), SEED[1]], 8, 64)
    with pytest.raises(ValueError, match=r"'mla' has 2 layers in src_plan and 3 in dst_plan"):
        kvc.TransferPlan(a, three)
    with pytest.raises(ValueError, match=r"layers\['mla'\] = \(1, 1, 2\) is outside src_plan"):
        kvc.TransferPlan(a, three, layers={"mla": (1, 1, 2)})
    with pytest.raises(ValueError, match=r"layers\['mla'\] = \(0, 2, 2\) is outside dst_plan"):
        kvc.TransferPlan(a, three, layers={"mla": (0, 2, 2)})
    with pytest.raises(ValueError, match=r"heads\['mla'\] = \(0, 0, 2\) is outside src_plan"):
        kvc.TransferPlan(a, a, heads={"mla": (0, 0, 2)})
    with pytest.raises(ValueError, match="count must be > 0"):
        kvc.TransferPlan(a, a, heads={"mla": (0, 0, 0)})
    with pytest.raises(ValueError, match="not moved"):
        kvc.TransferPlan(a, a, specs=["mla"], layers={"indexer": (0, 0, 1)})
    with pytest.raises(TypeError, match="src_plan"):
        kvc.TransferPlan("BLHNC", a)


def test_split_spec_is_checked():
    with pytest.raises(ValueError, match="add up to row_bytes = 132"):
        kvc.CacheSpec("indexer", 132, split=(128, 8))
    two_heads = kvc.CacheSpec("kv", 132, num_heads=2, split=(128, 4))  # a page per head:
    kvc.plan_cache([two_heads], 4, 16, "LBHNC")                           # only HNC layouts
    with pytest.raises(ValueError, match="each head's page must be contiguous, which LBNHC"):
        kvc.plan_cache([two_heads], 4, 16, "LBNHC")
    with pytest.raises(ValueError, match="channel_major = 3 needs a split whose first part"):
        kvc.CacheSpec("kv", 132, split=(128, 4), channel_major=3)
    with pytest.raises(ValueError, match="channel_major must be None or a positive int"):
        kvc.CacheSpec("kv", 132, split=(128, 4), channel_major=True)
    with pytest.raises(ValueError, match="two positive ints"):
        kvc.CacheSpec("indexer", 132, split=(132, 0))
    assert kvc.CacheSpec("i", 132, split=[128, 4]).split == (128, 4)


def test_tables_and_pairs_outside_the_plans():
    a, b = seed_plan("BLHNC", 64, 4), seed_plan("LBNHC", 16, 8)
    xp = kvc.TransferPlan(a, b)
    t = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    with pytest.raises(IndexError, match=r"src_block_table\[1\] = 9 is outside \[0, num_blocks = 4\)"):
        xp.token_spans(torch.tensor([0, 9], dtype=torch.int32), t, 100)
    with pytest.raises(IndexError, match=r"dst_block_table has 4 entries"):
        xp.token_spans(t, t, 100)
    with pytest.raises(IndexError, match=r"dst_block_table\[0\] = -1"):
        xp.token_spans(t, torch.tensor([-1] + list(range(9)), dtype=torch.int32), 10)
    with pytest.raises(ValueError, match="num_tokens must be an int >= 0"):
        xp.token_spans(t, t, -1)
    with pytest.raises(TypeError, match="src_block_table must be an int32"):
        xp.token_spans(t.float(), t, 1)
    with pytest.raises(ValueError, match="equal block sizes.*token_spans"):
        xp.block_spans(torch.tensor([[0, 0]]))
    same = kvc.TransferPlan(a, seed_plan("LBNHC", 64, 8))
    with pytest.raises(IndexError, match=r"block_pairs\[0, 1\] = 8: dst block ids"):
        same.block_spans(torch.tensor([[0, 8]]))
    with pytest.raises(IndexError, match=r"block_pairs\[1, 0\] = 4: src block ids"):
        same.block_spans(torch.tensor([[0, 1], [4, 2]]))
    with pytest.raises(ValueError, match="rows 0 and 2 both copy into block 3"):
        same.block_spans(torch.tensor([[0, 3], [1, 4], [2, 3]]))


def test_copy_spans_refuses_overlaps_and_bad_spans():
    plan = seed_plan("BLHNC", 64, 2)
    a, b = kvc.allocate(plan, fill=1), kvc.allocate(plan, fill=2)
    with pytest.raises(ValueError, match="overlapping"):
        kvc.copy_spans(a, b, torch.tensor([[0, 0, 8], [100, 4, 8]]))
    with pytest.raises(ValueError, match="reads"):
        kvc.copy_spans(a, a, torch.tensor([[0, 64, 8], [60, 1000, 8]]))
    with pytest.raises(IndexError):
        kvc.copy_spans(a, b, torch.tensor([[0, plan.total_bytes - 4, 8]]))
    with pytest.raises(ValueError, match=r"\[S, 3\]"):
        kvc.copy_spans(a, b, torch.tensor([0, 0, 8]))
    with pytest.raises(TypeError, match="KVCache"):
        kvc.copy_spans(a.buffer, b, torch.tensor([[0, 0, 8]]))
    assert bool((b.buffer == 2).all()) and bool((a.buffer == 1).all())
    # the Python checker (what NIXL transfers use) agrees with the op
    for spans, same, err in (([[0, 0, 8], [100, 4, 8]], False, ValueError),
                             ([[0, 64, 8], [60, 1000, 8]], True, ValueError),
                             ([[0, plan.total_bytes - 4, 8]], False, IndexError),
                             ([[0, 0, -1]], False, ValueError),
                             # start + length past 2^63 wraps negative: still refused by both
                             ([[2 ** 63 - 5, 0, 10]], False, IndexError),
                             ([[10, 10, 2 ** 63 - 5]], False, IndexError),
                             ([[0, 2 ** 63 - 5, 10]], False, IndexError)):
        with pytest.raises(err):
            kvc.check_spans(torch.tensor(spans), plan.total_bytes, plan.total_bytes, same)
        with pytest.raises(err):
            kvc.copy_spans(a, a if same else b, torch.tensor(spans))
    assert bool((b.buffer == 2).all()) and bool((a.buffer == 1).all())
    # empty spans are no copy for either, even inside another span's bytes
    empty = torch.tensor([[0, 0, 8], [4, 4, 0]])
    kvc.check_spans(empty, plan.total_bytes, plan.total_bytes, False)
    kvc.copy_spans(a, b, empty)
    kvc.check_spans(torch.tensor([[0, 64, 8], [72, 1000, 8]]), plan.total_bytes,
                    plan.total_bytes, True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_copies_record_an_event_and_keep_buffers():
    plan = seed_plan("BLHNC", 64, 4)
    host = kvc.allocate(plan, pin_memory=True, fill=7)
    dev = kvc.allocate(plan, device="cuda", fill=0)
    spans = kvc.TransferPlan(plan, plan).block_spans(torch.tensor([[0, 1], [2, 3]]))
    stats = kvc.copy_spans(host, dev, spans)
    assert isinstance(stats.event, torch.cuda.Event) and stats.buffers[0] is host.buffer
    stats.synchronize()
    assert stats.done() and bool((dev.buffer.view(4, -1)[[1, 3]] == 7).all())
    back = kvc.copy_blocks(dev, kvc.allocate(kvc.plan_cache(SEED, 5, 64, "LBNHC"), pin_memory=True,
                                             fill=0), torch.tensor([[1, 4]]))
    back.event.synchronize()
    assert back.spans == 4
