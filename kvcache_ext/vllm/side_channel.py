"""The side channel between a consumer's worker and a producer's worker: small request-reply
messages over TCP (a JSON header and an optional binary blob, each length-prefixed), served by
a thread of the producer's worker. A handler may also answer with a stream of replies on the
same connection (the packed read's "part p is ready" notices): stream() reads them as they
come. Every call is bounded by its timeout.

A peer's frames are untrusted at both ends: a header longer than MAX_HEAD_BYTES, a blob longer
than the reader allows (MAX_BLOB_BYTES; none in a request), a header that is not a JSON object,
or a message not complete by its deadline (the whole message's, not each recv's: a peer that
goes silent or drips a byte at a time is cut off just the same) ends that connection; the
server's other connections are answered meanwhile (a thread each)."""
from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
import time
from typing import Callable, Iterator

HEADER = struct.Struct("<II")  # a frame's header: its JSON bytes, its blob bytes (little-endian)
MAX_HEAD_BYTES = 1 << 20       # a message's JSON (the largest, a packed read's ask: kilobytes)
MAX_BLOB_BYTES = 64 << 20      # a reply's blob (a producer's NIXL metadata: kilobytes)
MESSAGE_TIMEOUT_S = 10.0       # the server's deadline for one request, from its connection


class FrameError(ValueError):
    """A frame that breaks the side channel's rules (size, JSON object)."""


def send(sock: socket.socket, message: dict, blob: bytes = b"") -> None:
    head = json.dumps(message).encode()
    sock.sendall(HEADER.pack(len(head), len(blob)) + head + blob)


class Reader:
    """The messages of one connection, in order, read in as few recv calls as the bytes allow:
    replies that have already arrived are parsed from what one recv brought in (up to 64 KiB),
    not fetched a recv each -- every socket call (settimeout too) lets go of the GIL, and in an
    engine's worker, whose main thread keeps it busy, taking it back can cost a switch interval
    (5 ms). left(): the seconds left to the caller's deadline, set as the socket's timeout
    before each recv (none: the socket's own); TimeoutError once it has passed. max_blob: the
    largest blob this end takes (0 for a server's requests)."""

    def __init__(self, sock: socket.socket, left: Callable[[], float] | None = None,
                 max_blob: int = MAX_BLOB_BYTES) -> None:
        self.sock, self.left, self.max_blob = sock, left, max_blob
        self._buf = bytearray()

    def _fill(self, need: int) -> bool:
        """At least `need` bytes buffered; False at the end of the stream with none buffered."""
        while len(self._buf) < need:
            if self.left is not None:
                left = self.left()
                if not left > 0:
                    raise TimeoutError("a side-channel message not complete by its deadline")
                self.sock.settimeout(left)
            chunk = self.sock.recv(min(max(need - len(self._buf), 1 << 16), 1 << 20))
            if not chunk:
                if self._buf:
                    raise ConnectionError("the side channel closed mid-message")
                return False
            self._buf += chunk
        return True

    def message(self) -> tuple[dict, bytes] | None:
        """The next message, or None where the peer closed the connection between messages."""
        if not self._fill(HEADER.size):
            return None
        n_head, n_blob = HEADER.unpack_from(self._buf)
        if n_head > MAX_HEAD_BYTES or n_blob > self.max_blob:  # before a byte of it is read
            raise FrameError(f"a side-channel frame of {n_head} + {n_blob} bytes: at most "
                             f"{MAX_HEAD_BYTES} + {self.max_blob}")
        end = HEADER.size + n_head + n_blob
        if not self._fill(end):
            raise ConnectionError("the side channel closed mid-message")
        head, blob = self._buf[HEADER.size:HEADER.size + n_head], self._buf[end - n_blob:end]
        try:
            message = json.loads(bytes(head))
        except (ValueError, RecursionError) as e:  # not UTF-8 or JSON, a 5000-digit int, [[[[...
            raise FrameError(f"a side-channel frame whose header is not JSON: "
                             f"{type(e).__name__}: {str(e)[:200]}") from None
        if not isinstance(message, dict):
            raise FrameError(f"a side-channel frame whose header is not a JSON object: "
                             f"{type(message).__name__}")
        del self._buf[:end]
        return message, bytes(blob)


def recv(sock: socket.socket, left: Callable[[], float] | None = None,
         max_blob: int = MAX_BLOB_BYTES) -> tuple[dict, bytes]:
    """One message (ConnectionError if the connection closes first). Reads past it: for a
    connection that carries one message, as call() and the server's requests do."""
    got = Reader(sock, left, max_blob).message()
    if got is None:
        raise ConnectionError("the side channel closed before a message")
    return got


def stream(host: str, port: int, message: dict,
           left: Callable[[], float]) -> Iterator[tuple[dict, bytes]]:
    """One request and the replies the producer streams back, as they come, until it closes
    the connection; every wait ends by the caller's deadline (left(): the seconds left to it,
    asked before each recv, so a reply already read in comes back without asking: the socket
    times out once it has passed). Closing the generator closes the connection."""
    with socket.create_connection((host, port), timeout=left()) as sock:
        sock.settimeout(left())
        send(sock, message)
        reader = Reader(sock, left)
        while True:
            got = reader.message()
            if got is None:
                return
            yield got


def call(host: str, port: int, message: dict, timeout_s: float) -> tuple[dict, bytes]:
    """One request and its reply; OSError / TimeoutError / ConnectionError when the producer
    has not answered in full within timeout_s (in all), FrameError for a reply that breaks the
    rules."""
    deadline = time.monotonic() + timeout_s
    left = lambda: deadline - time.monotonic()  # noqa: E731
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(max(left(), 0.001))  # connecting, sending and the reply: timeout_s in all
        send(sock, message)
        return recv(sock, left)


Handler = Callable[[dict], "tuple[dict, bytes] | Iterator[tuple[dict, bytes]]"]


class Server:
    """Serves `handler(message) -> (reply, blob)`, or an iterator of them (streamed, then the
    connection closes), on (host, port) only; port 0 picks a free one. A request (no blob) must
    arrive whole within message_timeout_s of its connection, and each reply be taken within
    that long, or the connection ends. At most max_connections are served at once (each holds a
    thread), and at most half of them from one address: one more is closed unanswered, so
    one peer's silent connections leave the others room."""

    def __init__(self, host: str, port: int, handler: Handler,
                 message_timeout_s: float = MESSAGE_TIMEOUT_S, max_connections: int = 128) -> None:
        per_peer = max(1, max_connections // 2)
        open_from: dict[str, int] = {}  # connections served now, by peer address
        lock = threading.Lock()

        def take(addr: str) -> bool:
            with lock:
                if sum(open_from.values()) >= max_connections or open_from.get(addr, 0) >= per_peer:
                    return False
                open_from[addr] = open_from.get(addr, 0) + 1
                return True

        def give(addr: str) -> None:
            with lock:
                open_from[addr] -= 1
                if not open_from[addr]:
                    del open_from[addr]
        class _Request(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                deadline = time.monotonic() + message_timeout_s
                try:
                    message, _ = recv(self.request, lambda: deadline - time.monotonic(), 0)
                except FrameError as e:  # oversized, not a JSON object: say so, and close
                    try:
                        self.request.settimeout(1.0)
                        send(self.request, {"ok": False, "why": str(e)})
                    except OSError:
                        pass
                    return
                except OSError:  # silent, dripping or cut off: the connection just closes
                    return
                self.request.settimeout(message_timeout_s)  # a reply the peer never takes
                try:
                    out = handler(message)
                except Exception as e:  # noqa: BLE001 - a bad request gets its error back
                    out = {"ok": False, "why": f"{type(e).__name__}: {e}"}, b""
                if isinstance(out, tuple):
                    out = iter((out,))
                try:
                    for reply, blob in out:
                        send(self.request, reply, blob)
                except OSError:
                    pass  # the caller has gone: the stream's own finally cleans up
                except Exception as e:  # noqa: BLE001 - a stream that fails says why, last
                    try:
                        send(self.request, {"ok": False, "why": f"{type(e).__name__}: {e}"})
                    except OSError:
                        pass
                finally:
                    close = getattr(out, "close", None)
                    if close is not None:
                        close()

        class _Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

            def process_request(self, request, client_address) -> None:
                if not take(client_address[0]):  # past a cap: closed at once, unanswered
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    give(client_address[0])
                    raise

            def process_request_thread(self, request, client_address) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    give(client_address[0])

        self._server = _Server((host, port), _Request)
        self.host, self.port = host, self._server.server_address[1]
        self.at = (self.host, self.port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="kvc-side-channel",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
