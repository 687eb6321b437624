// AVX2 versions of the row loops in rows.cpp, the same bytes as the scalar code. Encoding: the
// AVX-512 file's 16-bit-lane encoder on 16 values per instruction (a group with a rare lane is
// encoded again by the 32-bit integer formulation, 8 per step); MXFP4 likewise. Decoding: 16
// codes per step widened through fp16 by F16C (decodes_fast scales), else 8 per step by the
// integer formulation. Each function is compiled for AVX2 + F16C by a
// target attribute, so the rest of the library keeps the baseline ISA; rows.cpp calls these
// only when supported() says the CPU has both.
#include "rows.h"

#include "../core/v4_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define KVC_AVX2 __attribute__((target("avx2,f16c")))
#define KVC_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace kvc::cpu::avx2 {
namespace {

KVC_AVX2_INLINE __m256i splat(int32_t v) { return _mm256_set1_epi32(v); }

// 8 values of dtype t at src[i..i+8) as floats (exact widening).
KVC_AVX2_INLINE __m256 load8(const void* src, DType t, int64_t i) {
  if (t == DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(src) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + i));
  if (t == DType::kFloat16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// e4m3_encode_soft (numerics.h) on 8 lanes: codes in the low byte of each 32-bit lane.
KVC_AVX2_INLINE __m256i e4m3_encode8(__m256 q) {
  const __m256i bits = _mm256_castps_si256(q);
  const __m256i a = _mm256_and_si256(bits, splat(0x7FFFFFFF));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), splat(0x80));
  __m256i normal = _mm256_add_epi32(a, splat(0x7FFFF));
  normal = _mm256_add_epi32(normal, _mm256_and_si256(_mm256_srli_epi32(a, 20), splat(1)));
  normal = _mm256_sub_epi32(_mm256_srli_epi32(normal, 20), splat(120 << 3));
  const __m256 shifted = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(16384.0f));
  const __m256i subnormal = _mm256_sub_epi32(_mm256_castps_si256(shifted), splat(0x46800000));
  __m256i r = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(splat(0x3C800000), a));
  r = _mm256_blendv_epi8(r, splat(0x7E), _mm256_cmpgt_epi32(a, splat(0x43DFFFFF)));
  r = _mm256_or_si256(r, sign);
  return _mm256_blendv_epi8(r, splat(0x7F), _mm256_cmpgt_epi32(a, splat(0x7F800000)));
}

// The low bytes of 8 lanes, stored as 8 bytes.
KVC_AVX2_INLINE void store_low_bytes8(__m256i r, uint8_t* out) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i p = _mm256_shuffle_epi8(r, pick);
  const __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), both);
}

// e4m3_decode (numerics.h) on 8 codes.
KVC_AVX2_INLINE __m256 e4m3_decode8(const uint8_t* codes) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, splat(0x80)), 24);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(c, 3), splat(0xF));
  const __m256i m = _mm256_and_si256(c, splat(0x7));
  const __m256i normal = _mm256_or_si256(
      sign, _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(e, splat(120)), 23),
                            _mm256_slli_epi32(m, 20)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0.001953125f));
  __m256i r = _mm256_blendv_epi8(normal, _mm256_or_si256(sign, _mm256_castps_si256(sub)),
                                 _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  r = _mm256_blendv_epi8(r, splat(static_cast<int32_t>(kCanonicalNanBits)),
                         _mm256_cmpeq_epi32(_mm256_and_si256(c, splat(0x7F)), splat(0x7F)));
  return _mm256_castsi256_ps(r);
}

KVC_AVX2_INLINE __m256i is_nan8(__m256i u) {
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7FFFFFFF)), splat(0x7F800000));
}

// float_to_bf16 / float_to_fp16 (numerics.h) on 8 lanes, 16-bit results in each 32-bit lane.
KVC_AVX2_INLINE __m256i to_bf16_8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat(0x7FFF)), lsb), 16);
  return _mm256_blendv_epi8(r, splat(0x7FC0), is_nan8(u));
}

KVC_AVX2_INLINE __m256i to_fp16_8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(u, splat(0x7FFFFFFF));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(0x8000));
  __m256i normal = _mm256_add_epi32(a, splat(0xFFF));
  normal = _mm256_add_epi32(normal, _mm256_and_si256(_mm256_srli_epi32(a, 13), splat(1)));
  normal = _mm256_srli_epi32(_mm256_sub_epi32(normal, splat(112 << 23)), 13);
  const __m256 half = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0.5f));
  const __m256i subnormal = _mm256_sub_epi32(_mm256_castps_si256(half), splat(0x3F000000));
  __m256i r = _mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(a, splat(0x387FFFFF)));
  r = _mm256_blendv_epi8(r, splat(0x7C00), _mm256_cmpgt_epi32(a, splat(0x477FEFFF)));
  r = _mm256_or_si256(r, sign);
  return _mm256_blendv_epi8(r, splat(0x7E00), is_nan8(u));
}

// 8 16-bit results (one per 32-bit lane) stored as 16 bytes.
KVC_AVX2_INLINE void store_u16x8(__m256i r, uint8_t* out) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

// max of the 16 words of m (the complement's minimum: phminposuw takes 8 words in one step).
KVC_AVX2_INLINE uint32_t hmax_u16(__m256i m) {
  const __m128i x = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1)))));
}

KVC_AVX2_INLINE uint32_t hmax_i32(__m256i m) {
  __m128i x = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  x = _mm_max_epi32(x, _mm_srli_si128(x, 8));
  x = _mm_max_epi32(x, _mm_srli_si128(x, 4));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

}  // namespace

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

// 16-bit inputs: the amax of |x| taken on the 16-bit patterns (for non-negative bf16 / fp16 the
// bit order is the value order; NaN patterns count as 0), then widened once per tile.
KVC_AVX2 void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  const __m256i abs32 = splat(0x7FFFFFFF), inf32 = splat(0x7F800000), abs16 = _mm256_set1_epi16(0x7FFF);
  const __m256i inf16 = _mm256_set1_epi16(t == DType::kBFloat16 ? 0x7F80 : 0x7C00);
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(t);
    int64_t i = 0;
    float top = 0.0f;
    if (t == DType::kFloat32) {
      const float* f = reinterpret_cast<const float*>(x);
      __m256i m = _mm256_setzero_si256();
      for (; i + 8 <= tile; i += 8) {
        const __m256i a = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(f + i)), abs32);
        m = _mm256_max_epi32(m, _mm256_andnot_si256(_mm256_cmpgt_epi32(a, inf32), a));
      }
      top = bits_float(hmax_i32(m));
    } else {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(x);
      __m256i m = _mm256_setzero_si256();
      for (; i + 16 <= tile; i += 16) {
        const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)), abs16);
        m = _mm256_max_epu16(m, _mm256_andnot_si256(_mm256_cmpgt_epi16(a, inf16), a));
      }
      const uint16_t w = static_cast<uint16_t>(hmax_u16(m));
      top = t == DType::kBFloat16 ? bf16_to_float(w) : fp16_to_float(w);
    }
    const float rest = i < tile ? scalar::row_amax(x + i * dtype_size(t), t, tile - i) : 0.0f;
    amax[k] = rest > top ? rest : top;
  }
}

KVC_AVX2 float row_amax(const void* src, DType t, int64_t n) {
  float m;
  tile_amax(src, t, 1, n, n, &m);
  return m;
}

namespace {

// The AVX-512 file's encoder (see there) on 16 lanes of 16 bits: |q| cut to bf16 rounded to odd,
// normal-range codes by one rounding of that pattern; a group with a rare lane (below 2^-6,
// above 464, NaN) is encoded again by e4m3_encode8 from those patterns' float values, which
// round to the same codes.
KVC_AVX2_INLINE __m256i sticky16(__m256i u) {  // bit 16 |= any of bits 0-15 (bits 0-15 dropped after)
  return _mm256_or_si256(u, _mm256_add_epi32(_mm256_and_si256(u, splat(0xFFFF)), splat(0xFFFF)));
}
KVC_AVX2_INLINE __m256i bf16_odd_interleaved(__m256 even, __m256 odd) {
  return _mm256_blend_epi16(_mm256_srli_epi32(sticky16(_mm256_castps_si256(even)), 16),
                            sticky16(_mm256_castps_si256(odd)), 0xAA);
}
KVC_AVX2_INLINE __m256i high_words(__m256i lo, __m256i hi) {  // elements 0-7, 8-15 -> in order
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(lo, 16), _mm256_srli_epi32(hi, 16)), 0xD8);
}
KVC_AVX2_INLINE __m256i bf16_odd_ordered(__m256 lo, __m256 hi) {
  return high_words(sticky16(_mm256_castps_si256(lo)), sticky16(_mm256_castps_si256(hi)));
}

KVC_AVX2_INLINE __m128i e4m3_codes16(__m256i a, __m256i sign) {
  const __m256i high_bit = _mm256_set1_epi16(static_cast<int16_t>(0x8000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi16(a, 4), _mm256_set1_epi16(1));
  __m256i r = _mm256_slli_epi16(_mm256_add_epi16(_mm256_add_epi16(a, _mm256_set1_epi16(7 - 0x3C00)), lsb), 4);
  r = _mm256_or_si256(r, _mm256_and_si256(sign, high_bit));
  const __m256i beyond = _mm256_subs_epu16(_mm256_sub_epi16(a, _mm256_set1_epi16(0x3C80)),
                                           _mm256_set1_epi16(0x43E8 - 0x3C80));
  if (__builtin_expect(!_mm256_testz_si256(beyond, beyond), 0)) {
    const __m256i sign32 = splat(static_cast<int32_t>(0x80000000u));
    const __m256 even = _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(a, 16),
                                                            _mm256_and_si256(_mm256_slli_epi32(sign, 16), sign32)));
    const __m256 odd = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(a, splat(static_cast<int32_t>(0xFFFF0000u))),
                                                           _mm256_and_si256(sign, sign32)));
    r = _mm256_slli_epi16(_mm256_or_si256(e4m3_encode8(even), _mm256_slli_epi32(e4m3_encode8(odd), 16)), 8);
  }
  const __m256i pick = _mm256_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                        1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, pick), 0x08));
}

template <bool kNegative>
KVC_AVX2_INLINE __m256i signs(__m256i sign) {
  return kNegative ? _mm256_xor_si256(sign, _mm256_set1_epi16(static_cast<int16_t>(0x8000))) : sign;
}

// 16 values from x as bf16 patterns of |x| / s rounded to odd, and their signs (bit 15).
template <DType T>
KVC_AVX2_INLINE __m256i quotients16(const uint8_t* x, __m256 s, __m256i* sign) {
  if constexpr (T == DType::kFloat32) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
    const __m256i abs = splat(0x7FFFFFFF);
    *sign = high_words(lo, hi);
    return bf16_odd_ordered(_mm256_div_ps(_mm256_castsi256_ps(_mm256_and_si256(lo, abs)), s),
                            _mm256_div_ps(_mm256_castsi256_ps(_mm256_and_si256(hi, abs)), s));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i m = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
    *sign = h;
    if constexpr (T == DType::kBFloat16)
      return bf16_odd_interleaved(_mm256_div_ps(_mm256_castsi256_ps(_mm256_slli_epi32(m, 16)), s),
                                  _mm256_div_ps(_mm256_castsi256_ps(_mm256_andnot_si256(splat(0xFFFF), m)), s));
    return bf16_odd_ordered(_mm256_div_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(m)), s),
                            _mm256_div_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(m, 1)), s));
  }
}

template <DType T, bool kNegative>
KVC_AVX2_INLINE void quantize_tile(const uint8_t* x, int64_t n, float scale, uint8_t* o) {
  int64_t i = 0;
  const int32_t e = pow2_exponent(scale);
  if (T == DType::kBFloat16 && e != kNotPow2) {  // exponent arithmetic, as in the AVX-512 file
    const __m256i shift = _mm256_set1_epi16(static_cast<int16_t>(std::abs(e) << 7));
    const __m256i inf = _mm256_set1_epi16(0x7F80);
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i * 2));
      const __m256i m = _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF));
      __m256i a = e > 0 ? _mm256_subs_epu16(m, shift) : _mm256_min_epu16(_mm256_adds_epu16(m, shift), inf);
      a = _mm256_blendv_epi8(a, m, _mm256_cmpgt_epi16(m, inf));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), e4m3_codes16(a, signs<kNegative>(h)));
    }
  }
  const __m256 s = _mm256_set1_ps(std::fabs(scale));
  for (; i + 16 <= n; i += 16) {
    __m256i sign;
    const __m256i a = quotients16<T>(x + i * dtype_size(T), s, &sign);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), e4m3_codes16(a, signs<kNegative>(sign)));
  }
  if (i == n) return;
  const __m256 ss = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) store_low_bytes8(e4m3_encode8(_mm256_div_ps(load8(x, T, i), ss)), o + i);
  scalar::quantize_row(x + i * dtype_size(T), T, n - i, scale, o + i);
}

template <DType T>
KVC_AVX2_INLINE void quantize_tiles_as(const void* src, int64_t tiles, int64_t tile, int64_t stride,
                                       const float* scales, uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(T);
    if (std::signbit(scales[k])) quantize_tile<T, true>(x, tile, scales[k], out + k * tile);
    else quantize_tile<T, false>(x, tile, scales[k], out + k * tile);
  }
}

}  // namespace

KVC_AVX2 void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride,
                             const float* scales, uint8_t* out) {
  switch (t) {
    case DType::kBFloat16: return quantize_tiles_as<DType::kBFloat16>(src, tiles, tile, stride, scales, out);
    case DType::kFloat16: return quantize_tiles_as<DType::kFloat16>(src, tiles, tile, stride, scales, out);
    default: return quantize_tiles_as<DType::kFloat32>(src, tiles, tile, stride, scales, out);
  }
}

KVC_AVX2 void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  quantize_tiles(src, t, 1, n, n, &scale, out);
}

// Fast path (decodes_fast scales, bf16 or fp32 out): 16 codes per step widened through fp16 by
// F16C, as the AVX-512 decoder does: code c is the fp16 number (c & 0x7F) << 7 | (c & 0x80) << 8
// times 2^8, exactly, so one multiplication by 256 s gives each product.
KVC_AVX2 void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  const int64_t es = dtype_size(out_dtype);
  int64_t i = 0;
  if (out_dtype != DType::kFloat16 && decodes_fast(scale)) {
    const __m256 s256 = _mm256_set1_ps(scale * 256.0f);
    for (; i + 16 <= n; i += 16) {
      const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
      // c << 8 puts the sign at bit 15 and the rest at 8-14; an arithmetic shift by 1 moves the
      // rest to 7-13 and copies the sign into bit 14, which the mask clears
      const __m256i h = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(c, 8), 1),
                                         _mm256_set1_epi16(static_cast<int16_t>(0xBFFF)));
      const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
      const __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s256);
      const __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s256);
      uint8_t* o = out + i * es;
      if (out_dtype == DType::kFloat32) {
        const __m256 q = _mm256_castsi256_ps(splat(static_cast<int32_t>(kCanonicalNanBits)));
        const __m256 nl = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan)));
        const __m256 nh = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan, 1)));
        _mm256_storeu_ps(reinterpret_cast<float*>(o), _mm256_blendv_ps(lo, q, nl));
        _mm256_storeu_ps(reinterpret_cast<float*>(o) + 8, _mm256_blendv_ps(hi, q, nh));
      } else {  // round to nearest even on the bits (products are normal or 0), high words kept
        const __m256i ul = _mm256_castps_si256(lo), uh = _mm256_castps_si256(hi);
        const __m256i rl = _mm256_srli_epi32(_mm256_add_epi32(ul, _mm256_add_epi32(splat(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(ul, 16), splat(1)))), 16);
        const __m256i rh = _mm256_srli_epi32(_mm256_add_epi32(uh, _mm256_add_epi32(splat(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(uh, 16), splat(1)))), 16);
        // packus works per 128-bit half: quarters (lo 0-3, hi 0-3, lo 4-7, hi 4-7) put in order
        const __m256i r = _mm256_permute4x64_epi64(_mm256_packus_epi32(rl, rh), 0xD8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_blendv_epi8(r, _mm256_set1_epi16(0x7FC0), nan));
      }
    }
  }
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(e4m3_decode8(codes + i), s);
    uint8_t* o = out + i * es;
    if (out_dtype == DType::kFloat32) {
      const __m256i u = _mm256_castps_si256(v);
      const __m256i r = _mm256_blendv_epi8(u, splat(static_cast<int32_t>(kCanonicalNanBits)), is_nan8(u));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), r);
    } else {
      store_u16x8(out_dtype == DType::kBFloat16 ? to_bf16_8(v) : to_fp16_8(v), o);
    }
  }
  scalar::decode_row(codes + i, n - i, scale, out_dtype, out + i * es);
}

// e2m1 codes by 16-bit lanes, 16 per register (two per block), as the AVX-512 encoder does: x /
// 2^e is x's bf16 pattern with e taken off its exponent field, and the code's magnitude counts
// the rounding thresholds the pattern passes. AVX2 compares 16-bit lanes as signed: patterns
// are capped at 0x7FFF first (anything that large is past the top threshold anyway). Blocks
// holding inf or NaN, or with e < -100, are done again by the scalar loop after the others.
KVC_AVX2_INLINE bool has_inf_nan(__m256i m) {  // m: |x| patterns
  return _mm256_movemask_epi8(_mm256_cmpgt_epi16(m, _mm256_set1_epi16(0x7F7F))) != 0;
}
KVC_AVX2_INLINE __m256i abs_patterns(const uint16_t* x) {
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), _mm256_set1_epi16(0x7FFF));
}

KVC_AVX2 void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  // |v| > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5 as bf16 patterns (>= t as > t - 1)
  constexpr int16_t kAbove[] = {0x3E80, 0x3F3F, 0x3FA0, 0x3FDF, 0x4020, 0x405F, 0x40A0};
  // the low byte of each 32-bit lane (one packed byte per pair of values), 4 per 128-bit half
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  bool rare = false;
  for (int64_t b = 0; b < blocks; ++b) {
    const int32_t e = exps[b];
    rare |= e < -100;
    const __m256i shift = _mm256_set1_epi16(static_cast<int16_t>((e < 0 ? -e : e) << 7));
    __m256i bytes[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + b * kMxfp4Block + 16 * h));
      const __m256i m = _mm256_and_si256(v, _mm256_set1_epi16(0x7FFF));
      rare |= has_inf_nan(m);
      __m256i a = e >= 0 ? _mm256_subs_epu16(m, shift) : _mm256_adds_epu16(m, shift);
      a = _mm256_min_epu16(a, _mm256_set1_epi16(0x7FFF));
      __m256i code = _mm256_setzero_si256();
      for (int16_t t : kAbove) code = _mm256_sub_epi16(code, _mm256_cmpgt_epi16(a, _mm256_set1_epi16(t)));
      code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi16(v, 12), _mm256_set1_epi16(8)));  // sign
      // word pairs (even, odd) -> the low byte of their 32-bit lane: even | odd << 4
      bytes[h] = _mm256_shuffle_epi8(_mm256_or_si256(code, _mm256_srli_epi32(code, 12)), pick);
    }
    // dword 0 of each half holds 4 bytes: bytes[0] values 0-7 | 8-15, bytes[1] 16-23 | 24-31
    const __m256i both = _mm256_unpacklo_epi32(bytes[0], bytes[1]);  // halves: (0-7, 16-23), (8-15, 24-31)
    const __m128i r = _mm_unpacklo_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + b * kMxfp4Block / 2), r);
  }
  for (int64_t b = 0; rare && b < blocks; ++b) {
    const uint16_t* block = x + b * kMxfp4Block;
    if (exps[b] < -100 || has_inf_nan(abs_patterns(block)) || has_inf_nan(abs_patterns(block + 16)))
      scalar::e2m1_blocks(block, 1, &exps[b], packed + b * kMxfp4Block / 2);
  }
}

// MXFP4 decoding, 16 values (8 packed bytes) per step: each code picks its word from the scale
// byte's row of 16 by two 8-word permutes and a blend on the code's top bit.
KVC_AVX2 void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                                 const Mxfp4Words& words, uint8_t* out) {
  const bool bf16 = words.out_dtype == DType::kBFloat16;
  for (int64_t j = 0; j < blocks * 2; ++j) {  // two steps per block of 32
    const uint32_t* w = words.word[scale_bytes[j / 2]];
    const __m256i t0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i t1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + 8));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + 8 * j)));
    // 16-bit lane 2i: byte i's low nibble (value 2i); lane 2i + 1: its high nibble
    const __m256i idx = _mm256_and_si256(_mm256_or_si256(b, _mm256_slli_epi32(b, 12)), splat(0x000F000F));
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i i = _mm256_cvtepu16_epi32(h ? _mm256_extracti128_si256(idx, 1) : _mm256_castsi256_si128(idx));
      r[h] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(t0, i)),
                                                  _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(t1, i)),
                                                  _mm256_castsi256_ps(_mm256_slli_epi32(i, 28))));
    }
    if (bf16) {  // words < 2^16: packus keeps them; it packs per 128-bit half, hence the permute
      const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * j), p);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * j), r[0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * j + 32), r[1]);
    }
  }
}

}  // namespace kvc::cpu::avx2

#else  // not x86-64 with GCC-style intrinsics: the scalar code everywhere

namespace kvc::cpu::avx2 {
bool supported() { return false; }
float row_amax(const void* src, DType t, int64_t n) { return scalar::row_amax(src, t, n); }
void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  for (int64_t k = 0; k < tiles; ++k)
    amax[k] = scalar::row_amax(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile);
}
void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  scalar::quantize_row(src, t, n, scale, out);
}
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  scalar::decode_row(codes, n, scale, out_dtype, out);
}
void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, const float* scales,
                    uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k)
    scalar::quantize_row(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile, scales[k],
                         out + k * tile);
}
void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  scalar::e2m1_blocks(x, blocks, exps, packed);
}
void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out) {
  scalar::e2m1_decode_blocks(packed, scale_bytes, blocks, words, out);
}
}  // namespace kvc::cpu::avx2

#endif
