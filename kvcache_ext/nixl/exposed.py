"""Reads of a peer's exposed buffer (a mixin of Endpoint, using its peers, cache and the
transfer machinery): an Endpoint(exposed_bytes=n) registers a buffer of its own, `ep.exposed`,
whose address its metadata carries, and a peer reads it with read_exposed -- a producer packs a
prompt there in the consumer's page form (kvcache_ext.transfer.pack), part by part, and the
consumer reads each part as it is packed."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import torch

from ..transfer import as_runs, as_spans, check_runs
from ..transfer.pack import pieces_of, split_runs
from . import paths
from .handle import TransferHandle, TransferStats
from .peers import Peer
from .run_paths import merged


class ExposedReads:
    def read_exposed(self, peer: Peer, runs: torch.Tensor, bounds=None,
                     ready: Callable[[int], None] | None = None) -> TransferHandle:
        """Pull bytes of the peer's exposed buffer (its Endpoint(exposed_bytes=)) into our cache:
        spans [S, 3] or runs [R, 6] whose source offsets are in that buffer, checked against its
        size and our cache before anything moves; posted as merged spans (the plain path). With
        `bounds` (increasing offsets of that buffer) the read is one NIXL transfer per range
        [bounds[p], bounds[p + 1]) that it touches, in order, each made only after ready(p)
        returns (the peer has filled that range: a packed read) -- planned once, up front."""
        self._check_open()
        if not isinstance(peer, Peer) or not peer.exposed_nbytes:
            raise ValueError(f"peer must be a Peer that exposes a buffer (Endpoint(exposed_bytes="
                             f"n > 0)), got {peer!r:.120}")
        self._check_peer(peer)
        t0 = time.perf_counter()
        via = dataclasses.replace(peer, address=peer.exposed_address, nbytes=peer.exposed_nbytes)
        if isinstance(runs, torch.Tensor) and runs.dim() == 2 and runs.shape[1] == 3:
            sp = as_spans(runs)  # spans as runs of one piece
            runs = torch.cat([sp, sp[:, 2:].repeat(1, 2), torch.ones_like(sp[:, :1])], 1)
        runs = as_runs(runs)
        check_runs(runs, via.nbytes, self.cache.buffer.numel())
        r = runs.numpy()  # the plain path's lists in numpy, as run_paths builds them
        pcs = pieces_of(r[r[:, 2] > 0])
        spans = merged(pcs[:, 0], pcs[:, 1], pcs[:, 2])
        stats = TransferStats(path="plain", spans=int(spans.shape[0]),
                              bytes=int(spans[:, 2].sum()), runs=int(runs.shape[0]))
        if stats.bytes == 0:
            return TransferHandle(self, peer, "READ", [], stats)
        if bounds is None:
            bounds = (0, via.nbytes)
        one = np.concatenate([spans, spans[:, 2:], spans[:, 2:], np.ones_like(spans[:, :1])], 1)
        parts = []
        for p, cut in enumerate(split_runs(one, 0, bounds)):
            if cut.numel():
                s = cut.numpy()
                parts.extend(paths.plain_parts(self, via, "READ", s[:, 1], s[:, 0], s[:, 2], stats,
                                               before=(lambda p=p: ready(p)) if ready else None))
        return self._start("READ", peer, parts, stats, None, t0)
