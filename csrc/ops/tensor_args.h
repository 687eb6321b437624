// Building blocks of the op layer's argument parsers (write_args, gather_args, v4_args): tensors
// in, checked values and pointers out. Errors name the argument and the expected value
// (ValueError / TypeError / IndexError). Devices are not checked here: every op's device rules
// run before its kernel is chosen (op_list.h, dispatch_keys.cpp).
#pragma once
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "../core/params.h"

namespace kvc {

using OptTensor = std::optional<at::Tensor>;
using OptStr = std::optional<std::string_view>;

std::string shape_str(const at::Tensor& t);
// A dtype as Python spells it ("torch.float32"), for messages about what Python callers pass.
std::string dtype_str(at::ScalarType t);

template <class T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// A cache view: uint8 [num_blocks, H, rows, C], byte stride 1 in C, rows that do not overlap.
PagedView paged_view(const at::Tensor& view, const char* arg);
void check_row_bytes(const PagedView& v, int64_t want, const char* view_arg, const char* what);
void check_one_head(const PagedView& v, const char* view_arg);
// A split page (a row's first part in the page's first region, its last part after every
// row's first part) is only defined on a whole page of rows one after another: token stride =
// row_bytes. `what` completes "<view> must have contiguous pages ...".
void check_split_page(const PagedView& v, int64_t row_bytes, const char* view_arg,
                      const std::string& what);

// The string arguments the MLA and indexer ops share: placement "row" | "split",
// kv_cache_dtype "fp8_ds_mla" | "fp8" | "auto".
IndexerPlacement parse_placement(std::string_view placement);
MlaFormat parse_mla_format(std::string_view kv_cache_dtype);

DType input_dtype(const at::Tensor& t, const char* arg, bool allow_fp32);
// Rows input: rank 1 + tail.size(), at least num_tokens rows, the given trailing sizes (-1: any),
// last dimension contiguous, no negative strides.
void check_rows(const at::Tensor& t, const char* arg, int64_t num_tokens,
                std::initializer_list<int64_t> tail);
// slot_mapping int64 [T], contiguous: returns T.
int64_t slot_mapping_arg(const at::Tensor& sm, const char* arg = "slot_mapping");
// int32 [n], contiguous.
const int32_t* int32_vector(const at::Tensor& t, const char* arg, int64_t n);
// A block table [num_requests (= reqs when reqs >= 0), max_blocks] of int32.
const int32_t* block_table_arg(const at::Tensor& bt, const char* arg, int64_t reqs = -1);

// An fp8 scale: one fp32 value (or one per head when heads > 1) on the view's device (read by
// the kernel), or on the host (checked now: finite and > 0; one value is passed by value).
TensorScale tensor_scale(const OptTensor& scale, const at::Tensor& view, const char* view_arg,
                         int64_t heads, const char* arg, std::string_view kv_cache_dtype);
// A scale given where the row format takes none.
void check_no_scale(const OptTensor& scale, const char* arg, std::string_view kv_cache_dtype);

// Gathers read either through (block_table, cu_seq_lens, seq_starts) or explicit slots.
struct GatherSource {
  OptTensor block_table, cu_seq_lens, seq_starts, slots;
};
TokenSource token_source(const GatherSource& g, int64_t out_rows);

}  // namespace kvc
