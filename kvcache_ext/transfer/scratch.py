"""Host memory for a request's plan tables (the int64 runs of TransferPlan.token_runs), kept for
the next request of the same plan pair.

A request's runs table is new memory: between two block sizes of a channel-major page it is
most of a MiB (16,384 runs for 8,192 tokens), above glibc's mmap threshold, so each request
maps fresh pages and takes one page fault per 4 KiB on its first touch -- 2.5 ms of a 2-core
VM's planning for a pass that takes 0.3 ms on memory touched before. A pool lends a slab it
already holds instead, and takes it back when the last tensor on it is gone: the tensor is made
by torch.frombuffer over a memoryview of the slab, which the tensor's storage holds until it is
freed, so the memoryview's finalizer runs exactly then (whatever views of the table, numpy
arrays over it or other threads still hold it, the slab is not lent twice). A slab is a
private anonymous mmap: its pages are faulted in by the first table written there, only as far
as that table's rows go (token_runs lends a table of the most rows a request can take and
writes the rows it keeps), and stay in for every later one; reserve() faults a whole slab in
at once.
Torch and the standard library only: `import kvcache_ext` needs nothing else."""
from __future__ import annotations

import mmap
import threading
import weakref

import torch

_POOLED_MIN = 64 << 10   # smaller tables come from the heap, touched before
_SLAB_ALIGN = 64 << 10


class _Slab(mmap.mmap):
    """A slab and whether reserve() has faulted it in whole (then it is not filled again)."""
    whole = False


class TablePool:
    """Slabs of host memory lent as int64 tables: at most `keep` slabs, `keep_bytes` in all,
    are kept for reuse once returned (the rest are freed)."""

    def __init__(self, keep: int = 4, keep_bytes: int = 32 << 20) -> None:
        self.keep, self.keep_bytes = keep, keep_bytes
        # reentrant: a slab comes back from a finalizer, which a garbage collection that an
        # allocation under the lock sets off may run on this very thread
        self._lock = threading.RLock()
        self._free: list[_Slab] = []
        self.lent = 0     # slabs lent now
        self.made = 0     # slabs made (each fresh one faults its pages in once)
        self.faulted = 0  # bytes reserve() faulted in

    def int64(self, rows: int, cols: int) -> torch.Tensor:
        """An uninitialised int64 [rows, cols] table."""
        nbytes = rows * cols * 8
        if nbytes < _POOLED_MIN:
            return torch.empty(rows, cols, dtype=torch.int64)
        slab = self._take(nbytes)
        lease = memoryview(slab)[:nbytes]
        fin = weakref.finalize(lease, self._give, slab)
        fin.atexit = False
        return torch.frombuffer(lease, dtype=torch.int64).view(rows, cols)

    def reserve(self, nbytes: int) -> None:
        """A slab of at least nbytes faulted in now and kept (a consumer's first request then
        plans on warm memory too): keep_bytes grows to hold it if it must."""
        if nbytes < _POOLED_MIN:
            return
        slab = self._take(nbytes)
        with self._lock:
            self.keep_bytes = max(self.keep_bytes, len(slab))
            whole, slab.whole = slab.whole, True  # a second reserve() here: in already
            self.faulted += 0 if whole else len(slab)
        if not whole:
            torch.frombuffer(slab, dtype=torch.uint8).fill_(0)
        self._give(slab)

    def _take(self, nbytes: int) -> _Slab:
        with self._lock:
            # the smallest kept slab that holds the table and is not far larger
            most = max(8 * nbytes, nbytes + (8 << 20))
            fits = [s for s in self._free if nbytes <= len(s) <= most]
            if fits:
                slab = min(fits, key=len)
                self._free = [s for s in self._free if s is not slab]
            else:
                slab = None
                self.made += 1
            self.lent += 1
        if slab is None:
            # private anonymous memory (not shared with a forked child): no page touched yet
            slab = _Slab(-1, -(-nbytes // _SLAB_ALIGN) * _SLAB_ALIGN,
                         flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return slab

    def _give(self, slab: _Slab) -> None:
        # keep the largest slabs (a large one serves every smaller table), up to keep / keep_bytes
        with self._lock:
            self.lent -= 1
            kept: list[_Slab] = []
            total = 0
            for s in sorted(self._free + [slab], key=len, reverse=True):
                if len(kept) < self.keep and total + len(s) <= self.keep_bytes:
                    kept.append(s)
                    total += len(s)
            self._free = kept
