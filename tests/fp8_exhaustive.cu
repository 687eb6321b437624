// Host program: every one of the 2^32 float bit patterns through the project's software e4m3
// encoder and through cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), NVIDIA's
// host emulation of the cvt.rn.satfinite.e4m3x2.f32 instruction the CUDA kernels use (with
// NaN -> 0x7F). Prints the number of mismatches; exit status 1 if any.
#include <cstdio>

#include "core/numerics.h"

int main() {
  unsigned long long bad = 0;
  for (unsigned long long u = 0; u <= 0xFFFFFFFFull; ++u) {
    const float f = kvc::bits_float(static_cast<uint32_t>(u));
    const uint8_t ours = kvc::e4m3_encode_soft(f);
    const uint8_t nv = kvc::is_nan(f) ? 0x7F : static_cast<uint8_t>(
                           __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
    if (ours != nv && bad++ < 5) std::printf("0x%08llx: ours 0x%02x, cuda 0x%02x\n", u, ours, nv);
  }
  std::printf("mismatches: %llu\n", bad);
  return bad ? 1 : 0;
}
