"""The side channel's reader (kvcache_ext/vllm/side_channel.py): messages that have already
arrived are parsed from one recv, not fetched a socket call each (each lets go of the GIL, which
a busy engine thread may keep for a switch interval), and the framing holds however the bytes
are cut."""
from __future__ import annotations

import socket
import threading

import pytest

from kvcache_ext.vllm.side_channel import Reader, recv, send


class _Counting:
    """A socket whose calls are counted (the ones that let go of the GIL)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.calls = sock, 0

    def recv(self, n: int) -> bytes:
        self.calls += 1
        return self.sock.recv(n)

    def settimeout(self, t: float) -> None:
        self.calls += 1
        self.sock.settimeout(t)


def test_replies_that_have_arrived_are_read_in_one_call_each_with_its_blob():
    a, b = socket.socketpair()
    with a, b:
        msgs = [({"ok": True, "part": p, "pack_s": 0.001 * p}, bytes([p]) * (p % 3)) for p in range(8)]
        for m, blob in msgs:
            send(a, m, blob)
        a.close()
        counted = _Counting(b)
        reader = Reader(counted, left=lambda: 5.0)
        got = [reader.message() for _ in msgs]
        assert got == msgs
        # one timeout and one recv brought all eight; the end of the stream is one more recv
        assert counted.calls == 2, counted.calls
        assert reader.message() is None and counted.calls == 4


def test_a_message_cut_into_single_bytes_is_put_back_together():
    a, b = socket.socketpair()
    with a, b:
        m, blob = {"ok": True, "why": "x" * 300}, bytes(range(256)) * 3
        head = bytearray()
        sender = socket.socketpair()
        with sender[0], sender[1]:
            send(sender[0], m, blob)
            sender[0].close()
            while chunk := sender[1].recv(1 << 16):
                head += chunk

        def drip() -> None:
            for i in range(len(head)):
                a.sendall(head[i:i + 1])
            send(a, {"ok": True, "part": 0})
        t = threading.Thread(target=drip)
        t.start()
        b.settimeout(10)
        reader = Reader(b)
        assert reader.message() == (m, blob)
        assert reader.message() == ({"ok": True, "part": 0}, b"")
        t.join()


@pytest.mark.parametrize("cut", [3, 8, 20])  # in the header, at its end, in the JSON
def test_a_connection_closed_mid_message_raises_and_between_messages_ends(cut):
    a, b = socket.socketpair()
    with a, b:
        send(a, {"ok": True})
        whole = socket.socketpair()
        with whole[0], whole[1]:
            send(whole[0], {"ok": True, "why": "y" * 40}, b"blob")
            partial = whole[1].recv(1 << 16)[:cut]
        a.sendall(partial)
        a.close()
        b.settimeout(10)
        reader = Reader(b)
        assert reader.message() == ({"ok": True}, b"")
        with pytest.raises(ConnectionError, match="closed mid-message"):
            reader.message()
    c, d = socket.socketpair()
    with c, d:
        c.close()
        with pytest.raises(ConnectionError, match="closed before a message"):
            recv(d)


@pytest.mark.parametrize("blob_bytes", [0, (1 << 16) - 1, (1 << 16) + 1, (1 << 20) + 1, 3 << 20])
def test_blobs_past_one_recv_keep_their_bytes_and_the_next_message(blob_bytes):
    a, b = socket.socketpair()
    with a, b:
        blob = bytes(range(251)) * (blob_bytes // 251) + bytes(blob_bytes % 251)

        def write() -> None:  # a blob larger than the socket's buffer needs a reader meanwhile
            send(a, {"ok": True, "n": blob_bytes}, blob)
            send(a, {"ok": True, "part": 1})
            a.shutdown(socket.SHUT_WR)
        t = threading.Thread(target=write)
        t.start()
        reader = Reader(b, left=lambda: 10.0)
        assert reader.message() == ({"ok": True, "n": blob_bytes}, blob)
        assert reader.message() == ({"ok": True, "part": 1}, b"")
        assert reader.message() is None
        t.join()
