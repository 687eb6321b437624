// The write ops of DeepSeek-V4's rows (core/v4_rows.h): parse (v4_args.h), then run.
#include "../core/entry.h"
#include "ops.h"
#include "run.h"
#include "v4_args.h"

namespace kvc::ops {

void v4_mla_quant_and_cache(const Tensor& kv, const Tensor& view, const Tensor& slot_mapping,
                            Str scale_floor, Str format, Str subnormals) {
  NvtxRange range("kvc::v4_mla_quant_and_cache");
  const V4WriteParams p = parse_v4_mla_quant_and_cache(kv, view, slot_mapping, sv(scale_floor),
                                                       sv(format), sv(subnormals), view.is_cpu());
  run_kernel(view, p.num_tokens, [&] { cpu::v4_write(p); },
             [&](void* s) { KVC_CUDA(cuda::v4_write(p, s)); });
}

void mxfp4_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping) {
  NvtxRange range("kvc::mxfp4_quant_and_cache");
  const V4WriteParams p = parse_mxfp4_quant_and_cache(k, view, slot_mapping, view.is_cpu());
  run_kernel(view, p.num_tokens, [&] { cpu::v4_write(p); },
             [&](void* s) { KVC_CUDA(cuda::v4_write(p, s)); });
}

// V4's fp8 indexer row: V3.2's row of k rounded to bf16 (V3.2's kernels).
void v4_indexer_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping) {
  NvtxRange range("kvc::v4_indexer_quant_and_cache");
  const V4IndexerWrite w = parse_v4_indexer_quant_and_cache(k, view, slot_mapping, view.is_cpu());
  run_kernel(view, w.p.num_tokens, [&] { cpu::indexer_write(w.p); },
             [&](void* s) { KVC_CUDA(cuda::indexer_write(w.p, s)); });
}

// A compressed group's pair at one compressed slot_mapping: MXFP4 indexer rows with the main
// rows in one launch, or V4's fp8 indexer rows after them (two kernels, one parse).
void v4_dsa_write(const Tensor& kv, const Tensor& mla_view, const Tensor& k_idx,
                  const Tensor& indexer_view, const Tensor& slot_mapping, Str scale_floor,
                  Str indexer, Str format, Str subnormals) {
  NvtxRange range("kvc::v4_dsa_write");
  const V4PairWrite a = parse_v4_dsa_write(kv, mla_view, k_idx, indexer_view, slot_mapping,
                                           sv(scale_floor), sv(indexer), sv(format),
                                           sv(subnormals), mla_view.is_cpu());
  if (a.fp8_indexer) {
    run_kernel(mla_view, a.mla.num_tokens,
               [&] { cpu::v4_write(a.mla); cpu::indexer_write(a.fp8.p); },
               [&](void* s) {
                 KVC_CUDA(cuda::v4_write(a.mla, s));
                 KVC_CUDA(cuda::indexer_write(a.fp8.p, s));
               });
    return;
  }
  run_kernel(mla_view, a.mla.num_tokens, [&] { cpu::v4_pair_write(a.mla, a.mxfp4); },
             [&](void* s) { KVC_CUDA(cuda::v4_pair_write(a.mla, a.mxfp4, s)); });
}

}  // namespace kvc::ops
