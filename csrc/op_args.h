// Argument checks shared by every backend: tensors in, kernel parameters out.
// Errors name the argument and the expected value (ValueError / TypeError / IndexError).
#pragma once
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "kernels.h"
#include "overlap.h"

namespace kvc {

using OptTensor = std::optional<at::Tensor>;
using OptStr = std::optional<std::string_view>;

PagedView paged_view(const at::Tensor& view, const char* arg);

// Building blocks of the argument parsers (op_args.cpp, v4_args.cpp).
std::string shape_str(const at::Tensor& t);
DType input_dtype(const at::Tensor& t, const char* arg, bool allow_fp32);
void check_same_device(const at::Tensor& t, const char* arg, const at::Tensor& view,
                       const char* view_arg);
// Rows input: rank 1 + tail.size(), at least num_tokens rows, the given trailing sizes (-1: any),
// last dimension contiguous.
void check_rows(const at::Tensor& t, const char* arg, int64_t num_tokens,
                std::initializer_list<int64_t> tail);
int64_t check_slot_mapping(const at::Tensor& sm, const at::Tensor& view, const char* view_arg);
void check_row_bytes(const PagedView& v, int64_t want, const char* view_arg, const char* what);
void check_one_head(const PagedView& v, const char* view_arg);
const int32_t* int32_vector(const at::Tensor& t, const char* arg, int64_t n, const at::Tensor& view);
// A block table [num_requests (= reqs when reqs >= 0), max_blocks] of int32 on the view's device.
const int32_t* block_table_arg(const at::Tensor& bt, const char* arg, const at::Tensor& view,
                               const char* view_arg, int64_t reqs = -1);

PlainWriteParams plain_write_args(const at::Tensor& key, const at::Tensor& view,
                                  const at::Tensor& slot_mapping, std::string_view kv_cache_dtype,
                                  const OptTensor& scale, const char* key_arg = "key",
                                  const char* view_arg = "view", const char* scale_arg = "scale");
MlaWriteParams mla_write_args(const at::Tensor& kv_c, const at::Tensor& k_pe,
                              const at::Tensor& view, const at::Tensor& slot_mapping,
                              std::string_view kv_cache_dtype, const OptTensor& scale,
                              OptStr tile_scale = std::nullopt, const char* view_arg = "view");
IndexerWriteParams indexer_write_args(const at::Tensor& k, const at::Tensor& view,
                                      const at::Tensor& slot_mapping, OptStr scale_fmt,
                                      std::string_view placement, const char* k_arg = "k",
                                      const char* view_arg = "view");

// Gathers read either through (block_table, cu_seq_lens, seq_starts) or explicit slots.
struct GatherSource {
  OptTensor block_table, cu_seq_lens, seq_starts, slots;
};
MlaGatherParams mla_gather_args(const at::Tensor& view, const GatherSource& src,
                                std::string_view kv_cache_dtype, const at::Tensor& out,
                                const OptTensor& scale);
KvGatherParams kv_gather_args(const at::Tensor& view, const GatherSource& src,
                              const at::Tensor& out, const OptTensor& scale);
IndexerGatherParams indexer_gather_args(const at::Tensor& view, const GatherSource& src,
                                        std::string_view placement, const at::Tensor& codes,
                                        const at::Tensor& scales);
TokenSource token_source(const GatherSource& g, const at::Tensor& view, int64_t out_rows);

// Host-side checks that read tensor values (op_checks.cpp). They take CPU tensors (the CUDA backend copies
// the small metadata tensors first) and run before anything is written.
void check_slots_in_range(const at::Tensor& slot_mapping, int64_t num_tokens, const PagedView& v,
                          const char* arg = "slot_mapping", bool allow_negative = true);
// Two tokens of one call with one slot are a caller error (the row would be one token's, or in
// dsa_write half of each); CPU writes refuse them before writing. Slots are in range already.
void check_unique_slots(const at::Tensor& slot_mapping, int64_t num_tokens, const PagedView& v,
                        const char* arg = "slot_mapping");
void check_gather_source(const GatherSource& src, const PagedView& v, int64_t out_rows);
// Positions [first, end) of request r read through block-table row r: inside the table and
// every block they touch inside the view (IndexError naming arg otherwise).
void check_table_range(const at::Tensor& bt, const char* arg, int64_t r, int64_t first,
                       int64_t end, const PagedView& v, const char* what);

// Byte spans (src offset, dst offset, length) [n, 3] of one copy: inside both buffers, no two
// destinations overlapping, and no destination overlapping a source when both buffers share
// an address space (same_space) -- a memcpy over overlapping bytes is undefined.
void check_spans(const uint8_t* src, int64_t src_bytes, const uint8_t* dst, int64_t dst_bytes,
                 const int64_t* spans, int64_t n, bool same_space);

}  // namespace kvc

namespace kvc {
// Spans [n, 3] cut into chunks of at most `chunk` bytes: a CPU int64 tensor [num_chunks, 3].
at::Tensor chunk_spans(const int64_t* spans, int64_t n, int64_t chunk);
}  // namespace kvc
