// CUDA kernels of DeepSeek-V4's rows (v4_rows.h), byte for byte the CPU loops' (cpu/v4.cpp):
// - 584-B fp8_ds_mla rows, one warp per token: lane l holds values [16 l, 16 l + 16) of the
//   512, so lanes 4k..4k+3 are NoPE tile k (k < 7) and lanes 28..31 the 64 RoPE values;
// - 528-B V4.1 MXFP8 rows, one warp per token: lane l holds values [16 l, 16 l + 16), so lanes
//   2k, 2k + 1 are 32-value tile k;
// - 68-B MXFP4 rows, four tokens per warp, eight lanes a token: lane s holds values
//   [16 s, 16 s + 16), lanes 2b, 2b + 1 are 32-value block b.
// No host synchronisation; tokens whose slot is outside the view are skipped on writes and
// read as zero rows. Device code and dispatch_* only (see write_kernels.cuh).
#pragma once
#include "../core/v4_params.h"
#include "device_util.cuh"

namespace kvc::cuda {
namespace {

constexpr int kV4NopeLanes = static_cast<int>(kV4Nope / 16);  // 28
constexpr int kMxfp4TokensPerWarp = kWarp / kIndexerLanes;      // 4

// 16 input values from element `first` on, rounded to bf16 (SPEC 10: inputs are bf16; an fp16
// or fp32 NaN becomes 0x7FC0), held as floats.
template <DType kIn>
__device__ __forceinline__ void load16_as_bf16(const void* x, int64_t first, float (&v)[16]) {
  if constexpr (kIn == DType::kFloat32) {
    uint32_t w[16];
    load_words(static_cast<const uint8_t*>(x) + 4 * first, w);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = bf16_to_float(float_to_bf16(bits_float(w[i])));
  } else {
    uint32_t w[8];
    load_words(static_cast<const uint8_t*>(x) + 2 * first, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) unpack2<kIn == DType::kFloat16>(w[i], v[2 * i], v[2 * i + 1]);
    if constexpr (kIn == DType::kFloat16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = bf16_to_float(float_to_bf16(v[i]));
    }
  }
}

// 16 values x over 2^e, e from their tile's amax (v4_mla_exponent), as e4m3 codes stored at dst;
// returns e. flush: quotients below 2^-6 (e4m3 subnormals) become +-0 (flush_below).
__device__ __forceinline__ int32_t pow2_codes16(const float* x, float amax, const V4WriteParams& p,
                                                uint8_t* dst) {
  const int32_t e = v4_mla_exponent(amax, p.scale_floor);
  // x / 2^e: by the exact reciprocal, or by IEEE division when 2^e is inf (a tile with +-inf)
  const float scale = pow2f(e), recip = exact_recip(scale);
  const float below = p.flush_subnormals ? pow2f(e - 6) : 0.0f;  // |x| < 0 never holds
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    codes[i] = pack4_e4m3(div_by(flush_below(x[4 * i], below), scale, recip),
                          div_by(flush_below(x[4 * i + 1], below), scale, recip),
                          div_by(flush_below(x[4 * i + 2], below), scale, recip),
                          div_by(flush_below(x[4 * i + 3], below), scale, recip));
  store_words(dst, codes);
  return e;
}

// Token t's 584-B row, by the 32 lanes of a warp (all of them: the amax takes shuffles).
template <DType kIn>
__device__ __forceinline__ void v4_mla_token(const V4WriteParams& p, int64_t t, int64_t slot,
                                             int lane) {
  float x[16];
  load16_as_bf16<kIn>(p.x, t * p.x_stride + 16 * lane, x);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = amax_step(amax, x[i]);
  amax = group_max<4>(amax);  // lanes 28..31's (RoPE) is unused
  if (!p.view.valid_slot(slot)) return;
  const SplitAddress a = split_address(p.view, slot, kV4DataBytes, kV4ScaleBytes);
  uint8_t* data = p.view.base + a.first;
  if (lane < kV4NopeLanes) {
    const int32_t e = pow2_codes16(x, amax, p, data + 16 * lane);
    if (lane % 4 == 0) p.view.base[a.last + lane / 4] = v4_scale_byte(e);
  } else {
    uint32_t w[8];  // RoPE: the bf16 bits as they are
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = (float_bits(x[2 * i]) >> 16) | (float_bits(x[2 * i + 1]) & 0xFFFF0000u);
    store_words(data + kV4Nope + 32 * (lane - kV4NopeLanes), w);
    if (lane == kWarp - 1) p.view.base[a.last + kV4Tiles] = 0;
  }
}

// Token t's 528-B V4.1 row, by the 32 lanes of a warp (all of them: the amax takes shuffles).
template <DType kIn>
__device__ __forceinline__ void v41_token(const V4WriteParams& p, int64_t t, int64_t slot, int lane) {
  float x[16];
  load16_as_bf16<kIn>(p.x, t * p.x_stride + 16 * lane, x);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = amax_step(amax, x[i]);
  amax = group_max<2>(amax);
  if (!p.view.valid_slot(slot)) return;
  const SplitAddress a = split_address(p.view, slot, kV41DataBytes, kV41ScaleBytes);
  const int32_t e = pow2_codes16(x, amax, p, p.view.base + a.first + 16 * lane);
  if (lane % 2 == 0) p.view.base[a.last + lane / 2] = v4_scale_byte(e);
}

// Row `row`'s 68-B MXFP4 row at `slot`, by eight lanes (sub = 0..7; pairs of lanes shuffle, so
// every lane of the warp calls this); `store` false: the lane computes but writes nothing.
template <DType kIn>
__device__ __forceinline__ void mxfp4_token(const V4WriteParams& p, int64_t row, int64_t slot,
                                            int sub, bool store) {
  float x[16];
  load16_as_bf16<kIn>(p.x, row * p.x_stride + 16 * sub, x);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = amax_step(amax, x[i]);
  amax = group_max<2>(amax);
  if (!store || !p.view.valid_slot(slot)) return;
  const int32_t e = mxfp4_exponent(amax);
  const float m = pow2f(-e);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = e2m1_encode(x[2 * i] * m) | (e2m1_encode(x[2 * i + 1] * m) << 4);
    w[i / 4] |= byte << (8 * (i % 4));
  }
  const SplitAddress a = split_address(p.view, slot, kMxfp4PackedBytes, kMxfp4ScaleBytes);
  store_words(p.view.base + a.first + 8 * sub, w);
  if (sub % 2 == 0) p.view.base[a.last + sub / 2] = static_cast<uint8_t>(e + 127);
}

template <DType kIn>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) v4_mla_write_kernel(V4WriteParams p) {
  const int64_t t = warp_row();
  if (t < p.num_tokens) v4_mla_token<kIn>(p, t, p.slots[t], threadIdx.x % kWarp);
}

template <DType kIn>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) v41_write_kernel(V4WriteParams p) {
  const int64_t t = warp_row();
  if (t < p.num_tokens) v41_token<kIn>(p, t, p.slots[t], threadIdx.x % kWarp);
}

// The main-KV row of a pair: the 584-B or the 528-B one.
template <DType kIn>
__device__ __forceinline__ void main_token(const V4WriteParams& p, int64_t t, int64_t slot, int lane) {
  if (p.format == V4Format::kMxfp8)
    v41_token<kIn>(p, t, slot, lane);
  else
    v4_mla_token<kIn>(p, t, slot, lane);
}

template <DType kIn>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mxfp4_write_kernel(V4WriteParams p) {
  const int lane = threadIdx.x % kWarp;
  const int64_t first = warp_row() * kMxfp4TokensPerWarp;
  if (first >= p.num_tokens) return;  // whole warp: shuffles below
  const int64_t t = first + lane / kIndexerLanes;
  const bool live = t < p.num_tokens;  // a dead lane group reads row `first`, writes nothing
  mxfp4_token<kIn>(p, live ? t : first, live ? p.slots[t] : -1, lane % kIndexerLanes, live);
}

// A compressed group's pair in one launch (DeepSeek-V4's dsa_write): one warp per token writes
// its main-KV row (584 B, or V4.1's 528 B), then lanes 0..7 its MXFP4 indexer row, at one slot.
template <DType kIn>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) v4_pair_write_kernel(V4WriteParams mla,
                                                                               V4WriteParams idx) {
  const int64_t t = warp_row();
  if (t >= mla.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = mla.slots[t];
  main_token<kIn>(mla, t, slot, lane);
  mxfp4_token<kIn>(idx, t, slot, lane % kIndexerLanes, lane < kIndexerLanes);
}

// Lane `lane`'s 16 codes (data + 16 lane) under scale byte `scale_byte`, as values at
// out + 16 lane values: the fp8 part of either main-KV read.
template <MlaGatherMode kMode>
__device__ __forceinline__ void decode_lane16(const uint8_t* data, uint8_t scale_byte, uint8_t* out, int lane) {
  constexpr int kOut = kMode == MlaGatherMode::kDequantBf16 ? 2 : 4;  // bytes per value
  uint32_t c[4];
  load_words(data + 16 * lane, c);
  float vals[16];
  decode_words<16>(c, pow2f(static_cast<int32_t>(scale_byte) - 127), vals);
  store_values<kMode>(out + 16 * kOut * lane, vals);
}

// The values of one 584-B row (data, footer) into out, by the lanes of one warp.
template <MlaGatherMode kMode>
__device__ __forceinline__ void v4_mla_decode_row(const uint8_t* data, const uint8_t* footer, uint8_t* out,
                                                  int lane) {
  constexpr int kOut = kMode == MlaGatherMode::kDequantBf16 ? 2 : 4;  // bytes per value
  if (lane < kV4NopeLanes) {
    decode_lane16<kMode>(data, footer[lane / 4], out, lane);  // 4 lanes per 64-value tile
  } else {
    uint32_t r[8];
    load_words(data + kV4Nope + 32 * (lane - kV4NopeLanes), r);
    uint8_t* dst = out + kOut * (kV4Nope + 16 * (lane - kV4NopeLanes));
    if constexpr (kMode == MlaGatherMode::kDequantBf16) {
      store_words(dst, r);
    } else {
      float f[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        f[2 * i] = bits_float(r[i] << 16);
        f[2 * i + 1] = bits_float(r[i] & 0xFFFF0000u);
      }
      store_values<kMode>(dst, f);
    }
  }
}

// The values of one 528-B V4.1 row (data, footer) into out, by the lanes of one warp.
template <MlaGatherMode kMode>
__device__ __forceinline__ void v41_decode_row(const uint8_t* data, const uint8_t* footer, uint8_t* out, int lane) {
  decode_lane16<kMode>(data, footer[lane / 2], out, lane);  // 2 lanes per 32-value tile
}

// A 512-value row of either main-KV format (slot valid, or < 0 for a zero row) into out, by the
// lanes of one warp: a zero row, the raw bytes (data then footer) or the decoded values.
template <MlaGatherMode kMode, int64_t kData, int64_t kFooter, V4Format kFormat>
__device__ __forceinline__ void main_read_row_as(const PagedView& v, int64_t slot, uint8_t* out, int lane) {
  if (slot < 0) {
    warp_zero(out, v4_out_row_bytes(kFormat, kMode), lane);
    return;
  }
  const SplitAddress a = split_address(v, slot, kData, kFooter);
  if constexpr (kMode == MlaGatherMode::kCopyRow) {
    warp_copy(out, v.base + a.first, kData, lane);
    if (lane < kFooter) out[kData + lane] = v.base[a.last + lane];
  } else if constexpr (kFormat == V4Format::kMxfp8) {
    v41_decode_row<kMode>(v.base + a.first, v.base + a.last, out, lane);
  } else {
    v4_mla_decode_row<kMode>(v.base + a.first, v.base + a.last, out, lane);
  }
}

template <MlaGatherMode kMode>
__device__ __forceinline__ void main_read_row(V4Format f, const PagedView& v, int64_t slot,
                                              uint8_t* out, int lane) {
  if (f == V4Format::kMxfp8)
    main_read_row_as<kMode, kV41DataBytes, kV41ScaleBytes, V4Format::kMxfp8>(v, slot, out, lane);
  else
    main_read_row_as<kMode, kV4DataBytes, kV4ScaleBytes, V4Format::kMla>(v, slot, out, lane);
}

template <MlaGatherMode kMode>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) v4_mla_gather_kernel(V4GatherParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot != kNoRow)
    main_read_row<kMode>(p.format, p.view, slot, p.out + t * p.out_stride, threadIdx.x % kWarp);
}

template <MlaGatherMode kMode>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) v4_window_gather_kernel(
    V4WindowGatherParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  bool swa;
  const int64_t slot = p.src.slot_of(t, p.c_view, p.swa_view, swa);
  if (slot != kNoRow)
    main_read_row<kMode>(p.format, swa ? p.swa_view : p.c_view, slot, p.out + t * p.out_stride,
                         threadIdx.x % kWarp);
}

template <MlaGatherMode kMode>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) mxfp4_gather_kernel(V4GatherParams p) {
  const int lane = threadIdx.x % kWarp, sub = lane % kIndexerLanes;
  const int64_t t = warp_row() * kMxfp4TokensPerWarp + lane / kIndexerLanes;
  if (t >= p.num_tokens) return;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot == kNoRow) return;
  uint8_t* out = p.out + t * p.out_stride;
  const int64_t bytes = v4_out_row_bytes(V4Format::kMxfp4, kMode);
  if (slot < 0) {
    for (int64_t i = sub; i < bytes; i += kIndexerLanes) out[i] = 0;
    return;
  }
  const SplitAddress a = split_address(p.view, slot, kMxfp4PackedBytes, kMxfp4ScaleBytes);
  if constexpr (kMode == MlaGatherMode::kCopyRow) {
    for (int64_t i = sub; i < bytes; i += kIndexerLanes)
      out[i] = i < kMxfp4PackedBytes ? p.view.base[a.first + i]
                                     : p.view.base[a.last + i - kMxfp4PackedBytes];
  } else {
    uint32_t w[2];
    load_words(p.view.base + a.first + 8 * sub, w);
    const float scale = pow2f(static_cast<int32_t>(p.view.base[a.last + sub / 2]) - 127);
    float vals[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) vals[i] = e2m1_decode(w[i / 8] >> (4 * (i % 8))) * scale;
    constexpr int kOut = kMode == MlaGatherMode::kDequantBf16 ? 2 : 4;
    store_values<kMode>(out + 16 * kOut * sub, vals);
  }
}

// ---- Which kernel a call runs. ----
template <class Launch>
void dispatch_v4_write(const V4WriteParams& p, const Launch& launch) {
  if (p.format == V4Format::kMxfp8) {
    const unsigned grid = grid_for(p.num_tokens);
    switch (p.dtype) {
      case DType::kBFloat16: return launch(v41_write_kernel<DType::kBFloat16>, grid, p);
      case DType::kFloat16: return launch(v41_write_kernel<DType::kFloat16>, grid, p);
      case DType::kFloat32: return launch(v41_write_kernel<DType::kFloat32>, grid, p);
    }
  }
  if (p.format == V4Format::kMla) {
    const unsigned grid = grid_for(p.num_tokens);
    switch (p.dtype) {
      case DType::kBFloat16: return launch(v4_mla_write_kernel<DType::kBFloat16>, grid, p);
      case DType::kFloat16: return launch(v4_mla_write_kernel<DType::kFloat16>, grid, p);
      case DType::kFloat32: return launch(v4_mla_write_kernel<DType::kFloat32>, grid, p);
    }
  }
  const unsigned grid = grid_for((p.num_tokens + kMxfp4TokensPerWarp - 1) / kMxfp4TokensPerWarp);
  switch (p.dtype) {
    case DType::kBFloat16: return launch(mxfp4_write_kernel<DType::kBFloat16>, grid, p);
    case DType::kFloat16: return launch(mxfp4_write_kernel<DType::kFloat16>, grid, p);
    case DType::kFloat32: return launch(mxfp4_write_kernel<DType::kFloat32>, grid, p);
  }
}

template <class Launch>
void dispatch_v4_pair_write(const V4WriteParams& mla, const V4WriteParams& idx, const Launch& launch) {
  const unsigned grid = grid_for(mla.num_tokens);
  switch (mla.dtype) {  // the op layer checks that both inputs share it
    case DType::kBFloat16: return launch(v4_pair_write_kernel<DType::kBFloat16>, grid, mla, idx);
    case DType::kFloat16: return launch(v4_pair_write_kernel<DType::kFloat16>, grid, mla, idx);
    case DType::kFloat32: return launch(v4_pair_write_kernel<DType::kFloat32>, grid, mla, idx);
  }
}

template <class Launch>
void dispatch_v4_gather(const V4GatherParams& p, const Launch& launch) {
  constexpr auto kRaw = MlaGatherMode::kCopyRow, kBf16 = MlaGatherMode::kDequantBf16,
                 kF32 = MlaGatherMode::kDequantF32;
  if (p.format != V4Format::kMxfp4) {  // a warp per 512-value row, either main-KV format
    const unsigned grid = grid_for(p.num_tokens);
    switch (p.mode) {
      case kRaw: return launch(v4_mla_gather_kernel<kRaw>, grid, p);
      case kBf16: return launch(v4_mla_gather_kernel<kBf16>, grid, p);
      case kF32: return launch(v4_mla_gather_kernel<kF32>, grid, p);
    }
  }
  const unsigned grid = grid_for((p.num_tokens + kMxfp4TokensPerWarp - 1) / kMxfp4TokensPerWarp);
  switch (p.mode) {
    case kRaw: return launch(mxfp4_gather_kernel<kRaw>, grid, p);
    case kBf16: return launch(mxfp4_gather_kernel<kBf16>, grid, p);
    case kF32: return launch(mxfp4_gather_kernel<kF32>, grid, p);
  }
}

template <class Launch>
void dispatch_v4_window_gather(const V4WindowGatherParams& p, const Launch& launch) {
  const unsigned grid = grid_for(p.num_tokens);
  switch (p.mode) {
    case MlaGatherMode::kCopyRow:
      return launch(v4_window_gather_kernel<MlaGatherMode::kCopyRow>, grid, p);
    case MlaGatherMode::kDequantBf16:
      return launch(v4_window_gather_kernel<MlaGatherMode::kDequantBf16>, grid, p);
    case MlaGatherMode::kDequantF32:
      return launch(v4_window_gather_kernel<MlaGatherMode::kDequantF32>, grid, p);
  }
}

}  // namespace
}  // namespace kvc::cuda
