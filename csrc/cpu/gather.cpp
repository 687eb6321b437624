// CPU loops of the gathers. Tokens without a valid slot come back as zero rows; output rows past
// the last request's tokens are left as they are.
#include <ATen/Parallel.h>

#include <cstring>

#include "../kernels.h"
#include "rows.h"

namespace kvc::cpu {

void mla_gather(const MlaGatherParams& p) {
  const int64_t out_bytes = mla_gather_row_bytes(p);
  at::parallel_for(0, p.num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      uint8_t* out = p.out + t * p.out_stride;
      const int64_t slot = p.src.slot_of(t, p.view);
      if (slot == kNoRow) continue;
      if (slot < 0) {
        std::memset(out, 0, out_bytes);
        continue;
      }
      const uint8_t* row = p.view.row(slot);
      if (p.mode == MlaGatherMode::kCopyRow) {
        std::memcpy(out, row, out_bytes);
        continue;
      }
      const bool bf16 = p.mode == MlaGatherMode::kDequantBf16;
      if (p.format == MlaFormat::kFp8Tensor) {  // 576 codes, one scale
        decode_row(row, kMlaDim, p.scale.get(), bf16, out);
        continue;
      }
      for (int64_t k = 0; k < kMlaLatentDim / kMlaTile; ++k) {
        float scale;
        std::memcpy(&scale, row + kMlaScalesOffset + 4 * k, 4);
        decode_row(row + k * kMlaTile, kMlaTile, scale, bf16, out + k * kMlaTile * (bf16 ? 2 : 4));
      }
      const uint8_t* rope = row + kMlaRopeOffset;
      if (bf16) {
        std::memcpy(out + 2 * kMlaLatentDim, rope, 2 * kMlaRopeDim);
      } else {
        for (int64_t i = 0; i < kMlaRopeDim; ++i) {
          uint16_t h;
          std::memcpy(&h, rope + 2 * i, 2);
          const float v = canonical_nan(bf16_to_float(h));
          std::memcpy(out + 4 * (kMlaLatentDim + i), &v, 4);
        }
      }
    }
  });
}

void indexer_gather(const IndexerGatherParams& p) {
  at::parallel_for(0, p.num_tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
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
