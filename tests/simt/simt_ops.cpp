// The CUDA kernels, run on CPU tensors through tests/simt/simt_host.h: each function builds the
// kernel parameters exactly as the op does (op_args.cpp) and calls the same dispatch_* as
// csrc/cuda/*.cu, with a host launch instead of a stream launch. Like the CUDA ops, nothing
// here checks slot or block-table values first: the kernels must skip or zero what is invalid.
#include <torch/extension.h>

#include <optional>
#include <string>

#include "op_args.h"
#include "v4_args.h"
#include "simt_host.h"
// after simt_host.h:
#include "cuda/copy_kernels.cuh"
#include "cuda/gather_kernels.cuh"
#include "cuda/v4_kernels.cuh"
#include "cuda/write_kernels.cuh"

namespace {

using at::Tensor;
using kvc::simt::HostLaunch;
using Launch = HostLaunch<kvc::cuda::kWarpsPerBlock * kvc::cuda::kWarp>;
using OptS = std::optional<std::string>;

kvc::OptStr osv(const OptS& s) { return s ? kvc::OptStr(*s) : std::nullopt; }

void reshape_and_cache(const Tensor& key, const Tensor& view, const Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const std::optional<Tensor>& scale) {
  const auto p = kvc::plain_write_args(key, view, slot_mapping, kv_cache_dtype, scale);
  if (p.num_tokens) kvc::cuda::dispatch_plain_write(p, Launch{});
}

void reshape_and_cache_kv(const Tensor& key, const Tensor& value, const Tensor& k_view,
                          const Tensor& v_view, const Tensor& slot_mapping,
                          const std::string& kv_cache_dtype, const std::optional<Tensor>& k_scale,
                          const std::optional<Tensor>& v_scale) {
  const auto k = kvc::plain_write_args(key, k_view, slot_mapping, kv_cache_dtype, k_scale, "key",
                                       "k_view", "k_scale");
  const auto v = kvc::plain_write_args(value, v_view, slot_mapping, kv_cache_dtype, v_scale,
                                       "value", "v_view", "v_scale");
  if (k.num_tokens) kvc::cuda::dispatch_kv_write(k, v, Launch{});
}

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, const Tensor& view,
                          const Tensor& slot_mapping, const std::string& kv_cache_dtype,
                          const std::optional<Tensor>& scale, const OptS& tile_scale) {
  const auto p = kvc::mla_write_args(kv_c, k_pe, view, slot_mapping, kv_cache_dtype, scale,
                                     osv(tile_scale));
  if (p.num_tokens) kvc::cuda::dispatch_mla_write(p, Launch{});
}

void indexer_k_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping,
                               const OptS& scale_fmt, const std::string& placement) {
  const auto p = kvc::indexer_write_args(k, view, slot_mapping, osv(scale_fmt), placement);
  if (p.num_tokens) kvc::cuda::dispatch_indexer_write(p, Launch{});
}

void dsa_write(const Tensor& kv_c, const Tensor& k_pe, const Tensor& mla_view, const Tensor& k_idx,
               const Tensor& indexer_view, const Tensor& slot_mapping,
               const std::string& kv_cache_dtype, const OptS& scale_fmt,
               const std::string& placement, const OptS& tile_scale) {
  const auto mla = kvc::mla_write_args(kv_c, k_pe, mla_view, slot_mapping, kv_cache_dtype,
                                       std::nullopt, osv(tile_scale));
  const auto idx = kvc::indexer_write_args(k_idx, indexer_view, slot_mapping, osv(scale_fmt),
                                           placement);
  if (mla.num_tokens) kvc::cuda::dispatch_dsa_write(mla, idx, Launch{});
}

kvc::GatherSource source(const std::optional<Tensor>& block_table,
                         const std::optional<Tensor>& cu_seq_lens,
                         const std::optional<Tensor>& seq_starts, const std::optional<Tensor>& slots) {
  return {block_table, cu_seq_lens, seq_starts, slots};
}

void gather_mla(const Tensor& view, const std::optional<Tensor>& block_table,
                const std::optional<Tensor>& cu_seq_lens, const std::optional<Tensor>& seq_starts,
                const std::optional<Tensor>& slots, const std::string& kv_cache_dtype,
                const Tensor& out, const std::optional<Tensor>& scale) {
  const auto p = kvc::mla_gather_args(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                      kv_cache_dtype, out, scale);
  if (p.num_tokens) kvc::cuda::dispatch_mla_gather(p, Launch{});
}

void gather_kv(const Tensor& view, const std::optional<Tensor>& block_table,
               const std::optional<Tensor>& cu_seq_lens, const std::optional<Tensor>& seq_starts,
               const Tensor& out, const std::optional<Tensor>& scale,
               const std::optional<Tensor>& slots) {
  const auto p = kvc::kv_gather_args(view, source(block_table, cu_seq_lens, seq_starts, slots), out,
                                     scale);
  if (p.num_tokens) kvc::cuda::dispatch_kv_gather(p, Launch{});
}

void gather_indexer(const Tensor& view, const std::optional<Tensor>& block_table,
                    const std::optional<Tensor>& cu_seq_lens, const std::optional<Tensor>& seq_starts,
                    const std::optional<Tensor>& slots, const std::string& placement,
                    const Tensor& codes, const Tensor& scales) {
  const auto p = kvc::indexer_gather_args(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                          placement, codes, scales);
  if (p.num_tokens) kvc::cuda::dispatch_indexer_gather(p, Launch{});
}

void v4_quant_and_cache(const Tensor& x, const Tensor& view, const Tensor& slot_mapping,
                        const std::string& format, const std::string& scale_floor) {
  const auto p = kvc::v4_write_args(x, view, slot_mapping, kvc::parse_v4_format(format), scale_floor);
  if (p.num_tokens) kvc::cuda::dispatch_v4_write(p, Launch{});
}

void v4_dsa_write(const Tensor& kv, const Tensor& mla_view, const Tensor& k_idx,
                  const Tensor& indexer_view, const Tensor& slot_mapping,
                  const std::string& scale_floor, const std::string& indexer) {
  if (indexer == "fp8") {  // the op's CUDA branch: one set of checks, then both kernels
    const auto a = kvc::v4_fp8_pair_write_args(kv, mla_view, k_idx, indexer_view, slot_mapping,
                                               scale_floor);
    if (a.mla.num_tokens) {
      kvc::cuda::dispatch_v4_write(a.mla, Launch{});
      kvc::cuda::dispatch_indexer_write(a.idx, Launch{});
    }
    return;
  }
  const auto a = kvc::v4_pair_write_args(kv, mla_view, k_idx, indexer_view, slot_mapping, scale_floor);
  if (a.mla.num_tokens) kvc::cuda::dispatch_v4_pair_write(a.mla, a.idx, Launch{});
}

void gather_v4(const Tensor& view, const std::optional<Tensor>& block_table,
               const std::optional<Tensor>& cu_seq_lens, const std::optional<Tensor>& seq_starts,
               const std::optional<Tensor>& slots, const std::string& format, const Tensor& out) {
  const auto p = kvc::v4_gather_args(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                     kvc::parse_v4_format(format), out);
  if (p.num_tokens) kvc::cuda::dispatch_v4_gather(p, Launch{});
}

void gather_v4_window(const Tensor& c_view, const Tensor& c_block_table, const Tensor& swa_view,
                      const Tensor& swa_block_table, const Tensor& seq_lens, const Tensor& cu_out,
                      int64_t ratio, int64_t window, const Tensor& out) {
  const auto p = kvc::v4_window_gather_args(
      c_view, swa_view, {c_block_table, swa_block_table, seq_lens, cu_out}, ratio, window, out);
  if (p.num_tokens) kvc::cuda::dispatch_v4_window_gather(p, Launch{});
}

// The one-launch span copy: spans checked and chunked as the op does, then the kernel.
void copy_spans(const Tensor& src, const Tensor& dst, const Tensor& spans, int64_t chunk) {
  const int64_t n = spans.size(0);
  const int64_t* s = spans.data_ptr<int64_t>();
  kvc::check_spans(src.data_ptr<uint8_t>(), src.numel(), dst.data_ptr<uint8_t>(), dst.numel(), s, n,
                   true);
  const Tensor chunks = kvc::chunk_spans(s, n, chunk);
  kvc::cuda::dispatch_copy_chunks({src.data_ptr<uint8_t>(), dst.data_ptr<uint8_t>(),
                                   chunks.data_ptr<int64_t>(), chunks.size(0)},
                                  Launch{});
}

// Device helpers whose GPU-only callers the host path does not reach, checked on their own.
Tensor canonical_nan_codes(const Tensor& words) {
  Tensor out = words.clone();
  auto* w = out.data_ptr<int32_t>();
  for (int64_t i = 0; i < out.numel(); ++i)
    w[i] = static_cast<int32_t>(kvc::cuda::canonical_nan_codes(static_cast<uint32_t>(w[i])));
  return out;
}

Tensor exact_recip(const Tensor& scales) {
  Tensor out = scales.clone();
  auto* s = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) s[i] = kvc::cuda::exact_recip(s[i]);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("reshape_and_cache", &reshape_and_cache);
  m.def("concat_and_cache_mla", &concat_and_cache_mla, pybind11::arg("kv_c"), pybind11::arg("k_pe"),
        pybind11::arg("view"), pybind11::arg("slot_mapping"), pybind11::arg("kv_cache_dtype"),
        pybind11::arg("scale"), pybind11::arg("tile_scale") = std::nullopt);
  m.def("indexer_k_quant_and_cache", &indexer_k_quant_and_cache);
  m.def("dsa_write", &dsa_write, pybind11::arg("kv_c"), pybind11::arg("k_pe"),
        pybind11::arg("mla_view"), pybind11::arg("k_idx"), pybind11::arg("indexer_view"),
        pybind11::arg("slot_mapping"), pybind11::arg("kv_cache_dtype"), pybind11::arg("scale_fmt"),
        pybind11::arg("placement"), pybind11::arg("tile_scale") = std::nullopt);
  m.def("gather_mla", &gather_mla);
  m.def("gather_indexer", &gather_indexer);
  m.def("reshape_and_cache_kv", &reshape_and_cache_kv);
  m.def("gather_kv", &gather_kv, pybind11::arg("view"), pybind11::arg("block_table"),
        pybind11::arg("cu_seq_lens"), pybind11::arg("seq_starts"), pybind11::arg("out"),
        pybind11::arg("scale"), pybind11::arg("slots") = std::nullopt);
  m.def("copy_spans", &copy_spans);
  m.def("v4_quant_and_cache", &v4_quant_and_cache);
  m.def("v4_dsa_write", &v4_dsa_write, pybind11::arg("kv"), pybind11::arg("mla_view"),
        pybind11::arg("k_idx"), pybind11::arg("indexer_view"), pybind11::arg("slot_mapping"),
        pybind11::arg("scale_floor"), pybind11::arg("indexer") = "mxfp4");
  m.def("gather_v4", &gather_v4);
  m.def("gather_v4_window", &gather_v4_window);
  m.def("canonical_nan_codes", &canonical_nan_codes);
  m.def("exact_recip", &exact_recip);
}
