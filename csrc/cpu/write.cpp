// CPU loops of the write ops. Slots were range-checked by the op layer before the first write;
// negative slots are padding.
#include <ATen/Parallel.h>

#include <cstring>

#include "../kernels.h"

namespace kvc::cpu {
namespace {

constexpr int64_t kGrain = 64;  // tokens per parallel chunk

// Loads n elements starting at src into floats.
void load_floats(const void* src, int64_t n, DType t, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = load_as_float(src, i, t);
}

float amax_of(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = fmax_(m, abs_for_amax(x[i]));
  return m;
}

void encode(const float* x, int64_t n, float scale, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_encode(x[i] / scale);
}

const uint8_t* elem_ptr(const void* base, int64_t index, DType t) {
  return static_cast<const uint8_t*>(base) + index * dtype_size(t);
}

// 64 rope values as bf16: bf16 input copied bit for bit, others rounded.
void store_rope_bf16(const void* k_pe, DType t, uint8_t* dst) {
  if (t == DType::kBFloat16) {
    std::memcpy(dst, k_pe, 2 * kMlaRopeDim);
    return;
  }
  for (int64_t i = 0; i < kMlaRopeDim; ++i) {
    const uint16_t h = float_to_bf16(load_as_float(k_pe, i, t));
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

}  // namespace

void plain_write(const PlainWriteParams& p) {
  const int64_t esize = dtype_size(p.dtype);
  at::parallel_for(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    float buf[1024];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slots[t];
      if (!p.view.valid_slot(slot)) continue;
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const uint8_t* src = elem_ptr(p.key, t * p.key_token_stride + h * p.key_head_stride,
                                      p.dtype);
        uint8_t* dst = p.view.row(slot, h);
        if (!p.fp8) {
          std::memcpy(dst, src, p.head_dim * esize);
          continue;
        }
        const float scale = *p.scale;
        for (int64_t d0 = 0; d0 < p.head_dim; d0 += 1024) {
          const int64_t n = std::min<int64_t>(1024, p.head_dim - d0);
          load_floats(src + d0 * esize, n, p.dtype, buf);
          encode(buf, n, scale, dst + d0);
        }
      }
    }
  });
}

void mla_write(const MlaWriteParams& p) {
  const int64_t esize = dtype_size(p.dtype);
  at::parallel_for(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    float x[kMlaTile];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slots[t];
      if (!p.view.valid_slot(slot)) continue;
      uint8_t* row = p.view.row(slot);
      const uint8_t* kv_c = elem_ptr(p.kv_c, t * p.kv_c_stride, p.dtype);
      const uint8_t* k_pe = elem_ptr(p.k_pe, t * p.k_pe_stride, p.dtype);
      if (!p.fp8) {  // unquantized: 512 then 64 values of the input dtype
        std::memcpy(row, kv_c, kMlaLatentDim * esize);
        std::memcpy(row + kMlaLatentDim * esize, k_pe, kMlaRopeDim * esize);
        continue;
      }
      for (int64_t k = 0; k < kMlaLatentDim / kMlaTile; ++k) {
        load_floats(kv_c + k * kMlaTile * esize, kMlaTile, p.dtype, x);
        const float scale = mla_tile_scale(amax_of(x, kMlaTile));
        encode(x, kMlaTile, scale, row + k * kMlaTile);
        std::memcpy(row + kMlaScalesOffset + 4 * k, &scale, 4);
      }
      store_rope_bf16(k_pe, p.dtype, row + kMlaRopeOffset);
    }
  });
}

void indexer_write(const IndexerWriteParams& p) {
  at::parallel_for(0, p.num_tokens, kGrain, [&](int64_t begin, int64_t end) {
    float x[kIndexerDim];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slots[t];
      if (!p.view.valid_slot(slot)) continue;
      load_floats(elem_ptr(p.k, t * p.k_stride, p.dtype), kIndexerDim, p.dtype, x);
      const float scale = indexer_scale(amax_of(x, kIndexerDim), p.ue8m0);
      const IndexerAddress a = indexer_address(p.view, slot, p.placement);
      encode(x, kIndexerDim, scale, p.view.base + a.codes);
      std::memcpy(p.view.base + a.scale, &scale, 4);
    }
  });
}

}  // namespace kvc::cpu
