// DeepSeek-V4 ops' parses (v4_args.h): every argument checked once, here.
#include "v4_args.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "gather_args.h"
#include "host_checks.h"
#include "overlap.h"
#include "write_args.h"

namespace kvc {
namespace {

const char* format_name(V4Format f) {
  return f == V4Format::kMla ? "fp8_ds_mla_v4" : f == V4Format::kMxfp8 ? "v41_mxfp8" : "mxfp4";
}

// The main-KV row of a V4 op: the 584-B record or V4.1's 528-B one.
V4Format parse_main_format(std::string_view format) {
  const V4Format f = parse_v4_format(format);
  TORCH_CHECK_VALUE(f != V4Format::kMxfp4, "format must be \"fp8_ds_mla_v4\" or \"v41_mxfp8\" "
                    "for main-KV rows, got \"", format, "\"");
  return f;
}

// A V4 view: one head, rows of the format's bytes, whole split pages.
PagedView v4_view(const at::Tensor& view, V4Format f, const char* arg) {
  const PagedView v = paged_view(view, arg);
  check_one_head(v, arg);
  check_row_bytes(v, v4_row_bytes(f), arg, format_name(f));
  check_split_page(v, v4_row_bytes(f), arg, c10::str("(token stride ", v4_row_bytes(f), " bytes) for ",
                                                     format_name(f), "'s split pages"));
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

bool parse_scale_floor(std::string_view scale_floor, V4Format format) {
  TORCH_CHECK_VALUE(scale_floor == "amax" || scale_floor == "scale",
                    "scale_floor must be \"amax\" or \"scale\", got \"", scale_floor, "\"");
  TORCH_CHECK_VALUE(scale_floor == "amax" || format != V4Format::kMxfp4,
                    "scale_floor=\"scale\" applies to fp8_ds_mla_v4 and v41_mxfp8 rows only");
  return scale_floor == "scale";
}

bool parse_subnormals(std::string_view subnormals) {
  TORCH_CHECK_VALUE(subnormals == "keep" || subnormals == "flush",
                    "subnormals must be \"keep\" or \"flush\", got \"", subnormals, "\"");
  return subnormals == "flush";
}

struct Rounding {
  bool scale_floor = false, flush_subnormals = false;
};

Rounding parse_rounding(std::string_view scale_floor, std::string_view subnormals, V4Format f) {
  return {parse_scale_floor(scale_floor, f), parse_subnormals(subnormals)};
}

// x [T, v4_dim(format)] into view, without the slot_mapping checks (the caller's parse makes
// them once).
V4WriteParams v4_rows(const at::Tensor& x, const char* x_arg, const at::Tensor& view,
                      const char* view_arg, int64_t num_tokens, V4Format format, Rounding r) {
  V4WriteParams p{};
  p.format = format;
  p.view = v4_view(view, format, view_arg);
  p.scale_floor = r.scale_floor;
  p.flush_subnormals = r.flush_subnormals;
  p.num_tokens = num_tokens;
  p.dtype = input_dtype(x, x_arg, true);
  check_rows(x, x_arg, num_tokens, {v4_dim(format)});
  p.x = x.data_ptr();
  p.x_stride = x.stride(0);
  return p;
}

V4WriteParams v4_write(const at::Tensor& x, const char* x_arg, const at::Tensor& view,
                       const at::Tensor& slot_mapping, V4Format format, Rounding r,
                       bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  V4WriteParams p = v4_rows(x, x_arg, view, "view", n, format, r);
  p.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(view, "view")}, {named(x, x_arg), named(slot_mapping, "slot_mapping")});
  if (on_host) check_slot_values(slot_mapping, n, p.view);
  return p;
}

// V4's fp8 indexer: V3.2's row of the bf16-rounded input (bf16, fp16 or fp32; what is not a
// float is refused rather than converted). The copy is made last (round_indexer_input).
V4IndexerWrite v4_indexer_rows(const at::Tensor& k, const char* k_arg, const at::Tensor& view,
                               const char* view_arg, int64_t num_tokens) {
  const auto t = k.scalar_type();
  TORCH_CHECK_TYPE(t == at::kBFloat16 || t == at::kHalf || t == at::kFloat, k_arg,
                   " must be bfloat16, float16 or float32, got ", dtype_str(t));
  return {indexer_rows(k, k_arg, view, view_arg, num_tokens, "ue8m0", "split", true), at::Tensor()};
}

// The bf16 copy a V4 fp8 indexer write reads, made once every check has passed.
void round_indexer_input(V4IndexerWrite& w, const at::Tensor& k) {
  w.k_bf16 = k.scalar_type() == at::kBFloat16 ? k : k.to(at::kBFloat16);
  w.p.k = w.k_bf16.data_ptr();
  w.p.k_stride = w.k_bf16.stride(0);
  w.p.dtype = DType::kBFloat16;
}

}  // namespace

V4Format parse_v4_format(std::string_view format) {
  if (format == "fp8_ds_mla_v4") return V4Format::kMla;
  if (format == "v41_mxfp8") return V4Format::kMxfp8;
  if (format == "mxfp4") return V4Format::kMxfp4;
  TORCH_CHECK_VALUE(false, "format must be \"fp8_ds_mla_v4\", \"v41_mxfp8\" or \"mxfp4\", got \"",
                    format, "\"");
}

V4WriteParams parse_v4_mla_quant_and_cache(const at::Tensor& kv, const at::Tensor& view,
                                           const at::Tensor& slot_mapping,
                                           std::string_view scale_floor, std::string_view format,
                                           std::string_view subnormals, bool on_host) {
  const V4Format f = parse_main_format(format);
  return v4_write(kv, "kv", view, slot_mapping, f, parse_rounding(scale_floor, subnormals, f),
                  on_host);
}

V4WriteParams parse_mxfp4_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                          const at::Tensor& slot_mapping, bool on_host) {
  return v4_write(k, "k", view, slot_mapping, V4Format::kMxfp4, Rounding{}, on_host);
}

V4IndexerWrite parse_v4_indexer_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                                const at::Tensor& slot_mapping, bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  V4IndexerWrite w = v4_indexer_rows(k, "k", view, "view", n);
  w.p.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(view, "view")}, {named(k, "k"), named(slot_mapping, "slot_mapping")});
  if (on_host) check_slot_values(slot_mapping, n, w.p.view);
  round_indexer_input(w, k);
  return w;
}

V4PairWrite parse_v4_dsa_write(const at::Tensor& kv, const at::Tensor& mla_view,
                               const at::Tensor& k_idx, const at::Tensor& indexer_view,
                               const at::Tensor& slot_mapping, std::string_view scale_floor,
                               std::string_view indexer, std::string_view format,
                               std::string_view subnormals, bool on_host) {
  TORCH_CHECK_VALUE(indexer == "mxfp4" || indexer == "fp8",
                    "indexer must be \"mxfp4\" or \"fp8\", got \"", indexer, "\"");
  const V4Format f = parse_main_format(format);
  const int64_t n = slot_mapping_arg(slot_mapping);
  V4PairWrite a{};
  a.mla = v4_rows(kv, "kv", mla_view, "mla_view", n, f, parse_rounding(scale_floor, subnormals, f));
  a.fp8_indexer = indexer == "fp8";
  const PagedView* idx_view;
  if (a.fp8_indexer) {
    a.fp8 = v4_indexer_rows(k_idx, "k_idx", indexer_view, "indexer_view", n);
    a.fp8.p.slots = ptr<int64_t>(slot_mapping);
    idx_view = &a.fp8.p.view;
  } else {
    a.mxfp4 = v4_rows(k_idx, "k_idx", indexer_view, "indexer_view", n, V4Format::kMxfp4, Rounding{});
    TORCH_CHECK_TYPE(k_idx.scalar_type() == kv.scalar_type(), "k_idx must have the dtype of kv (",
                     kv.scalar_type(), "), got ", k_idx.scalar_type());
    a.mxfp4.slots = ptr<int64_t>(slot_mapping);
    idx_view = &a.mxfp4.view;
  }
  check_one_block_table(a.mla.view, "mla_view", *idx_view, "indexer_view");
  a.mla.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(mla_view, "mla_view"), named(indexer_view, "indexer_view")},
              {named(kv, "kv"), named(k_idx, "k_idx"), named(slot_mapping, "slot_mapping")});
  check_outputs_apart(named(mla_view, "mla_view"), named(indexer_view, "indexer_view"));
  if (on_host) check_slot_values(slot_mapping, n, a.mla.view);
  if (a.fp8_indexer) round_indexer_input(a.fp8, k_idx);
  return a;
}

V4GatherParams parse_gather_v4(const at::Tensor& view, const GatherSource& src,
                               std::string_view format, const at::Tensor& out, bool validate) {
  V4GatherParams p{};
  p.format = parse_v4_format(format);
  p.view = v4_view(view, p.format, "view");
  p.mode = out_mode(out, p.format, "out");
  p.num_tokens = out.size(0);
  p.src = token_source(src, p.num_tokens);
  p.out = ptr<uint8_t>(out);
  p.out_stride = out.stride(0) * out.element_size();
  check_gather_outputs({named(out, "out")}, view, src, std::nullopt);
  if (validate) validate_source(view, src, p.view, p.num_tokens);
  return p;
}

namespace {
// Value checks (CPU tensors) of a validated window read: lengths >= 0, cu_out the prefix sum of
// each request's rows, out large enough, every block a request reads inside its view.
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
}  // namespace

V4WindowGatherParams parse_gather_v4_window(const at::Tensor& c_view, const at::Tensor& swa_view,
                                            const WindowSource& src, int64_t ratio,
                                            int64_t window, const at::Tensor& out, bool validate,
                                            std::string_view format) {
  V4WindowGatherParams p{};
  p.format = parse_main_format(format);
  p.c_view = v4_view(c_view, p.format, "c_view");
  p.swa_view = v4_view(swa_view, p.format, "swa_view");
  TORCH_CHECK_VALUE(ratio >= 1, "ratio must be >= 1, got ", ratio);
  TORCH_CHECK_VALUE(window >= 0, "window must be >= 0, got ", window);
  p.mode = out_mode(out, p.format, "out");
  CompressedSwaSource& s = p.src;
  TORCH_CHECK_VALUE(src.seq_lens.dim() == 1, "seq_lens must be 1-D [num_requests], got shape ",
                    shape_str(src.seq_lens));
  s.num_reqs = src.seq_lens.size(0);
  s.seq_lens = int32_vector(src.seq_lens, "seq_lens", s.num_reqs);
  s.cu_out = int32_vector(src.cu_out, "cu_out", s.num_reqs + 1);
  s.c_block_table = block_table_arg(src.c_block_table, "c_block_table", s.num_reqs);
  s.c_bt_stride = src.c_block_table.stride(0);
  s.c_max_blocks = src.c_block_table.size(1);
  s.swa_block_table = block_table_arg(src.swa_block_table, "swa_block_table", s.num_reqs);
  s.swa_bt_stride = src.swa_block_table.stride(0);
  s.swa_max_blocks = src.swa_block_table.size(1);
  s.ratio = ratio;
  s.window = window;
  p.num_tokens = out.size(0);
  p.out = ptr<uint8_t>(out);
  p.out_stride = out.stride(0) * out.element_size();
  check_no_self_overlap(named(out, "out"));
  check_apart({named(out, "out")}, {named(c_view, "c_view"), named(swa_view, "swa_view"),
                                    named(src.c_block_table, "c_block_table"),
                                    named(src.swa_block_table, "swa_block_table"),
                                    named(src.seq_lens, "seq_lens"), named(src.cu_out, "cu_out")});
  if (validate) {
    check_window_source(c_view.is_cpu() ? src
                                        : WindowSource{src.c_block_table.cpu(),
                                                       src.swa_block_table.cpu(),
                                                       src.seq_lens.cpu(), src.cu_out.cpu()},
                        p);
  }
  return p;
}

}  // namespace kvc
