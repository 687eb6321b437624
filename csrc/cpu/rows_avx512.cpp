// AVX-512 versions of the row loops in rows.cpp, 16 values per step, the same bytes as the
// scalar code (tests/rows_exhaustive.cpp compares them on every float, every bf16 / fp16
// pattern and every code). Compiled for AVX-512 F/BW/VL by a target attribute, function by
// function; rows.cpp calls these only when supported() says the CPU has them.
//
// Besides the wider lanes: comparisons go to mask registers (one-instruction blends), codes are
// narrowed and stored by vpmovdb, and decoding widens the codes to fp16 in hardware: an e4m3
// code c is the fp16 number with bits (c & 0x7F) << 7 | (c & 0x80) << 8 times 2^8, exactly
// (e4m3's exponent bias is 7, fp16's 15; e4m3 subnormals land on fp16 subnormals), so
// vcvtph2ps and one multiplication by 256 give the code's value.
#include "rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's avx512fintrin.h seeds some intrinsics with _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports inside the header (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#define KVC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define KVC_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"), always_inline)) inline

namespace kvc::cpu::avx512 {
namespace {

KVC_AVX512_INLINE __m512i splat(int32_t v) { return _mm512_set1_epi32(v); }

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

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
}

// As the AVX2 version: 16-bit inputs compared as 16-bit patterns (NaN patterns count as 0).
KVC_AVX512 float row_amax(const void* src, DType t, int64_t n) {
  int64_t i = 0;
  float tail = 0.0f;
  if (t == DType::kFloat32) {
    const float* f = static_cast<const float*>(src);
    __m512i m = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
      const __m512i a = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(f + i)), splat(0x7FFFFFFF));
      m = _mm512_mask_max_epi32(m, _mm512_cmple_epi32_mask(a, splat(0x7F800000)), m, a);
    }
    tail = bits_float(static_cast<uint32_t>(_mm512_reduce_max_epi32(m)));
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(src);
    const __m512i inf = _mm512_set1_epi16(t == DType::kBFloat16 ? 0x7F80 : 0x7C00);
    __m512i m = _mm512_setzero_si512();
    for (; i + 32 <= n; i += 32) {
      const __m512i a = _mm512_and_si512(_mm512_loadu_si512(h + i), _mm512_set1_epi16(0x7FFF));
      m = _mm512_mask_max_epu16(m, _mm512_cmple_epu16_mask(a, inf), m, a);
    }
    // widen the 32 maxima to dwords (zero-extended) and reduce
    const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(m));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(m, 1));
    const uint16_t top = static_cast<uint16_t>(_mm512_reduce_max_epi32(_mm512_max_epi32(lo, hi)));
    tail = t == DType::kBFloat16 ? bf16_to_float(top) : fp16_to_float(top);
  }
  const float rest = scalar::row_amax(static_cast<const uint8_t*>(src) + i * dtype_size(t), t, n - i);
  return rest > tail ? rest : tail;
}

KVC_AVX512 void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_cvtepi32_epi8(e4m3_encode16(_mm512_div_ps(load16(src, t, i), s))));
  scalar::quantize_row(static_cast<const uint8_t*>(src) + i * dtype_size(t), t, n - i, scale, out + i);
}

KVC_AVX512 void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  const __m512 s = _mm512_set1_ps(scale);
  const int64_t es = dtype_size(out_dtype);
  int64_t i = 0;
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
  scalar::decode_row(codes + i, n - i, scale, out_dtype, out + i * es);
}

}  // namespace kvc::cpu::avx512

#else  // not x86-64 with GCC-style intrinsics: the scalar code everywhere

namespace kvc::cpu::avx512 {
bool supported() { return false; }
float row_amax(const void* src, DType t, int64_t n) { return scalar::row_amax(src, t, n); }
void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  scalar::quantize_row(src, t, n, scale, out);
}
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  scalar::decode_row(codes, n, scale, out_dtype, out);
}
}  // namespace kvc::cpu::avx512

#endif
