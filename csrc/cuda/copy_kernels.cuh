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

// copy_runs: one thread block per item (a run's pieces, about kCopyChunkBytes together); the
// block's threads walk the item's (piece, word) grid, as wide as every piece's two addresses
// and the length allow, so a 128-B piece is 8 threads' 16-B words and a warp covers 4 pieces.
template <class V>
__device__ __forceinline__ void copy_run_as(const uint8_t* src, uint8_t* dst, int64_t len,
                                            int64_t sa, int64_t sb, int64_t count, int tid) {
  constexpr int kThreads = kWarpsPerBlock * kWarp;
  const int64_t words = len / static_cast<int64_t>(sizeof(V));
  for (int64_t i = tid; i < words * count; i += kThreads) {
    const int64_t j = i / words, w = i - j * words;
    vec<V>(dst + j * sb)[w] = vec<const V>(src + j * sa)[w];
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) copy_run_items_kernel(RunCopyParams p) {
  const int64_t c = blockIdx.x;
  if (c >= p.num_items) return;
  const int64_t* item = p.items + 6 * c;
  const uint8_t* src = p.src + item[0];
  uint8_t* dst = p.dst + item[1];
  const int64_t len = item[2], sa = item[3], sb = item[4], count = item[5];
  const uintptr_t mix = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uintptr_t>(len) |
                        (count > 1 ? static_cast<uintptr_t>(sa) | static_cast<uintptr_t>(sb) : 0);
  const int tid = threadIdx.x;
  if ((mix & 15) == 0)
    copy_run_as<uint4>(src, dst, len, sa, sb, count, tid);
  else if ((mix & 7) == 0)
    copy_run_as<uint2>(src, dst, len, sa, sb, count, tid);
  else if ((mix & 3) == 0)
    copy_run_as<uint32_t>(src, dst, len, sa, sb, count, tid);
  else
    copy_run_as<uint8_t>(src, dst, len, sa, sb, count, tid);
}

template <class Launch>
void dispatch_copy_run_items(const RunCopyParams& p, const Launch& launch) {
  launch(copy_run_items_kernel, static_cast<unsigned>(p.num_items), p);
}

template <class Launch>
void dispatch_copy_chunks(const CopyParams& p, const Launch& launch) {
  launch(copy_chunks_kernel, static_cast<unsigned>(p.num_chunks), p);
}

}  // namespace
}  // namespace kvc::cuda
