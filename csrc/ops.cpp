// Op implementations: validate, build kernel parameters, run on the tensors' device.
// One function per op serves CPU and CUDA; CPU calls are fully checked before the first write.
// The fake (meta) implementations, which must handle symbolic shapes, live in kvcache_ext/fake.py.
#include <ATen/Parallel.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "nvtx.h"
#include "op_args.h"
#include "v4_args.h"

namespace kvc {
namespace {

using at::Tensor;
using S = c10::string_view;
using OS = std::optional<c10::string_view>;

std::string_view sv(S s) { return {s.data(), s.size()}; }
OptStr osv(const OS& s) { return s ? OptStr(sv(*s)) : std::nullopt; }

// The current stream of the tensor's device, as a cudaStream_t.
void* stream_of(const Tensor& t) {
  c10::impl::VirtualGuardImpl impl(t.device().type());
  return impl.getStream(t.device()).native_handle();
}

[[noreturn]] void no_cuda() {
  TORCH_CHECK(false, "kvcache_ext was built without CUDA kernels; rebuild with a CUDA torch and nvcc");
}

#if defined(KVC_WITH_CUDA)
#define KVC_CUDA(call) call
#else
#define KVC_CUDA(call) no_cuda()
#endif

// Writes: CPU checks every slot before the first byte is written; CUDA never synchronises,
// its kernels skip slots outside the view.
template <class Params, class CpuFn, class CudaFn>
void run_write(const Tensor& view, const Tensor& slot_mapping, const Params& p, CpuFn on_cpu_fn,
               CudaFn on_cuda_fn) {
  if (p.num_tokens == 0) return;
  if (view.is_cpu()) {
    check_slots_in_range(slot_mapping, p.num_tokens, p.view);
    check_unique_slots(slot_mapping, p.num_tokens, p.view);
    return on_cpu_fn(p);
  }
  c10::DeviceGuard guard(view.device());
  on_cuda_fn(p, stream_of(view));
}

void reshape_and_cache(const Tensor& key, const Tensor& view, const Tensor& slot_mapping,
                       S kv_cache_dtype, const std::optional<Tensor>& scale) {
  NvtxRange range("kvc::reshape_and_cache");
  const PlainWriteParams p = plain_write_args(key, view, slot_mapping, sv(kv_cache_dtype), scale);
  check_apart({named(view, "view")},
              {named(key, "key"), named(slot_mapping, "slot_mapping"), named(scale, "scale")});
  run_write(view, slot_mapping, p, cpu::plain_write,
            [](const PlainWriteParams& p, void* s) { KVC_CUDA(cuda::plain_write(p, s)); });
}

// K and V rows of one layer by one launch (vLLM's reshape_and_cache_flash).
void reshape_and_cache_kv(const Tensor& key, const Tensor& value, const Tensor& k_view,
                          const Tensor& v_view, const Tensor& slot_mapping, S kv_cache_dtype,
                          const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale) {
  NvtxRange range("kvc::reshape_and_cache_kv");
  const PlainWriteParams k = plain_write_args(key, k_view, slot_mapping, sv(kv_cache_dtype), k_scale,
                                              "key", "k_view", "k_scale");
  const PlainWriteParams v = plain_write_args(value, v_view, slot_mapping, sv(kv_cache_dtype),
                                              v_scale, "value", "v_view", "v_scale");
  TORCH_CHECK_VALUE(k.view.num_slots() == v.view.num_slots() && k_view.device() == v_view.device(),
                    "k_view and v_view must share one block table (same num_blocks x block_size) "
                    "and device, got ", k.view.num_slots(), " and ", v.view.num_slots(), " slots");
  check_apart({named(k_view, "k_view"), named(v_view, "v_view")},
              {named(key, "key"), named(value, "value"), named(slot_mapping, "slot_mapping"),
               named(k_scale, "k_scale"), named(v_scale, "v_scale")});
  run_write(k_view, slot_mapping, k,
            [&](const PlainWriteParams& p) { cpu::plain_write(p); cpu::plain_write(v); },
            [&](const PlainWriteParams& p, void* s) { KVC_CUDA(cuda::kv_write(p, v, s)); });
}

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, const Tensor& view,
                          const Tensor& slot_mapping, S kv_cache_dtype,
                          const std::optional<Tensor>& scale, OS tile_scale) {
  NvtxRange range("kvc::concat_and_cache_mla");
  const MlaWriteParams p = mla_write_args(kv_c, k_pe, view, slot_mapping, sv(kv_cache_dtype), scale,
                                          osv(tile_scale));
  check_apart({named(view, "view")}, {named(kv_c, "kv_c"), named(k_pe, "k_pe"),
                                      named(slot_mapping, "slot_mapping"), named(scale, "scale")});
  run_write(view, slot_mapping, p, cpu::mla_write, [](const MlaWriteParams& p, void* s) { KVC_CUDA(cuda::mla_write(p, s)); });
}

void indexer_k_quant_and_cache(const Tensor& k, const Tensor& view, const Tensor& slot_mapping,
                               OS scale_fmt, S placement) {
  NvtxRange range("kvc::indexer_k_quant_and_cache");
  const IndexerWriteParams p = indexer_write_args(k, view, slot_mapping, osv(scale_fmt), sv(placement));
  check_apart({named(view, "view")}, {named(k, "k"), named(slot_mapping, "slot_mapping")});
  run_write(view, slot_mapping, p, cpu::indexer_write,
            [](const IndexerWriteParams& p, void* s) { KVC_CUDA(cuda::indexer_write(p, s)); });
}

void dsa_write(const Tensor& kv_c, const Tensor& k_pe, const Tensor& mla_view, const Tensor& k_idx,
               const Tensor& indexer_view, const Tensor& slot_mapping, S kv_cache_dtype,
               OS scale_fmt, S placement, OS tile_scale) {
  NvtxRange range("kvc::dsa_write");
  TORCH_CHECK_VALUE(kv_cache_dtype != "fp8",
                    "dsa_write writes fp8_ds_mla or auto MLA rows; for per-tensor fp8 rows call "
                    "concat_and_cache_mla and indexer_k_quant_and_cache");
  const MlaWriteParams mla = mla_write_args(kv_c, k_pe, mla_view, slot_mapping,
                                            sv(kv_cache_dtype), std::nullopt, osv(tile_scale),
                                            "mla_view");
  const IndexerWriteParams idx = indexer_write_args(k_idx, indexer_view, slot_mapping,
                                                    osv(scale_fmt), sv(placement), "k_idx",
                                                    "indexer_view");
  TORCH_CHECK_TYPE(mla.format == MlaFormat::kAuto || k_idx.scalar_type() == kv_c.scalar_type(),
                   "k_idx must have the dtype of kv_c (", kv_c.scalar_type(), "), got ",
                   k_idx.scalar_type());
  TORCH_CHECK_VALUE(mla.view.num_slots() == idx.view.num_slots(),
                    "mla_view and indexer_view must share one block table (same num_blocks x "
                    "block_size), got ", mla.view.num_slots(), " and ", idx.view.num_slots(), " slots");
  check_apart({named(mla_view, "mla_view"), named(indexer_view, "indexer_view")},
              {named(kv_c, "kv_c"), named(k_pe, "k_pe"), named(k_idx, "k_idx"),
               named(slot_mapping, "slot_mapping")});
  run_write(mla_view, slot_mapping, mla,
            [&](const MlaWriteParams& p) { cpu::mla_write(p); cpu::indexer_write(idx); },
            [&](const MlaWriteParams& p, void* s) { KVC_CUDA(cuda::dsa_write(p, idx, s)); });
}

// CPU copies of the small metadata tensors a gather reads, for host-side validation.
GatherSource on_cpu(const GatherSource& g) {
  auto cpu = [](const std::optional<Tensor>& t) -> std::optional<Tensor> {
    return t ? std::optional<Tensor>(t->cpu()) : std::nullopt;
  };
  return {cpu(g.block_table), cpu(g.cu_seq_lens), cpu(g.seq_starts), cpu(g.slots)};
}

// A gather's outputs apart from what it reads (check_apart).
void check_outputs_apart(std::initializer_list<NamedTensor> outs, const Tensor& view,
                         const GatherSource& src, const std::optional<Tensor>& scale = std::nullopt) {
  for (const NamedTensor& o : outs) check_no_self_overlap(o);
  check_apart(outs, {named(view, "view"), named(src.block_table, "block_table"),
                     named(src.cu_seq_lens, "cu_seq_lens"), named(src.seq_starts, "seq_starts"),
                     named(src.slots, "slots"), named(scale, "scale")});
}

// Gathers write only their outputs and never read outside the view, so unvalidated calls are
// safe; validation turns bad metadata into an error instead of zero rows.
template <class Params, class CpuFn, class CudaFn>
void run_gather(const Tensor& view, const GatherSource& src, const Params& p, bool validate,
                CpuFn on_cpu_fn, CudaFn on_cuda_fn) {
  if (validate) check_gather_source(view.is_cpu() ? src : on_cpu(src), p.view, p.num_tokens);
  if (p.num_tokens == 0) return;
  if (view.is_cpu()) return on_cpu_fn(p);
  c10::DeviceGuard guard(view.device());
  on_cuda_fn(p, stream_of(view));
}

void run_mla_gather(const Tensor& view, const GatherSource& src, S kv_cache_dtype,
                    const Tensor& out, bool validate, const std::optional<Tensor>& scale) {
  const MlaGatherParams p = mla_gather_args(view, src, sv(kv_cache_dtype), out, scale);
  check_outputs_apart({named(out, "out")}, view, src, scale);
  run_gather(view, src, p, validate, cpu::mla_gather, [](const MlaGatherParams& p, void* s) { KVC_CUDA(cuda::mla_gather(p, s)); });
}

void gather_mla(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                const std::optional<Tensor>& seq_starts, S kv_cache_dtype, const Tensor& out,
                bool validate, const std::optional<Tensor>& scale) {
  NvtxRange range("kvc::gather_mla");
  run_mla_gather(view, {block_table, cu_seq_lens, seq_starts, std::nullopt}, kv_cache_dtype, out,
                 validate, scale);
}

void gather_mla_slots(const Tensor& view, const Tensor& slots, S kv_cache_dtype, const Tensor& out,
                      bool validate, const std::optional<Tensor>& scale) {
  NvtxRange range("kvc::gather_mla_slots");
  run_mla_gather(view, {std::nullopt, std::nullopt, std::nullopt, slots}, kv_cache_dtype, out,
                 validate, scale);
}

void gather_kv(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const std::optional<Tensor>& seq_starts, const Tensor& out, bool validate,
               const std::optional<Tensor>& scale) {
  NvtxRange range("kvc::gather_kv");
  const GatherSource src{block_table, cu_seq_lens, seq_starts, std::nullopt};
  const KvGatherParams p = kv_gather_args(view, src, out, scale);
  check_outputs_apart({named(out, "out")}, view, src, scale);
  run_gather(view, src, p, validate, cpu::kv_gather,
             [](const KvGatherParams& p, void* s) { KVC_CUDA(cuda::kv_gather(p, s)); });
}

// Rows at explicit slots (a sparse top-k over plain rows, e.g. V4's FlashInfer-layout cache).
void gather_kv_slots(const Tensor& view, const Tensor& slots, const Tensor& out, bool validate,
                     const std::optional<Tensor>& scale) {
  NvtxRange range("kvc::gather_kv_slots");
  const GatherSource src{std::nullopt, std::nullopt, std::nullopt, slots};
  const KvGatherParams p = kv_gather_args(view, src, out, scale);
  check_outputs_apart({named(out, "out")}, view, src, scale);
  run_gather(view, src, p, validate, cpu::kv_gather,
             [](const KvGatherParams& p, void* s) { KVC_CUDA(cuda::kv_gather(p, s)); });
}

void run_indexer_gather(const Tensor& view, const GatherSource& src, S placement,
                        const Tensor& codes, const Tensor& scales, bool validate) {
  const IndexerGatherParams p = indexer_gather_args(view, src, sv(placement), codes, scales);
  check_outputs_apart({named(codes, "codes"), named(scales, "scales")}, view, src);
  check_apart({named(codes, "codes")}, {named(scales, "scales")});
  run_gather(view, src, p, validate, cpu::indexer_gather,
             [](const IndexerGatherParams& p, void* s) { KVC_CUDA(cuda::indexer_gather(p, s)); });
}

void gather_indexer(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
                    const std::optional<Tensor>& seq_starts, S placement, const Tensor& codes,
                    const Tensor& scales, bool validate) {
  NvtxRange range("kvc::gather_indexer");
  run_indexer_gather(view, {block_table, cu_seq_lens, seq_starts, std::nullopt}, placement, codes,
                     scales, validate);
}

void gather_indexer_slots(const Tensor& view, const Tensor& slots, S placement,
                          const Tensor& codes, const Tensor& scales, bool validate) {
  NvtxRange range("kvc::gather_indexer_slots");
  run_indexer_gather(view, {std::nullopt, std::nullopt, std::nullopt, slots}, placement, codes,
                     scales, validate);
}

// DeepSeek-V4 rows (v4_rows.h): quantizing writes and dequantizing reads.
void v4_quant_and_cache(const Tensor& x, const Tensor& view, const Tensor& slot_mapping, S format,
                        S scale_floor) {
  NvtxRange range("kvc::v4_quant_and_cache");
  const V4WriteParams p = v4_write_args(x, view, slot_mapping, parse_v4_format(sv(format)), sv(scale_floor));
  check_apart({named(view, "view")}, {named(x, "x"), named(slot_mapping, "slot_mapping")});
  run_write(view, slot_mapping, p, cpu::v4_write, [](const V4WriteParams& p, void* s) { KVC_CUDA(cuda::v4_write(p, s)); });
}

// DeepSeek-V4's compressed pair (main KV + MXFP4 or fp8 indexer) at one compressed
// slot_mapping; both rows' arguments are checked before either is written.
void v4_dsa_write(const Tensor& kv, const Tensor& mla_view, const Tensor& k_idx,
                  const Tensor& indexer_view, const Tensor& slot_mapping, S scale_floor, S indexer) {
  NvtxRange range("kvc::v4_dsa_write");
  TORCH_CHECK_VALUE(indexer == "mxfp4" || indexer == "fp8",
                    "indexer must be \"mxfp4\" or \"fp8\", got \"", indexer, "\"");
  const auto check = [&] {
    check_apart({named(mla_view, "mla_view"), named(indexer_view, "indexer_view")},
                {named(kv, "kv"), named(k_idx, "k_idx"), named(slot_mapping, "slot_mapping")});
  };
  if (indexer == "fp8") {  // two kernels (the 132-B row is V3.2's), one set of checks
    const V4Fp8PairArgs a = v4_fp8_pair_write_args(kv, mla_view, k_idx, indexer_view, slot_mapping,
                                                   sv(scale_floor));
    check();
    run_write(mla_view, slot_mapping, a.mla,
              [&](const V4WriteParams& p) { cpu::v4_write(p); cpu::indexer_write(a.idx); },
              [&](const V4WriteParams& p, void* s) {
                KVC_CUDA(cuda::v4_write(p, s));
                KVC_CUDA(cuda::indexer_write(a.idx, s));
              });
    return;
  }
  const V4PairArgs a = v4_pair_write_args(kv, mla_view, k_idx, indexer_view, slot_mapping,
                                          sv(scale_floor));
  check();
  run_write(mla_view, slot_mapping, a.mla,
            [&](const V4WriteParams& p) { cpu::v4_pair_write(p, a.idx); },
            [&](const V4WriteParams& p, void* s) { KVC_CUDA(cuda::v4_pair_write(p, a.idx, s)); });
}

void run_v4_gather(const Tensor& view, const GatherSource& src, S format, const Tensor& out,
                   bool validate) {
  const V4GatherParams p = v4_gather_args(view, src, parse_v4_format(sv(format)), out);
  check_outputs_apart({named(out, "out")}, view, src);
  run_gather(view, src, p, validate, cpu::v4_gather, [](const V4GatherParams& p, void* s) { KVC_CUDA(cuda::v4_gather(p, s)); });
}

void gather_v4(const Tensor& view, const Tensor& block_table, const Tensor& cu_seq_lens,
               const std::optional<Tensor>& seq_starts, S format, const Tensor& out, bool validate) {
  NvtxRange range("kvc::gather_v4");
  run_v4_gather(view, {block_table, cu_seq_lens, seq_starts, std::nullopt}, format, out, validate);
}

void gather_v4_slots(const Tensor& view, const Tensor& slots, S format, const Tensor& out,
                     bool validate) {
  NvtxRange range("kvc::gather_v4_slots");
  run_v4_gather(view, {std::nullopt, std::nullopt, std::nullopt, slots}, format, out, validate);
}

// A request's compressed rows then its SWA window, requests concatenated (CompressedSwaSource).
void gather_v4_window(const Tensor& c_view, const Tensor& c_block_table, const Tensor& swa_view,
                      const Tensor& swa_block_table, const Tensor& seq_lens, const Tensor& cu_out,
                      int64_t ratio, int64_t window, const Tensor& out, bool validate) {
  NvtxRange range("kvc::gather_v4_window");
  const WindowSource src{c_block_table, swa_block_table, seq_lens, cu_out};
  const V4WindowGatherParams p = v4_window_gather_args(c_view, swa_view, src, ratio, window, out);
  check_no_self_overlap(named(out, "out"));
  check_apart({named(out, "out")}, {named(c_view, "c_view"), named(swa_view, "swa_view"),
                                    named(c_block_table, "c_block_table"),
                                    named(swa_block_table, "swa_block_table"),
                                    named(seq_lens, "seq_lens"), named(cu_out, "cu_out")});
  if (validate) {
    check_window_source(c_view.is_cpu() ? src
                                        : WindowSource{c_block_table.cpu(), swa_block_table.cpu(),
                                                       seq_lens.cpu(), cu_out.cpu()},
                        p);
  }
  if (p.num_tokens == 0) return;
  if (c_view.is_cpu()) return cpu::v4_window_gather(p);
  c10::DeviceGuard guard(c_view.device());
  KVC_CUDA(cuda::v4_window_gather(p, stream_of(c_view)));
}

// Keeps a pinned host buffer from being reused by torch's host allocator until the work queued
// on `stream` so far has finished (the caller may drop its tensor before the copy runs).
void record_pinned_use(const Tensor& host, const Tensor& gpu) {
  c10::impl::VirtualGuardImpl impl(gpu.device().type());
  const auto& data = host.storage().data_ptr();
  at::getHostAllocator(gpu.device().type())
      ->record_event(data.get(), data.get_context(), impl.getStream(gpu.device()));
}

void copy_spans(const Tensor& src, const Tensor& dst, const Tensor& spans) {
  NvtxRange range("kvc::copy_spans");
  TORCH_CHECK_TYPE(src.scalar_type() == at::kByte && dst.scalar_type() == at::kByte,
                   "src and dst must be uint8 buffers, got ", src.scalar_type(), " and ",
                   dst.scalar_type());
  TORCH_CHECK_VALUE(src.dim() == 1 && dst.dim() == 1 && src.is_contiguous() && dst.is_contiguous(),
                    "src and dst must be contiguous 1-D buffers");
  TORCH_CHECK_TYPE(spans.scalar_type() == at::kLong, "spans must be int64, got ", spans.scalar_type());
  TORCH_CHECK_VALUE(spans.device().is_cpu() && spans.dim() == 2 && spans.size(1) == 3 &&
                        spans.is_contiguous(),
                    "spans must be a contiguous CPU tensor [S, 3], got shape ", spans.sizes(),
                    " on ", spans.device());
  const int64_t n = spans.size(0);
  const int64_t* s = spans.data_ptr<int64_t>();
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = dst.data_ptr<uint8_t>();
  check_spans(from, src.numel(), to, dst.numel(), s, n, src.device() == dst.device());
  if (src.is_cpu() && dst.is_cpu()) {
    const Tensor chunks = chunk_spans(s, n, kCpuCopyChunkBytes);
    const int64_t* c = chunks.data_ptr<int64_t>();
    const int64_t count = chunks.size(0);
    // Threads get equal bytes, not equal chunk counts: spans sorted by address put all of one
    // spec's (large) pages before another's (small) ones.
    const int64_t parts = std::min<int64_t>(4 * at::get_num_threads(), count);
    int64_t total = 0;
    for (int64_t i = 0; i < count; ++i) total += c[3 * i + 2];
    std::vector<int64_t> first(parts + 1, count);
    for (int64_t i = 0, part = 0, done = 0; i < count && part < parts; ++i) {
      while (part < parts && done >= part * (total / std::max<int64_t>(parts, 1))) first[part++] = i;
      done += c[3 * i + 2];
    }
    first[0] = 0;
    at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = first[begin]; i < first[end]; ++i)
        std::memcpy(to + c[3 * i + 1], from + c[3 * i], c[3 * i + 2]);
    });
    return;
  }
  const Tensor& gpu = dst.is_cpu() ? src : dst;
  TORCH_CHECK_VALUE(src.is_cpu() || dst.is_cpu() || src.device() == dst.device(),
                    "src and dst on two GPUs are not supported, got ", src.device(), " and ", dst.device());
  for (const Tensor* host : {&src, &dst})
    TORCH_CHECK_VALUE(!host->is_cpu() || host->is_pinned(), host == &src ? "src" : "dst",
                      " is in pageable CPU memory: a GPU copy needs pinned memory "
                      "(kvc.allocate(..., pin_memory=True))");
  c10::DeviceGuard guard(gpu.device());
  // The chunk table travels to the GPU on the copy's stream, from pinned memory.
  const Tensor chunks = chunk_spans(s, n, kCopyChunkBytes).pin_memory().to(gpu.device(), true);
  KVC_CUDA(cuda::copy_chunks({from, to, chunks.data_ptr<int64_t>(), chunks.size(0)}, stream_of(gpu)));
  for (const Tensor* host : {&src, &dst})
    if (host->is_cpu()) record_pinned_use(*host, gpu);
}

}  // namespace

#define KVC_REGISTER_ALL(m)                                  \
  m.impl("reshape_and_cache", &reshape_and_cache);           \
  m.impl("reshape_and_cache_kv", &reshape_and_cache_kv);     \
  m.impl("gather_kv", &gather_kv);                           \
  m.impl("gather_kv_slots", &gather_kv_slots);               \
  m.impl("concat_and_cache_mla", &concat_and_cache_mla);     \
  m.impl("indexer_k_quant_and_cache", &indexer_k_quant_and_cache); \
  m.impl("dsa_write", &dsa_write);                           \
  m.impl("gather_mla", &gather_mla);                         \
  m.impl("gather_mla_slots", &gather_mla_slots);             \
  m.impl("gather_indexer", &gather_indexer);                 \
  m.impl("gather_indexer_slots", &gather_indexer_slots);     \
  m.impl("v4_quant_and_cache", &v4_quant_and_cache);       \
  m.impl("v4_dsa_write", &v4_dsa_write);                   \
  m.impl("gather_v4", &gather_v4);                         \
  m.impl("gather_v4_slots", &gather_v4_slots);             \
  m.impl("gather_v4_window", &gather_v4_window);           \
  m.impl("copy_spans", &copy_spans)

TORCH_LIBRARY_IMPL(kvcache_ext, CPU, m) { KVC_REGISTER_ALL(m); }
#if defined(KVC_WITH_CUDA)
TORCH_LIBRARY_IMPL(kvcache_ext, CUDA, m) { KVC_REGISTER_ALL(m); }
#endif

}  // namespace kvc
