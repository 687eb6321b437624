#include "op_args.h"

#include <cstring>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>

namespace kvc {

std::string shape_str(const at::Tensor& t) { return c10::str(t.sizes()); }

namespace {
template <class T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}
}  // namespace

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

namespace {

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
  for (int64_t h = 0; h < n; ++h) {
    uint32_t bits;  // tested on the bits: a caller flushing denormals must not refuse 1e-40
    std::memcpy(&bits, &values[h], 4);
    TORCH_CHECK_VALUE(bits > 0 && bits < 0x7F800000u, arg, n == 1 ? "" : c10::str("[", h, "]"),
                      " must be finite and > 0, got ", values[h]);
  }
  if (n == 1) return {nullptr, values[0], 0};
  return {values, 0.0f, stride};  // host values read by the CPU kernel
}

// fp8_ds_mla tile scales: "pow2" (the default) or "fp32"; given with another row format, refused.
TileScale parse_tile_scale(OptStr tile_scale, MlaFormat format, std::string_view kv_cache_dtype) {
  if (!tile_scale) return TileScale::kPow2;
  TORCH_CHECK_VALUE(*tile_scale == "pow2" || *tile_scale == "fp32",
                    "tile_scale must be \"pow2\" or \"fp32\", got \"", *tile_scale, "\"");
  TORCH_CHECK_VALUE(format == MlaFormat::kFp8DsMla, "tile_scale applies to kv_cache_dtype "
                    "\"fp8_ds_mla\" only, got tile_scale=\"", *tile_scale, "\" with kv_cache_dtype \"",
                    kv_cache_dtype, "\"");
  return *tile_scale == "pow2" ? TileScale::kPow2 : TileScale::kFp32;
}

void check_no_scale(const OptTensor& scale, std::string_view kv_cache_dtype) {
  TORCH_CHECK_VALUE(!scale.has_value(), "scale is only used with kv_cache_dtype \"fp8\", got "
                    "a scale with kv_cache_dtype \"", kv_cache_dtype, "\"");
}

}  // namespace

void check_row_bytes(const PagedView& v, int64_t want, const char* view_arg, const char* what) {
  TORCH_CHECK_VALUE(v.row_bytes == want, view_arg, " rows must be ", want, " bytes (", what,
                    "), got C = ", v.row_bytes);
}

void check_one_head(const PagedView& v, const char* view_arg) {
  TORCH_CHECK_VALUE(v.num_heads == 1, view_arg, " must have 1 head, got H = ", v.num_heads);
}

namespace {

// A split page puts every token's codes first and the scales after them: it is only defined
// on a contiguous page. A view sliced along tokens would send those bytes outside the view.
void check_split_page(const PagedView& v, IndexerPlacement placement, const char* view_arg) {
  TORCH_CHECK_VALUE(placement != IndexerPlacement::kSplit || v.token_stride == kIndexerRowBytes,
                    view_arg, " must have contiguous pages for placement=\"split\" (token stride ",
                    kIndexerRowBytes, " bytes), got token stride ", v.token_stride);
}

}  // namespace

const int32_t* block_table_arg(const at::Tensor& bt, const char* arg, const at::Tensor& view,
                               const char* view_arg, int64_t reqs) {
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
  check_same_device(bt, arg, view, view_arg);
  return ptr<int32_t>(bt);
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
  s.block_table = block_table_arg(bt, "block_table", view, "view");
  s.bt_stride = bt.stride(0);
  s.max_blocks = bt.size(1);
  s.num_reqs = bt.size(0);
  s.cu_seq_lens = int32_vector(*g.cu_seq_lens, "cu_seq_lens", s.num_reqs + 1, view);
  if (g.seq_starts) s.seq_starts = int32_vector(*g.seq_starts, "seq_starts", s.num_reqs, view);
  return s;
}

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
                              OptStr tile_scale, const char* view_arg) {
  MlaWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.format = parse_mla_format(kv_cache_dtype);
  p.tile_scale = parse_tile_scale(tile_scale, p.format, kv_cache_dtype);
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

}  // namespace kvc
