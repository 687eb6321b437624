"""What an Endpoint keeps for its transfers beyond its registered cache (a mixin of Endpoint,
using its agent, lock and buffer): the prepared descriptor grids of the prepared path (ours per
granule, each peer's until it is removed), the registered staging buffers of staged reads (lent
to one transfer at a time, reused), and the thread that unpacks staged parts."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..cache.buffer import host_buffer
from .handle import NixlError


class TransferResources:
    def _grids(self, peer, g: int) -> tuple[object, object, bool]:
        """Our buffer and the peer's as prepared grids of g-byte granules (made on first use,
        kept until the peer is removed); the bool: made now."""
        with self._lock:
            self._refuse_if_closing()
            first = False
            local = self._local_grids.get(g)
            if local is None:
                n = self.cache.buffer.numel() // g
                local = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", np.array(
                    [[self.cache.buffer.data_ptr(), g, self._device_id, g, n]], np.uint64),
                    self._mem_type)
                self._local_grids[g] = local
            remote = self._peer_grids.get((peer.name, g))
            if remote is None:
                remote = self._agent.prep_xfer_dlist(peer.name, np.array(
                    [[peer.address, g, peer.device_id, g, peer.nbytes // g]], np.uint64),
                    peer.mem_type)
                self._peer_grids[(peer.name, g)] = remote
                first = True
            return local, remote, first

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise NixlError(f"Endpoint {self.name!r} was closed during a transfer")

    def _release_dlists(self, handles) -> None:
        with self._lock:
            if self._closed:
                return
            for h in handles:
                try:
                    self._agent.release_dlist_handle(h)
                except Exception:
                    pass

    def _staging(self, nbytes: int) -> torch.Tensor:
        """A registered staging buffer of at least nbytes on our cache's device, lent until
        the transfer that asked ends (_return_staging). Buffers are told apart by identity:
        `==` on two tensors compares their elements (and fails for two sizes)."""
        with self._lock:
            self._refuse_if_closing()
            fits = [i for i, b in enumerate(self._stage_free) if b.numel() >= nbytes]
            if fits:
                i = min(fits, key=lambda i: self._stage_free[i].numel())
                return self._stage_free.pop(i)
            size = max(1 << 20, 1 << max(nbytes - 1, 1).bit_length())
            buf = host_buffer(size, self.cache.buffer.device)
            reg = self._agent.register_memory(buf)
            self._stage_all.append((buf, reg))
            return buf

    def _unpacker(self):
        """The thread that unpacks staged parts while the next part is read (made on first use)."""
        with self._lock:
            self._refuse_if_closing()
            if self._unpack_pool is None:
                self._unpack_pool = ThreadPoolExecutor(1, thread_name_prefix=f"kvc-unpack-{self.name}")
            return self._unpack_pool

    def _return_staging(self, buf: torch.Tensor) -> None:
        """Back to the free list, once (a second return of the same buffer is a no-op); a
        buffer this Endpoint no longer holds (closed since) is dropped."""
        with self._lock:
            if any(b is buf for b, _ in self._stage_all) and \
                    not any(b is buf for b in self._stage_free):
                self._stage_free.append(buf)
