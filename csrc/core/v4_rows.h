// DeepSeek-V4's quantized rows (SPEC 10), bit-exact on host and device: the 584-byte
// fp8_ds_mla row, V4.1's 528-byte MXFP8 record and the 68-byte MXFP4 indexer row, all in split
// pages (data of every row, then a footer of UE8M0 scale bytes). kvcache_ext/reference/v4.py is
// the torch ground truth.
//
// Inputs are bf16 values (other dtypes are rounded to bf16 first); amax ignores NaN. Every
// power-of-two scale is 2^ceil(log2(s)) taken exactly from s's bits.
#pragma once
#include <cstdint>

#include "numerics.h"
#include "paged_view.h"

namespace kvc {

// 584 B: 448 e4m3 NoPE codes + 64 bf16 RoPE values (576 data bytes), then 7 UE8M0 tile scales
// and a zero byte in the page footer.
constexpr int64_t kV4Dim = 512;
constexpr int64_t kV4Nope = 448;
constexpr int64_t kV4Tile = 64;
constexpr int64_t kV4Tiles = kV4Nope / kV4Tile;  // 7
constexpr int64_t kV4DataBytes = kV4Nope + 2 * (kV4Dim - kV4Nope);  // 576
constexpr int64_t kV4ScaleBytes = 8;
constexpr int64_t kV4RowBytes = kV4DataBytes + kV4ScaleBytes;  // 584
constexpr float kV4Floor = 1e-4f;  // amax floor (canonical) or scale floor (CuTe DSL option)

// 528 B (DeepSeek-V4.1, FlashMLA's V4.1 record, vLLM PR #56893): 512 e4m3 codes of the whole
// post-RoPE vector (RoPE quantized too), then 16 UE8M0 scale bytes in the page footer, one per
// 32 values (MXFP8). The scale rule is the 584-B row's (v4_mla_exponent), per 32-value tile.
constexpr int64_t kV41Dim = 512;
constexpr int64_t kV41Tile = 32;
constexpr int64_t kV41Tiles = kV41Dim / kV41Tile;  // 16
constexpr int64_t kV41DataBytes = kV41Dim;         // 512
constexpr int64_t kV41ScaleBytes = kV41Tiles;      // 16
constexpr int64_t kV41RowBytes = kV41DataBytes + kV41ScaleBytes;  // 528

// 68 B: 128 e2m1 values packed two to a byte (element 2i low nibble), then 4 UE8M0 bytes,
// one per 32 values.
constexpr int64_t kMxfp4Dim = 128;
constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kMxfp4PackedBytes = kMxfp4Dim / 2;               // 64
constexpr int64_t kMxfp4ScaleBytes = kMxfp4Dim / kMxfp4Block;      // 4
constexpr int64_t kMxfp4RowBytes = kMxfp4PackedBytes + kMxfp4ScaleBytes;  // 68
constexpr float kMxfp4Max = 6.0f;
constexpr float kMxfp4AmaxFloor = 6.0f * 1.17549435e-38f;  // 6 x 2^-126: an all-zero block -> byte 1

KVC_HD int clz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(v));
#else
  return __builtin_clz(v);
#endif
}

// ceil(log2(s)) of a positive float or +inf (-> 128), from the bits: normal s = 1.M x 2^(E-127)
// gives E - 127 + (M != 0); subnormal s = M x 2^-149 gives bitlength(M - 1) - 149.
KVC_HD int32_t ceil_log2(float s) {
  const uint32_t b = float_bits(s);
  const int32_t e = static_cast<int32_t>((b >> 23) & 0xFFu);
  const uint32_t m = b & 0x7FFFFFu;
  if (e == 0xFF) return 128;
  if (e != 0) return e - 127 + (m != 0 ? 1 : 0);
  return (m <= 1 ? 0 : 32 - clz32(m - 1)) - 149;
}

// 2^e as a float, exactly: 2^128 and above are inf, below 2^-126 subnormal, below 2^-149 zero.
KVC_HD float pow2f(int32_t e) {
  if (e >= 128) return bits_float(0x7F800000u);
  if (e >= -126) return bits_float(static_cast<uint32_t>(e + 127) << 23);
  if (e >= -149) return bits_float(1u << (e + 149));
  return 0.0f;
}

// Tile exponent of a V4 fp8_ds_mla tile (64 NoPE values) or a V4.1 MXFP8 tile (32 values) from
// its NaN-free amax: 2^e is the scale; byte = clamp(e + 127, 0, 255) (a tile holding +-inf has
// e = 128, byte 255).
KVC_HD int32_t v4_mla_exponent(float amax, bool scale_floor) {
  const float s = scale_floor ? fmax_(amax / kFp8Max, kV4Floor) : fmax_(amax, kV4Floor) / kFp8Max;
  return ceil_log2(s);
}
// subnormals="flush" (vLLM-CPU's window writer): a value whose quotient by 2^e would be an e4m3
// subnormal, |x / 2^e| < 2^-6 before rounding, is written as +-0 (its sign kept). Applied to
// the input, since x / 2^e is exact and the rounding would move 2^-6 - 2^-10 .. 2^-6 to 2^-6.
KVC_HD float flush_below(float x, float threshold) {
  const uint32_t b = float_bits(x);
  return bits_float(b & 0x7FFFFFFFu) < threshold ? bits_float(b & 0x80000000u) : x;
}
KVC_HD uint8_t v4_scale_byte(int32_t e) {
  const int32_t b = e + 127;
  return static_cast<uint8_t>(b < 0 ? 0 : b > 255 ? 255 : b);
}

// MXFP4 block exponent: clamp(ceil(log2(max(amax, 6 x 2^-126) / 6)), -127, 127); byte e + 127.
KVC_HD int32_t mxfp4_exponent(float amax) {
  const int32_t e = ceil_log2(fmax_(amax, kMxfp4AmaxFloor) / kMxfp4Max);
  return e < -127 ? -127 : e > 127 ? 127 : e;
}

// e2m1 code of v: round to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturate to +-6, sign
// kept (small negatives -> 0x8), NaN -> 0x7 (as cvt.rn.satfinite.e2m1x2.f32).
KVC_HD uint8_t e2m1_encode(float v) {  // branch-free, so CPU loops vectorize
  const uint32_t b = float_bits(v);
  const uint32_t a = b & 0x7FFFFFFFu;
  const float f = bits_float(a);
  const uint32_t mag = (f > 0.25f) + (f >= 0.75f) + (f > 1.25f) + (f >= 1.75f) + (f > 2.5f) +
                       (f >= 3.5f) + (f > 5.0f);
  const uint32_t code = mag | ((b >> 28) & 0x8u);
  return static_cast<uint8_t>(a > 0x7F800000u ? 0x7u : code);
}

KVC_HD float e2m1_decode(uint32_t code) {
  // magnitudes x 2 are 0 1 2 3 4 6 8 12: one nibble each of 0xC8643210
  const float mag = static_cast<float>((0xC8643210u >> (4 * (code & 7))) & 0xFu) * 0.5f;
  return (code & 8) ? -mag : mag;
}

}  // namespace kvc
