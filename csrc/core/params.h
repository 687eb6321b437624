// Plain parameter structs shared by the CPU loops and the CUDA kernels (entry points: entry.h).
// The op layer (csrc/ops) validates tensors and fills these; kernels never see a Tensor, which
// keeps the .cu files free of torch headers (fast nvcc builds).
#pragma once
#include <cstdint>

#include "numerics.h"
#include "paged_view.h"

namespace kvc {

// A per-tensor fp8 scale: read by the kernel from memory on the view's device (ptr), or passed
// by value when the caller's scale is a host tensor or a Python float (then checked finite and
// > 0 before anything runs).
struct TensorScale {
  const float* ptr;  // nullptr: use value
  float value;
  int64_t stride;    // 0: one scale for every head; 1: one per head (ptr only)
  KVC_HD float get(int64_t head = 0) const { return ptr != nullptr ? ptr[head * stride] : value; }
};

// Tile scales of fp8_ds_mla rows (SPEC 3): kPow2, the default, stores 2^ceil(log2(max(amax / 448,
// 1e-4))) (vLLM since PR #49435: FlashMLA's readers convert the scale to bf16 or E8M0, which only
// a power of two survives); kFp32 stores max(amax / 448, FLT_MIN) (engines before that change).
enum class TileScale : int32_t { kPow2 = 0, kFp32 = 1 };

// Row formats of the MLA ops.
enum class MlaFormat : int32_t {
  kAuto = 0,       // 576 values of the input dtype, copied
  kFp8DsMla = 1,   // 656 B: 4 tiles of e4m3 codes, 4 fp32 tile scales, 64 bf16 rope values
  kFp8Tensor = 2,  // 576 B: e4m3 codes of kv_c then k_pe, one per-tensor scale (DeepSeek-V3/R1)
};

// reshape_and_cache: [T, H, D] rows copied as they are, or encoded to fp8 with a per-tensor scale.
struct PlainWriteParams {
  const void* key;
  int64_t key_token_stride;  // elements
  int64_t key_head_stride;   // elements
  DType dtype;
  int64_t num_heads;
  int64_t head_dim;
  bool fp8;
  TensorScale scale;  // fp8 only: per tensor or per head
  PagedView view;
  const int64_t* slots;
  int64_t num_tokens;
  // Bytes between a row's elements in the cache; 0: they are contiguous. A channel-major page
  // (vLLM-CPU's K: element c of token n at (c x block_size + n) x es) has block_size x es, its
  // view's token_stride es. Unquantized rows only.
  int64_t elem_stride;
};

// concat_and_cache_mla: kv_c [T, 512] + k_pe [T, 64] -> a row of `format`.
struct MlaWriteParams {
  const void* kv_c;
  int64_t kv_c_stride;  // elements between tokens
  const void* k_pe;
  int64_t k_pe_stride;
  DType dtype;
  MlaFormat format;
  TensorScale scale;  // kFp8Tensor only
  TileScale tile_scale;  // kFp8DsMla only
  PagedView view;
  const int64_t* slots;
  int64_t num_tokens;
};

// indexer_k_quant_and_cache: k [T, 128] -> 128 fp8 codes + fp32 scale.
struct IndexerWriteParams {
  const void* k;
  int64_t k_stride;
  DType dtype;
  bool ue8m0;
  IndexerPlacement placement;
  PagedView view;
  const int64_t* slots;
  int64_t num_tokens;
};

enum class MlaGatherMode : int32_t {
  kCopyRow = 0,      // the stored row as it is (656 or 576 raw bytes, or an unquantized row)
  kDequantBf16 = 1,  // fp8 rows -> 576 bf16
  kDequantF32 = 2,   // fp8 rows -> 576 fp32 (NaN canonical: 0x7FC00000)
};

struct MlaGatherParams {
  PagedView view;
  TokenSource src;
  int64_t num_tokens;
  MlaGatherMode mode;
  MlaFormat format;
  TensorScale scale;  // kFp8Tensor only
  uint8_t* out;
  int64_t out_stride;  // bytes between output rows
};

// Bytes of one output row of an MLA gather.
KVC_HD int64_t mla_gather_row_bytes(const MlaGatherParams& p) {
  return p.mode == MlaGatherMode::kDequantBf16 ? 2 * kMlaDim
         : p.mode == MlaGatherMode::kDequantF32 ? 4 * kMlaDim
                                                : p.view.row_bytes;
}

// gather_kv: [T, H, D] rows through a block table, copied (C = D x itemsize) or decoded from
// e4m3 codes (C = D) with a per-tensor or per-head scale.
struct KvGatherParams {
  PagedView view;
  TokenSource src;
  int64_t num_tokens;
  int64_t head_dim;  // D
  DType dtype;       // of the output
  bool fp8;
  TensorScale scale;  // fp8 only
  uint8_t* out;
  int64_t out_token_stride;  // bytes
  int64_t out_head_stride;   // bytes
};

struct IndexerGatherParams {
  PagedView view;
  TokenSource src;
  int64_t num_tokens;
  IndexerPlacement placement;
  uint8_t* codes;  // [T, 128], row stride codes_stride bytes
  int64_t codes_stride;
  float* scales;   // [T], contiguous
};

// Per-token scale math, shared by every implementation.
// fp8_ds_mla tile scale of a tile whose max |x| is amax: amax / 448 by IEEE division, floored, and
// for kPow2 rounded up to a power of two from the float's bits (exact; no log2 / exp2).
KVC_HD float mla_tile_scale(float amax, TileScale rule) {
  const float s = amax / kFp8Max;
  return rule == TileScale::kPow2 ? ue8m0_round_up(fmax_(s, kMlaPow2ScaleFloor)) : fmax_(s, kFltMin);
}
KVC_HD float indexer_scale(float amax, bool ue8m0) {
  const float s = fmax_(amax, kIndexerAmaxFloor) / kFp8Max;
  return ue8m0 ? ue8m0_round_up(s) : s;
}

// copy_spans: chunks (src offset, dst offset, length) [num_chunks, 3] of at most
// kCopyChunkBytes (CUDA) each, in memory the copying device reads.
struct CopyParams {
  const uint8_t* src;
  uint8_t* dst;
  const int64_t* chunks;
  int64_t num_chunks;
};
constexpr int64_t kCopyChunkBytes = 64 * 1024;     // one CUDA thread block each
constexpr int64_t kCpuCopyChunkBytes = 256 * 1024;  // parallel CPU work items

// copy_runs (a re-tiling): items (src offset, dst offset, length, src stride, dst stride, count)
// [num_items, 6] -- `count` pieces of `length` bytes, piece j from src + j * src stride to dst +
// j * dst stride; the op layer cuts the runs into items of about kCopyChunkBytes (CUDA: one
// thread block each) or kCpuCopyChunkBytes (CPU work items).
struct RunCopyParams {
  const uint8_t* src;
  uint8_t* dst;
  const int64_t* items;
  int64_t num_items;
};

}  // namespace kvc
