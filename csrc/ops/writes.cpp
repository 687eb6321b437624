// The write ops of DeepSeek-V3.2's rows and plain K/V rows: parse (write_args.h), then run.
#include "../core/entry.h"
#include "ops.h"
#include "run.h"
#include "write_args.h"

namespace kvc::ops {

void reshape_and_cache(const Tensor& key, const Tensor& view, const Tensor& slot_mapping,
                       Str kv_cache_dtype, const OptTensor& scale) {
  NvtxRange range("kvc::reshape_and_cache");
  const PlainWriteParams p = parse_reshape_and_cache(key, view, slot_mapping, sv(kv_cache_dtype),
                                                     scale, view.is_cpu());
  run_kernel(view, p.num_tokens, [&] { cpu::plain_write(p); },
             [&](void* s) { KVC_CUDA(cuda::plain_write(p, s)); });
}

// K and V rows of one layer by one launch (vLLM's reshape_and_cache_flash).
void reshape_and_cache_kv(const Tensor& key, const Tensor& value, const Tensor& k_view,
                          const Tensor& v_view, const Tensor& slot_mapping, Str kv_cache_dtype,
                          const OptTensor& k_scale, const OptTensor& v_scale) {
  NvtxRange range("kvc::reshape_and_cache_kv");
  const KvWriteParams a = parse_reshape_and_cache_kv(key, value, k_view, v_view, slot_mapping,
                                                     sv(kv_cache_dtype), k_scale, v_scale,
                                                     k_view.is_cpu());
  run_kernel(k_view, a.k.num_tokens, [&] { cpu::plain_write(a.k); cpu::plain_write(a.v); },
             [&](void* s) { KVC_CUDA(cuda::kv_write(a.k, a.v, s)); });
}

// K and V into one split page per (block, head) (vLLM-CPU's attention page: K channel-major).
void reshape_and_cache_kv_split(const Tensor& key, const Tensor& value, const Tensor& view,
                                const Tensor& slot_mapping, bool k_channel_major) {
  NvtxRange range("kvc::reshape_and_cache_kv_split");
  const KvWriteParams a = parse_reshape_and_cache_kv_split(key, value, view, slot_mapping,
                                                           k_channel_major, view.is_cpu());
  run_kernel(view, a.k.num_tokens, [&] { cpu::plain_write(a.k); cpu::plain_write(a.v); },
             [&](void* s) { KVC_CUDA(cuda::kv_write(a.k, a.v, s)); });
}

// Compressor-state rows [kv | score]: the two parts of each row by one launch.
void state_write(const Tensor& kv, const Tensor& score, const Tensor& view,
                 const Tensor& slot_mapping) {
  NvtxRange range("kvc::state_write");
  const KvWriteParams a = parse_state_write(kv, score, view, slot_mapping, view.is_cpu());
  run_kernel(view, a.k.num_tokens, [&] { cpu::plain_write(a.k); cpu::plain_write(a.v); },
             [&](void* s) { KVC_CUDA(cuda::kv_write(a.k, a.v, s)); });
}

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, const Tensor& view,
                          const Tensor& slot_mapping, Str kv_cache_dtype, const OptTensor& scale,
                          OptStr tile_scale) {
  NvtxRange range("kvc::concat_and_cache_mla");
  const MlaWriteParams p = parse_concat_and_cache_mla(kv_c, k_pe, view, slot_mapping,
                                                      sv(kv_cache_dtype), scale, osv(tile_scale),
                                                      view.is_cpu());
  run_kernel(view, p.num_tokens, [&] { cpu::mla_write(p); },
             [&](void* s) { KVC_CUDA(cuda::mla_write(p, s)); });
}

void indexer_k_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping,
                               OptStr scale_fmt, Str placement) {
  NvtxRange range("kvc::indexer_k_quant_and_cache");
  const IndexerWriteParams p = parse_indexer_k_quant_and_cache(k, view, slot_mapping,
                                                               osv(scale_fmt), sv(placement),
                                                               view.is_cpu());
  run_kernel(view, p.num_tokens, [&] { cpu::indexer_write(p); },
             [&](void* s) { KVC_CUDA(cuda::indexer_write(p, s)); });
}

// The DSA pair: one layer's MLA row and indexer row for the same slots, one launch.
void dsa_write(const Tensor& kv_c, const Tensor& k_pe, const Tensor& mla_view, const Tensor& k_idx,
               const Tensor& indexer_view, const Tensor& slot_mapping, Str kv_cache_dtype,
               OptStr scale_fmt, Str placement, OptStr tile_scale) {
  NvtxRange range("kvc::dsa_write");
  const DsaWriteParams a = parse_dsa_write(kv_c, k_pe, mla_view, k_idx, indexer_view, slot_mapping,
                                           sv(kv_cache_dtype), osv(scale_fmt), sv(placement),
                                           osv(tile_scale), mla_view.is_cpu());
  run_kernel(mla_view, a.mla.num_tokens, [&] { cpu::mla_write(a.mla); cpu::indexer_write(a.idx); },
             [&](void* s) { KVC_CUDA(cuda::dsa_write(a.mla, a.idx, s)); });
}

}  // namespace kvc::ops
