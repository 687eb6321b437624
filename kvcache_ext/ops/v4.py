"""Thin wrappers over the DeepSeek-V4 row ops (SPEC 10; kernels in csrc/v4_*, cpu/v4.cpp,
cuda/v4_kernels.cuh), with the conventions of `kvcache_ext.ops`: writes mutate the view in
place (T = slot_mapping.numel(), slot < 0 is padding; CPU checks every slot first, CUDA skips
slots outside the view), reads allocate unless `out=` is given and validate their metadata
unless a CUDA graph is being captured.

Formats: "fp8_ds_mla_v4" (584-B rows: 448 e4m3 + 64 bf16 RoPE, 7 UE8M0 tile scales in the page
footer) <-> 512 values, and "mxfp4" (68-B indexer rows, 4 UE8M0 scales in the footer) <-> 128
values. Inputs are rounded to bf16 first. The V4 fp8 indexer is V3.2's op with
scale_fmt="ue8m0", placement="split"; plain bf16 / per-tensor fp8 512-wide rows are
`reshape_and_cache` / `gather_kv` rows; compressor states are [kv | score] rows (state_write).
"""
from __future__ import annotations

import operator

import torch

from .args import check_out_kind, flat_rows, gather_rows, validate_default
from .gathers import gather_kv
from .library import ops as _ops
from .profiles import resolve

V4_DIM = {"fp8_ds_mla_v4": 512, "v41_mxfp8": 512, "mxfp4": 128}
V4_ROW_BYTES = {"fp8_ds_mla_v4": 584, "v41_mxfp8": 528, "mxfp4": 68}
SWA_WINDOW = 128  # SPEC 10: the SWA cache keeps a request's last 128 tokens


def v4_mla_quant_and_cache(kv: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                           scale_floor: str | None = None, *, fmt: str = "fp8_ds_mla_v4",
                           subnormals: str | None = None, profile: str | None = None) -> None:
    """kv [T, 512] (448 NoPE + 64 RoPE; bf16, fp16 or fp32) -> 584-B rows at slot_mapping, or
    DeepSeek-V4.1's 528-B MXFP8 rows with fmt="v41_mxfp8". Rounding choices (ops/profiles.py):
    scale_floor "amax" (default) or "scale" (floor the tile scale at 1e-4: vLLM's CuTe DSL
    compressor, vLLM-CPU, FlashMLA's V4.1 reference); subnormals "keep" (default) or "flush"
    (vLLM-CPU's window writer); or profile="vllm-cpu-window" etc. for an engine's set."""
    r = resolve(profile, scale_floor, subnormals)
    _ops.v4_mla_quant_and_cache(kv, view, slot_mapping, r["scale_floor"], fmt, r["subnormals"])


def mxfp4_quant_and_cache(k: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k [T, 128] -> 68-B MXFP4 indexer rows at slot_mapping."""
    _ops.mxfp4_quant_and_cache(k, view, slot_mapping)


def v4_indexer_quant_and_cache(k: torch.Tensor, view: torch.Tensor,
                               slot_mapping: torch.Tensor) -> None:
    """V4's fp8 indexer row: V3.2's 132-B row with scale_fmt="ue8m0", placement="split", of k
    (bf16, fp16 or fp32) rounded to bf16 first (SPEC 10); the op checks k, overlap included,
    before it makes the rounded copy."""
    _ops.v4_indexer_quant_and_cache(k, view, slot_mapping)


def v4_dsa_write(kv: torch.Tensor, mla_view: torch.Tensor, k_idx: torch.Tensor,
                 indexer_view: torch.Tensor, slot_mapping: torch.Tensor, *, indexer: str = "mxfp4",
                 scale_floor: str | None = None, fmt: str = "fp8_ds_mla_v4",
                 subnormals: str | None = None, profile: str | None = None) -> None:
    """A compressed group's pair at one slot_mapping (for a C4 layer, kvc.slot_mapping(...,
    compress_ratio=4): only tokens closing a window write): kv [T, 512] -> 584-B main-KV rows,
    k_idx [T, 128] -> indexer rows, "mxfp4" (68 B, both rows in one launch) or "fp8" (V3.2's
    132-B row with scale_fmt="ue8m0", placement="split", of k_idx rounded to bf16: two
    launches). fmt="v41_mxfp8": the main-KV rows are DeepSeek-V4.1's 528-B ones. scale_floor,
    subnormals, profile: the main-KV rows' rounding choices (v4_mla_quant_and_cache). Every
    argument of both rows is checked before either is written."""
    r = resolve(profile, scale_floor, subnormals)
    _ops.v4_dsa_write(kv, mla_view, k_idx, indexer_view, slot_mapping, r["scale_floor"], indexer,
                      fmt, r["subnormals"])


def _v4_out(view: torch.Tensor, rows: tuple[int, ...], fmt: str, raw: bool,
            dtype: torch.dtype | None) -> torch.Tensor:
    if fmt not in V4_DIM:
        raise ValueError(f'format must be "fp8_ds_mla_v4", "v41_mxfp8" or "mxfp4", got {fmt!r}')
    if raw:
        return torch.empty(*rows, V4_ROW_BYTES[fmt], dtype=torch.uint8, device=view.device)
    return torch.empty(*rows, V4_DIM[fmt], dtype=dtype or torch.bfloat16, device=view.device)


def gather_v4(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
              fmt: str = "fp8_ds_mla_v4", *, seq_starts: torch.Tensor | None = None,
              raw: bool = False, dtype: torch.dtype | None = None,
              out: torch.Tensor | None = None, num_tokens: int | None = None,
              validate: bool | None = None) -> torch.Tensor:
    """Requests' rows through the block table (rows counted in the view's rows per block) ->
    [total, 512 | 128] bf16 (float32 with dtype=), or raw rows (data then footer) with raw=True."""
    check_out_kind(out, raw, dtype)
    if out is None:
        rows = gather_rows("gather_v4", view, block_table, cu_seq_lens, num_tokens)
        out = _v4_out(view, (rows,), fmt, raw, dtype)
    _ops.gather_v4(view, block_table, cu_seq_lens, seq_starts, fmt, out,
                   validate_default(validate, view))
    return out


def gather_v4_slots(view: torch.Tensor, slots: torch.Tensor, fmt: str = "fp8_ds_mla_v4", *,
                    raw: bool = False, dtype: torch.dtype | None = None,
                    out: torch.Tensor | None = None, validate: bool | None = None) -> torch.Tensor:
    """Rows at explicit int64 slots [K] or [Q, K] (a sparse top-k); slot -1 gives zeros."""
    check_out_kind(out, raw, dtype)
    if out is None:
        out = _v4_out(view, tuple(slots.shape), fmt, raw, dtype)
    _ops.gather_v4_slots(view, slots.reshape(-1), fmt, flat_rows(out, "out", 1),
                         validate_default(validate, view))
    return out


def _is_int(value) -> bool:
    """A Python or numpy integer (not a bool, not a float, not a tensor)."""
    if isinstance(value, (bool, torch.Tensor)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check_window_args(seq_lens: torch.Tensor, ratio: int, window: int) -> None:
    for arg, value, least in (("ratio", ratio, 1), ("window", window, 0)):
        if not _is_int(value) or value < least:
            raise ValueError(f"{arg} must be an int >= {least}, got {value!r}")
    if (not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype.is_floating_point
            or seq_lens.dtype.is_complex or seq_lens.dtype == torch.bool):
        raise TypeError("seq_lens must be a tensor of integers, got "
                        f"{getattr(seq_lens, 'dtype', type(seq_lens).__name__)}")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be 1-D [num_requests], got shape {tuple(seq_lens.shape)}")


def window_rows(seq_lens: torch.Tensor, ratio: int, window: int = SWA_WINDOW) -> torch.Tensor:
    """int32 [R + 1] prefix sums of each request's rows in gather_compressed_and_swa:
    seq_lens // ratio compressed rows + min(seq_lens, window) SWA rows. Computed on
    seq_lens' device without a host synchronisation (CUDA-graph safe)."""
    _check_window_args(seq_lens, ratio, window)
    lens = seq_lens.to(torch.int64)
    rows = lens // ratio + lens.clamp(max=window)
    return torch.cat([rows.new_zeros(1), rows.cumsum(0)]).to(torch.int32)


def gather_compressed_and_swa(c_view: torch.Tensor, c_block_table: torch.Tensor, ratio: int,
                              swa_view: torch.Tensor, swa_block_table: torch.Tensor,
                              seq_lens: torch.Tensor, *, window: int = SWA_WINDOW,
                              dtype: torch.dtype | None = None, raw: bool = False,
                              out: torch.Tensor | None = None, cu_out: torch.Tensor | None = None,
                              validate: bool | None = None,
                              fmt: str = "fp8_ds_mla_v4") -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's dequantize_and_gather_k_cache: per request, its L // ratio compressed rows (row c
    holds tokens c * ratio .. (c + 1) * ratio - 1) then its last min(L, window) SWA rows, requests
    concatenated. Returns (out [cu_out[-1], 512], cu_out int32 [R + 1]); request r's rows are
    out[cu_out[r]:cu_out[r + 1]]. Into `out=` (with cu_out from window_rows, nothing waits on the
    GPU), rows past cu_out[-1] keep their contents."""
    _check_window_args(seq_lens, ratio, window)
    check_out_kind(out, raw, dtype)
    if cu_out is None:
        cu_out = window_rows(seq_lens, ratio, window)
    if out is None:
        out = _v4_out(c_view, (int(cu_out[-1]),), fmt, raw, dtype)
    _ops.gather_v4_window(c_view, c_block_table, swa_view, swa_block_table, seq_lens.to(torch.int32),
                          cu_out, ratio, window, out, validate_default(validate, c_view), fmt)
    return out, cu_out


def state_write(kv: torch.Tensor, score: torch.Tensor, view: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
    """Compressor-state rows [kv | score] (kv [T, W], score [T, W2], both float32 or both
    bfloat16) copied as they are to slot_mapping: one launch."""
    _ops.state_write(kv, score, view, slot_mapping)


def state_read(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
               width: int, *, dtype: torch.dtype = torch.float32,
               seq_starts: torch.Tensor | None = None, num_tokens: int | None = None,
               validate: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Compressor-state rows through the block table -> (kv [T, width], score [T, rest])."""
    if isinstance(view, torch.Tensor) and view.dim() == 4:
        values = view.shape[-1] // torch.empty(0, dtype=dtype).element_size()
        if not _is_int(width) or not 0 < width < values:
            raise ValueError(f"width must be an int in [1, {values - 1}] (rows of {values} {dtype} "
                             f"values: kv then score), got {width!r}")
    rows = gather_kv(view, block_table, cu_seq_lens, seq_starts=seq_starts, dtype=dtype,
                     num_tokens=num_tokens, validate=validate)[:, 0]
    return rows[:, :width], rows[:, width:]
