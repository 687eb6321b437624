// AVX-512 (F, BW, VL) row loops, the same bytes as the scalar code: amax, e4m3 encoding and
// decoding from the width-generic loops (simd/rows_simd.h) on the 32-word vector
// (simd/vec_avx512.h); bf16 decoding by the AVX512-BF16 conversion where the CPU has it; MXFP4
// by word tables (one permute per block, which AVX2 lacks); the streaming copy by whole lines.
// rows.cpp calls these only when supported() / bf16_supported() say the CPU has them.
#include "rows.h"

#include "../core/v4_rows.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "simd/vec_avx512.h"
#define KVC_SIMD_ISA avx512
#define KVC_SIMD_TARGET KVC_AVX512
#define KVC_SIMD_INLINE KVC_AVX512_INLINE
#include "simd/rows_simd.h"  // this ISA's amax, e4m3 encoding and decoding
#undef KVC_SIMD_INLINE
#undef KVC_SIMD_TARGET
#undef KVC_SIMD_ISA

namespace kvc::cpu::avx512 {
namespace {
KVC_AVX512_INLINE __m512i splat(int32_t v) { return _mm512_set1_epi32(v); }
}  // namespace

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
}

bool bf16_supported() {
  __builtin_cpu_init();
  return supported() && __builtin_cpu_supports("avx512bf16");
}

// bf16 output by the AVX512-BF16 conversion, which rounds to nearest even as float_to_bf16
// does for normal floats (it reads subnormals as 0, which decodes_fast rules out).
KVC_AVX512_BF16 void decode_row_bf16(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  if (out_dtype != DType::kBFloat16 || !decodes_fast(scale)) return decode_row(codes, n, scale, out_dtype, out);
  const __m512 s = _mm512_set1_ps(scale * 256.0f);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 lo, hi;
    const __mmask32 bad = simd::decoded<Vec>(codes + i, s, &lo, &hi);
    const __m512i r = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // words 0-15 from lo
    _mm512_storeu_si512(out + i * 2, _mm512_mask_mov_epi16(r, bad, _mm512_set1_epi16(0x7FC0)));
  }
  if (i < n) decode_row(codes + i, n - i, scale, out_dtype, out + i * 2);
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

namespace kvc::cpu::avx512 {
const RowLoops loops{"avx512", row_amax, quantize_row, tile_amax, quantize_tiles, decode_row, stream_copy,
                     e2m1_blocks, e2m1_decode_blocks};
const RowLoops loops_bf16{"avx512+bf16", row_amax, quantize_row, tile_amax, quantize_tiles, decode_row_bf16,
                          stream_copy, e2m1_blocks, e2m1_decode_blocks};
}  // namespace kvc::cpu::avx512
