#include "rows.h"

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
}  // namespace scalar

namespace {
const bool kAvx2 = avx2::supported();
}  // namespace

float row_amax(const void* src, DType t, int64_t n) {
  return kAvx2 ? avx2::row_amax(src, t, n) : scalar::row_amax(src, t, n);
}

void quantize_row(const void* src, DType t, int64_t n, float scale, uint8_t* out) {
  kAvx2 ? avx2::quantize_row(src, t, n, scale, out) : scalar::quantize_row(src, t, n, scale, out);
}

void decode_row(const uint8_t* codes, int64_t n, float scale, DType out_dtype, uint8_t* out) {
  kAvx2 ? avx2::decode_row(codes, n, scale, out_dtype, out)
        : scalar::decode_row(codes, n, scale, out_dtype, out);
}

}  // namespace kvc::cpu
