#include "op_args.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace kvc {
namespace {

std::string shape_str(const at::Tensor& t) { return c10::str(t.sizes()); }

template <class T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
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

void check_same_device(const at::Tensor& t, const char* arg, const at::Tensor& view,
                       const char* view_arg) {
  TORCH_CHECK_VALUE(t.device() == view.device(), arg, " must be on the device of ", view_arg, " (",
                    view.device(), "), got ", t.device());
}

// Rows input: rank `rank`, at least num_tokens rows, given last dims, last dim contiguous.
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

int64_t check_slot_mapping(const at::Tensor& sm, const at::Tensor& view, const char* view_arg) {
  TORCH_CHECK_TYPE(sm.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
                   sm.scalar_type());
  TORCH_CHECK_VALUE(sm.dim() == 1, "slot_mapping must be 1-D [T], got shape ", shape_str(sm));
  TORCH_CHECK_VALUE(sm.numel() == 0 || sm.stride(0) == 1, "slot_mapping must be contiguous");
  check_same_device(sm, "slot_mapping", view, view_arg);
  return sm.numel();
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

// An fp8 scale: one fp32 (or one per head when `heads` > 1), on the view's device (read by the
// kernel, unchecked: reading it here would synchronise), or on the host (checked now: finite
// and > 0). A single host value is passed by value, so a CUDA view may take a CPU scale.
TensorScale tensor_scale(const OptTensor& scale, const at::Tensor& view, const char* view_arg,
                         int64_t heads = 1, const char* arg = "scale") {
  TORCH_CHECK_VALUE(scale.has_value(), arg, " is required when kv_cache_dtype is \"fp8\"");
  TORCH_CHECK_TYPE(scale->scalar_type() == at::kFloat, arg, " must be float32, got ",
                   scale->scalar_type());
  const int64_t n = scale->numel();
  TORCH_CHECK_VALUE(n == 1 || (n == heads && scale->dim() == 1 && scale->is_contiguous()), arg,
                    " must hold one value", heads > 1 ? c10::str(" or one per head [", heads, "]") : "",
                    ", got shape ", shape_str(*scale));
  TORCH_CHECK_VALUE(scale->device() == view.device() || (scale->is_cpu() && (n == 1 || view.is_cpu())),
                    arg, " must be on the device of ", view_arg, " (", view.device(), ")",
                    n == 1 ? " or on the CPU" : "", ", got ", scale->device());
  const float* values = ptr<float>(*scale);
  const int64_t stride = n == 1 ? 0 : 1;
  if (!scale->is_cpu()) return {values, 0.0f, stride};
  for (int64_t h = 0; h < n; ++h)
    TORCH_CHECK_VALUE(std::isfinite(values[h]) && values[h] > 0.0f, arg, n == 1 ? "" : c10::str("[", h, "]"),
                      " must be finite and > 0, got ", values[h]);
  if (n == 1) return {nullptr, values[0], 0};
  return {values, 0.0f, stride};  // host values read by the CPU kernel
}

void check_no_scale(const OptTensor& scale, std::string_view kv_cache_dtype) {
  TORCH_CHECK_VALUE(!scale.has_value(), "scale is only used with kv_cache_dtype \"fp8\", got "
                    "a scale with kv_cache_dtype \"", kv_cache_dtype, "\"");
}

void check_row_bytes(const PagedView& v, int64_t want, const char* view_arg, const char* what) {
  TORCH_CHECK_VALUE(v.row_bytes == want, view_arg, " rows must be ", want, " bytes (", what,
                    "), got C = ", v.row_bytes);
}

void check_one_head(const PagedView& v, const char* view_arg) {
  TORCH_CHECK_VALUE(v.num_heads == 1, view_arg, " must have 1 head, got H = ", v.num_heads);
}

// A split page puts every token's codes first and the scales after them: it is only defined
// on a contiguous page. A view sliced along tokens would send those bytes outside the view.
void check_split_page(const PagedView& v, IndexerPlacement placement, const char* view_arg) {
  TORCH_CHECK_VALUE(placement != IndexerPlacement::kSplit || v.token_stride == kIndexerRowBytes,
                    view_arg, " must have contiguous pages for placement=\"split\" (token stride ",
                    kIndexerRowBytes, " bytes), got token stride ", v.token_stride);
}

const int32_t* int32_vector(const at::Tensor& t, const char* arg, int64_t n, const at::Tensor& view) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, arg, " must be int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, arg, " must be 1-D with ", n,
                    " entries, got shape ", shape_str(t));
  TORCH_CHECK_VALUE(n == 0 || t.stride(0) == 1, arg, " must be contiguous");
  check_same_device(t, arg, view, "view");
  return ptr<int32_t>(t);
}

TokenSource token_source(const GatherSource& g, const at::Tensor& view, int64_t out_rows) {
  TokenSource s{};
  if (g.slots) {
    const at::Tensor& sl = *g.slots;
    TORCH_CHECK_TYPE(sl.scalar_type() == at::kLong, "slots must be int64, got ", sl.scalar_type());
    TORCH_CHECK_VALUE(sl.is_contiguous(), "slots must be contiguous");
    TORCH_CHECK_VALUE(sl.numel() == out_rows, "out must have slots.numel() = ", sl.numel(),
                      " rows, got ", out_rows);
    check_same_device(sl, "slots", view, "view");
    s.slots = ptr<int64_t>(sl);
    return s;
  }
  TORCH_CHECK_VALUE(g.block_table && g.cu_seq_lens, "block_table and cu_seq_lens are required");
  const at::Tensor& bt = *g.block_table;
  TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt, "block_table must be int32, got ",
                   bt.scalar_type());
  TORCH_CHECK_VALUE(bt.dim() == 2, "block_table must be 2-D [num_requests, max_blocks], got shape ",
                    shape_str(bt));
  TORCH_CHECK_VALUE(bt.size(1) <= 1 || bt.stride(1) == 1,
                    "block_table must be contiguous in its last dimension");
  check_same_device(bt, "block_table", view, "view");
  s.block_table = ptr<int32_t>(bt);
  s.bt_stride = bt.stride(0);
  s.max_blocks = bt.size(1);
  s.num_reqs = bt.size(0);
  s.cu_seq_lens = int32_vector(*g.cu_seq_lens, "cu_seq_lens", s.num_reqs + 1, view);
  if (g.seq_starts) s.seq_starts = int32_vector(*g.seq_starts, "seq_starts", s.num_reqs, view);
  return s;
}

}  // namespace

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
  return v;
}

PlainWriteParams plain_write_args(const at::Tensor& key, const at::Tensor& view,
                                  const at::Tensor& slot_mapping, std::string_view kv_cache_dtype,
                                  const OptTensor& scale, const char* key_arg,
                                  const char* view_arg, const char* scale_arg) {
  PlainWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.num_tokens = check_slot_mapping(slot_mapping, view, view_arg);
  TORCH_CHECK_VALUE(kv_cache_dtype == "auto" || kv_cache_dtype == "fp8",
                    "kv_cache_dtype must be \"auto\" or \"fp8\", got \"", kv_cache_dtype, "\"");
  p.fp8 = kv_cache_dtype == "fp8";
  p.dtype = input_dtype(key, key_arg, true);
  check_rows(key, key_arg, p.num_tokens, {p.view.num_heads, -1});
  check_same_device(key, key_arg, view, view_arg);
  p.num_heads = key.size(1);
  p.head_dim = key.size(2);
  const int64_t want = p.head_dim * (p.fp8 ? 1 : dtype_size(p.dtype));
  TORCH_CHECK_VALUE(p.view.row_bytes == want, view_arg, " rows must be D x ",
                    p.fp8 ? 1 : key.element_size(), " = ", want, " bytes for ", key_arg,
                    " of shape ", shape_str(key), ", got C = ", p.view.row_bytes);
  if (p.fp8)
    p.scale = tensor_scale(scale, view, view_arg, p.num_heads, scale_arg);
  else
    TORCH_CHECK_VALUE(!scale.has_value(), scale_arg, " is only used with kv_cache_dtype \"fp8\"");
  p.key = ptr<void>(key);
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  p.slots = ptr<int64_t>(slot_mapping);
  return p;
}

MlaWriteParams mla_write_args(const at::Tensor& kv_c, const at::Tensor& k_pe,
                              const at::Tensor& view, const at::Tensor& slot_mapping,
                              std::string_view kv_cache_dtype, const OptTensor& scale,
                              const char* view_arg) {
  MlaWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.format = parse_mla_format(kv_cache_dtype);
  p.num_tokens = check_slot_mapping(slot_mapping, view, view_arg);
  p.dtype = input_dtype(kv_c, "kv_c", p.format == MlaFormat::kAuto);
  TORCH_CHECK_TYPE(k_pe.scalar_type() == kv_c.scalar_type(), "k_pe must have the dtype of kv_c (",
                   kv_c.scalar_type(), "), got ", k_pe.scalar_type());
  check_rows(kv_c, "kv_c", p.num_tokens, {kMlaLatentDim});
  check_rows(k_pe, "k_pe", p.num_tokens, {kMlaRopeDim});
  check_same_device(kv_c, "kv_c", view, view_arg);
  check_same_device(k_pe, "k_pe", view, view_arg);
  check_one_head(p.view, view_arg);
  switch (p.format) {
    case MlaFormat::kFp8DsMla:
      check_row_bytes(p.view, kMlaFp8RowBytes, view_arg, "fp8_ds_mla");
      break;
    case MlaFormat::kFp8Tensor:
      check_row_bytes(p.view, kMlaDim, view_arg, "fp8: 576 e4m3 codes");
      break;
    case MlaFormat::kAuto:
      check_row_bytes(p.view, kMlaDim * dtype_size(p.dtype), view_arg, "576 values of kv_c's dtype");
      break;
  }
  if (p.format == MlaFormat::kFp8Tensor)
    p.scale = tensor_scale(scale, view, view_arg);
  else
    check_no_scale(scale, kv_cache_dtype);
  p.kv_c = ptr<void>(kv_c);
  p.kv_c_stride = kv_c.stride(0);
  p.k_pe = ptr<void>(k_pe);
  p.k_pe_stride = k_pe.stride(0);
  p.slots = ptr<int64_t>(slot_mapping);
  return p;
}

IndexerWriteParams indexer_write_args(const at::Tensor& k, const at::Tensor& view,
                                      const at::Tensor& slot_mapping, OptStr scale_fmt,
                                      std::string_view placement, const char* k_arg,
                                      const char* view_arg) {
  IndexerWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.placement = parse_placement(placement);
  TORCH_CHECK_VALUE(!scale_fmt || *scale_fmt == "ue8m0",
                    "scale_fmt must be None or \"ue8m0\", got \"", scale_fmt.value_or(""), "\"");
  p.ue8m0 = scale_fmt.has_value();
  p.num_tokens = check_slot_mapping(slot_mapping, view, view_arg);
  p.dtype = input_dtype(k, k_arg, false);
  check_rows(k, k_arg, p.num_tokens, {kIndexerDim});
  check_same_device(k, k_arg, view, view_arg);
  check_one_head(p.view, view_arg);
  check_row_bytes(p.view, kIndexerRowBytes, view_arg, "indexer: 128 codes + fp32 scale");
  check_split_page(p.view, p.placement, view_arg);
  p.k = ptr<void>(k);
  p.k_stride = k.stride(0);
  p.slots = ptr<int64_t>(slot_mapping);
  return p;
}

MlaGatherParams mla_gather_args(const at::Tensor& view, const GatherSource& src,
                                std::string_view kv_cache_dtype, const at::Tensor& out,
                                const OptTensor& scale) {
  MlaGatherParams p{};
  p.view = paged_view(view, "view");
  check_one_head(p.view, "view");
  p.format = parse_mla_format(kv_cache_dtype);
  TORCH_CHECK_VALUE(out.dim() == 2, "out must be 2-D [T, row], got shape ", shape_str(out));
  TORCH_CHECK_VALUE(out.size(0) == 0 || out.stride(1) == 1, "out must be contiguous in its last dimension");
  check_same_device(out, "out", view, "view");
  const int64_t cols = out.size(1);
  if (p.format != MlaFormat::kAuto) {
    const bool ds = p.format == MlaFormat::kFp8DsMla;
    const int64_t row = ds ? kMlaFp8RowBytes : kMlaDim;
    check_row_bytes(p.view, row, "view", ds ? "fp8_ds_mla" : "fp8: 576 e4m3 codes");
    if (ds)
      check_no_scale(scale, kv_cache_dtype);
    else
      p.scale = tensor_scale(scale, view, "view");
    if (out.scalar_type() == at::kByte) {
      p.mode = MlaGatherMode::kCopyRow;
      TORCH_CHECK_VALUE(cols == row, "out must be [T, ", row, "] for raw rows, got shape ",
                        shape_str(out));
    } else {
      TORCH_CHECK_TYPE(out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat,
                       "out must be bfloat16, float32 or uint8 (raw rows), got ", out.scalar_type());
      p.mode = out.scalar_type() == at::kFloat ? MlaGatherMode::kDequantF32
                                               : MlaGatherMode::kDequantBf16;
      TORCH_CHECK_VALUE(cols == kMlaDim, "out must be [T, 576], got shape ", shape_str(out));
    }
  } else {
    check_no_scale(scale, kv_cache_dtype);
    p.mode = MlaGatherMode::kCopyRow;
    TORCH_CHECK_VALUE(cols * out.element_size() == p.view.row_bytes && cols == kMlaDim,
                      "out must be [T, 576] of the dtype the rows were written in (C = ",
                      p.view.row_bytes, " bytes), got shape ", shape_str(out), " of ",
                      out.scalar_type());
  }
  p.num_tokens = out.size(0);
  p.src = token_source(src, view, p.num_tokens);
  p.out = ptr<uint8_t>(out);
  p.out_stride = out.stride(0) * out.element_size();
  return p;
}

KvGatherParams kv_gather_args(const at::Tensor& view, const GatherSource& src,
                              const at::Tensor& out, const OptTensor& scale) {
  KvGatherParams p{};
  p.view = paged_view(view, "view");
  p.dtype = input_dtype(out, "out", true);
  TORCH_CHECK_VALUE(out.dim() == 3 && out.size(1) == p.view.num_heads,
                    "out must be [T, H = ", p.view.num_heads, ", D], got shape ", shape_str(out));
  TORCH_CHECK_VALUE(out.numel() == 0 || out.stride(2) == 1, "out must be contiguous in its last dimension");
  check_same_device(out, "out", view, "view");
  p.head_dim = out.size(2);
  p.fp8 = scale.has_value();
  const int64_t want = p.head_dim * (p.fp8 ? 1 : out.element_size());
  TORCH_CHECK_VALUE(p.view.row_bytes == want, "view rows must be D x ", p.fp8 ? 1 : out.element_size(),
                    " = ", want, " bytes for out of shape ", shape_str(out), p.fp8 ? " (fp8 codes)" : "",
                    ", got C = ", p.view.row_bytes);
  if (p.fp8) p.scale = tensor_scale(scale, view, "view", p.view.num_heads);
  p.num_tokens = out.size(0);
  p.src = token_source(src, view, p.num_tokens);
  p.out = ptr<uint8_t>(out);
  p.out_token_stride = out.stride(0) * out.element_size();
  p.out_head_stride = out.stride(1) * out.element_size();
  return p;
}

IndexerGatherParams indexer_gather_args(const at::Tensor& view, const GatherSource& src,
                                        std::string_view placement, const at::Tensor& codes,
                                        const at::Tensor& scales) {
  IndexerGatherParams p{};
  p.view = paged_view(view, "view");
  check_one_head(p.view, "view");
  check_row_bytes(p.view, kIndexerRowBytes, "view", "indexer: 128 codes + fp32 scale");
  p.placement = parse_placement(placement);
  check_split_page(p.view, p.placement, "view");
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte, "codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK_VALUE(codes.dim() == 2 && codes.size(1) == kIndexerDim,
                    "codes must be [T, 128], got shape ", shape_str(codes));
  TORCH_CHECK_VALUE(codes.size(0) == 0 || codes.stride(1) == 1, "codes must be contiguous in its last dimension");
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, "scales must be float32, got ",
                   scales.scalar_type());
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.size(0) == codes.size(0) && scales.is_contiguous(),
                    "scales must be contiguous [T] with T = codes.size(0) = ", codes.size(0),
                    ", got shape ", shape_str(scales));
  check_same_device(codes, "codes", view, "view");
  check_same_device(scales, "scales", view, "view");
  p.num_tokens = codes.size(0);
  p.src = token_source(src, view, p.num_tokens);
  p.codes = ptr<uint8_t>(codes);
  p.codes_stride = codes.stride(0);
  p.scales = ptr<float>(scales);
  return p;
}

void check_slots_in_range(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                          const char* arg, bool allow_negative) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK_INDEX(s[t] < v.num_slots() && (allow_negative || s[t] >= 0), arg, "[", t, "] = ",
                      s[t], " is outside [", allow_negative ? "-inf" : "0", ", num_blocks x block_size = ",
                      v.num_slots(), ")");
  }
}

void check_gather_source(const GatherSource& g, const PagedView& v, int64_t out_rows) {
  if (g.slots) {
    check_slots_in_range(*g.slots, g.slots->numel(), v, "slots");
    return;
  }
  const at::Tensor& bt = *g.block_table;
  const int64_t reqs = bt.size(0), width = bt.size(1);
  const int32_t* cu = g.cu_seq_lens->data_ptr<int32_t>();
  const int32_t* starts = g.seq_starts ? g.seq_starts->data_ptr<int32_t>() : nullptr;
  TORCH_CHECK_VALUE(cu[0] == 0, "cu_seq_lens[0] must be 0, got ", cu[0]);
  for (int64_t r = 0; r < reqs; ++r) {
    TORCH_CHECK_VALUE(cu[r + 1] >= cu[r], "cu_seq_lens must be non-decreasing, got cu_seq_lens[",
                      r, "] = ", cu[r], " > cu_seq_lens[", r + 1, "] = ", cu[r + 1]);
  }
  TORCH_CHECK_VALUE(cu[reqs] <= out_rows, "out must have at least cu_seq_lens[-1] = ", cu[reqs],
                    " rows, got ", out_rows);
  for (int64_t r = 0; r < reqs; ++r) {
    const int64_t start = starts ? starts[r] : 0;
    TORCH_CHECK_INDEX(start >= 0, "seq_starts[", r, "] must be >= 0, got ", start);
    const int64_t end = start + cu[r + 1] - cu[r];
    if (end == start) continue;
    TORCH_CHECK_INDEX(end <= width * v.block_size, "cu_seq_lens: request ", r, " reads positions [",
                      start, ", ", end, ") but block_table holds ", width, " blocks of ",
                      v.block_size, " tokens");
    const int32_t* row = ptr<int32_t>(bt) + r * bt.stride(0);
    for (int64_t j = start / v.block_size; j <= (end - 1) / v.block_size; ++j) {
      TORCH_CHECK_INDEX(row[j] >= 0 && row[j] < v.num_blocks, "block_table[", r, ", ", j, "] = ",
                        row[j], " is outside [0, num_blocks = ", v.num_blocks, ")");
    }
  }
}

void check_unique_slots(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                        const char* arg) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  auto refuse = [&](int64_t slot) {
    int64_t first = -1, second = -1;
    for (int64_t t = 0; t < num_tokens && second < 0; ++t)
      if (s[t] == slot) (first < 0 ? first : second) = t;
    TORCH_CHECK_VALUE(false, arg, "[", first, "] and ", arg, "[", second, "] are both slot ", slot,
                      ": two tokens of one call must not share a slot");
  };
  const int64_t num_slots = v.num_slots();
  // A bitmap of the view's slots while it is small next to the call (O(T + slots / 64)),
  // else a sorted copy of the slots (O(T log T)).
  if (num_slots <= 64 * std::max<int64_t>(num_tokens, 4096)) {
    std::vector<uint64_t> seen((num_slots + 63) / 64, 0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (s[t] < 0) continue;
      uint64_t& word = seen[s[t] >> 6];
      const uint64_t bit = uint64_t{1} << (s[t] & 63);
      if (word & bit) refuse(s[t]);
      word |= bit;
    }
    return;
  }
  std::vector<int64_t> sorted;
  sorted.reserve(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t)
    if (s[t] >= 0) sorted.push_back(s[t]);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) refuse(*dup);
}

void check_spans(const uint8_t* src, int64_t src_bytes, const uint8_t* dst, int64_t dst_bytes,
                 const int64_t* spans, int64_t n, bool same_space) {
  struct Range {
    uintptr_t begin, end;
    int64_t i;
  };
  std::vector<Range> writes, reads;
  writes.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = spans[3 * i], b = spans[3 * i + 1], len = spans[3 * i + 2];
    TORCH_CHECK_INDEX(len >= 0 && a >= 0 && b >= 0 && a <= src_bytes - len && b <= dst_bytes - len,
                      "spans[", i, "] = (", a, ", ", b, ", ", len, ") is outside src (", src_bytes,
                      " bytes) or dst (", dst_bytes, " bytes)");
    if (len == 0) continue;
    const auto at = [](const uint8_t* base, int64_t off) { return reinterpret_cast<uintptr_t>(base + off); };
    writes.push_back({at(dst, b), at(dst, b + len), i});
    if (same_space) reads.push_back({at(src, a), at(src, a + len), i});
  }
  const auto by_begin = [](const Range& x, const Range& y) { return x.begin < y.begin; };
  std::sort(writes.begin(), writes.end(), by_begin);
  for (size_t k = 1; k < writes.size(); ++k)
    TORCH_CHECK_VALUE(writes[k].begin >= writes[k - 1].end, "spans[", writes[k - 1].i, "] and spans[",
                      writes[k].i, "] write overlapping destination bytes");
  if (reads.empty()) return;
  // Does any read range meet a write range? Reads sorted by start, with the running maximum of
  // their ends: the reads starting before a write's end reach into it iff that maximum passes
  // the write's start.
  std::sort(reads.begin(), reads.end(), by_begin);
  std::vector<size_t> reach(reads.size());  // index of the read with the largest end so far
  for (size_t k = 0; k < reads.size(); ++k)
    reach[k] = (k == 0 || reads[k].end > reads[reach[k - 1]].end) ? k : reach[k - 1];
  for (const Range& w : writes) {
    const auto it = std::lower_bound(reads.begin(), reads.end(), w.end,
                                     [](const Range& r, uintptr_t e) { return r.begin < e; });
    if (it == reads.begin()) continue;
    const Range& r = reads[reach[(it - reads.begin()) - 1]];
    TORCH_CHECK_VALUE(r.end <= w.begin, "spans[", w.i, "] writes bytes that spans[", r.i,
                      "] reads (src and dst share memory): a copy's destinations must not "
                      "overlap its sources");
  }
}

// Spans cut into chunks of at most `chunk` bytes, [n, 3] int64: even parallel work on CPU,
// one thread block each on CUDA.
at::Tensor chunk_spans(const int64_t* s, int64_t n, int64_t chunk) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += (s[3 * i + 2] + chunk - 1) / chunk;
  at::Tensor chunks = at::empty({count, 3}, at::TensorOptions().dtype(at::kLong));
  int64_t* c = chunks.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t off = 0; off < s[3 * i + 2]; off += chunk) {
      c[0] = s[3 * i] + off;
      c[1] = s[3 * i + 1] + off;
      c[2] = std::min(chunk, s[3 * i + 2] - off);
      c += 3;
    }
  }
  return chunks;
}

}  // namespace kvc
