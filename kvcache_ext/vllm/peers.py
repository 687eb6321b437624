"""The producers a consumer's worker knows, as NIXL peers of its Endpoint: each one's metadata
fetched over the side channel once per producer instance, and checked against a read's
parameters on every read (engine id and instance: a restarted producer is another one)."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .. import nixl as kvc_nixl
from .packing import packed_tokens_max
from .protocol import Remote
from .side_channel import call

if TYPE_CHECKING:  # the consumer's packed plans come from its worker; only named here
    from ..transfer.pack import PackPlans


class LoadError(RuntimeError):
    """A prompt's cache could not be read (the request then fails or is recomputed)."""


class Producers:
    """layer_names: this engine's (a producer with others is refused). reserve_tokens: > 0 makes
    the plan pair with each new producer at its handshake and faults in a runs table of that
    many tokens (TransferPlan.reserve_runs; a grouped cache's: GroupTransferPlan.reserve_runs).
    packs: the consumer's packed reads (set once its cache is known): with a producer that
    packs for it, their runs table is faulted in at the handshake instead, and the plain one
    only where some prompts are longer than its pack buffer holds (a plain read of a shorter
    one -- its buffer full with other reads -- faults its table in as it writes it)."""

    def __init__(self, layer_names: list[str], reserve_tokens: int = 0) -> None:
        self.layer_names, self.reserve_tokens = layer_names, reserve_tokens
        self.packs: PackPlans | None = None
        self._peers: dict[tuple[str, int], tuple[str, str, kvc_nixl.Peer]] = {}
        self._lock = threading.Lock()

    def peer(self, ep: kvc_nixl.Endpoint, r: Remote, timeout_s: float) -> kvc_nixl.Peer:
        """The producer's Endpoint as a peer: its metadata over the side channel (once per
        producer instance), checked against the parameters on every read (engine id and
        instance: a restarted producer is another one). The side channel is asked outside the
        lock (a producer that does not answer holds up no read from another); a peer is
        replaced only by a newer instance than the one known, never by a stale request's."""
        key = (r.host, r.port)
        with self._lock:
            known = self._peers.get(key)
        added = None
        if known is None or known[1] != r.instance:
            reply, blob = call(r.host, r.port, {"op": "meta"}, timeout_s)
            if reply.get("layers") != self.layer_names:
                raise LoadError(f"the producer's layers {reply.get('layers')} are not this "
                                f"engine's {self.layer_names}")
            fetched = (str(reply.get("engine_id")), str(reply.get("instance")))
            with self._lock:
                known = self._peers.get(key)
                if known is None or known[:2] != fetched:
                    if known is not None:  # that producer was restarted: its blocks are gone
                        ep.remove_peer(known[2])
                    known = (*fetched, ep.add_peer(blob))
                    self._peers[key] = known
                    added = known[2]
            if added is not None and self.reserve_tokens:  # made once, not in a read's plan_s
                packed = packed_tokens_max(ep, added) if self.packs is not None else 0
                if packed:
                    self.packs.reserve(min(packed, self.reserve_tokens))
                if packed < self.reserve_tokens:  # plain reads: the prompts it cannot pack
                    ep.transfer_plan(added).reserve_runs(self.reserve_tokens)
        engine_id, instance, peer = known
        if engine_id != r.engine_id:
            raise LoadError(f"the producer at {r.host}:{r.port} is engine {engine_id!r}, the "
                            f"parameters name {r.engine_id!r}")
        if instance != r.instance:
            raise LoadError(f"the producer at {r.host}:{r.port} is instance {instance!r}, the "
                            f"parameters name {r.instance!r} (restarted: the blocks are gone)")
        return peer
