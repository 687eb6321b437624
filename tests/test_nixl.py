"""NIXL between two processes (SPEC 8): a DSA request BLHNC/64 -> LBNHC/16 and back, checked
through the gathers; a large read that the owner makes no call for; bad input, a timeout and a
peer that has gone away raise clear errors, and every wait is bounded.

The peer is a "spawn" process (tests/nixl_peer.py) on 127.0.0.1 (UCX_NET_DEVICES=lo). Without
nixl these tests skip, unless KVC_REQUIRE_NIXL=1 (CI), where a missing nixl fails."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

import kvcache_ext as kvc
from conftest import import_nixl

kn = import_nixl()

import nixl_peer as P  # noqa: E402

WAIT_S = 20      # every wait of a transfer that should finish
START_S = 120    # the peer process's start (imports torch and nixl)


def reply(peer, kind: str, timeout_s: float = WAIT_S):
    """The peer's next reply, or a clear failure if it died or went silent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            msg = peer.replies.get(timeout=0.5)
        except queue.Empty:
            if not peer.proc.is_alive():
                pytest.fail(f"the peer process died (exit code {peer.proc.exitcode})")
            continue
        assert msg[0] == kind, msg
        return msg
    pytest.fail(f"no {kind!r} reply from the peer within {timeout_s} s")


@pytest.fixture(scope="module")
def peer():
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=P.serve, args=(commands, replies), daemon=True)
    proc.start()
    p = SimpleNamespace(proc=proc, commands=commands, replies=replies)
    try:
        _, p.blob, p.still_blob, p.gathers = reply(p, "ready", START_S)
        yield p
    finally:
        if proc.is_alive():
            commands.put(("exit",))
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@pytest.fixture(scope="module")
def reader():
    plan = kvc.plan_cache(P.specs(), 4 * P.NUM_BLOCKS, 16, "LBNHC")
    with kn.Endpoint("reader", kvc.allocate(plan, fill=0)) as ep:
        yield ep


def peer_of(ep, blob):
    return ep.peers.get("owner") or ep.add_peer(blob)


def assert_gathers_equal(got, want):
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert torch.equal(a, b)


def test_request_round_trip(peer, reader):
    owner = peer_of(reader, peer.blob)
    assert owner.name == "owner" and owner.plan.layout == "BLHNC" and owner.plan.block_size == 64
    b_table = torch.tensor([37, 2, 901, 14, 15, 600, 333, 8, 1000, 77], dtype=torch.int32)
    a_table = torch.tensor(P.TABLE, dtype=torch.int32)
    there = kvc.TransferPlan(owner.plan, reader.plan).token_spans(a_table, b_table, P.TOKENS)
    assert there.shape[0] == 10 * P.LAYERS * 3  # 10 runs of <= 16 tokens: mla, codes, scales
    h = reader.read(owner, there)
    h.wait(WAIT_S)
    assert h.done() and h.bytes == P.TOKENS * P.LAYERS * 788
    assert_gathers_equal(P.gathers(reader.cache, b_table.tolist()), peer.gathers)
    back = kvc.TransferPlan(reader.plan, owner.plan).token_spans(
        b_table, torch.tensor(P.BACK_TABLE, dtype=torch.int32), P.TOKENS)
    reader.write(owner, back).wait(WAIT_S)
    peer.commands.put(("check_back",))
    assert reply(peer, "checked")[1] is True


def test_large_read_needs_no_call_from_the_owner(peer, reader):
    """25 MB (the owner's whole cache) while the owner only waits on a queue; from an Endpoint
    without a poller the same read cannot finish: wait() raises TimeoutError, bounded."""
    owner = peer_of(reader, peer.blob)
    src_t = torch.arange(P.NUM_BLOCKS, dtype=torch.int32)
    dst_t = torch.randperm(4 * P.NUM_BLOCKS, generator=torch.Generator().manual_seed(0))
    dst_t = dst_t.to(torch.int32)
    xp = kvc.TransferPlan(owner.plan, reader.plan)
    spans = xp.token_spans(src_t, dst_t, P.NUM_BLOCKS * 64)
    t0 = time.monotonic()
    reader.read(owner, spans).wait(WAIT_S)
    assert time.monotonic() - t0 < WAIT_S
    mapped = [int(dst_t[4 * b + j]) for b in P.TABLE for j in range(4)]
    assert_gathers_equal(P.gathers(reader.cache, mapped), peer.gathers)

    still = reader.add_peer(peer.still_blob)
    h = reader.read(still, spans)
    with pytest.raises(TimeoutError, match="not finished after 1.5 s"):
        h.wait(1.5)
    h.cancel()
    reader.remove_peer(still)


def test_bad_input(peer, reader):
    owner = peer_of(reader, peer.blob)
    with pytest.raises(ValueError, match="not kvcache_ext.nixl metadata"):
        reader.add_peer(b"not metadata")
    with pytest.raises(ValueError, match="not valid kvcache_ext.nixl metadata"):
        reader.add_peer(peer.blob[:12] + b"X" + peer.blob[13:])
    with pytest.raises(IndexError, match=r"spans\[1\].*source range"):
        reader.read(owner, torch.tensor([[0, 0, 8], [owner.nbytes - 4, 64, 8]]))
    with pytest.raises(IndexError, match=r"spans\[0\].*destination range"):
        reader.write(owner, torch.tensor([[0, owner.nbytes, 1]]))
    with pytest.raises(ValueError, match="overlapping"):
        reader.read(owner, torch.tensor([[0, 0, 8], [64, 4, 8]]))
    stranger = kn.Peer("stranger", owner.plan, 0, owner.nbytes, "DRAM", 0)
    with pytest.raises(ValueError, match="add_peer"):
        reader.read(stranger, torch.tensor([[0, 0, 8]]))
    other = kvc.plan_cache([kvc.CacheSpec("mla", 576, P.LAYERS)], 4, 64, "BLHNC")
    with pytest.raises(ValueError, match="differs in row_bytes"):
        kvc.TransferPlan(owner.plan, other)
    h = reader.read(owner, torch.tensor([[0, 0, 8]]))
    with pytest.raises(ValueError, match="timeout_s"):
        h.wait(-1)
    h.wait(WAIT_S)
    assert reader.read(owner, torch.zeros(0, 3, dtype=torch.int64)).done()
    plan = kvc.plan_cache(P.specs(), 2, 64, "BLHNC")
    closed = kn.Endpoint("closed", kvc.allocate(plan, fill=0))
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.metadata()


@pytest.mark.parametrize("path", ["plain", "prepared", "strided", "staged", "auto"])
def test_every_path_moves_the_same_bytes(peer, reader, path):
    """The request through each way to NIXL (paths.py): poisoned rows first, the same gathers
    after; the stats say which way it went and what NIXL was handed."""
    owner = peer_of(reader, peer.blob)
    b_table = torch.tensor([37, 2, 901, 14, 15, 600, 333, 8, 1000, 77], dtype=torch.int32)
    there = kvc.TransferPlan(owner.plan, reader.plan).token_spans(
        torch.tensor(P.TABLE, dtype=torch.int32), b_table, P.TOKENS)
    reader.cache.buffer.fill_(0xA5)
    h = reader.read(owner, there, path=path)
    h.wait(WAIT_S)
    assert_gathers_equal(P.gathers(reader.cache, b_table.tolist()), peer.gathers)
    st = h.stats
    assert st.path == ("plain" if path == "auto" else path)  # 60 spans: too few to stage
    assert st.spans == there.shape[0] == 60 and st.bytes == P.TOKENS * P.LAYERS * 788
    assert st.parts == 1 and st.pieces > 0 and st.move_s > 0 and st.build_s > 0
    if path == "staged":  # three source blocks' pages (and the gaps between them) in extents
        assert st.pieces < 60 and st.staged_bytes >= st.bytes and st.unpack_s > 0
    else:
        assert st.pieces == 60 and st.staged_bytes == 0
    if path != "staged":  # and back, the same way
        back = kvc.TransferPlan(reader.plan, owner.plan).token_spans(
            b_table, torch.tensor(P.BACK_TABLE, dtype=torch.int32), P.TOKENS)
        reader.write(owner, back, path=path).wait(WAIT_S)
        peer.commands.put(("check_back",))
        assert reply(peer, "checked")[1] is True


def test_auto_stages_many_small_spans_in_parts(peer, reader, monkeypatch):
    """The 25 MB read of 16-token runs: auto stages it (6,140 spans of 2-10 KiB); in parts of 4 MiB
    it takes several parts through two staging halves, and the bytes are the same."""
    owner = peer_of(reader, peer.blob)
    src_t = torch.arange(P.NUM_BLOCKS, dtype=torch.int32)
    dst_t = torch.randperm(4 * P.NUM_BLOCKS, generator=torch.Generator().manual_seed(3))
    dst_t = dst_t.to(torch.int32)
    spans = kvc.TransferPlan(owner.plan, reader.plan).token_spans(src_t, dst_t, P.NUM_BLOCKS * 64)
    mapped = [int(dst_t[4 * b + j]) for b in P.TABLE for j in range(4)]
    for part_bytes in (kn.paths.STAGE_PART_BYTES, 4 << 20):
        monkeypatch.setattr(kn.paths, "STAGE_PART_BYTES", part_bytes)
        reader.cache.buffer.fill_(0x5A)
        h = reader.read(owner, spans)
        h.wait(WAIT_S)
        assert h.stats.path == "staged"
        assert h.stats.parts == -(-owner.nbytes // part_bytes)
        assert h.stats.pieces < spans.shape[0] // 100
        assert_gathers_equal(P.gathers(reader.cache, mapped), peer.gathers)
    with pytest.raises(ValueError, match="staged.*reads only"):
        reader.write(owner, spans[:1], path="staged")
    with pytest.raises(ValueError, match="path must be one of"):
        reader.read(owner, spans, path="fast")


def test_prepared_lists_live_with_their_peer(peer, reader):
    """A peer's prepared lists are made on first use, reused, and released with the peer; its
    old Peer is refused after it was removed (and a transfer in flight fails, not goes on)."""
    owner = peer_of(reader, peer.blob)
    spans = torch.tensor([[0, 0, 4096], [4096, 4096, 4096]])  # NIXL merges them into one
    first = reader.read(owner, spans, path="prepared")
    first.wait(WAIT_S)
    again = reader.read(owner, spans, path="prepared")
    again.wait(WAIT_S)
    assert first.stats.prepared and not again.stats.prepared and again.stats.pieces == 1
    assert any(k[0] == "owner" for k in reader._peer_grids)
    reader.remove_peer(owner)
    assert not any(k[0] == "owner" for k in reader._peer_grids)
    with pytest.raises(ValueError, match="returned by this Endpoint's add_peer"):
        reader.read(owner, spans, path="prepared")
    fresh = reader.add_peer(peer.blob)
    h = reader.read(fresh, spans, path="prepared")
    h.wait(WAIT_S)
    assert h.stats.prepared
    big = kvc.TransferPlan(fresh.plan, reader.plan).token_spans(
        torch.arange(P.NUM_BLOCKS, dtype=torch.int32),
        torch.arange(4 * P.NUM_BLOCKS, dtype=torch.int32), P.NUM_BLOCKS * 64)
    h = reader.read(fresh, big, path="plain")
    reader.remove_peer(fresh)
    if not h._done:
        with pytest.raises(kn.NixlError, match="was removed during the READ"):
            h.wait(WAIT_S)
    reader.add_peer(peer.blob)


def test_peer_gone_raises(peer, reader):
    """The peer process ends without closing anything: the next read raises (PeerGoneError or
    a NIXL error), or times out -- within a bounded time, never a hang. Runs last."""
    owner = peer_of(reader, peer.blob)
    peer.commands.put(("die",))
    peer.proc.join(WAIT_S)
    assert not peer.proc.is_alive()
    spans = kvc.TransferPlan(owner.plan, reader.plan).token_spans(
        torch.arange(8, dtype=torch.int32), torch.arange(32, dtype=torch.int32), 512)
    t0 = time.monotonic()
    with pytest.raises((kn.PeerGoneError, kn.NixlError, TimeoutError)) as err:
        reader.read(owner, spans).wait(5)
    assert time.monotonic() - t0 < 10
    print("peer gone:", type(err.value).__name__, err.value)


def test_import_kvcache_ext_does_not_import_nixl():
    code = ("import os, sys; os.environ.pop('UCX_MODULES', None); import kvcache_ext as kvc; "
            "assert 'nixl' not in sys.modules and 'kvcache_ext.nixl' not in sys.modules; "
            "kvc.nixl.Endpoint; assert os.environ['UCX_MODULES'] == '^ib'; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "UCX_MODULES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_closing_an_endpoint_fails_its_unfinished_transfers():
    """A transfer cut short by close() must not look finished: its bytes are undefined."""
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 2)], 512, 64, "BLHNC")
    a = kn.Endpoint("closing-a", kvc.allocate(plan, fill=1))
    b = kn.Endpoint("closing-b", kvc.allocate(plan, fill=0))
    try:
        peer = b.add_peer(a.metadata())
        pairs = torch.stack([torch.arange(512), torch.randperm(512)], 1)
        h = b.read(peer, kvc.TransferPlan(plan, plan).block_spans(pairs))
        finished_first = h.done()
        b.close()
        if not finished_first:  # 84 MB through loopback: normally still running here
            with pytest.raises(kn.NixlError, match="was closed during the READ"):
                h.wait(1)
    finally:
        b.close()
        a.close()


def test_cancelled_transfers_do_not_look_finished_and_handshakes_repeat():
    """cancel() of a running transfer leaves its bytes undefined: done() / wait() say so. The same
    metadata added twice gives back the Peer handed out first (still usable); other metadata
    under a known name (a restarted peer) is refused until the old Peer is removed."""
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 656, 2)], 512, 64, "BLHNC")
    # the owner makes no progress (no poller, no calls): a large read cannot finish
    a = kn.Endpoint("cancel-a", kvc.allocate(plan, fill=1), poll_interval_s=None)
    b = kn.Endpoint("cancel-b", kvc.allocate(plan, fill=0))
    try:
        peer = b.add_peer(a.metadata())
        assert b.add_peer(a.metadata()) is peer
        pairs = torch.stack([torch.arange(512), torch.randperm(512)], 1)
        h = b.read(peer, kvc.TransferPlan(plan, plan).block_spans(pairs))
        with pytest.raises(TimeoutError):
            h.wait(0.5)
        h.cancel()
        with pytest.raises(kn.NixlError, match="was cancelled before it finished"):
            h.wait(1)
        with pytest.raises(kn.NixlError, match="cancelled"):
            h.done()
        b.write(peer, torch.tensor([[0, 0, 8]])).cancel()  # the first Peer is still accepted
        c = kn.Endpoint("cancel-c", kvc.allocate(plan, fill=2))  # a peer that makes progress
        small = b.read(b.add_peer(c.metadata()), torch.tensor([[0, 0, 8]]))
        small.wait(WAIT_S)
        small.cancel()  # a finished transfer stays finished
        assert small.done()
        c.close()
        blob = a.metadata()
        n = int.from_bytes(blob[8:12], "little")
        head = json.loads(blob[12:12 + n])
        head["address"] += 64  # the same name, another buffer
        moved = json.dumps(head).encode()
        with pytest.raises(ValueError, match="added before with other metadata.*remove_peer"):
            b.add_peer(blob[:8] + len(moved).to_bytes(4, "little") + moved + blob[12 + n:])
        b.remove_peer(peer)
        assert b.add_peer(blob) is not peer
    finally:
        b.close()
        a.close()


def test_a_packed_read_through_the_exposed_buffer_lands_the_direct_moves_bytes():
    """A producer packs tokens of a request into its exposed buffer in the consumer's page form
    (block 32 -> 48, vLLM-CPU's channel-major K | V page), part by part; the consumer reads
    each part with read_exposed: its cache ends as a direct copy would leave it. Runs past the
    exposed buffer, and a peer that exposes nothing, are refused before anything moves."""
    from kvcache_ext.ops.library import ops
    from kvcache_ext.transfer.pack import packed_read, split_runs
    spec = kvc.CacheSpec("kv", 256, 2, 2, split=(128, 128), channel_major=4)
    src_plan = kvc.plan_cache([spec], 64, 32, "LBHNC")
    dst_plan = kvc.plan_cache([spec], 64, 48, "LBHNC")
    src = kvc.allocate(src_plan, fill=0)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8))
    start, count = 48, 500
    pr = packed_read(dst_plan, start, count, 64 << 10)
    a = kn.Endpoint("pack-a", src, exposed_bytes=pr.nbytes + 4096)
    b = kn.Endpoint("pack-b", kvc.allocate(dst_plan, fill=0xFF))
    c = kn.Endpoint("pack-c", kvc.allocate(dst_plan, fill=0))
    try:
        peer = b.add_peer(a.metadata())
        assert peer.exposed_nbytes == pr.nbytes + 4096 and peer.exposed_address
        src_table = torch.randperm(64)[:-(-(start + count) // 32)]
        dst_table = torch.randperm(64)[:-(-(start + count) // 48)]
        pack = kvc.TransferPlan(src_plan, pr.plan).token_runs(src_table, pr.table(), count,
                                                              start, start)
        read = kvc.TransferPlan(pr.plan, dst_plan).token_runs(pr.table(), dst_table, count,
                                                              start, start)
        slot = 4096  # where in the exposed buffer this request's packed bytes go
        bounds = [x + slot for x in pr.bounds]
        parts = split_runs(pack, 1, pr.bounds)
        read[:, 0] += slot
        asked = []

        def ready(p: int) -> None:  # the producer packs part p only when the read needs it
            asked.append(p)
            parts[p][:, 1] += slot
            ops.copy_runs(src.buffer, a.exposed, parts[p])
        h = b.read_exposed(peer, read, bounds, ready)
        h.wait(WAIT_S)
        assert asked == list(range(pr.parts)) and h.stats.parts == pr.parts > 5
        want = kvc.allocate(dst_plan, fill=0xFF)
        kvc.copy_spans(src, want, kvc.TransferPlan(src_plan, dst_plan).token_spans(
            src_table, dst_table, count, start, start))
        assert torch.equal(b.cache.buffer, want.buffer)

        def fail(p: int) -> None:  # the producer stops before part 2
            if p == 2:
                raise RuntimeError("the producer stopped")
        b.cache.buffer.fill_(0xFF)
        with pytest.raises(kn.NixlError, match="the producer stopped"):
            b.read_exposed(peer, read, bounds, fail)
        for p, part in enumerate(split_runs(read, 0, bounds)):  # parts 0, 1 landed, no other
            for _, d, n in kvc.spans_of_runs(part).tolist():
                got = b.cache.buffer[d:d + n]
                assert torch.equal(got, want.buffer[d:d + n]) if p < 2 else bool((got == 0xFF).all())
        before = b.cache.buffer.clone()
        with pytest.raises(IndexError, match="source pieces must lie in"):
            b.read_exposed(peer, torch.tensor([[pr.nbytes + 4000, 0, 200]]))
        with pytest.raises(ValueError, match="exposes a buffer"):
            b.read_exposed(b.add_peer(c.metadata()), torch.tensor([[0, 0, 8]]))
        assert torch.equal(b.cache.buffer, before)
    finally:
        c.close()
        b.close()
        a.close()
