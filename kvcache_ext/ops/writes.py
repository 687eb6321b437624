"""The write ops: thin Python wrappers over torch.ops.kvcache_ext (CPU and CUDA kernels; fakes in
fake.py).

Writes mutate the view in place. T = slot_mapping.numel(); inputs may hold more rows (padded
for CUDA graphs); slot < 0 is padding. On CPU every argument, slot values included, is checked
before the first byte is written. On CUDA the write kernels never synchronise: a slot outside
the view is skipped, never written.

Two tokens of one call with one slot are a caller error: CPU writes raise ValueError before
writing; CUDA writes cannot check without synchronising, so `check_slot_mapping` is offered for
debug runs. Per-tensor fp8 scales must be finite and > 0: a scale given as a Python float or a
CPU tensor is checked (CPU and CUDA); one already on the GPU is the caller's to keep sane.
"""
from __future__ import annotations

import torch

from .args import Scale, as_scale
from .library import ops as _ops


def reshape_and_cache(key: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache_dtype: str = "auto", scale: Scale = None) -> None:
    """Plain [T, H, D] rows into view [B, H, N, C]; "auto" copies (C = D x itemsize), "fp8"
    encodes x / scale (C = D; scale a one-element fp32 tensor or a Python float)."""
    _ops.reshape_and_cache(key, view, slot_mapping, kv_cache_dtype, as_scale(scale))


def reshape_and_cache_kv(key: torch.Tensor, value: torch.Tensor, k_view: torch.Tensor,
                         v_view: torch.Tensor, slot_mapping: torch.Tensor,
                         kv_cache_dtype: str = "auto", k_scale: Scale = None,
                         v_scale: Scale = None) -> None:
    """One layer's K and V rows by one launch (vLLM's reshape_and_cache_flash): key, value
    [T, H, D] into k_view, v_view [B, H, N, C]; "auto" copies, "fp8" encodes x / scale with a
    per-tensor scale (one value) or a per-head one ([H], on the view's device)."""
    _ops.reshape_and_cache_kv(key, value, k_view, v_view, slot_mapping, kv_cache_dtype,
                              as_scale(k_scale), as_scale(v_scale))


def reshape_and_cache_kv_split(key: torch.Tensor, value: torch.Tensor, view: torch.Tensor,
                               slot_mapping: torch.Tensor, k_channel_major: bool = True) -> None:
    """K and V of each token into one split page per (block, head) of a spec with split=(D_k x
    es, D_v x es): K's elements first -- channel-major (element c of token n at (c x block_size
    + n) x es, vLLM-CPU's attention page, CacheSpec(channel_major=es)) or as rows -- then V's
    rows. key [T, H, D_k], value [T, H, D_v], one dtype, copied as they are; view [B, H, N,
    (D_k + D_v) x es] with contiguous pages. One launch."""
    _ops.reshape_and_cache_kv_split(key, value, view, slot_mapping, k_channel_major)


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, view: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                         scale: Scale = None, tile_scale: str | None = None) -> None:
    """kv_c [T, 512] + k_pe [T, 64] -> 656-byte fp8_ds_mla rows, 576-byte per-tensor "fp8" rows
    (DeepSeek-V3/R1: e4m3 of x / scale for all 576 values), or 576-value "auto" rows.

    tile_scale (fp8_ds_mla only): "pow2" (the default when None; vLLM since PR #49435) stores
    each tile's scale as 2^ceil(log2(max(amax / 448, 1e-4))); "fp32" stores max(amax / 448,
    FLT_MIN), what engines before that change write."""
    _ops.concat_and_cache_mla(kv_c, k_pe, view, slot_mapping, kv_cache_dtype, as_scale(scale),
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
