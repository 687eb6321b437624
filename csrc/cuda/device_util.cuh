// Small device helpers: warp-cooperative byte copies at the widest aligned width, fp8/bf16
// packing, warp reductions. Only CUDA built-ins (uint4, __shfl_xor_sync, threadIdx, ...), which
// tests/simt/simt_host.h also provides on the host.
#pragma once
#include <cstdint>

#include "../core/params.h"  // MlaGatherMode
#include "../core/numerics.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kvc::cuda {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;  // tokens per thread block for the one-warp-per-row kernels
// Indexer rows (132 B) alone: four tokens per warp, eight lanes per token.
constexpr int kIndexerLanes = 8;
constexpr int kIndexerTokensPerWarp = kWarp / kIndexerLanes;

inline unsigned grid_for(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
}

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Every vector access goes through vec<V>(p). Under the host emulation (tests/simt) it also
// checks the alignment a GPU requires, which the host's own loads would not enforce.
template <class V, class T>
__device__ __forceinline__ V* vec(T* p) {
#if defined(KVC_SIMT_CHECK_ALIGNED)
  KVC_SIMT_CHECK_ALIGNED(p, sizeof(V));
#endif
  return reinterpret_cast<V*>(p);
}

// n bytes from src to dst by the lanes of one warp, 16/8/4/1 bytes at a time.
__device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, int64_t n, int lane) {
  const uintptr_t mix = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                        static_cast<uintptr_t>(n);
  if ((mix & 15) == 0) {
    for (int64_t i = lane; i < n / 16; i += kWarp)
      vec<uint4>(dst)[i] = vec<const uint4>(src)[i];
  } else if ((mix & 7) == 0) {
    for (int64_t i = lane; i < n / 8; i += kWarp)
      vec<uint2>(dst)[i] = vec<const uint2>(src)[i];
  } else if ((mix & 3) == 0) {
    for (int64_t i = lane; i < n / 4; i += kWarp)
      vec<uint32_t>(dst)[i] = vec<const uint32_t>(src)[i];
  } else {
    for (int64_t i = lane; i < n; i += kWarp) dst[i] = src[i];
  }
}

__device__ __forceinline__ void warp_zero(uint8_t* dst, int64_t n, int lane) {
  if (((reinterpret_cast<uintptr_t>(dst) | static_cast<uintptr_t>(n)) & 15) == 0) {
    for (int64_t i = lane; i < n / 16; i += kWarp) vec<uint4>(dst)[i] = make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t i = lane; i < n; i += kWarp) dst[i] = 0;
  }
}

// Stores n (multiple of 4) bytes held in 32-bit words, as wide as dst's alignment allows.
// kAligned: the caller guarantees dst is aligned to the widest access (16 B for N % 4 == 0,
// 8 B for N == 2, 4 B for N == 1): no run-time test (a host-chosen kernel variant).
template <int N, bool kAligned = false>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t (&w)[N]) {
  static_assert(N % 4 == 0 || N < 4, "");
  if constexpr (kAligned && N == 2) {
    vec<uint2>(dst)[0] = {w[0], w[1]};
    return;
  }
  if constexpr (N % 4 == 0) {
    if (kAligned || aligned(dst, 16)) {
#pragma unroll
      for (int i = 0; i < N; i += 4)
        vec<uint4>(dst)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
      return;
    }
  }
  if (kAligned || aligned(dst, 4)) {
#pragma unroll
    for (int i = 0; i < N; ++i) vec<uint32_t>(dst)[i] = w[i];
    return;
  }
#pragma unroll
  for (int i = 0; i < 4 * N; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

// Loads n (multiple of 4) bytes into 32-bit words, as wide as src's alignment allows
// (kAligned: as store_words).
template <int N, bool kAligned = false>
__device__ __forceinline__ void load_words(const uint8_t* src, uint32_t (&w)[N]) {
  if constexpr (N % 4 == 0) {
    if (kAligned || aligned(src, 16)) {
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const uint4 v = vec<const uint4>(src)[i / 4];
        w[i] = v.x; w[i + 1] = v.y; w[i + 2] = v.z; w[i + 3] = v.w;
      }
      return;
    }
  }
  if constexpr (N % 2 == 0) {
    if (kAligned || aligned(src, 8)) {
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        const uint2 v = vec<const uint2>(src)[i / 2];
        w[i] = v.x; w[i + 1] = v.y;
      }
      return;
    }
  }
  if (kAligned || aligned(src, 4)) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = vec<const uint32_t>(src)[i];
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    w[i] = src[4 * i] | (src[4 * i + 1] << 8) | (src[4 * i + 2] << 16) |
           (static_cast<uint32_t>(src[4 * i + 3]) << 24);
}

// Two 16-bit floats packed in a word -> floats (fp16: the hardware's exact widening on a GPU).
template <bool kHalf>
__device__ __forceinline__ void unpack2(uint32_t w, float& lo, float& hi) {
  if constexpr (kHalf) {
#if defined(__CUDA_ARCH__)
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    lo = f.x;
    hi = f.y;
#else
    lo = fp16_to_float(static_cast<uint16_t>(w & 0xFFFF));
    hi = fp16_to_float(static_cast<uint16_t>(w >> 16));
#endif
  } else {
    lo = bits_float(w << 16);
    hi = bits_float(w & 0xFFFF0000u);
  }
}

// Bytes equal to 0xFF (e4m3 NaN of either sign) become 0x7F, word-wide: 0xFF is no finite
// satfinite code, so this only canonicalises NaN.
__device__ __forceinline__ uint32_t canonical_nan_codes(uint32_t w) {
  const uint32_t v = ~w;  // a NaN byte is a zero byte of v
  const uint32_t nonzero = (((v & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | v) & 0x80808080u;
  return w & ~(~nonzero & 0x80808080u);
}

// Four floats -> four e4m3 codes (lowest address first). On sm_89+ two paired hardware
// conversions (cvt.rn.satfinite.e4m3x2.f32) with NaN made 0x7F; elsewhere the software encoder.
__device__ __forceinline__ uint32_t pack4_e4m3(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return canonical_nan_codes(lo | (hi << 16));
#else
  return static_cast<uint32_t>(e4m3_encode(a)) | (static_cast<uint32_t>(e4m3_encode(b)) << 8) |
         (static_cast<uint32_t>(e4m3_encode(c)) << 16) | (static_cast<uint32_t>(e4m3_encode(d)) << 24);
#endif
}

// max(m, |x|) ignoring NaN: fmaxf returns the other operand of a NaN, and fabsf(-0) is +0, so
// this is abs_for_amax's maximum in one instruction (FMNMX with |x|).
__device__ __forceinline__ float amax_step(float m, float x) { return fmaxf(m, fabsf(x)); }

// x / scale, exactly as IEEE division: by multiplication when the scale is a power of two with a
// finite normal reciprocal (recip != 0), then x * recip is the same correctly rounded value.
__device__ __forceinline__ float exact_recip(float scale) {
  const uint32_t b = float_bits(scale);
  const bool pow2 = (b & 0x7FFFFFu) == 0 && ((b >> 23) & 0xFFu) > 1 && ((b >> 23) & 0xFFu) < 254;
  return pow2 ? bits_float((b & 0x80000000u) | ((254u << 23) - (b & 0x7F800000u))) : 0.0f;
}

__device__ __forceinline__ float div_by(float x, float scale, float recip) {
  return recip != 0.0f ? x * recip : x / scale;
}

template <int kWidth>  // reduce over groups of kWidth consecutive lanes
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int off = kWidth / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}

// ---- Dequantizing reads ----
// Two floats -> two bf16 (round to nearest even, NaN -> 0x7FC0): one paired hardware conversion
// on sm_80+ (its NaN is replaced), the software rounding elsewhere.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t w = *reinterpret_cast<const uint32_t*>(&h);
  if (lo != lo) w = (w & 0xFFFF0000u) | 0x7FC0u;
  if (hi != hi) w = (w & 0xFFFFu) | 0x7FC00000u;
  return w;
#else
  return float_to_bf16(lo) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
#endif
}

// n decoded values (n % 4 == 0) as bf16 or fp32 words at dst; fp32 NaN canonical.
template <MlaGatherMode kMode, int N>
__device__ __forceinline__ void store_values(uint8_t* dst, const float (&v)[N]) {
  if constexpr (kMode == MlaGatherMode::kDequantBf16) {
    uint32_t w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
    store_words(dst, w);
  } else {
    uint32_t w[N];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = float_bits(canonical_nan(v[i]));
    store_words(dst, w);
  }
}

// N codes (N % 4 == 0) held in words, decoded and multiplied by scale. On sm_89+ the hardware
// widens two codes at a time to fp16 (exact: e4m3 is a subset of fp16), then to fp32 (exact).
template <int N>
__device__ __forceinline__ void decode_words(const uint32_t (&c)[N / 4], float scale, float (&v)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(c[i / 4] >> (8 * (i % 4))), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    v[i] = f.x * scale;
    v[i + 1] = f.y * scale;
  }
#else
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = e4m3_decode(static_cast<uint8_t>(c[i / 4] >> (8 * (i % 4)))) * scale;
#endif
}

}  // namespace kvc::cuda
