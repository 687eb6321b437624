#include "v4_args.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace kvc {
namespace {

const char* format_name(V4Format f) { return f == V4Format::kMla ? "fp8_ds_mla_v4" : "mxfp4"; }

// A V4 view: one head, rows of the format's bytes, contiguous pages (the split placement puts
// a row's footer after every row's data: only defined on a whole page).
PagedView v4_view(const at::Tensor& view, V4Format f, const char* arg) {
  const PagedView v = paged_view(view, arg);
  check_one_head(v, arg);
  check_row_bytes(v, v4_row_bytes(f), arg, format_name(f));
  TORCH_CHECK_VALUE(v.token_stride == v4_row_bytes(f), arg,
                    " must have contiguous pages (token stride ", v4_row_bytes(f), " bytes) for ",
                    format_name(f), "'s split pages, got token stride ", v.token_stride);
  return v;
}

MlaGatherMode out_mode(const at::Tensor& out, V4Format f, const char* arg) {
  TORCH_CHECK_VALUE(out.dim() == 2, arg, " must be 2-D [T, row], got shape ", shape_str(out));
  TORCH_CHECK_VALUE(out.size(0) == 0 || out.stride(1) == 1, arg,
                    " must be contiguous in its last dimension");
  MlaGatherMode m;
  switch (out.scalar_type()) {
    case at::kByte: m = MlaGatherMode::kCopyRow; break;
    case at::kBFloat16: m = MlaGatherMode::kDequantBf16; break;
    case at::kFloat: m = MlaGatherMode::kDequantF32; break;
    default:
      TORCH_CHECK_TYPE(false, arg, " must be bfloat16, float32 or uint8 (raw rows), got ",
                       out.scalar_type());
  }
  const int64_t cols = m == MlaGatherMode::kCopyRow ? v4_row_bytes(f) : v4_dim(f);
  TORCH_CHECK_VALUE(out.size(1) == cols, arg, " must be [T, ", cols, "] for ", format_name(f),
                    m == MlaGatherMode::kCopyRow ? " raw rows" : " values", ", got shape ",
                    shape_str(out));
  return m;
}

}  // namespace

V4Format parse_v4_format(std::string_view format) {
  if (format == "fp8_ds_mla_v4") return V4Format::kMla;
  if (format == "mxfp4") return V4Format::kMxfp4;
  TORCH_CHECK_VALUE(false, "format must be \"fp8_ds_mla_v4\" or \"mxfp4\", got \"", format, "\"");
}

namespace {
V4WriteParams write_args(const at::Tensor& x, const at::Tensor& view, const at::Tensor& slot_mapping,
                         V4Format format, std::string_view scale_floor, const char* x_arg,
                         const char* view_arg) {
  V4WriteParams p{};
  p.format = format;
  p.view = v4_view(view, format, view_arg);
  TORCH_CHECK_VALUE(scale_floor == "amax" || scale_floor == "scale",
                    "scale_floor must be \"amax\" or \"scale\", got \"", scale_floor, "\"");
  TORCH_CHECK_VALUE(scale_floor == "amax" || format == V4Format::kMla,
                    "scale_floor=\"scale\" applies to fp8_ds_mla_v4 rows only");
  p.scale_floor = scale_floor == "scale";
  p.num_tokens = check_slot_mapping(slot_mapping, view, view_arg);
  p.dtype = input_dtype(x, x_arg, true);
  check_rows(x, x_arg, p.num_tokens, {v4_dim(format)});
  check_same_device(x, x_arg, view, view_arg);
  p.x = x.data_ptr();
  p.x_stride = x.stride(0);
  p.slots = slot_mapping.data_ptr<int64_t>();
  return p;
}
// A pair's two views are addressed by one block table.
template <class MlaView, class IndexerView>
void check_one_block_table(const MlaView& mla, const IndexerView& idx) {
  TORCH_CHECK_VALUE(mla.num_blocks == idx.num_blocks && mla.block_size == idx.block_size,
                    "mla_view and indexer_view must share one block table (same num_blocks and rows "
                    "per block), got [", mla.num_blocks, ", ", mla.block_size, "] and [",
                    idx.num_blocks, ", ", idx.block_size, "]");
}
}  // namespace

V4WriteParams v4_write_args(const at::Tensor& x, const at::Tensor& view,
                            const at::Tensor& slot_mapping, V4Format format,
                            std::string_view scale_floor) {
  return write_args(x, view, slot_mapping, format, scale_floor,
                    format == V4Format::kMla ? "kv" : "k", "view");
}

V4PairArgs v4_pair_write_args(const at::Tensor& kv, const at::Tensor& mla_view,
                              const at::Tensor& k_idx, const at::Tensor& indexer_view,
                              const at::Tensor& slot_mapping, std::string_view scale_floor) {
  V4PairArgs a{write_args(kv, mla_view, slot_mapping, V4Format::kMla, scale_floor, "kv", "mla_view"),
               write_args(k_idx, indexer_view, slot_mapping, V4Format::kMxfp4, "amax", "k_idx",
                          "indexer_view")};
  TORCH_CHECK_TYPE(k_idx.scalar_type() == kv.scalar_type(), "k_idx must have the dtype of kv (",
                   kv.scalar_type(), "), got ", k_idx.scalar_type());
  check_one_block_table(a.mla.view, a.idx.view);
  return a;
}

V4Fp8PairArgs v4_fp8_pair_write_args(const at::Tensor& kv, const at::Tensor& mla_view,
                                     const at::Tensor& k_idx, const at::Tensor& indexer_view,
                                     const at::Tensor& slot_mapping, std::string_view scale_floor) {
  V4Fp8PairArgs a{write_args(kv, mla_view, slot_mapping, V4Format::kMla, scale_floor, "kv", "mla_view"),
                  indexer_write_args(k_idx, indexer_view, slot_mapping, "ue8m0", "split", "k_idx",
                                     "indexer_view")};
  TORCH_CHECK_TYPE(k_idx.scalar_type() == at::kBFloat16,
                   "k_idx must be bfloat16 for the V4 fp8 indexer (rounded to bf16 first), got ",
                   k_idx.scalar_type());
  check_one_block_table(a.mla.view, a.idx.view);
  return a;
}

V4GatherParams v4_gather_args(const at::Tensor& view, const GatherSource& src, V4Format format,
                              const at::Tensor& out) {
  V4GatherParams p{};
  p.format = format;
  p.view = v4_view(view, format, "view");
  p.mode = out_mode(out, format, "out");
  check_same_device(out, "out", view, "view");
  p.num_tokens = out.size(0);
  p.src = token_source(src, view, p.num_tokens);
  p.out = static_cast<uint8_t*>(out.data_ptr());
  p.out_stride = out.stride(0) * out.element_size();
  return p;
}

V4WindowGatherParams v4_window_gather_args(const at::Tensor& c_view, const at::Tensor& swa_view,
                                           const WindowSource& src, int64_t ratio, int64_t window,
                                           const at::Tensor& out) {
  V4WindowGatherParams p{};
  p.c_view = v4_view(c_view, V4Format::kMla, "c_view");
  p.swa_view = v4_view(swa_view, V4Format::kMla, "swa_view");
  check_same_device(swa_view, "swa_view", c_view, "c_view");
  TORCH_CHECK_VALUE(ratio >= 1, "ratio must be >= 1, got ", ratio);
  TORCH_CHECK_VALUE(window >= 0, "window must be >= 0, got ", window);
  p.mode = out_mode(out, V4Format::kMla, "out");
  check_same_device(out, "out", c_view, "c_view");
  CompressedSwaSource& s = p.src;
  TORCH_CHECK_VALUE(src.seq_lens.dim() == 1, "seq_lens must be 1-D [num_requests], got shape ",
                    shape_str(src.seq_lens));
  s.num_reqs = src.seq_lens.size(0);
  s.seq_lens = int32_vector(src.seq_lens, "seq_lens", s.num_reqs, c_view);
  s.cu_out = int32_vector(src.cu_out, "cu_out", s.num_reqs + 1, c_view);
  s.c_block_table = block_table_arg(src.c_block_table, "c_block_table", c_view, "c_view", s.num_reqs);
  s.c_bt_stride = src.c_block_table.stride(0);
  s.c_max_blocks = src.c_block_table.size(1);
  s.swa_block_table = block_table_arg(src.swa_block_table, "swa_block_table", c_view, "c_view",
                                      s.num_reqs);
  s.swa_bt_stride = src.swa_block_table.stride(0);
  s.swa_max_blocks = src.swa_block_table.size(1);
  s.ratio = ratio;
  s.window = window;
  p.num_tokens = out.size(0);
  p.out = static_cast<uint8_t*>(out.data_ptr());
  p.out_stride = out.stride(0) * out.element_size();
  return p;
}

void check_window_source(const WindowSource& src, const V4WindowGatherParams& p) {
  const int32_t* lens = src.seq_lens.data_ptr<int32_t>();
  const int32_t* cu = src.cu_out.data_ptr<int32_t>();
  const CompressedSwaSource& s = p.src;
  TORCH_CHECK_VALUE(s.num_reqs == 0 || cu[0] == 0, "cu_out[0] must be 0, got ", cu[0]);
  for (int64_t r = 0; r < s.num_reqs; ++r) {
    const int64_t len = lens[r];
    TORCH_CHECK_VALUE(len >= 0, "seq_lens[", r, "] must be >= 0, got ", len);
    const int64_t n_c = len / s.ratio, n_w = std::min<int64_t>(len, s.window);
    TORCH_CHECK_VALUE(int64_t{cu[r + 1]} - cu[r] == n_c + n_w, "cu_out[", r + 1, "] - cu_out[", r,
                      "] must be seq_lens[", r, "] // ratio + min(seq_lens[", r, "], window) = ",
                      n_c + n_w, ", got ", int64_t{cu[r + 1]} - cu[r]);
    check_table_range(src.c_block_table, "c_block_table", r, 0, n_c, p.c_view, "rows");
    check_table_range(src.swa_block_table, "swa_block_table", r, len - n_w, len, p.swa_view, "rows");
  }
  const int64_t total = s.num_reqs > 0 ? cu[s.num_reqs] : 0;
  TORCH_CHECK_VALUE(total <= p.num_tokens, "out must have at least cu_out[-1] = ", total,
                    " rows, got ", p.num_tokens);
}

}  // namespace kvc
