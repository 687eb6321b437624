"""Layout planner: the seed's worked example, exact tiling of the buffer, address == view."""
from __future__ import annotations

import itertools

import pytest
import torch

import kvcache_ext as kvc

SEED_SPECS = [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 2)]


def test_layouts_constant():
    assert kvc.LAYOUTS == ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
    assert kvc.layout_order("LBNHC") == (0, 1, 3, 2, 4)
    assert kvc.layout_order("BHLNC") == (1, 2, 0, 3, 4)


def test_seed_example_block_outer():
    plan = kvc.plan_cache(SEED_SPECS, num_blocks=8, block_size=64, layout="BLHNC")
    mla, idx = plan.tensor("mla"), plan.tensor("indexer")
    assert (mla.offset, mla.layer_stride, mla.block_stride, mla.row_bytes) == (0, 41984, 100864, 656)
    assert (idx.offset, idx.layer_stride, idx.block_stride, idx.row_bytes) == (83968, 8448, 100864, 132)
    assert plan.total_bytes == 8 * 100864 == mla.size == idx.size
    assert mla.layers == ["mla.0", "mla.1"]
    bt = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    slot = int(kvc.slot_mapping(bt, torch.tensor([130]), 64)[0])
    assert slot == 322
    assert plan.address("mla", 1, slot) == 547616
    assert plan.address("indexer", 1, slot) == 597000


@pytest.mark.parametrize("n", [1, 7, 100])
def test_seed_example_layer_outer(n):
    plan = kvc.plan_cache(SEED_SPECS, num_blocks=n, block_size=64, layout="LBNHC")
    mla, idx = plan.tensor("mla"), plan.tensor("indexer")
    assert (mla.offset, mla.layer_stride, mla.block_stride) == (0, 41984 * n, 41984)
    assert (idx.offset, idx.layer_stride, idx.block_stride) == (83968 * n, 8448 * n, 8448)


SPEC_MIXES = [
    [kvc.CacheSpec("kv", 256, 3, 1)],
    [kvc.CacheSpec("k", 64, 2, 4), kvc.CacheSpec("v", 48, 2, 4)],
    [kvc.CacheSpec("mla", 656, 2), kvc.CacheSpec("indexer", 132, 3)],
    [kvc.CacheSpec("a", 5, 3, 2), kvc.CacheSpec("b", 3, 1, 3), kvc.CacheSpec("c", 7, 2, 1)],
]


def owner_map(plan: kvc.CachePlan) -> torch.Tensor:
    """For every byte of the buffer: how many (spec, layer, block, head, token, byte) own it."""
    counts = torch.zeros(plan.total_bytes, dtype=torch.int32)
    for s in plan.specs:
        t = plan.tensor(s.name)
        idx = torch.arange(plan.total_bytes, dtype=torch.int64)
        for layer in range(s.num_layers):
            v = torch.as_strided(idx, (plan.num_blocks, s.num_heads, plan.block_size, s.row_bytes),
                                 (t.block_stride, t.head_stride, t.token_stride, 1),
                                 t.offset + layer * t.layer_stride)
            counts.index_add_(0, v.reshape(-1), torch.ones(v.numel(), dtype=torch.int32))
    return counts


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("mix", range(len(SPEC_MIXES)))
@pytest.mark.parametrize("block_size,num_blocks", [(1, 5), (4, 3), (16, 2)])
def test_views_tile_the_buffer(layout, mix, block_size, num_blocks):
    plan = kvc.plan_cache(SPEC_MIXES[mix], num_blocks=num_blocks, block_size=block_size,
                          layout=layout)
    assert plan.total_bytes == num_blocks * block_size * sum(
        s.num_layers * s.num_heads * s.row_bytes for s in plan.specs)
    counts = owner_map(plan)
    assert int(counts.min()) == 1 and int(counts.max()) == 1


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("mix", range(len(SPEC_MIXES)))
def test_address_agrees_with_view(layout, mix):
    plan = kvc.plan_cache(SPEC_MIXES[mix], num_blocks=3, block_size=4, layout=layout)
    cache = kvc.allocate(plan)
    # Each byte holds its own address (mod 251 keeps distinct neighbours distinct).
    cache.buffer.copy_(torch.arange(plan.total_bytes) % 251)
    for s in plan.specs:
        for layer, slot, head in itertools.product(range(s.num_layers), range(plan.num_slots),
                                                   range(s.num_heads)):
            for byte in {0, s.row_bytes - 1}:
                a = plan.address(s.name, layer, slot, head, byte)
                v = cache.view(s.name, layer)
                assert int(v[slot // 4, head, slot % 4, byte]) == a % 251
                assert v.data_ptr() + v.stride(0) * (slot // 4) + v.stride(1) * head + \
                    v.stride(2) * (slot % 4) + byte == cache.buffer.data_ptr() + a


def test_table_strides_for_heads():
    s = kvc.CacheSpec("x", 10, num_layers=2, num_heads=3)
    n, b = 4, 5
    cases = {
        "LBHNC": (b * 3 * n * 10, 3 * n * 10, n * 10, 10),
        "LBNHC": (b * n * 3 * 10, n * 3 * 10, 10, 3 * 10),
        "LHBNC": (3 * b * n * 10, n * 10, b * n * 10, 10),
        "BLHNC": (3 * n * 10, 2 * 3 * n * 10, n * 10, 10),
        "BLNHC": (n * 3 * 10, 2 * 3 * n * 10, 10, 3 * 10),
        "BHLNC": (n * 10, 2 * 3 * n * 10, 2 * n * 10, 10),
    }
    for layout, want in cases.items():
        t = kvc.plan_cache([s], num_blocks=b, block_size=n, layout=layout).tensor("x")
        assert (t.layer_stride, t.block_stride, t.head_stride, t.token_stride) == want, layout


@pytest.mark.gpu  # pinned host memory where there is a GPU
@pytest.mark.parametrize("layout", kvc.LAYOUTS)
def test_view_shape_and_devices(layout):
    plan = kvc.plan_cache(SPEC_MIXES[1], num_blocks=3, block_size=4, layout=layout)
    cache = kvc.allocate(plan, device="cpu", pin_memory=torch.cuda.is_available())
    v = cache.view("k", 1)
    assert v.shape == (3, 4, 4, 64) and v.dtype == torch.uint8
    assert cache.buffer.numel() == plan.total_bytes


def test_bad_arguments():
    spec = kvc.CacheSpec("a", 8)
    with pytest.raises(ValueError, match="layout"):
        kvc.plan_cache([spec], 4, 16, layout="BNLHC")
    with pytest.raises(ValueError, match="num_blocks"):
        kvc.plan_cache([spec], 0, 16)
    with pytest.raises(ValueError, match="block_size"):
        kvc.plan_cache([spec], 4, -1)
    with pytest.raises(ValueError, match="unique"):
        kvc.plan_cache([spec, kvc.CacheSpec("a", 4)], 4, 16)
    with pytest.raises(ValueError, match="specs"):
        kvc.plan_cache([], 4, 16)
    for bad in ({"row_bytes": 0}, {"num_layers": -2}, {"num_heads": 0}, {"name": ""}):
        with pytest.raises(ValueError):
            kvc.CacheSpec(**({"name": "x", "row_bytes": 4} | bad))
    plan = kvc.plan_cache([spec], 4, 16)
    with pytest.raises(KeyError, match="no spec"):
        plan.tensor("b")
    with pytest.raises(IndexError, match="slot"):
        plan.address("a", 0, 64)
    with pytest.raises(IndexError, match="layer"):
        plan.address("a", 1, 0)
    with pytest.raises(ValueError, match="pin_memory"):
        kvc.allocate(plan, device="meta", pin_memory=True)


def test_slot_mapping():
    bt = torch.tensor([[2, 0, 1], [4, 3, 5]], dtype=torch.int32)
    pos = torch.tensor([0, 5, 9, 3, 4])
    req = torch.tensor([0, 0, 0, 1, 1])
    got = kvc.slot_mapping(bt, pos, 4, req)
    assert got.dtype == torch.int64
    assert got.tolist() == [8, 1, 5, 19, 12]
    with pytest.raises(TypeError, match="block_table"):
        kvc.slot_mapping(bt.float(), pos, 4, req)
    with pytest.raises(TypeError, match="positions"):
        kvc.slot_mapping(bt, pos.float(), 4, req)
    with pytest.raises(ValueError, match="req_indices"):
        kvc.slot_mapping(bt, pos, 4)
    with pytest.raises(ValueError, match="req_indices"):
        kvc.slot_mapping(bt, pos, 4, req[:2])
    with pytest.raises(IndexError, match="positions"):
        kvc.slot_mapping(bt, torch.tensor([12]), 4, torch.tensor([0]))
    with pytest.raises(ValueError, match="positions"):
        kvc.slot_mapping(bt, pos.view(5, 1), 4, req)


@pytest.mark.parametrize("layout", kvc.LAYOUTS)
@pytest.mark.parametrize("mix", range(len(SPEC_MIXES)))
def test_block_pages_tile_the_buffer_and_hold_what_they_say(layout, mix):
    plan = kvc.plan_cache(SPEC_MIXES[mix], num_blocks=3, block_size=4, layout=layout)
    # For every byte: which (spec, layer, head, block) owns it, through the views.
    owner = {k: torch.full((plan.total_bytes,), -1, dtype=torch.int64) for k in "slhb"}
    for si, s in enumerate(plan.specs):
        t = plan.tensor(s.name)
        for layer in range(s.num_layers):
            shape = (plan.num_blocks, s.num_heads, plan.block_size, s.row_bytes)
            for key, value in (("s", si), ("l", layer)):
                torch.as_strided(owner[key], shape, (t.block_stride, t.head_stride, t.token_stride, 1),
                                 t.offset + layer * t.layer_stride).fill_(value)
            v = torch.as_strided(owner["h"], shape, (t.block_stride, t.head_stride, t.token_stride, 1),
                                 t.offset + layer * t.layer_stride)
            v.copy_(torch.arange(s.num_heads).view(1, -1, 1, 1).expand(shape))
            v = torch.as_strided(owner["b"], shape, (t.block_stride, t.head_stride, t.token_stride, 1),
                                 t.offset + layer * t.layer_stride)
            v.copy_(torch.arange(plan.num_blocks).view(-1, 1, 1, 1).expand(shape))
    seen = torch.zeros(plan.total_bytes, dtype=torch.int32)
    names = [s.name for s in plan.specs]
    for block in range(plan.num_blocks):
        for pg in plan.block_pages():
            a = pg.start + block * pg.block_stride
            span = slice(a, a + pg.length)
            seen[span] += 1
            assert torch.all(owner["s"][span] == names.index(pg.spec))
            assert torch.all(owner["l"][span] == pg.layer)
            assert torch.all(owner["b"][span] == block)
            if pg.head is not None:
                assert torch.all(owner["h"][span] == pg.head)
    assert torch.all(seen == 1)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

spec_st = st.builds(lambda i, c, l, h: kvc.CacheSpec(f"s{i}", c, l, h), st.integers(0, 10 ** 6),
                    st.integers(1, 40), st.integers(1, 3), st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(st.lists(spec_st, min_size=1, max_size=3, unique_by=lambda s: s.name),
       st.sampled_from(kvc.LAYOUTS), st.integers(1, 5), st.integers(1, 4))
def test_any_plan_tiles_its_buffer(specs, layout, block_size, num_blocks):
    plan = kvc.plan_cache(specs, num_blocks=num_blocks, block_size=block_size, layout=layout)
    counts = owner_map(plan)
    assert int(counts.min()) == 1 and int(counts.max()) == 1
    pages = sorted((pg.start + b * pg.block_stride, pg.length) for b in range(num_blocks)
                   for pg in plan.block_pages())
    assert pages[0][0] == 0 and sum(n for _, n in pages) == plan.total_bytes
    assert all(a + n == b for (a, n), (b, _) in zip(pages, pages[1:]))
