"""Slot mapping: where each token of a batch is written (SPEC 7; compressed rows, SPEC 10)."""
from __future__ import annotations

import torch

from .spec import check_positive


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int,
                 req_indices: torch.Tensor | None = None, compress_ratio: int = 1) -> torch.Tensor:
    """int64 [T] slots: block_table[req, pos // block_size] * block_size + pos % block_size.

    A block-table entry < 0 (an unassigned block) gives slot -1: padding, which every write
    skips (vLLM's rule: every negative slot is padding).

    compress_ratio = r > 1 (SPEC 10, vLLM's get_compressed_slot_mapping): slots count rows of
    a spec that stores one row per r tokens. Only a token with (pos + 1) % r == 0 writes:
    cpos = pos // r, rows = block_size // r, slot = block_table[req, cpos // rows] * rows
    + cpos % rows; every other token gets -1. `block_size` is the group's (tokens per block)."""
    check_positive("block_size", block_size)
    check_positive("compress_ratio", compress_ratio)
    if block_size % compress_ratio:
        raise ValueError(f"block_size ({block_size}) must be a multiple of compress_ratio "
                         f"({compress_ratio})")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype not in (torch.int32,
                                                                              torch.int64):
        raise TypeError("block_table must be an int32 (or int64) tensor")
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64,
                                                                          torch.int32):
        raise TypeError("positions must be an int64 (or int32) tensor")
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [T], got shape {tuple(positions.shape)}")
    if block_table.dim() == 1:
        block_table = block_table.unsqueeze(0)
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [R, M] or [M], got shape {tuple(block_table.shape)}")
    rows, width = block_table.shape
    if req_indices is None:
        if rows != 1:
            raise ValueError(f"req_indices is required when block_table has {rows} rows")
        req_indices = torch.zeros_like(positions, dtype=torch.int64)
    else:
        if not isinstance(req_indices, torch.Tensor) or req_indices.dtype not in (torch.int64,
                                                                                  torch.int32):
            raise TypeError("req_indices must be an int64 (or int32) tensor")
        if req_indices.shape != positions.shape:
            raise ValueError(f"req_indices must have the shape of positions "
                             f"{tuple(positions.shape)}, got {tuple(req_indices.shape)}")
    positions = positions.to(torch.int64)
    req_indices = req_indices.to(torch.int64)
    if positions.numel():
        if int(positions.min()) < 0:
            raise IndexError("positions must be >= 0")
        if int(positions.max()) >= width * block_size:
            raise IndexError(f"positions must be < block_table width x block_size = "
                             f"{width * block_size}, got {int(positions.max())}")
        if int(req_indices.min()) < 0 or int(req_indices.max()) >= rows:
            raise IndexError(f"req_indices must be in [0, {rows})")
    blocks = block_table.to(torch.int64)[req_indices, positions // block_size]
    if compress_ratio == 1:
        slots = blocks * block_size + positions % block_size
        return torch.where(blocks < 0, torch.full_like(slots, -1), slots)
    rows = block_size // compress_ratio
    cpos = positions // compress_ratio  # cpos // rows == pos // block_size: the same block
    slots = blocks * rows + cpos % rows
    closes = (positions + 1) % compress_ratio == 0
    return torch.where((blocks < 0) | ~closes, torch.full_like(slots, -1), slots)

