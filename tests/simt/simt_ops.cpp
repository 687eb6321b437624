// The CUDA kernels, run on CPU tensors through tests/simt/simt_host.h: each function parses its
// arguments with the op's own parse (csrc/ops/*_args.h) and calls the same dispatch_* as
// csrc/cuda/*.cu, with a host launch instead of a stream launch. Like the CUDA ops, nothing here
// checks slot or block-table values (on_host = false, validate = false): the kernels must skip
// or zero what is invalid.
#include <torch/extension.h>

#include <optional>
#include <string>

#include "ops/gather_args.h"
#include "ops/runs.h"
#include "ops/spans.h"
#include "ops/v4_args.h"
#include "ops/write_args.h"
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
using OptT = std::optional<Tensor>;

kvc::OptStr osv(const OptS& s) { return s ? kvc::OptStr(*s) : std::nullopt; }
constexpr bool kCuda = false;  // on_host / validate: the CUDA ops' semantics

void reshape_and_cache(const Tensor& key, const Tensor& view, const Tensor& slot_mapping,
                       const std::string& kv_cache_dtype, const OptT& scale) {
  const auto p = kvc::parse_reshape_and_cache(key, view, slot_mapping, kv_cache_dtype, scale, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_plain_write(p, Launch{});
}

void reshape_and_cache_kv(const Tensor& key, const Tensor& value, const Tensor& k_view,
                          const Tensor& v_view, const Tensor& slot_mapping,
                          const std::string& kv_cache_dtype, const OptT& k_scale,
                          const OptT& v_scale) {
  const auto a = kvc::parse_reshape_and_cache_kv(key, value, k_view, v_view, slot_mapping,
                                                 kv_cache_dtype, k_scale, v_scale, kCuda);
  if (a.k.num_tokens) kvc::cuda::dispatch_kv_write(a.k, a.v, Launch{});
}

void reshape_and_cache_kv_split(const Tensor& key, const Tensor& value, const Tensor& view,
                                const Tensor& slot_mapping, bool k_channel_major) {
  const auto a = kvc::parse_reshape_and_cache_kv_split(key, value, view, slot_mapping,
                                                       k_channel_major, kCuda);
  if (a.k.num_tokens) kvc::cuda::dispatch_kv_write(a.k, a.v, Launch{});
}

void state_write(const Tensor& kv, const Tensor& score, const Tensor& view,
                 const Tensor& slot_mapping) {
  const auto a = kvc::parse_state_write(kv, score, view, slot_mapping, kCuda);
  if (a.k.num_tokens) kvc::cuda::dispatch_kv_write(a.k, a.v, Launch{});
}

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, const Tensor& view,
                          const Tensor& slot_mapping, const std::string& kv_cache_dtype,
                          const OptT& scale, const OptS& tile_scale) {
  const auto p = kvc::parse_concat_and_cache_mla(kv_c, k_pe, view, slot_mapping, kv_cache_dtype,
                                                 scale, osv(tile_scale), kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_mla_write(p, Launch{});
}

void indexer_k_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping,
                               const OptS& scale_fmt, const std::string& placement) {
  const auto p = kvc::parse_indexer_k_quant_and_cache(k, view, slot_mapping, osv(scale_fmt),
                                                      placement, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_indexer_write(p, Launch{});
}

void dsa_write(const Tensor& kv_c, const Tensor& k_pe, const Tensor& mla_view, const Tensor& k_idx,
               const Tensor& indexer_view, const Tensor& slot_mapping,
               const std::string& kv_cache_dtype, const OptS& scale_fmt,
               const std::string& placement, const OptS& tile_scale) {
  const auto a = kvc::parse_dsa_write(kv_c, k_pe, mla_view, k_idx, indexer_view, slot_mapping,
                                      kv_cache_dtype, osv(scale_fmt), placement, osv(tile_scale),
                                      kCuda);
  if (a.mla.num_tokens) kvc::cuda::dispatch_dsa_write(a.mla, a.idx, Launch{});
}

kvc::GatherSource source(const OptT& block_table, const OptT& cu_seq_lens, const OptT& seq_starts,
                         const OptT& slots) {
  return {block_table, cu_seq_lens, seq_starts, slots};
}

void gather_mla(const Tensor& view, const OptT& block_table, const OptT& cu_seq_lens,
                const OptT& seq_starts, const OptT& slots, const std::string& kv_cache_dtype,
                const Tensor& out, const OptT& scale) {
  const auto p = kvc::parse_gather_mla(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                       kv_cache_dtype, out, kCuda, scale);
  if (p.num_tokens) kvc::cuda::dispatch_mla_gather(p, Launch{});
}

void gather_kv(const Tensor& view, const OptT& block_table, const OptT& cu_seq_lens,
               const OptT& seq_starts, const Tensor& out, const OptT& scale, const OptT& slots) {
  const auto p = kvc::parse_gather_kv(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                      out, kCuda, scale);
  if (p.num_tokens) kvc::cuda::dispatch_kv_gather(p, Launch{});
}

void gather_indexer(const Tensor& view, const OptT& block_table, const OptT& cu_seq_lens,
                    const OptT& seq_starts, const OptT& slots, const std::string& placement,
                    const Tensor& codes, const Tensor& scales) {
  const auto p = kvc::parse_gather_indexer(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                           placement, codes, scales, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_indexer_gather(p, Launch{});
}

void v4_mla_quant_and_cache(const Tensor& kv, const Tensor& view, const Tensor& slot_mapping,
                            const std::string& scale_floor, const std::string& format,
                            const std::string& subnormals) {
  const auto p = kvc::parse_v4_mla_quant_and_cache(kv, view, slot_mapping, scale_floor, format,
                                                   subnormals, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_v4_write(p, Launch{});
}

void mxfp4_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping) {
  const auto p = kvc::parse_mxfp4_quant_and_cache(k, view, slot_mapping, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_v4_write(p, Launch{});
}

void v4_indexer_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping) {
  const auto w = kvc::parse_v4_indexer_quant_and_cache(k, view, slot_mapping, kCuda);
  if (w.p.num_tokens) kvc::cuda::dispatch_indexer_write(w.p, Launch{});
}

void v4_dsa_write(const Tensor& kv, const Tensor& mla_view, const Tensor& k_idx,
                  const Tensor& indexer_view, const Tensor& slot_mapping,
                  const std::string& scale_floor, const std::string& indexer,
                  const std::string& format, const std::string& subnormals) {
  const auto a = kvc::parse_v4_dsa_write(kv, mla_view, k_idx, indexer_view, slot_mapping,
                                         scale_floor, indexer, format, subnormals, kCuda);
  if (!a.mla.num_tokens) return;
  if (a.fp8_indexer) {  // the op's CUDA branch: one parse, then both kernels
    kvc::cuda::dispatch_v4_write(a.mla, Launch{});
    kvc::cuda::dispatch_indexer_write(a.fp8.p, Launch{});
    return;
  }
  kvc::cuda::dispatch_v4_pair_write(a.mla, a.mxfp4, Launch{});
}

void gather_v4(const Tensor& view, const OptT& block_table, const OptT& cu_seq_lens,
               const OptT& seq_starts, const OptT& slots, const std::string& format,
               const Tensor& out) {
  const auto p = kvc::parse_gather_v4(view, source(block_table, cu_seq_lens, seq_starts, slots),
                                      format, out, kCuda);
  if (p.num_tokens) kvc::cuda::dispatch_v4_gather(p, Launch{});
}

void gather_v4_window(const Tensor& c_view, const Tensor& c_block_table, const Tensor& swa_view,
                      const Tensor& swa_block_table, const Tensor& seq_lens, const Tensor& cu_out,
                      int64_t ratio, int64_t window, const Tensor& out, const std::string& format) {
  const auto p = kvc::parse_gather_v4_window(
      c_view, swa_view, {c_block_table, swa_block_table, seq_lens, cu_out}, ratio, window, out,
      kCuda, format);
  if (p.num_tokens) kvc::cuda::dispatch_v4_window_gather(p, Launch{});
}

// The one-launch span copy: spans checked and chunked as the op does, then the kernel.
void copy_spans(const Tensor& src, const Tensor& dst, const Tensor& spans, int64_t chunk) {
  const int64_t n = spans.size(0);
  const int64_t* s = spans.data_ptr<int64_t>();
  kvc::check_spans(s, n, src.numel(), dst.numel(),
                   reinterpret_cast<intptr_t>(dst.data_ptr()) - reinterpret_cast<intptr_t>(src.data_ptr()));
  const Tensor chunks = kvc::chunk_spans(s, n, chunk);
  kvc::cuda::dispatch_copy_chunks({src.data_ptr<uint8_t>(), dst.data_ptr<uint8_t>(),
                                   chunks.data_ptr<int64_t>(), chunks.size(0)},
                                  Launch{});
}

// The one-launch run copy (the regroup): runs checked and cut into items as the op does.
void copy_runs(const Tensor& src, const Tensor& dst, const Tensor& runs, int64_t chunk) {
  const int64_t n = runs.size(0);
  const int64_t* r = runs.data_ptr<int64_t>();
  kvc::ops::check_run_rows(r, n, src.numel(), dst.numel(), "runs");
  const Tensor items = kvc::ops::run_items(r, n, chunk);
  kvc::cuda::dispatch_copy_run_items({src.data_ptr<uint8_t>(), dst.data_ptr<uint8_t>(),
                                      items.data_ptr<int64_t>(), items.size(0)},
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
  m.def("reshape_and_cache_kv_split", &reshape_and_cache_kv_split, pybind11::arg("key"),
        pybind11::arg("value"), pybind11::arg("view"), pybind11::arg("slot_mapping"),
        pybind11::arg("k_channel_major") = true);
  m.def("gather_kv", &gather_kv, pybind11::arg("view"), pybind11::arg("block_table"),
        pybind11::arg("cu_seq_lens"), pybind11::arg("seq_starts"), pybind11::arg("out"),
        pybind11::arg("scale"), pybind11::arg("slots") = std::nullopt);
  m.def("copy_spans", &copy_spans);
  m.def("copy_runs", &copy_runs);
  m.def("v4_mla_quant_and_cache", &v4_mla_quant_and_cache, pybind11::arg("kv"), pybind11::arg("view"),
        pybind11::arg("slot_mapping"), pybind11::arg("scale_floor") = "amax",
        pybind11::arg("format") = "fp8_ds_mla_v4", pybind11::arg("subnormals") = "keep");
  m.def("mxfp4_quant_and_cache", &mxfp4_quant_and_cache);
  m.def("v4_indexer_quant_and_cache", &v4_indexer_quant_and_cache);
  m.def("state_write", &state_write);
  m.def("v4_dsa_write", &v4_dsa_write, pybind11::arg("kv"), pybind11::arg("mla_view"),
        pybind11::arg("k_idx"), pybind11::arg("indexer_view"), pybind11::arg("slot_mapping"),
        pybind11::arg("scale_floor"), pybind11::arg("indexer") = "mxfp4",
        pybind11::arg("format") = "fp8_ds_mla_v4", pybind11::arg("subnormals") = "keep");
  m.def("gather_v4", &gather_v4);
  m.def("gather_v4_window", &gather_v4_window, pybind11::arg("c_view"), pybind11::arg("c_block_table"),
        pybind11::arg("swa_view"), pybind11::arg("swa_block_table"), pybind11::arg("seq_lens"),
        pybind11::arg("cu_out"), pybind11::arg("ratio"), pybind11::arg("window"), pybind11::arg("out"),
        pybind11::arg("format") = "fp8_ds_mla_v4");
  m.def("canonical_nan_codes", &canonical_nan_codes);
  m.def("exact_recip", &exact_recip);
}
