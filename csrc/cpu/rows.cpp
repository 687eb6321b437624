#include "rows.h"

#include "../core/entry.h"  // isa()
#include "../core/v4_rows.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvc::cpu {

namespace scalar {
namespace {
// |x| bits as a signed int, NaN as 0: below 2^31, so signed max orders them like the values.
inline int32_t amax_key(float v) {
  const int32_t a = static_cast<int32_t>(float_bits(v) & 0x7FFFFFFFu);
  return a > 0x7F800000 ? 0 : a;
}
}  // namespace

float row_amax(const void* src, DType t, int64_t n) {
  int32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t k = amax_key(load_as_float(src, i, t));
    m = k > m ? k : m;
  }
  return bits_float(static_cast<uint32_t>(m));
}

void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_encode_soft(load_as_float(src, i, t) / scale);
}

void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) store_float(out, i, e4m3_decode(codes[i]) * scale, out_dtype);
}

void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* block = x + b * kMxfp4Block;
    const float m = pow2f(-exps[b]);
    float v[kMxfp4Block];  // separate 32-bit passes, so each vectorizes
    uint32_t c[kMxfp4Block];
    for (int64_t i = 0; i < kMxfp4Block; ++i) v[i] = bf16_to_float(block[i]) * m;
    for (int64_t i = 0; i < kMxfp4Block; ++i) c[i] = e2m1_encode(v[i]);
    for (int64_t i = 0; i < kMxfp4Block / 2; ++i)
      packed[b * kMxfp4Block / 2 + i] = static_cast<uint8_t>(c[2 * i] | (c[2 * i + 1] << 4));
  }
}

void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out) {
  const int64_t es = dtype_size(words.out_dtype);
  for (int64_t k = 0; k < blocks * kMxfp4Block / 2; ++k) {
    const uint32_t* w = words.word[scale_bytes[k / (kMxfp4Block / 2)]];
    const uint32_t lo = w[packed[k] & 0xF], hi = w[packed[k] >> 4];
    std::memcpy(out + 2 * k * es, &lo, es);  // little-endian: a bf16 word is the low half
    std::memcpy(out + (2 * k + 1) * es, &hi, es);
  }
}

void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes) {
#if defined(__SSE2__)
  for (int64_t i = 0; i < bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
#else
  std::memcpy(dst, src, bytes);
#endif
}
}  // namespace scalar

Mxfp4Words::Mxfp4Words(DType t) : out_dtype(t) {
  for (int b = 0; b < 256; ++b) {
    for (uint32_t c = 0; c < 16; ++c) {
      word[b][c] = 0;
      store_float(&word[b][c], 0, e2m1_decode(c) * pow2f(b - 127), t);
    }
  }
}

namespace scalar {
void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  for (int64_t k = 0; k < tiles; ++k)
    amax[k] = row_amax(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile);
}

void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, const float* scales,
                    uint8_t* out) {
  for (int64_t k = 0; k < tiles; ++k)
    quantize_row(static_cast<const uint8_t*>(src) + k * stride * dtype_size(t), t, tile, scales[k], out + k * tile);
}

const RowLoops loops{"scalar", row_amax, quantize_row, tile_amax, quantize_tiles, decode_row, stream_copy,
                     e2m1_blocks, e2m1_decode_blocks};
}  // namespace scalar

namespace {
const RowLoops& pick_loops() {
  const char* cap = std::getenv("KVC_CPU_ISA");
  std::string want = cap ? cap : "avx512";
  if (want != "scalar" && want != "avx2" && want != "avx512") {
    // read while the library loads: an exception here would abort the import
    std::fprintf(stderr, "kvcache_ext: KVC_CPU_ISA must be scalar, avx2 or avx512, got \"%s\"; "
                 "using the widest this CPU has\n", want.c_str());
    want = "avx512";
  }
  if (want == "avx512" && avx512::supported()) return avx512::bf16_supported() ? avx512::loops_bf16 : avx512::loops;
  if (want != "scalar" && avx2::supported()) return avx2::loops;
  return scalar::loops;
}

// Constant-initialized to the scalar loops, so a call made before this file's dynamic
// initialization (another file's static initializer) runs correct, if slow, code.
const RowLoops* loops_in_use = &scalar::loops;
const bool kPicked = (loops_in_use = &pick_loops(), true);
}  // namespace

const char* isa() { return loops_in_use->name; }

float row_amax(const void* src, DType t, int64_t n) { return loops_in_use->row_amax(src, t, n); }

void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  loops_in_use->quantize_row(src, t, n, scale, out);
}

void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax) {
  loops_in_use->tile_amax(src, t, tiles, tile, stride, amax);
}

void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, const float* scales,
                    uint8_t* out) {
  loops_in_use->quantize_tiles(src, t, tiles, tile, stride, scales, out);
}

void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  loops_in_use->decode_row(codes, n, scale, out_dtype, out);
}

void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes) { loops_in_use->stream_copy(dst, src, bytes); }

void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed) {
  loops_in_use->e2m1_blocks(x, blocks, exps, packed);
}

void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out) {
  loops_in_use->e2m1_decode_blocks(packed, scale_bytes, blocks, words, out);
}

}  // namespace kvc::cpu
