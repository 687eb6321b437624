"""Byte spans (src_offset, dst_offset, length), int64 [S, 3]: their form, their checks and
their merge."""
from __future__ import annotations

import torch


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
    """What the op checks, in Python (for NIXL transfers, which bypass the op): every span
    inside both buffers with a length >= 0 (empty spans are ignored, as the copy op does), no two
    destinations overlapping, and, within one buffer, no destination over a source. IndexError /
    ValueError name the span."""
    if spans.shape[0] == 0:
        return
    src, dst, n = spans[:, 0], spans[:, 1], spans[:, 2]
    # ends compared as start > size - length (lengths are >= 0 by then): start + length could
    # wrap past 2^63 and pass
    for what, bad in (("length must be >= 0", n < 0),
                      (f"source range must lie in [0, {src_bytes})", (src < 0) | (src > src_bytes - n)),
                      (f"destination range must lie in [0, {dst_bytes})",
                       (dst < 0) | (dst > dst_bytes - n))):
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            err = ValueError if what.startswith("length") else IndexError
            raise err(f"{arg}[{i}] = {spans[i].tolist()}: {what}")
    index = torch.nonzero(n > 0).squeeze(1)  # empty spans overlap nothing
    src, dst, n = src[index], dst[index], n[index]
    order = torch.argsort(dst)
    d, e = dst[order], (dst + n)[order]
    clash = d[1:] < e[:-1]
    if bool(clash.any()):
        j = int(torch.nonzero(clash)[0])
        a, b = sorted((int(index[order[j]]), int(index[order[j + 1]])))
        raise ValueError(f"{arg}[{a}] and {arg}[{b}] write overlapping destination bytes")
    if same_buffer:  # a destination range that intersects any source range
        s_order = torch.argsort(src)
        s, s_end = src[s_order], (src + n)[s_order]
        prefix_end = torch.cummax(s_end, 0).values
        # for each destination [d, e): the last source starting before e must end <= d
        k = torch.searchsorted(s, dst + n, side="left") - 1
        hit = (k >= 0) & (prefix_end[k.clamp(min=0)] > dst)
        if bool(hit.any()):
            i = int(index[torch.nonzero(hit)[0]])
            raise ValueError(f"{arg}[{i}] writes bytes that a span of the same call reads "
                             f"(one buffer: destinations must not overlap sources)")


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
