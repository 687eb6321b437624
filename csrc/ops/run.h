// How an op body runs its kernel once its arguments are parsed: the CPU loop on the calling
// thread (which finishes before the op returns), or the CUDA launch on the device of `anchor`
// and its current stream (asynchronous). An op without tokens runs nothing.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "nvtx.h"

namespace kvc {

// The current stream of the tensor's device, as a cudaStream_t.
inline void* stream_of(const at::Tensor& t) {
  c10::impl::VirtualGuardImpl impl(t.device().type());
  return impl.getStream(t.device()).native_handle();
}

[[noreturn]] inline void no_cuda() {
  TORCH_CHECK(false, "kvcache_ext was built without CUDA kernels; rebuild with a CUDA torch and nvcc");
}

#if defined(KVC_WITH_CUDA)
#define KVC_CUDA(call) call
#else
#define KVC_CUDA(call) ::kvc::no_cuda()
#endif

template <class CpuFn, class CudaFn>
void run_kernel(const at::Tensor& anchor, int64_t num_tokens, CpuFn on_cpu, CudaFn on_cuda) {
  if (num_tokens == 0) return;
  if (anchor.is_cpu()) return on_cpu();
  c10::DeviceGuard guard(anchor.device());
  on_cuda(stream_of(anchor));
}

}  // namespace kvc
