"""Moving DeepSeek-V4 caches (group plans, SPEC 10) between plans: copy_blocks with a block
mapping per group, and a request's live rows through NIXL between two Endpoints whose plans
differ (layout, packing, number of blocks). Rows are written by the V4 kernels and read back
by them on both sides."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import ops_v4 as o4

os.environ.setdefault("UCX_NET_DEVICES", "lo")


def v4_plans() -> tuple[kvc.GroupPlan, kvc.GroupPlan]:
    groups = kvc.presets.deepseek_v4("flash")
    return (kvc.plan_cache(groups=groups, num_blocks=12, layout="BLHNC", packing="overlay"),
            kvc.plan_cache(groups=groups, num_blocks=9, layout="BLNHC", packing="stack"))


def poisoned(plan, seed: int) -> kvc.KVCache:
    g = torch.Generator().manual_seed(seed)
    return kvc.KVCache(plan, torch.randint(0, 256, (plan.total_bytes,), dtype=torch.uint8, generator=g))


def test_copy_blocks_between_group_plans_moves_only_the_named_groups_pages():
    src_plan, dst_plan = v4_plans()
    src, dst = poisoned(src_plan, 1), poisoned(dst_plan, 2)
    before = dst.buffer.clone()
    mapping = {"main": torch.tensor([[1, 7], [4, 0]]), "c4_states": torch.tensor([[2, 3]])}
    stats = kvc.copy_blocks(src, dst, mapping)
    assert stats.blocks == 3
    want = before.clone()
    expected = kvc.KVCache(dst_plan, want)
    moved = 0
    for gname, pairs in mapping.items():
        for spec in src_plan.group(gname).specs:
            rows_bytes = src_plan.rows_per_block(spec.name) * spec.row_bytes
            for layer in range(spec.num_layers):
                for s_blk, d_blk in pairs.tolist():
                    a = src.view(spec.name, layer)[s_blk].reshape(-1)[:rows_bytes]
                    expected.view(spec.name, layer)[d_blk].reshape(-1)[:rows_bytes] = a
                    moved += rows_bytes
    assert stats.bytes == moved
    assert torch.equal(dst.buffer, want)
    assert int((dst.buffer != before).sum()) > moved // 2  # random bytes: most of them changed
    with pytest.raises(TypeError, match=r"block_mapping = \{group name"):
        kvc.copy_blocks(src, dst, torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="not in"):
        kvc.copy_blocks(src, dst, {"nope": torch.tensor([[0, 0]])})


def nixl_module():
    try:
        import kvcache_ext.nixl as kn
    except ImportError as e:  # pragma: no cover
        if os.environ.get("KVC_REQUIRE_NIXL") == "1":
            raise
        pytest.skip(f"nixl is not installed ({e})")
    return kn


def test_v4_request_through_nixl_between_different_plans():
    kn = nixl_module()
    src_plan, dst_plan = v4_plans()
    owner_cache = poisoned(src_plan, 3)
    reader_cache = poisoned(dst_plan, 4)
    n = 300                                                   # tokens of the request
    pos, req = torch.arange(n), torch.zeros(n, dtype=torch.int64)
    # (owner, reader) block tables; overlaid groups share the owner's pool: disjoint blocks.
    # Windowed groups hold only their window's blocks (-1 before it: never moved).
    tables = {"main": (torch.tensor([3, 0]), torch.tensor([8, 2])),           # 256 tokens / block
              "swa0": (torch.tensor([5, 1, 2, 4, 6]), torch.tensor([0, 1, 3, 6, 7])),  # 64
              "c4_states": (torch.tensor([-1] * 73 + [7, 8]), torch.tensor([-1] * 73 + [4, 5]))}
    g = torch.Generator().manual_seed(5)
    kv = (torch.randn(n, 512, generator=g) * 4).to(torch.bfloat16)
    k = torch.randn(n, 128, generator=g).to(torch.bfloat16)
    bt = lambda name: tables[name][0].to(torch.int32).unsqueeze(0)  # noqa: E731
    c4 = kvc.slot_mapping(bt("main"), pos, 256, req, compress_ratio=4)
    o4.v4_dsa_write(kv, owner_cache.view("c4_kv", 1), k, owner_cache.view("c4_indexer", 1), c4)
    o4.v4_mla_quant_and_cache(kv, owner_cache.view("swa0_kv", 1), kvc.slot_mapping(bt("swa0"), pos, 64, req))
    # C4 compressor states: the last 8 tokens' [kv | score] rows (4 tokens per block)
    state = torch.randn(8, 2048, generator=g)
    live = kvc.slot_mapping(bt("c4_states"), torch.arange(292, 300), 4, torch.zeros(8, dtype=torch.int64))
    o4.state_write(state[:, :1024], state[:, 1024:], owner_cache.view("c4_state", 1), live)
    reader_before = reader_cache.buffer.clone()
    a = kn.Endpoint("v4-owner", owner_cache)
    b = kn.Endpoint("v4-reader", reader_cache)
    try:
        peer = b.add_peer(a.metadata())
        assert peer.plan == src_plan and peer.plan.block_stride == src_plan.block_stride
        xp = kvc.GroupTransferPlan(peer.plan, b.plan, groups=list(tables))
        spans = xp.token_spans({g: (s.to(torch.int32), d.to(torch.int32))
                                for g, (s, d) in tables.items()}, n)
        b.read(peer, spans).wait(30)
    finally:
        b.close()
        a.close()
    # the request's rows read back on both sides: compressed + SWA window, and the indexer
    lens = torch.tensor([n], dtype=torch.int32)
    side = lambda c, i: o4.gather_compressed_and_swa(  # noqa: E731
        c.view("c4_kv", 1), tables["main"][i].to(torch.int32)[None], 4, c.view("swa0_kv", 1),
        tables["swa0"][i].to(torch.int32)[None], lens)[0]
    got, want = side(reader_cache, 1), side(owner_cache, 0)
    assert got.shape == (75 + 128, 512) and torch.equal(got.view(torch.int16), want.view(torch.int16))
    idx = lambda c, i: o4.gather_v4(c.view("c4_indexer", 1), tables["main"][i].to(torch.int32)[None],  # noqa: E731
                                    torch.tensor([0, 75], dtype=torch.int32), "mxfp4", raw=True)
    assert torch.equal(idx(reader_cache, 1), idx(owner_cache, 0))
    # the C4 state window (tokens 292..299: blocks 73, 74) moved, rows as written
    st = lambda c, i: o4.state_read(c.view("c4_state", 1), tables["c4_states"][i][73:].to(torch.int32)[None],  # noqa: E731
                                    torch.tensor([0, 8], dtype=torch.int32), 1024)
    assert torch.equal(torch.cat(st(reader_cache, 1), 1), state)
    # SWA rows outside the last 128 tokens (block 0: tokens 0..63) were not moved: the reader
    # still holds its own bytes there, every one of them
    early = lambda c, i: o4.gather_v4(c.view("swa0_kv", 1), tables["swa0"][i][:1].to(torch.int32)[None],  # noqa: E731
                                      torch.tensor([0, 64], dtype=torch.int32), raw=True)
    assert torch.equal(early(reader_cache, 1), early(kvc.KVCache(dst_plan, reader_before), 1))
    assert not torch.equal(early(reader_cache, 1), early(owner_cache, 0))


def test_the_kept_plan_pair_plans_a_v4_request_that_reads_the_copy_runs_bytes():
    """The consumer's way (the vLLM connector's V4 read): the GroupTransferPlan the reader's
    Endpoint keeps for its peer plans every group's runs past a prefix hit, kept windows given,
    and read() through NIXL writes exactly the bytes copy_runs writes into a poisoned copy of the
    reader's cache; read_tokens and a peer of the other plan kind are refused, naming why."""
    from test_groups import request_tables, shuffled, window_firsts
    from test_plan_runs import expanded
    kn = nixl_module()
    groups = kvc.presets.deepseek_v4("flash")
    n, start = 700, 100
    kept = window_firsts(groups, n)
    need = sum(-(-n // g.block_size) - kept.get(g.name, 0) // g.block_size for g in groups)
    src_plan = kvc.plan_cache(groups=groups, num_blocks=need + 2, layout="BLHNC")
    dst_plan = kvc.plan_cache(groups=groups, num_blocks=need + 5, layout="BLNHC", packing="stack")
    owner, reader = poisoned(src_plan, 6), poisoned(dst_plan, 7)
    want = kvc.KVCache(dst_plan, reader.buffer.clone())
    g = torch.Generator().manual_seed(8)
    st_ = request_tables(groups, n, shuffled(src_plan.num_blocks, g), kept)
    dt = request_tables(groups, n, shuffled(dst_plan.num_blocks, g), kept)
    tables = {k: (st_[k], dt[k]) for k in st_}
    a = kn.Endpoint("v4-kept-owner", owner)
    b = kn.Endpoint("v4-kept-reader", reader)
    c = kn.Endpoint("v4-kept-plain", kvc.allocate(kvc.plan_cache([kvc.CacheSpec("k", 64)], 4, 16)))
    try:
        peer = b.add_peer(a.metadata())
        xp = b.transfer_plan(peer)
        assert isinstance(xp, kvc.GroupTransferPlan) and b.transfer_plan(peer) is xp
        runs = xp.token_runs(tables, n, start, kept)
        handle = b.read(peer, runs)
        handle.wait(30)
        assert handle.stats.runs == runs.shape[0]
        assert handle.stats.bytes == int((runs[:, 2] * runs[:, 5]).sum()) > 0
        with pytest.raises(ValueError, match=r"read_tokens moves the tokens of a cache plan"):
            b.read_tokens(peer, st_["main"], dt["main"], n)
        other = c.add_peer(a.metadata())
        with pytest.raises(ValueError, match=r"peer 'v4-kept-owner' has a GroupPlan and this "
                                             r"Endpoint a CachePlan"):
            c.transfer_plan(other)
    finally:
        c.close()
        b.close()
        a.close()
    kvc.copy_runs(owner, want, runs)
    assert torch.equal(reader.buffer, want.buffer)
    spans = xp.token_spans(tables, n, start, kept)
    assert torch.equal(expanded(runs), spans)  # the rows past the prefix, no more, no fewer
    for s_, d, k in spans[::7].tolist():  # moved bytes are the owner's, not the poison
        assert torch.equal(reader.buffer[d:d + k], owner.buffer[s_:s_ + k])


def test_concurrent_v4_requests_planned_by_the_kept_plan_land_their_own_rows():
    """Three prompts of one producer at once (a consumer loading several requests): each
    planned on its own thread by the one GroupTransferPlan the Endpoint keeps (its pool of
    runs tables shared: tables of 2,000 tokens are pooled), all three reads in flight together.
    Each request's runs are its own rows exactly, and the reader ends with what copy_runs of
    the three writes into a poisoned copy: nothing lost, nothing crossed, nothing else
    written."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from test_groups import request_tables, shuffled
    from test_plan_runs import expanded
    kn = nixl_module()
    groups = kvc.presets.deepseek_v4("flash")
    n, starts = 2000, [0, 64, 300]
    per = sum(len(t) - int((t < 0).sum())
              for t in request_tables(groups, n, list(range(10_000))).values())
    src_plan = kvc.plan_cache(groups=groups, num_blocks=3 * per + 1, layout="BLHNC")
    dst_plan = kvc.plan_cache(groups=groups, num_blocks=3 * per + 3, layout="BLNHC",
                              packing="stack")
    owner, reader = poisoned(src_plan, 11), poisoned(dst_plan, 12)
    want = kvc.KVCache(dst_plan, reader.buffer.clone())
    g = torch.Generator().manual_seed(13)
    src_free, dst_free = shuffled(src_plan.num_blocks, g), shuffled(dst_plan.num_blocks, g)
    reqs = []  # disjoint blocks on both sides: one free list per side
    for _ in starts:
        st_, dt = request_tables(groups, n, src_free), request_tables(groups, n, dst_free)
        reqs.append({k: (st_[k], dt[k]) for k in st_})
    a = kn.Endpoint("v4-many-owner", owner)
    b = kn.Endpoint("v4-many-reader", reader)
    try:
        peer = b.add_peer(a.metadata())
        xp = b.transfer_plan(peer)
        xp.reserve_runs(n)  # as the handshake does: a slab kept, which one planner gets
        together = threading.Barrier(len(starts))

        def plan(i: int) -> torch.Tensor:
            together.wait(10)
            return xp.token_runs(reqs[i], n, starts[i])

        with ThreadPoolExecutor(len(starts)) as pool:
            runs = list(pool.map(plan, range(len(starts))))
        assert xp.tables.made >= len(starts)  # pooled: the kept slab lent to one at a time
        handles = [b.read(peer, r) for r in runs]  # all in flight before any wait
        for h in handles:
            h.wait(60)
    finally:
        b.close()
        a.close()
    for r, tables, start in zip(runs, reqs, starts):
        assert torch.equal(expanded(r), xp.token_spans(tables, n, start))
        kvc.copy_runs(owner, want, r)
    assert torch.equal(reader.buffer, want.buffer)


def test_closing_a_v4_endpoint_mid_read_fails_it_and_writes_nothing_outside_its_rows(
        monkeypatch):
    """close() while a V4 request's rows are read (the consumer engine shutting down): the read
    fails naming the close (its rows are undefined: never reported as moved), and every byte of
    the reader's cache outside those rows is as it was; the owner's cache is untouched. The
    read is staged in parts whose unpacks are slowed, so close() comes while parts are still
    read and unpacked, whatever this host's speed (a plain read may be over when posted)."""
    kn = nixl_module()
    real, unpacks = kn.paths._ops.copy_spans, []

    def slow_copy_spans(src, dst, spans):
        unpacks.append(time.monotonic())
        time.sleep(0.2)
        real(src, dst, spans)
    monkeypatch.setattr(kn.paths, "_ops", SimpleNamespace(copy_spans=slow_copy_spans))
    monkeypatch.setattr(kn.paths, "STAGE_PART_BYTES", 4 << 20)  # about 11 parts
    groups = kvc.presets.deepseek_v4("flash")
    src_plan = kvc.plan_cache(groups=groups, num_blocks=64, layout="BLHNC", packing="overlay")
    dst_plan = kvc.plan_cache(groups=groups, num_blocks=64, layout="BLNHC", packing="stack")
    # one byte value a side: a byte of the owner's that lands outside the rows shows
    owner = kvc.allocate(src_plan, fill=0x5A)
    reader = kvc.allocate(dst_plan, fill=0xA5)
    g = torch.Generator().manual_seed(8)
    src, dst = (torch.randperm(64, generator=g)[:50].to(torch.int32) for _ in range(2))
    spans = kvc.GroupTransferPlan(src_plan, dst_plan, groups=["main"]).token_spans(
        {"main": (src, dst)}, 50 * 256)
    rows = torch.zeros(dst_plan.total_bytes, dtype=torch.bool)
    for _, d, n in spans.tolist():
        rows[d:d + n] = True
    a = kn.Endpoint("v4-close-owner", owner)
    b = kn.Endpoint("v4-close-reader", reader)
    try:
        peer = b.add_peer(a.metadata())
        h = b.read(peer, spans, path="staged")
        deadline = time.monotonic() + 30
        while not h.done() and not unpacks and time.monotonic() < deadline:
            time.sleep(0.005)  # done() moves it on: until the first part is being unpacked
        assert unpacks and not h.done()
        b.close()
        with pytest.raises(kn.NixlError, match="was closed during the READ"):
            h.wait(5)
        with pytest.raises(ValueError, match="closed"):
            b.read(peer, spans)
    finally:
        b.close()
        a.close()
    assert int(rows.sum()) > 40 << 20 and not bool(rows.all())
    assert not bool(((reader.buffer != 0xA5) & ~rows).any())
    assert not bool((owner.buffer != 0x5A).any())
