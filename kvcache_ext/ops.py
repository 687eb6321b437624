"""Thin Python wrappers over torch.ops.kvcache_ext (CPU and CUDA kernels; fake impls in fake.py).

Writes mutate the view in place. T = slot_mapping.numel(); inputs may hold more rows (padded
for CUDA graphs); slot < 0 is padding. On CPU every argument, slot values included, is checked
before the first byte is written. On CUDA the write kernels never synchronise: a slot outside
the view is skipped, never written.

Gathers allocate their outputs unless `out=` is given. With `validate` (default: on unless the
current stream is capturing a CUDA graph) the block table, lengths and slots are checked
against the view first (CPU and CUDA; on CUDA it costs one host synchronisation); without it,
the kernels still never read outside the view and return zero rows for tokens without a
valid slot.
"""
from __future__ import annotations

import torch

from ._ext import ops as _ops
from .reference import indexer_dequant
from .transfer import CopyStats, block_spans, copy_blocks  # noqa: F401  (public surface)

MLA_DIM = 576
INDEXER_DIM = 128


def reshape_and_cache(key: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache_dtype: str = "auto", scale: torch.Tensor | None = None) -> None:
    """Plain [T, H, D] rows into view [B, H, N, C]; "auto" copies (C = D x itemsize), "fp8"
    encodes x / scale (C = D, scale a one-element fp32 tensor)."""
    _ops.reshape_and_cache(key, view, slot_mapping, kv_cache_dtype, scale)


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, view: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla") -> None:
    """kv_c [T, 512] + k_pe [T, 64] -> 656-byte fp8_ds_mla rows, or 576-value "auto" rows."""
    _ops.concat_and_cache_mla(kv_c, k_pe, view, slot_mapping, kv_cache_dtype)


def indexer_k_quant_and_cache(k: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                              scale_fmt: str | None = None, placement: str = "row") -> None:
    """k [T, 128] -> 128 fp8 codes + fp32 scale per token, "row" or "split" placement."""
    _ops.indexer_k_quant_and_cache(k, view, slot_mapping, scale_fmt, placement)


def dsa_write(kv_c: torch.Tensor, k_pe: torch.Tensor, mla_view: torch.Tensor, k_idx: torch.Tensor,
              indexer_view: torch.Tensor, slot_mapping: torch.Tensor,
              kv_cache_dtype: str = "fp8_ds_mla", scale_fmt: str | None = None,
              placement: str = "row") -> None:
    """One layer's MLA row and indexer row for the same slots, in one kernel launch."""
    _ops.dsa_write(kv_c, k_pe, mla_view, k_idx, indexer_view, slot_mapping, kv_cache_dtype,
                   scale_fmt, placement)


def _validate_default(validate: bool | None, view: torch.Tensor) -> bool:
    if validate is not None:
        return validate
    return not (view.is_cuda and torch.cuda.is_current_stream_capturing())


def _num_tokens(cu_seq_lens: torch.Tensor, num_tokens: int | None) -> int:
    if num_tokens is not None:
        return num_tokens
    if not isinstance(cu_seq_lens, torch.Tensor) or cu_seq_lens.dim() != 1 or not len(cu_seq_lens):
        raise ValueError("cu_seq_lens must be a 1-D tensor [num_requests + 1]")
    return int(cu_seq_lens[-1])


def _mla_out(view: torch.Tensor, rows_shape: tuple[int, ...], kv_cache_dtype: str, raw: bool,
             dtype: torch.dtype | None) -> torch.Tensor:
    if kv_cache_dtype == "fp8_ds_mla":
        if raw:
            return torch.empty(*rows_shape, 656, dtype=torch.uint8, device=view.device)
        return torch.empty(*rows_shape, MLA_DIM, dtype=dtype or torch.bfloat16, device=view.device)
    if dtype is None:
        dtype = torch.float32 if view.shape[-1] == 4 * MLA_DIM else torch.bfloat16
    return torch.empty(*rows_shape, MLA_DIM, dtype=dtype, device=view.device)


def gather_mla(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
               kv_cache_dtype: str = "fp8_ds_mla", *, seq_starts: torch.Tensor | None = None,
               raw: bool = False, dtype: torch.dtype | None = None,
               out: torch.Tensor | None = None, num_tokens: int | None = None,
               validate: bool | None = None) -> torch.Tensor:
    """Requests' tokens through the block table -> [total_tokens, 576] (bf16 by default,
    dequantized from fp8_ds_mla; float32 with dtype=), raw 656-byte rows with raw=True, or
    "auto" rows in the dtype they were written in. seq_starts[r] skips request r's first
    tokens (chunked-prefill context)."""
    if out is None:
        out = _mla_out(view, (_num_tokens(cu_seq_lens, num_tokens),), kv_cache_dtype, raw, dtype)
    _ops.gather_mla(view, block_table, cu_seq_lens, seq_starts, kv_cache_dtype, out,
                    _validate_default(validate, view))
    return out


def gather_mla_slots(view: torch.Tensor, slots: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                     *, raw: bool = False, dtype: torch.dtype | None = None,
                     out: torch.Tensor | None = None, validate: bool | None = None) -> torch.Tensor:
    """Rows at explicit int64 slots [K] or [Q, K] (sparse attention); slot -1 gives zeros."""
    if out is None:
        out = _mla_out(view, tuple(slots.shape), kv_cache_dtype, raw, dtype)
    _ops.gather_mla_slots(view, slots.reshape(-1), kv_cache_dtype, out.view(-1, out.shape[-1]),
                          _validate_default(validate, view))
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
    codes, scales = _indexer_outputs(view, (_num_tokens(cu_seq_lens, num_tokens),), out)
    _ops.gather_indexer(view, block_table, cu_seq_lens, seq_starts, placement, codes, scales,
                        _validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)


def gather_indexer_slots(view: torch.Tensor, slots: torch.Tensor, placement: str = "row", *,
                         dequant: torch.dtype | None = None,
                         out: tuple[torch.Tensor, torch.Tensor] | None = None,
                         validate: bool | None = None):
    """Indexer rows at explicit int64 slots [K] or [Q, K]; slot -1 gives zeros."""
    codes, scales = _indexer_outputs(view, tuple(slots.shape), out)
    _ops.gather_indexer_slots(view, slots.reshape(-1), placement, codes.view(-1, INDEXER_DIM),
                              scales.view(-1), _validate_default(validate, view))
    return _maybe_dequant(codes, scales, dequant)
