#include "rows.h"

#include <cstring>

// Cloned for AVX2 with a run-time pick (GCC on x86-64); the attribute goes on definitions only.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KVC_CPU_HOT __attribute__((target_clones("avx2", "default")))
#else
#define KVC_CPU_HOT
#endif

namespace kvc::cpu {

namespace {
// |x| bits as a signed int, NaN as 0: below 2^31, so signed max orders them like the values.
inline int32_t amax_key(float v) {
  const int32_t a = static_cast<int32_t>(float_bits(v) & 0x7FFFFFFFu);
  return a > 0x7F800000 ? 0 : a;
}
}  // namespace

KVC_CPU_HOT float load_amax(const void* src, DType t, int64_t n, float* __restrict x) {
  int32_t m = 0;
  if (t == DType::kFloat32) {
    const float* __restrict f = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = f[i];
      const int32_t k = amax_key(x[i]);
      m = k > m ? k : m;
    }
  } else {
    const uint16_t* __restrict h = static_cast<const uint16_t*>(src);
    if (t == DType::kBFloat16) {
      for (int64_t i = 0; i < n; ++i) {
        x[i] = bf16_to_float(h[i]);
        const int32_t k = amax_key(x[i]);
        m = k > m ? k : m;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        x[i] = fp16_to_float(h[i]);
        const int32_t k = amax_key(x[i]);
        m = k > m ? k : m;
      }
    }
  }
  return bits_float(static_cast<uint32_t>(m));
}

KVC_CPU_HOT void encode_row(const float* __restrict x, int64_t n, float scale,
                            uint8_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_encode_soft(x[i] / scale);
}

KVC_CPU_HOT void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype,
                            uint8_t* out) {
  if (out_dtype == DType::kBFloat16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = float_to_bf16(e4m3_decode(codes[i]) * scale);
  } else if (out_dtype == DType::kFloat16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = float_to_fp16(e4m3_decode(codes[i]) * scale);
  } else {
    float* o = reinterpret_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = canonical_nan(e4m3_decode(codes[i]) * scale);
  }
}

}  // namespace kvc::cpu
