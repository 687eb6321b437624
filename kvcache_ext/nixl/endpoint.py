"""Moving cache bytes between processes (and machines) with NIXL (SPEC 8).

    ep = kvcache_ext.nixl.Endpoint("decode0", cache)   # registers cache.buffer once
    blob = ep.metadata()                               # bytes, sent to the peer out of band
    peer = ep.add_peer(other_blob)                     # .name, .plan
    spans = kvc.TransferPlan(peer.plan, ep.plan).token_spans(src_table, dst_table, n)
    ep.read(peer, spans).wait(timeout_s=10)            # pull the peer's bytes into our cache
    ep.write(peer, kvc.TransferPlan(ep.plan, peer.plan).block_spans(pairs)).wait(10)
    ep.close()                                         # or: with Endpoint(...) as ep:

Spans are (src_offset, dst_offset, length) rows as a TransferPlan gives them: for read() the
source is the peer's buffer, for write() it is ours. Every span is checked against both buffers,
and overlapping destinations are refused, before anything is posted.

Progress: the owner of memory that a peer reads or writes makes no call while that happens;
it only keeps its Endpoint open. Each Endpoint runs a small poller thread that calls its agent
every `poll_interval_s` (NIXL's own progress thread spins a whole core, which a 2-core host
cannot spare; without any progress the target of a large read never lets it finish). All agent
calls of an Endpoint go through one lock, so the poller and the caller never enter the agent at
once. A handle's wait() drives the initiator's side itself (it polls until done or timeout).

Memory on a GPU (VRAM) is registered as it is; the caller makes sure the kernels that wrote the
bytes have finished (synchronise the stream) before a peer reads them.

Environment: UCX_MODULES=^ib is set here (os.environ.setdefault) before nixl is imported --
without it every process that made an agent dies with SIGSEGV at exit on hosts without
InfiniBand. Set UCX_NET_DEVICES=lo to keep UCX on loopback (tests, benchmarks on one host).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass

if "nixl" not in sys.modules:
    os.environ.setdefault("UCX_MODULES", "^ib")
elif "UCX_MODULES" not in os.environ:
    warnings.warn("nixl was imported before kvcache_ext.nixl without UCX_MODULES set: processes "
                  "may die with SIGSEGV at exit; set UCX_MODULES=^ib before importing nixl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("kvcache_ext.nixl needs NIXL: pip install nixl==1.5.1 (requirements.txt; "
                      f"scripts/setup.sh installs it): {e}") from e

from ..cache import KVCache  # noqa: E402
from ..plan import CachePlan, GroupPlan, plan_from_dict, plan_to_dict  # noqa: E402
from ..transfer import as_spans, check_spans  # noqa: E402

__all__ = ["DEFAULT_POLL_INTERVAL_S", "Endpoint", "NixlError", "Peer", "PeerGoneError",
           "TransferHandle"]

DEFAULT_POLL_INTERVAL_S = 0.0005
_MAGIC = b"KVCNIXL1"
_OPEN: set["Endpoint"] = set()  # closed at interpreter exit, before UCX is torn down


@atexit.register
def _close_open_endpoints() -> None:
    for ep in list(_OPEN):
        try:
            ep.close()
        except Exception:
            pass


class NixlError(RuntimeError):
    """A NIXL transfer failed."""


class PeerGoneError(NixlError, ConnectionError):
    """The peer of a transfer has gone away (its process ended or its Endpoint closed)."""


def _nixl_error(e: Exception, what: str, peer: str) -> NixlError:
    text = f"{type(e).__name__}: {e}"
    if "Disconnect" in type(e).__name__ or "DISCONNECT" in str(e):
        return PeerGoneError(f"{what}: peer {peer!r} has gone away ({text})")
    return NixlError(f"{what} with peer {peer!r} failed ({text})")


@dataclass(frozen=True)
class Peer:
    """A remote Endpoint: its agent name, its plan and where its buffer lives."""

    name: str
    plan: CachePlan | GroupPlan
    address: int
    nbytes: int
    mem_type: str   # "DRAM" or "VRAM"
    device_id: int


class TransferHandle:
    """One posted NIXL transfer. done() polls (and drives progress); wait(timeout_s) returns when
    it has finished, and raises TimeoutError, PeerGoneError or NixlError otherwise."""

    def __init__(self, ep: "Endpoint", xfer, peer: Peer, op: str, spans: int,
                 nbytes: int) -> None:
        self._ep, self._xfer, self.peer, self.op = ep, xfer, peer, op
        self.spans, self.bytes = spans, nbytes
        self._done = xfer is None
        self._abandoned = False  # the Endpoint was closed before the transfer finished
        self._cancelled = False  # cancel() gave it up before it finished

    def _finish(self) -> None:
        if self._xfer is not None:
            self._ep._release(self)
        self._done, self._xfer = True, None

    def done(self) -> bool:
        if self._abandoned:
            raise NixlError(f"Endpoint {self._ep.name!r} was closed during the {self.op} of "
                            f"{self.spans} spans with peer {self.peer.name!r}: its bytes are undefined")
        if self._cancelled:
            raise NixlError(f"the {self.op} of {self.spans} spans with peer {self.peer.name!r} was "
                            "cancelled before it finished: its bytes are undefined")
        if self._done:
            return True
        state = self._ep._state(self)
        if state == "PROC":
            return False
        self._finish()
        if state == "ERR":
            raise NixlError(f"NIXL {self.op} of {self.spans} spans ({self.bytes} B) with peer "
                            f"{self.peer.name!r} failed")
        return True

    def cancel(self) -> None:
        """Give up on an unfinished transfer (NIXL aborts it); the bytes it covers are undefined,
        and done() / wait() raise NixlError from then on. A finished transfer stays finished."""
        if not self._done:
            self._finish()
            self._cancelled = True

    def wait(self, timeout_s: float) -> None:
        """Return when the transfer has finished; raise TimeoutError after timeout_s seconds. A
        timed-out transfer keeps running (its bytes stay undefined) until it finishes or the
        caller calls cancel()."""
        if not (isinstance(timeout_s, (int, float)) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be a number >= 0, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        while not self.done():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"NIXL {self.op} of {self.spans} spans ({self.bytes} B) with "
                                   f"peer {self.peer.name!r} not finished after {timeout_s} s")
            time.sleep(0)  # let the poller and other threads in; keep driving progress


class Endpoint:
    """A cache's flat buffer registered with a NIXL agent named `name` (unique among peers)."""

    def __init__(self, name: str, cache: KVCache, *, poll_interval_s: float | None =
                 DEFAULT_POLL_INTERVAL_S, backends: tuple[str, ...] = ("UCX",),
                 num_threads: int = 0) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        buf = cache.buffer
        if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
            raise ValueError("cache.buffer must be a contiguous 1-D uint8 tensor")
        if poll_interval_s is not None and not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0 or None, got {poll_interval_s!r}")
        self.name, self.cache = name, cache
        self._lock = threading.RLock()
        self._peers: dict[str, Peer] = {}
        self._peer_metadata: dict[str, bytes] = {}  # the blob each peer was added from
        self._handles: set[TransferHandle] = set()
        self._closed = False
        self._mem_type = "VRAM" if buf.is_cuda else "DRAM"
        self._device_id = (buf.device.index or 0) if buf.is_cuda else 0
        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                                   backends=list(backends), num_threads=num_threads)
        self._agent = nixl_agent(name, config)
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise NixlError(f"NIXL backend(s) {missing} not available (plugins: "
                            f"{self._agent.plugin_list})")
        self._reg = self._agent.register_memory(buf)
        _OPEN.add(self)
        self._stop = threading.Event()
        self._poller = None
        if poll_interval_s is not None:
            self._poller = threading.Thread(target=self._poll, args=(poll_interval_s,),
                                            name=f"kvc-nixl-{name}", daemon=True)
            self._poller.start()

    # ---- progress ---------------------------------------------------------------------------
    def _poll(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                if self._closed:
                    return
                try:
                    self._agent.get_new_notifs()  # drives the agent's progress
                except Exception:  # a failing peer shows in its transfers, not here
                    pass

    # ---- metadata ---------------------------------------------------------------------------
    @property
    def plan(self) -> CachePlan | GroupPlan:
        return self.cache.plan

    @property
    def peers(self) -> dict[str, Peer]:
        """The peers added so far, by name."""
        return dict(self._peers)

    def metadata(self) -> bytes:
        """This Endpoint as bytes for a peer's add_peer: agent metadata, plan, buffer address."""
        self._check_open()
        head = json.dumps({"version": 1, "name": self.name, "plan": plan_to_dict(self.plan),
                           "address": self.cache.buffer.data_ptr(),
                           "nbytes": self.cache.buffer.numel(), "mem_type": self._mem_type,
                           "device_id": self._device_id}).encode()
        with self._lock:
            agent_md = self._agent.get_agent_metadata()
        return _MAGIC + len(head).to_bytes(4, "little") + head + agent_md

    def add_peer(self, blob: bytes) -> Peer:
        """Load a peer's metadata (from its metadata()); returns the Peer to read or write."""
        self._check_open()
        if not isinstance(blob, (bytes, bytearray)) or not bytes(blob[:8]) == _MAGIC:
            raise ValueError("blob is not kvcache_ext.nixl metadata (Endpoint.metadata() bytes)")
        try:
            n = int.from_bytes(blob[8:12], "little")
            head = json.loads(bytes(blob[12:12 + n]))
            agent_md = bytes(blob[12 + n:])
            plan = plan_from_dict(head["plan"])
            peer = Peer(head["name"], plan, int(head["address"]), int(head["nbytes"]),
                        head["mem_type"], int(head["device_id"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"blob is not valid kvcache_ext.nixl metadata: {e}") from None
        if peer.name == self.name:
            raise ValueError(f"the peer's name {peer.name!r} is this Endpoint's own name")
        if peer.nbytes < plan.total_bytes:
            raise ValueError(f"peer {peer.name!r} registered {peer.nbytes} bytes, its plan needs "
                             f"{plan.total_bytes}")
        with self._lock:  # one handshake at a time: the same blob twice gives one Peer
            known = self._peers.get(peer.name)
            if known is not None:  # the same handshake again keeps the Peer handed out before
                if self._peer_metadata.get(peer.name) == bytes(blob):
                    return known
                raise ValueError(f"peer {peer.name!r} was added before with other metadata (a "
                                 "restarted peer?): remove_peer() the old Peer first")
            try:
                name = self._agent.add_remote_agent(agent_md)
            except Exception as e:
                raise ValueError(f"NIXL refused the metadata of peer {peer.name!r}: {e}") from None
            if isinstance(name, bytes):
                name = name.decode()
            if name != peer.name:
                raise ValueError(f"blob names peer {peer.name!r} but its agent is {name!r}")
            self._peers[peer.name] = peer
            self._peer_metadata[peer.name] = bytes(blob)
        return peer

    def remove_peer(self, peer: Peer) -> None:
        with self._lock:
            self._peer_metadata.pop(peer.name, None)
            if self._peers.pop(peer.name, None) is not None and not self._closed:
                try:
                    self._agent.remove_remote_agent(peer.name)
                except Exception:
                    pass

    # ---- transfers --------------------------------------------------------------------------
    def read(self, peer: Peer, spans: torch.Tensor) -> TransferHandle:
        """Pull peer bytes into our cache: spans from TransferPlan(peer.plan, self.plan)."""
        return self._post("READ", peer, spans)

    def write(self, peer: Peer, spans: torch.Tensor) -> TransferHandle:
        """Push our bytes into the peer's cache: spans from TransferPlan(self.plan, peer.plan)."""
        return self._post("WRITE", peer, spans)

    def _post(self, op: str, peer: Peer, spans: torch.Tensor) -> TransferHandle:
        self._check_open()
        if not isinstance(peer, Peer) or self._peers.get(peer.name) is not peer:
            raise ValueError(f"peer must be a Peer returned by this Endpoint's add_peer, got "
                             f"{peer!r:.80}")
        spans = as_spans(spans)
        ours = self.cache.buffer.numel()
        src_bytes, dst_bytes = (peer.nbytes, ours) if op == "READ" else (ours, peer.nbytes)
        check_spans(spans, src_bytes, dst_bytes)
        count = int(spans.shape[0])
        nbytes = int(spans[:, 2].sum()) if count else 0
        if count == 0:
            return TransferHandle(self, None, peer, op, 0, 0)
        s = spans.numpy().astype(np.uint64)
        local_off, remote_off = (s[:, 1], s[:, 0]) if op == "READ" else (s[:, 0], s[:, 1])
        local = np.stack([local_off + np.uint64(self.cache.buffer.data_ptr()), s[:, 2],
                          np.full(count, self._device_id, np.uint64)], 1)
        remote = np.stack([remote_off + np.uint64(peer.address), s[:, 2],
                           np.full(count, peer.device_id, np.uint64)], 1)
        with self._lock:
            try:
                xfer = self._agent.initialize_xfer(
                    op, self._agent.get_xfer_descs(local, self._mem_type),
                    self._agent.get_xfer_descs(remote, peer.mem_type), peer.name)
                state = self._agent.transfer(xfer)
            except Exception as e:
                raise _nixl_error(e, f"NIXL {op} of {count} spans", peer.name) from None
            handle = TransferHandle(self, xfer, peer, op, count, nbytes)
            self._handles.add(handle)
        if state != "PROC":
            if state == "ERR":
                handle._finish()
                raise NixlError(f"NIXL {op} of {count} spans with peer {peer.name!r} failed "
                                f"when posted")
            handle._finish()
        return handle

    def _state(self, handle: TransferHandle) -> str:
        with self._lock:
            if self._closed:
                raise NixlError(f"Endpoint {self.name!r} was closed during the {handle.op}")
            try:
                return self._agent.check_xfer_state(handle._xfer)
            except Exception as e:
                handle._done, handle._xfer = True, None
                self._handles.discard(handle)
                raise _nixl_error(e, f"NIXL {handle.op} of {handle.spans} spans",
                                  handle.peer.name) from None

    def _release(self, handle: TransferHandle) -> None:
        with self._lock:
            self._handles.discard(handle)
            if not self._closed and handle._xfer is not None:
                try:
                    self._agent.release_xfer_handle(handle._xfer)
                except Exception:
                    pass

    # ---- lifetime ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"Endpoint {self.name!r} is closed")

    def close(self) -> None:
        """Stop the poller, release unfinished transfers, forget peers, deregister the buffer."""
        if self._closed:
            return
        _OPEN.discard(self)
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        with self._lock:
            for h in list(self._handles):
                try:
                    self._agent.release_xfer_handle(h._xfer)
                except Exception:
                    pass
                h._done, h._xfer, h._abandoned = True, None, True
            self._handles.clear()
            for name in list(self._peers):
                try:
                    self._agent.remove_remote_agent(name)
                except Exception:
                    pass
            self._peers.clear()
            self._peer_metadata.clear()
            try:
                self._agent.deregister_memory(self._reg)
            finally:
                self._closed = True
                self._agent = None

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._peers)} peer(s)"
        return f"Endpoint({self.name!r}, {self.plan.layout}, {self.cache.buffer.numel()} B, {state})"
