// copy_spans (byte spans between two flat buffers, CPU <-> CPU, GPU <-> GPU, GPU <-> pinned CPU),
// copy_runs (strided runs between two buffers: a re-tiling, runs.h),
// and the checks offered alone: check_spans (the span rules, spans.h) and check_slot_mapping (a
// write's slot rules, host_checks.h, for debug runs of CUDA writes, which cannot check).
#include <ATen/core/CachingHostAllocator.h>
#include <c10/util/Exception.h>

#include "../core/entry.h"
#include "host_checks.h"
#include "ops.h"
#include "run.h"
#include "runs.h"
#include "spans.h"

namespace kvc::ops {
namespace {

const int64_t* spans_arg(const Tensor& spans, const char* name = "spans") {
  TORCH_CHECK_TYPE(spans.scalar_type() == at::kLong, name, " must be int64, got ", spans.scalar_type());
  TORCH_CHECK_VALUE(spans.dim() == 2 && spans.size(1) == 3 && spans.is_contiguous(), name,
                    " must be a contiguous CPU tensor [S, 3], got shape ", spans.sizes());
  return spans.data_ptr<int64_t>();
}

// Keeps a pinned host buffer from being reused by torch's host allocator until the work queued
// on `stream` so far has finished (the caller may drop its tensor before the copy runs).
void record_pinned_use(const Tensor& host, const Tensor& gpu) {
  c10::impl::VirtualGuardImpl impl(gpu.device().type());
  const auto& data = host.storage().data_ptr();
  at::getHostAllocator(gpu.device().type())
      ->record_event(data.get(), data.get_context(), impl.getStream(gpu.device()));
}

void check_buffers(const Tensor& src, const Tensor& dst) {
  TORCH_CHECK_TYPE(src.scalar_type() == at::kByte && dst.scalar_type() == at::kByte,
                   "src and dst must be uint8 buffers, got ", src.scalar_type(), " and ",
                   dst.scalar_type());
  TORCH_CHECK_VALUE(src.dim() == 1 && dst.dim() == 1 && src.is_contiguous() && dst.is_contiguous(),
                    "src and dst must be contiguous 1-D buffers");
}

// A GPU copy: the GPU buffer, after checking that the pair is one GPU and pinned host memory.
const Tensor& gpu_of(const Tensor& src, const Tensor& dst) {
  TORCH_CHECK_VALUE(src.is_cpu() || dst.is_cpu() || src.device() == dst.device(),
                    "src and dst on two GPUs are not supported, got ", src.device(), " and ",
                    dst.device());
  for (const Tensor* host : {&src, &dst})
    TORCH_CHECK_VALUE(!host->is_cpu() || host->is_pinned(), host == &src ? "src" : "dst",
                      " is in pageable CPU memory: a GPU copy needs pinned memory "
                      "(kvc.allocate(..., pin_memory=True))");
  return dst.is_cpu() ? src : dst;
}

}  // namespace

void copy_spans(const Tensor& src, const Tensor& dst, const Tensor& spans) {
  NvtxRange range("kvc::copy_spans");
  check_buffers(src, dst);
  const int64_t* s = spans_arg(spans);
  const int64_t n = spans.size(0);
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = dst.data_ptr<uint8_t>();
  const bool one_space = src.device() == dst.device();
  // Sources and destinations can only meet when the two buffers share bytes.
  const intptr_t f = reinterpret_cast<intptr_t>(from), t = reinterpret_cast<intptr_t>(to);
  const bool apart = t >= f + src.numel() || f >= t + dst.numel();
  kvc::check_spans(s, n, src.numel(), dst.numel(),
                   one_space && !apart ? std::optional<int64_t>(t - f) : std::nullopt);
  if (src.is_cpu() && dst.is_cpu()) {
    const Tensor chunks = chunk_spans(s, n, kCpuCopyChunkBytes);
    cpu::copy_chunks({from, to, chunks.data_ptr<int64_t>(), chunks.size(0)});
    return;
  }
  const Tensor& gpu = gpu_of(src, dst);
  c10::DeviceGuard guard(gpu.device());
  // The chunk table travels to the GPU on the copy's stream, from pinned memory.
  const Tensor chunks = chunk_spans(s, n, kCopyChunkBytes).pin_memory().to(gpu.device(), true);
  KVC_CUDA(cuda::copy_chunks({from, to, chunks.data_ptr<int64_t>(), chunks.size(0)}, stream_of(gpu)));
  for (const Tensor* host : {&src, &dst})
    if (host->is_cpu()) record_pinned_use(*host, gpu);
}

// copy_runs: the runs' pieces from src to dst, checked as check_runs checks them (before any
// byte moves), in one parallel CPU loop or one CUDA launch (GPU <-> GPU, GPU <-> pinned CPU).
void copy_runs(const Tensor& src, const Tensor& dst, const Tensor& runs) {
  NvtxRange range("kvc::copy_runs");
  check_buffers(src, dst);
  const int64_t* r = rows_arg(runs, 6, "runs");
  const int64_t n = runs.size(0);
  const uint8_t* from = src.data_ptr<uint8_t>();
  uint8_t* to = dst.data_ptr<uint8_t>();
  const intptr_t f = reinterpret_cast<intptr_t>(from), t = reinterpret_cast<intptr_t>(to);
  TORCH_CHECK_VALUE(src.device() != dst.device() || t >= f + src.numel() || f >= t + dst.numel(),
                    "src and dst share memory: copy_runs moves bytes between two buffers "
                    "(copy_spans checks destinations against sources within one)");
  check_run_rows(r, n, src.numel(), dst.numel(), "runs");
  if (src.is_cpu() && dst.is_cpu()) {
    const Tensor items = run_items(r, n, kCpuCopyChunkBytes);
    cpu::copy_run_items({from, to, items.data_ptr<int64_t>(), items.size(0)});
    return;
  }
  const Tensor& gpu = gpu_of(src, dst);
  c10::DeviceGuard guard(gpu.device());
  const Tensor items = run_items(r, n, kCopyChunkBytes).pin_memory().to(gpu.device(), true);
  KVC_CUDA(cuda::copy_run_items({from, to, items.data_ptr<int64_t>(), items.size(0)},
                                stream_of(gpu)));
  for (const Tensor* host : {&src, &dst})
    if (host->is_cpu()) record_pinned_use(*host, gpu);
}

void check_spans(const Tensor& spans, int64_t src_bytes, int64_t dst_bytes, bool same_buffer,
                 Str name) {
  const std::string arg(sv(name));
  const int64_t* s = spans_arg(spans, arg.c_str());
  kvc::check_spans(s, spans.size(0), src_bytes, dst_bytes,
                   same_buffer ? std::optional<int64_t>(0) : std::nullopt, arg.c_str());
}

void check_slot_mapping(const Tensor& slot_mapping, const Tensor& view) {
  const PagedView v = paged_view(view, "view");
  const int64_t n = slot_mapping_arg(slot_mapping);
  check_slot_values(slot_mapping.is_cpu() ? slot_mapping : slot_mapping.cpu(), n, v);
}

}  // namespace kvc::ops
