"""The consumer worker's shared state under several reads at once (one thread per prompt): the
producers it knows as NIXL peers. The side channel and the Endpoint are stand-ins here, so the
order of events is ours to choose."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace as NS

import pytest

from kvcache_ext.vllm import peers as P
from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.protocol import Remote

LAYERS = ["model.layers.0.self_attn.attn"]


class FakeEndpoint:
    def __init__(self) -> None:
        self.added: list[bytes] = []
        self.removed: list[object] = []
        self.planned: list[object] = []
        self.reserved: list[int] = []  # reserve_runs(tokens) of the plan pairs made

    def add_peer(self, blob: bytes):
        self.added.append(blob)
        return NS(name=blob.decode())

    def remove_peer(self, peer) -> None:
        self.removed.append(peer)

    def transfer_plan(self, peer):
        self.planned.append(peer)
        return NS(reserve_runs=self.reserved.append)


def consumer(monkeypatch, answer) -> W.WorkerSide:
    """A WorkerSide whose side-channel calls go to answer(host, port, message)."""
    cfg = NS(kv_transfer_config=NS(engine_id="consumer"), parallel_config=NS(),
             model_config=NS(max_model_len=4096))
    kv = NS(kv_cache_groups=[NS(layer_names=LAYERS)])
    ws = W.WorkerSide(cfg, kv, ConnectorConfig())
    ws.ep = FakeEndpoint()
    monkeypatch.setattr(P, "call", lambda host, port, m, timeout_s: answer(host, port, m))
    return ws


def remote(host: str, instance: str, engine: str = "producer") -> Remote:
    return Remote(host, 1, engine, instance, "req", 1, (0,), 1, 0.0)


def meta(engine: str, instance: str):
    return {"ok": True, "engine_id": engine, "instance": instance, "layers": LAYERS}, \
        f"{engine}-{instance}".encode()


def test_a_stale_request_does_not_drop_the_live_producer(monkeypatch):
    """The producer was restarted (instance old -> new) and reads of the new one run; a request
    still naming the old instance fails on its own, without removing the live peer that the
    other reads use (it used to: the known instance differed from its parameters', so it
    fetched the metadata again and replaced the peer with the same one)."""
    ws = consumer(monkeypatch, lambda host, port, m: meta("producer", "new"))
    live = ws._peer(remote("h", "new"), 1.0)
    with pytest.raises(W.LoadError, match="instance 'new', the parameters name 'old'"):
        ws._peer(remote("h", "old"), 1.0)
    assert ws.ep.removed == []
    assert ws._peer(remote("h", "new"), 1.0) is live
    assert ws.ep.added == [b"producer-new"]


def test_a_restarted_producer_replaces_its_peer_once(monkeypatch):
    now = {"instance": "one"}
    ws = consumer(monkeypatch, lambda host, port, m: meta("producer", now["instance"]))
    first = ws._peer(remote("h", "one"), 1.0)
    now["instance"] = "two"
    second = ws._peer(remote("h", "two"), 1.0)
    assert second is not first and ws.ep.removed == [first]
    assert ws._peer(remote("h", "two"), 1.0) is second and len(ws.ep.added) == 2
    # the plan pair is made at each handshake (once per producer instance), not per read
    assert ws.ep.planned == [first, second]
    assert ws.ep.reserved == [4096, 4096]  # a longest prompt's runs table, once per producer


def test_a_producer_that_packs_gets_the_packed_reads_table_reserved_too(monkeypatch):
    """With a producer of another block size and a pack buffer, the handshake also faults in
    the packed reads' runs table: for the longest prompt that buffer holds, or max_model_len's
    if less; with one of the same block size (plain reads only) it does not. The plain pair's
    table is reserved but where the pack buffer holds every prompt (all its reads packed)."""
    import kvcache_ext as kvc

    spec = [kvc.CacheSpec("kv", 16, 2, 4)]
    own = kvc.plan_cache(spec, 256, 32, "LBHNC")  # 4 KiB a block
    peers = {"unlike": (kvc.plan_cache(spec, 256, 64, "LBHNC"), 100 * own.block_stride),
             "roomy": (kvc.plan_cache(spec, 256, 64, "LBHNC"), 1 << 30),
             "like": (kvc.plan_cache(spec, 256, 32, "LBHNC"), 1 << 30),
             "no buffer": (kvc.plan_cache(spec, 256, 64, "LBHNC"), 0)}
    ws = consumer(monkeypatch, lambda host, port, m: meta(host, "1"))
    ws.ep.plan = own
    ws.ep.add_peer = lambda blob: NS(plan=peers[blob.decode()[:-2]][0],
                                     exposed_nbytes=peers[blob.decode()[:-2]][1])
    packed: list[int] = []
    ws.producers.packs = NS(reserve=packed.append)
    for host in ("unlike", "roomy", "like", "no buffer"):
        r = remote(host, "1", engine=host)
        ws._peer(r, 1.0)
        ws._peer(r, 1.0)  # known: nothing reserved again
    assert packed == [100 * 32, 4096]
    # the plain plan pair of every producer but "roomy", whose buffer holds every prompt
    assert ws.ep.reserved == [4096] * 3


def test_a_silent_producer_holds_up_no_other_read(monkeypatch):
    """One producer does not answer its side channel; a read from another producer goes on
    meanwhile (the lock over the known peers used to be held across the call)."""
    release = threading.Event()

    def answer(host, port, m):
        if host == "silent":
            release.wait(5.0)
        return meta(host, "i")
    ws = consumer(monkeypatch, answer)
    stuck = threading.Thread(target=lambda: ws._peer(remote("silent", "i", "silent"), 10.0))
    stuck.start()
    time.sleep(0.2)  # the first read is inside its call
    t = time.monotonic()
    ws._peer(remote("lively", "i", "lively"), 10.0)
    took = time.monotonic() - t
    release.set()
    stuck.join(10)
    assert took < 1.0, f"the second producer's read waited {took:.1f} s for the first's"


def test_concurrent_first_reads_add_one_peer(monkeypatch):
    """Eight reads of one new producer at once: one peer is added and all get it."""
    def answer(host, port, m):
        time.sleep(0.05)
        return meta("producer", "i")
    ws = consumer(monkeypatch, answer)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(ws._peer(remote("h", "i"), 5.0)))
               for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert len(got) == 8 and all(p is got[0] for p in got)
    assert ws.ep.added == [b"producer-i"] and ws.ep.planned == [got[0]]
