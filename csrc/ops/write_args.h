// One parse per write op: its arguments in, its kernel parameters out, after every check --
// shapes, dtypes, row formats, what the op writes against everything else it is handed (memory
// overlap), and, when the op runs on the host (`on_host`: a CPU view), the slot values (in range,
// no two tokens on one slot), so a refused call leaves the cache as it was. CUDA kernels skip
// slots outside the view instead (a host check would synchronise). Devices were checked before
// any of this (op_list.h).
#pragma once
#include <ATen/core/Tensor.h>

#include <string_view>

#include "../core/params.h"
#include "tensor_args.h"

namespace kvc {

PlainWriteParams parse_reshape_and_cache(const at::Tensor& key, const at::Tensor& view,
                                         const at::Tensor& slot_mapping,
                                         std::string_view kv_cache_dtype, const OptTensor& scale,
                                         bool on_host);

// Two row writes at one slot_mapping, one launch (reshape_and_cache_kv, state_write).
struct KvWriteParams {
  PlainWriteParams k, v;
};
// K and V of each token into one split page per (block, head): K's D_k elements, channel-major
// when k_channel_major (vLLM-CPU's attention page) or as rows, then V's rows; view rows are
// (D_k + D_v) x es bytes, its pages contiguous (token stride = row bytes).
KvWriteParams parse_reshape_and_cache_kv_split(const at::Tensor& key, const at::Tensor& value,
                                               const at::Tensor& view,
                                               const at::Tensor& slot_mapping,
                                               bool k_channel_major, bool on_host);
KvWriteParams parse_reshape_and_cache_kv(const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& k_view, const at::Tensor& v_view,
                                         const at::Tensor& slot_mapping,
                                         std::string_view kv_cache_dtype, const OptTensor& k_scale,
                                         const OptTensor& v_scale, bool on_host);
// Compressor-state rows [kv | score] (kv [T, W], score [T, W2], both float32 or both bfloat16)
// copied as they are into one-head views of rows of W + W2 values.
KvWriteParams parse_state_write(const at::Tensor& kv, const at::Tensor& score,
                                const at::Tensor& view, const at::Tensor& slot_mapping,
                                bool on_host);
MlaWriteParams parse_concat_and_cache_mla(const at::Tensor& kv_c, const at::Tensor& k_pe,
                                          const at::Tensor& view, const at::Tensor& slot_mapping,
                                          std::string_view kv_cache_dtype, const OptTensor& scale,
                                          OptStr tile_scale, bool on_host);
IndexerWriteParams parse_indexer_k_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                                   const at::Tensor& slot_mapping,
                                                   OptStr scale_fmt, std::string_view placement,
                                                   bool on_host);
struct DsaWriteParams {
  MlaWriteParams mla;
  IndexerWriteParams idx;
};
DsaWriteParams parse_dsa_write(const at::Tensor& kv_c, const at::Tensor& k_pe,
                               const at::Tensor& mla_view, const at::Tensor& k_idx,
                               const at::Tensor& indexer_view, const at::Tensor& slot_mapping,
                               std::string_view kv_cache_dtype, OptStr scale_fmt,
                               std::string_view placement, OptStr tile_scale, bool on_host);

// Building blocks shared with v4_args.cpp: an indexer row write's view and input, without the
// slot_mapping checks (the caller's parse makes them once). any_float: k may be float32 too
// (V4's fp8 indexer, which rounds k to bf16 before its kernel reads it).
IndexerWriteParams indexer_rows(const at::Tensor& k, const char* k_arg, const at::Tensor& view,
                                const char* view_arg, int64_t num_tokens, OptStr scale_fmt,
                                std::string_view placement, bool any_float = false);
// Two views one op writes are addressed by one block table: same num_blocks and rows per block.
void check_one_block_table(const PagedView& a, const char* a_arg, const PagedView& b,
                           const char* b_arg);

}  // namespace kvc
