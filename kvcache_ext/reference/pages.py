"""Pieces every DeepSeek-V4 row format's reference shares: powers of two taken exactly from a
float's bits, and split pages (CacheSpec.split=(a, b): row n's first a bytes at n * a, its last
b bytes at rows * a + n * b; the pad up to page_align is never written)."""
from __future__ import annotations

import torch

from .v32 import _split, _valid


# ---- powers of two from the bits --------------------------------------------------------------
def ceil_log2(s: torch.Tensor) -> torch.Tensor:
    """int64 ceil(log2(s)) of positive fp32 s, exactly from the bits; +inf -> 128.

    Normal s = 1.M x 2^(E-127): E - 127 + (M != 0). Subnormal s = M x 2^-149:
    bitlength(M - 1) - 149. (exp2(ceil(log2(s))) in fp32 misses s = 2^k (1 + 2^-23), where
    log2 rounds to k.)"""
    bits = s.float().contiguous().view(torch.int32).to(torch.int64)
    exp, man = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    normal = exp - 127 + (man != 0).to(torch.int64)
    # bitlength(n) for 0 <= n < 2^23: frexp of the exactly converted float64
    bitlen = torch.frexp((man - 1).clamp(min=0).to(torch.float64)).exponent.to(torch.int64)
    return torch.where(exp == 0, bitlen - 149, normal)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """fp32 2^e for integer e (2^128 -> inf, 2^-127 a subnormal: both exact IEEE results)."""
    return torch.ldexp(torch.ones(e.shape, dtype=torch.float64, device=e.device),
                       e.to(torch.int64)).float()


# ---- split pages ------------------------------------------------------------------------------
def _split_pages(view: torch.Tensor) -> torch.Tensor:
    """A one-head view [num_blocks, 1, rows, C] as [num_blocks, rows * C] contiguous pages."""
    nb, h, rows, c = view.shape
    if h != 1:
        raise ValueError(f"a split page has one head, got view with {h} heads")
    if view.stride(2) != c or view.stride(3) != 1:
        raise ValueError(f"view must have contiguous pages (row stride {c} bytes), got strides "
                         f"{view.stride()}")
    return torch.as_strided(view, (nb, rows * c), (view.stride(0), 1))


def write_split(view: torch.Tensor, slots: torch.Tensor, first: torch.Tensor,
                last: torch.Tensor) -> None:
    """Rows split (a, b) = (first [T, a], last [T, b]) into a split view; slots < 0 skipped."""
    a, b = first.shape[1], last.shape[1]
    if a + b != view.shape[3]:
        raise ValueError(f"split ({a}, {b}) must add up to the view's row bytes {view.shape[3]}")
    pages = _split_pages(view)  # raises before anything is written
    slots = slots.reshape(-1).to(view.device)
    keep = _valid(view, slots)
    blk, pos = _split(view, slots[keep])
    rows, dev = view.shape[2], view.device
    blk, pos = blk[:, None], pos[:, None]
    pages[blk, pos * a + torch.arange(a, device=dev)] = first[keep.to(first.device)].to(dev)
    last = last[keep.to(last.device)].to(dev)
    pages[blk, rows * a + pos * b + torch.arange(b, device=dev)] = last


def read_split(view: torch.Tensor, slots: torch.Tensor,
               split: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(first [T, a], last [T, b]) of the rows at slots; invalid slots read as zeros."""
    a, b = split
    pages = _split_pages(view)
    slots = slots.reshape(-1).to(view.device)
    keep = _valid(view, slots)
    blk, pos = _split(view, torch.where(keep, slots, torch.zeros_like(slots)))
    rows, dev = view.shape[2], view.device
    blk, pos = blk[:, None], pos[:, None]
    first = pages[blk, pos * a + torch.arange(a, device=dev)].clone()
    last = pages[blk, rows * a + pos * b + torch.arange(b, device=dev)].clone()
    first[~keep], last[~keep] = 0, 0
    return first, last
