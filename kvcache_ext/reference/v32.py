"""Pure-PyTorch reference of every op: the ground truth the test suite compares kernels against.

Same semantics as the kernels, written for clarity, not speed. fp8 is OCP e4m3fn: x / scale in
fp32, round to nearest even, saturate finite overflow and +-inf to +-448, NaN -> 0x7F (sign
dropped). amax reductions ignore NaN. bf16 results round to nearest even, NaN -> 0x7FC0.
"""
from __future__ import annotations

import torch

__all__ = ["CANONICAL_NAN_BITS", "FLT_MIN", "FP8_MAX", "INDEXER_AMAX_FLOOR",
           "INDEXER_ROW_BYTES", "MLA_POW2_SCALE_FLOOR", "TILE_SCALES", "amax", "canonical_nan",
           "concat_and_cache_mla", "dsa_write", "e4m3_decode", "e4m3_encode", "gather_indexer",
           "gather_indexer_slots", "gather_kv", "gather_mla", "gather_mla_slots",
           "gather_slots", "indexer_dequant", "indexer_k_quant_and_cache", "indexer_rows",
           "indexer_scales", "mla_auto_rows", "mla_dequant", "mla_fp8_rows",
           "mla_fp8_tensor_dequant", "mla_fp8_tensor_rows", "mla_tile_scales", "read_indexer",
           "read_rows", "reshape_and_cache", "reshape_and_cache_kv", "reshape_and_cache_kv_split", "to_bf16", "to_fp16",
           "ue8m0_round_up", "write_indexer", "write_rows"]

FP8_MAX = 448.0
FLT_MIN = torch.finfo(torch.float32).tiny
INDEXER_AMAX_FLOOR = 1e-4
MLA_POW2_SCALE_FLOOR = 1e-4  # fp8_ds_mla "pow2" tile scales: floor of amax / 448
TILE_SCALES = ("pow2", "fp32")
INDEXER_ROW_BYTES = 132


# ---- number formats -------------------------------------------------------------------------
def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> uint8 e4m3 codes (RNE, saturating, NaN -> 0x7F)."""
    x = x.float()
    codes = x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(x.isnan(), torch.full_like(codes, 0x7F), codes)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).float()


CANONICAL_NAN_BITS = 0x7FC00000


def canonical_nan(x: torch.Tensor) -> torch.Tensor:
    """fp32 with every NaN as 0x7FC00000 (GPU arithmetic gives 0x7FFFFFFF, x86 the operand's)."""
    nan = torch.full_like(x.view(torch.int32), CANONICAL_NAN_BITS).view(torch.float32)
    return torch.where(x.isnan(), nan, x)


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 with one NaN pattern (0x7FC0) on every device."""
    out = x.to(torch.bfloat16)
    nan = torch.full_like(out.view(torch.int16), 0x7FC0)
    return torch.where(x.isnan(), nan, out.view(torch.int16)).view(torch.bfloat16)


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the last dimension, NaN counted as 0."""
    a = x.float().abs()
    return torch.where(a.isnan(), torch.zeros_like(a), a).amax(dim=-1)


def ue8m0_round_up(s: torch.Tensor) -> torch.Tensor:
    """Round positive fp32 scales up to a power of two, from the bits."""
    bits = s.contiguous().view(torch.int32)
    exp_all_ones = (bits & 0x7F800000) == 0x7F800000
    up = torch.where(((bits & 0x7FFFFF) != 0) & ~exp_all_ones,
                     (bits & -0x800000) + 0x800000, bits)
    return up.view(torch.float32)


def mla_tile_scales(kv_c: torch.Tensor, tile_scale: str = "pow2") -> torch.Tensor:
    """[T, 512] -> [T, 4] fp32 scales: "pow2" 2^ceil(log2(max(amax / 448, 1e-4))) (rounded up
    from the bits), "fp32" max(amax / 448, FLT_MIN)."""
    if tile_scale not in TILE_SCALES:
        raise ValueError(f"tile_scale must be one of {TILE_SCALES}, got {tile_scale!r}")
    tiles = kv_c.float().reshape(kv_c.shape[0], 4, 128)
    s = amax(tiles) / FP8_MAX
    if tile_scale == "fp32":
        return torch.clamp(s, min=FLT_MIN)
    return ue8m0_round_up(torch.clamp(s, min=MLA_POW2_SCALE_FLOOR))


def indexer_scales(k: torch.Tensor, scale_fmt: str | None = None) -> torch.Tensor:
    s = torch.clamp(amax(k.float()), min=INDEXER_AMAX_FLOOR) / FP8_MAX
    return ue8m0_round_up(s) if scale_fmt == "ue8m0" else s


# ---- rows -------------------------------------------------------------------------------------
def mla_fp8_rows(kv_c: torch.Tensor, k_pe: torch.Tensor, tile_scale: str = "pow2") -> torch.Tensor:
    """kv_c [T, 512], k_pe [T, 64] -> uint8 [T, 656] fp8_ds_mla rows."""
    t = kv_c.shape[0]
    scales = mla_tile_scales(kv_c, tile_scale)
    x = kv_c.float().reshape(t, 4, 128) / scales.unsqueeze(-1)
    rope = k_pe if k_pe.dtype == torch.bfloat16 else to_bf16(k_pe.float())
    return torch.cat([e4m3_encode(x).reshape(t, 512),
                      scales.contiguous().view(torch.uint8).reshape(t, 16),
                      rope.contiguous().view(torch.uint8).reshape(t, 128)], dim=1)


def mla_fp8_tensor_rows(kv_c: torch.Tensor, k_pe: torch.Tensor, scale) -> torch.Tensor:
    """Per-tensor fp8 rows (DeepSeek-V3/R1): uint8 [T, 576] = e4m3(kv_c / scale), e4m3(k_pe / scale)."""
    x = torch.cat([kv_c.float(), k_pe.float()], dim=1)
    return e4m3_encode(x / _scale_value(scale, x.device))


def _scale_value(scale, device: torch.device) -> torch.Tensor:
    if scale is None:
        raise ValueError('scale is required when kv_cache_dtype is "fp8"')
    return torch.as_tensor(scale, dtype=torch.float32).reshape(()).to(device)


def mla_auto_rows(kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """Unquantized rows: 576 values of the input dtype, as bytes."""
    return torch.cat([kv_c, k_pe], dim=1).contiguous().view(torch.uint8)


def indexer_rows(k: torch.Tensor, scale_fmt: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """k [T, 128] -> (codes uint8 [T, 128], scales fp32 [T])."""
    scales = indexer_scales(k, scale_fmt)
    return e4m3_encode(k.float() / scales.unsqueeze(-1)), scales


def mla_dequant(rows: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [T, 656] -> [T, 576]: decoded latent then the rope values."""
    t = rows.shape[0]
    codes = rows[:, :512].reshape(t, 4, 128)
    scales = rows[:, 512:528].contiguous().view(torch.float32).reshape(t, 4, 1)
    latent = (e4m3_decode(codes) * scales).reshape(t, 512)
    rope = rows[:, 528:656].contiguous().view(torch.bfloat16)
    if dtype == torch.bfloat16:
        return torch.cat([to_bf16(latent), rope], dim=1)
    return canonical_nan(torch.cat([latent, rope.float()], dim=1)).to(dtype)


def mla_fp8_tensor_dequant(rows: torch.Tensor, scale,
                           dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """uint8 [T, 576] per-tensor fp8 rows -> [T, 576] values = code x scale."""
    out = e4m3_decode(rows) * _scale_value(scale, rows.device)
    return to_bf16(out) if dtype == torch.bfloat16 else canonical_nan(out).to(dtype)


def indexer_dequant(codes: torch.Tensor, scales: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = e4m3_decode(codes) * scales.unsqueeze(-1)
    return to_bf16(out) if dtype == torch.bfloat16 else canonical_nan(out).to(dtype)


# ---- addressing through a view -------------------------------------------------------------
def _valid(view: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return (slots >= 0) & (slots < view.shape[0] * view.shape[2])


def _split(view: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bs = view.shape[2]
    return slots // bs, slots % bs


def write_rows(view: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """rows [T, H, C] (or [T, C] for H = 1) into view at slots; negative slots skipped."""
    keep = _valid(view, slots)
    blocks, pos = _split(view, slots[keep])
    rows = rows[keep.to(rows.device)]
    if rows.dim() == 2:
        rows = rows.unsqueeze(1)
    heads = torch.arange(view.shape[1], device=view.device)
    view[blocks[:, None], heads[None, :], pos[:, None]] = rows.to(view.device)


def read_rows(view: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """uint8 [T, C] rows of head 0 at slots; invalid slots read as zeros."""
    keep = _valid(view, slots)
    blocks, pos = _split(view, torch.where(keep, slots, torch.zeros_like(slots)))
    rows = view[blocks, 0, pos].clone()
    rows[~keep] = 0
    return rows


def _indexer_pages(view: torch.Tensor, placement: str) -> torch.Tensor:
    """Where each placement's offsets are taken in a one-head indexer view: `row` as
    [num_blocks, block_size, 132] rows through the view's strides (a view sliced along tokens
    keeps its rows); `split` as [num_blocks, block_size * 132] pages, defined on a contiguous
    page only."""
    nb, _, bs, c = view.shape
    if placement == "row":
        return torch.as_strided(view, (nb, bs, c), (view.stride(0), view.stride(2), 1))
    if placement == "split":
        if view.stride(2) != c:
            raise ValueError(f'view must have contiguous pages for placement="split" (token stride '
                             f'{c} bytes), got token stride {view.stride(2)}')
        return torch.as_strided(view, (nb, bs * c), (view.stride(0), 1))
    raise ValueError(f'placement must be "row" or "split", got {placement!r}')


def _indexer_at(view: torch.Tensor, blocks: torch.Tensor, pos: torch.Tensor, placement: str):
    """Index tuples (into _indexer_pages) of the 128 code bytes and 4 scale bytes of each token."""
    ar128, ar4 = torch.arange(128, device=pos.device), torch.arange(4, device=pos.device)
    b, p = blocks[:, None], pos[:, None]
    if placement == "row":
        return (b, p, ar128), (b, p, 128 + ar4)
    return (b, p * 128 + ar128), (b, view.shape[2] * 128 + 4 * p + ar4)


def write_indexer(view: torch.Tensor, slots: torch.Tensor, codes: torch.Tensor,
                  scales: torch.Tensor, placement: str) -> None:
    pages = _indexer_pages(view, placement)  # raises before anything is written
    keep = _valid(view, slots)
    blocks, pos = _split(view, slots[keep])
    code_at, scale_at = _indexer_at(view, blocks, pos, placement)
    pages[code_at] = codes[keep.to(codes.device)].to(view.device)
    pages[scale_at] = (
        scales[keep.to(scales.device)].contiguous().view(torch.uint8).reshape(-1, 4).to(view.device))


def read_indexer(view: torch.Tensor, slots: torch.Tensor,
                 placement: str) -> tuple[torch.Tensor, torch.Tensor]:
    pages = _indexer_pages(view, placement)
    keep = _valid(view, slots)
    blocks, pos = _split(view, torch.where(keep, slots, torch.zeros_like(slots)))
    code_at, scale_at = _indexer_at(view, blocks, pos, placement)
    codes = pages[code_at].clone()
    scales = pages[scale_at].contiguous().view(torch.float32).reshape(-1).clone()
    codes[~keep] = 0
    scales[~keep] = 0
    return codes, scales


# ---- ops ------------------------------------------------------------------------------------
def reshape_and_cache(key: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_cache_dtype: str = "auto", scale: torch.Tensor | None = None) -> None:
    t = slot_mapping.numel()
    key = key[:t]
    if kv_cache_dtype == "fp8":
        rows = e4m3_encode(key.float() / _scale_value(scale, key.device))
    else:
        rows = key.contiguous().view(torch.uint8)
    write_rows(view, slot_mapping, rows)


def _head_scales(scale, heads: int, device: torch.device) -> torch.Tensor:
    """A per-tensor or per-head scale as [H, 1] for broadcasting over [T, H, D]."""
    if scale is None:
        raise ValueError('scale is required when kv_cache_dtype is "fp8"')
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(-1).to(device)
    return s.expand(heads).reshape(heads, 1)


def to_fp16(x: torch.Tensor) -> torch.Tensor:
    """Round to fp16 with one NaN pattern (0x7E00) on every device."""
    out = x.to(torch.float16)
    nan = torch.full_like(out.view(torch.int16), 0x7E00)
    return torch.where(x.isnan(), nan, out.view(torch.int16)).view(torch.float16)


def reshape_and_cache_kv(key: torch.Tensor, value: torch.Tensor, k_view: torch.Tensor,
                         v_view: torch.Tensor, slot_mapping: torch.Tensor,
                         kv_cache_dtype: str = "auto", k_scale=None, v_scale=None) -> None:
    t = slot_mapping.numel()
    for x, view, scale in ((key[:t], k_view, k_scale), (value[:t], v_view, v_scale)):
        if kv_cache_dtype == "fp8":
            rows = e4m3_encode(x.float() / _head_scales(scale, x.shape[1], x.device))
        else:
            rows = x.contiguous().view(torch.uint8)
        write_rows(view, slot_mapping, rows)


def reshape_and_cache_kv_split(key: torch.Tensor, value: torch.Tensor, view: torch.Tensor,
                               slot_mapping: torch.Tensor, k_channel_major: bool = True) -> None:
    """K then V in one split page per (block, head): K element c of token n at (c x N + n) x es
    (channel-major) or at n x D_k x es, V's row at N x D_k x es + n x D_v x es."""
    t = slot_mapping.numel()
    nb, heads, n, _ = view.shape
    k = key[:t].contiguous().view(torch.uint8).reshape(t, heads, key.shape[2], -1)
    v = value[:t].contiguous().view(torch.uint8).reshape(t, heads, -1)
    dk, es = k.shape[2], k.shape[3]
    slots = slot_mapping.to(torch.int64).cpu()
    for i in range(t):
        s = int(slots[i])
        if s < 0:
            continue
        b, pos = divmod(s, n)
        for h in range(heads):
            page = view[b, h].reshape(-1)  # contiguous pages (the op checks it)
            for c in range(dk):
                at = (c * n + pos) * es if k_channel_major else (pos * dk + c) * es
                page[at:at + es] = k[i, h, c]
            at = n * dk * es + pos * v.shape[2]
            page[at:at + v.shape[2]] = v[i, h]


def gather_kv(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
              dtype: torch.dtype = torch.bfloat16, scale=None,
              seq_starts: torch.Tensor | None = None) -> torch.Tensor:
    """[total_tokens, H, D]: rows copied, or decoded from e4m3 codes with `scale`."""
    slots = gather_slots(block_table, cu_seq_lens, view.shape[2], seq_starts).to(view.device)
    keep = _valid(view, slots)
    blocks, pos = _split(view, torch.where(keep, slots, torch.zeros_like(slots)))
    rows = view[blocks, :, pos].clone()  # [T, H, C]
    rows[~keep] = 0
    if scale is None:
        return rows.view(dtype)
    vals = e4m3_decode(rows) * _head_scales(scale, view.shape[1], view.device)
    vals[~keep] = 0
    if dtype == torch.bfloat16:
        return to_bf16(vals)
    if dtype == torch.float16:
        return to_fp16(vals)
    return canonical_nan(vals).to(dtype)


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, view: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                         scale=None, tile_scale: str | None = None) -> None:
    t = slot_mapping.numel()
    if kv_cache_dtype == "fp8_ds_mla":
        rows = mla_fp8_rows(kv_c[:t], k_pe[:t], tile_scale or "pow2")
    elif kv_cache_dtype == "fp8":
        rows = mla_fp8_tensor_rows(kv_c[:t], k_pe[:t], scale)
    else:
        rows = mla_auto_rows(kv_c[:t], k_pe[:t])
    write_rows(view, slot_mapping, rows)


def indexer_k_quant_and_cache(k: torch.Tensor, view: torch.Tensor, slot_mapping: torch.Tensor,
                              scale_fmt: str | None = None, placement: str = "row") -> None:
    codes, scales = indexer_rows(k[: slot_mapping.numel()], scale_fmt)
    write_indexer(view, slot_mapping, codes, scales, placement)


def dsa_write(kv_c, k_pe, mla_view, k_idx, indexer_view, slot_mapping,
              kv_cache_dtype="fp8_ds_mla", scale_fmt=None, placement="row",
              tile_scale=None) -> None:
    _indexer_pages(indexer_view, placement)  # a refused placement raises before any write
    concat_and_cache_mla(kv_c, k_pe, mla_view, slot_mapping, kv_cache_dtype,
                         tile_scale=tile_scale)
    indexer_k_quant_and_cache(k_idx, indexer_view, slot_mapping, scale_fmt, placement)


def gather_slots(block_table: torch.Tensor, cu_seq_lens: torch.Tensor, block_size: int,
                 seq_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Slots of every requested token, requests concatenated (block-table gathers)."""
    slots = []
    cu = cu_seq_lens.tolist()
    for r in range(block_table.shape[0]):
        start = int(seq_starts[r]) if seq_starts is not None else 0
        pos = torch.arange(start, start + cu[r + 1] - cu[r], dtype=torch.int64)
        blocks = block_table[r].cpu().to(torch.int64)[pos // block_size]
        slots.append(blocks * block_size + pos % block_size)
    return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)


def gather_mla(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
               kv_cache_dtype: str = "fp8_ds_mla", seq_starts: torch.Tensor | None = None,
               raw: bool = False, dtype: torch.dtype | None = None, scale=None) -> torch.Tensor:
    slots = gather_slots(block_table, cu_seq_lens, view.shape[2], seq_starts).to(view.device)
    return gather_mla_slots(view, slots, kv_cache_dtype, raw=raw, dtype=dtype, scale=scale)


def gather_mla_slots(view: torch.Tensor, slots: torch.Tensor, kv_cache_dtype: str = "fp8_ds_mla",
                     raw: bool = False, dtype: torch.dtype | None = None,
                     scale=None) -> torch.Tensor:
    flat = slots.reshape(-1)
    rows = read_rows(view, flat)
    if kv_cache_dtype in ("fp8_ds_mla", "fp8") and not raw:
        if kv_cache_dtype == "fp8":
            out = mla_fp8_tensor_dequant(rows, scale, dtype or torch.bfloat16)
        else:
            out = mla_dequant(rows, dtype or torch.bfloat16)
        out[(flat < 0) | (flat >= view.shape[0] * view.shape[2])] = 0
    elif kv_cache_dtype in ("fp8_ds_mla", "fp8"):
        out = rows
    else:
        out = rows.view(dtype or torch.bfloat16)
    return out.reshape(*slots.shape, out.shape[-1])


def gather_indexer(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                   placement: str = "row", seq_starts: torch.Tensor | None = None):
    slots = gather_slots(block_table, cu_seq_lens, view.shape[2], seq_starts).to(view.device)
    return read_indexer(view, slots, placement)


def gather_indexer_slots(view: torch.Tensor, slots: torch.Tensor, placement: str = "row"):
    codes, scales = read_indexer(view, slots.reshape(-1), placement)
    return codes.reshape(*slots.shape, 128), scales.reshape(slots.shape)
