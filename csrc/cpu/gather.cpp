// CPU loops of the gathers. Tokens without a valid slot come back as zero rows; output rows past
// the last request's tokens are left as they are.
#include <cstring>

#include "../core/entry.h"
#include "float_env.h"
#include "gather_rows.h"
#include "rows.h"

namespace kvc::cpu {
void mla_gather(const MlaGatherParams& p) {
  const int64_t out_bytes = mla_gather_row_bytes(p);
  const bool bf16 = p.mode == MlaGatherMode::kDequantBf16;
  const DType out_dtype = bf16 ? DType::kBFloat16 : DType::kFloat32;
  gather_rows(p.num_tokens, p.out, p.out_stride, out_bytes,
              token_locator(p.src, p.view, p.view.row_bytes),
              [&](const PagedView& v, int64_t slot, uint8_t* out) {
    const uint8_t* row = v.row(slot);
    if (p.mode == MlaGatherMode::kCopyRow) {
      std::memcpy(out, row, out_bytes);
      return;
    }
    if (p.format == MlaFormat::kFp8Tensor) {  // 576 codes, one scale
      decode_row(row, kMlaDim, p.scale.get(), out_dtype, out);
      return;
    }
    for (int64_t k = 0; k < kMlaLatentDim / kMlaTile; ++k) {
      float scale;
      std::memcpy(&scale, row + kMlaScalesOffset + 4 * k, 4);
      decode_row(row + k * kMlaTile, kMlaTile, scale, out_dtype, out + k * kMlaTile * (bf16 ? 2 : 4));
    }
    const uint8_t* rope = row + kMlaRopeOffset;
    if (bf16) {
      std::memcpy(out + 2 * kMlaLatentDim, rope, 2 * kMlaRopeDim);
    } else {
      for (int64_t i = 0; i < kMlaRopeDim; ++i) {
        uint16_t h;
        std::memcpy(&h, rope + 2 * i, 2);
        const float f = canonical_nan(bf16_to_float(h));
        std::memcpy(out + 4 * (kMlaLatentDim + i), &f, 4);
      }
    }
  });
}

void kv_gather(const KvGatherParams& p) {
  const int64_t out_bytes = p.head_dim * dtype_size(p.dtype);
  parallel_rows(0, p.num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (p.view.num_heads == 1) prefetch_slot_row(p.src, p.view, t, end, p.view.row_bytes);
      const int64_t slot = p.src.slot_of(t, p.view);
      if (slot == kNoRow) continue;
      for (int64_t h = 0; h < p.view.num_heads; ++h) {
        uint8_t* out = p.out + t * p.out_token_stride + h * p.out_head_stride;
        if (slot < 0)
          std::memset(out, 0, out_bytes);
        else if (p.fp8)
          decode_row(p.view.row(slot, h), p.head_dim, p.scale.get(h), p.dtype, out);
        else
          std::memcpy(out, p.view.row(slot, h), out_bytes);
      }
    }
  });
}

void indexer_gather(const IndexerGatherParams& p) {
  parallel_rows(0, p.num_tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (p.src.slots != nullptr && t + kAhead < end && p.view.valid_slot(p.src.slots[t + kAhead])) {
        const IndexerAddress n = indexer_address(p.view, p.src.slots[t + kAhead], p.placement);
        prefetch_lines(p.view.base + n.codes, kIndexerDim);
        prefetch_lines(p.view.base + n.scale, 4);
      }
      uint8_t* codes = p.codes + t * p.codes_stride;
      const int64_t slot = p.src.slot_of(t, p.view);
      if (slot == kNoRow) continue;
      if (slot < 0) {
        std::memset(codes, 0, kIndexerDim);
        p.scales[t] = 0.0f;
        continue;
      }
      const IndexerAddress a = indexer_address(p.view, slot, p.placement);
      std::memcpy(codes, p.view.base + a.codes, kIndexerDim);
      std::memcpy(p.scales + t, p.view.base + a.scale, 4);
    }
  });
}

}  // namespace kvc::cpu
