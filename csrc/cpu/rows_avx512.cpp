// AVX-512 versions of rows.cpp's encoding loops (amax, e4m3 and MXFP4 encoding) and its
// streaming copy, the same bytes as the scalar code (tests/rows_exhaustive.cpp compares them on
// every float, every bf16 / fp16 pattern under many scales, every MXFP4 block exponent). Compiled
// for AVX-512 F/BW/VL by target attributes (avx512.h), function by function; rows.cpp calls these
// only when supported() says the CPU has them. Decoding: rows_avx512_decode.cpp.
//
// Encoding runs 32 values per instruction in 16-bit lanes (the loop is bound by instructions
// issued, not by the division): each quotient |x| / |s| is cut to a bf16 pattern rounded to odd
// (the 16 dropped bits stick to the kept lowest bit), which rounds to the same e4m3 code as the
// float itself (8 significant bits >= 4 + 2, so the second rounding cannot be misled). Codes in
// e4m3's normal range up to 464 are then a rounding of that pattern's top bits; the rare lanes
// (below 2^-6, above 464, inf, NaN) are done over by table, clamp and mask only when a group of
// 32 has one. A bf16 tile over a power-of-two scale skips the division: the quotient's pattern
// is the input's with the exponent field shifted.
#include "rows.h"

#include "../core/v4_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512.h"

namespace kvc::cpu::avx512 {
namespace {

// 16 values of dtype t at src[i..i+16) as floats (exact widening).
KVC_AVX512_INLINE __m512 load16(const void* src, DType t, int64_t i) {
  if (t == DType::kFloat32) return _mm512_loadu_ps(static_cast<const float*>(src) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + i));
  if (t == DType::kFloat16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e4m3_encode_soft (numerics.h) on 16 lanes: codes in the low byte of each 32-bit lane. The
// normal-range code rises with |x|, and is exactly 0x7E at 448, so saturation is a minimum.
KVC_AVX512_INLINE __m512i e4m3_encode16(__m512 q) {
  const __m512i bits = _mm512_castps_si512(q);
  const __m512i a = _mm512_and_si512(bits, splat(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), splat(0x80));
  __m512i normal = _mm512_add_epi32(a, splat(0x7FFFF));
  normal = _mm512_add_epi32(normal, _mm512_and_si512(_mm512_srli_epi32(a, 20), splat(1)));
  normal = _mm512_sub_epi32(_mm512_srli_epi32(normal, 20), splat(120 << 3));
  const __m512 shifted = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(16384.0f));
  const __m512i subnormal = _mm512_sub_epi32(_mm512_castps_si512(shifted), splat(0x46800000));
  __m512i r = _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(a, splat(0x3C800000)), normal, subnormal);
  r = _mm512_or_si512(_mm512_min_epi32(r, splat(0x7E)), sign);
  return _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(a, splat(0x7F800000)), splat(0x7F));
}

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

constexpr SubnormalCodes kSubnormalCodes = make_subnormal_codes();

// |q| of 16 + 16 values (nonnegative floats or NaN) as bf16 patterns rounded to odd, 32 words:
// interleaved (word 2j from even lane j, 2j + 1 from odd lane j) or in order (lo then hi).
KVC_AVX512_INLINE __m512i sticky16(__m512i u) {
  return _mm512_mask_or_epi32(u, _mm512_test_epi32_mask(u, splat(0xFFFF)), u, splat(0x10000));
}
KVC_AVX512_INLINE __m512i bf16_odd_interleaved(__m512 even, __m512 odd) {
  const __m512i pick = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19, 49, 17,
                                        47, 15, 45, 13, 43, 11, 41, 9, 39, 7, 37, 5, 35, 3, 33, 1);
  return _mm512_permutex2var_epi16(sticky16(_mm512_castps_si512(even)), pick, sticky16(_mm512_castps_si512(odd)));
}
KVC_AVX512_INLINE __m512i high_words(__m512i lo, __m512i hi) {
  const __m512i odd_words = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                             31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(lo, odd_words, hi);
}
KVC_AVX512_INLINE __m512i bf16_odd_ordered(__m512 lo, __m512 hi) {
  return high_words(sticky16(_mm512_castps_si512(lo)), sticky16(_mm512_castps_si512(hi)));
}

// 32 codes from 32 such patterns a; bit 15 of each word of sign is the code's sign. Normal
// range: round the 7 mantissa bits to 3 (nearest even) with the exponent rebased 127 -> 7,
// computed as code << 8 so that the sign merges at bit 15 and the high bytes are the codes.
// Up to a = 0x43E8 (464, which rounds to 448: every quotient of a tile by its own scale) no
// clamp is needed; below 2^-6 (e4m3 subnormals), above 464 (saturation, inf) and NaN are rare
// lanes, done over only when a group of 32 has one.
KVC_AVX512_INLINE __m512i normal_code_words(__m512i c, __m512i sign) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(c, 4), _mm512_set1_epi16(1));
  const __m512i r = _mm512_slli_epi16(_mm512_add_epi16(_mm512_add_epi16(c, _mm512_set1_epi16(7 - 0x3C00)), lsb), 4);
  return _mm512_ternarylogic_epi32(r, sign, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);  // r | sign bit
}

// nan: lanes known to be NaN whatever a holds.
KVC_AVX512_INLINE __m256i e4m3_codes32(__m512i a, __m512i sign, __mmask32 nan = 0) {
  const __m512i high_bit = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
  __m512i r = normal_code_words(a, sign);
  const __mmask32 rare = _mm512_cmpgt_epu16_mask(_mm512_sub_epi16(a, _mm512_set1_epi16(0x3C80)),
                                                 _mm512_set1_epi16(0x43E8 - 0x3C80)) | nan;
  if (__builtin_expect(rare != 0, 0)) {
    r = normal_code_words(_mm512_min_epu16(a, _mm512_set1_epi16(0x43E0)), sign);  // >= 448, inf: 0x7E
    const __m512i t = _mm512_subs_epu16(a, _mm512_set1_epi16(0x3A80));
    const __m512i idx = _mm512_srli_epi16(t, 4);
    __m512i sub = _mm512_permutexvar_epi16(idx, _mm512_load_si512(kSubnormalCodes.above));
    sub = _mm512_mask_permutexvar_epi16(sub, _mm512_testn_epi16_mask(t, _mm512_set1_epi16(15)), idx,
                                        _mm512_load_si512(kSubnormalCodes.exact));
    sub = _mm512_ternarylogic_epi32(_mm512_slli_epi16(sub, 8), sign, high_bit, 0xF8);
    r = _mm512_mask_mov_epi16(r, _mm512_cmplt_epu16_mask(a, _mm512_set1_epi16(0x3C80)), sub);
    r = _mm512_mask_mov_epi16(r, _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(0x7F80)) | nan, _mm512_set1_epi16(0x7F00));
  }
  // high bytes of the 32 words: per 128-bit lane into its low 8 bytes, then the lanes' halves
  const __m512i pick = _mm512_set4_epi32(-1, -1, 0x0F0D0B09, 0x07050301);
  const __m512i bytes = _mm512_shuffle_epi8(r, pick);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), bytes));
}

}  // namespace

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
}

// max of the 32 words of m (the complement's minimum: phminposuw takes 8 words in one step).
KVC_AVX512_INLINE uint16_t max_u16(__m512i m) {
  const __m256i m256 = _mm256_max_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
  const __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi32(-1)))));
}

// As the AVX2 version: 16-bit inputs compared as 16-bit patterns (NaN patterns count as 0).
KVC_AVX512 void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  const __m512i abs16 = _mm512_set1_epi16(0x7FFF), abs32 = splat(0x7FFFFFFF), inf32 = splat(0x7F800000);
  const __m512i inf16 = _mm512_set1_epi16(t == DType::kBFloat16 ? 0x7F80 : 0x7C00);
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(t);
    int64_t i = 0;
    float top = 0.0f;
    if (t == DType::kFloat32) {
      const float* f = reinterpret_cast<const float*>(x);
      __m512i m = _mm512_setzero_si512();
      for (; i + 16 <= tile; i += 16) {
        const __m512i a = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(f + i)), abs32);
        m = _mm512_mask_max_epi32(m, _mm512_cmple_epi32_mask(a, inf32), m, a);
      }
      top = bits_float(static_cast<uint32_t>(_mm512_reduce_max_epi32(m)));
    } else {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(x);
      __m512i m = _mm512_setzero_si512();
      for (; i + 32 <= tile; i += 32) {
        const __m512i a = _mm512_and_si512(_mm512_loadu_si512(h + i), abs16);
        m = _mm512_mask_max_epu16(m, _mm512_cmple_epu16_mask(a, inf16), m, a);
      }
      const uint16_t w = max_u16(m);
      top = t == DType::kBFloat16 ? bf16_to_float(w) : fp16_to_float(w);
    }
    const float rest = i < tile ? scalar::row_amax(x + i * dtype_size(t), t, tile - i) : 0.0f;
    amax[k] = rest > top ? rest : top;
  }
}

KVC_AVX512 float row_amax(const void* src, DType t, int64_t n) {
  float amax;
  tile_amax(src, t, 1, n, n, &amax);
  return amax;
}

// 32 values from x as bf16 patterns of |x| / s rounded to odd, and their signs (bit 15).
template <DType T>
KVC_AVX512_INLINE __m512i quotients32(const void* x, __m512 s, __m512i* sign) {
  const __m512i abs16 = _mm512_set1_epi16(0x7FFF), abs32 = splat(0x7FFFFFFF);
  if constexpr (T == DType::kFloat32) {
    const float* f = static_cast<const float*>(x);
    const __m512i lo = _mm512_loadu_si512(f), hi = _mm512_loadu_si512(f + 16);
    *sign = high_words(lo, hi);
    return bf16_odd_ordered(_mm512_div_ps(_mm512_castsi512_ps(_mm512_and_si512(lo, abs32)), s),
                            _mm512_div_ps(_mm512_castsi512_ps(_mm512_and_si512(hi, abs32)), s));
  } else {
    const __m512i h = _mm512_loadu_si512(x);
    const __m512i m = _mm512_and_si512(h, abs16);
    *sign = h;
    if constexpr (T == DType::kBFloat16)  // even elements: the low words moved up; odd: the high words
      return bf16_odd_interleaved(_mm512_div_ps(_mm512_castsi512_ps(_mm512_slli_epi32(m, 16)), s),
                                  _mm512_div_ps(_mm512_castsi512_ps(_mm512_andnot_si512(splat(0xFFFF), m)), s));
    return bf16_odd_ordered(_mm512_div_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(m)), s),
                            _mm512_div_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(m, 1)), s));
  }
}

// One tile: |x| / |s| (the IEEE quotient's magnitude), the sign of x / s attached by bits
// (flipped for a negative scale).
template <bool kNegative>
KVC_AVX512_INLINE __m512i signs(__m512i sign) {
  return kNegative ? _mm512_xor_si512(sign, _mm512_set1_epi16(static_cast<int16_t>(0x8000))) : sign;
}

// bf16 / 2^e is the bf16 pattern with e taken off its exponent field, exactly, while both are
// normal; otherwise the quotient is < 2^-26 (|e| <= 100), whose code is 0 either way, or it
// saturates to inf. NaN lanes are passed on as such. Returns how many values were coded.
template <bool kNegative, bool kDown>
KVC_AVX512_INLINE int64_t pow2_codes(const uint8_t* x, int64_t n, int32_t abs_e, uint8_t* o) {
  const __m512i shift = _mm512_set1_epi16(static_cast<int16_t>(abs_e << 7));
  const __m512i inf = _mm512_set1_epi16(0x7F80);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i h = _mm512_loadu_si512(x + i * 2);
    const __m512i m = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
    const __m512i a = kDown ? _mm512_subs_epu16(m, shift) : _mm512_min_epu16(_mm512_adds_epu16(m, shift), inf);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                        e4m3_codes32(a, signs<kNegative>(h), _mm512_cmpgt_epu16_mask(m, inf)));
  }
  return i;
}

template <DType T, bool kNegative>
KVC_AVX512_INLINE void quantize_tile(const uint8_t* x, int64_t n, float scale, uint8_t* o) {
  int64_t i = 0;
  const int32_t e = pow2_exponent(scale);
  if (T == DType::kBFloat16 && e != kNotPow2) {
    i = e > 0 ? pow2_codes<kNegative, true>(x, n, e, o) : pow2_codes<kNegative, false>(x, n, -e, o);
  }
  const __m512 s = _mm512_set1_ps(std::fabs(scale));
  for (; i + 32 <= n; i += 32) {
    __m512i sign;
    const __m512i a = quotients32<T>(x + i * dtype_size(T), s, &sign);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), e4m3_codes32(a, signs<kNegative>(sign)));
  }
  if (i == n) return;
  const __m512 ss = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm512_cvtepi32_epi8(e4m3_encode16(_mm512_div_ps(load16(x, T, i), ss))));
  scalar::quantize_row(x + i * dtype_size(T), T, n - i, scale, o + i);
}

template <DType T>
KVC_AVX512_INLINE void quantize_tiles_as(const void* src, int64_t tiles, int64_t tile, int64_t stride,
                                         const float* scales, uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k) {
    const uint8_t* x = static_cast<const uint8_t*>(src) + k * stride * dtype_size(T);
    if (std::signbit(scales[k])) quantize_tile<T, true>(x, tile, scales[k], out + k * tile);
    else quantize_tile<T, false>(x, tile, scales[k], out + k * tile);
  }
}

KVC_AVX512 void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride,
                               const float* scales, uint8_t* out) {
  switch (t) {
    case DType::kBFloat16: return quantize_tiles_as<DType::kBFloat16>(src, tiles, tile, stride, scales, out);
    case DType::kFloat16: return quantize_tiles_as<DType::kFloat16>(src, tiles, tile, stride, scales, out);
    default: return quantize_tiles_as<DType::kFloat32>(src, tiles, tile, stride, scales, out);
  }
}

KVC_AVX512 void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  quantize_tiles(src, t, 1, n, n, &scale, out);
}

// e2m1 codes by 16-bit lanes: x / 2^e is x's bf16 pattern with e taken off its exponent field
// (exact while normal; below that < 2^-26 and coded 0 either way, for e >= -100), and the code's
// magnitude is the number of rounding thresholds the pattern passes (patterns order as values).
// Every threshold sits at a multiple of 32 patterns or one below, so that number depends only on
// the pattern's 32-step q = a >> 5 and on whether its low 5 bits are 0: one 64-entry table,
// indexed by q - 499 (clamped to 0..31; q < 500 is below every threshold, q >= 530 past all of
// them) + 32 when the low bits are not 0. Blocks holding inf or NaN, or with e < -100, are done
// again by the scalar loop after the others (no call inside the loop, so constants stay in
// registers).
// |v| > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5 as bf16 patterns (>= t as > t - 1)
constexpr uint16_t kE2m1Above[] = {0x3E80, 0x3F3F, 0x3FA0, 0x3FDF, 0x4020, 0x405F, 0x40A0};
struct E2m1Table {
  alignas(64) int16_t lo[32];  // codes of q * 32
  alignas(64) int16_t hi[32];  // codes of q * 32 + 1 .. q * 32 + 31
};
constexpr int16_t e2m1_magnitude(uint32_t a) {
  int16_t n = 0;
  for (uint16_t t : kE2m1Above) n += a > t ? 1 : 0;
  return n;
}
constexpr E2m1Table make_e2m1_table() {
  E2m1Table t{};
  for (uint32_t i = 1; i < 32; ++i) {
    t.lo[i] = e2m1_magnitude((499 + i) * 32);
    t.hi[i] = e2m1_magnitude((499 + i) * 32 + 1);
  }
  return t;
}
constexpr E2m1Table kE2m1Table = make_e2m1_table();
static_assert(e2m1_magnitude(499 * 32 + 31) == 0 && e2m1_magnitude(530 * 32) == 7);

KVC_AVX512_INLINE bool e2m1_rare(__m512i m, int32_t e) {
  return e < -100 || _mm512_cmpge_epu16_mask(m, _mm512_set1_epi16(0x7F80)) != 0;
}

KVC_AVX512 void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  const __m512i lo = _mm512_load_si512(kE2m1Table.lo), hi = _mm512_load_si512(kE2m1Table.hi);
  bool rare = false;
  for (int64_t b = 0; b < blocks; ++b) {
    const int32_t e = exps[b];
    const __m512i h = _mm512_loadu_si512(x + b * kMxfp4Block);
    const __m512i m = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
    rare |= e2m1_rare(m, e);
    const __m512i shift = _mm512_set1_epi16(static_cast<int16_t>((e < 0 ? -e : e) << 7));
    const __m512i a = e >= 0 ? _mm512_subs_epu16(m, shift) : _mm512_adds_epu16(m, shift);
    __m512i idx = _mm512_min_epu16(_mm512_subs_epu16(_mm512_srli_epi16(a, 5), _mm512_set1_epi16(499)),
                                   _mm512_set1_epi16(31));
    idx = _mm512_mask_add_epi16(idx, _mm512_test_epi16_mask(a, _mm512_set1_epi16(0x1F)), idx, _mm512_set1_epi16(32));
    __m512i code = _mm512_permutex2var_epi16(lo, idx, hi);
    code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi16(h, 12), _mm512_set1_epi16(8), 0xF8);  // | sign
    // word pairs (even, odd) -> one byte: even | odd << 4
    const __m512i pairs = _mm512_or_si512(code, _mm512_srli_epi32(code, 12));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + b * kMxfp4Block / 2), _mm512_cvtepi32_epi8(pairs));
  }
  for (int64_t b = 0; rare && b < blocks; ++b) {
    const __m512i m = _mm512_and_si512(_mm512_loadu_si512(x + b * kMxfp4Block), _mm512_set1_epi16(0x7FFF));
    if (e2m1_rare(m, exps[b])) scalar::e2m1_blocks(x + b * kMxfp4Block, 1, &exps[b], packed + b * kMxfp4Block / 2);
  }
}

// 16-B stores up to dst's first 64-B boundary, whole lines by one store each, 16-B ones after.
KVC_AVX512 void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  int64_t i = 0;
  for (; i < bytes && (reinterpret_cast<uintptr_t>(dst + i) & 63) != 0; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  for (; i + 64 <= bytes; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
  for (; i < bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
}

}  // namespace kvc::cpu::avx512

#else  // not x86-64 with GCC-style intrinsics: the scalar code everywhere

namespace kvc::cpu::avx512 {
bool supported() { return false; }
float row_amax(const void* src, DType t, int64_t n) { return scalar::row_amax(src, t, n); }
void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  scalar::quantize_row(src, t, n, scale, out);
}
void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  for (int64_t k = 0; k < tiles; ++k)
    amax[k] = scalar::row_amax(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile);
}
void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, const float* scales,
                    uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k)
    scalar::quantize_row(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile, scales[k],
                         out + k * tile);
}
void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes) { scalar::stream_copy(dst, src, bytes); }
void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  scalar::e2m1_blocks(x, blocks, exps, packed);
}
}  // namespace kvc::cpu::avx512

#endif
