// Host program: numerics.h's tile_div (three multiply-adds with the reciprocal) gives the e4m3
// code of the IEEE quotient x / s for every operand pair the write kernels hand it: every
// finite bf16 (resp. fp16) value x and every tile scale s of a bf16 (resp. fp16) amax A >= |x|,
// for every scale rule (MLA "fp32": fmax(A / 448, FLT_MIN); MLA "pow2": its power-of-two round-up
// with the 1e-4 floor; indexer: fmax(A, 1e-4) / 448). About 1.5 x 2^32 pairs. Prints "mismatches: N"; exit status 1 if any.
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/params.h"

using namespace kvc;

int main() {
  unsigned long long bad = 0, pairs = 0, fast = 0;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> xs;
    for (uint32_t h = 0; h < 65536; ++h) {
      const float f = t == DType::kBFloat16 ? bf16_to_float(static_cast<uint16_t>(h))
                                            : fp16_to_float(static_cast<uint16_t>(h));
      if (std::isfinite(f)) xs.push_back(f);
    }
    std::vector<float> amaxes;
    for (float f : xs)
      if (f >= 0.0f && float_bits(f) != 0x80000000u) amaxes.push_back(f);
    for (int rule = 0; rule < 3; ++rule) {
#pragma omp parallel for reduction(+ : bad, pairs, fast) schedule(dynamic, 64)
      for (size_t i = 0; i < amaxes.size(); ++i) {
        const float a = amaxes[i];
        const float s = rule == 0   ? mla_tile_scale(a, TileScale::kFp32)
                        : rule == 1 ? indexer_scale(a, false)
                                    : mla_tile_scale(a, TileScale::kPow2);
        const TileDivisor d = tile_divisor(s);
        fast += d.y != 0.0f;
        for (float x : xs) {
          if (std::fabs(x) > a) continue;
          ++pairs;
          const uint8_t want = e4m3_encode_soft(x / s), got = e4m3_encode_soft(tile_div(x, d));
          if (want != got) {
#pragma omp critical
            if (bad < 8) std::printf("%s rule %d: x = %a, s = %a: code 0x%x, want 0x%x\n",
                                     t == DType::kBFloat16 ? "bf16" : "fp16", rule, x, s, got, want);
            ++bad;
          }
        }
      }
    }
  }
  std::printf("pairs: %llu, scales on the fast path: %llu\nmismatches: %llu\n", pairs, fast, bad);
  return bad ? 1 : 0;
}
