"""The producer's side of the side channel: a consumer asks for its NIXL metadata, for leave to
read a prompt's blocks (acquire) and to free them (release). Every field of a peer's message is
untrusted: a read is granted only for the request id, hand-off generation, worker instance and
block ids this worker holds (NIXL reads are one-sided, so the producer names the blocks and an
honest consumer reads nothing else) and for the prompt's own token count, a peer's seconds are
held to this engine's own bounds (a granted read's deadline only ever moves later), and blocks
under a granted read are freed only by the leases that acquires handed out (every granted read's
release, or the hold's deadline). Each refused acquire is counted (ProducerSide.refused) and,
with stats_path, logged as a line."""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
import threading
from dataclasses import dataclass, field

from .peer_input import bounded_seconds

log = logging.getLogger("kvcache_ext.vllm")


@dataclass
class Hold:
    generation: int
    expiry_time: float        # time.time(): freed unread after this
    block_ids: tuple[tuple[int, ...], ...] = ()  # every group's: what a read may take
    num_tokens: int = 0       # the prompt's tokens in them: what a read may take of them
    read_deadline: float = 0  # time.time(): granted reads hold the blocks until then (only
    #                           ever moved later: no acquire shortens another's read)
    leases: set[str] = field(default_factory=set)  # the granted reads': each one's release
    #                                                ends its own; the last frees the blocks


MAX_LEASES = 16  # granted reads of one hand-off (a router's retries, a client's duplicate)
MIN_PART_BYTES = 64 << 10  # a pack's parts: a peer's part size never makes millions of them
MAX_REFUSAL_LINES = 10_000  # stats lines of refusals a worker writes (the counter goes on)


class Refused(Exception):
    """An acquire refused: reason (one word, the counter's key) and why (for the peer)."""

    def __init__(self, reason: str, why: str) -> None:
        super().__init__(why)
        self.reason, self.why = reason, why


class ProducerSide:
    """Mixed into WorkerSide, whose state it uses: cfg, ep, pack, instance, engine_id,
    layer_names, _cond (an RLock's condition), _holds (request id -> Hold), _drop_hold."""

    refused: Counter  # acquires refused, by reason: hook, fields, instance, unknown, expired,
    #                   blocks, tokens, leases
    _refusal_lock = threading.Lock()  # the stats file's lines (one file per worker process)

    def _serve(self, m: dict):
        op = m.get("op")
        if op == "meta":
            return {"ok": True, "engine_id": self.engine_id, "instance": self.instance,
                    "layers": self.layer_names}, self.ep.metadata()
        if op == "acquire":
            try:
                return self._acquire(m)
            except Refused as e:
                self._count(e, m.get("request_id"))
                return {"ok": False, "why": e.why}, b""
        if op == "release":
            return self._release_hold(m)
        return {"ok": False, "why": f"unknown op {op!r:.40}"}, b""

    def _acquire(self, m: dict):
        if m.get("debug_delay_s") and not self.cfg.test_only_hooks:  # a peer picks no sleep
            raise Refused("hook", "debug_delay_s is a test hook and this engine was not started "
                                  "with test_only_hooks")
        time.sleep(bounded_seconds(m.get("debug_delay_s"), self.cfg.read_timeout_s, 0.0))
        rid, gen = m.get("request_id"), m.get("generation")
        if not isinstance(rid, str) or type(gen) is not int:
            raise Refused("fields", "request_id must be a string and generation an integer")
        if m.get("instance") != self.instance:
            raise Refused("instance", f"this is instance {self.instance}, the read names "
                                      f"{m.get('instance')!r:.40} (restarted: its blocks are gone)")
        timeout_s = bounded_seconds(m.get("timeout_s"), self.cfg.read_timeout_s)
        with self._cond:
            # the read may ask before this worker has the step's metadata that holds it
            self._cond.wait_for(lambda: rid in self._holds,
                                timeout=min(self.cfg.acquire_wait_s, timeout_s))
            h = self._holds.get(rid)
            if h is None or h.generation != gen:
                raise Refused("unknown", f"request {rid:.80} (hand-off {gen}) holds no blocks "
                                         f"here: freed, reused or never sent")
            if time.time() > h.expiry_time:  # no new read; granted ones keep their deadline
                if not h.leases:
                    self._drop_hold(rid)
                raise Refused("expired", f"request {rid:.80}'s hold timed out: no new read")
            held = [list(g) for g in h.block_ids]
            if m.get("block_ids") != held:  # another request's, freed or out-of-range blocks
                raise Refused("blocks", f"the read names blocks {str(m.get('block_ids')):.80} but "
                                        f"request {rid:.80}'s hand-off {gen} holds {str(held):.80}")
            if m.get("num_tokens") != h.num_tokens:  # rows past the prompt: another's leftovers
                raise Refused("tokens", f"the read names {str(m.get('num_tokens')):.20} tokens, "
                                        f"request {rid:.80}'s hand-off {gen} holds {h.num_tokens}")
            if len(h.leases) >= MAX_LEASES:
                raise Refused("leases", f"request {rid:.80} has {MAX_LEASES} reads granted")
            h.read_deadline = max(h.read_deadline, time.time() + timeout_s)
            lease = uuid.uuid4().hex
            h.leases.add(lease)
            deadline = h.read_deadline
        granted = {"ok": True, "block_ids": held, "lease": lease}
        ask = m.get("pack")
        if isinstance(ask, dict) and self.pack is not None:  # our blocks, not the ask's
            bad = self._bad_pack(ask, h.num_tokens)
            if bad:
                return granted | {"packed": None, "why": bad}, b""
            return self._with_grant(granted, self.pack.pack(
                self.ep.cache.buffer, self.ep.plan, rid, ask | {"block_ids": held[0]},
                lambda: self._holding(rid, gen) and time.time() <= deadline))
        return granted, b""

    def _bad_pack(self, ask: dict, num_tokens: int) -> str:
        """Why a peer's pack request is not packed ("" when it may be): its tokens within the
        prompt held, its parts neither tiny nor past the buffer."""
        start, count, part = ask.get("start"), ask.get("count"), ask.get("part_bytes")
        if not all(type(v) is int for v in (start, count, part)):
            return "start, count and part_bytes must be integers"
        if not (0 <= start and 0 < count and start + count <= num_tokens):
            return f"tokens {start}..{start + count} are not within the {num_tokens} held"
        if not MIN_PART_BYTES <= part:
            return f"part_bytes must be at least {MIN_PART_BYTES}"
        return ""

    @staticmethod
    def _with_grant(granted: dict, replies):
        """The pack's replies, its first one carrying the grant's block ids and lease."""
        try:
            first = True
            for reply, blob in replies:
                yield (granted | reply if first and reply.get("ok") else reply), blob
                first = False
        finally:
            replies.close()  # the pack's own cleanup (its range), whenever the stream ends

    def _release_hold(self, m: dict):
        """A granted read's release (its lease) ends that read, and the last one frees the
        blocks; before any grant, a release naming the blocks held frees them (a consumer that
        holds the prompt itself, or whose read failed before it asked). Anything else frees
        nothing: a peer that knows a request id cannot free its blocks under a read."""
        rid, gen = m.get("request_id"), m.get("generation")
        with self._cond:
            h = self._holds.get(rid) if isinstance(rid, str) else None
            if h is None or type(gen) is not int or h.generation != gen:
                return {"ok": True}, b""  # nothing held under those: nothing to do
            if h.leases:
                lease = m.get("lease")
                if not isinstance(lease, str) or lease not in h.leases:
                    return {"ok": False, "why": "reads of these blocks were granted: a read's "
                                                "lease releases them"}, b""
                h.leases.discard(lease)
                if h.leases:  # other granted reads still read them
                    return {"ok": True}, b""
            elif m.get("block_ids") != [list(g) for g in h.block_ids]:
                return {"ok": False, "why": "a release names the blocks it frees"}, b""
            self._drop_hold(rid)
        return {"ok": True}, b""

    def _holding(self, rid: str, gen: int) -> bool:
        with self._cond:
            h = self._holds.get(rid)
            return h is not None and h.generation == gen

    def _count(self, e: Refused, rid: object) -> None:
        """The refusal counted, logged, and (the first MAX_REFUSAL_LINES) a stats line, written
        under a lock of its own: a peer's refusals never hold up the engine's steps."""
        with self._cond:
            self.refused[e.reason] += 1
            n = sum(self.refused.values())
        if self.cfg.stats_path and n <= MAX_REFUSAL_LINES:
            with self._refusal_lock, open(self.cfg.stats_path, "a") as f:
                f.write(json.dumps({"refused": e.reason, "request_id": str(rid)[:80],
                                    "why": e.why}) + "\n")
        log.warning("KvcacheExtConnector: refused a read of %.80s: %s", rid, e.why)
