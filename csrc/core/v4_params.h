// Parameters of DeepSeek-V4's row kernels (formats in v4_rows.h), shared by the CPU loops
// (cpu/v4.cpp) and the CUDA kernels (cuda/v4_kernels.cuh); entry points in entry.h.
#pragma once
#include <cstdint>

#include "params.h"
#include "v4_rows.h"

namespace kvc {

enum class V4Format : int32_t {
  kMla = 0,    // "fp8_ds_mla_v4": 584 B fp8_ds_mla rows <-> 512 values
  kMxfp4 = 1,  // "mxfp4": 68 B MXFP4 indexer rows <-> 128 values
  kMxfp8 = 2,  // "v41_mxfp8": 528 B DeepSeek-V4.1 rows <-> 512 values
};

KVC_HD int64_t v4_dim(V4Format f) { return f == V4Format::kMxfp4 ? kMxfp4Dim : kV4Dim; }
KVC_HD int64_t v4_row_bytes(V4Format f) {
  return f == V4Format::kMla ? kV4RowBytes : f == V4Format::kMxfp8 ? kV41RowBytes : kMxfp4RowBytes;
}
// (data, footer) bytes of a row in its split page.
KVC_HD int64_t v4_data_bytes(V4Format f) {
  return f == V4Format::kMla ? kV4DataBytes : f == V4Format::kMxfp8 ? kV41DataBytes : kMxfp4PackedBytes;
}
KVC_HD int64_t v4_footer_bytes(V4Format f) {
  return f == V4Format::kMla ? kV4ScaleBytes : f == V4Format::kMxfp8 ? kV41ScaleBytes : kMxfp4ScaleBytes;
}

KVC_HD SplitAddress v4_address(const PagedView& v, int64_t slot, V4Format f) {
  return split_address(v, slot, v4_data_bytes(f), v4_footer_bytes(f));
}

// Writes: x [T, v4_dim] -> quantized rows at slots (slot < 0 or outside the view: skipped).
struct V4WriteParams {
  const void* x;
  int64_t x_stride;  // elements between tokens
  DType dtype;
  V4Format format;
  bool scale_floor;  // kMla, kMxfp8: floor the scale (CuTe DSL) instead of the amax (canonical)
  bool flush_subnormals;  // kMla, kMxfp8: |x / 2^e| < 2^-6 -> +-0 (vLLM-CPU's window writer)
  PagedView view;
  const int64_t* slots;
  int64_t num_tokens;
};

// Output row of a V4 read: raw bytes (data then footer), or values as bf16 / fp32.
KVC_HD int64_t v4_out_row_bytes(V4Format f, MlaGatherMode m) {
  return m == MlaGatherMode::kCopyRow ? v4_row_bytes(f)
                                      : v4_dim(f) * (m == MlaGatherMode::kDequantF32 ? 4 : 2);
}

struct V4GatherParams {
  PagedView view;
  TokenSource src;
  int64_t num_tokens;
  V4Format format;
  MlaGatherMode mode;
  uint8_t* out;
  int64_t out_stride;  // bytes
};

// Rows of a read that concatenates, per request, its compressed rows and its SWA window
// (vLLM's dequantize_and_gather_k_cache): request r of length L = seq_lens[r] owns output rows
// cu_out[r] .. cu_out[r + 1]: first n_c = L / ratio compressed rows 0 .. n_c - 1, then the
// n_w = min(L, window) SWA rows of positions L - n_w .. L - 1.
struct CompressedSwaSource {
  const int32_t* c_block_table;  // [num_reqs, c_max_blocks], row stride c_bt_stride
  int64_t c_bt_stride, c_max_blocks;
  const int32_t* swa_block_table;
  int64_t swa_bt_stride, swa_max_blocks;
  const int32_t* seq_lens;  // [num_reqs]
  const int32_t* cu_out;    // [num_reqs + 1]
  int64_t num_reqs;
  int64_t ratio, window;

  // Slot of output row t in the compressed view (swa = false) or the SWA view (swa = true);
  // kZeroRow for a position whose block is outside its view, kNoRow for rows no request owns.
  KVC_HD int64_t slot_of(int64_t t, const PagedView& c, const PagedView& s, bool& swa) const {
    swa = false;
    if (num_reqs <= 0 || t < cu_out[0] || t >= cu_out[num_reqs]) return kNoRow;
    int64_t lo = 0, hi = num_reqs;  // r with cu_out[r] <= t < cu_out[r + 1]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (cu_out[mid] <= t) lo = mid; else hi = mid;
    }
    const int64_t len = seq_lens[lo] > 0 ? seq_lens[lo] : 0;
    const int64_t n_c = len / ratio, n_w = len < window ? len : window;
    int64_t i = t - cu_out[lo];
    if (i < n_c) return block_table_slot(c_block_table + lo * c_bt_stride, c_max_blocks, i, c);
    i -= n_c;
    if (i >= n_w) return kNoRow;  // cu_out gives the request more rows than it has
    swa = true;
    return block_table_slot(swa_block_table + lo * swa_bt_stride, swa_max_blocks, len - n_w + i, s);
  }
};

struct V4WindowGatherParams {
  PagedView c_view, swa_view;  // views of `format` rows (kMla or kMxfp8)
  V4Format format;
  CompressedSwaSource src;
  int64_t num_tokens;  // rows of out
  MlaGatherMode mode;
  uint8_t* out;
  int64_t out_stride;
};


}  // namespace kvc
