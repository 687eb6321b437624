// The AVX2 + F16C vector the width-generic row loops (rows_simd.h) are written against: 16 words
// or 8 dwords per register, masks as vectors of all-ones / zero lanes. Each function is compiled
// for AVX2 by its target attribute, so the library keeps the baseline ISA elsewhere; rows.cpp
// uses these only when avx2::supported() says the CPU has both.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

#include "../../core/numerics.h"

#define KVC_AVX2 __attribute__((target("avx2,f16c")))
#define KVC_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace kvc::cpu::avx2 {

struct Vec {
  using I = __m256i;
  using F = __m256;
  using M16 = __m256i;  // 0 / 0xFFFF per word
  using M32 = __m256i;  // 0 / 0xFFFFFFFF per dword
  static constexpr int64_t kWords = 16;
  static constexpr bool kWordPermute = false;  // no vpermw: rare lanes re-encoded by dwords

  static KVC_AVX2_INLINE I zero() { return _mm256_setzero_si256(); }
  static KVC_AVX2_INLINE I set16(int32_t v) { return _mm256_set1_epi16(static_cast<int16_t>(v)); }
  static KVC_AVX2_INLINE I set32(int32_t v) { return _mm256_set1_epi32(v); }
  static KVC_AVX2_INLINE F set_ps(float v) { return _mm256_set1_ps(v); }
  static KVC_AVX2_INLINE I loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static KVC_AVX2_INLINE void storeu(void* p, I v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
  static KVC_AVX2_INLINE F loadu_ps(const float* p) { return _mm256_loadu_ps(p); }
  static KVC_AVX2_INLINE void storeu_ps(float* p, F v) { _mm256_storeu_ps(p, v); }

  static KVC_AVX2_INLINE I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static KVC_AVX2_INLINE I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static KVC_AVX2_INLINE I xor_(I a, I b) { return _mm256_xor_si256(a, b); }
  static KVC_AVX2_INLINE I andnot(I a, I b) { return _mm256_andnot_si256(a, b); }  // ~a & b
  static KVC_AVX2_INLINE I or_and(I r, I a, I m) { return or_(r, and_(a, m)); }     // r | (a & m)
  static KVC_AVX2_INLINE I add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static KVC_AVX2_INLINE I sub16(I a, I b) { return _mm256_sub_epi16(a, b); }
  static KVC_AVX2_INLINE I add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static KVC_AVX2_INLINE I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  static KVC_AVX2_INLINE I srli16(I a, int n) { return _mm256_srli_epi16(a, n); }
  static KVC_AVX2_INLINE I slli16(I a, int n) { return _mm256_slli_epi16(a, n); }
  static KVC_AVX2_INLINE I srai16(I a, int n) { return _mm256_srai_epi16(a, n); }
  static KVC_AVX2_INLINE I srli32(I a, int n) { return _mm256_srli_epi32(a, n); }
  static KVC_AVX2_INLINE I slli32(I a, int n) { return _mm256_slli_epi32(a, n); }
  static KVC_AVX2_INLINE I adds_u16(I a, I b) { return _mm256_adds_epu16(a, b); }
  static KVC_AVX2_INLINE I subs_u16(I a, I b) { return _mm256_subs_epu16(a, b); }
  static KVC_AVX2_INLINE I min_u16(I a, I b) { return _mm256_min_epu16(a, b); }
  static KVC_AVX2_INLINE I min_i32(I a, I b) { return _mm256_min_epi32(a, b); }

  // signed compares (the loops compare only patterns below 0x8000 / 0x80000000 this way)
  static KVC_AVX2_INLINE M16 gt16(I a, I b) { return _mm256_cmpgt_epi16(a, b); }
  static KVC_AVX2_INLINE M16 eq16(I a, I b) { return _mm256_cmpeq_epi16(a, b); }
  static KVC_AVX2_INLINE M32 gt32(I a, I b) { return _mm256_cmpgt_epi32(a, b); }
  static KVC_AVX2_INLINE M32 lt32(I a, I b) { return _mm256_cmpgt_epi32(b, a); }
  static KVC_AVX2_INLINE M16 no_lanes() { return zero(); }
  // select(m, a, b): b where m is set, else a
  static KVC_AVX2_INLINE I select16(M16 m, I a, I b) { return _mm256_blendv_epi8(a, b, m); }
  static KVC_AVX2_INLINE I select32(M32 m, I a, I b) { return _mm256_blendv_epi8(a, b, m); }
  static KVC_AVX2_INLINE F select_ps(M32 m, F a, F b) { return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m)); }

  static KVC_AVX2_INLINE F as_ps(I a) { return _mm256_castsi256_ps(a); }
  static KVC_AVX2_INLINE I as_si(F a) { return _mm256_castps_si256(a); }
  static KVC_AVX2_INLINE F add_ps(F a, F b) { return _mm256_add_ps(a, b); }
  static KVC_AVX2_INLINE F mul_ps(F a, F b) { return _mm256_mul_ps(a, b); }
  static KVC_AVX2_INLINE F div_ps(F a, F b) { return _mm256_div_ps(a, b); }
  // fp16 words 0-7 / 8-15 of a as floats (F16C)
  static KVC_AVX2_INLINE F fp16_lo(I a) { return _mm256_cvtph_ps(_mm256_castsi256_si128(a)); }
  static KVC_AVX2_INLINE F fp16_hi(I a) { return _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)); }
  // word masks of elements 0-7 / 8-15 as dword masks
  static KVC_AVX2_INLINE M32 lo_mask32(M16 m) { return _mm256_cvtepi16_epi32(_mm256_castsi256_si128(m)); }
  static KVC_AVX2_INLINE M32 hi_mask32(M16 m) { return _mm256_cvtepi16_epi32(_mm256_extracti128_si256(m, 1)); }

  // 8 values of dtype t at src[i..i+8) as floats (exact widening)
  static KVC_AVX2_INLINE F load_floats(const void* src, DType t, int64_t i) {
    if (t == DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(src) + i);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + i));
    if (t == DType::kFloat16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 16 bytes as 16 words
  static KVC_AVX2_INLINE I load_bytes_as_words(const uint8_t* p) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }

  // the high words of lo's and hi's dwords, in order (elements 0-7 from lo, 8-15 from hi)
  static KVC_AVX2_INLINE I high_words(I lo, I hi) {  // packus works per 128-bit half, hence the permute
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(srli32(lo, 16), srli32(hi, 16)), 0xD8);
  }
  // word 2j from even's dword j, word 2j + 1 from odd's dword j (their high words)
  static KVC_AVX2_INLINE I interleave_high_words(I even, I odd) {
    return _mm256_blend_epi16(srli32(even, 16), odd, 0xAA);
  }
  // bit 16 |= any of bits 0-15 (the low word is dropped after): rounding to odd
  static KVC_AVX2_INLINE I sticky16(I u) { return or_(u, add32(and_(u, set32(0xFFFF)), set32(0xFFFF))); }

  // the high bytes of the 16 words as 16 bytes
  static KVC_AVX2_INLINE void store_high_bytes(I r, uint8_t* out) {
    const __m256i pick = _mm256_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                          1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, pick), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(b));
  }
  // the low bytes of the 8 dwords as 8 bytes
  static KVC_AVX2_INLINE void store_dword_bytes(I r, uint8_t* out) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i p = _mm256_shuffle_epi8(r, pick);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out),
                     _mm_unpacklo_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
  }
  // the low words of the 8 dwords (each below 2^16) as 16 bytes
  static KVC_AVX2_INLINE void store_dword_words(I r, uint8_t* out) {
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }

  // any lane of a outside [0x3C80, 0x43E8] (e4m3's normal range up to 464) or set in extra
  static KVC_AVX2_INLINE bool rare_lanes(I a, M16 extra) {
    const __m256i beyond = or_(subs_u16(sub16(a, set16(0x3C80)), set16(0x43E8 - 0x3C80)), extra);
    return !_mm256_testz_si256(beyond, beyond);
  }

  // m = max(m, a) over the lanes where a <= lim (signed words / dwords)
  static KVC_AVX2_INLINE I max_le_u16(I m, I a, I lim) { return _mm256_max_epu16(m, andnot(gt16(a, lim), a)); }
  static KVC_AVX2_INLINE I max_le_i32(I m, I a, I lim) { return _mm256_max_epi32(m, andnot(gt32(a, lim), a)); }
  // the largest word (the complement's minimum: phminposuw takes 8 words in one step) / dword
  static KVC_AVX2_INLINE uint32_t hmax_u16(I m) {
    const __m128i x = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(x, _mm_set1_epi32(-1)))));
  }
  static KVC_AVX2_INLINE uint32_t hmax_i32(I m) {
    __m128i x = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    x = _mm_max_epi32(x, _mm_srli_si128(x, 8));
    x = _mm_max_epi32(x, _mm_srli_si128(x, 4));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
  }
};

}  // namespace kvc::cpu::avx2

#endif
