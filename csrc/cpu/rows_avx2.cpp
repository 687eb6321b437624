// AVX2 + F16C row loops, the same bytes as the scalar code: amax, e4m3 encoding and decoding
// from the width-generic loops (simd/rows_simd.h) on the 16-word vector (simd/vec_avx2.h);
// MXFP4 by its own algorithm at this width (no word permute: thresholds counted by compares,
// words picked by two dword permutes). rows.cpp calls these only when supported() says the CPU
// has AVX2 and F16C.
#include "rows.h"

#include "../core/v4_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "simd/vec_avx2.h"
#define KVC_SIMD_ISA avx2
#define KVC_SIMD_TARGET KVC_AVX2
#define KVC_SIMD_INLINE KVC_AVX2_INLINE
#include "simd/rows_simd.h"  // this ISA's amax, e4m3 encoding and decoding
#undef KVC_SIMD_INLINE
#undef KVC_SIMD_TARGET
#undef KVC_SIMD_ISA

namespace kvc::cpu::avx2 {

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

namespace {
KVC_AVX2_INLINE __m256i splat(int32_t v) { return _mm256_set1_epi32(v); }
}  // namespace

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

namespace kvc::cpu::avx2 {
const RowLoops loops{"avx2", row_amax, quantize_row, tile_amax, quantize_tiles, decode_row, scalar::stream_copy,
                     e2m1_blocks, e2m1_decode_blocks};
}  // namespace kvc::cpu::avx2
