// The write ops' parses (write_args.h): every argument checked once, here.
#include "write_args.h"

#include <c10/util/Exception.h>

#include "host_checks.h"
#include "overlap.h"

namespace kvc {
namespace {


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

// [T, H, D] rows of key into view (C = D x itemsize, or D e4m3 codes with "fp8" and a scale).
PlainWriteParams plain_rows(const at::Tensor& key, const char* key_arg, const at::Tensor& view,
                            const char* view_arg, int64_t num_tokens, bool fp8,
                            std::string_view kv_cache_dtype, const OptTensor& scale,
                            const char* scale_arg) {
  PlainWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.num_tokens = num_tokens;
  p.fp8 = fp8;
  p.dtype = input_dtype(key, key_arg, true);
  check_rows(key, key_arg, num_tokens, {p.view.num_heads, -1});
  p.num_heads = key.size(1);
  p.head_dim = key.size(2);
  const int64_t want = p.head_dim * (fp8 ? 1 : dtype_size(p.dtype));
  TORCH_CHECK_VALUE(p.view.row_bytes == want, view_arg, " rows must be D x ",
                    fp8 ? 1 : key.element_size(), " = ", want, " bytes for ", key_arg,
                    " of shape ", shape_str(key), ", got C = ", p.view.row_bytes);
  if (fp8)
    p.scale = tensor_scale(scale, view, view_arg, p.num_heads, scale_arg, kv_cache_dtype);
  else
    check_no_scale(scale, scale_arg, kv_cache_dtype);
  p.key = key.data_ptr();
  p.key_token_stride = key.stride(0);
  p.key_head_stride = key.stride(1);
  return p;
}

bool parse_plain_format(std::string_view kv_cache_dtype) {
  TORCH_CHECK_VALUE(kv_cache_dtype == "auto" || kv_cache_dtype == "fp8",
                    "kv_cache_dtype must be \"auto\" or \"fp8\", got \"", kv_cache_dtype, "\"");
  return kv_cache_dtype == "fp8";
}

MlaWriteParams mla_rows(const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& view,
                        const char* view_arg, int64_t num_tokens, std::string_view kv_cache_dtype,
                        const OptTensor& scale, OptStr tile_scale) {
  MlaWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.format = parse_mla_format(kv_cache_dtype);
  p.tile_scale = parse_tile_scale(tile_scale, p.format, kv_cache_dtype);
  p.num_tokens = num_tokens;
  p.dtype = input_dtype(kv_c, "kv_c", p.format == MlaFormat::kAuto);
  TORCH_CHECK_TYPE(k_pe.scalar_type() == kv_c.scalar_type(), "k_pe must have the dtype of kv_c (",
                   kv_c.scalar_type(), "), got ", k_pe.scalar_type());
  check_rows(kv_c, "kv_c", num_tokens, {kMlaLatentDim});
  check_rows(k_pe, "k_pe", num_tokens, {kMlaRopeDim});
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
    p.scale = tensor_scale(scale, view, view_arg, 1, "scale", kv_cache_dtype);
  else
    check_no_scale(scale, "scale", kv_cache_dtype);
  p.kv_c = kv_c.data_ptr();
  p.kv_c_stride = kv_c.stride(0);
  p.k_pe = k_pe.data_ptr();
  p.k_pe_stride = k_pe.stride(0);
  return p;
}

}  // namespace

void check_one_block_table(const PagedView& a, const char* a_arg, const PagedView& b,
                           const char* b_arg) {
  TORCH_CHECK_VALUE(a.num_blocks == b.num_blocks && a.block_size == b.block_size, a_arg, " and ",
                    b_arg, " must share one block table (same num_blocks and rows per block), "
                    "got [", a.num_blocks, ", ", a.block_size, "] and [", b.num_blocks, ", ",
                    b.block_size, "]");
}

IndexerWriteParams indexer_rows(const at::Tensor& k, const char* k_arg, const at::Tensor& view,
                                const char* view_arg, int64_t num_tokens, OptStr scale_fmt,
                                std::string_view placement, bool any_float) {
  IndexerWriteParams p{};
  p.view = paged_view(view, view_arg);
  p.placement = parse_placement(placement);
  TORCH_CHECK_VALUE(!scale_fmt || *scale_fmt == "ue8m0",
                    "scale_fmt must be None or \"ue8m0\", got \"", scale_fmt.value_or(""), "\"");
  p.ue8m0 = scale_fmt.has_value();
  p.num_tokens = num_tokens;
  p.dtype = input_dtype(k, k_arg, any_float);
  check_rows(k, k_arg, num_tokens, {kIndexerDim});
  check_one_head(p.view, view_arg);
  check_row_bytes(p.view, kIndexerRowBytes, view_arg, "indexer: 128 codes + fp32 scale");
  if (p.placement == IndexerPlacement::kSplit)
    check_split_page(p.view, kIndexerRowBytes, view_arg,
                     c10::str("for placement=\"split\" (token stride ", kIndexerRowBytes, " bytes)"));
  p.k = k.data_ptr();
  p.k_stride = k.stride(0);
  return p;
}

PlainWriteParams parse_reshape_and_cache(const at::Tensor& key, const at::Tensor& view,
                                         const at::Tensor& slot_mapping,
                                         std::string_view kv_cache_dtype, const OptTensor& scale,
                                         bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  PlainWriteParams p = plain_rows(key, "key", view, "view", n, parse_plain_format(kv_cache_dtype),
                                  kv_cache_dtype, scale, "scale");
  p.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(view, "view")},
              {named(key, "key"), named(slot_mapping, "slot_mapping"), named(scale, "scale")});
  if (on_host) check_slot_values(slot_mapping, n, p.view);
  return p;
}

KvWriteParams parse_reshape_and_cache_kv(const at::Tensor& key, const at::Tensor& value,
                                         const at::Tensor& k_view, const at::Tensor& v_view,
                                         const at::Tensor& slot_mapping,
                                         std::string_view kv_cache_dtype, const OptTensor& k_scale,
                                         const OptTensor& v_scale, bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  const bool fp8 = parse_plain_format(kv_cache_dtype);
  KvWriteParams a{plain_rows(key, "key", k_view, "k_view", n, fp8, kv_cache_dtype, k_scale, "k_scale"),
                  plain_rows(value, "value", v_view, "v_view", n, fp8, kv_cache_dtype, v_scale,
                             "v_scale")};
  check_one_block_table(a.k.view, "k_view", a.v.view, "v_view");
  a.k.slots = a.v.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(k_view, "k_view"), named(v_view, "v_view")},
              {named(key, "key"), named(value, "value"), named(slot_mapping, "slot_mapping"),
               named(k_scale, "k_scale"), named(v_scale, "v_scale")});
  check_outputs_apart(named(k_view, "k_view"), named(v_view, "v_view"));
  if (on_host) check_slot_values(slot_mapping, n, a.k.view);
  return a;
}

KvWriteParams parse_reshape_and_cache_kv_split(const at::Tensor& key, const at::Tensor& value,
                                               const at::Tensor& view,
                                               const at::Tensor& slot_mapping,
                                               bool k_channel_major, bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  const PagedView page = paged_view(view, "view");
  check_split_page(page, page.row_bytes, "view", "(K, then V, per block and head)");
  TORCH_CHECK_TYPE(key.scalar_type() == value.scalar_type(), "key and value must have one dtype, "
                   "got ", dtype_str(key.scalar_type()), " and ", dtype_str(value.scalar_type()));
  KvWriteParams a{};
  for (PlainWriteParams* p : {&a.k, &a.v}) {
    const bool first = p == &a.k;
    const at::Tensor& x = first ? key : value;
    const char* arg = first ? "key" : "value";
    p->dtype = input_dtype(x, arg, true);
    check_rows(x, arg, n, {page.num_heads, -1});
    p->num_heads = x.size(1);
    p->head_dim = x.size(2);
    p->key = x.data_ptr();
    p->key_token_stride = x.stride(0);
    p->key_head_stride = x.stride(1);
    p->num_tokens = n;
    p->slots = ptr<int64_t>(slot_mapping);
    p->view = page;
  }
  const int64_t es = dtype_size(a.k.dtype), k_bytes = a.k.head_dim * es;
  TORCH_CHECK_VALUE(page.row_bytes == k_bytes + a.v.head_dim * es, "view rows must be (D_k + D_v) x ",
                    es, " = ", k_bytes + a.v.head_dim * es, " bytes for key ", shape_str(key),
                    " and value ", shape_str(value), ", got C = ", page.row_bytes);
  a.k.view.row_bytes = k_bytes;
  a.k.view.token_stride = k_channel_major ? es : k_bytes;
  a.k.elem_stride = k_channel_major ? page.block_size * es : 0;
  a.v.view.base += page.block_size * k_bytes;
  a.v.view.row_bytes = a.v.view.token_stride = a.v.head_dim * es;
  check_apart({named(view, "view")}, {named(key, "key"), named(value, "value"),
                                      named(slot_mapping, "slot_mapping")});
  if (on_host) check_slot_values(slot_mapping, n, page);
  return a;
}

KvWriteParams parse_state_write(const at::Tensor& kv, const at::Tensor& score,
                                const at::Tensor& view, const at::Tensor& slot_mapping,
                                bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  TORCH_CHECK_TYPE(kv.scalar_type() == score.scalar_type() &&
                       (kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kBFloat16),
                   "kv and score must both be float32 or bfloat16, got ", dtype_str(kv.scalar_type()),
                   " and ", dtype_str(score.scalar_type()));
  TORCH_CHECK_VALUE(kv.dim() == 2 && score.dim() == 2, "kv and score must be [T, W], got ",
                    shape_str(kv), " and ", shape_str(score));
  TORCH_CHECK_VALUE(kv.size(0) >= n && score.size(0) >= n, "kv and score must hold at least "
                    "slot_mapping.numel() = ", n, " rows, got ", shape_str(kv), " and ", shape_str(score));
  check_rows(kv, "kv", n, {-1});
  check_rows(score, "score", n, {-1});
  const PagedView whole = paged_view(view, "view");
  check_one_head(whole, "view");
  const int64_t es = kv.element_size(), kv_bytes = kv.size(1) * es;
  TORCH_CHECK_VALUE(kv.size(1) > 0 && score.size(1) > 0 && whole.row_bytes == kv_bytes + score.size(1) * es,
                    "view rows of ", whole.row_bytes, " bytes do not hold kv ", shape_str(kv),
                    " + score ", shape_str(score), " of ", dtype_str(kv.scalar_type()));
  // The kv part and the score part of each row: two row writes of one launch.
  KvWriteParams a{};
  for (PlainWriteParams* p : {&a.k, &a.v}) {
    const bool first = p == &a.k;
    const at::Tensor& x = first ? kv : score;
    p->view = whole;
    p->view.base += first ? 0 : kv_bytes;
    p->view.row_bytes = x.size(1) * es;
    p->dtype = input_dtype(x, first ? "kv" : "score", true);
    p->num_heads = 1;
    p->head_dim = x.size(1);
    p->key = x.data_ptr();
    p->key_token_stride = x.stride(0);
    p->key_head_stride = x.size(1);
    p->num_tokens = n;
    p->slots = ptr<int64_t>(slot_mapping);
  }
  check_apart({named(view, "view")},
              {named(kv, "kv"), named(score, "score"), named(slot_mapping, "slot_mapping")});
  if (on_host) check_slot_values(slot_mapping, n, whole);
  return a;
}

MlaWriteParams parse_concat_and_cache_mla(const at::Tensor& kv_c, const at::Tensor& k_pe,
                                          const at::Tensor& view, const at::Tensor& slot_mapping,
                                          std::string_view kv_cache_dtype, const OptTensor& scale,
                                          OptStr tile_scale, bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  MlaWriteParams p = mla_rows(kv_c, k_pe, view, "view", n, kv_cache_dtype, scale, tile_scale);
  p.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(view, "view")}, {named(kv_c, "kv_c"), named(k_pe, "k_pe"),
                                      named(slot_mapping, "slot_mapping"), named(scale, "scale")});
  if (on_host) check_slot_values(slot_mapping, n, p.view);
  return p;
}

IndexerWriteParams parse_indexer_k_quant_and_cache(const at::Tensor& k, const at::Tensor& view,
                                                   const at::Tensor& slot_mapping,
                                                   OptStr scale_fmt, std::string_view placement,
                                                   bool on_host) {
  const int64_t n = slot_mapping_arg(slot_mapping);
  IndexerWriteParams p = indexer_rows(k, "k", view, "view", n, scale_fmt, placement);
  p.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(view, "view")}, {named(k, "k"), named(slot_mapping, "slot_mapping")});
  if (on_host) check_slot_values(slot_mapping, n, p.view);
  return p;
}

DsaWriteParams parse_dsa_write(const at::Tensor& kv_c, const at::Tensor& k_pe,
                               const at::Tensor& mla_view, const at::Tensor& k_idx,
                               const at::Tensor& indexer_view, const at::Tensor& slot_mapping,
                               std::string_view kv_cache_dtype, OptStr scale_fmt,
                               std::string_view placement, OptStr tile_scale, bool on_host) {
  TORCH_CHECK_VALUE(kv_cache_dtype != "fp8",
                    "dsa_write writes fp8_ds_mla or auto MLA rows; for per-tensor fp8 rows call "
                    "concat_and_cache_mla and indexer_k_quant_and_cache");
  const int64_t n = slot_mapping_arg(slot_mapping);
  DsaWriteParams a{mla_rows(kv_c, k_pe, mla_view, "mla_view", n, kv_cache_dtype, std::nullopt,
                            tile_scale),
                   indexer_rows(k_idx, "k_idx", indexer_view, "indexer_view", n, scale_fmt,
                                placement)};
  TORCH_CHECK_TYPE(a.mla.format == MlaFormat::kAuto || k_idx.scalar_type() == kv_c.scalar_type(),
                   "k_idx must have the dtype of kv_c (", kv_c.scalar_type(), "), got ",
                   k_idx.scalar_type());
  check_one_block_table(a.mla.view, "mla_view", a.idx.view, "indexer_view");
  a.mla.slots = a.idx.slots = ptr<int64_t>(slot_mapping);
  check_apart({named(mla_view, "mla_view"), named(indexer_view, "indexer_view")},
              {named(kv_c, "kv_c"), named(k_pe, "k_pe"), named(k_idx, "k_idx"),
               named(slot_mapping, "slot_mapping")});
  check_outputs_apart(named(mla_view, "mla_view"), named(indexer_view, "indexer_view"));
  if (on_host) check_slot_values(slot_mapping, n, a.mla.view);
  return a;
}

}  // namespace kvc
