"""What the op wrappers share: scales given as Python floats, the validate default, out= and the
rows a gather allocates."""
from __future__ import annotations

import torch

from . import devices

Scale = torch.Tensor | float | None


def as_scale(scale: Scale) -> torch.Tensor | None:
    """A Python float becomes a one-element CPU tensor (checked and passed by value)."""
    if scale is None or isinstance(scale, torch.Tensor):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float32 tensor or a Python float, got {type(scale).__name__}")
    return torch.tensor([float(scale)], dtype=torch.float32)


def validate_default(validate: bool | None, view: torch.Tensor) -> bool:
    if validate is not None:
        return validate
    return not (view.is_cuda and torch.cuda.is_current_stream_capturing())


def check_out_kind(out: torch.Tensor | None, raw: bool, dtype: torch.dtype | None) -> None:
    """With out=, the out tensor decides what a gather writes: raw= and dtype= must agree."""
    if out is None:
        return
    if raw and out.dtype != torch.uint8:
        raise TypeError(f"raw=True writes uint8 rows, got out of dtype {out.dtype}")
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {out.dtype}")


def flat_rows(t: torch.Tensor, arg: str, trailing: int) -> torch.Tensor:
    """t [*rows, *last `trailing` dims] seen as [N, *last dims] without a copy (the kernels write
    through it), or a ValueError naming the argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{arg} must be a tensor, got {type(t).__name__}")
    if t.dim() < trailing:
        raise ValueError(f"{arg} must have at least {trailing} dimensions, got shape {tuple(t.shape)}")
    last = tuple(t.shape[t.dim() - trailing:])
    try:
        return t.view(-1, *last)
    except RuntimeError:
        raise ValueError(f"{arg} of shape {tuple(t.shape)} and strides {t.stride()} cannot be "
                         f"seen as {list((-1,) + last)} without a copy: its leading dimensions "
                         "must step as one") from None


def gather_rows(op: str, view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                num_tokens: int | None) -> int:
    """Rows of op's output (a gather by block table), checked before anything is allocated for
    them: cu_seq_lens is read on the host, after op's device rules."""
    devices.check(op, {"view": view, "block_table": block_table, "cu_seq_lens": cu_seq_lens})
    if num_tokens is not None:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
        return num_tokens
    if not isinstance(cu_seq_lens, torch.Tensor) or cu_seq_lens.dim() != 1 or not len(cu_seq_lens):
        raise ValueError("cu_seq_lens must be a 1-D tensor [num_requests + 1]")
    if cu_seq_lens.dtype != torch.int32:
        raise TypeError(f"cu_seq_lens must be int32, got {cu_seq_lens.dtype}")
    cu = cu_seq_lens.cpu().to(torch.int64)  # the one host synchronisation of an allocating gather
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seq_lens[0] must be 0, got {int(cu[0])}")
    steps = cu[1:] - cu[:-1]
    if steps.numel() and int(steps.min()) < 0:
        r = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"cu_seq_lens must be non-decreasing, got cu_seq_lens[{r}] = {int(cu[r])} "
                         f"> cu_seq_lens[{r + 1}] = {int(cu[r + 1])}")
    total = int(cu[-1])
    if isinstance(block_table, torch.Tensor) and block_table.dim() == 2 and view.dim() == 4:
        row = block_table.shape[1] * view.shape[2]  # tokens one block-table row addresses
        limit = block_table.shape[0] * row
        if total > limit:
            raise ValueError(f"cu_seq_lens[-1] = {total} exceeds what block_table "
                             f"{tuple(block_table.shape)} can address ({limit} tokens of block "
                             f"size {view.shape[2]})")
        if steps.numel() and int(steps.max()) > row:
            r = int(torch.argmax(steps))
            raise ValueError(f"cu_seq_lens: request {r} has {int(steps[r])} tokens, more than "
                             f"its block_table row addresses ({row} = {block_table.shape[1]} "
                             f"blocks of {view.shape[2]})")
    return total
