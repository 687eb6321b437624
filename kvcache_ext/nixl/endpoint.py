"""Moving cache bytes between processes (and machines) with NIXL (SPEC 8).

    ep = kvcache_ext.nixl.Endpoint("decode0", cache)   # registers cache.buffer once
    blob = ep.metadata()                               # bytes, sent to the peer out of band
    peer = ep.add_peer(other_blob)                     # .name, .plan
    spans = kvc.TransferPlan(peer.plan, ep.plan).token_spans(src_table, dst_table, n)
    ep.read(peer, spans).wait(timeout_s=10)            # pull the peer's bytes into our cache
    ep.read_tokens(peer, src_table, dst_table, n).wait(10)  # the same, planned per peer once
    ep.write(peer, kvc.TransferPlan(ep.plan, peer.plan).block_spans(pairs)).wait(10)
    ep.close()                                         # or: with Endpoint(...) as ep:

An Endpoint made with exposed_bytes=n also registers a buffer of its own, `ep.exposed` (n bytes),
that peers may read with read_exposed(peer, runs): a producer packs a request there in the
consumer's page form (kvcache_ext.transfer.pack), the consumer reads it into place.

Spans are (src_offset, dst_offset, length) rows as a TransferPlan gives them, or strided runs
(src_offset, dst_offset, length, src_stride, dst_stride, count) as its token_runs gives them: for
read() the source is the peer's buffer, for write() it is ours. Every span (run) is checked
against both buffers, and overlapping destinations are refused, before anything is posted.
read_tokens plans the runs itself, in compiled code, from a TransferPlan made once per peer.

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
import os
import sys
import threading
import time
import warnings

if "nixl" not in sys.modules:
    os.environ.setdefault("UCX_MODULES", "^ib")
elif "UCX_MODULES" not in os.environ:
    warnings.warn("nixl was imported before kvcache_ext.nixl without UCX_MODULES set: processes "
                  "may die with SIGSEGV at exit; set UCX_MODULES=^ib before importing nixl")

import torch  # noqa: E402

try:
    from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("kvcache_ext.nixl needs NIXL: pip install nixl==1.5.1 (requirements.txt; "
                      f"scripts/setup.sh installs it): {e}") from e

from ..cache import KVCache  # noqa: E402
from ..cache.buffer import host_buffer  # noqa: E402
from ..plan import CachePlan, GroupPlan  # noqa: E402
from ..transfer import (GroupTransferPlan, TransferPlan, as_runs, as_spans,  # noqa: E402
                        check_runs, check_spans, plan_transfer, runs_of_spans)
from . import paths, run_paths  # noqa: E402
from .handle import (NixlError, PeerGoneError, TransferHandle, TransferStats,  # noqa: E402
                     nixl_error)
from .exposed import ExposedReads  # noqa: E402
from .peers import Peer, PeerTable  # noqa: E402
from .resources import TransferResources  # noqa: E402

__all__ = ["DEFAULT_POLL_INTERVAL_S", "Endpoint", "NixlError", "Peer", "PeerGoneError",
           "TransferHandle", "TransferStats"]

DEFAULT_POLL_INTERVAL_S = 0.0005
_OPEN: set["Endpoint"] = set()  # closed at interpreter exit, before UCX is torn down


@atexit.register
def _close_open_endpoints() -> None:
    for ep in list(_OPEN):
        try:
            ep.close()
        except Exception:
            pass


class Endpoint(PeerTable, TransferResources, ExposedReads):
    """A cache's flat buffer registered with a NIXL agent named `name` (unique among peers)."""

    def __init__(self, name: str, cache: KVCache, *, poll_interval_s: float | None =
                 DEFAULT_POLL_INTERVAL_S, backends: tuple[str, ...] = ("UCX",),
                 num_threads: int = 0, exposed_bytes: int = 0) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        buf = cache.buffer
        if buf.dtype != torch.uint8 or buf.dim() != 1 or not buf.is_contiguous():
            raise ValueError("cache.buffer must be a contiguous 1-D uint8 tensor")
        if poll_interval_s is not None and not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0 or None, got {poll_interval_s!r}")
        if isinstance(exposed_bytes, bool) or not isinstance(exposed_bytes, int) or exposed_bytes < 0:
            raise ValueError(f"exposed_bytes must be an int >= 0, got {exposed_bytes!r}")
        self.name, self.cache = name, cache
        self._lock = threading.RLock()
        self._peers: dict[str, Peer] = {}
        self._peer_metadata: dict[str, bytes] = {}  # the blob each peer was added from
        self._xplans: dict[str, TransferPlan | GroupTransferPlan] = {}  # peer -> (its plan, ours)
        self._handles: set[TransferHandle] = set()
        self._local_grids: dict[int, object] = {}              # granule -> prepared local list
        self._peer_grids: dict[tuple[str, int], object] = {}   # (peer, granule) -> remote list
        self._stage_all: list[tuple[torch.Tensor, object]] = []  # staging buffers, registered
        self._stage_free: list[torch.Tensor] = []  # those of _stage_all lent to no transfer
        self.strided = paths.nixl_has_strided()
        self._unpack_pool = None  # resources.py: made on first staged read
        self._closed = False   # the agent is gone
        self._closing = False  # close() has begun: no transfer starts or goes on
        self._mem_type = "VRAM" if buf.is_cuda else "DRAM"
        self._device_id = (buf.device.index or 0) if buf.is_cuda else 0
        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                                   backends=list(backends), num_threads=num_threads,
                                   capture_telemetry=True)  # pieces posted, in the stats
        self._agent = nixl_agent(name, config)
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise NixlError(f"NIXL backend(s) {missing} not available (plugins: "
                            f"{self._agent.plugin_list})")
        self._reg = self._agent.register_memory(buf)
        # a buffer of ours that peers read (read_exposed): registered before any metadata()
        self.exposed: torch.Tensor | None = None
        self._exposed_reg = None
        if exposed_bytes:
            self.exposed = host_buffer(exposed_bytes, buf.device)
            self.exposed.zero_()  # touched now, not during a read
            self._exposed_reg = self._agent.register_memory(self.exposed)
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

    # ---- transfers --------------------------------------------------------------------------
    def read(self, peer: Peer, spans: torch.Tensor, path: str = "auto") -> TransferHandle:
        """Pull peer bytes into our cache: spans [S, 3] or runs [R, 6] from
        transfer_plan(peer) (TransferPlan or GroupTransferPlan: peer.plan -> self.plan). path:
        "auto" (the cheapest the measurements support, paths.py), or force "plain", "prepared",
        "strided" (nixl >= 1.5) or "staged"; the bytes are the same either way."""
        return self._transfer("READ", peer, spans, path)

    def transfer_plan(self, peer: Peer) -> TransferPlan | GroupTransferPlan:
        """The plan pair from the peer's plan to ours (kvc.plan_transfer: a TransferPlan between
        cache plans, a GroupTransferPlan between group plans), made on first use and kept until
        the peer is removed (what depends only on the two plans is computed once per peer)."""
        with self._lock:
            xp = self._xplans.get(peer.name)
            if xp is None or xp.src_plan is not peer.plan:
                if isinstance(peer.plan, GroupPlan) != isinstance(self.plan, GroupPlan):
                    kind = lambda p: type(p).__name__  # noqa: E731
                    raise ValueError(f"peer {peer.name!r} has a {kind(peer.plan)} and this "
                                     f"Endpoint a {kind(self.plan)}: bytes move only between "
                                     f"plans of one kind")
                xp = plan_transfer(peer.plan, self.plan)
                if self._peers.get(peer.name) is peer:  # not kept for a peer removed meanwhile
                    self._xplans[peer.name] = xp
            return xp

    def read_tokens(self, peer: Peer, src_block_table: torch.Tensor,
                    dst_block_table: torch.Tensor, num_tokens: int, src_start: int = 0,
                    dst_start: int = 0, path: str = "auto") -> TransferHandle:
        """Pull num_tokens tokens (from src_start in the peer's block table, to dst_start in
        ours) into our cache, any two block sizes: the runs planned in compiled code
        (TransferPlan.token_runs, the plan pair kept per peer), timed as stats.plan_s (wall)
        and stats.plan_cpu_s (this thread's CPU), then read(peer, runs, path) -- staged and
        re-tiled in one pass where that is cheaper."""
        self._check_open()
        self._check_peer(peer)
        if isinstance(self.plan, GroupPlan):
            raise ValueError("read_tokens moves the tokens of a cache plan (one block table); a "
                             "group plan's request: read(peer, transfer_plan(peer).token_runs("
                             "{group: (src_block_table, dst_block_table)}, num_tokens))")
        t, c = time.perf_counter(), time.thread_time()
        runs = self.transfer_plan(peer).token_runs(src_block_table, dst_block_table, num_tokens,
                                                   src_start, dst_start)
        plan_s, plan_cpu_s = time.perf_counter() - t, time.thread_time() - c
        handle = self._transfer("READ", peer, runs, path)
        handle.stats.plan_s, handle.stats.plan_cpu_s = plan_s, plan_cpu_s
        return handle

    def write(self, peer: Peer, spans: torch.Tensor, path: str = "auto") -> TransferHandle:
        """Push our bytes into the peer's cache: spans from TransferPlan(self.plan, peer.plan).
        path: "auto", "plain", "prepared" or "strided" (staging is for reads)."""
        return self._transfer("WRITE", peer, spans, path)

    def _check_peer(self, peer: Peer) -> None:
        if not isinstance(peer, Peer) or self._peers.get(peer.name) is not peer:
            raise ValueError(f"peer must be a Peer returned by this Endpoint's add_peer (and not "
                             f"removed since), got {peer!r:.80}")

    def _transfer(self, op: str, peer: Peer, spans: torch.Tensor, path: str) -> TransferHandle:
        t0 = time.perf_counter()
        self._check_open()
        self._check_peer(peer)
        paths.check_path(path, op, self.strided)
        ours = self.cache.buffer.numel()
        src_bytes, dst_bytes = (peer.nbytes, ours) if op == "READ" else (ours, peer.nbytes)
        if isinstance(spans, torch.Tensor) and spans.dim() == 2 and spans.shape[1] == 6:
            return self._transfer_runs(op, peer, spans, path, src_bytes, dst_bytes, t0)
        spans = as_spans(spans)
        check_spans(spans, src_bytes, dst_bytes)
        keep = spans[:, 2] > 0
        s = spans[keep].numpy() if not bool(keep.all()) else spans.numpy()
        remote_off, local_off = (s[:, 0], s[:, 1]) if op == "READ" else (s[:, 1], s[:, 0])
        lengths = s[:, 2]
        stats = TransferStats(path="plain", spans=int(spans.shape[0]), bytes=int(lengths.sum()))
        if lengths.size == 0:
            return TransferHandle(self, peer, op, [], stats)
        if path == "auto":
            path = "plain"
            if op == "READ" and lengths.size >= paths.AUTO_MIN_SPANS:
                e_len = paths.extents(remote_off, lengths)[3]
                path = paths.choose(op, lengths, int(e_len.size), int(e_len.sum()))
        g = paths.granule(local_off, remote_off, lengths) if path == "prepared" else 0
        if path == "prepared" and not paths.prepared_fits(ours, peer.nbytes, stats.bytes, g):
            raise ValueError(f"path='prepared': the spans' offsets and lengths share a granule of "
                             f"only {g} B, which makes {stats.bytes // g} indices for this transfer "
                             f"(at most {paths.PREPARED_MAX_INDICES}): use 'strided' or 'staged'")
        stats.path = path
        if path == "plain":
            parts = paths.plain_parts(self, peer, op, local_off, remote_off, lengths, stats)
        elif path == "prepared":
            parts = paths.prepared_parts(self, peer, op, local_off, remote_off, lengths, g, stats)
        elif path == "strided":
            t = time.perf_counter()
            runs = runs_of_spans(torch.from_numpy(s)).numpy()
            stats.lists_s += time.perf_counter() - t
            parts = paths.strided_parts(self, peer, op, runs, stats)
        else:
            parts = []
        on_end = None
        if path == "staged":
            parts, on_end = paths.staged_parts(self, peer, remote_off, local_off, lengths, stats)
        return self._start(op, peer, parts, stats, on_end, t0)

    def _transfer_runs(self, op: str, peer: Peer, runs: torch.Tensor, path: str, src_bytes: int,
                       dst_bytes: int, t0: float) -> TransferHandle:
        runs = as_runs(runs)
        check_runs(runs, src_bytes, dst_bytes)
        # numpy, not torch calls (a fifth of the time); r may be the caller's runs: read only
        r = runs.numpy()
        r = r[r[:, 2] > 0] if bool((r[:, 2] <= 0).any()) else r
        stats = TransferStats(path="plain", spans=int(r[:, 5].sum()),
                              bytes=int((r[:, 2] * r[:, 5]).sum()), runs=int(runs.shape[0]))
        if stats.spans == 0:
            return TransferHandle(self, peer, op, [], stats)
        stats.path, parts, on_end = run_paths.run_parts(self, peer, op, r, path, stats)
        return self._start(op, peer, parts, stats, on_end, t0)

    def _start(self, op: str, peer: Peer, parts, stats: TransferStats, on_end,
               t0: float) -> TransferHandle:
        handle = TransferHandle(self, peer, op, parts, stats, on_end)
        with handle._mu:  # close() may abandon it as soon as it is listed
            with self._lock:
                if self._closing:
                    handle._abandon(f"Endpoint {self.name!r} was closed during the {op}")
                    raise NixlError(handle._why)
                self._handles.add(handle)
            handle._post_next(t0)
        return handle

    def _post(self, handle: TransferHandle, xfer) -> str:
        with self._lock:
            if self._closing:
                raise NixlError(f"Endpoint {self.name!r} was closed during the {handle.op}")
            try:
                return self._agent.transfer(xfer)
            except Exception as e:
                raise nixl_error(e, f"NIXL {handle.op} of {handle.spans} spans",
                                 handle.peer.name) from None

    def _state(self, handle: TransferHandle) -> str:
        with self._lock:
            if self._closing:
                raise NixlError(f"Endpoint {self.name!r} was closed during the {handle.op}")
            if self._peers.get(handle.peer.name) is not handle.peer:
                handle._abandon(f"peer {handle.peer.name!r} was removed during the {handle.op}")
                raise NixlError(handle._why)
            try:
                return self._agent.check_xfer_state(handle._xfer)
            except Exception as e:
                err = nixl_error(e, f"NIXL {handle.op} of {handle.spans} spans", handle.peer.name)
                handle._abandon(str(err))
                raise err from None

    def _telemetry_pieces(self, xfer, default: int) -> int:
        """The descriptors NIXL posted for a finished transfer (its telemetry), else default."""
        with self._lock:
            try:
                return int(self._agent.get_xfer_telemetry(xfer).descCount)
            except Exception:
                return default

    def _release(self, handle: TransferHandle, xfer) -> None:
        with self._lock:
            if not self._closed and xfer is not None:
                try:
                    self._agent.release_xfer_handle(xfer)
                except Exception:
                    pass

    def _ended(self, handle: TransferHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    # ---- lifetime ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing:
            raise ValueError(f"Endpoint {self.name!r} is closed")

    def close(self) -> None:
        """Stop the poller, fail unfinished transfers (each waits for its running unpack),
        forget peers, deregister the buffers. Safe while other threads wait on transfers:
        they get NixlError."""
        with self._lock:
            if self._closing:
                return
            self._closing = True  # from here no transfer starts or goes on
            handles = list(self._handles)
        _OPEN.discard(self)
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=5)
        for h in handles:  # outside the Endpoint's lock: a handle's lock comes first
            h._abandon(f"Endpoint {self.name!r} was closed during the {h.op}")
        if self._unpack_pool is not None:
            self._unpack_pool.shutdown(wait=True)
        with self._lock:
            self._handles.clear()
            self._release_dlists(list(self._local_grids.values()) + list(self._peer_grids.values()))
            self._local_grids.clear()
            self._peer_grids.clear()
            for _, reg in self._stage_all:
                try:
                    self._agent.deregister_memory(reg)
                except Exception:
                    pass
            self._stage_all.clear()
            self._stage_free.clear()
            for name in list(self._peers):
                try:
                    self._agent.remove_remote_agent(name)
                except Exception:
                    pass
            self._peers.clear()
            self._peer_metadata.clear()
            self._xplans.clear()
            try:
                if self._exposed_reg is not None:
                    self._agent.deregister_memory(self._exposed_reg)
                self._agent.deregister_memory(self._reg)
            finally:
                self._closed = True
                self._agent = None

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closing else f"{len(self._peers)} peer(s)"
        return f"Endpoint({self.name!r}, {self.plan.layout}, {self.cache.buffer.numel()} B, {state})"
