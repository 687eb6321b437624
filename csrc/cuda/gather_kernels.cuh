// CUDA gathers: one warp per output token. The token's slot comes from explicit slots or from
// (block_table, cu_seq_lens, seq_starts) via TokenSource; tokens without a valid slot read as
// zero rows, so no input can make a kernel read outside its view.
//
// Device code only, and the choice of kernel for a call (dispatch_*); see write_kernels.cuh.
#pragma once
#include "../core/params.h"
#include "device_util.cuh"

namespace kvc::cuda {
namespace {

// Per-tensor fp8 rows (576 codes, one scale): lane l decodes codes [16 l, 16 l + 16), lanes
// 0..7 also the rope codes [512 + 8 l, 512 + 8 l + 8).
template <MlaGatherMode kMode>
__device__ __forceinline__ void mla_gather_fp8_tensor(const MlaGatherParams& p, const uint8_t* row,
                                                      uint8_t* out, int lane) {
  constexpr int kOut = kMode == MlaGatherMode::kDequantBf16 ? 2 : 4;  // bytes per value
  const float scale = p.scale.get();
  uint32_t c[4];
  load_words(row + 16 * lane, c);
  float v[16];
  decode_words<16>(c, scale, v);
  store_values<kMode>(out + 16 * kOut * lane, v);
  if (lane < 8) {
    uint32_t r[2];
    load_words(row + kMlaLatentDim + 8 * lane, r);
    float w[8];
    decode_words<8>(r, scale, w);
    store_values<kMode>(out + kOut * (kMlaLatentDim + 8 * lane), w);
  }
}

// Lane l dequantizes codes [16 l, 16 l + 16) (tile l / 8); lanes 0..7 (bf16) or 0..15 (fp32)
// carry the rope values. Rows past the last request's tokens (kNoRow) are left alone.
template <MlaGatherMode kMode, MlaFormat kFormat>
__global__ void mla_gather_kernel(MlaGatherParams p) {
  const int64_t t = warp_row();
  if (t >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarp;
  uint8_t* out = p.out + t * p.out_stride;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot == kNoRow) return;
  if (slot < 0) {
    warp_zero(out, mla_gather_row_bytes(p), lane);
    return;
  }
  const uint8_t* row = p.view.row(slot);
  if constexpr (kMode == MlaGatherMode::kCopyRow) {
    warp_copy(out, row, p.view.row_bytes, lane);
  } else if constexpr (kFormat == MlaFormat::kFp8Tensor) {
    mla_gather_fp8_tensor<kMode>(p, row, out, lane);
  } else {
    uint32_t c[4], s[1];
    load_words(row + 16 * lane, c);
    load_words(row + kMlaScalesOffset + 4 * (lane / 8), s);
    const float scale = bits_float(s[0]);
    float v[16];
    decode_words<16>(c, scale, v);
    store_values<kMode>(out + (kMode == MlaGatherMode::kDequantBf16 ? 32 : 64) * lane, v);
    const uint8_t* rope = row + kMlaRopeOffset;
    if constexpr (kMode == MlaGatherMode::kDequantBf16) {
      if (lane < 8) {
        uint32_t r[4];
        load_words(rope + 16 * lane, r);
        store_words(out + 2 * kMlaLatentDim + 16 * lane, r);
      }
    } else {
      if (lane < 16) {
        uint32_t r[2];
        load_words(rope + 8 * lane, r);
        const float f[4] = {bits_float(r[0] << 16), bits_float(r[0] & 0xFFFF0000u),
                            bits_float(r[1] << 16), bits_float(r[1] & 0xFFFF0000u)};
        store_values<kMode>(out + 4 * kMlaLatentDim + 16 * lane, f);
      }
    }
  }
}

// Four tokens per warp (132-byte rows are short): lane l of a token's 8 copies codes
// [16 l, 16 l + 16), lane 0 also the scale.
__global__ void indexer_gather_kernel(IndexerGatherParams p) {
  const int lane = threadIdx.x % kWarp, sub = lane % kIndexerLanes;
  const int64_t t = warp_row() * kIndexerTokensPerWarp + lane / kIndexerLanes;
  if (t >= p.num_tokens) return;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot == kNoRow) return;
  uint32_t w[4] = {0, 0, 0, 0}, s[1] = {0};
  if (slot >= 0) {
    const IndexerAddress a = indexer_address(p.view, slot, p.placement);
    load_words(p.view.base + a.codes + 16 * sub, w);
    if (sub == 0) load_words(p.view.base + a.scale, s);
  }
  store_words(p.codes + t * p.codes_stride + 16 * sub, w);
  if (sub == 0) p.scales[t] = bits_float(s[0]);
}

// One warp per (token, head): a copied row, or e4m3 codes decoded with the head's scale.
__global__ void kv_gather_kernel(KvGatherParams p) {
  const int64_t r = warp_row();
  const int64_t heads = p.view.num_heads;
  if (r >= p.num_tokens * heads) return;
  const int64_t t = r / heads, h = r - t * heads;
  const int lane = threadIdx.x % kWarp;
  const int64_t slot = p.src.slot_of(t, p.view);
  if (slot == kNoRow) return;
  uint8_t* out = p.out + t * p.out_token_stride + h * p.out_head_stride;
  const int64_t bytes = p.head_dim * dtype_size(p.dtype);
  if (slot < 0) {
    warp_zero(out, bytes, lane);
    return;
  }
  const uint8_t* row = p.view.row(slot, h);
  if (!p.fp8) {
    warp_copy(out, row, bytes, lane);
    return;
  }
  const float scale = p.scale.get(h);
  for (int64_t i = lane; i < p.head_dim; i += kWarp)
    store_float(out, i, e4m3_decode(row[i]) * scale, p.dtype);
}

template <class Launch>
void dispatch_kv_gather(const KvGatherParams& p, const Launch& launch) {
  launch(kv_gather_kernel, grid_for(p.num_tokens * p.view.num_heads), p);
}

template <class Launch>
void dispatch_mla_gather(const MlaGatherParams& p, const Launch& launch) {
  const unsigned grid = grid_for(p.num_tokens);
  constexpr MlaFormat kDs = MlaFormat::kFp8DsMla, kTensor = MlaFormat::kFp8Tensor;
  const bool tensor = p.format == kTensor;
  switch (p.mode) {
    case MlaGatherMode::kCopyRow:
      launch(mla_gather_kernel<MlaGatherMode::kCopyRow, kDs>, grid, p);
      break;
    case MlaGatherMode::kDequantBf16:
      tensor ? launch(mla_gather_kernel<MlaGatherMode::kDequantBf16, kTensor>, grid, p)
             : launch(mla_gather_kernel<MlaGatherMode::kDequantBf16, kDs>, grid, p);
      break;
    case MlaGatherMode::kDequantF32:
      tensor ? launch(mla_gather_kernel<MlaGatherMode::kDequantF32, kTensor>, grid, p)
             : launch(mla_gather_kernel<MlaGatherMode::kDequantF32, kDs>, grid, p);
      break;
  }
}

template <class Launch>
void dispatch_indexer_gather(const IndexerGatherParams& p, const Launch& launch) {
  launch(indexer_gather_kernel,
         grid_for((p.num_tokens + kIndexerTokensPerWarp - 1) / kIndexerTokensPerWarp), p);
}

}  // namespace
}  // namespace kvc::cuda
