"""The read ops (gathers by block table or by slot): thin wrappers over torch.ops.kvcache_ext.

Gathers allocate their outputs unless `out=` is given; into `out=`, only the rows of real
tokens are written (rows past cu_seq_lens[-1] keep their contents). With `validate` (default:
on unless the current stream is capturing a CUDA graph) the block table, lengths and slots are
checked against the view first (CPU and CUDA; on CUDA it costs one host synchronisation), and
cu_seq_lens before any output is allocated; without it, the kernels still never read outside
the view and return zero rows for tokens without a valid slot.
"""
from __future__ import annotations

import torch

from ..reference import indexer_dequant
from .args import Scale, as_scale, check_out_kind, flat_rows, gather_rows, validate_default
from .library import ops as _ops

MLA_DIM = 576
INDEXER_DIM = 128
MLA_ROW_BYTES = {"fp8_ds_mla": 656, "fp8": MLA_DIM}


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
    check_out_kind(out, raw and kv_cache_dtype != "auto", dtype)  # "auto" rows are their values
    if out is None:
        rows = gather_rows("gather_mla", view, block_table, cu_seq_lens, num_tokens)
        out = _mla_out(view, (rows,), kv_cache_dtype, raw, dtype)
    _ops.gather_mla(view, block_table, cu_seq_lens, seq_starts, kv_cache_dtype, out,
                    validate_default(validate, view), as_scale(scale))
    return out


def gather_mla_slots(view: torch.Tensor, slots: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                     *, raw: bool = False, dtype: torch.dtype | None = None,
                     out: torch.Tensor | None = None, validate: bool | None = None,
                     scale: Scale = None) -> torch.Tensor:
    """Rows at explicit int64 slots [K] or [Q, K] (sparse attention); slot -1 gives zeros."""
    check_out_kind(out, raw and kv_cache_dtype != "auto", dtype)
    if out is None:
        out = _mla_out(view, tuple(slots.shape), kv_cache_dtype, raw, dtype)
    _ops.gather_mla_slots(view, slots.reshape(-1), kv_cache_dtype, flat_rows(out, "out", 1),
                          validate_default(validate, view), as_scale(scale))
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
    scale = as_scale(scale)
    check_out_kind(out, False, dtype)
    if out is None:
        out = _kv_out(view, (gather_rows("gather_kv", view, block_table, cu_seq_lens, num_tokens),),
                      dtype, scale)
    _ops.gather_kv(view, block_table, cu_seq_lens, seq_starts, out,
                   validate_default(validate, view), scale)
    return out


def gather_kv_slots(view: torch.Tensor, slots: torch.Tensor, *, dtype: torch.dtype | None = None,
                    scale: Scale = None, out: torch.Tensor | None = None,
                    validate: bool | None = None) -> torch.Tensor:
    """K (or V) rows at explicit int64 slots [K] or [Q, K] -> [*slots.shape, H, D] (copied, or
    decoded from e4m3 codes with `scale`, as gather_kv); slot -1 gives zeros."""
    scale = as_scale(scale)
    check_out_kind(out, False, dtype)
    if out is None:
        out = _kv_out(view, tuple(slots.shape), dtype, scale)
    _ops.gather_kv_slots(view, slots.reshape(-1), flat_rows(out, "out", 2),
                         validate_default(validate, view), scale)
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
        rows = gather_rows("gather_indexer", view, block_table, cu_seq_lens, num_tokens)
        out = _indexer_outputs(view, (rows,), None)
    codes, scales = out
    _ops.gather_indexer(view, block_table, cu_seq_lens, seq_starts, placement, codes, scales,
                        validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)


def gather_indexer_slots(view: torch.Tensor, slots: torch.Tensor, placement: str = "row", *,
                         dequant: torch.dtype | None = None,
                         out: tuple[torch.Tensor, torch.Tensor] | None = None,
                         validate: bool | None = None):
    """Indexer rows at explicit int64 slots [K] or [Q, K]; slot -1 gives zeros."""
    codes, scales = _indexer_outputs(view, tuple(slots.shape), out)
    _ops.gather_indexer_slots(view, slots.reshape(-1), placement, flat_rows(codes, "codes", 1),
                              flat_rows(scales, "scales", 0), validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)
