#include "tensor_args.h"

#include <c10/util/Exception.h>

#include <cstring>

#include "overlap.h"

namespace kvc {

std::string shape_str(const at::Tensor& t) { return c10::str(t.sizes()); }

std::string dtype_str(at::ScalarType t) { return c10::str("torch.", c10::getDtypeNames(t).first); }

PagedView paged_view(const at::Tensor& view, const char* arg) {
  TORCH_CHECK_TYPE(view.scalar_type() == at::kByte, arg, " must be a torch.uint8 cache view, got ",
                   view.scalar_type());
  TORCH_CHECK_VALUE(view.dim() == 4, arg, " must be 4-D [num_blocks, H, block_size, C], got shape ",
                    shape_str(view));
  TORCH_CHECK_VALUE(view.stride(3) == 1, arg, " must have byte stride 1 in C, got strides ",
                    view.strides());
  for (int64_t i = 0; i < 3; ++i)
    TORCH_CHECK_VALUE(view.stride(i) >= 0, arg, " must not have negative strides");
  PagedView v{};
  v.base = ptr<uint8_t>(view);
  v.num_blocks = view.size(0);
  v.num_heads = view.size(1);
  v.block_size = view.size(2);
  v.row_bytes = view.size(3);
  v.block_stride = view.stride(0);
  v.head_stride = view.stride(1);
  v.token_stride = view.stride(2);
  TORCH_CHECK_VALUE(v.num_blocks > 0 && v.num_heads > 0 && v.block_size > 0 && v.row_bytes > 0,
                    arg, " must not be empty, got shape ", shape_str(view));
  TORCH_CHECK_VALUE(!may_overlap_itself(view), arg, " rows must not overlap one another: strides ",
                    view.strides(), " step over less than the dimensions inside them cover (shape ",
                    shape_str(view), ")");
  return v;
}

void check_row_bytes(const PagedView& v, int64_t want, const char* view_arg, const char* what) {
  TORCH_CHECK_VALUE(v.row_bytes == want, view_arg, " rows must be ", want, " bytes (", what,
                    "), got C = ", v.row_bytes);
}

void check_one_head(const PagedView& v, const char* view_arg) {
  TORCH_CHECK_VALUE(v.num_heads == 1, view_arg, " must have 1 head, got H = ", v.num_heads);
}

void check_split_page(const PagedView& v, int64_t row_bytes, const char* view_arg,
                      const std::string& what) {
  TORCH_CHECK_VALUE(v.token_stride == row_bytes, view_arg, " must have contiguous pages ", what,
                    ", got token stride ", v.token_stride);
}

IndexerPlacement parse_placement(std::string_view placement) {
  if (placement == "row") return IndexerPlacement::kRow;
  if (placement == "split") return IndexerPlacement::kSplit;
  TORCH_CHECK_VALUE(false, "placement must be \"row\" or \"split\", got \"", placement, "\"");
}

MlaFormat parse_mla_format(std::string_view kv_cache_dtype) {
  if (kv_cache_dtype == "fp8_ds_mla") return MlaFormat::kFp8DsMla;
  if (kv_cache_dtype == "fp8") return MlaFormat::kFp8Tensor;
  if (kv_cache_dtype == "auto") return MlaFormat::kAuto;
  TORCH_CHECK_VALUE(false, "kv_cache_dtype must be \"fp8_ds_mla\", \"fp8\" or \"auto\", got \"",
                    kv_cache_dtype, "\"");
}

DType input_dtype(const at::Tensor& t, const char* arg, bool allow_fp32) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kFloat:
      if (allow_fp32) return DType::kFloat32;
      break;
    default: break;
  }
  TORCH_CHECK_TYPE(false, arg, " must be bfloat16 or float16", allow_fp32 ? " or float32" : "",
                   ", got ", t.scalar_type());
}

void check_rows(const at::Tensor& t, const char* arg, int64_t num_tokens,
                std::initializer_list<int64_t> tail) {
  const int64_t rank = 1 + static_cast<int64_t>(tail.size());
  TORCH_CHECK_VALUE(t.dim() == rank, arg, " must have ", rank, " dimensions [T, ...], got shape ",
                    shape_str(t));
  int64_t d = 1;
  for (int64_t want : tail) {
    TORCH_CHECK_VALUE(want < 0 || t.size(d) == want, arg, ".size(", d, ") must be ", want,
                      ", got shape ", shape_str(t));
    ++d;
  }
  TORCH_CHECK_VALUE(t.size(0) >= num_tokens, arg, " must hold at least slot_mapping.numel() = ",
                    num_tokens, " rows, got shape ", shape_str(t));
  TORCH_CHECK_VALUE(t.numel() == 0 || t.stride(rank - 1) == 1, arg,
                    " must be contiguous in its last dimension, got strides ", t.strides());
  for (int64_t i = 0; i < rank; ++i)
    TORCH_CHECK_VALUE(t.stride(i) >= 0, arg, " must not have negative strides");
}

int64_t slot_mapping_arg(const at::Tensor& sm, const char* arg) {
  TORCH_CHECK_TYPE(sm.scalar_type() == at::kLong, arg, " must be int64, got ", sm.scalar_type());
  TORCH_CHECK_VALUE(sm.dim() == 1, arg, " must be 1-D [T], got shape ", shape_str(sm));
  TORCH_CHECK_VALUE(sm.numel() == 0 || sm.stride(0) == 1, arg, " must be contiguous");
  return sm.numel();
}

const int32_t* int32_vector(const at::Tensor& t, const char* arg, int64_t n) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, arg, " must be int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, arg, " must be 1-D with ", n,
                    " entries, got shape ", shape_str(t));
  TORCH_CHECK_VALUE(n == 0 || t.stride(0) == 1, arg, " must be contiguous");
  return ptr<int32_t>(t);
}

const int32_t* block_table_arg(const at::Tensor& bt, const char* arg, int64_t reqs) {
  TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt, arg, " must be int32, got ", bt.scalar_type());
  if (reqs < 0) {
    TORCH_CHECK_VALUE(bt.dim() == 2, arg, " must be 2-D [num_requests, max_blocks], got shape ",
                      shape_str(bt));
  } else {
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == reqs, arg, " must be 2-D [num_requests = ",
                      reqs, ", max_blocks], got shape ", shape_str(bt));
  }
  TORCH_CHECK_VALUE(bt.size(1) <= 1 || bt.stride(1) == 1, arg,
                    " must be contiguous in its last dimension");
  return ptr<int32_t>(bt);
}

TensorScale tensor_scale(const OptTensor& scale, const at::Tensor& view, const char* view_arg,
                         int64_t heads, const char* arg, std::string_view kv_cache_dtype) {
  TORCH_CHECK_VALUE(scale.has_value(), arg, " is required when kv_cache_dtype is \"",
                    kv_cache_dtype, "\"");
  TORCH_CHECK_TYPE(scale->scalar_type() == at::kFloat, arg, " must be float32, got ",
                   scale->scalar_type());
  const int64_t n = scale->numel();
  TORCH_CHECK_VALUE(n == 1 || (n == heads && scale->dim() == 1 && scale->is_contiguous()), arg,
                    " must hold one value", heads > 1 ? c10::str(" or one per head [", heads, "]") : "",
                    ", got shape ", shape_str(*scale));
  // One host value is passed by value; per-head values are read by the kernel where it runs.
  TORCH_CHECK_VALUE(n == 1 || scale->device() == view.device(), arg, " (one value per head) must "
                    "be on the device of ", view_arg, " (", view.device(), "), got ",
                    scale->device());
  const float* values = ptr<float>(*scale);
  const int64_t stride = n == 1 ? 0 : 1;
  if (!scale->is_cpu()) return {values, 0.0f, stride};
  for (int64_t h = 0; h < n; ++h) {
    uint32_t bits;  // tested on the bits: a caller flushing denormals must not refuse 1e-40
    std::memcpy(&bits, &values[h], 4);
    TORCH_CHECK_VALUE(bits > 0 && bits < 0x7F800000u, arg, n == 1 ? "" : c10::str("[", h, "]"),
                      " must be finite and > 0, got ", values[h]);
  }
  if (n == 1) return {nullptr, values[0], 0};
  return {values, 0.0f, stride};  // host values read by the CPU kernel
}

void check_no_scale(const OptTensor& scale, const char* arg, std::string_view kv_cache_dtype) {
  TORCH_CHECK_VALUE(!scale.has_value(), arg, " is only used with kv_cache_dtype \"fp8\", got "
                    "one with kv_cache_dtype \"", kv_cache_dtype, "\"");
}

TokenSource token_source(const GatherSource& g, int64_t out_rows) {
  TokenSource s{};
  if (g.slots) {
    const at::Tensor& sl = *g.slots;
    TORCH_CHECK_TYPE(sl.scalar_type() == at::kLong, "slots must be int64, got ", sl.scalar_type());
    TORCH_CHECK_VALUE(sl.is_contiguous(), "slots must be contiguous");
    TORCH_CHECK_VALUE(sl.numel() == out_rows, "out must have slots.numel() = ", sl.numel(),
                      " rows, got ", out_rows);
    s.slots = ptr<int64_t>(sl);
    return s;
  }
  TORCH_CHECK_VALUE(g.block_table && g.cu_seq_lens, "block_table and cu_seq_lens are required");
  const at::Tensor& bt = *g.block_table;
  s.block_table = block_table_arg(bt, "block_table");
  s.bt_stride = bt.stride(0);
  s.max_blocks = bt.size(1);
  s.num_reqs = bt.size(0);
  s.cu_seq_lens = int32_vector(*g.cu_seq_lens, "cu_seq_lens", s.num_reqs + 1);
  if (g.seq_starts) s.seq_starts = int32_vector(*g.seq_starts, "seq_starts", s.num_reqs);
  return s;
}

}  // namespace kvc
