// Number formats of the cache rows, bit-exact on host and device.
//
// e4m3 ("fn", max 448) encoding: round to nearest even, saturate finite overflow and +-inf to
// +-448, NaN -> 0x7F whatever its sign (GPUs drop the sign of NaN results, x86 keeps it, so a
// signed NaN could not give the same bytes everywhere). This matches the hardware
// cvt.rn.satfinite.e4m3x2.f32 instruction, which the device path uses on sm_89 and newer.
// bf16 results round to nearest even with NaN -> 0x7FC0.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

#include "paged_view.h"  // KVC_HD

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace kvc {

KVC_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

KVC_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

KVC_HD bool is_nan(float f) { return (float_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// |x| for amax reductions; NaN counts as 0 so one NaN does not poison a tile's scale.
KVC_HD float abs_for_amax(float f) {
  const uint32_t a = float_bits(f) & 0x7FFFFFFFu;
  return a > 0x7F800000u ? 0.0f : bits_float(a);
}

KVC_HD float fmax_(float a, float b) { return a > b ? a : b; }

// One NaN for fp32 results: arithmetic on a NaN gives 0x7FFFFFFF on a GPU and the quieted
// operand (e.g. 0x7FC00000, or a negative NaN) on x86, so every fp32 dequantized value is
// passed through this to give the same bits everywhere.
constexpr uint32_t kCanonicalNanBits = 0x7FC00000u;
KVC_HD float canonical_nan(float f) { return is_nan(f) ? bits_float(kCanonicalNanBits) : f; }

constexpr float kFp8Max = 448.0f;
constexpr float kFltMin = 1.17549435e-38f;  // FLT_MIN
constexpr float kIndexerAmaxFloor = 1e-4f;
constexpr float kMlaPow2ScaleFloor = 1e-4f;  // fp8_ds_mla "pow2" tiles: floor of amax / 448

// Software encoder, branch-free so CPU loops vectorize. Normal range: round the fp32 mantissa
// to 3 bits (nearest even) by integer arithmetic. Subnormal range (|x| < 2^-6): adding 2^14
// makes the FPU round at e4m3's 2^-9 step, nearest even, and the low bits are the code.
KVC_HD uint8_t e4m3_encode_soft(float f) {
  const uint32_t bits = float_bits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  const uint32_t normal = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  const uint32_t subnormal = float_bits(bits_float(a) + 16384.0f) - 0x46800000u;
  uint32_t r = a < 0x3C800000u ? subnormal : normal;
  r = a >= 0x43E00000u ? 0x7Eu : r;  // >= 448 and inf saturate
  r |= sign;
  r = a > 0x7F800000u ? 0x7Fu : r;   // NaN
  return static_cast<uint8_t>(r);
}

KVC_HD uint8_t e4m3_encode(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (is_nan(f)) return 0x7F;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
#else
  return e4m3_encode_soft(f);
#endif
}

KVC_HD float e4m3_decode(uint8_t c) {  // exact; NaN -> 0x7FC00000; branch-free
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu;
  const uint32_t m = c & 0x7u;
  const uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
  const uint32_t subnormal = sign | float_bits(static_cast<float>(m) * 0.001953125f);  // m * 2^-9
  uint32_t r = e == 0 ? subnormal : normal;
  r = (c & 0x7Fu) == 0x7Fu ? 0x7FC00000u : r;
  return bits_float(r);
}

KVC_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

KVC_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : r);
}

KVC_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) return bits_float(sign | float_bits(static_cast<float>(m) * 5.9604644775390625e-8f));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// fp16, round to nearest even, NaN -> 0x7E00. Normal range by integer rounding of the mantissa;
// subnormals (|x| < 2^-14): adding 0.5 makes the FPU round at fp16's 2^-24 step.
KVC_HD uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7E00u;
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (a >= 0x38800000u)
    return static_cast<uint16_t>(sign | ((a + 0xFFFu + ((a >> 13) & 1u) - (112u << 23)) >> 13));
  return static_cast<uint16_t>(sign | (float_bits(bits_float(a) + 0.5f) - 0x3F000000u));
}

// Round a positive scale up to a power of two (ue8m0), from the float's bits.
KVC_HD float ue8m0_round_up(float s) {
  const uint32_t u = float_bits(s);
  if ((u & 0x7F800000u) == 0x7F800000u) return s;  // inf / NaN stay
  if ((u & 0x7FFFFFu) == 0) return s;              // already a power of two
  return bits_float((u & 0xFF800000u) + 0x800000u);
}

// x / s for the e4m3 encoder when s is a tile scale (fmax(amax / 448, FLT_MIN), its power-of-two
// round-up, or the indexer's fmax(amax, 1e-4) / 448) of bf16 / fp16 inputs and x a value of the tile: three
// multiply-adds with the correctly rounded reciprocal y = 1 / s instead of a division,
//   q0 = x * y,  r = fma(-q0, s, x),  q = fma(r, y, q0),  sign of q := sign of x (x = -0
//   would give +0: the division's zero keeps the sign of x),
// whose e4m3 code equals that of the IEEE quotient for every such (x, s) with
// 2^-100 <= s < inf -- checked on every pair by tests/tile_div_exhaustive.cpp (bf16 and fp16
// inputs, both scale rules). Outside that range (all-zero or tiny tiles, tiles holding inf)
// tile_div divides. Nothing else may call it: other operands are not covered by the check.
struct TileDivisor {
  float s;  // the scale
  float y;  // RN(1 / s); 0 when tile_div must divide
};

KVC_HD TileDivisor tile_divisor(float s) {
  const bool fast = s >= 0x1p-100f && s < bits_float(0x7F800000u);
#if defined(__CUDA_ARCH__)
  return {s, fast ? __frcp_rn(s) : 0.0f};
#else
  return {s, fast ? 1.0f / s : 0.0f};
#endif
}

// The multiply-add quotient alone (d.y != 0); kernels test d.y once per tile, not per value.
KVC_HD float tile_div_fma(float x, const TileDivisor& d) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(x, d.y);
  const float q = __fmaf_rn(__fmaf_rn(-q0, d.s, x), d.y, q0);
#else
  const float q0 = x * d.y;
  const float q = std::fma(std::fma(-q0, d.s, x), d.y, q0);
#endif
  return bits_float((float_bits(q) & 0x7FFFFFFFu) | (float_bits(x) & 0x80000000u));
}

KVC_HD float tile_div(float x, const TileDivisor& d) {
  return d.y == 0.0f ? x / d.s : tile_div_fma(x, d);
}

// Input element kinds of the write ops.
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

KVC_HD int64_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// One float stored as `t` at element i of dst (bf16 / fp16 NaN canonical, fp32 NaN 0x7FC00000).
KVC_HD void store_float(void* dst, int64_t i, float v, DType t) {
  if (t == DType::kFloat32)
    static_cast<float*>(dst)[i] = canonical_nan(v);
  else
    static_cast<uint16_t*>(dst)[i] = t == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
}

KVC_HD float load_as_float(const void* p, int64_t i, DType t) {
  if (t == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == DType::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
}

}  // namespace kvc
