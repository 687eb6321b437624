"""The packed read inside the connector (kvcache_ext/vllm/packing.py), engine-free: the producer's
pack buffer lends ranges and never lends one a pack may still write; a producer's pack stream
read by a consumer lands the bytes of a direct move (two real NIXL Endpoints in this process,
vLLM-CPU's K | V page, 32 -> 48 and 48 -> 32, from token 0 and from a prefix hit); what cannot be
packed says why; a producer that stops mid-stream fails the read."""
from __future__ import annotations

import time

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import nixl as kn
from kvcache_ext.transfer.pack import PackPlans
from kvcache_ext.vllm.packing import PackBuffer, pack_ask, read_packed

SPEC = kvc.CacheSpec("kv", 256, 2, 2, split=(128, 128), channel_major=4)


def test_pack_buffer_lends_first_fit_and_keeps_ranges_being_packed():
    pb = PackBuffer(torch.zeros(100, dtype=torch.uint8))
    assert (pb.lend("a", 40), pb.lend("b", 40), pb.lend("c", 40)) == (0, 40, None)
    pb._packed("a", 0)
    pb.free("a")                      # packed and released: free at once
    assert pb.lend("c", 30) == 0
    pb.free("b")                      # still being packed: kept until its packing ends
    assert pb.lend("d", 60) is None and "b" in pb.lent()
    pb._packed("b", 40)
    assert "b" not in pb.lent() and pb.lend("d", 60) == 30
    assert pb.lend("d", 10) is None   # d asked again (its first asker may still read it)
    pb._packed("d", 30)
    assert pb.lend("d", 10) is None and pb.lent()["d"] == (30, 60)


def _pair(src_block: int, dst_block: int, exposed: int):
    src_plan = kvc.plan_cache([SPEC], 64, src_block, "LBHNC")
    dst_plan = kvc.plan_cache([SPEC], 64, dst_block, "LBHNC")
    src = kvc.allocate(src_plan, fill=0)
    src.buffer.copy_(torch.randint(0, 256, src.buffer.shape, dtype=torch.uint8))
    prod = kn.Endpoint(f"prod-{src_block}-{dst_block}", src, exposed_bytes=exposed)
    cons = kn.Endpoint(f"cons-{src_block}-{dst_block}", kvc.allocate(dst_plan, fill=0xFF))
    return prod, cons, cons.add_peer(prod.metadata())


@pytest.mark.parametrize("blocks,start", [((32, 48), 0), ((48, 32), 96), ((32, 48), 48)])
def test_a_pack_stream_read_by_the_consumer_lands_the_direct_moves_bytes(blocks, start):
    prod, cons, peer = _pair(*blocks, exposed=1 << 20)
    try:
        pb = PackBuffer(prod.exposed)
        assert pb.lend("another prompt", 4096) == 0  # so this one's range starts past it
        count = 700 - start
        src_table = torch.randperm(64)[:-(-700 // blocks[0])]
        dst_table = torch.randperm(64)[:-(-700 // blocks[1])]
        ask = pack_ask(cons, peer, src_table.tolist(), start, count, 64 << 10)  # several parts
        stream = pb.pack(prod.cache.buffer, prod.plan, "req", ask, lambda: True)
        first, _ = next(stream)
        assert first["ok"] and first["packed"]["bytes"] > 0 and first["packed"]["offset"] == 4096
        stats, runs = read_packed(cons, peer, dst_table, start, count, first["packed"], stream,
                                  lambda: 20.0)
        assert stats.path == "packed" and stats.parts > 1 and stats.pack_s > 0
        assert 0 < stats.pack_cpu_s <= stats.pack_s + 1e-3  # thread_time ticks coarser
        assert stats.bytes == count * SPEC.row_bytes * SPEC.num_layers * SPEC.num_heads
        want = kvc.allocate(cons.plan, fill=0xFF)
        spans = kvc.TransferPlan(prod.plan, cons.plan).token_spans(src_table, dst_table, count,
                                                                   start, start)
        kvc.copy_spans(prod.cache, want, spans)
        assert torch.equal(cons.cache.buffer, want.buffer)
        # the runs it returns: their destinations are the rows written (what a failed read's
        # clean-up and the tests' corruption use), their sources in the producer's buffer
        def rows(s: torch.Tensor) -> torch.Tensor:
            mask = torch.zeros(cons.plan.total_bytes, dtype=torch.bool)
            for d, n in s[:, 1:].tolist():
                mask[d:d + n] = True
            return mask
        got = kvc.spans_of_runs(runs)
        assert torch.equal(rows(got), rows(spans))
        assert got[:, 0].min() >= first["packed"]["offset"]
        assert (got[:, 0] + got[:, 2]).max() <= first["packed"]["offset"] + first["packed"]["bytes"]
        assert pb.lent()["req"][1] == first["packed"]["bytes"]  # lent until released
        pb.free("req")
        assert list(pb.lent()) == ["another prompt"]
    finally:
        cons.close()
        prod.close()


def test_a_packed_reads_wait_for_its_first_part_is_pack_wait_not_build_time():
    """The consumer builds part 0's read only once the producer says it is packed: that wait
    is pack_wait_s, and build_s is the build alone (it used to hold the wait too)."""
    prod, cons, peer = _pair(32, 48, exposed=1 << 20)
    try:
        pb, plans = PackBuffer(prod.exposed), PackPlans(cons.plan, own_is_src=False)
        table = torch.arange(22)
        ask = pack_ask(cons, peer, table.tolist(), 0, 700, 64 << 10, plans)
        stream = pb.pack(prod.cache.buffer, prod.plan, "req", ask, lambda: True)
        first, _ = next(stream)

        def late(replies):  # part 0's notice comes 0.3 s late
            for i, reply in enumerate(replies):
                if i == 0:
                    time.sleep(0.3)
                yield reply

        stats, _ = read_packed(cons, peer, torch.arange(15), 0, 700, first["packed"],
                               late(stream), lambda: 20.0, plans)
        assert stats.pack_wait_s >= 0.3 and stats.build_s < 0.3 and stats.parts > 1
        # the producer's stream stood still 0.3 s between parts: wall time, not its CPU time
        assert stats.pack_s >= 0.3 and 0 < stats.pack_cpu_s < 0.3, stats
    finally:
        cons.close()
        prod.close()


def test_a_consumer_closed_mid_packed_read_fails_the_read_and_lands_nothing_outside_it():
    """The consumer's Endpoint closed while its read waits for part 1 to be packed: the read
    fails naming the close (no hang), no byte lands outside the prompt's rows, and the parts
    after the close never land."""
    import threading
    prod, cons, peer = _pair(32, 48, exposed=1 << 20)
    try:
        pb = PackBuffer(prod.exposed)
        src_table, dst_table = torch.arange(22), torch.arange(15)
        ask = pack_ask(cons, peer, src_table.tolist(), 0, 700, 64 << 10)
        stream = pb.pack(prod.cache.buffer, prod.plan, "req", ask, lambda: True)
        first, _ = next(stream)

        def late(replies):  # part 1's notice comes 0.6 s late; the consumer closes at 0.2 s
            for i, reply in enumerate(replies):
                if i == 1:
                    time.sleep(0.6)
                yield reply

        closer = threading.Timer(0.2, cons.close)
        t0 = time.monotonic()
        closer.start()
        with pytest.raises(RuntimeError, match="closed"):
            read_packed(cons, peer, dst_table, 0, 700, first["packed"], late(stream),
                        lambda: 20.0)
        closer.join()
        assert time.monotonic() - t0 < 5.0
        spans = kvc.TransferPlan(prod.plan, cons.plan).token_spans(src_table, dst_table, 700)
        inside = torch.zeros(cons.cache.buffer.numel(), dtype=torch.bool)
        want = kvc.allocate(cons.plan, fill=0xFF)
        kvc.copy_spans(prod.cache, want, spans)
        for _, d, n in spans.tolist():
            inside[d:d + n] = True
        got = cons.cache.buffer
        assert bool((got[~inside] == 0xFF).all())  # nothing outside the prompt's rows
        assert not torch.equal(got[inside], want.buffer[inside])  # the later parts never came
    finally:
        cons.close()
        prod.close()


def test_what_cannot_be_packed_says_why_and_a_stopped_producer_fails_the_read():
    prod, cons, peer = _pair(32, 48, exposed=400 << 10)
    try:
        pb = PackBuffer(prod.exposed)
        table = list(range(10))
        assert pack_ask(cons, peer, table, 0, 0) is None        # nothing to read
        assert pack_ask(cons, peer, table, 0, 1000) is None     # packed, it would not fit
        ask = pack_ask(cons, peer, table, 0, 300)
        bad = dict(ask, block_ids=[10 ** 6] * 10)
        reply, _ = next(pb.pack(prod.cache.buffer, prod.plan, "bad", bad, lambda: True))
        assert reply["ok"] and reply["packed"] is None and "IndexError" in reply["why"]
        gone = pb.pack(prod.cache.buffer, prod.plan, "gone", ask, lambda: False)
        reply, _ = next(gone)  # released while it was planned: refused, the range not kept
        assert not reply["ok"] and "released" in reply["why"]
        assert list(gone) == [] and "gone" not in pb.lent()
        held = pb.pack(prod.cache.buffer, prod.plan, "one", ask, lambda: True)
        assert next(held)[0]["packed"]
        reply, _ = next(pb.pack(prod.cache.buffer, prod.plan, "two", ask, lambda: True))  # full
        assert reply["packed"] is None and "pack buffer has no" in reply["why"]
        dst_table = torch.arange(7)
        before = cons.cache.buffer.clone()
        stopped = iter([({"ok": False, "why": "gone"}, b"")])
        with pytest.raises(RuntimeError, match="did not pack part 0 .*gone"):
            read_packed(cons, peer, dst_table, 0, 300, {"offset": 0, "bytes": ask_bytes(cons, 300),
                                                        "part_bytes": 1 << 20},
                        _Closable(stopped), lambda: 5.0)
        assert torch.equal(cons.cache.buffer, before)  # nothing was read
        held.close()  # the stream ends: "one"'s range is no longer being packed, and is freed
        assert "one" in pb.lent()  # when the consumer releases it
        pb.free("one")
        assert pb.lent() == {}
    finally:
        cons.close()
        prod.close()


def test_a_producer_late_past_the_deadline_fails_the_read_by_the_deadline():
    """Through the real side channel (a Server streaming the producer's generator, stream()
    reading it): a producer that announces the packed range and then stalls fails the read
    when the read's own deadline passes -- every wait of the stream is bounded by it, not each
    by a fresh timeout -- and the stalled generator's finally runs once the consumer has gone."""
    import threading
    import time as _time
    from kvcache_ext.vllm.side_channel import Server, stream
    prod, cons, peer = _pair(32, 48, exposed=1 << 20)
    ended = threading.Event()

    def handler(m):
        def gen():
            try:
                yield {"ok": True, "packed": {"offset": 0, "bytes": ask_bytes(cons, 300),
                                              "part_bytes": 64 << 10}}, b""
                for _ in range(40):  # stalls: 0.1 s per beat, far past the 1.5 s deadline
                    _time.sleep(0.1)
                    yield {"ok": True, "beat": True}, b""
            finally:
                ended.set()
        return gen()
    server = Server("127.0.0.1", 0, handler)
    try:
        deadline = _time.monotonic() + 1.5
        left = lambda: max(deadline - _time.monotonic(), 0.001)  # noqa: E731
        replies = stream("127.0.0.1", server.port, {"op": "acquire"}, left)
        first, _ = next(replies)
        before = cons.cache.buffer.clone()
        t = _time.monotonic()
        with pytest.raises(RuntimeError, match="did not pack part 0"):
            read_packed(cons, peer, torch.arange(7), 0, 300, first["packed"], replies, left)
        assert _time.monotonic() - t < 2.0
        assert torch.equal(cons.cache.buffer, before)
        assert ended.wait(10)  # the producer's stream noticed the consumer had gone
    finally:
        server.close()
        cons.close()
        prod.close()


def ask_bytes(ep, count: int) -> int:
    from kvcache_ext.transfer.pack import packed_read
    return packed_read(ep.plan, 0, count).nbytes


class _Closable:
    def __init__(self, it) -> None:
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)

    def close(self) -> None:
        pass
