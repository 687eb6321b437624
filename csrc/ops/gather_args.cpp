// The read ops' parses (gather_args.h): every argument checked once, here.
#include "gather_args.h"

#include <c10/util/Exception.h>

#include "host_checks.h"

namespace kvc {

void check_gather_outputs(std::initializer_list<NamedTensor> outs, const at::Tensor& view,
                          const GatherSource& src, const OptTensor& scale) {
  for (const NamedTensor& o : outs) check_no_self_overlap(o);
  check_apart(outs, {named(view, "view"), named(src.block_table, "block_table"),
                     named(src.cu_seq_lens, "cu_seq_lens"), named(src.seq_starts, "seq_starts"),
                     named(src.slots, "slots"), named(scale, "scale")});
}

void validate_source(const at::Tensor& view, const GatherSource& src, const PagedView& v,
                     int64_t out_rows) {
  check_gather_source(view.is_cpu() ? src : on_host(src), v, out_rows);
}

MlaGatherParams parse_gather_mla(const at::Tensor& view, const GatherSource& src,
                                 std::string_view kv_cache_dtype, const at::Tensor& out,
                                 bool validate, const OptTensor& scale) {
  MlaGatherParams p{};
  p.view = paged_view(view, "view");
  check_one_head(p.view, "view");
  p.format = parse_mla_format(kv_cache_dtype);
  TORCH_CHECK_VALUE(out.dim() == 2, "out must be 2-D [T, row], got shape ", shape_str(out));
  TORCH_CHECK_VALUE(out.size(0) == 0 || out.stride(1) == 1, "out must be contiguous in its last dimension");
  const int64_t cols = out.size(1);
  if (p.format != MlaFormat::kAuto) {
    const bool ds = p.format == MlaFormat::kFp8DsMla;
    const int64_t row = ds ? kMlaFp8RowBytes : kMlaDim;
    check_row_bytes(p.view, row, "view", ds ? "fp8_ds_mla" : "fp8: 576 e4m3 codes");
    if (ds)
      check_no_scale(scale, "scale", kv_cache_dtype);
    else
      p.scale = tensor_scale(scale, view, "view", 1, "scale", kv_cache_dtype);
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
    check_no_scale(scale, "scale", kv_cache_dtype);
    p.mode = MlaGatherMode::kCopyRow;
    TORCH_CHECK_VALUE(cols * out.element_size() == p.view.row_bytes && cols == kMlaDim,
                      "out must be [T, 576] of the dtype the rows were written in (C = ",
                      p.view.row_bytes, " bytes), got shape ", shape_str(out), " of ",
                      out.scalar_type());
  }
  p.num_tokens = out.size(0);
  p.src = token_source(src, p.num_tokens);
  p.out = ptr<uint8_t>(out);
  p.out_stride = out.stride(0) * out.element_size();
  check_gather_outputs({named(out, "out")}, view, src, scale);
  if (validate) validate_source(view, src, p.view, p.num_tokens);
  return p;
}

KvGatherParams parse_gather_kv(const at::Tensor& view, const GatherSource& src,
                               const at::Tensor& out, bool validate, const OptTensor& scale) {
  KvGatherParams p{};
  p.view = paged_view(view, "view");
  p.dtype = input_dtype(out, "out", true);
  TORCH_CHECK_VALUE(out.dim() == 3 && out.size(1) == p.view.num_heads,
                    "out must be [T, H = ", p.view.num_heads, ", D], got shape ", shape_str(out));
  TORCH_CHECK_VALUE(out.numel() == 0 || out.stride(2) == 1, "out must be contiguous in its last dimension");
  p.head_dim = out.size(2);
  p.fp8 = scale.has_value();
  const int64_t want = p.head_dim * (p.fp8 ? 1 : out.element_size());
  TORCH_CHECK_VALUE(p.view.row_bytes == want, "view rows must be D x ", p.fp8 ? 1 : out.element_size(),
                    " = ", want, " bytes for out of shape ", shape_str(out), p.fp8 ? " (fp8 codes)" : "",
                    ", got C = ", p.view.row_bytes);
  if (p.fp8) p.scale = tensor_scale(scale, view, "view", p.view.num_heads, "scale", "fp8");
  p.num_tokens = out.size(0);
  p.src = token_source(src, p.num_tokens);
  p.out = ptr<uint8_t>(out);
  p.out_token_stride = out.stride(0) * out.element_size();
  p.out_head_stride = out.stride(1) * out.element_size();
  check_gather_outputs({named(out, "out")}, view, src, scale);
  if (validate) validate_source(view, src, p.view, p.num_tokens);
  return p;
}

IndexerGatherParams parse_gather_indexer(const at::Tensor& view, const GatherSource& src,
                                         std::string_view placement, const at::Tensor& codes,
                                         const at::Tensor& scales, bool validate) {
  IndexerGatherParams p{};
  p.view = paged_view(view, "view");
  check_one_head(p.view, "view");
  check_row_bytes(p.view, kIndexerRowBytes, "view", "indexer: 128 codes + fp32 scale");
  p.placement = parse_placement(placement);
  if (p.placement == IndexerPlacement::kSplit)
    check_split_page(p.view, kIndexerRowBytes, "view",
                     c10::str("for placement=\"split\" (token stride ", kIndexerRowBytes, " bytes)"));
  TORCH_CHECK_TYPE(codes.scalar_type() == at::kByte, "codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK_VALUE(codes.dim() == 2 && codes.size(1) == kIndexerDim,
                    "codes must be [T, 128], got shape ", shape_str(codes));
  TORCH_CHECK_VALUE(codes.size(0) == 0 || codes.stride(1) == 1, "codes must be contiguous in its last dimension");
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, "scales must be float32, got ",
                   scales.scalar_type());
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.size(0) == codes.size(0) && scales.is_contiguous(),
                    "scales must be contiguous [T] with T = codes.size(0) = ", codes.size(0),
                    ", got shape ", shape_str(scales));
  p.num_tokens = codes.size(0);
  p.src = token_source(src, p.num_tokens);
  p.codes = ptr<uint8_t>(codes);
  p.codes_stride = codes.stride(0);
  p.scales = ptr<float>(scales);
  check_gather_outputs({named(codes, "codes"), named(scales, "scales")}, view, src, std::nullopt);
  check_outputs_apart(named(codes, "codes"), named(scales, "scales"));
  if (validate) validate_source(view, src, p.view, p.num_tokens);
  return p;
}

}  // namespace kvc
