// CPU loops of the write ops. Slots were range-checked by the op layer before the first write;
// negative slots are padding. The per-row arithmetic lives in rows.cpp (vectorized).
#include <algorithm>
#include <cstring>
#include <vector>

#include "../core/entry.h"
#include "float_env.h"
#include "prefetch.h"
#include "rows.h"
#include "stream.h"

namespace kvc::cpu {
namespace {

constexpr int64_t kGrain = 64;  // tokens per parallel chunk

const uint8_t* elem(const void* base, int64_t index, DType t) {
  return static_cast<const uint8_t*>(base) + index * dtype_size(t);
}

// Rows are built in L1, then stored: whole rows of 16-B multiples streamed (stream.h), the rest
// in place. Indexer rows are computed kBatch tokens at a time (one call of the row loops per
// batch); MLA rows one token at a time (4 tiles per call).
constexpr int64_t kBatch = 8;
constexpr int64_t kAheadRows = 2;  // MLA rows: inputs asked for this many tokens ahead

// Unquantized rows: straight byte copies of `bytes` per (token, head).
void copy_rows(int64_t num_tokens, const int64_t* slots, const PagedView& v, int64_t heads,
               const uint8_t* src, int64_t token_stride, int64_t head_stride, int64_t bytes) {
  // Heads adjacent in both the input and the view (NHC layouts): one copy per token.
  const bool fused = v.head_stride == bytes && head_stride == bytes;
  const int64_t n = fused ? 1 : heads, len = fused ? heads * bytes : bytes;
  parallel_rows(0, num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (!v.valid_slot(slots[t])) continue;
      for (int64_t h = 0; h < n; ++h)
        std::memcpy(v.row(slots[t], h), src + t * token_stride + h * head_stride, len);
    }
  });
}

}  // namespace

void plain_write(const PlainWriteParams& p) {
  const int64_t es = dtype_size(p.dtype);
  if (p.elem_stride != 0) {  // a channel-major page: one element at a time
    parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (!p.view.valid_slot(p.slots[t])) continue;
        for (int64_t h = 0; h < p.num_heads; ++h) {
          const uint8_t* src = static_cast<const uint8_t*>(
              elem(p.key, t * p.key_token_stride + h * p.key_head_stride, p.dtype));
          uint8_t* dst = p.view.row(p.slots[t], h);
          for (int64_t c = 0; c < p.head_dim; ++c) std::memcpy(dst + c * p.elem_stride, src + c * es, es);
        }
      }
    });
    return;
  }
  if (!p.fp8) {
    copy_rows(p.num_tokens, p.slots, p.view, p.num_heads, static_cast<const uint8_t*>(p.key),
              p.key_token_stride * es, p.key_head_stride * es, p.head_dim * es);
    return;
  }
  parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> staged(p.head_dim + 16);
    uint8_t* buf = staged.data() + (-reinterpret_cast<uintptr_t>(staged.data()) & 15);
    for (int64_t t = begin; t < end; ++t) {
      if (!p.view.valid_slot(p.slots[t])) continue;
      for (int64_t h = 0; h < p.num_heads; ++h) {
        uint8_t* dst = p.view.row(p.slots[t], h);
        const bool stream = streams(dst, p.head_dim);
        quantize_row(elem(p.key, t * p.key_token_stride + h * p.key_head_stride, p.dtype), p.dtype,
                     p.head_dim, p.scale.get(h), stream ? buf : dst);
        if (stream) stream_row(dst, buf, p.head_dim);
      }
    }
    store_fence();
  });
}

// Per-tensor fp8 rows (DeepSeek-V3/R1): the codes of kv_c, then those of k_pe, one scale.
static void mla_fp8_tensor_write(const MlaWriteParams& p) {
  const float scale = p.scale.get();
  parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) uint8_t row[kMlaDim];
    for (int64_t t = begin; t < end; ++t) {
      if (!p.view.valid_slot(p.slots[t])) continue;
      quantize_row(elem(p.kv_c, t * p.kv_c_stride, p.dtype), p.dtype, kMlaLatentDim, scale, row);
      quantize_row(elem(p.k_pe, t * p.k_pe_stride, p.dtype), p.dtype, kMlaRopeDim, scale,
                   row + kMlaLatentDim);
      stream_row(p.view.row(p.slots[t]), row, kMlaDim);
    }
    store_fence();
  });
}

void mla_write(const MlaWriteParams& p) {
  const int64_t es = dtype_size(p.dtype);
  if (p.format == MlaFormat::kFp8Tensor) return mla_fp8_tensor_write(p);
  if (p.format == MlaFormat::kAuto) {  // 512 then 64 values of the input dtype, one pass over the rows
    const auto* kv_c = static_cast<const uint8_t*>(p.kv_c);
    const auto* k_pe = static_cast<const uint8_t*>(p.k_pe);
    parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (!p.view.valid_slot(p.slots[t])) continue;
        uint8_t* row = p.view.row(p.slots[t]);
        std::memcpy(row, kv_c + t * p.kv_c_stride * es, kMlaLatentDim * es);
        std::memcpy(row + kMlaLatentDim * es, k_pe + t * p.k_pe_stride * es, kMlaRopeDim * es);
      }
    });
    return;
  }
  parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    uint16_t rope[kMlaRopeDim];
    alignas(64) uint8_t staged[kMlaFp8RowBytes];
    for (int64_t t = begin; t < end; ++t) {
      if (t + kAheadRows < end) {
        prefetch_lines(elem(p.kv_c, (t + kAheadRows) * p.kv_c_stride, p.dtype), kMlaLatentDim * es);
        prefetch_lines(elem(p.k_pe, (t + kAheadRows) * p.k_pe_stride, p.dtype), kMlaRopeDim * es);
      }
      const int64_t slot = p.slots[t];
      if (!p.view.valid_slot(slot)) continue;
      uint8_t* const dst = p.view.row(slot);
      uint8_t* row = staged;
      const uint8_t* kv_c = elem(p.kv_c, t * p.kv_c_stride, p.dtype);
      constexpr int64_t kTiles = kMlaLatentDim / kMlaTile;
      float scales[kTiles];
      tile_amax(kv_c, p.dtype, kTiles, kMlaTile, kMlaTile, scales);
      for (float& s : scales) s = mla_tile_scale(s, p.tile_scale);
      quantize_tiles(kv_c, p.dtype, kTiles, kMlaTile, kMlaTile, scales, row);
      std::memcpy(row + kMlaScalesOffset, scales, sizeof(scales));
      // Rope values stored as bf16: bf16 input bit for bit, fp16 rounded to nearest even.
      const uint8_t* k_pe = elem(p.k_pe, t * p.k_pe_stride, p.dtype);
      if (p.dtype == DType::kBFloat16) {
        std::memcpy(row + kMlaRopeOffset, k_pe, sizeof(rope));
      } else {
        for (int64_t i = 0; i < kMlaRopeDim; ++i) rope[i] = float_to_bf16(load_as_float(k_pe, i, p.dtype));
        std::memcpy(row + kMlaRopeOffset, rope, sizeof(rope));
      }
      stream_row(dst, staged, kMlaFp8RowBytes);
    }
    store_fence();
  });
}

void indexer_write(const IndexerWriteParams& p) {
  const bool split = p.placement == IndexerPlacement::kSplit;
  parallel_rows(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    alignas(64) uint8_t codes[kBatch][kIndexerDim];
    float scales[kBatch];
    for (int64_t b = begin; b < end; b += kBatch) {
      const int64_t n = std::min(kBatch, end - b);
      // ask for the next batch's lines now, so they arrive while this one is computed: its
      // inputs (the hardware prefetcher falls behind among the random stores) and its rows at
      // random slots (padding tokens' codes are computed and dropped)
      for (int64_t i = b + kBatch; i < std::min(b + 2 * kBatch, end); ++i) {
        prefetch_lines(elem(p.k, i * p.k_stride, p.dtype), kIndexerDim * dtype_size(p.dtype));
        if (!p.view.valid_slot(p.slots[i])) continue;
        const IndexerAddress a = indexer_address(p.view, p.slots[i], p.placement);
        if (!split) prefetch_lines(p.view.base + a.codes, kIndexerDim, true);  // codes stored in place
        prefetch_lines(p.view.base + a.scale, 4, true);
      }
      const uint8_t* k = elem(p.k, b * p.k_stride, p.dtype);
      tile_amax(k, p.dtype, n, kIndexerDim, p.k_stride, scales);
      for (int64_t i = 0; i < n; ++i) scales[i] = indexer_scale(scales[i], p.ue8m0);
      quantize_tiles(k, p.dtype, n, kIndexerDim, p.k_stride, scales, codes[0]);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = p.slots[b + i];
        if (!p.view.valid_slot(slot)) continue;
        const IndexerAddress a = indexer_address(p.view, slot, p.placement);
        // split pages: 128 codes at 128-B steps, streamed; 132-B rows: in place (a streamed
        // row would share its last line with the scale's regular store)
        if (split) stream_row(p.view.base + a.codes, codes[i], kIndexerDim);
        else std::memcpy(p.view.base + a.codes, codes[i], kIndexerDim);
        std::memcpy(p.view.base + a.scale, &scales[i], 4);
      }
    }
    store_fence();
  });
}

}  // namespace kvc::cpu
