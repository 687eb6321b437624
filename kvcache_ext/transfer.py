"""Whole-block copies between two caches of one plan (offload, prefix reuse, KV transfer).

A block's bytes are its pages (CachePlan.block_pages); adjacent pages merge, so a block is one
span in block-outer layouts and one per (spec, layer) -- (spec, layer, head) in LHBNC -- in
layer-outer ones. Runs of consecutive blocks whose spans continue in both caches are coalesced.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._ext import ops as _ops
from .cache import KVCache
from .layout import CachePlan


@dataclass(frozen=True)
class CopyStats:
    blocks: int
    spans: int   # memcpy calls issued
    bytes: int


def block_spans(plan: CachePlan, block_mapping: torch.Tensor) -> torch.Tensor:
    """int64 [S, 3] (src offset, dst offset, length) covering every (src, dst) block pair."""
    mapping = _check_mapping(plan, block_mapping)
    if mapping.shape[0] == 0:
        return torch.zeros(0, 3, dtype=torch.int64)
    pieces = torch.tensor([(pg.start, pg.length, pg.block_stride) for pg in plan.block_pages()],
                          dtype=torch.int64)  # [P, 3]: start in block 0, length, block stride
    start, length, stride = pieces[:, 0], pieces[:, 1], pieces[:, 2]
    src = (start[None, :] + mapping[:, :1] * stride[None, :]).reshape(-1)
    dst = (start[None, :] + mapping[:, 1:] * stride[None, :]).reshape(-1)
    lens = length.repeat(mapping.shape[0])
    order = torch.argsort(src, stable=True)
    src, dst, lens = src[order], dst[order], lens[order]
    # A span continues the previous one when it starts where that ended, in both buffers.
    cont = torch.zeros_like(src, dtype=torch.bool)
    cont[1:] = (src[1:] == src[:-1] + lens[:-1]) & (dst[1:] == dst[:-1] + lens[:-1])
    run = torch.cumsum(~cont, 0) - 1
    n = int(run[-1]) + 1
    first = torch.nonzero(~cont).squeeze(1)
    total = torch.zeros(n, dtype=torch.int64).index_add_(0, run, lens)
    return torch.stack([src[first], dst[first], total], dim=1).contiguous()


def copy_blocks(src: KVCache, dst: KVCache, block_mapping: torch.Tensor) -> CopyStats:
    """Copy blocks src[block_mapping[i, 0]] -> dst[block_mapping[i, 1]], every spec and layer.

    GPU<->GPU, GPU<->CPU (pinned for asynchrony) or CPU<->CPU; asynchronous on the current
    stream when a GPU is involved.
    """
    if src.plan != dst.plan:
        raise ValueError("src and dst must share one plan (same specs, blocks, layout)")
    mapping = _check_mapping(src.plan, block_mapping)
    _check_pairs(mapping, same_buffer=_shares_memory(src.buffer, dst.buffer))
    spans = block_spans(src.plan, block_mapping)
    _ops.copy_spans(src.buffer, dst.buffer, spans)
    return CopyStats(blocks=int(block_mapping.shape[0]), spans=int(spans.shape[0]),
                     bytes=int(spans[:, 2].sum()))


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() and b0 < a0 + a.numel()


def _check_pairs(mapping: torch.Tensor, same_buffer: bool) -> None:
    """No two pairs with one destination; within one buffer, no destination that is also a
    source (chained pairs like [[0, 1], [1, 2]] would depend on the copy order)."""
    dst = mapping[:, 1]
    values, counts = torch.unique(dst, return_counts=True)
    if bool((counts > 1).any()):
        b = int(values[counts > 1][0])
        rows = torch.nonzero(dst == b).squeeze(1)[:2].tolist()
        raise ValueError(f"block_mapping rows {rows[0]} and {rows[1]} both copy into block {b}")
    if same_buffer:
        both = torch.isin(dst, mapping[:, 0])
        if bool(both.any()):
            i = int(torch.nonzero(both)[0])
            raise ValueError(f"block_mapping[{i}] writes block {int(dst[i])}, which another pair "
                             f"reads: within one cache the destinations must not be sources")


def _check_mapping(plan: CachePlan, block_mapping: torch.Tensor) -> torch.Tensor:
    if not isinstance(block_mapping, torch.Tensor) or block_mapping.dtype not in (torch.int64,
                                                                                  torch.int32):
        raise TypeError("block_mapping must be an int64 (or int32) tensor [M, 2]")
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [M, 2] (src, dst), got shape "
                         f"{tuple(block_mapping.shape)}")
    mapping = block_mapping.to("cpu", torch.int64)
    if mapping.numel() and (int(mapping.min()) < 0 or int(mapping.max()) >= plan.num_blocks):
        raise IndexError(f"block_mapping entries must be in [0, num_blocks = {plan.num_blocks})")
    return mapping
