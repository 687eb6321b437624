// Hot per-row loops of the CPU kernels: amax, fp8 quantization and fp8 decoding of a row of
// n values. Three implementations give the same bytes: portable scalar code (branch-free, which
// GCC auto-vectorizes), and AVX2 (rows_avx2.cpp) and AVX-512 (rows_avx512.cpp) loops, written
// once for any vector width (simd/rows_simd.h) and compiled for each ISA function by function,
// so the library still loads on any x86-64. The public functions call through one table of the
// widest loops the CPU has, chosen at load (KVC_CPU_ISA=scalar|avx2|avx512 caps it, for
// comparisons); tests/rows_exhaustive.cpp compares each SIMD version with the scalar one on
// every float.
#pragma once
#include <cstdint>

#include "../core/numerics.h"

namespace kvc::cpu {

// max |x| over n values of dtype t, NaN ignored (counted as 0).
float row_amax(const void* src, DType t, int64_t n);

// out[i] = e4m3(x[i] / scale): IEEE division, round to nearest even, saturating, NaN -> 0x7F.
void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out);

// The same over `tiles` tiles of `tile` values, tile k at src + k * stride values (stride >=
// tile): amax[k] = row_amax of tile k, and tile k quantized with scales[k] to out + k * tile.
// One call for a row's tiles or a batch of rows pays the setup once, not once per tile.
void tile_amax(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax);
void quantize_tiles(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, const float* scales,
                    uint8_t* out);

// out[i] = decoded codes[i] * scale, stored as `out_dtype` (bf16, fp16 or fp32; NaN canonical).
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out);

// bytes (a multiple of 16) from src to dst (16-B aligned) by streaming stores (stream.h).
void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes);

// MXFP4 (v4_rows.h): blocks of 32 bf16 values x, block b's codes e2m1(x / 2^exps[b]) packed
// two per byte (even value in the low nibble) at packed + 16 b. exps[b] in [-127, 127].
void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed);

// MXFP4 decoding by table: word[b][c] is the output word of code c under scale byte b, as the
// CUDA kernel computes it (e2m1 value x 2^(b - 127), then rounded): bf16 bits in the low half,
// or fp32 bits.
struct Mxfp4Words {
  DType out_dtype;  // kBFloat16 or kFloat32
  alignas(64) uint32_t word[256][16];
  explicit Mxfp4Words(DType t);
};

// blocks of 32 MXFP4 values: block k's 16 packed bytes at packed + 16 k (even value in the low
// nibble), its scale byte scale_bytes[k]; out gets 32 words of words.out_dtype per block.
void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out);

// The row loops of one ISA, as a table: rows.cpp calls through the widest one the CPU has,
// chosen once at load; tests/rows_exhaustive.cpp compares each table with the scalar one.
struct RowLoops {
  const char* name;
  float (*row_amax)(const void* src, DType t, int64_t n);
  void (*quantize_row)(const void* src, DType t, int64_t n, float scale, uint8_t* out);
  void (*tile_amax)(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride, float* amax);
  void (*quantize_tiles)(const void* src, DType t, int64_t tiles, int64_t tile, int64_t stride,
                         const float* scales, uint8_t* out);
  void (*decode_row)(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out);
  void (*stream_copy)(uint8_t* dst, const uint8_t* src, int64_t bytes);
  void (*e2m1_blocks)(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed);
  void (*e2m1_decode_blocks)(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                             const Mxfp4Words& words, uint8_t* out);
};

namespace scalar {
extern const RowLoops loops;  // portable code, branch-free (GCC auto-vectorizes it)
// what the SIMD loops fall back on for tails, rare blocks and (AVX2) the streaming copy, and
// the SIMD files' non-x86 builds on everything
float row_amax(const void* src, DType t, int64_t n);
void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out);
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out);
void stream_copy(uint8_t* dst, const uint8_t* src, int64_t bytes);  // 16-B stores (SSE2)
void e2m1_blocks(const uint16_t* x, int64_t blocks, const int32_t* exps, uint8_t* packed);
void e2m1_decode_blocks(const uint8_t* packed, const uint8_t* scale_bytes, int64_t blocks,
                        const Mxfp4Words& words, uint8_t* out);
}  // namespace scalar

namespace avx2 {
bool supported();  // AVX2 and F16C, asked of the CPU once
extern const RowLoops loops;
}  // namespace avx2

namespace avx512 {
bool supported();       // AVX-512 F, BW and VL, and F16C
bool bf16_supported();  // and AVX512-BF16
extern const RowLoops loops;       // streaming copy by 64-B stores where dst allows
extern const RowLoops loops_bf16;  // the same, decoding to bf16 by the AVX512-BF16 conversion
}  // namespace avx512

// e when |s| = 2^e with |e| <= 100 (the SIMD loops then divide a bf16 tile by shifting its
// exponent field), else kNotPow2.
constexpr int32_t kNotPow2 = 1 << 30;
inline int32_t pow2_exponent(float s) {
  const uint32_t u = float_bits(s) & 0x7FFFFFFFu;
  const int32_t e = static_cast<int32_t>(u >> 23) - 127;
  return (u & 0x7FFFFFu) == 0 && e >= -100 && e <= 100 ? e : kNotPow2;
}

// Scales with 2^-100 <= |s| <= 2^100 (every scale but the FLT_MIN floor of all-zero or tiny MLA
// tiles, and absurd per-tensor ones) make each product of a code's value (0 or >= 2^-9 in
// magnitude) a normal float or 0, and 256 s exact: the SIMD decoders' fast path (codes widened
// through fp16 in hardware, 256 s folded in, bf16 rounded as for normal floats). Other scales,
// fp16 output and tails take the general loop.
inline bool decodes_fast(float scale) {
  const uint32_t a = float_bits(scale) & 0x7FFFFFFFu;
  return a >= 0x0D800000u && a <= 0x71800000u;  // 2^-100, 2^100
}

}  // namespace kvc::cpu
