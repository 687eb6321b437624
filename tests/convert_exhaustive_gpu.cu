// Device program (needs a GPU): the conversions the CUDA kernels run on the GPU's own
// instructions, on every input, against the software conversions that give the CPU kernels'
// bytes (core/numerics.h). Host builds of the kernels (tests/simt, fp8_exhaustive.cu) only see
// cuda_fp8.h's host emulation; this sees the hardware.
//   e4m3 encode   every float        pack4_e4m3 (cvt.rn.satfinite.e4m3x2.f32) vs e4m3_encode_soft
//   bf16 encode   every float        pack_bf16 (cvt.rn.bf16x2.f32)          vs float_to_bf16
//   e4m3 decode   every code pair    decode_words (cvt.rn.f16x2.e4m3x2)     vs e4m3_decode
//   fp16 widen    every fp16 pair    unpack2<true> (__half22float2)        vs fp16_to_float
//   tile division every (x, scale) the write kernels divide (as tile_div_exhaustive.cpp, on the
//                 device's __frcp_rn / __fmaf_rn): code of tile_div(x, s) vs code of IEEE x / s
// Prints one line per check and "mismatches: N"; exit status 1 on any mismatch or CUDA error.
//   nvcc -O3 --fmad=false -std=c++17 -arch=native -Icsrc tests/convert_exhaustive_gpu.cu
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/device_util.cuh"

using namespace kvc;

#define CHECK(call)                                                                 \
  do {                                                                              \
    const cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Bad {
  unsigned long long count;
  uint32_t input[4], got[4], want[4];
};

__device__ void report(Bad* b, uint32_t input, uint32_t got, uint32_t want) {
  const unsigned long long i = atomicAdd(&b->count, 1ull);
  if (i < 4) {
    b->input[i] = input;
    b->got[i] = got;
    b->want[i] = want;
  }
}

__device__ uint64_t global_thread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void encode_e4m3(Bad* bad) {  // 2^30 threads, four consecutive floats each
  const uint32_t u = static_cast<uint32_t>(global_thread() * 4);
  const uint32_t w = cuda::pack4_e4m3(bits_float(u), bits_float(u + 1), bits_float(u + 2),
                                      bits_float(u + 3));
  for (uint32_t k = 0; k < 4; ++k) {
    const uint32_t got = (w >> (8 * k)) & 0xFFu, want = e4m3_encode_soft(bits_float(u + k));
    if (got != want) report(bad, u + k, got, want);
  }
}

__global__ void encode_bf16(Bad* bad) {  // 2^31 threads, two consecutive floats each
  const uint32_t u = static_cast<uint32_t>(global_thread() * 2);
  const uint32_t w = cuda::pack_bf16(bits_float(u), bits_float(u + 1));
  for (uint32_t k = 0; k < 2; ++k) {
    const uint32_t got = (w >> (16 * k)) & 0xFFFFu, want = float_to_bf16(bits_float(u + k));
    if (got != want) report(bad, u + k, got, want);
  }
}

__global__ void decode_e4m3(Bad* bad) {  // 2^16 threads: codes (i & 0xFF, i >> 8) twice
  const uint32_t i = static_cast<uint32_t>(global_thread());
  const uint32_t c[1] = {i | (i << 16)};
  float v[4];
  cuda::decode_words<4>(c, 1.0f, v);
  for (uint32_t k = 0; k < 4; ++k) {
    const uint8_t code = static_cast<uint8_t>(c[0] >> (8 * k));
    const uint32_t got = float_bits(canonical_nan(v[k])), want = float_bits(e4m3_decode(code));
    if (got != want) report(bad, code, got, want);
  }
}

__global__ void widen_fp16(Bad* bad) {  // 2^16 threads: fp16 patterns (i, ~i)
  const uint32_t i = static_cast<uint32_t>(global_thread());
  const uint32_t w = i | ((~i & 0xFFFFu) << 16);
  float lo, hi;
  cuda::unpack2<true>(w, lo, hi);
  const float v[2] = {lo, hi};
  for (uint32_t k = 0; k < 2; ++k) {
    const uint16_t h = static_cast<uint16_t>(w >> (16 * k));
    const uint32_t got = float_bits(v[k]), want = float_bits(fp16_to_float(h));
    // NaN payloads: the kernels pass widened NaN on only through the encoders, which map
    // every NaN alike; compare NaN-ness there, bits elsewhere.
    if (is_nan(v[k]) ? !is_nan(fp16_to_float(h)) : got != want) report(bad, h, got, want);
  }
}

// One block per (rule, amax); its threads walk every x with |x| <= amax.
__global__ void tile_division(const float* xs, int nx, const float* amaxes, int rule,
                              unsigned long long* pairs, Bad* bad) {
  const float a = amaxes[blockIdx.x];
  const float s = rule == 0   ? mla_tile_scale(a, TileScale::kFp32)
                  : rule == 1 ? indexer_scale(a, false)
                              : mla_tile_scale(a, TileScale::kPow2);
  const TileDivisor d = tile_divisor(s);
  unsigned long long n = 0;
  for (int j = threadIdx.x; j < nx; j += blockDim.x) {
    const float x = xs[j];
    if (fabsf(x) > a) continue;
    ++n;
    const uint32_t got = cuda::pack4_e4m3(tile_div(x, d), 0.f, 0.f, 0.f) & 0xFFu;
    const uint32_t want = e4m3_encode_soft(__fdiv_rn(x, s));
    if (got != want) report(bad, float_bits(x), got, want);
  }
  atomicAdd(pairs, n);
}

template <class Launch>
static unsigned long long run(const char* name, Launch launch) {
  Bad* d;
  CHECK(cudaMalloc(&d, sizeof(Bad)));
  CHECK(cudaMemset(d, 0, sizeof(Bad)));
  launch(d);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  Bad h;
  CHECK(cudaMemcpy(&h, d, sizeof(Bad), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(d));
  std::printf("%s: %llu mismatches\n", name, h.count);
  for (unsigned long long i = 0; i < h.count && i < 4; ++i)
    std::printf("  input 0x%08x: gpu 0x%08x, software 0x%08x\n", h.input[i], h.got[i], h.want[i]);
  return h.count;
}

static std::vector<float> finite_values(DType t) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = t == DType::kBFloat16 ? bf16_to_float(static_cast<uint16_t>(h))
                                          : fp16_to_float(static_cast<uint16_t>(h));
    if (std::isfinite(f)) xs.push_back(f);
  }
  return xs;
}

static unsigned long long tile_divisions() {
  unsigned long long bad = 0, total = 0;
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    const std::vector<float> xs = finite_values(t);
    std::vector<float> amaxes;
    for (float f : xs)
      if (f >= 0.0f && float_bits(f) != 0x80000000u) amaxes.push_back(f);
    float *dx, *da;
    unsigned long long* dp;
    CHECK(cudaMalloc(&dx, xs.size() * sizeof(float)));
    CHECK(cudaMalloc(&da, amaxes.size() * sizeof(float)));
    CHECK(cudaMalloc(&dp, sizeof(unsigned long long)));
    CHECK(cudaMemcpy(dx, xs.data(), xs.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(da, amaxes.data(), amaxes.size() * sizeof(float), cudaMemcpyHostToDevice));
    for (int rule = 0; rule < 3; ++rule) {
      CHECK(cudaMemset(dp, 0, sizeof(unsigned long long)));
      char name[64];
      std::snprintf(name, sizeof name, "tile division %s rule %d",
                    t == DType::kBFloat16 ? "bf16" : "fp16", rule);
      const int nx = static_cast<int>(xs.size());
      const unsigned blocks = static_cast<unsigned>(amaxes.size());
      bad += run(name, [&](Bad* b) { tile_division<<<blocks, 256>>>(dx, nx, da, rule, dp, b); });
      unsigned long long pairs = 0;
      CHECK(cudaMemcpy(&pairs, dp, sizeof pairs, cudaMemcpyDeviceToHost));
      total += pairs;
    }
    CHECK(cudaFree(dx));
    CHECK(cudaFree(da));
    CHECK(cudaFree(dp));
  }
  std::printf("tile division pairs: %llu\n", total);
  return bad;
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d\n", prop.name, prop.major, prop.minor);
  unsigned long long bad = 0;
  bad += run("e4m3 encode, every float", [](Bad* b) { encode_e4m3<<<1u << 22, 256>>>(b); });
  bad += run("bf16 encode, every float", [](Bad* b) { encode_bf16<<<1u << 23, 256>>>(b); });
  bad += run("e4m3 decode, every code", [](Bad* b) { decode_e4m3<<<256, 256>>>(b); });
  bad += run("fp16 widen, every pattern", [](Bad* b) { widen_fp16<<<256, 256>>>(b); });
  bad += tile_divisions();
  std::printf("mismatches: %llu\n", bad);
  return bad ? 1 : 0;
}
