"""The connector's worker half (in vLLM's worker process, which owns the cache): the cache as a
kvcache_ext plan registered with a kvcache_ext.nixl Endpoint, a side channel a consumer asks for
the producer's metadata and for leave to read a prompt's blocks, and the reads themselves --
Endpoint.read_tokens between any two block sizes (runs planned in compiled code from the plan
pair kept per producer; staged and re-tiled in one pass where that is cheaper), one read per
prompt, in a thread of its own so no engine step waits, every wait bounded by the timeout.

Between two block sizes, a producer with a pack buffer (pack_buffer_mb) re-tiles the prompt into
the consumer's page form there, part by part on its own core, while the consumer reads the parts
packed so far straight into place (a packed read: kvcache_ext.transfer.pack); without one, or
when the buffer is full, the consumer re-tiles what it reads itself.

A producer holds a finished prompt's blocks (vLLM frees them when get_transfer_results reports
the request as sent) until the consumer releases them or the hold times out; a read the producer
granted extends the hold until the read's own deadline. Parameters whose instance, generation or
block ids the producer does not hold are refused (producer.py): never read as wrong bytes."""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter

import torch

from .. import nixl as kvc_nixl
from ..transfer import TransferPlan, spans_of_runs
from ..transfer.pack import PackPlans
from .cache_plan import cache_of
from .config import ConnectorConfig
from .group_plan import VllmGroupPlan, group_cache_of, group_plan_of
from .group_reads import group_spans, group_tables
from .packing import Done, PackBuffer, pack_ask, read_packed
from .params import ParamError, check_blocks
from .peer_input import bounded_seconds
from .peers import LoadError, Producers
from .producer import Hold, ProducerSide
from .protocol import KvcacheExtMetadata, RecvSpec, Remote, WorkerAddress
from .side_channel import Server, call, stream

log = logging.getLogger("kvcache_ext.vllm")


class WorkerSide(ProducerSide):
    def __init__(self, vllm_config, kv_cache_config, cfg: ConnectorConfig,
                 vplan: VllmGroupPlan | None = None) -> None:
        """vplan: a hybrid cache's VllmGroupPlan if check_supported made it already."""
        self.cfg = cfg
        self.engine_id = str(vllm_config.kv_transfer_config.engine_id)
        groups = kv_cache_config.kv_cache_groups
        # several groups (vLLM's hybrid manager: DeepSeek-V4): one GroupPlan over them all
        if vplan is None and len(groups) > 1:
            vplan = group_plan_of(kv_cache_config)
        self.vplan = vplan
        self.layer_names = [n for g in groups for n in g.layer_names]
        self.kv_cache_spec = getattr(groups[0], "kv_cache_spec", None)
        self.dp_index = int(getattr(vllm_config.parallel_config, "data_parallel_index", 0) or 0)
        model = getattr(vllm_config, "model_config", None)
        self.max_tokens = int(getattr(model, "max_model_len", 0) or 0)  # reserve_runs: a longest prompt
        self.instance = uuid.uuid4().hex[:12]
        self._cond = threading.Condition()
        self._holds: dict[str, Hold] = {}
        self.refused: Counter = Counter()  # producer: acquires refused, by reason
        self._sent: set[str] = set()
        self._recv_done: set[str] = set()
        self._recv_failed: set[str] = set()
        self._loading = 0      # reads in flight (threads in _load)
        self._idle = False     # this step runs nothing (its metadata's idle): results() may wait
        self._steps = 0        # results() calls (engine steps) so far: a read's stats line has
        #                        how many ran while it was in flight
        self._bad_blocks: set[int] = set()
        self.pack: PackBuffer | None = None  # producer: where it packs for unlike consumers
        self.pack_plans: PackPlans | None = None  # consumer: its packed reads, once per length
        # the producers known as NIXL peers; each one's plan pair made and the runs tables of
        # the longest prompt faulted in at its handshake (not in a read's plan_s)
        self.producers = Producers(self.layer_names, self.max_tokens)
        self.ep: kvc_nixl.Endpoint | None = None
        self.elem_bytes = 0
        self.server: Server | None = None

    # ---- start-up ------------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self.vplan is not None:
            cache = group_cache_of(kv_caches, self.vplan)
        else:
            cache = cache_of(kv_caches, self.layer_names, self.kv_cache_spec)
        self.elem_bytes = next(iter(kv_caches.values())).element_size()
        pack = int(self.cfg.pack_buffer_mb * (1 << 20)) if self.vplan is None else 0
        self.ep = kvc_nixl.Endpoint(f"kvc-{self.engine_id[:12]}-{self.instance}", cache,
                                    exposed_bytes=pack)
        if pack:
            self.pack = PackBuffer(self.ep.exposed)
        if self.vplan is None:
            self.pack_plans = self.producers.packs = PackPlans(cache.plan, own_is_src=False)
        self.server = Server(self.cfg.host(), self.cfg.port(self.dp_index), self._serve,
                             self.cfg.side_channel_timeout_s,
                             self.cfg.side_channel_max_connections)
        log.info("KvcacheExtConnector: %s, side channel %s:%d", cache.plan.layout, *self.server.at)

    def address(self) -> WorkerAddress | None:
        if self.server is None:
            return None
        return WorkerAddress(self.server.host, self.server.port, self.instance)

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.ep is not None:
            self.ep.close()

    # ---- each step -----------------------------------------------------------------------------
    def start(self, meta: KvcacheExtMetadata) -> None:
        with self._cond:
            for rid, s in meta.send.items():
                self._holds[rid] = Hold(s.generation, s.expiry_time, s.block_ids, s.num_tokens)
            self._loading += len(meta.recv)
            self._idle = meta.idle
            self._cond.notify_all()
        for rs in meta.recv.values():
            threading.Thread(target=self._load, args=(rs,), name="kvc-load", daemon=True).start()
        for remote in meta.release.values():
            self._release_later(remote)

    def results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving, failed receiving); expired holds are freed.
        A step that runs nothing while this worker reads or holds blocks for a reader first
        waits up to idle_wait_ms for a read to end or a hold to be released (config.py): else
        vLLM steps again ~1 ms later, Python in this process beside the read or packing."""
        with self._cond:
            if self._idle and (self._loading or self._holds) and self.cfg.idle_wait_ms > 0:
                self._cond.wait_for(lambda: self._recv_done or self._recv_failed or self._sent
                                    or not (self._loading or self._holds),
                                    timeout=self.cfg.idle_wait_ms / 1e3)
            self._idle = False  # one wait a step
            self._steps += 1
            now = time.time()
            for rid, h in list(self._holds.items()):
                if now > (h.read_deadline if h.read_deadline else h.expiry_time) and not (
                        self.pack is not None and self.pack.busy(rid)):  # not while packed
                    log.warning("KvcacheExtConnector: freeing %s's blocks unread after the hold "
                                "timeout", rid)
                    self._drop_hold(rid)
            sent, self._sent = self._sent, set()
            failed, self._recv_failed = self._recv_failed, set()
            done, self._recv_done = self._recv_done, set()
        return sent, done | failed, failed

    def _drop_hold(self, rid: str) -> None:
        """Under _cond: the blocks held for rid are free (reported sent at the next step, its
        pack range returned); an idle step waiting in results() answers now."""
        del self._holds[rid]
        self._sent.add(rid)
        if self.pack is not None:
            self.pack.free(rid)
        self._cond.notify_all()

    def bad_blocks(self) -> set[int]:
        with self._cond:
            bad, self._bad_blocks = self._bad_blocks, set()
        return bad

    # ---- consumer: one prompt's read -----------------------------------------------------------
    def _peer(self, r: Remote, timeout_s: float) -> kvc_nixl.Peer:
        return self.producers.peer(self.ep, r, timeout_s)

    def _check_blocks(self, peer: kvc_nixl.Peer, r: Remote) -> None:
        """The parameters' block lists against the producer's plan (LoadError naming them):
        a grouped cache's in this engine's group order (vLLM's, the producer's too)."""
        plan = peer.plan
        sizes = ([plan.group(n).block_size for n in self.vplan.group_names]
                 if self.vplan is not None else [plan.block_size])
        try:
            check_blocks(r, sizes, plan.num_blocks)
        except (ParamError, KeyError) as e:
            raise LoadError(str(e)) from None

    def _tables(self, src, dst, rs: RecvSpec) -> tuple[dict, dict]:
        try:
            return group_tables(self.ep.plan, self.vplan.group_names, src, dst,
                                rs.start + rs.count)
        except ValueError as e:
            raise LoadError(str(e)) from None

    def _local_spans(self, rs: RecvSpec) -> torch.Tensor:
        if self.vplan is not None:
            tables, firsts = self._tables(rs.local_block_ids, rs.local_block_ids, rs)
            return group_spans(self.ep.plan, self.ep.plan, tables, firsts,
                               rs.start + rs.count, rs.start)
        table = torch.tensor(rs.local_block_ids[0], dtype=torch.int32)
        return TransferPlan(self.ep.plan, self.ep.plan).token_spans(table, table, rs.count,
                                                                   rs.start, rs.start)

    def _read(self, peer: kvc_nixl.Peer, r: Remote, rs: RecvSpec):
        """Start the read of the prompt's rows; (handle, what to negate for kvc_debug_corrupt)."""
        if self.vplan is None:
            tables = (torch.tensor(r.block_ids[0], dtype=torch.int64),
                      torch.tensor(rs.local_block_ids[0], dtype=torch.int64))
            # runs planned in compiled code from the plan pair kept per producer (plan_s)
            handle = self.ep.read_tokens(peer, *tables, rs.count, rs.start, rs.start)
            return handle, lambda spec=None: spans_of_runs(self.ep.transfer_plan(
                peer).token_runs(*tables, rs.count, rs.start, rs.start))
        t, c = time.perf_counter(), time.thread_time()
        tables, firsts = self._tables(r.block_ids, rs.local_block_ids, rs)
        end = rs.start + rs.count
        # runs planned in compiled code, from the group plan pair kept per producer (plan_s)
        runs = self.ep.transfer_plan(peer).token_runs(tables, end, rs.start, firsts)
        plan_s, plan_cpu_s = time.perf_counter() - t, time.thread_time() - c
        handle = self.ep.read(peer, runs)
        handle.stats.plan_s, handle.stats.plan_cpu_s = plan_s, plan_cpu_s
        return handle, lambda spec=None: spans_of_runs(runs) if spec is None else group_spans(
            peer.plan, self.ep.plan, tables, firsts, end, rs.start, spec)

    def _fill(self, rs: RecvSpec, value: int) -> None:
        for d, n in self._local_spans(rs)[:, 1:].tolist():
            self.ep.cache.buffer[d:d + n] = value

    def _corrupt(self, spans: torch.Tensor) -> None:
        """Every value of the spans negated (still finite); in a grouped cache of byte records
        (fp8 codes, UE8M0 scales, bf16 and fp32 parts, whose sign bits a byte view cannot
        tell) each byte set to 0x3F instead: every part finite, none its moved value."""
        if self.vplan is not None:
            for d, n in spans[:, 1:].tolist():
                self.ep.cache.buffer[d:d + n] = 0x3F
            return
        es = self.elem_bytes
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[es]
        sign = -(1 << (8 * es - 1))
        for d, n in spans[:, 1:].tolist():
            rows = self.ep.cache.buffer[d:d + n].view(ints)
            rows ^= sign

    def _load(self, rs: RecvSpec) -> None:
        try:
            self._load_one(rs)
        finally:
            with self._cond:
                self._loading -= 1
                self._cond.notify_all()

    def _load_one(self, rs: RecvSpec) -> None:
        dbg = rs.debug
        t0, steps0 = time.monotonic(), self._steps
        deadline = t0 + bounded_seconds(dbg.get("timeout_s"), self.cfg.read_timeout_s)
        left = lambda: max(deadline - time.monotonic(), 0.001)  # noqa: E731
        handle, error, xfer, lease = None, "", None, None
        times: dict[str, object] = {}  # seconds of each stage, for the stats line

        def lap(stage: str, since: float) -> float:
            now = time.monotonic()
            times[stage] = now - since
            return now
        try:
            if self.cfg.poison_before_load:  # rows never written read as NaN
                self._fill(rs, 0xFF)
            if rs.error or rs.remote is None:
                raise LoadError(f"kv_transfer_params refused: {rs.error}")
            r = rs.remote
            if r.expiry_time and time.time() > r.expiry_time:
                raise LoadError(f"the parameters expired {time.time() - r.expiry_time:.1f} s ago: "
                                f"the producer has freed those blocks")
            if rs.start + rs.count > r.num_tokens:
                raise LoadError(f"tokens {rs.start}..{rs.start + rs.count} asked, the producer "
                                f"holds {r.num_tokens}")
            time.sleep(bounded_seconds(dbg.get("delay_s"), left(), 0.0))
            t = time.monotonic()
            peer = self._peer(r, left())
            t = lap("peer_s", t)
            held = [list(g) for g in r.block_ids]  # the producer refuses any it does not hold
            ask = {"op": "acquire", "request_id": r.request_id, "generation": r.generation,
                   "instance": r.instance, "timeout_s": left(), "block_ids": held,
                   "num_tokens": r.num_tokens,
                   "debug_delay_s": dbg.get("acquire_delay_s", 0.0)}
            pack = None if self.vplan is not None else pack_ask(
                self.ep, peer, r.block_ids[0], rs.start, rs.count, plans=self.pack_plans)
            if pack is None:
                reply, _ = call(r.host, r.port, ask, left())
            else:  # the producer packs, streaming "part p is packed" after its reply
                replies = stream(r.host, r.port, ask | {"pack": pack}, left)
                reply, _ = next(replies, ({"ok": False, "why": "no reply"}, b""))
            t = lap("acquire_s", t)
            if pack is not None and not (reply.get("ok") and reply.get("packed")):
                replies.close()
                if reply.get("ok"):  # read, but not packed: the producer says why
                    times["pack_refused"] = str(reply.get("why", ""))
            if not reply.get("ok"):
                raise LoadError(f"the producer refused the read: {str(reply.get('why')):.300}")
            lease = reply.get("lease")
            try:
                if reply.get("block_ids") != held:  # a read takes only what the producer names
                    raise LoadError(f"the producer holds blocks {str(reply.get('block_ids')):.80}"
                                    f", the parameters name {str(held):.80}")
                self._check_blocks(peer, r)
            except LoadError:
                if pack is not None:
                    replies.close()  # the producer stops packing
                raise
            if pack is not None and reply.get("packed"):
                try:
                    stats, runs = read_packed(
                        self.ep, peer, torch.tensor(rs.local_block_ids[0], dtype=torch.int64),
                        rs.start, rs.count, reply["packed"], replies, left, self.pack_plans)
                except RuntimeError as e:
                    raise LoadError(str(e)) from None
                handle, moved = Done(stats), lambda spec=None: spans_of_runs(runs)
            else:
                handle, moved = self._read(peer, r, rs)
            xfer = handle.stats  # what it planned and posted, in the stats line even if it fails
            handle.wait(left())
            handle = None
            lap("read_s", t)
            times["plan_s"], times["plan_cpu_s"] = xfer.plan_s, xfer.plan_cpu_s
            times["read_s"] -= xfer.plan_s
            if dbg.get("corrupt"):  # the tokens must show it (tests): every value it read
                # (True) or one spec's (its name), changed but finite
                self._corrupt(moved(None if dbg["corrupt"] is True else str(dbg["corrupt"])))
            with self._cond:
                self._recv_done.add(rs.request_id)
                self._cond.notify_all()  # an idle step waiting in results() answers now
            self._release_later(r, bounded_seconds(dbg.get("release_delay_s"),
                                                   self.cfg.hold_timeout_s, 0), lease)
        except Exception as e:  # noqa: BLE001 - every failure is the request's, reported to vLLM
            if handle is not None:
                handle.cancel()  # NIXL aborts it: no byte lands after this
            # A failed read may have left part of its rows written (or poisoned): zero them, as
            # vLLM's cache starts, before vLLM recomputes into these blocks -- possibly in
            # another order, so a row this read did not own may become an unwritten tail slot,
            # which vLLM's CPU attention still multiplies (by 0: NaN * 0 is NaN).
            error = f"{type(e).__name__}: {e}"
            try:
                self._fill(rs, 0)
            except Exception:  # noqa: BLE001 - block lists that fit no plan: nothing was
                pass           # written; the request is still reported as failed below
            log.warning("KvcacheExtConnector: reading request %s's cache failed: %s",
                        rs.request_id, error)
            sizes = ([g.block_size for g in self.ep.plan.groups] if self.vplan is not None
                     else [self.ep.plan.block_size])
            bad = set()
            for bs, ids in zip(sizes, rs.local_block_ids):
                bad.update(ids[rs.start // bs:-(-(rs.start + rs.count) // bs)])
            bad.discard(0)  # vLLM's null block (a window group's blocks before its window)
            with self._cond:
                self._recv_failed.add(rs.request_id)
                self._cond.notify_all()
                if self.vplan is None:  # vLLM takes block-level failures from one group only
                    self._bad_blocks.update(bad)
            if rs.remote is not None:
                self._release_later(rs.remote, 0.0, lease)
        if self.cfg.stats_path:
            rec = {"request_id": rs.request_id, "start": rs.start, "tokens": rs.count,
                   "runs": xfer.runs if xfer else 0, "spans": xfer.spans if xfer else 0,
                   "bytes": xfer.bytes if xfer else 0,
                   "seconds": time.monotonic() - t0, "steps": self._steps - steps0, **times,
                   "ok": not error, "error": error,
                   "path": xfer.path if xfer else "", "pieces": xfer.pieces if xfer else 0,
                   "staged_bytes": xfer.staged_bytes if xfer else 0,
                   **({k: getattr(xfer, k) for k in ("build_s", "move_s", "unpack_s", "pack_s",
                                                     "pack_cpu_s", "pack_wait_s")}
                      if xfer else {})}
            with self._cond, open(self.cfg.stats_path, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def _release_later(self, r: Remote, delay_s: float = 0.0, lease: str | None = None) -> None:
        threading.Thread(target=lambda: (time.sleep(delay_s), self._release(r, lease=lease)),
                         daemon=True).start()

    def _release(self, r: Remote, timeout_s: float | None = None,
                 lease: str | None = None) -> None:
        """Tell the producer it may free the blocks (best effort: a gone producer frees them by
        itself when its hold times out). lease: the acquire's, after a granted read."""
        try:
            call(r.host, r.port, {"op": "release", "request_id": r.request_id,
                                  "generation": r.generation, "lease": lease,
                                  "block_ids": [list(g) for g in r.block_ids]},
                 timeout_s or self.cfg.read_timeout_s)
        except (OSError, ValueError) as e:  # gone, or a reply that breaks the rules (FrameError)
            log.info("KvcacheExtConnector: release of %s not delivered: %s", r.request_id, e)
