// Byte spans between two buffers by one launch: the op layer cuts the spans into chunks of at
// most kCopyChunkBytes (a [n, 3] int64 table in device memory), one thread block copies a chunk,
// 16 bytes at a time where the chunk's two addresses and its length allow. A pinned host buffer
// is read or written in place (unified addressing), so GPU <-> pinned CPU is one launch too.
//
// Device code only, and its dispatch; copy.cu launches it, tests/simt/ runs it on the host.
#pragma once
#include "../core/params.h"
#include "device_util.cuh"

namespace kvc::cuda {
namespace {

template <class V>
__device__ __forceinline__ void copy_as(uint8_t* dst, const uint8_t* src, int64_t n, int tid) {
  constexpr int kThreads = kWarpsPerBlock * kWarp;
  for (int64_t i = tid; i < n / static_cast<int64_t>(sizeof(V)); i += kThreads)
    vec<V>(dst)[i] = vec<const V>(src)[i];
}

__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) copy_chunks_kernel(CopyParams p) {
  const int64_t c = blockIdx.x;
  if (c >= p.num_chunks) return;
  const int tid = threadIdx.x;
  const uint8_t* src = p.src + p.chunks[3 * c];
  uint8_t* dst = p.dst + p.chunks[3 * c + 1];
  const int64_t n = p.chunks[3 * c + 2];
  const uintptr_t mix = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uintptr_t>(n);
  if ((mix & 15) == 0)
    copy_as<uint4>(dst, src, n, tid);
  else if ((mix & 7) == 0)
    copy_as<uint2>(dst, src, n, tid);
  else if ((mix & 3) == 0)
    copy_as<uint32_t>(dst, src, n, tid);
  else
    copy_as<uint8_t>(dst, src, n, tid);
}

template <class Launch>
void dispatch_copy_chunks(const CopyParams& p, const Launch& launch) {
  launch(copy_chunks_kernel, static_cast<unsigned>(p.num_chunks), p);
}

}  // namespace
}  // namespace kvc::cuda
