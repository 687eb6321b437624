// CUDA gathers: one warp per output token. The token's slot comes from explicit slots or from
// (block_table, cu_seq_lens, seq_starts) via TokenSource; tokens without a valid slot read as
// zero rows, so no input can make a kernel read outside its view.
//
// Device code only, and the choice of kernel for a call (dispatch_*); see write_kernels.cuh.
#pragma once
#include "../kernels.h"
#include "device_util.cuh"

namespace kvc::cuda {
namespace {

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return float_to_bf16(lo) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

// Lane l dequantizes codes [16 l, 16 l + 16) (tile l / 8); lanes 0..7 (bf16) or 0..15 (fp32)
// carry the rope values.
template <MlaGatherMode kMode>
__global__ void mla_gather_kernel(MlaGatherParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  uint8_t* out = p.out + t * p.out_stride;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot < 0) {
    warp_zero(out, mla_gather_row_bytes(p), lane);
    return;
  }
  const uint8_t* row = p.view.row(slot);
  if constexpr (kMode == MlaGatherMode::kCopyRow) {
    warp_copy(out, row, p.view.row_bytes, lane);
  } else {
    uint32_t c[4], s[1];
    load_words(row + 16 * lane, c);
    load_words(row + kMlaScalesOffset + 4 * (lane / 8), s);
    const float scale = bits_float(s[0]);
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = e4m3_decode(static_cast<uint8_t>(c[i / 4] >> (8 * (i % 4)))) * scale;
    const uint8_t* rope = row + kMlaRopeOffset;
    if constexpr (kMode == MlaGatherMode::kDequantBf16) {
      uint32_t w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
      store_words(out + 32 * lane, w);
      if (lane < 8) {
        uint32_t r[4];
        load_words(rope + 16 * lane, r);
        store_words(out + 2 * kMlaLatentDim + 16 * lane, r);
      }
    } else {
      uint32_t w[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i] = float_bits(v[i]);
      store_words(out + 64 * lane, w);
      if (lane < 16) {
        uint32_t r[2], f[4];
        load_words(rope + 8 * lane, r);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          f[2 * i] = r[i] << 16;
          f[2 * i + 1] = r[i] & 0xFFFF0000u;
        }
        store_words(out + 4 * kMlaLatentDim + 16 * lane, f);
      }
    }
  }
}

// Lane l copies codes [4 l, 4 l + 4); lane 0 the scale.
__global__ void indexer_gather_kernel(IndexerGatherParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  uint8_t* codes = p.codes + t * p.codes_stride;
  const int64_t slot = p.src.slot_of(t, p.view);
  uint32_t w[1] = {0}, s[1] = {0};
  if (slot >= 0) {
    const IndexerAddress a = indexer_address(p.view, slot, p.placement);
    load_words(p.view.base + a.codes + 4 * lane, w);
    if (lane == 0) load_words(p.view.base + a.scale, s);
  }
  store_words(codes + 4 * lane, w);
  if (lane == 0) p.scales[t] = bits_float(s[0]);
}

template <class Launch>
void dispatch_mla_gather(const MlaGatherParams& p, const Launch& launch) {
  const unsigned grid = grid_for(p.num_tokens);
  switch (p.mode) {
    case MlaGatherMode::kCopyRow:
      launch(mla_gather_kernel<MlaGatherMode::kCopyRow>, grid, p);
      break;
    case MlaGatherMode::kDequantBf16:
      launch(mla_gather_kernel<MlaGatherMode::kDequantBf16>, grid, p);
      break;
    case MlaGatherMode::kDequantF32:
      launch(mla_gather_kernel<MlaGatherMode::kDequantF32>, grid, p);
      break;
  }
}

template <class Launch>
void dispatch_indexer_gather(const IndexerGatherParams& p, const Launch& launch) {
  launch(indexer_gather_kernel, grid_for(p.num_tokens), p);
}

}  // namespace
}  // namespace kvc::cuda
