// The AVX-512 (F, BW, VL) + F16C vector the width-generic row loops (rows_simd.h) are written
// against: 32 words or 16 dwords per register, masks in mask registers. Each function is
// compiled for AVX-512 by its target attribute, so the library still loads on any x86-64;
// rows.cpp uses these only when avx512::supported() says the CPU has them.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's avx512fintrin.h seeds some intrinsics with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports inside the header (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "../../core/numerics.h"

#define KVC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define KVC_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"), always_inline)) inline
#define KVC_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,f16c")))

namespace kvc::cpu::avx512 {

// e4m3 codes of bf16 patterns in [0, 2^-6) (t = pattern - 0x3A80, saturated at 0: at most 2^-10,
// which rounds to 0), by t >> 4 = (exponent - 117) << 3 | top 3 mantissa bits: the code when the
// other 4 mantissa bits are 0 (a possible tie) and when they are not. Ties fall only there.
struct SubnormalCodes {
  alignas(64) uint16_t exact[32];
  alignas(64) uint16_t above[32];
};

// The code of (128 + m) x 2^(e - 134) (a bf16 pattern's value) in e4m3's 2^-9 steps, rounded to
// nearest even, by integers: a compile-time table, so no load order can see it unfilled.
constexpr uint16_t subnormal_code(uint32_t e, uint32_t m) {
  const uint32_t v = 128 + m, k = 125 - e;  // value / 2^-9 = v / 2^k, k in 5..8
  const uint32_t q = v >> k, r = v & ((1u << k) - 1), half = 1u << (k - 1);
  return static_cast<uint16_t>(q + (r > half || (r == half && (q & 1))));
}

constexpr SubnormalCodes make_subnormal_codes() {
  SubnormalCodes c{};
  for (uint32_t i = 0; i < 32; ++i) {
    c.exact[i] = subnormal_code(117 + (i >> 3), (i & 7) << 4);
    c.above[i] = subnormal_code(117 + (i >> 3), (i & 7) << 4 | 1);
  }
  return c;
}

inline constexpr SubnormalCodes kSubnormalCodes = make_subnormal_codes();

struct Vec {
  using I = __m512i;
  using F = __m512;
  using M16 = __mmask32;
  using M32 = __mmask16;
  static constexpr int64_t kWords = 32;
  static constexpr bool kWordPermute = true;  // vpermw: rare lanes by table, clamp and mask

  static KVC_AVX512_INLINE I zero() { return _mm512_setzero_si512(); }
  static KVC_AVX512_INLINE I set16(int32_t v) { return _mm512_set1_epi16(static_cast<int16_t>(v)); }
  static KVC_AVX512_INLINE I set32(int32_t v) { return _mm512_set1_epi32(v); }
  static KVC_AVX512_INLINE F set_ps(float v) { return _mm512_set1_ps(v); }
  static KVC_AVX512_INLINE I loadu(const void* p) { return _mm512_loadu_si512(p); }
  static KVC_AVX512_INLINE void storeu(void* p, I v) { _mm512_storeu_si512(p, v); }
  static KVC_AVX512_INLINE F loadu_ps(const float* p) { return _mm512_loadu_ps(p); }
  static KVC_AVX512_INLINE void storeu_ps(float* p, F v) { _mm512_storeu_ps(p, v); }

  static KVC_AVX512_INLINE I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static KVC_AVX512_INLINE I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static KVC_AVX512_INLINE I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static KVC_AVX512_INLINE I andnot(I a, I b) { return _mm512_andnot_si512(a, b); }
  static KVC_AVX512_INLINE I or_and(I r, I a, I m) { return _mm512_ternarylogic_epi32(r, a, m, 0xF8); }
  static KVC_AVX512_INLINE I add16(I a, I b) { return _mm512_add_epi16(a, b); }
  static KVC_AVX512_INLINE I sub16(I a, I b) { return _mm512_sub_epi16(a, b); }
  static KVC_AVX512_INLINE I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  static KVC_AVX512_INLINE I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  static KVC_AVX512_INLINE I srli16(I a, int n) { return _mm512_srli_epi16(a, n); }
  static KVC_AVX512_INLINE I slli16(I a, int n) { return _mm512_slli_epi16(a, n); }
  static KVC_AVX512_INLINE I srai16(I a, int n) { return _mm512_srai_epi16(a, n); }
  static KVC_AVX512_INLINE I srli32(I a, int n) { return _mm512_srli_epi32(a, n); }
  static KVC_AVX512_INLINE I slli32(I a, int n) { return _mm512_slli_epi32(a, n); }
  static KVC_AVX512_INLINE I adds_u16(I a, I b) { return _mm512_adds_epu16(a, b); }
  static KVC_AVX512_INLINE I subs_u16(I a, I b) { return _mm512_subs_epu16(a, b); }
  static KVC_AVX512_INLINE I min_u16(I a, I b) { return _mm512_min_epu16(a, b); }
  static KVC_AVX512_INLINE I min_i32(I a, I b) { return _mm512_min_epi32(a, b); }

  static KVC_AVX512_INLINE M16 gt16(I a, I b) { return _mm512_cmpgt_epu16_mask(a, b); }
  static KVC_AVX512_INLINE M16 eq16(I a, I b) { return _mm512_cmpeq_epi16_mask(a, b); }
  static KVC_AVX512_INLINE M16 lt_u16(I a, I b) { return _mm512_cmplt_epu16_mask(a, b); }
  static KVC_AVX512_INLINE M32 gt32(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static KVC_AVX512_INLINE M32 lt32(I a, I b) { return _mm512_cmplt_epi32_mask(a, b); }
  static KVC_AVX512_INLINE M16 no_lanes() { return 0; }
  static KVC_AVX512_INLINE I select16(M16 m, I a, I b) { return _mm512_mask_mov_epi16(a, m, b); }
  static KVC_AVX512_INLINE I select32(M32 m, I a, I b) { return _mm512_mask_mov_epi32(a, m, b); }
  static KVC_AVX512_INLINE F select_ps(M32 m, F a, F b) { return _mm512_mask_mov_ps(a, m, b); }

  static KVC_AVX512_INLINE F as_ps(I a) { return _mm512_castsi512_ps(a); }
  static KVC_AVX512_INLINE I as_si(F a) { return _mm512_castps_si512(a); }
  static KVC_AVX512_INLINE F add_ps(F a, F b) { return _mm512_add_ps(a, b); }
  static KVC_AVX512_INLINE F mul_ps(F a, F b) { return _mm512_mul_ps(a, b); }
  static KVC_AVX512_INLINE F div_ps(F a, F b) { return _mm512_div_ps(a, b); }
  static KVC_AVX512_INLINE F fp16_lo(I a) { return _mm512_cvtph_ps(_mm512_castsi512_si256(a)); }
  static KVC_AVX512_INLINE F fp16_hi(I a) { return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(a, 1)); }
  static KVC_AVX512_INLINE M32 lo_mask32(M16 m) { return static_cast<__mmask16>(m); }
  static KVC_AVX512_INLINE M32 hi_mask32(M16 m) { return static_cast<__mmask16>(m >> 16); }

  static KVC_AVX512_INLINE F load_floats(const void* src, DType t, int64_t i) {
    if (t == DType::kFloat32) return _mm512_loadu_ps(static_cast<const float*>(src) + i);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + i));
    if (t == DType::kFloat16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static KVC_AVX512_INLINE I load_bytes_as_words(const uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  static KVC_AVX512_INLINE I high_words(I lo, I hi) {
    const __m512i odd_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                               31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(lo, odd_words, hi);
  }
  static KVC_AVX512_INLINE I interleave_high_words(I even, I odd) {
    const __m512i pick = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19, 49, 17,
                                          47, 15, 45, 13, 43, 11, 41, 9, 39, 7, 37, 5, 35, 3, 33, 1);
    return _mm512_permutex2var_epi16(even, pick, odd);
  }
  static KVC_AVX512_INLINE I sticky16(I u) {
    return _mm512_mask_or_epi32(u, _mm512_test_epi32_mask(u, set32(0xFFFF)), u, set32(0x10000));
  }

  // high bytes of the 32 words: per 128-bit lane into its low 8 bytes, then the lanes' halves
  static KVC_AVX512_INLINE void store_high_bytes(I r, uint8_t* out) {
    const __m512i bytes = _mm512_shuffle_epi8(r, _mm512_set4_epi32(-1, -1, 0x0F0D0B09, 0x07050301));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                        _mm512_castsi512_si256(_mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), bytes)));
  }
  static KVC_AVX512_INLINE void store_dword_bytes(I r, uint8_t* out) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(r));
  }
  static KVC_AVX512_INLINE void store_dword_words(I r, uint8_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(r));
  }

  static KVC_AVX512_INLINE bool rare_lanes(I a, M16 extra) {
    return (_mm512_cmpgt_epu16_mask(sub16(a, set16(0x3C80)), set16(0x43E8 - 0x3C80)) | extra) != 0;
  }
  // the words of sign's bit 15 | the e4m3 code (high byte) of bf16 patterns a below 2^-6
  static KVC_AVX512_INLINE I subnormal_code_words(I a, I sign) {
    const __m512i t = _mm512_subs_epu16(a, set16(0x3A80));
    const __m512i idx = _mm512_srli_epi16(t, 4);
    __m512i sub = _mm512_permutexvar_epi16(idx, _mm512_load_si512(kSubnormalCodes.above));
    sub = _mm512_mask_permutexvar_epi16(sub, _mm512_testn_epi16_mask(t, set16(15)), idx,
                                        _mm512_load_si512(kSubnormalCodes.exact));
    return or_and(_mm512_slli_epi16(sub, 8), sign, set16(0x8000));
  }

  static KVC_AVX512_INLINE I max_le_u16(I m, I a, I lim) {
    return _mm512_mask_max_epu16(m, _mm512_cmple_epu16_mask(a, lim), m, a);
  }
  static KVC_AVX512_INLINE I max_le_i32(I m, I a, I lim) {
    return _mm512_mask_max_epi32(m, _mm512_cmple_epi32_mask(a, lim), m, a);
  }
  static KVC_AVX512_INLINE uint32_t hmax_u16(I m) {
    const __m256i m256 = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
    const __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
    return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi32(-1)))));
  }
  static KVC_AVX512_INLINE uint32_t hmax_i32(I m) { return static_cast<uint32_t>(_mm512_reduce_max_epi32(m)); }
};

}  // namespace kvc::cpu::avx512

#endif
