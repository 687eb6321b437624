"""Byte spans (src_offset, dst_offset, length), int64 [S, 3]: their form, their checks and
their merge."""
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
    order = torch.argsort(dst, stable=True)
    order = order[torch.argsort(src[order], stable=True)]
    src, dst, length = src[order], dst[order], length[order]
    cont = torch.zeros_like(src, dtype=torch.bool)
    cont[1:] = (src[1:] == src[:-1] + length[:-1]) & (dst[1:] == dst[:-1] + length[:-1])
    run = torch.cumsum(~cont, 0) - 1
    first = torch.nonzero(~cont).squeeze(1)
    total = torch.zeros(first.numel(), dtype=torch.int64).index_add_(0, run, length)
    return torch.stack([src[first], dst[first], total], dim=1).contiguous()
