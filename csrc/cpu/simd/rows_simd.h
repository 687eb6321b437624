// The SIMD row loops once, for any vector V (vec_avx2.h: 16 words; vec_avx512.h: 32 words), the
// same bytes as the scalar loops in rows.cpp (tests/rows_exhaustive.cpp compares every float,
// every bf16 / fp16 pattern under many scales and every code). Included by one file per ISA
// (rows_avx2.cpp, rows_avx512.cpp), which first defines KVC_SIMD_INLINE as its always-inline
// target attribute, so each instantiation is compiled for its ISA alone.
//
// Encoding runs kWords values per step in 16-bit lanes (the loop is bound by instructions
// issued, not by the division): each quotient |x| / |s| is cut to a bf16 pattern rounded to odd
// (the 16 dropped bits stick to the kept lowest bit), which rounds to the same e4m3 code as the
// float itself (8 significant bits >= 4 + 2, so the second rounding cannot be misled). Codes in
// e4m3's normal range up to 464 are then a rounding of that pattern's top bits; the rare lanes
// (below 2^-6, above 464, inf, NaN) are done over only when a group has one: by table, clamp and
// mask where V permutes words, else by the 32-bit formulation. A bf16 tile over a power-of-two
// scale skips the division: the quotient's pattern is the input's with the exponent shifted.
//
// Decoding widens the codes to fp16 in hardware: an e4m3 code c is the fp16 number with bits
// (c & 0x7F) << 7 | (c & 0x80) << 8 times 2^8, exactly (e4m3's exponent bias is 7, fp16's 15;
// e4m3 subnormals land on fp16 subnormals), so vcvtph2ps and one multiplication give its value.
#include <cmath>  // no #pragma once: one ISA per including file, each includes it once
#include <cstdint>

#include "../rows.h"

#if !defined(KVC_SIMD_ISA) || !defined(KVC_SIMD_TARGET) || !defined(KVC_SIMD_INLINE)
#error "define KVC_SIMD_ISA, KVC_SIMD_TARGET and KVC_SIMD_INLINE (see above) first"
#endif

namespace kvc::cpu::simd {
namespace {

// ---- amax: 16-bit inputs compared as 16-bit patterns (for non-negative bf16 / fp16 the bit
// order is the value order; NaN patterns count as 0), widened once per tile.
template <class V>
KVC_SIMD_INLINE void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  using I = typename V::I;
  const I abs16 = V::set16(0x7FFF), abs32 = V::set32(0x7FFFFFFF), inf32 = V::set32(0x7F800000);
  const I inf16 = V::set16(t == DType::kBFloat16 ? 0x7F80 : 0x7C00);
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(t);
    int64_t i = 0;
    float top = 0.0f;
    if (t == DType::kFloat32) {
      I m = V::zero();
      for (; i + V::kWords / 2 <= tile; i += V::kWords / 2)
        m = V::max_le_i32(m, V::and_(V::loadu(x + 4 * i), abs32), inf32);
      top = bits_float(V::hmax_i32(m));
    } else {
      I m = V::zero();
      for (; i + V::kWords <= tile; i += V::kWords) m = V::max_le_u16(m, V::and_(V::loadu(x + 2 * i), abs16), inf16);
      const uint16_t w = static_cast<uint16_t>(V::hmax_u16(m));
      top = t == DType::kBFloat16 ? bf16_to_float(w) : fp16_to_float(w);
    }
    const float rest = i < tile ? scalar::row_amax(x + i * dtype_size(t), t, tile - i) : 0.0f;
    amax[k] = rest > top ? rest : top;
  }
}

// ---- e4m3 encoding
// e4m3_encode_soft (numerics.h) on 32-bit lanes: codes in the low byte of each dword. The
// normal-range code rises with |x| and is exactly 0x7E at 448, so saturation is a minimum.
template <class V>
KVC_SIMD_INLINE typename V::I e4m3_dwords(typename V::F q) {
  using I = typename V::I;
  const I bits = V::as_si(q);
  const I a = V::and_(bits, V::set32(0x7FFFFFFF));
  const I sign = V::and_(V::srli32(bits, 24), V::set32(0x80));
  I normal = V::add32(a, V::set32(0x7FFFF));
  normal = V::add32(normal, V::and_(V::srli32(a, 20), V::set32(1)));
  normal = V::sub32(V::srli32(normal, 20), V::set32(120 << 3));
  const I subnormal = V::sub32(V::as_si(V::add_ps(V::as_ps(a), V::set_ps(16384.0f))), V::set32(0x46800000));
  I r = V::select32(V::lt32(a, V::set32(0x3C800000)), normal, subnormal);
  r = V::or_(V::min_i32(r, V::set32(0x7E)), sign);
  return V::select32(V::gt32(a, V::set32(0x7F800000)), r, V::set32(0x7F));
}

// Normal range, on bf16 patterns a (|q| rounded to odd): the 7 mantissa bits rounded to 3
// (nearest even) with the exponent rebased 127 -> 7, as code << 8 so that the sign (bit 15 of
// sign) merges at bit 15 and the high bytes are the codes. Right up to a = 0x43E8 (464, which
// rounds to 448: every quotient of a tile by its own scale) with no clamp.
template <class V>
KVC_SIMD_INLINE typename V::I normal_code_words(typename V::I a, typename V::I sign) {
  const auto lsb = V::and_(V::srli16(a, 4), V::set16(1));
  const auto r = V::slli16(V::add16(V::add16(a, V::set16(7 - 0x3C00)), lsb), 4);
  return V::or_and(r, sign, V::set16(0x8000));
}

// The rare lanes' code words: below 2^-6 (e4m3 subnormals), above 464 (saturation, inf), NaN
// (and the lanes of nan, NaN whatever a holds).
template <class V>
KVC_SIMD_INLINE typename V::I rare_code_words(typename V::I a, typename V::I sign, typename V::M16 nan) {
  using I = typename V::I;
  if constexpr (V::kWordPermute) {
    I r = normal_code_words<V>(V::min_u16(a, V::set16(0x43E0)), sign);  // >= 448, inf: 0x7E
    r = V::select16(V::lt_u16(a, V::set16(0x3C80)), r, V::subnormal_code_words(a, sign));
    return V::select16(V::gt16(a, V::set16(0x7F80)) | nan, r, V::set16(0x7F00));
  } else {  // the patterns' float values (even and odd words apart) round to the same codes
    a = V::select16(nan, a, V::set16(0x7FC0));
    const I sign32 = V::set32(static_cast<int32_t>(0x80000000u));
    const I even = V::or_(V::slli32(a, 16), V::and_(V::slli32(sign, 16), sign32));
    const I odd = V::or_(V::and_(a, V::set32(static_cast<int32_t>(0xFFFF0000u))), V::and_(sign, sign32));
    return V::slli16(V::or_(e4m3_dwords<V>(V::as_ps(even)), V::slli32(e4m3_dwords<V>(V::as_ps(odd)), 16)), 8);
  }
}

template <class V>
KVC_SIMD_INLINE void store_codes(typename V::I a, typename V::I sign, typename V::M16 nan, uint8_t* o) {
  typename V::I r = normal_code_words<V>(a, sign);
  if (__builtin_expect(V::rare_lanes(a, nan), 0)) r = rare_code_words<V>(a, sign, nan);
  V::store_high_bytes(r, o);
}

// kWords values from x as bf16 patterns of |x| / s rounded to odd, and their signs (bit 15).
template <class V, DType T>
KVC_SIMD_INLINE typename V::I quotients(const uint8_t* x, typename V::F s, typename V::I* sign) {
  using I = typename V::I;
  if constexpr (T == DType::kFloat32) {
    const I lo = V::loadu(x), hi = V::loadu(x + 2 * V::kWords), abs = V::set32(0x7FFFFFFF);
    *sign = V::high_words(lo, hi);
    return V::high_words(V::sticky16(V::as_si(V::div_ps(V::as_ps(V::and_(lo, abs)), s))),
                         V::sticky16(V::as_si(V::div_ps(V::as_ps(V::and_(hi, abs)), s))));
  } else {
    const I h = V::loadu(x);
    const I m = V::and_(h, V::set16(0x7FFF));
    *sign = h;
    if constexpr (T == DType::kBFloat16)  // even elements: the low words moved up; odd: the high words
      return V::interleave_high_words(
          V::sticky16(V::as_si(V::div_ps(V::as_ps(V::slli32(m, 16)), s))),
          V::sticky16(V::as_si(V::div_ps(V::as_ps(V::andnot(V::set32(0xFFFF), m)), s))));
    return V::high_words(V::sticky16(V::as_si(V::div_ps(V::fp16_lo(m), s))),
                         V::sticky16(V::as_si(V::div_ps(V::fp16_hi(m), s))));
  }
}

// The sign of x / s attached by bits (flipped for a negative scale).
template <class V, bool kNegative>
KVC_SIMD_INLINE typename V::I signs(typename V::I sign) {
  return kNegative ? V::xor_(sign, V::set16(0x8000)) : sign;
}

// bf16 / 2^e is the bf16 pattern with e taken off its exponent field, exactly, while both are
// normal; otherwise the quotient is < 2^-26 (|e| <= 100), whose code is 0 either way, or it
// saturates to inf. NaN lanes are passed on as such. Returns how many values were coded.
template <class V, bool kNegative, bool kDown>
KVC_SIMD_INLINE int64_t pow2_codes(const uint8_t* x, int64_t n, int32_t abs_e, uint8_t* o) {
  using I = typename V::I;
  const I shift = V::set16(abs_e << 7), inf = V::set16(0x7F80);
  int64_t i = 0;
  for (; i + V::kWords <= n; i += V::kWords) {
    const I h = V::loadu(x + i * 2);
    const I m = V::and_(h, V::set16(0x7FFF));
    const I a = kDown ? V::subs_u16(m, shift) : V::min_u16(V::adds_u16(m, shift), inf);
    store_codes<V>(a, signs<V, kNegative>(h), V::gt16(m, inf), o + i);
  }
  return i;
}

template <class V, DType T, bool kNegative>
KVC_SIMD_INLINE void quantize_tile(const uint8_t* x, int64_t n, float scale, uint8_t* o) {
  int64_t i = 0;
  const int32_t e = pow2_exponent(scale);
  if (T == DType::kBFloat16 && e != kNotPow2)
    i = e > 0 ? pow2_codes<V, kNegative, true>(x, n, e, o) : pow2_codes<V, kNegative, false>(x, n, -e, o);
  const typename V::F s = V::set_ps(std::fabs(scale));
  for (; i + V::kWords <= n; i += V::kWords) {
    typename V::I sign;
    const typename V::I a = quotients<V, T>(x + i * dtype_size(T), s, &sign);
    store_codes<V>(a, signs<V, kNegative>(sign), V::no_lanes(), o + i);
  }
  if (i == n) return;
  const typename V::F ss = V::set_ps(scale);
  for (; i + V::kWords / 2 <= n; i += V::kWords / 2)
    V::store_dword_bytes(e4m3_dwords<V>(V::div_ps(V::load_floats(x, T, i), ss)), o + i);
  scalar::quantize_row(x + i * dtype_size(T), T, n - i, scale, o + i);
}

template <class V, DType T>
KVC_SIMD_INLINE void quantize_tiles_as(const void* src, int64_t tiles, int64_t tile, int64_t stride,
                                       const float* scales, uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(T);
    if (std::signbit(scales[k])) quantize_tile<V, T, true>(x, tile, scales[k], out + k * tile);
    else quantize_tile<V, T, false>(x, tile, scales[k], out + k * tile);
  }
}

template <class V>
KVC_SIMD_INLINE void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride,
                                    const float* scales, uint8_t* out) {
  switch (t) {
    case DType::kBFloat16: return quantize_tiles_as<V, DType::kBFloat16>(src, tiles, tile, stride, scales, out);
    case DType::kFloat16: return quantize_tiles_as<V, DType::kFloat16>(src, tiles, tile, stride, scales, out);
    default: return quantize_tiles_as<V, DType::kFloat32>(src, tiles, tile, stride, scales, out);
  }
}

// ---- e4m3 decoding
// The values of kWords codes times s / 256, in lo (codes 0 .. kWords/2) and hi; returns the NaN
// codes' lanes.
template <class V>
KVC_SIMD_INLINE typename V::M16 decoded(const uint8_t* codes, typename V::F s, typename V::F* lo, typename V::F* hi) {
  const typename V::I c = V::load_bytes_as_words(codes);
  // c << 8 puts the sign at bit 15 and the rest at 8-14; an arithmetic shift by 1 moves the rest
  // to 7-13 and copies the sign into bit 14, which the mask clears
  const typename V::I h = V::and_(V::srai16(V::slli16(c, 8), 1), V::set16(0xBFFF));
  *lo = V::mul_ps(V::fp16_lo(h), s);
  *hi = V::mul_ps(V::fp16_hi(h), s);
  return V::eq16(V::and_(c, V::set16(0x7F)), V::set16(0x7F));
}

// float_to_bf16 / float_to_fp16 (numerics.h) on 32-bit lanes (NaN lanes given apart), 16-bit
// results in each dword.
// v rounded to nearest even at bit 16 (the bf16 in the high word; NaN lanes given apart)
template <class V>
KVC_SIMD_INLINE typename V::I bf16_rounded(typename V::F v) {
  const typename V::I u = V::as_si(v);
  return V::add32(V::add32(u, V::set32(0x7FFF)), V::and_(V::srli32(u, 16), V::set32(1)));
}

template <class V>
KVC_SIMD_INLINE typename V::I to_bf16(typename V::F v) {
  return V::srli32(bf16_rounded<V>(v), 16);
}

template <class V>
KVC_SIMD_INLINE typename V::I to_fp16(typename V::F v) {
  using I = typename V::I;
  const I u = V::as_si(v);
  const I a = V::and_(u, V::set32(0x7FFFFFFF));
  const I sign = V::and_(V::srli32(u, 16), V::set32(0x8000));
  I normal = V::add32(a, V::set32(0xFFF));
  normal = V::add32(normal, V::and_(V::srli32(a, 13), V::set32(1)));
  normal = V::srli32(V::sub32(normal, V::set32(112 << 23)), 13);
  const I subnormal = V::sub32(V::as_si(V::add_ps(V::as_ps(a), V::set_ps(0.5f))), V::set32(0x3F000000));
  I r = V::select32(V::gt32(a, V::set32(0x387FFFFF)), subnormal, normal);
  r = V::select32(V::gt32(a, V::set32(0x477FEFFF)), r, V::set32(0x7C00));
  return V::or_(r, sign);
}

// One half's values stored as out_dtype: NaN canonical, for the lanes of nan (NaN codes) and
// for NaN products (a NaN or infinite scale).
template <class V>
KVC_SIMD_INLINE void store_values(typename V::F v, typename V::M32 nan, DType out_dtype, uint8_t* o) {
  nan = nan | V::gt32(V::and_(V::as_si(v), V::set32(0x7FFFFFFF)), V::set32(0x7F800000));
  if (out_dtype == DType::kFloat32)
    V::storeu_ps(reinterpret_cast<float*>(o), V::select_ps(nan, v, V::as_ps(V::set32(static_cast<int32_t>(kCanonicalNanBits)))));
  else if (out_dtype == DType::kBFloat16)
    V::store_dword_words(V::select32(nan, to_bf16<V>(v), V::set32(0x7FC0)), o);
  else
    V::store_dword_words(V::select32(nan, to_fp16<V>(v), V::set32(0x7E00)), o);
}

// Fast path (decodes_fast scales, bf16 or fp32 out): one multiplication by 256 s gives each
// product, and bf16 rounds as for normal floats. Else: the code's value (times 256 exactly),
// then times s, then converted as numerics.h does.
template <class V>
KVC_SIMD_INLINE int64_t decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  using F = typename V::F;
  const int64_t es = dtype_size(out_dtype);
  int64_t i = 0;
  if (out_dtype != DType::kFloat16 && decodes_fast(scale)) {
    const F s256 = V::set_ps(scale * 256.0f);
    for (; i + V::kWords <= n; i += V::kWords) {
      F lo, hi;
      const typename V::M16 nan = decoded<V>(codes + i, s256, &lo, &hi);
      uint8_t* o = out + i * es;
      if (out_dtype == DType::kFloat32) {
        const F q = V::as_ps(V::set32(static_cast<int32_t>(kCanonicalNanBits)));
        V::storeu_ps(reinterpret_cast<float*>(o), V::select_ps(V::lo_mask32(nan), lo, q));
        V::storeu_ps(reinterpret_cast<float*>(o) + V::kWords / 2, V::select_ps(V::hi_mask32(nan), hi, q));
      } else {
        const typename V::I r = V::high_words(bf16_rounded<V>(lo), bf16_rounded<V>(hi));
        V::storeu(o, V::select16(nan, r, V::set16(0x7FC0)));
      }
    }
  }
  const F s = V::set_ps(scale), k256 = V::set_ps(256.0f);
  for (; i + V::kWords <= n; i += V::kWords) {
    F lo, hi;
    const typename V::M16 nan = decoded<V>(codes + i, k256, &lo, &hi);
    uint8_t* o = out + i * es;
    store_values<V>(V::mul_ps(lo, s), V::lo_mask32(nan), out_dtype, o);
    store_values<V>(V::mul_ps(hi, s), V::hi_mask32(nan), out_dtype, o + V::kWords / 2 * es);
  }
  return i;
}

}  // namespace
}  // namespace kvc::cpu::simd

// The ISA's entry points (rows.h), for its Vec.
namespace kvc::cpu::KVC_SIMD_ISA {

KVC_SIMD_TARGET void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  simd::tile_amax<Vec>(src, t, tiles, tile, stride, amax);
}

KVC_SIMD_TARGET float row_amax(const void* src, DType t, int64_t n) {
  float amax;
  simd::tile_amax<Vec>(src, t, 1, n, n, &amax);
  return amax;
}

KVC_SIMD_TARGET void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride,
                                    const float* scales, uint8_t* out) {
  simd::quantize_tiles<Vec>(src, t, tiles, tile, stride, scales, out);
}

KVC_SIMD_TARGET void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  simd::quantize_tiles<Vec>(src, t, 1, n, n, &scale, out);
}

KVC_SIMD_TARGET void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  const int64_t i = simd::decode_row<Vec>(codes, n, scale, out_dtype, out);
  if (i < n) scalar::decode_row(codes + i, n - i, scale, out_dtype, out + i * dtype_size(out_dtype));
}

}  // namespace kvc::cpu::KVC_SIMD_ISA
