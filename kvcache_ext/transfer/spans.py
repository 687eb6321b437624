"""Byte spans (src_offset, dst_offset, length), int64 [S, 3]: their form, their checks and
their merge; and strided runs (src_offset, dst_offset, length, src_stride, dst_stride, count),
int64 [R, 6] -- `count` pieces of `length` bytes, piece j from src_offset + j x src_stride to
dst_offset + j x dst_stride -- the shorter form of span lists whose pieces step evenly (what
NIXL's strided descriptor lists take)."""
from __future__ import annotations

import torch

from ..ops.library import ops as _ops


def as_spans(spans: torch.Tensor, arg: str = "spans") -> torch.Tensor:
    """spans as the op takes them: a contiguous int64 CPU tensor [S, 3]."""
    if not isinstance(spans, torch.Tensor) or spans.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{arg} must be an int64 tensor [S, 3] (src_offset, dst_offset, length)")
    if spans.dim() != 2 or spans.shape[1] != 3:
        raise ValueError(f"{arg} must be [S, 3] (src_offset, dst_offset, length), got shape "
                         f"{tuple(spans.shape)}")
    return spans.to("cpu", torch.int64).contiguous()


def check_spans(spans: torch.Tensor, src_bytes: int, dst_bytes: int,
                same_buffer: bool = False, arg: str = "spans") -> None:
    """The rules copy_spans checks every call with (csrc/ops/spans.h, one implementation), for
    transfers that bypass the op (NIXL): every span inside both buffers with a length >= 0
    (empty spans are ignored, as the copy op does), no two destinations overlapping, and, within
    one buffer, no destination over a source. IndexError / ValueError name the span."""
    _ops.check_spans(as_spans(spans, arg), src_bytes, dst_bytes, same_buffer, arg)


def merge_spans(src: torch.Tensor, dst: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Sort pieces by (src, dst) and merge each one into the previous where it continues it in
    both buffers. -> int64 [S, 3] (src_offset, dst_offset, length)."""
    if src.numel() == 0:
        return torch.zeros(0, 3, dtype=torch.int64)
    src, dst, length = (t.to("cpu", torch.int64) for t in (src, dst, length))
    order = torch.argsort(dst, stable=True)
    order = order[torch.argsort(src[order], stable=True)]
    src, dst, length = src[order], dst[order], length[order]
    cont = torch.zeros_like(src, dtype=torch.bool)
    cont[1:] = (src[1:] == src[:-1] + length[:-1]) & (dst[1:] == dst[:-1] + length[:-1])
    run = torch.cumsum(~cont, 0) - 1
    first = torch.nonzero(~cont).squeeze(1)
    total = torch.zeros(first.numel(), dtype=torch.int64).index_add_(0, run, length)
    return torch.stack([src[first], dst[first], total], dim=1).contiguous()


def as_runs(runs: torch.Tensor, arg: str = "runs") -> torch.Tensor:
    """runs as the ops take them: a contiguous int64 CPU tensor [R, 6]."""
    if not isinstance(runs, torch.Tensor) or runs.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{arg} must be an int64 tensor [R, 6] (src_offset, dst_offset, length, "
                        f"src_stride, dst_stride, count)")
    if runs.dim() != 2 or runs.shape[1] != 6:
        raise ValueError(f"{arg} must be [R, 6] (src_offset, dst_offset, length, src_stride, "
                         f"dst_stride, count), got shape {tuple(runs.shape)}")
    return runs.to("cpu", torch.int64).contiguous()


def runs_of_spans(spans: torch.Tensor) -> torch.Tensor:
    """The spans as strided runs: in the spans' order, every piece that has the previous one's
    length and steps from it as the run's second piece did (strides >= the length on both
    sides) joins its run. spans_of_runs(runs_of_spans(s)) == s."""
    spans = as_spans(spans)
    runs = torch.empty(spans.shape[0], 6, dtype=torch.int64)
    count = torch.zeros(1, dtype=torch.int64)
    _ops.runs_of_spans(spans, runs, count)
    return runs[:int(count)].clone()


def spans_of_runs(runs: torch.Tensor) -> torch.Tensor:
    """The spans a list of runs stands for, in order: int64 [sum(count), 3]."""
    runs = as_runs(runs)
    count = runs[:, 5]
    if bool((count < 1).any()):
        raise ValueError(f"runs[{int(torch.nonzero(count < 1)[0])}]: count must be >= 1")
    run = torch.repeat_interleave(torch.arange(runs.shape[0]), count)
    j = torch.arange(run.numel(), dtype=torch.int64) - torch.repeat_interleave(
        torch.cumsum(count, 0) - count, count)
    r = runs[run]
    return torch.stack([r[:, 0] + j * r[:, 3], r[:, 1] + j * r[:, 4], r[:, 2]], 1).contiguous()


def check_runs(runs: torch.Tensor, src_bytes: int, dst_bytes: int, arg: str = "runs") -> None:
    """The span rules on runs, without expanding them (csrc/ops/runs.cpp): count >= 1, length >=
    0, a destination stride >= the length (and a source stride >= 0) when count > 1, every piece
    inside both buffers, no two destination pieces overlapping. IndexError / ValueError name
    the run."""
    _ops.check_runs(as_runs(runs, arg), src_bytes, dst_bytes, arg)
