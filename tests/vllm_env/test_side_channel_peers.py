"""The side channel against peers that do not play by its rules (kvcache_ext/vllm/side_channel.py):
a silent or byte-dripping peer is cut off by the whole message's deadline while every other peer
is answered, oversized frames and headers that are not a JSON object are refused before they are
used, at the server and in the consumer's reader, and fuzzed frames and field values (the
producer's own handler behind the server) never crash or hang it."""
from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace as NS

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.producer import Hold
from kvcache_ext.vllm.side_channel import (HEADER, MAX_BLOB_BYTES, MAX_HEAD_BYTES, FrameError,
                                          Reader, Server, call, recv, send)

DEADLINE_S = 1.0


def echo(m: dict):
    return {"ok": True, "echo": m}, b""


@pytest.fixture
def server():
    s = Server("127.0.0.1", 0, echo, message_timeout_s=DEADLINE_S)
    yield s
    s.close()


def frame(message, blob: bytes = b"") -> bytes:
    head = json.dumps(message).encode()
    return HEADER.pack(len(head), len(blob)) + head + blob


def closed_after(sock: socket.socket, limit_s: float = 8.0) -> float:
    """Seconds until the server closes this connection (what it sent before is skipped)."""
    t = time.monotonic()
    sock.settimeout(limit_s)
    while sock.recv(1 << 16):
        pass
    return time.monotonic() - t


def drip(sock: socket.socket, data: bytes, stop: threading.Event) -> None:
    """data a byte every 0.05 s, until it is all sent, the peer is gone or stop is set."""
    for b in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([b]))
        except OSError:
            return
        time.sleep(0.05)


def test_a_silent_peer_is_cut_off_while_every_other_peer_is_answered(server):
    silent = socket.create_connection(server.at)
    with silent:
        t = time.monotonic()
        for i in range(20):  # answered at once, with the silent connection open
            assert call(server.host, server.port, {"i": i}, 5.0)[0] == {"ok": True, "echo": {"i": i}}
        assert time.monotonic() - t < DEADLINE_S  # none waited for the silent peer
        assert closed_after(silent) < DEADLINE_S + 2.0


def test_a_peer_dripping_a_byte_at_a_time_is_cut_off_by_the_message_deadline(server):
    """Each byte comes well inside any per-recv timeout; the message as a whole is not done by
    its deadline, so the connection ends then (the drip would take about 6 s)."""
    data = frame({"op": "x" * 100})
    sock = socket.create_connection(server.at)
    stop = threading.Event()
    t = threading.Thread(target=drip, args=(sock, data, stop))
    t.start()
    try:
        assert closed_after(sock) < DEADLINE_S + 2.0
    finally:
        stop.set()
        t.join()
        sock.close()


@pytest.mark.parametrize("head,blob", [(MAX_HEAD_BYTES + 1, 0), (2**32 - 1, 0), (2, 1),
                                       (2, 2**32 - 1)])
def test_an_oversized_request_is_refused_before_it_is_read(server, head, blob):
    with socket.create_connection(server.at) as sock:
        sock.sendall(HEADER.pack(head, blob))  # and nothing of what the header announces
        reply, _ = recv(sock, lambda: 5.0)
        assert reply["ok"] is False and "at most" in reply["why"]
        assert closed_after(sock) < 5.0


@pytest.mark.parametrize("head", [b"not json", b"[1, 2]", b'"text"', b"7", b"null", b"\xff\xfe{}",
                                  b'{"a": 1'])
def test_a_header_that_is_not_a_json_object_is_refused(server, head):
    with socket.create_connection(server.at) as sock:
        sock.sendall(HEADER.pack(len(head), 0) + head)
        reply, _ = recv(sock, lambda: 5.0)
        assert reply["ok"] is False and "JSON" in reply["why"]


@pytest.mark.parametrize("raw,why", [
    (HEADER.pack(MAX_HEAD_BYTES + 1, 0), "at most"),
    (HEADER.pack(2, MAX_BLOB_BYTES + 1) + b"{}", "at most"),
    (HEADER.pack(3, 0) + b"[1]", "JSON object"),
])
def test_the_consumers_reader_refuses_a_bad_reply(raw, why):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        with pytest.raises(FrameError, match=why):
            Reader(b, lambda: 5.0).message()


def test_a_call_is_bounded_in_all_not_per_recv():
    """A producer that drips its reply a byte every 0.05 s: call() gives up at its timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    data = frame({"ok": True, "pad": "x" * 200})

    def producer():
        conn, _ = listener.accept()
        with conn:
            drip(conn, data, threading.Event())
    t = threading.Thread(target=producer)
    t.start()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        call("127.0.0.1", listener.getsockname()[1], {"op": "meta"}, 1.0)
    assert time.monotonic() - start < 3.0
    t.join()
    listener.close()


# ---- fuzz: frames, and field values through the producer's own handler ------------------------
INSTANCE = "<the producer's instance>"  # replaced by it when sent: acquires reach the holds
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                          max_size=4),
                    max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "op": st.sampled_from(["meta", "acquire", "release", "nope"]) | JSON,
    "request_id": st.sampled_from(["r"]) | JSON, "generation": st.sampled_from([1]) | JSON,
    "instance": st.just(INSTANCE) | JSON, "timeout_s": JSON, "debug_delay_s": JSON,
    "block_ids": st.just([[1, 2]]) | JSON, "num_tokens": st.just(40) | JSON, "lease": JSON,
    "pack": JSON})
BLOCKS = ((1, 2),)  # what the producer holds for r
DEEP = b"[" * 100_000 + b"]" * 100_000  # json's recursion limit
HUGE_INT = b'{"generation": ' + b"9" * 5000 + b"}"  # past Python's int-string limit


@st.composite
def frames(draw) -> dict | bytes:
    """A message (random fields, the producer's own instance among them; sometimes a blob,
    which a request may not carry) or bytes: a header whose lengths say anything, raw bytes,
    headers json cannot take."""
    kind = draw(st.sampled_from(["message", "message", "lengths", "raw", "unparsable"]))
    if kind == "message":
        return {"fields": draw(FIELDS), "blob": draw(st.binary(max_size=8) | st.just(b""))}
    if kind == "lengths":
        head = HEADER.pack(draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)))
        return head + draw(st.binary(max_size=64))
    if kind == "unparsable":
        head = draw(st.sampled_from([DEEP, HUGE_INT, b"\xff" * 3, b"NaN", b"{'a': 1}"]))
        return HEADER.pack(len(head), 0) + head
    return draw(st.binary(max_size=64))


@pytest.fixture(scope="module")
def producer_server():
    """The producer worker's own _serve behind a server, holding request r (hand-off 1); an
    acquire for a request it does not hold waits 0.05 s here, not 5 s."""
    vcfg = NS(kv_transfer_config=NS(engine_id="producer"), parallel_config=NS(),
              model_config=NS(max_model_len=4096))
    ws = W.WorkerSide(vcfg, NS(kv_cache_groups=[NS(layer_names=["l0"])]),
                      ConnectorConfig(acquire_wait_s=0.05))
    ws._holds["r"] = Hold(generation=1, expiry_time=time.time() + 3600, block_ids=BLOCKS, num_tokens=40)
    s = Server("127.0.0.1", 0, ws._serve, message_timeout_s=2.0)
    yield s, ws
    s.close()


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=frames())
def test_fuzzed_frames_never_crash_or_hang_the_server(producer_server, data):
    s, ws = producer_server
    if "r" not in ws._holds:  # a fuzzed release freed it
        ws._holds["r"] = Hold(generation=1, expiry_time=time.time() + 3600, block_ids=BLOCKS, num_tokens=40)
    message = isinstance(data, dict)
    if message:
        fields = {k: ws.instance if v == INSTANCE else v for k, v in data["fields"].items()}
        data = frame(fields, data["blob"])
    with socket.create_connection(s.at, timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # what it sent is all there is
        got = b""
        t = time.monotonic()
        while chunk := sock.recv(1 << 16):  # the server answers or closes, in time
            got += chunk
        assert time.monotonic() - t < 5.0
    assert got or not message  # a whole message is always answered (a refusal says why)
    if got:  # a reply is one well-formed frame whose header says ok or not
        a, b = socket.socketpair()
        with a, b:
            a.sendall(got)
            a.close()
            reply, _ = Reader(b, lambda: 1.0).message()
        assert isinstance(reply.get("ok"), bool), reply


def test_after_the_fuzz_the_server_still_answers(producer_server):
    s, ws = producer_server
    ws._holds["r2"] = Hold(generation=1, expiry_time=time.time() + 3600, block_ids=BLOCKS, num_tokens=40)  # (r: released?)
    reply, _ = call(s.host, s.port, {"op": "acquire", "request_id": "r2", "generation": 1,
                                     "instance": ws.instance, "timeout_s": 1e9,
                                     "block_ids": [[1, 2]], "num_tokens": 40}, 5.0)
    assert reply == {"ok": True, "block_ids": [[1, 2]], "lease": reply["lease"]}
    assert ws._holds["r2"].leases == {reply["lease"]}
    assert ws._holds["r2"].read_deadline <= time.time() + ws.cfg.read_timeout_s


def test_connections_past_the_cap_are_closed_and_served_again_in_time():
    """A peer holding its share of the slots (half of them: silent connections): one more
    connection from it is closed at once, unanswered, while a peer at another address is still
    answered; the slots come back when the silent ones are cut at the deadline."""
    s = Server("127.0.0.1", 0, echo, message_timeout_s=DEADLINE_S, max_connections=4)
    try:
        silent = [socket.create_connection(s.at) for _ in range(2)]
        time.sleep(0.2)  # both accepted
        with socket.create_connection(s.at) as third:  # (it sends nothing: a close, no reset)
            assert closed_after(third, 3.0) < 0.5
        with socket.create_connection(s.at, source_address=("127.0.0.2", 0)) as other:
            other.sendall(frame({"op": "other"}))
            other.settimeout(3.0)
            reply, _ = recv(other, lambda: 3.0)
            assert reply["echo"] == {"op": "other"}
        for x in silent:
            assert closed_after(x) < DEADLINE_S + 2.0
            x.close()
        time.sleep(0.1)
        assert call(s.host, s.port, {"op": "hello"}, 5.0)[0]["echo"] == {"op": "hello"}
    finally:
        s.close()
