// Hot per-row loops of the CPU kernels. Branch-free over fixed-size rows so GCC vectorizes them
// (built with -fno-trapping-math, which lets it if-convert; results are unchanged), and cloned
// for AVX2 with a run-time pick where the compiler supports it.
#pragma once
#include <cstdint>

#include "../numerics.h"

namespace kvc::cpu {

// Loads n values as floats and returns their amax (NaN ignored). Integer max over |x| bits:
// for non-negative floats the bit order is the value order.
float load_amax(const void* src, DType t, int64_t n, float* x);

// out[i] = e4m3(x[i] / scale)
void encode_row(const float* x, int64_t n, float scale, uint8_t* out);

// out[i] = decoded codes[i] * scale, stored as `out_dtype` (bf16, fp16 or fp32; NaN canonical).
void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out);

}  // namespace kvc::cpu
