// AVX-512 versions of rows.cpp's decoding loops (e4m3 codes to bf16 / fp16 / fp32 values, MXFP4
// blocks by table), the same bytes as the scalar code (tests/rows_exhaustive.cpp compares them on
// every code under many scales and every packed MXFP4 byte under every scale byte). Compiled for
// AVX-512 F/BW/VL, and BF16 for decode_row_bf16, by target attributes (avx512.h); rows.cpp calls
// these only when supported() / bf16_supported() say the CPU has them.
//
// Decoding widens the codes to fp16 in hardware: an e4m3 code c is the fp16 number with bits
// (c & 0x7F) << 7 | (c & 0x80) << 8 times 2^8, exactly (e4m3's exponent bias is 7, fp16's 15;
// e4m3 subnormals land on fp16 subnormals), so vcvtph2ps and one multiplication by 256 give the
// code's value.
#include "rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "avx512.h"

namespace kvc::cpu::avx512 {
namespace {

// 16 codes as their exact values (NaN codes as NaN).
KVC_AVX512_INLINE __m512 e4m3_decode16(const uint8_t* codes) {
  const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7F));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                                    _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8));
  const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
  return _mm512_mask_mov_ps(v, nan, _mm512_castsi512_ps(splat(static_cast<int32_t>(kCanonicalNanBits))));
}

KVC_AVX512_INLINE __mmask16 is_nan16(__m512i u) {
  return _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, splat(0x7FFFFFFF)), splat(0x7F800000));
}

// float_to_bf16 / float_to_fp16 (numerics.h) on 16 lanes, 16-bit results in each 32-bit lane.
KVC_AVX512_INLINE __m512i to_bf16_16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), splat(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, splat(0x7FFF)), lsb), 16);
  return _mm512_mask_mov_epi32(r, is_nan16(u), splat(0x7FC0));
}

KVC_AVX512_INLINE __m512i to_fp16_16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(u, splat(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 16), splat(0x8000));
  __m512i normal = _mm512_add_epi32(a, splat(0xFFF));
  normal = _mm512_add_epi32(normal, _mm512_and_si512(_mm512_srli_epi32(a, 13), splat(1)));
  normal = _mm512_srli_epi32(_mm512_sub_epi32(normal, splat(112 << 23)), 13);
  const __m512 half = _mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(0.5f));
  const __m512i subnormal = _mm512_sub_epi32(_mm512_castps_si512(half), splat(0x3F000000));
  __m512i r = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a, splat(0x387FFFFF)), subnormal, normal);
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epi32_mask(a, splat(0x477FEFFF)), splat(0x7C00));
  r = _mm512_or_si512(r, sign);
  return _mm512_mask_mov_epi32(r, is_nan16(u), splat(0x7E00));
}

}  // namespace

// 32 codes as fp16 numbers 2^-8 times their values (see the top of the file), in 32 words.
KVC_AVX512_INLINE __m512i codes_as_fp16(__m512i c) {  // c: one code per word
  // c << 8 puts the sign at bit 15 and the rest at 8-14; an arithmetic shift by 1 moves the rest
  // to 7-13 and copies the sign into bit 14, which the mask clears
  return _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(c, 8), 1), _mm512_set1_epi16(static_cast<int16_t>(0xBFFF)));
}

// Codes with (c & 0x7F) == 0x7F are NaN.
KVC_AVX512_INLINE __mmask32 nan_codes(__m512i c) {
  return _mm512_cmpeq_epi16_mask(_mm512_and_si512(c, _mm512_set1_epi16(0x7F)), _mm512_set1_epi16(0x7F));
}

// The values of 32 codes times s256 / 256, in lo (codes 0-15) and hi (16-31); returns the NaN
// codes' lanes.
KVC_AVX512_INLINE __mmask32 decoded32(const uint8_t* codes, __m512 s256, __m512* lo, __m512* hi) {
  const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  const __m512i h = codes_as_fp16(c);
  *lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), s256);
  *hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), s256);
  return nan_codes(c);
}

KVC_AVX512 void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  const int64_t es = dtype_size(out_dtype);
  int64_t i = 0;
  if (out_dtype == DType::kFloat32 && decodes_fast(scale)) {
    const __m512 s = _mm512_set1_ps(scale * 256.0f);
    const __m512 nan = _mm512_castsi512_ps(splat(static_cast<int32_t>(kCanonicalNanBits)));
    for (; i + 32 <= n; i += 32) {
      __m512 lo, hi;
      const __mmask32 bad = decoded32(codes + i, s, &lo, &hi);
      float* o = reinterpret_cast<float*>(out) + i;
      _mm512_storeu_ps(o, _mm512_mask_mov_ps(lo, static_cast<__mmask16>(bad), nan));
      _mm512_storeu_ps(o + 16, _mm512_mask_mov_ps(hi, static_cast<__mmask16>(bad >> 16), nan));
    }
  } else if (out_dtype == DType::kBFloat16 && decodes_fast(scale)) {  // CPUs without AVX512-BF16
    const __m512 s = _mm512_set1_ps(scale * 256.0f);
    for (; i + 32 <= n; i += 32) {
      __m512 lo, hi;
      const __mmask32 bad = decoded32(codes + i, s, &lo, &hi);
      // round to nearest even on the bits (products are normal or 0), then keep the high words
      const __m512i ul = _mm512_castps_si512(lo), uh = _mm512_castps_si512(hi);
      const __m512i rl = _mm512_add_epi32(ul, _mm512_add_epi32(splat(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(ul, 16), splat(1))));
      const __m512i rh = _mm512_add_epi32(uh, _mm512_add_epi32(splat(0x7FFF), _mm512_and_si512(_mm512_srli_epi32(uh, 16), splat(1))));
      const __m512i r = _mm512_permutex2var_epi16(rl, _mm512_set_epi16(
          63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
          31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1), rh);
      _mm512_storeu_si512(out + i * 2, _mm512_mask_mov_epi16(r, bad, _mm512_set1_epi16(0x7FC0)));
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(e4m3_decode16(codes + i), s);
    uint8_t* o = out + i * es;
    if (out_dtype == DType::kFloat32) {
      const __m512i u = _mm512_castps_si512(v);
      _mm512_storeu_si512(o, _mm512_mask_mov_epi32(u, is_nan16(u), splat(static_cast<int32_t>(kCanonicalNanBits))));
    } else {
      const __m512i r = out_dtype == DType::kBFloat16 ? to_bf16_16(v) : to_fp16_16(v);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi32_epi16(r));
    }
  }
  if (i < n) scalar::decode_row(codes + i, n - i, scale, out_dtype, out + i * es);
}

// bf16 output by the AVX512-BF16 conversion, which rounds to nearest even as float_to_bf16
// does for normal floats (it reads subnormals as 0, which decodes_fast rules out).
KVC_AVX512_BF16 void decode_row_bf16(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  if (out_dtype != DType::kBFloat16 || !decodes_fast(scale)) return decode_row(codes, n, scale, out_dtype, out);
  const __m512 s = _mm512_set1_ps(scale * 256.0f);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 lo, hi;
    const __mmask32 bad = decoded32(codes + i, s, &lo, &hi);
    const __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // words 0-15 from lo
    _mm512_storeu_si512(out + i * 2, _mm512_mask_mov_epi16(r, bad, _mm512_set1_epi16(0x7FC0)));
  }
  if (i < n) decode_row(codes + i, n - i, scale, out_dtype, out + i * 2);
}

// MXFP4 decoding: a block's 32 codes index its scale byte's row of 16 words by one permute (16-bit
// lanes for bf16, two 32-bit ones for fp32).
KVC_AVX512 void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                                   const Mxfp4Words& words, uint8_t* out) {
  const bool bf16 = words.out_dtype == DType::kBFloat16;
  for (int64_t k = 0; k < blocks; ++k) {
    const __m512i row = _mm512_load_si512(words.word[scale_bytes[k]]);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + 16 * k)));
    // 16-bit lane 2i: byte i's low nibble (value 2i); lane 2i + 1: its high nibble
    const __m512i idx = _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), splat(0x000F000F));
    if (bf16) {
      const __m512i row16 = _mm512_zextsi256_si512(_mm512_cvtepi32_epi16(row));
      _mm512_storeu_si512(out + 64 * k, _mm512_permutexvar_epi16(idx, row16));
    } else {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(idx));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(idx, 1));
      _mm512_storeu_si512(out + 128 * k, _mm512_permutexvar_epi32(lo, row));
      _mm512_storeu_si512(out + 128 * k + 64, _mm512_permutexvar_epi32(hi, row));
    }
  }
}

bool bf16_supported() {
  __builtin_cpu_init();
  return supported() && __builtin_cpu_supports("avx512bf16");
}
}  // namespace kvc::cpu::avx512

#else  // not x86-64 with GCC-style intrinsics: the scalar code everywhere

namespace kvc::cpu::avx512 {
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  scalar::decode_row(codes, n, scale, out_dtype, out);
}
bool bf16_supported() { return false; }
void decode_row_bf16(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  scalar::decode_row(codes, n, scale, out_dtype, out);
}
void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out) {
  scalar::e2m1_decode_blocks(packed, scale_bytes, blocks, words, out);
}
}  // namespace kvc::cpu::avx512

#endif
