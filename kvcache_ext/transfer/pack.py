"""A request's tokens packed in another plan's page form: what lets a producer do the re-tiling of
a block-size change on its own core, so the consumer reads whole pages into place as between
equal plans (the packed read of kvcache_ext.vllm; SPEC 8).

    pr = packed_read(consumer_plan, start, count)     # the packed form: blocks 0.. of pr.plan
    pack = TransferPlan(producer_plan, pr.plan).token_runs(src_table, pr.table(), count,
                                                           start, start)   # producer: re-tile
    read = TransferPlan(pr.plan, consumer_plan).token_runs(pr.table(), dst_table, count,
                                                           start, start)   # consumer: pages
    for p, (a, b) in enumerate(zip(split_runs(pack, 1, pr.bounds), split_runs(read, 0, pr.bounds))):
        ...  # part p of the packed bytes: written by a, then read by b

pr.plan has the consumer's specs and block size, its layers outermost (the consumer's own
layout when that is layer-outer), and as many blocks as the tokens touch: packed block k holds
the consumer's logical block start // block_size + k. The packed bytes are cut into parts at
fixed offsets (pr.bounds), and split_runs cuts both run lists at them, so part p's reads need
only part p's packing: a producer can pack part p + 1 while the consumer reads part p.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..plan import CachePlan, plan_cache
from .checks import check_counts
from .plan import TransferPlan
from .scratch import TablePool

# the parts a packed read is pipelined in: each is one NIXL read of the consumer (about 0.3 ms
# of fixed cost on a 2-core host) and the first is packed before any is read
PACK_PART_BYTES = 16 << 20


def pack_layout(layout: str) -> str:
    """The layer-outer layout with the same page form: LBHNC for BHLNC, LBNHC for BLNHC."""
    return layout if layout[0] == "L" else "L" + layout.replace("L", "")


@dataclass(frozen=True)
class PackedRead:
    """Tokens start .. start + count - 1 of a request in `plan`'s blocks 0.., cut into parts:
    part p is bytes [bounds[p], bounds[p + 1]) of the packed buffer."""

    plan: CachePlan
    start: int
    count: int
    bounds: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.plan.total_bytes

    @property
    def parts(self) -> int:
        return len(self.bounds) - 1

    def table(self) -> torch.Tensor:
        """The request's block table on the packed side: logical block j -> packed block
        j - start // block_size (the blocks before the first are never used: 0)."""
        bs = self.plan.block_size
        first = self.start // bs
        n = -(-(self.start + self.count) // bs)
        return (torch.arange(n, dtype=torch.int64) - first).clamp_(min=0)


def _check_read(dst_plan: CachePlan, start: int, count: int, part_bytes: int) -> None:
    if not isinstance(dst_plan, CachePlan):
        raise TypeError(f"dst_plan must be a CachePlan, got {type(dst_plan).__name__}")
    for arg, v in (("start", start), ("count", count), ("part_bytes", part_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if arg != "start" else 0):
            raise ValueError(f"{arg} must be an int >= {1 if arg != 'start' else 0}, got {v!r}")


def _blocks(block_size: int, start: int, count: int) -> int:
    """The blocks tokens start .. start + count - 1 touch."""
    return -(-(start + count) // block_size) - start // block_size


def packed_read(dst_plan: CachePlan, start: int, count: int,
                part_bytes: int = PACK_PART_BYTES) -> PackedRead:
    """The packed form of tokens start .. start + count - 1 for a consumer of plan dst_plan."""
    _check_read(dst_plan, start, count, part_bytes)
    return _packed_read(dst_plan, start, count, part_bytes)


def _packed_read(dst_plan: CachePlan, start: int, count: int, part_bytes: int) -> PackedRead:
    bs = dst_plan.block_size
    plan = plan_cache(list(dst_plan.specs), _blocks(bs, start, count), bs,
                      pack_layout(dst_plan.layout))
    total = plan.total_bytes
    bounds = tuple(range(0, total, part_bytes)) + (total,)
    return PackedRead(plan, start, count, bounds)


class PackPlans:
    """The packed reads of one engine's cache plan `own`, made once per consumer plan, block count
    and part size and kept (the last `keep`): packed_read and the TransferPlan between the packed
    plan and `own` -- into it for a consumer (own_is_src False), out of it for a producer. A
    request of a length seen before then plans only its runs; every request, whatever its
    length, plans them in tables lent by one pool (`tables`, transfer/scratch.py) from memory an
    earlier request touched, so prompts of ever new lengths fault no fresh table in either."""

    def __init__(self, own: CachePlan, own_is_src: bool, keep: int = 16) -> None:
        if not isinstance(own, CachePlan):
            raise TypeError(f"own must be a CachePlan, got {type(own).__name__}")
        self.own, self.own_is_src, self.keep = own, own_is_src, keep
        self._made: OrderedDict[tuple, tuple[CachePlan, tuple[int, ...], TransferPlan]] = (
            OrderedDict())
        self._lock = threading.Lock()
        self.tables = TablePool()

    def get(self, dst_plan: CachePlan, start: int, count: int,
            part_bytes: int = PACK_PART_BYTES) -> tuple[PackedRead, TransferPlan]:
        """(packed_read(dst_plan, start, count, part_bytes), its TransferPlan with own)."""
        _check_read(dst_plan, start, count, part_bytes)
        if not self.own_is_src and dst_plan is not self.own and dst_plan != self.own:
            raise ValueError("a consumer's packed reads are into its own plan: dst_plan must "
                             "be `own`")
        # the key is arithmetic: a length seen before plans nothing but its runs
        key = (dst_plan.specs, dst_plan.block_size, dst_plan.layout,
               _blocks(dst_plan.block_size, start, count), part_bytes)
        with self._lock:
            made = self._made.get(key)
            if made is not None:
                self._made.move_to_end(key)
        if made is None:
            pr = _packed_read(dst_plan, start, count, part_bytes)  # checked above
            xplan = (TransferPlan(self.own, pr.plan) if self.own_is_src
                     else TransferPlan(pr.plan, self.own))
            xplan.tables = self.tables  # one pool for all lengths
            made = (pr.plan, pr.bounds, xplan)
            with self._lock:
                made = self._made.setdefault(key, made)
                while len(self._made) > self.keep:
                    self._made.popitem(last=False)
        return PackedRead(made[0], start, count, made[1]), made[2]

    def reserve(self, num_tokens: int) -> None:
        """A consumer's: fault in now the runs table of a packed read of up to num_tokens
        tokens (TransferPlan.reserve_runs in the pool every length shares) and plan one such
        read, so the first packed request plans on warm memory and pays no first call's costs
        (0.4 ms of CPU on a 2-core EPYC), as its plain reads do after the handshake."""
        if self.own_is_src:
            raise ValueError("a producer's packed plans depend on each consumer's plan: "
                             "reserve is a consumer's (own_is_src False)")
        check_counts(num_tokens=num_tokens)
        if num_tokens:
            pr, xplan = self.get(self.own, 0, num_tokens)
            xplan.reserve_runs(num_tokens, in_step=True)  # a packed read's starts agree
            # the planning's first calls (the table, the checks, the op): one block's tokens
            bs = self.own.block_size
            xplan.token_runs(pr.table()[:1], torch.zeros(1, dtype=torch.int64),
                             min(num_tokens, bs))


def pieces_of(f: np.ndarray) -> np.ndarray:
    """Runs [R, 6] (numpy) as one run of count 1 per piece, in order."""
    cnt = f[:, 5]
    which = np.repeat(np.arange(f.shape[0]), cnt)
    j = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    g = f[which].copy()
    g[:, 0] += j * g[:, 3]
    g[:, 1] += j * g[:, 4]
    g[:, 3] = g[:, 4] = g[:, 2]
    g[:, 5] = 1
    return g


def split_runs(runs: torch.Tensor, col: int, bounds,
               order_col: int | None = None) -> list[torch.Tensor]:
    """Runs [R, 6] (src, dst, length, src_stride, dst_stride, count) cut at the byte offsets
    `bounds` of their source (col 0) or destination (col 1) side: one int64 [*, 6] per part
    [bounds[p], bounds[p + 1]), together the same bytes. A run whose pieces lie in one part
    stays whole; one that crosses a bound becomes its pieces, and a piece that crosses one is
    cut there. order_col: each part's runs sorted by that column (one sort for all parts)."""
    if col not in (0, 1):
        raise ValueError(f"col must be 0 (source) or 1 (destination), got {col!r}")
    b = np.asarray(bounds, dtype=np.int64)
    if b.ndim != 1 or b.size < 2 or np.any(np.diff(b) <= 0):
        raise ValueError("bounds must be at least two increasing offsets")
    r = runs.numpy() if isinstance(runs, torch.Tensor) else np.asarray(runs)
    r = r[r[:, 2] > 0].astype(np.int64, copy=False)
    last = r[:, col] + (r[:, 5] - 1) * r[:, 3 + col]
    lo = np.minimum(r[:, col], last)
    hi = np.maximum(r[:, col], last) + r[:, 2]
    if r.shape[0] and (lo.min() < b[0] or hi.max() > b[-1]):
        raise ValueError(f"runs reach bytes {int(lo.min())}..{int(hi.max())} outside the "
                         f"bounds {int(b[0])}..{int(b[-1])}")

    def part(x: np.ndarray) -> np.ndarray:
        return np.searchsorted(b, x, side="right") - 1

    whole = part(lo) == part(hi - 1)
    out, parts = [r[whole]], [part(lo[whole])]
    f = r[~whole]
    if f.shape[0]:  # their pieces, one run each
        g = pieces_of(f)
        while g.shape[0]:
            p = part(g[:, col])
            cross = p != part(g[:, col] + g[:, 2] - 1)
            out.append(g[~cross])
            parts.append(p[~cross])
            c = g[cross]
            head = b[p[cross] + 1] - c[:, col]  # bytes up to the next bound
            tail = c.copy()
            c[:, 2] = head
            c[:, 3] = c[:, 4] = head
            tail[:, 0] += head
            tail[:, 1] += head
            tail[:, 2] -= head
            tail[:, 3] = tail[:, 4] = tail[:, 2]
            out.append(c)
            parts.append(p[cross])
            g = tail
    allr, allp = np.concatenate(out), np.concatenate(parts)
    order = (np.argsort(allp, kind="stable") if order_col is None
             else np.lexsort((allr[:, order_col], allp)))
    allr, allp = allr[order], allp[order]
    cuts = np.searchsorted(allp, np.arange(b.size))
    return [torch.from_numpy(np.ascontiguousarray(allr[cuts[i]:cuts[i + 1]]))
            for i in range(b.size - 1)]
