"""An Endpoint's peers (a mixin of Endpoint, using its agent, lock, cache and the per-peer
state it keeps): the metadata an Endpoint hands out, the handshake that turns a peer's metadata
into a Peer, and its removal, which drops everything kept for that peer."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..plan import CachePlan, GroupPlan, plan_from_dict, plan_to_dict

_MAGIC = b"KVCNIXL1"


@dataclass(frozen=True)
class Peer:
    """A remote Endpoint: its agent name, its plan and where its buffer lives."""

    name: str
    plan: CachePlan | GroupPlan
    address: int
    nbytes: int
    mem_type: str   # "DRAM" or "VRAM"
    device_id: int
    exposed_address: int = 0  # its exposed buffer (Endpoint(exposed_bytes=)), if any
    exposed_nbytes: int = 0


class PeerTable:
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
                           "device_id": self._device_id,
                           "exposed": ([self.exposed.data_ptr(), self.exposed.numel()]
                                       if self.exposed is not None else [0, 0])}).encode()
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
            exposed = head.get("exposed", [0, 0])
            peer = Peer(head["name"], plan, int(head["address"]), int(head["nbytes"]),
                        head["mem_type"], int(head["device_id"]), int(exposed[0]),
                        int(exposed[1]))
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
        """Forget a peer: its prepared lists are released, and its unfinished transfers fail
        (NixlError) rather than go on with a peer that may be another one next time."""
        with self._lock:
            self._release_dlists([self._peer_grids.pop(k) for k in list(self._peer_grids)
                                  if k[0] == peer.name])
            self._peer_metadata.pop(peer.name, None)
            self._xplans.pop(peer.name, None)
            if self._peers.pop(peer.name, None) is not None and not self._closed:
                try:
                    self._agent.remove_remote_agent(peer.name)
                except Exception:
                    pass

    def _peer_removed(self, peer: Peer) -> bool:
        with self._lock:
            return self._peers.get(peer.name) is not peer
