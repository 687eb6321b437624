"""Cache groups (SPEC 10): DeepSeek-V4 golden strides, packed views, compressed slot mapping."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache_ext as kvc
from kvcache_ext import reference as ref

BLOCK_OUTER = ("BLHNC", "BLNHC", "BHLNC")
PRESETS = [(m, mla, idx) for m in ("pro", "flash") for mla in ("fp8_ds_mla", "flashinfer_fp8")
           for idx in ("mxfp4", "fp8")]


# ---- golden numbers -------------------------------------------------------------------------

@pytest.mark.parametrize("layout", BLOCK_OUTER)
def test_v4_pro_golden_strides(layout):
    fp8 = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", mla="fp8_ds_mla", indexer="mxfp4"),
                         num_blocks=4, layout=layout)
    assert fp8.block_stride == 1_315_008 == 30 * 37_440 + 30 * 4_608 + 31 * 1_728
    assert fp8.total_bytes == 4 * 1_315_008
    fi = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro", mla="flashinfer_fp8",
                                                        indexer="mxfp4"),
                        num_blocks=4, layout=layout, packing="overlay")
    assert fi.block_stride == 1_228_800 == 30 * 32_768 + 30 * 8_192
    # the largest group: main in fp8_ds_mla, the C4 states in FlashInfer's layout
    assert max(fp8.groups, key=lambda g: g.block_bytes).name == "main"
    assert max(fi.groups, key=lambda g: g.block_bytes).name == "c4_states"


def test_v4_page_sizes_match_spec_table():
    pages = {(m, s.name): g.page_bytes(s) for m in ("fp8_ds_mla", "flashinfer_fp8")
             for g in kvc.presets.deepseek_v4("pro", mla=m) for s in g.specs}
    fp8, fi = "fp8_ds_mla", "flashinfer_fp8"
    assert pages[fp8, "c4_kv"] == pages[fp8, "swa0_kv"] == 37_440     # 64 x 584 = 37,376 -> 576k
    assert pages[fp8, "c128_kv"] == 1_728                              # 2 x 584 = 1,168
    assert pages[fp8, "c4_indexer"] == pages[fi, "c4_indexer"] == 4_608  # 64 x 68 = 4,352
    assert pages[fp8, "c4_state"] == pages[fp8, "c128_state"] == 32_832  # 32,768 padded
    assert pages[fp8, "c4_indexer_state"] == 8_640                     # 8,192 padded
    assert pages[fi, "c4_kv"] == 32_768 and pages[fi, "c128_kv"] == 1_024
    assert pages[fi, "c4_state"] == 32_768 and pages[fi, "c4_indexer_state"] == 8_192
    g = kvc.presets.deepseek_v4("pro", indexer="fp8")[0]
    assert g.page_bytes(g.specs[1]) == 8_640                           # 64 x 132 = 8,448
    main = kvc.presets.deepseek_v4("pro")[0]
    assert [(s.name, s.num_layers, main.rows(s)) for s in main.specs] == [
        ("c4_kv", 30, 64), ("c4_indexer", 30, 64), ("c128_kv", 31, 2)]
    assert main.specs[0].split == (576, 8) and main.specs[1].split == (64, 4)


def test_v4_stack_packing_is_not_the_pre_48993_history():
    """SPEC 10's 1,473,408 / 1,308,672 B (pages stacked by size, fp8 indexer) are history, not a
    target: this planner's "stack" (every group after the other) does not reproduce them."""
    for mla in ("fp8_ds_mla", "flashinfer_fp8"):
        groups = kvc.presets.deepseek_v4("pro", mla=mla, indexer="fp8")
        stack = kvc.plan_cache(groups=groups, num_blocks=1, layout="BLHNC", packing="stack")
        assert stack.block_stride == sum(g.block_bytes for g in groups)
        assert stack.block_stride not in (1_473_408, 1_308_672)


# ---- views: containment and non-overlap ----------------------------------------------------

def _view_extent(plan, name, layer, block):
    """[lo, hi) spanned by one (spec, layer)'s bytes in `block`, from the view's strides."""
    buf = torch.empty(plan.total_bytes, dtype=torch.uint8)
    v = plan.view(buf, name, layer)[block]
    lo = v.storage_offset()
    return lo, lo + sum((n - 1) * s for n, s in zip(v.shape, v.stride())) + 1


def _check_plan(plan, blocks=(0, -1)):
    """Every byte of every (spec, layer) view in `blocks` lies inside its group's region, and
    no byte belongs to two views of one group: contiguous views as intervals, strided ones
    (several heads interleaved) counted byte by byte through the views."""
    empty = torch.empty(plan.total_bytes, dtype=torch.uint8)
    for g in plan.groups:
        count = None
        intervals = []
        for s in g.specs:
            rows = plan.rows_per_block(s.name)
            for layer in range(s.num_layers):
                v = plan.view(empty, s.name, layer)
                for b in blocks:
                    b %= plan.num_blocks
                    lo = v[b].storage_offset()
                    assert plan.address(s.name, layer, b * rows) == lo
                    hi = lo + sum((n - 1) * st_ for n, st_ in zip(v.shape[1:], v.stride()[1:])) + 1
                    if plan.block_outer:
                        g_lo, g_hi = plan.group_region(g.name, b)
                        assert g_lo <= lo < hi <= g_hi, (g.name, s.name, layer, b)
                    if v[b].is_contiguous():
                        intervals.append((lo, hi))
                    else:
                        if count is None:
                            count = torch.zeros(plan.total_bytes, dtype=torch.uint8)
                        plan.view(count, s.name, layer)[b] += 1
        intervals = sorted(iv for iv in intervals if iv[1] > iv[0])
        for (a_lo, a_hi), (c_lo, c_hi) in zip(intervals, intervals[1:]):
            assert a_hi <= c_lo, (g.name, a_lo, c_lo)
        if count is not None:
            for lo, hi in intervals:
                if hi > lo:
                    count[lo:hi] += 1
            assert int(count.max()) == 1, g.name
    if plan.block_outer:
        assert max(g.block_bytes for g in plan.groups) <= plan.block_stride


@pytest.mark.parametrize("packing", ["overlay", "stack"])
@pytest.mark.parametrize("preset", PRESETS)
def test_v4_views_inside_group_and_disjoint(preset, packing):
    m, mla, idx = preset
    for layout in BLOCK_OUTER:
        _check_plan(kvc.plan_cache(groups=kvc.presets.deepseek_v4(m, mla=mla, indexer=idx),
                                   num_blocks=3, layout=layout, packing=packing))


def test_v4_stack_groups_disjoint_and_layer_outer():
    groups = kvc.presets.deepseek_v4("flash")
    stack = kvc.plan_cache(groups=groups, num_blocks=2, layout="BLNHC", packing="stack")
    regions = sorted(stack.group_region(g.name, 1) for g in groups)
    assert all(a[1] <= b[0] for a, b in zip(regions, regions[1:]))
    lo = kvc.plan_cache(groups=groups, num_blocks=2, layout="LBNHC", packing="stack")
    assert lo.total_bytes == stack.total_bytes
    ext = sorted(_view_extent(lo, s.name, i, b) for g in groups for s in g.specs
                 for i in range(s.num_layers) for b in (0, 1))
    assert all(a[1] <= b[0] for a, b in zip(ext, ext[1:]))
    with pytest.raises(ValueError, match="block-outer"):
        kvc.plan_cache(groups=groups, num_blocks=2, layout="LBNHC", packing="overlay")


def test_view_shape_and_address_count_rows():
    plan = kvc.plan_cache(groups=kvc.presets.deepseek_v4("pro"), num_blocks=5, layout="BLHNC")
    buf = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    v = plan.view(buf, "c128_kv", 7)
    assert v.shape == (5, 1, 2, 584) and v.stride() == (1_315_008, 1168, 584, 1)
    c4 = plan.tensor("c4_kv")
    assert (c4.offset, c4.layer_stride) == (0, 37_440)  # the padded page is the layer stride
    assert plan.tensor("c4_indexer").offset == 30 * 37_440
    assert plan.tensor("c128_kv").offset == 30 * 37_440 + 30 * 4_608
    # slot = block x rows + row; the 584-B rows are split pages (576, 8): row 1's byte 5 is at
    # 1 x 576 + 5 in its page, its scale bytes after both rows' data
    page = 30 * 37_440 + 30 * 4_608 + 7 * 1_728 + 3 * 1_315_008
    assert plan.address("c128_kv", 7, 3 * 2 + 1, byte=5) == page + 576 + 5
    assert plan.address("c128_kv", 7, 3 * 2 + 1, byte=577) == page + 2 * 576 + 8 + 1
    v[3, 0].reshape(-1)[576 + 5] = 9  # the page's bytes, through the view
    assert buf[plan.address("c128_kv", 7, 7, byte=5)] == 9
    with pytest.raises(IndexError, match="slot"):
        plan.address("c128_kv", 0, 10)
    assert kvc.allocate(plan).view("swa1_kv", 29).shape == (5, 1, 64, 584)


# ---- single-group plans are unchanged ------------------------------------------------------

@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_single_group_identical_to_spec_plan(layout):
    specs = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2),
             kvc.CacheSpec("k", 256, 3, 4)]
    old = kvc.plan_cache(specs, num_blocks=7, block_size=64, layout=layout)
    for packing in ("overlay", "stack"):
        new = kvc.plan_cache(groups=[kvc.CacheGroup("g", specs, 64)], num_blocks=7,
                             layout=layout, packing=packing)
        assert new.total_bytes == old.total_bytes and new.block_stride == old.block_stride
        assert new.tensors == old.tensors
        assert new.block_pages() == old.block_pages()
        for s in specs:
            for i in range(s.num_layers):
                assert new.address(s.name, i, 200, head=s.num_heads - 1, byte=3) == \
                    old.address(s.name, i, 200, head=s.num_heads - 1, byte=3)


def test_seed_example_and_errors():
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)],
                          num_blocks=8, block_size=64, layout="BLHNC")
    assert plan.block_stride == 100_864 and plan.address("mla", 1, 322) == 547_616
    with pytest.raises(ValueError, match="CacheGroup"):
        kvc.plan_cache([kvc.CacheSpec("c", 584, compress_ratio=4)], num_blocks=1, block_size=64)
    with pytest.raises(ValueError, match="compress_ratio"):
        kvc.CacheGroup("g", [kvc.CacheSpec("c", 584, compress_ratio=3)], 64)
    with pytest.raises(ValueError, match="unique"):
        kvc.plan_cache(groups=[kvc.CacheGroup("g", [kvc.CacheSpec("a", 4)], 4),
                               kvc.CacheGroup("h", [kvc.CacheSpec("a", 4)], 8)], num_blocks=1)
    with pytest.raises(ValueError, match="packing"):
        kvc.plan_cache(groups=[kvc.CacheGroup("g", [kvc.CacheSpec("a", 4)], 4)], num_blocks=1,
                       packing="tight")
    with pytest.raises(ValueError, match="page_align"):
        kvc.CacheSpec("a", 4, num_heads=2, page_align=512)


# ---- compressed slot mapping ---------------------------------------------------------------

def _slots_loop(bt, positions, reqs, block_size, ratio):
    out = []
    rows = block_size // ratio
    for p, r in zip(positions.tolist(), reqs.tolist()):
        if (p + 1) % ratio:
            out.append(-1)
            continue
        cpos = p // ratio
        b = int(bt[r, cpos // rows])
        out.append(-1 if b < 0 else b * rows + cpos % rows)
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_compressed_slot_mapping_prefill_and_decode(ratio):
    g = torch.Generator().manual_seed(ratio)
    bt = torch.randperm(64, generator=g).to(torch.int32).reshape(4, 16)
    bt[3, 5] = -1
    # prefill: requests of different lengths, all their positions
    lens = [700, 1, 256, 1500]
    pos = torch.cat([torch.arange(n) for n in lens])
    reqs = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])
    got = kvc.slot_mapping(bt, pos, 256, reqs, compress_ratio=ratio)
    assert torch.equal(got, _slots_loop(bt, pos, reqs, 256, ratio))
    # decode: one token per request at its current position
    pos = torch.tensor([3, 127, 255, 1279 + 64])
    reqs = torch.arange(4)
    got = kvc.slot_mapping(bt, pos, 256, reqs, compress_ratio=ratio)
    assert torch.equal(got, _slots_loop(bt, pos, reqs, 256, ratio))
    if ratio == 1:
        assert torch.equal(got, kvc.slot_mapping(bt, pos, 256, reqs))
    with pytest.raises(ValueError, match="multiple"):
        kvc.slot_mapping(bt, pos, 256, reqs, compress_ratio=3)


@pytest.mark.parametrize("placement", ["row", "split"])
def test_fused_writes_take_compressed_slots(placement):
    """A V3.2-row DSA pair stored at ratio 4 in a 256-token group: dsa_write with compressed
    slots writes exactly the rows a per-token loop of the reference writes."""
    split = (128, 4) if placement == "split" else None
    group = kvc.CacheGroup("main", [kvc.CacheSpec("mla", 656, 2, compress_ratio=4, page_align=576),
                                    kvc.CacheSpec("indexer", 132, 2, split=split,
                                                  compress_ratio=4, page_align=576)], 256)
    plan = kvc.plan_cache(groups=[group, kvc.CacheGroup("swa", [kvc.CacheSpec("s", 584)], 64)],
                          num_blocks=6, layout="BLHNC")
    got, want = kvc.allocate(plan, fill=0), kvc.allocate(plan, fill=0)
    bt = torch.tensor([[4, 1, 3], [0, 5, 2]], dtype=torch.int32)
    pos = torch.cat([torch.arange(600), torch.tensor([255])])  # prefill of req 0, decode of 1
    reqs = torch.cat([torch.zeros(600, dtype=torch.int64), torch.ones(1, dtype=torch.int64)])
    slots = kvc.slot_mapping(bt, pos, 256, reqs, compress_ratio=4)
    g = torch.Generator().manual_seed(0)
    kv_c, k_pe, k = (torch.randn(len(pos), n, generator=g).to(torch.bfloat16)
                     for n in (512, 64, 128))
    kvc.ops.dsa_write(kv_c, k_pe, got.view("mla", 1), k, got.view("indexer", 1), slots,
                      scale_fmt="ue8m0", placement=placement)
    for t in range(len(pos)):
        s = _slots_loop(bt, pos[t:t + 1], reqs[t:t + 1], 256, 4)
        if int(s) >= 0:
            ref.dsa_write(kv_c[t:t + 1], k_pe[t:t + 1], want.view("mla", 1), k[t:t + 1],
                          want.view("indexer", 1), s, "fp8_ds_mla", "ue8m0", placement)
    assert int((slots >= 0).sum()) == 151
    assert torch.equal(got.buffer, want.buffer)


# ---- property tests ------------------------------------------------------------------------

@st.composite
def group_lists(draw):
    groups, n = [], 0
    for gi in range(draw(st.integers(1, 4))):
        bs = draw(st.sampled_from([4, 8, 16, 64, 256]))
        specs = []
        for _ in range(draw(st.integers(1, 3))):
            n += 1
            ratio = draw(st.sampled_from([r for r in (1, 2, 4, 128) if bs % r == 0]))
            heads = draw(st.sampled_from([1, 1, 2]))
            specs.append(kvc.CacheSpec(f"s{n}", draw(st.integers(1, 700)), draw(st.integers(1, 3)),
                                       heads, compress_ratio=ratio,
                                       page_align=draw(st.sampled_from([1, 512, 576]))
                                       if heads == 1 else 1))
        groups.append(kvc.CacheGroup(f"g{gi}", specs, bs))
    return groups


@settings(max_examples=60, deadline=None)
@given(group_lists(), st.sampled_from(kvc.LAYOUTS), st.sampled_from(["overlay", "stack"]),
       st.integers(1, 3))
def test_property_random_groups(groups, layout, packing, num_blocks):
    if layout[0] == "L" and packing == "overlay" and len(groups) > 1:
        with pytest.raises(ValueError, match="block-outer"):
            kvc.plan_cache(groups=groups, num_blocks=num_blocks, layout=layout, packing=packing)
        return
    plan = kvc.plan_cache(groups=groups, num_blocks=num_blocks, layout=layout, packing=packing)
    sizes = [g.block_bytes for g in groups]
    assert plan.block_stride == (max(sizes) if packing == "overlay" else sum(sizes))
    if layout[0] == "L":  # layer-outer: every spec its own tensor, no byte shared by two views
        count = torch.zeros(plan.total_bytes, dtype=torch.uint8)
        for s in plan.specs:
            for layer in range(s.num_layers):
                plan.view(count, s.name, layer).add_(1)
        assert int(count.max()) == 1
    assert plan.total_bytes == num_blocks * plan.block_stride
    _check_plan(plan, blocks=range(num_blocks))
    # every byte written through a view lands where plan.address says
    buf = torch.zeros(plan.total_bytes, dtype=torch.uint8)
    for s in plan.specs:
        rows = plan.rows_per_block(s.name)
        for layer, slot in itertools.product((0, s.num_layers - 1), (0, num_blocks * rows - 1)):
            b, r = divmod(slot, rows)
            v = plan.view(buf, s.name, layer)
            v[b, s.num_heads - 1, r, s.row_bytes - 1] = 7
            a = plan.address(s.name, layer, slot, s.num_heads - 1, s.row_bytes - 1)
            assert buf[a] == 7
            buf[a] = 0


# ---- capacity and CLI ------------------------------------------------------------------------

def test_capacity_v4_against_v32():
    from kvcache_ext import capacity as cap
    pro = kvc.presets.deepseek_v4("pro")
    usage = {u.name: u for u in cap.group_usage(pro)}
    assert usage["main"].bytes_per_token == 30 * 584 / 4 + 30 * 68 / 4 + 31 * 584 / 128
    assert usage["main"].padded_bytes_per_token == 1_315_008 / 256
    assert usage["c4_states"].block_bytes == 30 * 32_832 + 30 * 8_640
    pool = cap.group_pool_for_budget(pro, 80 * 2**30, 131072)
    assert pool.block_stride == 1_315_008 and pool.num_blocks == 80 * 2**30 // 1_315_008
    # main: every token; SWA (64-token blocks, window 128): 2 blocks; C4 states (4, window 8):
    # 2; C128 states (8, window 128): 16
    assert pool.blocks_per_request == {"main": 512, "swa0": 2, "swa1": 2, "c4_states": 2,
                                       "c128_states": 16}
    assert pool.requests == pool.num_blocks // 534
    assert kvc.CacheGroup("w", [kvc.CacheSpec("a", 1)], 64, window=128).blocks_for(130) == 3
    v32 = cap.bytes_per_token(kvc.presets.preset("deepseek-v3.2").specs)
    assert v32 == 61 * (656 + 132) > 8.9 * 534 * 1_315_008 / 131072
    # a PP stage holds its share of every kind's layers
    stage = {s.name: s.num_layers for g in cap.rank_groups(pro, 4) for s in g.specs}
    assert stage["c4_kv"] == 8 and stage["c128_kv"] == 8 and stage["swa0_kv"] == 8
    assert [s.num_layers for g in cap.rank_groups(pro, 1) for s in g.specs] == \
        [s.num_layers for g in pro for s in g.specs]


def test_cli_v4_capacity_and_layout(tmp_path, capsys):
    from kvcache_ext.cli import main
    assert main(["capacity", "--model", "deepseek-v4-pro", "--tokens", "131072"]) == 0
    out = capsys.readouterr().out
    assert "block stride 1315008 B" in out and "DeepSeek-V3.2" in out
    assert main(["capacity", "--model", "deepseek-v4-flash", "--layers", "2"]) == 2
    assert "cannot be combined" in capsys.readouterr().err
    # --pp: the largest stage of each kind (vLLM's split: the first stage is the smaller one)
    assert main(["capacity", "--model", "deepseek-v4-pro", "--pp", "2"]) == 0
    out = capsys.readouterr().out
    assert "c4_kv 15, c4_indexer 15, c128_kv 16" in out and "31 layers, block 64" in out
    stride = (15 * 37_440 + 15 * 4_608 + 16 * 1_728)          # group 0 is still the largest
    assert f"block stride {stride} B" in out
    assert main(["capacity", "--model", "deepseek-v4-flash", "--pp", "64"]) == 2
    assert "pp (64) must not exceed num_layers (21)" in capsys.readouterr().err
    svg = tmp_path / "slab.svg"
    assert main(["layout", "--preset", "deepseek-v4-pro", "--mla", "flashinfer_fp8",
                 "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "1228800 bytes (block stride)" in out and "c4_indexer_state" in out
    text = svg.read_text()
    assert "block stride 1,228,800 B" in text
    # one cell per (spec, layer) of every group
    groups = kvc.presets.deepseek_v4("pro", mla="flashinfer_fp8")
    assert text.count('class="cell"') == sum(s.num_layers for g in groups for s in g.specs)
    assert main(["layout", "--preset", "deepseek-v4-pro", "--layout", "LBNHC"]) == 2
    assert "block-outer" in capsys.readouterr().err


# ---- transfers between group plans -----------------------------------------------------------

def window_firsts(groups, num_tokens: int) -> dict[str, int]:
    """Each windowed group's first kept token by the window rule, as whole blocks."""
    return {g.name: max(num_tokens - g.window, 0) // g.block_size * g.block_size
            for g in groups if g.window is not None}


def request_tables(groups, num_tokens: int, free: list[int],
                   kept: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Each group's own block table for one request, its blocks popped from `free` (distinct
    blocks: overlay gives a block to one group; requests drawing from one list get disjoint
    ones); a windowed group: -1 before the block of its first kept token (kept, default the
    window rule)."""
    kept = window_firsts(groups, num_tokens) if kept is None else kept
    out = {}
    for grp in groups:
        n = -(-num_tokens // grp.block_size)
        first = kept.get(grp.name, 0) // grp.block_size
        out[grp.name] = torch.tensor([-1] * first + [free.pop() for _ in range(n - first)],
                                     dtype=torch.int32)
    return out


def shuffled(num_blocks: int, g: torch.Generator) -> list[int]:
    """Block ids 0 .. num_blocks - 1 in a random order: a free list for request_tables."""
    return torch.randperm(num_blocks, generator=g).tolist()


def _tables(groups, num_tokens, num_blocks, seed):
    """request_tables from a seeded free list of num_blocks blocks, windows by the rule."""
    return request_tables(groups, num_tokens,
                          shuffled(num_blocks, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("start", [0, 256, 700])
def test_group_token_spans_past_a_prefix_hit_from_given_firsts(start):
    """start: the tokens the destination holds (row k of ratio r moves when k·r + r - 1 >=
    start); firsts: a windowed group's first token held, in place of its window rule (vLLM
    keeps whole blocks). The bytes moved are exactly those rows'."""
    groups = kvc.presets.deepseek_v4("flash")
    src = kvc.plan_cache(groups=groups, num_blocks=400, layout="BLHNC")
    dst = kvc.plan_cache(groups=groups, num_blocks=420, layout="BLNHC", packing="stack")
    n = 700
    st_, dt = _tables(groups, n, 400, 3), _tables(groups, n, 420, 4)
    firsts = {g.name: max(n - g.window, 0) // g.block_size * g.block_size
              for g in groups if g.window is not None}
    xp = kvc.GroupTransferPlan(src, dst)
    spans = xp.token_spans({k: (st_[k], dt[k]) for k in st_}, n, start, firsts)
    want = sum((n // s.compress_ratio - max(firsts.get(g.name, 0), start) // s.compress_ratio)
               * s.row_bytes * s.num_layers for g in groups for s in g.specs)
    assert int(spans[:, 2].sum()) == want
    with pytest.raises(ValueError, match=r"start must be an int in \[0, num_tokens = 700\]"):
        xp.token_spans({k: (st_[k], dt[k]) for k in st_}, n, 701)
    with pytest.raises(ValueError, match=r"firsts names groups that are not moved: \['nope'\]"):
        xp.token_spans({k: (st_[k], dt[k]) for k in st_}, n, 0, {"nope": 0})


@pytest.mark.parametrize("num_tokens", [1, 300, 1000])
def test_group_token_spans_move_live_rows(num_tokens):
    groups = kvc.presets.deepseek_v4("flash")
    src = kvc.plan_cache(groups=groups, num_blocks=40, layout="BLHNC")
    dst = kvc.plan_cache(groups=groups, num_blocks=36, layout="BLNHC", packing="stack")
    st_, dt = _tables(groups, num_tokens, 40, 1), _tables(groups, num_tokens, 36, 2)
    xp = kvc.GroupTransferPlan(src, dst)
    spans = xp.token_spans({k: (st_[k], dt[k]) for k in st_}, num_tokens)
    a = kvc.allocate(src)
    a.buffer.copy_(torch.randint(0, 256, (src.total_bytes,), dtype=torch.uint8))
    b = kvc.allocate(dst, fill=0)
    kvc.copy_spans(a, b, spans)
    moved = 0
    for grp in groups:
        for s in grp.specs:
            first, end = xp.live_rows(grp.name, s.compress_ratio, num_tokens)
            rows = grp.rows(s)
            for layer in (0, s.num_layers - 1):
                va, vb = a.view(s.name, layer), b.view(s.name, layer)
                for row in range(first, end):
                    blk, r = divmod(row, rows)
                    sb, db = int(st_[grp.name][blk]), int(dt[grp.name][blk])
                    if s.split is None:
                        assert torch.equal(va[sb, :, r], vb[db, :, r])
                    else:  # a split page: [rows x a][rows x b], compared as bytes
                        pa, pb = va[sb, 0].reshape(-1), vb[db, 0].reshape(-1)
                        x, y = s.split
                        assert torch.equal(pa[r * x:(r + 1) * x], pb[r * x:(r + 1) * x])
                        assert torch.equal(pa[rows * x + r * y:rows * x + (r + 1) * y],
                                           pb[rows * x + r * y:rows * x + (r + 1) * y])
            moved += (end - first) * s.row_bytes * s.num_layers
    assert int(spans[:, 2].sum()) == moved  # nothing but the live rows moves
    # windowed groups touch only the blocks of their window
    swa = dst.group("swa0")
    live = {int(x) for x in dt["swa0"] if int(x) >= 0}
    stride = dst.block_stride
    lo, hi = dst.group_region("swa0", 0)
    in_swa = (spans[:, 1] % stride >= lo) & (spans[:, 1] % stride < hi)
    assert {int(x) // stride for x in spans[in_swa, 1]} <= live
    assert len(live) <= 3 and swa.window == 128


def test_group_block_spans_whole_blocks():
    groups = kvc.presets.deepseek_v4("pro")
    src = kvc.plan_cache(groups=groups, num_blocks=6, layout="BLHNC")
    dst = kvc.plan_cache(groups=groups, num_blocks=8, layout="BLHNC")
    xp = kvc.GroupTransferPlan(src, dst)
    pairs = {"main": torch.tensor([[0, 3], [1, 4]]), "c4_states": torch.tensor([[5, 0]])}
    spans = xp.block_spans(pairs)
    # every page's rows move, its padding does not (37,376 of a 37,440-B page)
    main = 30 * 64 * 584 + 30 * 64 * 68 + 31 * 2 * 584
    assert int(spans[:, 2].sum()) == 2 * main + 30 * 4 * 8192 + 30 * 4 * 2048
    with pytest.raises(TypeError, match="GroupPlan"):
        kvc.GroupTransferPlan(kvc.plan_cache([kvc.CacheSpec("a", 4)], 1, 4), dst)


def test_transfer_plan_of_group_plans_is_their_group_transfer_plan():
    groups = kvc.presets.deepseek_v4("flash")
    plan = kvc.plan_cache(groups=groups, num_blocks=2, layout="BLHNC")
    other = kvc.plan_cache(groups=groups, num_blocks=3, layout="BLNHC", packing="stack")
    xp = kvc.plan_transfer(plan, other, specs=["main", "swa0"])
    assert isinstance(xp, kvc.GroupTransferPlan) and list(xp.moves) == ["main", "swa0"]
    pairs = {"main": torch.tensor([[0, 2]])}
    assert torch.equal(xp.block_spans(pairs), kvc.GroupTransferPlan(plan, other).block_spans(pairs))
    with pytest.raises(TypeError, match="GroupTransferPlan"):  # one group plan, one spec plan
        kvc.TransferPlan(plan, kvc.plan_cache([kvc.CacheSpec("a", 4)], 1, 4))
    with pytest.raises(ValueError, match="layers= and heads= apply to CachePlans"):
        kvc.plan_transfer(plan, other, layers={"c4_kv": (0, 0, 1)})
    with pytest.raises(TypeError, match="plan_transfer"):  # no constructor returns another class
        kvc.TransferPlan(plan, other)
    # windows decide which rows are live: the two plans must agree on them
    shorter = [g if g.name != "swa0" else kvc.CacheGroup(g.name, g.specs, g.block_size, window=64)
               for g in groups]
    with pytest.raises(ValueError, match="keeps the last 128 tokens in src_plan and the last 64"):
        kvc.GroupTransferPlan(plan, kvc.plan_cache(groups=shorter, num_blocks=2, layout="BLHNC"))


def test_group_transfer_arguments_are_taken_as_named():
    """One group name is one group (as specs= of a CachePlan transfer); a table for a group that
    is not moved, or whole blocks between unequal group block sizes, are refused by name."""
    groups = kvc.presets.deepseek_v4("flash")
    plan = kvc.plan_cache(groups=groups, num_blocks=2, layout="BLHNC")
    assert list(kvc.plan_transfer(plan, plan, specs="main").moves) == ["main"]
    assert list(kvc.GroupTransferPlan(plan, plan, groups="swa0").moves) == ["swa0"]
    with pytest.raises(ValueError, match="groups must name each group once"):
        kvc.GroupTransferPlan(plan, plan, groups=["main", "main"])
    a, b = kvc.allocate(plan, fill=1), kvc.allocate(plan, fill=2)
    assert kvc.copy_blocks(a, b, {}).blocks == 0 and bool((b.buffer == 2).all())  # nothing to copy
    xp = kvc.GroupTransferPlan(plan, plan, groups=["main"])
    t = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"block_tables names groups that are not moved: \['swa0'\]"):
        xp.token_spans({"main": (t, t), "swa0": (t, t)}, 30)
    wide = [g if g.name != "main" else kvc.CacheGroup(g.name, g.specs, 2 * g.block_size) for g in groups]
    other = kvc.plan_cache(groups=wide, num_blocks=2, layout="BLHNC")
    with pytest.raises(ValueError, match=r"group 'main' has 256 tokens per block in src_plan and "
                                         r"512 in dst_plan: move tokens with GroupTransferPlan\.token_spans"):
        kvc.GroupTransferPlan(plan, other, groups="main").block_spans({"main": torch.tensor([[0, 1]])})
    src, dst = kvc.allocate(plan, fill=1), kvc.allocate(other, fill=2)
    with pytest.raises(ValueError, match="256 tokens per block in src_plan"):
        kvc.copy_blocks(src, dst, {"main": torch.tensor([[0, 1]])})
    assert bool((dst.buffer == 2).all())
    # tokens move between the two block sizes
    spans = kvc.GroupTransferPlan(plan, other, groups="main").token_spans({"main": (t, t)}, 100)
    assert int(spans[:, 2].sum()) > 0


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([(4, 1), (4, 4), (8, 2), (64, 1), (256, 4), (256, 128)]),
       st.integers(1, 3), st.integers(1, 5), st.data())
def test_property_compressed_slot_mapping(bs_ratio, num_reqs, width, data):
    block_size, ratio = bs_ratio
    bt = torch.tensor(data.draw(st.lists(st.lists(st.integers(-1, 50), min_size=width,
                                                  max_size=width),
                                         min_size=num_reqs, max_size=num_reqs)),
                      dtype=torch.int32)
    n = data.draw(st.integers(0, 40))
    pos = torch.tensor(data.draw(st.lists(st.integers(0, width * block_size - 1), min_size=n,
                                          max_size=n)), dtype=torch.int64)
    reqs = torch.tensor(data.draw(st.lists(st.integers(0, num_reqs - 1), min_size=n,
                                           max_size=n)), dtype=torch.int64)
    got = kvc.slot_mapping(bt, pos, block_size, reqs, compress_ratio=ratio)
    assert torch.equal(got, _slots_loop(bt, pos, reqs, block_size, ratio))
