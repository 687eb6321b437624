"""Moving cache bytes between two caches in one process: copy_spans executes a span list,
copy_runs a list of strided runs (a re-tiling: one pass of one kernel, e.g. the channel-major
K pages of one block size into another's), copy_blocks copies whole blocks between any two
plans of one block size (SPEC 8).

The spans come from a TransferPlan (plan.py): both plans enumerate the same logical
bytes, and the spans covering them are merged wherever they continue in both buffers -- one
span per run of consecutive blocks between block-outer plans, one per (spec, layer) page (per
head in head-major layouts) between layer-outer ones.

Execution is one call of the op `copy_spans`: a parallel loop on the CPU, one batched operation
on the current stream when a GPU is involved (never one API call per span). GPU copies are
asynchronous: `CopyStats.event` is a CUDA event recorded on the current stream after the copy,
and the CopyStats holds both buffers, so pinned host memory stays alive while the caller keeps
the stats (wait on `stats.event`, or call `stats.synchronize()`, before dropping it or reusing
the memory). On the CPU the copy has finished when copy_spans returns and `event` is None.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..cache import KVCache
from ..ops.library import ops as _ops
from ..plan import CachePlan, GroupPlan
from .groups import GroupTransferPlan
from .plan import TransferPlan
from .spans import as_runs, as_spans


@dataclass(frozen=True)
class CopyStats:
    blocks: int          # blocks copied (copy_blocks); 0 for copy_spans
    spans: int           # spans in the one batched copy
    bytes: int
    event: object = field(default=None, compare=False)  # torch.cuda.Event, or None on the CPU
    buffers: tuple = field(default=(), repr=False, compare=False)  # kept alive with the stats

    def synchronize(self) -> None:
        """Block until the copy has finished (a no-op on the CPU)."""
        if self.event is not None:
            self.event.synchronize()

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())


def block_spans(plan: CachePlan, block_mapping: torch.Tensor) -> torch.Tensor:
    """int64 [S, 3] (src offset, dst offset, length) covering every (src, dst) block pair of one
    plan: the shortcut for TransferPlan(plan, plan).block_spans(block_mapping)."""
    return TransferPlan(plan, plan).block_spans(block_mapping, arg="block_mapping")


def copy_spans(src_cache: KVCache, dst_cache: KVCache, spans: torch.Tensor) -> CopyStats:
    """Copy span i: src_cache.buffer[src_offset : +length] -> dst_cache.buffer[dst_offset : ...].

    One call of the op: CPU<->CPU (parallel), GPU<->GPU or GPU<->pinned CPU (one batched
    operation on the current stream, asynchronous; see the module docstring for CopyStats.event
    and for keeping pinned memory alive). Overlapping destinations, or a destination over a
    source of the same call in one buffer, raise ValueError before anything is copied.
    """
    for arg, c in (("src_cache", src_cache), ("dst_cache", dst_cache)):
        if not isinstance(c, KVCache):
            raise TypeError(f"{arg} must be a KVCache, got {type(c).__name__}")
    spans = as_spans(spans)
    return _execute(src_cache.buffer, dst_cache.buffer, spans, blocks=0)


def copy_runs(src_cache: KVCache, dst_cache: KVCache, runs: torch.Tensor) -> CopyStats:
    """Copy the pieces of strided runs, int64 [R, 6] (src_offset, dst_offset, length,
    src_stride, dst_stride, count), from src_cache.buffer to dst_cache.buffer: what copy_spans
    does with spans_of_runs(runs), without the list of pieces -- runs are cut into items of
    about equal bytes, one parallel CPU loop or one CUDA launch (GPU<->GPU, GPU<->pinned CPU,
    asynchronous as copy_spans). For a TransferPlan's token_runs between two caches. The two
    buffers must not share memory; the runs are checked as check_runs checks them (ValueError /
    IndexError naming the run) before any byte moves."""
    for arg, c in (("src_cache", src_cache), ("dst_cache", dst_cache)):
        if not isinstance(c, KVCache):
            raise TypeError(f"{arg} must be a KVCache, got {type(c).__name__}")
    runs = as_runs(runs)
    src, dst = src_cache.buffer, dst_cache.buffer
    _ops.copy_runs(src, dst, runs)
    return _stats_after(src, dst, blocks=0, spans=int(runs[:, 5].sum()) if runs.numel() else 0,
                        nbytes=int((runs[:, 2] * runs[:, 5]).sum()) if runs.numel() else 0)


def _execute(src: torch.Tensor, dst: torch.Tensor, spans: torch.Tensor, blocks: int) -> CopyStats:
    _ops.copy_spans(src, dst, spans)
    return _stats_after(src, dst, blocks, int(spans.shape[0]),
                        int(spans[:, 2].sum()) if spans.numel() else 0)


def _stats_after(src: torch.Tensor, dst: torch.Tensor, blocks: int, spans: int,
                 nbytes: int) -> CopyStats:
    event = None
    gpu = src if src.is_cuda else dst if dst.is_cuda else None
    if gpu is not None:
        stream = torch.cuda.current_stream(gpu.device)
        for b in (src, dst):
            if b.is_cuda:
                b.record_stream(stream)  # the caching allocator waits for the copy before reuse
        event = torch.cuda.Event()
        event.record(stream)
    return CopyStats(blocks=blocks, spans=spans, bytes=nbytes, event=event, buffers=(src, dst) if gpu is not None else ())


def copy_blocks(src: KVCache, dst: KVCache, block_mapping) -> CopyStats:
    """Copy blocks src[block_mapping[i, 0]] -> dst[block_mapping[i, 1]], every spec and layer
    of dst's plan (each must be in src's plan), between any layouts and numbers of blocks of one
    block size. GPU<->GPU, GPU<->CPU (pinned for asynchrony) or CPU<->CPU, as copy_spans.

    Caches of group plans (plan_cache(groups=...)) take a mapping per group instead,
    block_mapping = {group name: [M, 2] (src, dst) blocks}: a physical block belongs to one
    group at a time, so only that group's pages of it move (GroupTransferPlan.block_spans)."""
    if isinstance(dst.plan, GroupPlan) or isinstance(src.plan, GroupPlan):
        if not isinstance(block_mapping, Mapping):
            raise TypeError("caches of group plans take block_mapping = {group name: [M, 2] "
                            f"blocks}}, got {type(block_mapping).__name__}")
        spans = GroupTransferPlan(src.plan, dst.plan, groups=list(block_mapping)).block_spans(
            block_mapping)
        return _execute(src.buffer, dst.buffer, spans,
                        blocks=sum(int(m.shape[0]) for m in block_mapping.values()))
    if src.plan.block_size != dst.plan.block_size:
        raise ValueError(f"copy_blocks needs equal block sizes, got {src.plan.block_size} (src) "
                         f"and {dst.plan.block_size} (dst): move tokens with "
                         f"TransferPlan(src.plan, dst.plan).token_spans(...) and copy_spans")
    xp = TransferPlan(src.plan, dst.plan)
    spans = xp.block_spans(block_mapping, arg="block_mapping")
    if _shares_memory(src.buffer, dst.buffer):
        mapping = block_mapping.to("cpu", torch.int64)
        both = torch.isin(mapping[:, 1], mapping[:, 0])
        if src.plan == dst.plan and bool(both.any()):
            i = int(torch.nonzero(both)[0])
            raise ValueError(f"block_mapping[{i}] writes block {int(mapping[i, 1])}, which a pair "
                             f"of the same call reads: within one cache the destinations must not "
                             f"be sources")
    return _execute(src.buffer, dst.buffer, spans, blocks=int(block_mapping.shape[0]))


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() and b0 < a0 + a.numel()
