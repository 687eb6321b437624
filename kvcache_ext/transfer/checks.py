"""The checks of a transfer plan's per-request arguments (block pairs, block tables, token
counts): each error names the argument and what was expected, before anything is planned."""
from __future__ import annotations

import torch


def check_counts(**counts: int) -> None:
    for arg, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{arg} must be an int >= 0, got {v!r}")


def check_pairs(block_pairs: torch.Tensor, arg: str, src_blocks: int,
                dst_blocks: int) -> torch.Tensor:
    if not isinstance(block_pairs, torch.Tensor) or block_pairs.dtype not in (torch.int64,
                                                                              torch.int32):
        raise TypeError(f"{arg} must be an int64 (or int32) tensor [M, 2]")
    if block_pairs.dim() != 2 or block_pairs.shape[1] != 2:
        raise ValueError(f"{arg} must be [M, 2] (src, dst), got shape "
                         f"{tuple(block_pairs.shape)}")
    pairs = block_pairs.to("cpu", torch.int64)
    for col, side, n in ((0, "src", src_blocks), (1, "dst", dst_blocks)):
        v = pairs[:, col]
        bad = (v < 0) | (v >= n)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise IndexError(f"{arg}[{i}, {col}] = {int(v[i])}: {side} block ids must be in "
                             f"[0, num_blocks = {n})")
    dst = pairs[:, 1]
    values, counts = torch.unique(dst, return_counts=True)
    if bool((counts > 1).any()):
        b = int(values[counts > 1][0])
        rows = torch.nonzero(dst == b).squeeze(1)[:2].tolist()
        raise ValueError(f"{arg} rows {rows[0]} and {rows[1]} both copy into block {b}")
    return pairs


def table_form(table: torch.Tensor, arg: str, start: int, num_tokens: int,
               block_size: int) -> torch.Tensor:
    """The block table as a contiguous int64 [M] CPU tensor, long enough for the tokens."""
    if not isinstance(table, torch.Tensor) or table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{arg} must be an int32 (or int64) tensor [M]")
    if table.dim() != 1:
        raise ValueError(f"{arg} must be 1-D [M] (one request), got shape {tuple(table.shape)}")
    last = (start + num_tokens - 1) // block_size
    if last >= table.numel():
        raise IndexError(f"{arg} has {table.numel()} entries, but tokens up to "
                         f"{start + num_tokens - 1} (block size {block_size}) need {last + 1}")
    return table.to("cpu", torch.int64).contiguous()


def check_table(table: torch.Tensor, arg: str, start: int, num_tokens: int, block_size: int,
                num_blocks: int) -> torch.Tensor:
    """The block table as int64 [M] on the CPU; the blocks the tokens use must be in range."""
    t = table_form(table, arg, start, num_tokens, block_size)
    last = (start + num_tokens - 1) // block_size
    used = t[start // block_size:last + 1]
    bad = (used < 0) | (used >= num_blocks)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0]) + start // block_size
        raise IndexError(f"{arg}[{i}] = {int(t[i])} is outside [0, num_blocks = {num_blocks})")
    return t
