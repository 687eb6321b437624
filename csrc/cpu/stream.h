// Non-temporal row stores for the CPU writes. A write op fills whole rows at random slots of a
// cache far larger than the caches: a regular store to such a line first reads it from memory
// (write-allocate), which a streaming store skips. Rows are built in L1 first, then streamed;
// every parallel chunk fences before it returns, so the bytes are visible when the op returns.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "rows.h"  // stream_copy

namespace kvc::cpu {

// Whether stream_row streams: rows under 64 B (small K/V heads) share most of their lines with
// neighbours, where streaming gains nothing, so they are stored in place.
inline bool streams(const uint8_t* dst, int64_t bytes) {
  return (reinterpret_cast<uintptr_t>(dst) & 15) == 0 && bytes % 16 == 0 && bytes >= 64;
}

// bytes from src to dst: streaming stores when streams(dst, bytes), else a plain copy.
inline void stream_row(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  if (streams(dst, bytes)) return stream_copy(dst, src, bytes);
  std::memcpy(dst, src, bytes);
}

// Orders this thread's streaming stores before whatever follows (the op's return).
inline void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace kvc::cpu
