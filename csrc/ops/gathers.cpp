// The read ops: parse (gather_args.h, v4_args.h), then run. Gathers write only their outputs and
// never read outside the view, so unvalidated calls are safe; validation turns bad metadata into
// an error instead of zero rows.
#include "../core/entry.h"
#include "gather_args.h"
#include "ops.h"
#include "run.h"
#include "v4_args.h"

namespace kvc::ops {
namespace {
GatherSource by_table(const Tensor& bt, const Tensor& cu, const OptTensor& starts) {
  return {bt, cu, starts, std::nullopt};
}
GatherSource by_slots(const Tensor& slots) { return {std::nullopt, std::nullopt, std::nullopt, slots}; }

void mla(const Tensor& view, const GatherSource& src, Str kv_cache_dtype, const Tensor& out,
         bool validate, const OptTensor& scale) {
  const MlaGatherParams p = parse_gather_mla(view, src, sv(kv_cache_dtype), out, validate, scale);
  run_kernel(view, p.num_tokens, [&] { cpu::mla_gather(p); },
             [&](void* s) { KVC_CUDA(cuda::mla_gather(p, s)); });
}

void kv(const Tensor& view, const GatherSource& src, const Tensor& out, bool validate,
        const OptTensor& scale) {
  const KvGatherParams p = parse_gather_kv(view, src, out, validate, scale);
  run_kernel(view, p.num_tokens, [&] { cpu::kv_gather(p); },
             [&](void* s) { KVC_CUDA(cuda::kv_gather(p, s)); });
}

void indexer(const Tensor& view, const GatherSource& src, Str placement, const Tensor& codes,
             const Tensor& scales, bool validate) {
  const IndexerGatherParams p = parse_gather_indexer(view, src, sv(placement), codes, scales,
                                                     validate);
  run_kernel(view, p.num_tokens, [&] { cpu::indexer_gather(p); },
             [&](void* s) { KVC_CUDA(cuda::indexer_gather(p, s)); });
}

void v4(const Tensor& view, const GatherSource& src, Str format, const Tensor& out, bool validate) {
  const V4GatherParams p = parse_gather_v4(view, src, sv(format), out, validate);
  run_kernel(view, p.num_tokens, [&] { cpu::v4_gather(p); },
             [&](void* s) { KVC_CUDA(cuda::v4_gather(p, s)); });
}
}  // namespace

void gather_mla(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                const OptTensor& seq_starts, Str kv_cache_dtype, const Tensor& out, bool validate,
                const OptTensor& scale) {
  NvtxRange range("kvc::gather_mla");
  mla(view, by_table(block_table, cu_seq_lens, seq_starts), kv_cache_dtype, out, validate, scale);
}

void gather_mla_slots(const Tensor& view, const Tensor& slots, Str kv_cache_dtype,
                      const Tensor& out, bool validate, const OptTensor& scale) {
  NvtxRange range("kvc::gather_mla_slots");
  mla(view, by_slots(slots), kv_cache_dtype, out, validate, scale);
}

void gather_kv(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const OptTensor& seq_starts, const Tensor& out, bool validate,
               const OptTensor& scale) {
  NvtxRange range("kvc::gather_kv");
  kv(view, by_table(block_table, cu_seq_lens, seq_starts), out, validate, scale);
}

// Rows at explicit slots (a sparse top-k over plain rows, e.g. V4's FlashInfer-layout cache).
void gather_kv_slots(const Tensor& view, const Tensor& slots, const Tensor& out, bool validate,
                     const OptTensor& scale) {
  NvtxRange range("kvc::gather_kv_slots");
  kv(view, by_slots(slots), out, validate, scale);
}

void gather_indexer(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                    const OptTensor& seq_starts, Str placement, const Tensor& codes,
                    const Tensor& scales, bool validate) {
  NvtxRange range("kvc::gather_indexer");
  indexer(view, by_table(block_table, cu_seq_lens, seq_starts), placement, codes, scales, validate);
}

void gather_indexer_slots(const Tensor& view, const Tensor& slots, Str placement,
                          const Tensor& codes, const Tensor& scales, bool validate) {
  NvtxRange range("kvc::gather_indexer_slots");
  indexer(view, by_slots(slots), placement, codes, scales, validate);
}

void gather_v4(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const OptTensor& seq_starts, Str format, const Tensor& out, bool validate) {
  NvtxRange range("kvc::gather_v4");
  v4(view, by_table(block_table, cu_seq_lens, seq_starts), format, out, validate);
}

void gather_v4_slots(const Tensor& view, const Tensor& slots, Str format, const Tensor& out,
                     bool validate) {
  NvtxRange range("kvc::gather_v4_slots");
  v4(view, by_slots(slots), format, out, validate);
}

// A request's compressed rows then its SWA window, requests concatenated (CompressedSwaSource).
void gather_v4_window(const Tensor& c_view, const Tensor& c_block_table, const Tensor& swa_view,
                      const Tensor& swa_block_table, const Tensor& seq_lens, const Tensor& cu_out,
                      int64_t ratio, int64_t window, const Tensor& out, bool validate,
                      Str format) {
  NvtxRange range("kvc::gather_v4_window");
  const V4WindowGatherParams p = parse_gather_v4_window(
      c_view, swa_view, {c_block_table, swa_block_table, seq_lens, cu_out}, ratio, window, out,
      validate, sv(format));
  run_kernel(c_view, p.num_tokens, [&] { cpu::v4_window_gather(p); },
             [&](void* s) { KVC_CUDA(cuda::v4_window_gather(p, s)); });
}

}  // namespace kvc::ops
