"""The packed read between two block sizes (kvcache_ext.transfer.pack inside the connector): the
producer re-tiles a prompt into the consumer's page form in its pack buffer (registered with
NIXL as its Endpoint's exposed buffer), part by part on its own core, and streams "part p is
packed" over the side channel; the consumer reads each part straight into place as it comes
(whole pages, as between equal plans) while the producer packs the next. Without a pack buffer,
or when it is full, the consumer re-tiles what it reads itself (worker.py)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .. import nixl as kvc_nixl
from ..ops.library import ops as _ops
from ..plan import CachePlan, plan_from_dict, plan_to_dict
from ..transfer.pack import PACK_PART_BYTES, PackPlans, split_runs


@dataclass
class _Slot:
    offset: int
    nbytes: int
    busy: bool = True       # being packed: its range is freed only when that ends
    released: bool = False  # the read is over (or the hold ended): free once not busy


class Done:
    """A read that has already finished, as the worker's loads see a handle (a packed read moves
    its parts as they are packed)."""

    def __init__(self, stats: kvc_nixl.TransferStats) -> None:
        self.stats = stats

    def wait(self, timeout_s: float) -> None:
        pass

    def cancel(self) -> None:
        pass


class PackBuffer:
    """A producer's pack buffer: ranges lent to one request each, first fit. A range is never
    lent again while a pack may still write into it."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._plans: PackPlans | None = None  # the packed plans out of the cache's plan

    def lend(self, rid: str, nbytes: int) -> int | None:
        """The offset of a free range of nbytes lent to rid (None: no room, or rid holds a
        range already)."""
        with self._lock:
            if rid in self._slots:  # asked twice: the first asker may still read its range
                return None
            at = 0
            for s in sorted(self._slots.values(), key=lambda s: s.offset):
                if s.offset - at >= nbytes:
                    break
                at = max(at, s.offset + s.nbytes)
            if at + nbytes > self.buffer.numel():
                return None
            self._slots[rid] = _Slot(at, nbytes)
            return at

    def free(self, rid: str) -> None:
        """rid's range back (at once, or when its packing ends)."""
        with self._lock:
            slot = self._slots.get(rid)
            if slot is not None:
                if slot.busy:
                    slot.released = True
                else:
                    del self._slots[rid]

    def _packed(self, rid: str, at: int) -> None:
        with self._lock:
            slot = self._slots.get(rid)
            if slot is not None and slot.offset == at:
                slot.busy = False
                if slot.released:
                    del self._slots[rid]

    def lent(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return {rid: (s.offset, s.nbytes) for rid, s in self._slots.items()}

    def busy(self, rid: str) -> bool:
        with self._lock:
            slot = self._slots.get(rid)
            return slot is not None and slot.busy

    def pack(self, cache: torch.Tensor, plan: CachePlan, rid: str, ask: dict,
             alive: Callable[[], bool]):
        """The acquire's reply, then "part p" as each part is packed: the prompt's tokens
        re-tiled from `cache` (of `plan`) into the consumer's page form (its plan, start, count,
        our block ids and the part size, from `ask`) in a range lent to rid. What cannot be
        packed (no room, a plan or block list that does not fit) answers packed: None with why:
        the consumer then reads our cache as it is. alive(): the producer still holds rid's
        blocks (checked after the range is lent and before each part: a hold released meanwhile
        frees the range, and a pack never reads blocks given back to vLLM)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            dst = plan_from_dict(ask["plan"])
            start, count = int(ask["start"]), int(ask["count"])
            plans = self._plans
            if plans is None or (plans.own is not plan and plans.own != plan):
                plans = self._plans = PackPlans(plan, own_is_src=True)
            pr, xplan = plans.get(dst, start, count, int(ask["part_bytes"]))
            table = torch.tensor(ask["block_ids"], dtype=torch.int64)
            used = table[start // plan.block_size:-(-(start + count) // plan.block_size)]
            if used.numel() * plan.block_size < start % plan.block_size + count or (
                    used.numel() and not 0 <= int(used.min()) <= int(used.max()) < plan.num_blocks):
                raise IndexError(f"block_ids {ask['block_ids'][:8]}... do not hold tokens "
                                 f"{start}..{start + count} in {plan.num_blocks} blocks")
        except Exception as e:  # noqa: BLE001 - the consumer reads unpacked instead
            yield {"ok": True, "packed": None, "why": f"{type(e).__name__}: {e}"}, b""
            return
        at = self.lend(rid, pr.nbytes)
        if at is None:
            yield {"ok": True, "packed": None,
                   "why": f"the pack buffer has no {pr.nbytes} B free"}, b""
            return
        try:  # the reply first: the consumer plans its read while the runs are planned here
            if not alive():  # released while this was planned: the range is not left lent
                self.free(rid)
                yield {"ok": False, "why": f"request {rid}'s blocks were released"}, b""
                return
            yield {"ok": True, "packed": {"offset": at, "bytes": pr.nbytes,
                                          "part_bytes": int(ask["part_bytes"])}}, b""
            runs = xplan.token_runs(table, pr.table(), count, start, start).numpy().copy()
            runs[:, 1] += at  # into the lent range
            # each part in source order: the runs that split one source page (a block-size
            # change) follow each other, so the page is read from DRAM once, not once per run
            # (64 -> 32: 20 ms -> 10 ms for 134 MB on a 2-core EPYC); sorted, cut and offset
            # before the first part, so a part is one call that lets go of the GIL (copy_runs)
            # beside its notice: the worker's main thread may hold the GIL for 5 ms at a time
            parts = split_runs(runs, 1, [b + at for b in pr.bounds], order_col=0)
            for p, part in enumerate(parts):
                if not alive():
                    raise RuntimeError(f"request {rid}'s blocks were released while packing")
                if part.numel():
                    _ops.copy_runs(cache, self.buffer, part)
                yield {"ok": True, "part": p, "pack_s": time.perf_counter() - t0,
                       "pack_cpu_s": time.thread_time() - c0}, b""
        finally:
            self._packed(rid, at)


def packed_tokens_max(ep: kvc_nixl.Endpoint, peer: kvc_nixl.Peer) -> int:
    """The longest prompt (from a block's first token) a packed read from this producer takes:
    its pack buffer's worth of this engine's blocks; 0 where none applies (the same block size,
    a grouped cache on either side, no pack buffer)."""
    if (not peer.exposed_nbytes or not isinstance(peer.plan, CachePlan)
            or not isinstance(ep.plan, CachePlan) or peer.plan.block_size == ep.plan.block_size):
        return 0
    return peer.exposed_nbytes // ep.plan.block_stride * ep.plan.block_size


def pack_ask(ep: kvc_nixl.Endpoint, peer: kvc_nixl.Peer, block_ids, start: int, count: int,
             part_bytes: int = PACK_PART_BYTES, plans: PackPlans | None = None) -> dict | None:
    """What a consumer asks its producer to pack, where a packed read applies: another block
    size, one cache plan on each side, and the packed prompt fits the producer's pack buffer.
    plans: the consumer's PackPlans into ep.plan (kept by the caller: made once per length)."""
    if count == 0 or not packed_tokens_max(ep, peer):
        return None
    plans = plans or PackPlans(ep.plan, own_is_src=False)
    if plans.get(ep.plan, start, count, part_bytes)[0].nbytes > peer.exposed_nbytes:
        return None
    return {"plan": plan_to_dict(ep.plan), "start": start, "count": count,
            "block_ids": list(block_ids), "part_bytes": part_bytes}


def read_packed(ep: kvc_nixl.Endpoint, peer: kvc_nixl.Peer, dst_table: torch.Tensor, start: int,
                count: int, packed: dict, replies, left, plans: PackPlans | None = None
                ) -> tuple[kvc_nixl.TransferStats, torch.Tensor]:
    """Read each part of the prompt into place as the producer reports it packed (packed: its
    first reply's offset, bytes and part size; replies: the side channel's stream after that
    reply, each wait bounded by the read's deadline; left(): seconds left to it).
    -> (what it did, the runs it read: sources in the exposed buffer, destinations the rows
    written). Raises, with every posted part cancelled, if the producer fails, stops or is
    late; closes `replies`. plans: as pack_ask's."""
    handle = None
    try:
        t, c = time.perf_counter(), time.thread_time()
        plans = plans or PackPlans(ep.plan, own_is_src=False)
        pr, xplan = plans.get(ep.plan, start, count, int(packed["part_bytes"]))
        if int(packed.get("bytes", -1)) != pr.nbytes:
            raise RuntimeError(f"the producer packed {packed.get('bytes')} B, this read needs "
                               f"{pr.nbytes} B")
        runs = xplan.token_runs(pr.table(), dst_table, count, start, start)
        at = int(packed["offset"])
        runs[:, 0] += at  # the sources in the producer's exposed buffer (runs is this read's)
        plan_s, plan_cpu_s = time.perf_counter() - t, time.thread_time() - c
        seen, waited, pack_s, first_wait = [-1], [0.0], [0.0, 0.0], [0.0]

        def ready(p: int) -> None:  # part p is packed: the producer said so (parts in order)
            tw = time.perf_counter()
            while seen[0] < p:
                msg, _ = next(replies, ({"ok": False, "why": "the side channel closed"}, b""))
                if not msg.get("ok") or "part" not in msg:
                    raise RuntimeError(f"the producer did not pack part {p} of {pr.parts}: "
                                       f"{msg.get('why', msg)}")
                seen[0] = int(msg["part"])
                pack_s[:] = float(msg.get("pack_s", 0.0)), float(msg.get("pack_cpu_s", 0.0))
            waited[0] += time.perf_counter() - tw
            if p == 0:  # waited inside the first part's build: pack_wait_s, not build_s
                first_wait[0] = waited[0]
        handle = ep.read_exposed(peer, runs, [b + at for b in pr.bounds], ready)
        handle.wait(left())
        if seen[0] < pr.parts - 1:  # parts of no bytes at the end: their notices, for pack_s
            ready(pr.parts - 1)
    except BaseException as e:
        if handle is not None:
            handle.cancel()  # no byte lands after this
        if isinstance(e, kvc_nixl.NixlError):  # a part that failed, or was never packed
            raise RuntimeError(str(e)) from None
        raise
    finally:
        replies.close()
    stats = handle.stats
    stats.path, stats.plan_s, stats.plan_cpu_s = "packed", plan_s, plan_cpu_s
    stats.pack_wait_s, (stats.pack_s, stats.pack_cpu_s) = waited[0], pack_s
    stats.build_s = max(0.0, stats.build_s - first_wait[0])
    return stats, runs
