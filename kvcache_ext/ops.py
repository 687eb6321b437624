"""Thin Python wrappers over torch.ops.kvcache_ext (CPU and CUDA kernels; fake impls in fake.py).

Writes mutate the view in place. T = slot_mapping.numel(); inputs may hold more rows (padded
for CUDA graphs); slot < 0 is padding. On CPU every argument, slot values included, is checked
before the first byte is written. On CUDA the write kernels never synchronise: a slot outside
the view is skipped, never written.

Two tokens of one call with one slot are a caller error: CPU writes raise ValueError before
writing; CUDA writes cannot check without synchronising, so `check_slot_mapping` is offered for
debug runs. Per-tensor fp8 scales must be finite and > 0: a scale given as a Python float or a
CPU tensor is checked (CPU and CUDA); one already on the GPU is the caller's to keep sane.

Gathers allocate their outputs unless `out=` is given; into `out=`, only the rows of real
tokens are written (rows past cu_seq_lens[-1] keep their contents). With `validate` (default:
on unless the current stream is capturing a CUDA graph) the block table, lengths and slots are
checked against the view first (CPU and CUDA; on CUDA it costs one host synchronisation), and
cu_seq_lens before any output is allocated; without it, the kernels still never read outside
the view and return zero rows for tokens without a valid slot.
"""
from __future__ import annotations

import torch

from ._ext import ops as _ops
from .reference import indexer_dequant
from .transfer import CopyStats, block_spans, copy_blocks  # noqa: F401  (public surface)

MLA_DIM = 576
INDEXER_DIM = 128
MLA_ROW_BYTES = {"fp8_ds_mla": 656, "fp8": MLA_DIM}

Scale = torch.Tensor | float | None


def _scale(scale: Scale) -> torch.Tensor | None:
    """A Python float becomes a one-element CPU tensor (checked and passed by value)."""
    if scale is None or isinstance(scale, torch.Tensor):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float32 tensor or a Python float, got {type(scale).__name__}")
    return torch.tensor([float(scale)], dtype=torch.float32)


def reshape_and_cache(key: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache_dtype: str = "auto", scale: Scale = None) -> None:
    """Plain [T, H, D] rows into view [B, H, N, C]; "auto" copies (C = D x itemsize), "fp8"
    encodes x / scale (C = D; scale a one-element fp32 tensor or a Python float)."""
    _ops.reshape_and_cache(key, view, slot_mapping, kv_cache_dtype, _scale(scale))


def reshape_and_cache_kv(key: torch.Tensor, value: torch.Tensor, k_view: torch.Tensor,
                         v_view: torch.Tensor, slot_mapping: torch.Tensor,
                         kv_cache_dtype: str = "auto", k_scale: Scale = None,
                         v_scale: Scale = None) -> None:
    """One layer's K and V rows by one launch (vLLM's reshape_and_cache_flash): key, value
    [T, H, D] into k_view, v_view [B, H, N, C]; "auto" copies, "fp8" encodes x / scale with a
    per-tensor scale (one value) or a per-head one ([H], on the view's device)."""
    _ops.reshape_and_cache_kv(key, value, k_view, v_view, slot_mapping, kv_cache_dtype,
                              _scale(k_scale), _scale(v_scale))


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, view: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                         scale: Scale = None, tile_scale: str | None = None) -> None:
    """kv_c [T, 512] + k_pe [T, 64] -> 656-byte fp8_ds_mla rows, 576-byte per-tensor "fp8" rows
    (DeepSeek-V3/R1: e4m3 of x / scale for all 576 values), or 576-value "auto" rows.

    tile_scale (fp8_ds_mla only): "pow2" (the default when None; vLLM since PR #49435) stores
    each tile's scale as 2^ceil(log2(max(amax / 448, 1e-4))); "fp32" stores max(amax / 448,
    FLT_MIN), what engines before that change write."""
    _ops.concat_and_cache_mla(kv_c, k_pe, view, slot_mapping, kv_cache_dtype, _scale(scale),
                              tile_scale)


def indexer_k_quant_and_cache(k: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                              scale_fmt: str | None = None, placement: str = "row") -> None:
    """k [T, 128] -> 128 fp8 codes + fp32 scale per token, "row" or "split" placement."""
    _ops.indexer_k_quant_and_cache(k, view, slot_mapping, scale_fmt, placement)


def dsa_write(kv_c: torch.Tensor, k_pe: torch.Tensor, mla_view: torch.Tensor, k_idx: torch.Tensor,
              indexer_view: torch.Tensor, slot_mapping: torch.Tensor,
              kv_cache_dtype: str = "fp8_ds_mla", scale_fmt: str | None = None,
              placement: str = "row", tile_scale: str | None = None) -> None:
    """One layer's MLA row and indexer row for the same slots, in one kernel launch
    (tile_scale as concat_and_cache_mla's)."""
    _ops.dsa_write(kv_c, k_pe, mla_view, k_idx, indexer_view, slot_mapping, kv_cache_dtype,
                   scale_fmt, placement, tile_scale)


def _validate_default(validate: bool | None, view: torch.Tensor) -> bool:
    if validate is not None:
        return validate
    return not (view.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_out_kind(out: torch.Tensor | None, raw: bool, dtype: torch.dtype | None) -> None:
    """With out=, the out tensor decides what a gather writes: raw= and dtype= must agree."""
    if out is None:
        return
    if raw and out.dtype != torch.uint8:
        raise TypeError(f"raw=True writes uint8 rows, got out of dtype {out.dtype}")
    if dtype is not None and out.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {out.dtype}")


def _flat_rows(t: torch.Tensor, arg: str, trailing: int) -> torch.Tensor:
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


def _num_tokens(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                num_tokens: int | None) -> int:
    """Rows of a gather's output, checked before anything is allocated for them."""
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


def _mla_out(view: torch.Tensor, rows_shape: tuple[int, ...], kv_cache_dtype: str, raw: bool,
             dtype: torch.dtype | None) -> torch.Tensor:
    if kv_cache_dtype in MLA_ROW_BYTES:
        if raw:
            return torch.empty(*rows_shape, MLA_ROW_BYTES[kv_cache_dtype], dtype=torch.uint8,
                               device=view.device)
        return torch.empty(*rows_shape, MLA_DIM, dtype=dtype or torch.bfloat16, device=view.device)
    if dtype is None:
        dtype = torch.float32 if view.shape[-1] == 4 * MLA_DIM else torch.bfloat16
    return torch.empty(*rows_shape, MLA_DIM, dtype=dtype, device=view.device)


def gather_mla(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
               kv_cache_dtype: str = "fp8_ds_mla", *, seq_starts: torch.Tensor | None = None,
               raw: bool = False, dtype: torch.dtype | None = None,
               out: torch.Tensor | None = None, num_tokens: int | None = None,
               validate: bool | None = None, scale: Scale = None) -> torch.Tensor:
    """Requests' tokens through the block table -> [total_tokens, 576] (bf16 by default,
    dequantized from fp8_ds_mla, or from per-tensor "fp8" rows with scale=; float32 with
    dtype=), raw rows with raw=True, or "auto" rows in the dtype they were written in.
    seq_starts[r] skips request r's first tokens (chunked-prefill context). Into `out=`, rows
    past cu_seq_lens[-1] are left as they are."""
    _check_out_kind(out, raw and kv_cache_dtype != "auto", dtype)  # "auto" rows are their values
    if out is None:
        rows = _num_tokens(view, block_table, cu_seq_lens, num_tokens)
        out = _mla_out(view, (rows,), kv_cache_dtype, raw, dtype)
    _ops.gather_mla(view, block_table, cu_seq_lens, seq_starts, kv_cache_dtype, out,
                    _validate_default(validate, view), _scale(scale))
    return out


def gather_mla_slots(view: torch.Tensor, slots: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                     *, raw: bool = False, dtype: torch.dtype | None = None,
                     out: torch.Tensor | None = None, validate: bool | None = None,
                     scale: Scale = None) -> torch.Tensor:
    """Rows at explicit int64 slots [K] or [Q, K] (sparse attention); slot -1 gives zeros."""
    _check_out_kind(out, raw and kv_cache_dtype != "auto", dtype)
    if out is None:
        out = _mla_out(view, tuple(slots.shape), kv_cache_dtype, raw, dtype)
    _ops.gather_mla_slots(view, slots.reshape(-1), kv_cache_dtype, _flat_rows(out, "out", 1),
                          _validate_default(validate, view), _scale(scale))
    return out


def _kv_out(view: torch.Tensor, rows: tuple[int, ...], dtype: torch.dtype | None,
            scale: torch.Tensor | None) -> torch.Tensor:
    """[*rows, H, D] for view rows of C bytes: D = C (e4m3 codes, with a scale) or C / itemsize."""
    dtype = dtype or torch.bfloat16
    c = view.shape[-1]
    itemsize = 1 if scale is not None else torch.empty(0, dtype=dtype).element_size()
    if c % itemsize:
        raise ValueError(f"view rows of {c} bytes do not hold whole {dtype} values")
    return torch.empty(*rows, view.shape[1], c // itemsize, dtype=dtype, device=view.device)


def gather_kv(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor, *,
              seq_starts: torch.Tensor | None = None, dtype: torch.dtype | None = None,
              scale: Scale = None, out: torch.Tensor | None = None,
              num_tokens: int | None = None, validate: bool | None = None) -> torch.Tensor:
    """Requests' K (or V) rows through the block table -> [total_tokens, H, D] of `dtype`
    (default: out's dtype, else bfloat16), vLLM's cp_gather_cache. Without `scale` the rows are
    copied (C = D x itemsize); with it they are e4m3 codes (C = D) decoded as code x scale (per
    tensor, or per head [H]). Into `out=`, rows past cu_seq_lens[-1] are left as they are."""
    scale = _scale(scale)
    _check_out_kind(out, False, dtype)
    if out is None:
        out = _kv_out(view, (_num_tokens(view, block_table, cu_seq_lens, num_tokens),), dtype, scale)
    _ops.gather_kv(view, block_table, cu_seq_lens, seq_starts, out,
                   _validate_default(validate, view), scale)
    return out


def gather_kv_slots(view: torch.Tensor, slots: torch.Tensor, *, dtype: torch.dtype | None = None,
                    scale: Scale = None, out: torch.Tensor | None = None,
                    validate: bool | None = None) -> torch.Tensor:
    """K (or V) rows at explicit int64 slots [K] or [Q, K] -> [*slots.shape, H, D] (copied, or
    decoded from e4m3 codes with `scale`, as gather_kv); slot -1 gives zeros."""
    scale = _scale(scale)
    _check_out_kind(out, False, dtype)
    if out is None:
        out = _kv_out(view, tuple(slots.shape), dtype, scale)
    _ops.gather_kv_slots(view, slots.reshape(-1), _flat_rows(out, "out", 2),
                         _validate_default(validate, view), scale)
    return out


def _indexer_outputs(view: torch.Tensor, shape: tuple[int, ...],
                     out: tuple[torch.Tensor, torch.Tensor] | None):
    if out is not None:
        return out
    return (torch.empty(*shape, INDEXER_DIM, dtype=torch.uint8, device=view.device),
            torch.empty(*shape, dtype=torch.float32, device=view.device))


def _maybe_dequant(codes: torch.Tensor, scales: torch.Tensor, dequant: torch.dtype | None):
    if dequant is None:
        return codes, scales
    return indexer_dequant(codes, scales, dequant)


def gather_indexer(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                   placement: str = "row", *, seq_starts: torch.Tensor | None = None,
                   dequant: torch.dtype | None = None,
                   out: tuple[torch.Tensor, torch.Tensor] | None = None,
                   num_tokens: int | None = None, validate: bool | None = None):
    """-> (codes uint8 [T, 128], scales fp32 [T]); dequant=torch.float32/bfloat16 returns the
    decoded [T, 128] values instead."""
    if out is None:
        out = _indexer_outputs(view, (_num_tokens(view, block_table, cu_seq_lens, num_tokens),), None)
    codes, scales = out
    _ops.gather_indexer(view, block_table, cu_seq_lens, seq_starts, placement, codes, scales,
                        _validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)


def gather_indexer_slots(view: torch.Tensor, slots: torch.Tensor, placement: str = "row", *,
                         dequant: torch.dtype | None = None,
                         out: tuple[torch.Tensor, torch.Tensor] | None = None,
                         validate: bool | None = None):
    """Indexer rows at explicit int64 slots [K] or [Q, K]; slot -1 gives zeros."""
    codes, scales = _indexer_outputs(view, tuple(slots.shape), out)
    _ops.gather_indexer_slots(view, slots.reshape(-1), placement, _flat_rows(codes, "codes", 1),
                              _flat_rows(scales, "scales", 0), _validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)


def check_slot_mapping(slot_mapping: torch.Tensor, view: torch.Tensor) -> None:
    """Debug check of a write's slots on any device (CUDA writes cannot check without a host
    synchronisation): every slot < num_blocks x block_size of `view`, and no two tokens share
    a slot (negative slots are padding). Raises IndexError / ValueError naming the token."""
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dtype != torch.int64:
        raise TypeError("slot_mapping must be an int64 tensor")
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D [T], got shape {tuple(slot_mapping.shape)}")
    if view.dim() != 4:
        raise ValueError(f"view must be 4-D [num_blocks, H, block_size, C], got {tuple(view.shape)}")
    num_slots = view.shape[0] * view.shape[2]
    over = torch.nonzero(slot_mapping >= num_slots)
    if over.numel():
        t = int(over[0])
        raise IndexError(f"slot_mapping[{t}] = {int(slot_mapping[t])} is outside [-inf, "
                         f"num_blocks x block_size = {num_slots})")
    real = torch.nonzero(slot_mapping >= 0).squeeze(1)
    values, order = torch.sort(slot_mapping[real], stable=True)
    same = torch.nonzero(values[1:] == values[:-1]).squeeze(1)
    if same.numel():
        i = int(same[0])
        first, second = sorted((int(real[order[i]]), int(real[order[i + 1]])))
        raise ValueError(f"slot_mapping[{first}] and slot_mapping[{second}] are both slot "
                         f"{int(values[i])}: two tokens of one call must not share a slot")
