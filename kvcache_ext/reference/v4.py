"""Pure-PyTorch reference of DeepSeek-V4's row formats (SPEC 10): ground truth for kernels.

Rules (SPEC 10 unless said otherwise; vLLM file names as SPEC gives them):
- Inputs are bf16 (other dtypes are rounded to bf16 first); amax ignores NaN (reference.amax).
- Every power-of-two scale is 2^ceil(log2(s)) taken exactly from s's fp32 bits (`ceil_log2`),
  not exp2(ceil(log2(s))), which differs at 2^k * (1 + 2^-23).
- V4 fp8_ds_mla (vLLM cache_utils.py quantize_and_insert_k_kernel), 584 B: 7 tiles of 64 NoPE
  values, e = ceil_log2(max(amax, 1e-4) / 448), byte = clamp(e + 127, 0, 255), codes =
  e4m3(x / 2^e) with SPEC 3's encoder (fp32 division, RNE, saturate +-448, NaN -> 0x7F). A tile
  holding +-inf has e = 128: byte 255, scale = 2^128 = inf in fp32, so (division, defined
  here) its finite values encode as +-0 and its infinities as inf / inf = NaN -> 0x7F; decoding
  gives code x inf (NaN for 0 codes, as IEEE says). Data = 448 codes + 64 bf16 RoPE values bit
  for bit; footer = 7 scale bytes + one 0 byte. The format overflows at the top of bf16:
  |x| >= 248 x 2^120 has e = 120 and rounds to code 256, which decodes to 2^128 = inf.
  scale_floor="scale" (CuTe DSL compressor and vLLM-CPU's writers, byte 114 for a zero tile) is
  offered for bit-compatibility, and subnormals="flush" (vLLM-CPU's window writer: a quotient
  |x / 2^e| < 2^-6, before rounding, is written as +-0, its sign kept); see ops/profiles.py.
  bit-compatibility; "amax" (byte 105) is canonical.
- V4.1 MXFP8 record, 528 B (FlashMLA's V4.1 record; vLLM PR #56893's writer
  _quantize_and_insert_k_mxfp8_kernel): all 512 post-RoPE values (RoPE quantized too) in 16
  tiles of 32, each tile's e and byte by the 584-B row's rule (amax floor 1e-4 as vLLM's writer;
  scale_floor="scale" floors the scale instead, as FlashMLA's and SGLang's references do),
  codes e4m3(x / 2^e); data = 512 codes, footer = 16 scale bytes. NaN -> 0x7F, a tile holding
  +-inf gets byte 255 (as the 584-B row here). Pages are padded to 512 B (none for block sizes
  that are multiples of 32).
- MXFP4 indexer, 68 B: per 32 values e = clamp(ceil_log2(max(amax, 6 * 2^-126) / 6), -127,
  127), byte e + 127, v = x * 2^-e (fp32), e2m1 (RNE, saturate +-6; element 2i low nibble,
  2i+1 high). NaN -> 0x7 (+6, cvt.rn.satfinite.e2m1x2.f32), -tiny -> 0x8 (-0). A tile holding
  +-inf has e = 127 (byte 254); its finite values are multiplied by 2^-127 as the rule says,
  so they are +-0 up to |x| = 2^125 (0.25 rounds to 0) and larger bf16 values keep a code
  (defined here: the formula, no special case). |x| >= 3.5 x 2^126 decodes to 4 x 2^126 = inf.
- V4 fp8 indexer, 132 B: reference.indexer_rows(k, "ue8m0") stored with placement="split"
  (amax floor 1e-4 as V3.2's, SPEC 10).
- Split pages (CacheSpec.split=(a, b), layout.split_address): row n's first a bytes at n * a,
  its last b bytes at rows * a + n * b; the pad up to page_align is never written.
- Slots count rows (slot = block * rows + row); negative slots are skipped on writes and read
  as zero rows.
"""
from __future__ import annotations

import torch

from .pages import ceil_log2, pow2, read_split, write_split
from .v32 import (FP8_MAX, INDEXER_AMAX_FLOOR, _valid, amax, canonical_nan,
                  e4m3_decode, e4m3_encode, gather_slots, indexer_rows, read_indexer,
                  read_rows, to_bf16, write_indexer, write_rows)

V4_NOPE, V4_ROPE, V4_TILE = 448, 64, 64
V41_TILE, V41_SCALES = 32, 16                                  # split (512, 16), 528 B
V4_MLA_DATA, V4_MLA_SCALES = V4_NOPE + 2 * V4_ROPE, 8          # split (576, 8), 584 B
V4_AMAX_FLOOR = 1e-4                                           # all-zero tile -> byte 105
V4_SCALE_FLOOR = 1e-4                                          # scale_floor="scale" -> byte 114
MXFP4_BLOCK, MXFP4_MAX = 32, 6.0
MXFP4_AMAX_FLOOR = 6.0 * 2.0 ** -126                           # all-zero block -> byte 1
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)          # codes 0..7; bit 3 = sign


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.bfloat16 else to_bf16(x.float())


def _check_shape(name: str, x: torch.Tensor, width: int) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name} must be [T, {width}], got shape {tuple(x.shape)}")


def _tile_exponents(a: torch.Tensor, scale_floor: str) -> torch.Tensor:
    """NaN-free tile amaxes -> int64 exponents: ceil_log2 of max(amax, 1e-4) / 448 (canonical)
    or of max(amax / 448, 1e-4) (scale_floor="scale")."""
    if scale_floor == "amax":
        s = torch.maximum(a, torch.tensor(V4_AMAX_FLOOR, dtype=torch.float32)) / FP8_MAX
    elif scale_floor == "scale":
        s = torch.maximum(a / FP8_MAX, torch.tensor(V4_SCALE_FLOOR, dtype=torch.float32))
    else:
        raise ValueError(f'scale_floor must be "amax" or "scale", got {scale_floor!r}')
    return ceil_log2(s)


def _quotients(x: torch.Tensor, e: torch.Tensor, subnormals: str) -> torch.Tensor:
    """x [..., tiles, tile] (fp32 of bf16 values) / 2^e per tile; subnormals="flush" (vLLM-CPU's
    window writer) makes every quotient below 2^-6 in magnitude +-0 before it is rounded."""
    if subnormals not in ("keep", "flush"):
        raise ValueError(f'subnormals must be "keep" or "flush", got {subnormals!r}')
    q = x / pow2(e).unsqueeze(-1)
    if subnormals == "flush":
        q = torch.where(q.abs() < 2.0 ** -6, torch.where(torch.signbit(q), -0.0, 0.0), q)
    return q


# ---- V4 fp8_ds_mla, 584 B ---------------------------------------------------------------------
def v4_mla_exponents(kv: torch.Tensor, scale_floor: str = "amax") -> torch.Tensor:
    """[T, 512] -> int64 [T, 7] tile exponents e (byte = clamp(e + 127, 0, 255))."""
    t = kv.shape[0]
    return _tile_exponents(amax(_bf16(kv)[:, :V4_NOPE].float().reshape(t, 7, V4_TILE)), scale_floor)


def v4_mla_rows(kv: torch.Tensor, scale_floor: str = "amax",
                subnormals: str = "keep") -> tuple[torch.Tensor, torch.Tensor]:
    """kv [T, 512] (448 NoPE + 64 RoPE) -> (data uint8 [T, 576], scales uint8 [T, 8])."""
    _check_shape("kv", kv, V4_NOPE + V4_ROPE)
    kv = _bf16(kv)
    t = kv.shape[0]
    e = v4_mla_exponents(kv, scale_floor)
    x = _quotients(kv[:, :V4_NOPE].float().reshape(t, 7, V4_TILE), e, subnormals)
    data = torch.cat([e4m3_encode(x).reshape(t, V4_NOPE),
                      kv[:, V4_NOPE:].contiguous().view(torch.uint8).reshape(t, 2 * V4_ROPE)], 1)
    scales = torch.zeros(t, V4_MLA_SCALES, dtype=torch.uint8, device=kv.device)
    scales[:, :7] = (e + 127).clamp(0, 255).to(torch.uint8)
    return data, scales


def v4_mla_dequant(data: torch.Tensor, scales: torch.Tensor,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(data [T, 576], scales [T, 8]) -> [T, 512]: code x 2^(byte - 127) (448), then RoPE (64)."""
    t = data.shape[0]
    scale = pow2(scales[:, :7].to(torch.int64) - 127).unsqueeze(-1)
    nope = (e4m3_decode(data[:, :V4_NOPE].reshape(t, 7, V4_TILE)) * scale).reshape(t, V4_NOPE)
    rope = data[:, V4_NOPE:V4_MLA_DATA].contiguous().view(torch.bfloat16)
    if dtype == torch.bfloat16:
        return torch.cat([to_bf16(nope), rope], dim=1)
    return canonical_nan(torch.cat([nope, rope.float()], dim=1)).to(dtype)


# ---- V4.1 MXFP8 record, 528 B -----------------------------------------------------------------
def v41_rows(kv: torch.Tensor, scale_floor: str = "amax",
             subnormals: str = "keep") -> tuple[torch.Tensor, torch.Tensor]:
    """kv [T, 512] (448 NoPE + 64 RoPE, all quantized) -> (data uint8 [T, 512], scales uint8
    [T, 16]): tile k = values 32k .. 32k + 31."""
    _check_shape("kv", kv, V4_NOPE + V4_ROPE)
    x = _bf16(kv).float().reshape(kv.shape[0], V41_SCALES, V41_TILE)
    e = _tile_exponents(amax(x), scale_floor)
    data = e4m3_encode(_quotients(x, e, subnormals)).reshape(kv.shape[0], 512)
    return data, (e + 127).clamp(0, 255).to(torch.uint8)


def v41_dequant(data: torch.Tensor, scales: torch.Tensor,
                dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(data [T, 512], scales [T, 16]) -> [T, 512]: code x 2^(byte - 127)."""
    t = data.shape[0]
    scale = pow2(scales.to(torch.int64) - 127).unsqueeze(-1)
    vals = (e4m3_decode(data.reshape(t, V41_SCALES, V41_TILE)) * scale).reshape(t, 512)
    return to_bf16(vals) if dtype == torch.bfloat16 else canonical_nan(vals).to(dtype)


def v41_write(view: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor,
              scale_floor: str = "amax", subnormals: str = "keep") -> None:
    """Quantize kv[:T] (T = slots.numel()) into a 528-B split view."""
    data, scales = v41_rows(kv[: slots.numel()], scale_floor, subnormals)
    write_split(view, slots, data, scales)


def v41_read(view: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
             raw: bool = False):
    """Rows at slots: raw=True -> (data [T, 512], scales [T, 16]); else [T, 512] values (slot -1
    -> a zero row)."""
    data, scales = read_split(view, slots, (512, V41_SCALES))
    if raw:
        return data, scales
    out = v41_dequant(data, scales, dtype)
    out[~_valid(view, slots.reshape(-1).to(view.device))] = 0
    return out


# ---- MXFP4 indexer, 68 B ----------------------------------------------------------------------
def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> uint8 e2m1 codes 0..15: round to nearest even (ties go to the even code), saturate
    to +-6, sign bit kept (-0 and small negatives -> 0x8), NaN -> 0x7."""
    a = v.float().abs()
    mag = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
           + (a >= 3.5) + (a > 5.0)).to(torch.uint8)
    code = mag | (torch.signbit(v.float()).to(torch.uint8) << 3)
    return torch.where(v.isnan(), torch.full_like(code, 0x7), code)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    sign = torch.where((codes & 8) != 0, -1.0, 1.0).to(codes.device)
    return grid[(codes & 7).long()] * sign


def mxfp4_exponents(k: torch.Tensor) -> torch.Tensor:
    """[T, 128] -> int64 [T, 4] block exponents e in [-127, 127] (byte e + 127)."""
    a = amax(_bf16(k).float().reshape(k.shape[0], 4, MXFP4_BLOCK))
    s = torch.maximum(a, torch.tensor(MXFP4_AMAX_FLOOR, dtype=torch.float32)) / MXFP4_MAX
    return ceil_log2(s).clamp(-127, 127)


def mxfp4_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k [T, 128] -> (packed uint8 [T, 64], scales uint8 [T, 4])."""
    _check_shape("k", k, 128)
    k = _bf16(k)
    t = k.shape[0]
    e = mxfp4_exponents(k)
    v = k.float().reshape(t, 4, MXFP4_BLOCK) * pow2(-e).unsqueeze(-1)
    codes = e2m1_encode(v).reshape(t, 64, 2)
    return codes[..., 0] | (codes[..., 1] << 4), (e + 127).to(torch.uint8)


def mxfp4_dequant(packed: torch.Tensor, scales: torch.Tensor,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(packed [T, 64], scales [T, 4]) -> [T, 128] = e2m1 value x 2^(byte - 127)."""
    t = packed.shape[0]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(t, 4, MXFP4_BLOCK)
    out = (e2m1_decode(codes) * pow2(scales.to(torch.int64) - 127).unsqueeze(-1)).reshape(t, 128)
    return to_bf16(out) if dtype == torch.bfloat16 else canonical_nan(out).to(dtype)


# ---- writes and reads of each format ---------------------------------------------------------
def v4_mla_write(view: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor,
                 scale_floor: str = "amax", subnormals: str = "keep") -> None:
    """Quantize kv[:T] (T = slots.numel()) and write it into a 584-B split view."""
    data, scales = v4_mla_rows(kv[: slots.numel()], scale_floor, subnormals)
    write_split(view, slots, data, scales)


def v4_mla_read(view: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
                raw: bool = False):
    """Rows at slots: raw=True -> (data [T, 576], scales [T, 8]); else dequantized [T, 512]
    (slot -1 -> a zero row)."""
    data, scales = read_split(view, slots, (V4_MLA_DATA, V4_MLA_SCALES))
    if raw:
        return data, scales
    out = v4_mla_dequant(data, scales, dtype)
    out[~_valid(view, slots.reshape(-1).to(view.device))] = 0
    return out


def v4_mla_gather(view: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor,
                  seq_starts: torch.Tensor | None = None,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[cu_seq_lens[-1], 512]: request r's rows seq_starts[r] .. + len, requests concatenated
    (rows counted in the view's rows per block; a block-table entry < 0 reads zero rows)."""
    slots = gather_slots(block_table, cu_seq_lens, view.shape[2], seq_starts).to(view.device)
    return v4_mla_read(view, slots, dtype)


def mxfp4_write(view: torch.Tensor, slots: torch.Tensor, k: torch.Tensor) -> None:
    packed, scales = mxfp4_rows(k[: slots.numel()])
    write_split(view, slots, packed, scales)


def mxfp4_read(view: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               raw: bool = False):
    """raw=True -> (packed [T, 64], scales [T, 4]); else [T, 128] (slot -1 -> zeros)."""
    packed, scales = read_split(view, slots, (64, 4))
    if raw:
        return packed, scales
    out = mxfp4_dequant(packed, scales, dtype)
    out[~_valid(view, slots.reshape(-1).to(view.device))] = 0
    return out


def v4_indexer_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V4 fp8 indexer = V3.2's with scale_fmt="ue8m0": (codes [T, 128], fp32 scales [T]),
    scale = ue8m0_round_up(max(amax, 1e-4) / 448) (reference.INDEXER_AMAX_FLOOR)."""
    assert INDEXER_AMAX_FLOOR == V4_AMAX_FLOOR
    return indexer_rows(_bf16(k), "ue8m0")


def v4_indexer_write(view: torch.Tensor, slots: torch.Tensor, k: torch.Tensor) -> None:
    codes, scales = v4_indexer_rows(k[: slots.numel()])
    write_indexer(view, slots, codes, scales, "split")


def v4_indexer_read(view: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return read_indexer(view, slots.reshape(-1), "split")


# ---- compressor states ------------------------------------------------------------------------
def state_rows(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """kv [T, W], score [T, W2] (fp32 or bf16, one dtype) -> uint8 rows [kv | score] as they are."""
    if kv.dtype != score.dtype or kv.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"kv and score must both be float32 or bfloat16, got {kv.dtype} and "
                        f"{score.dtype}")
    if kv.dim() != 2 or score.dim() != 2 or kv.shape[0] != score.shape[0]:
        raise ValueError(f"kv and score must be [T, W] with one T, got {tuple(kv.shape)} and "
                         f"{tuple(score.shape)}")
    return torch.cat([kv, score], dim=1).contiguous().view(torch.uint8)


def empty_state_row(width: int, dtype: torch.dtype = torch.float32,
                    score_width: int | None = None) -> torch.Tensor:
    """uint8 [1, row bytes] of an empty state: kv = 0 (defined here), score = -inf (SPEC 10)."""
    kv = torch.zeros(1, width, dtype=dtype)
    score = torch.full((1, width if score_width is None else score_width), float("-inf"),
                       dtype=dtype)
    return state_rows(kv, score)


def state_write(view: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor,
                score: torch.Tensor) -> None:
    t = slots.numel()
    write_rows(view, slots.reshape(-1), state_rows(kv[:t], score[:t]))


def state_read(view: torch.Tensor, slots: torch.Tensor, width: int,
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv [T, width], score [T, rest]) of the rows at slots (slot -1 -> zero bytes)."""
    vals = read_rows(view, slots.reshape(-1)).view(dtype)
    return vals[:, :width], vals[:, width:]


# ---- compressed rows + SWA window (vLLM dequantize_and_gather_k_cache) ------------------------
def gather_compressed_and_swa(c_view: torch.Tensor, c_block_table: torch.Tensor, ratio: int,
                              swa_view: torch.Tensor, swa_block_table: torch.Tensor,
                              seq_lens: torch.Tensor, window: int = 128,
                              dtype: torch.dtype = torch.bfloat16, fmt: str = "fp8_ds_mla_v4"):
    """Per request, its compressed K then its SWA window, dequantized; requests concatenated.

    Request r of length L = seq_lens[r] contributes n_c + n_w rows of 512 values:
    - n_c = L // ratio compressed rows 0 .. n_c - 1 of the ratio-`ratio` view (row c holds
      tokens c*ratio .. (c+1)*ratio - 1; it exists once token (c+1)*ratio - 1 < L was written),
      at slot c_block_table[r, c // R] * R + c % R, R = c_view.shape[2] (rows per block);
    - then n_w = min(L, window) SWA rows of tokens L - n_w .. L - 1 in position order, at slot
      swa_block_table[r, p // B] * B + p % B, B = swa_view.shape[2].
    A block-table entry < 0 reads zero rows. Returns (out [sum(n_c + n_w), 512] of dtype,
    cu int64 [R + 1]: request r's rows are out[cu[r]:cu[r + 1]], its SWA part the last n_w)."""
    slots, cu = [], [0]
    for r, length in enumerate(seq_lens.tolist()):
        n_c, n_w = length // ratio, min(length, window)
        for bt, pos, rows in ((c_block_table, torch.arange(n_c), c_view.shape[2]),
                              (swa_block_table, torch.arange(length - n_w, length),
                               swa_view.shape[2])):
            blocks = bt[r].cpu().to(torch.int64)[pos // rows]
            slots.append(torch.where(blocks >= 0, blocks * rows + pos % rows, -1))
        cu.append(cu[-1] + n_c + n_w)
    read = v41_read if fmt == "v41_mxfp8" else v4_mla_read
    parts = [read(view, s.to(view.device), dtype)
             for i, s in enumerate(slots) for view in [(c_view, swa_view)[i % 2]]]
    out = torch.cat(parts) if parts else torch.zeros(0, 512, dtype=dtype, device=c_view.device)
    return out, torch.tensor(cu, dtype=torch.int64)
