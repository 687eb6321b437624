"""Several NIXL transfers of one Endpoint in flight at once, from several threads (as the vLLM
connector's consumer runs one read per prompt), and the Endpoint closed while they run.

Both Endpoints live in this process (each with its poller), so the timing is ours to steer: the
unpack of every staged part is slowed, which keeps several staged reads (each with its own
staging buffer) in flight together, and keeps unpacks running when close() comes. Without nixl
these tests skip, unless KVC_REQUIRE_NIXL=1 (CI)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

import kvcache_ext as kvc
from conftest import import_nixl

kn = import_nixl()

WAIT_S = 30
READERS = 4
BLOCKS_EACH = 8  # source blocks of 64 tokens per request


def _plans():
    spec = kvc.CacheSpec("mla", 656, 2)
    return (kvc.plan_cache([spec], READERS * BLOCKS_EACH, 64, "BLHNC"),
            kvc.plan_cache([spec], 4 * READERS * BLOCKS_EACH, 16, "LBNHC"))


def _requests(src_plan, dst_plan):
    """One request per reader: its own source blocks, scattered destination blocks."""
    dst_blocks = torch.randperm(4 * READERS * BLOCKS_EACH, generator=torch.Generator().manual_seed(5))
    xp = kvc.TransferPlan(src_plan, dst_plan)
    out = []
    for i in range(READERS):
        src_t = torch.arange(i * BLOCKS_EACH, (i + 1) * BLOCKS_EACH, dtype=torch.int32)
        dst_t = dst_blocks[4 * i * BLOCKS_EACH:4 * (i + 1) * BLOCKS_EACH].to(torch.int32)
        out.append(xp.token_spans(src_t, dst_t, BLOCKS_EACH * 64))
    return out


def _slow_unpacks(monkeypatch, delay_s: float, log: list):
    """Every staged part's unpack sleeps first; log gets (start, end) of each."""
    real = kn.paths._ops.copy_spans

    def copy_spans(src, dst, spans):
        t = time.monotonic()
        time.sleep(delay_s)
        real(src, dst, spans)
        log.append((t, time.monotonic()))
    monkeypatch.setattr(kn.paths, "_ops", SimpleNamespace(copy_spans=copy_spans))
    monkeypatch.setattr(kn.paths, "STAGE_PART_BYTES", 128 << 10)  # several parts per request


def _run_readers(ep, peer, requests, results, started):
    barrier = threading.Barrier(len(requests))

    def one(i):
        barrier.wait()
        try:
            h = ep.read(peer, requests[i], path="staged")
            started.append(i)
            h.wait(WAIT_S)
            results[i] = "ok"
        except BaseException as e:  # noqa: BLE001 - asserted on below
            results[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    return threads


def test_staged_reads_in_flight_at_once_land_their_own_bytes(monkeypatch):
    """Four staged reads at once need four staging buffers; each comes back to the pool and
    the next reads reuse them. The bytes equal a local copy_spans of the same spans."""
    src_plan, dst_plan = _plans()
    src = kvc.allocate(src_plan)
    src.buffer.copy_(torch.randint(0, 256, (src_plan.total_bytes,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(1)))
    requests = _requests(src_plan, dst_plan)
    want = kvc.allocate(dst_plan, fill=0)
    for spans in requests:
        kvc.copy_spans(src, want, spans)
    log: list = []
    _slow_unpacks(monkeypatch, 0.02, log)
    with kn.Endpoint("conc-src", src) as a, kn.Endpoint("conc-dst", kvc.allocate(dst_plan, fill=0)) as b:
        peer = b.add_peer(a.metadata())
        for round_ in range(2):  # the second round takes the returned buffers
            b.cache.buffer.fill_(0xA5)
            results: dict = {}
            for t in _run_readers(b, peer, requests, results, []):
                t.join(WAIT_S + 10)
            assert results == {i: "ok" for i in range(READERS)}, results
            assert torch.equal(b.cache.buffer, want.buffer)
            assert len(b._stage_all) >= 2, "the reads were never in flight together"
            assert len(b._stage_free) == len(b._stage_all)  # every buffer back, once each
        kept = len(b._stage_all)
        assert kept <= READERS  # reused, not one more per read
        assert len({id(buf) for buf in b._stage_free}) == kept
        b._return_staging(b._stage_free[0])  # a second return of a buffer changes nothing
        assert len(b._stage_free) == kept


def test_closing_the_endpoint_while_staged_reads_run(monkeypatch):
    """close() from another thread while four staged reads unpack: it returns without raising,
    every reader gets a NixlError naming the close (not a RuntimeError from a staging buffer or
    from the unpack thread), and no unpack is still writing the cache after close() returned."""
    src_plan, dst_plan = _plans()
    src = kvc.allocate(src_plan, fill=7)
    requests = _requests(src_plan, dst_plan)
    log: list = []
    _slow_unpacks(monkeypatch, 0.1, log)
    a = kn.Endpoint("close-src", src)
    b = kn.Endpoint("close-dst", kvc.allocate(dst_plan, fill=0))
    try:
        peer = b.add_peer(a.metadata())
        results: dict = {}
        started: list = []
        threads = _run_readers(b, peer, requests, results, started)
        deadline = time.monotonic() + WAIT_S
        while (not log or len(started) < READERS) and time.monotonic() < deadline:
            time.sleep(0.005)  # every read posted, and one unpack done: they are in flight
        assert log and len(started) == READERS
        b.close()
        closed_at = time.monotonic()
        for t in threads:
            t.join(WAIT_S)
            assert not t.is_alive()
        errors = {i: r for i, r in results.items() if r != "ok"}
        assert errors, "every read finished before close(): the test proved nothing"
        for i, e in errors.items():
            assert isinstance(e, kn.NixlError) and "was closed during" in str(e), (i, repr(e))
        assert all(end <= closed_at for _, end in log), "an unpack ran on after close()"
        assert not b._stage_all and not b._handles
        with pytest.raises(ValueError, match="closed"):
            b.read(peer, requests[0])
    finally:
        b.close()
        a.close()


def test_a_peer_removed_while_reads_run_fails_only_its_reads(monkeypatch):
    """remove_peer() while reads from two peers run: the removed peer's reads raise NixlError,
    the other peer's finish with the right bytes."""
    src_plan, dst_plan = _plans()
    one, two = kvc.allocate(src_plan, fill=1), kvc.allocate(src_plan, fill=2)
    requests = _requests(src_plan, dst_plan)
    log: list = []
    _slow_unpacks(monkeypatch, 0.05, log)
    with kn.Endpoint("rm-one", one) as a1, kn.Endpoint("rm-two", two) as a2, \
            kn.Endpoint("rm-dst", kvc.allocate(dst_plan, fill=0)) as b:
        p1, p2 = b.add_peer(a1.metadata()), b.add_peer(a2.metadata())
        results: dict = {}
        barrier = threading.Barrier(READERS)

        def one_read(i):
            barrier.wait()
            try:
                b.read(p1 if i % 2 == 0 else p2, requests[i], path="staged").wait(WAIT_S)
                results[i] = "ok"
            except BaseException as e:  # noqa: BLE001
                results[i] = e
        threads = [threading.Thread(target=one_read, args=(i,)) for i in range(READERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while not log and time.monotonic() < deadline:
            time.sleep(0.005)
        b.remove_peer(p1)
        for t in threads:
            t.join(WAIT_S + 10)
        for i in range(1, READERS, 2):
            assert results[i] == "ok", results[i]
            assert bool((b.cache.buffer[requests[i][:, 1]] == 2).all())
        for i in range(0, READERS, 2):
            r = results[i]
            assert r == "ok" or (isinstance(r, kn.NixlError) and "was removed" in str(r)), repr(r)
        assert len(b._stage_free) == len(b._stage_all)  # the failed reads' buffers came back
