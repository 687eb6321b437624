// The CPU loop of copy_spans: memcpy of every chunk (core/params.h CopyParams), in parallel.
#include <ATen/Parallel.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "../core/entry.h"

namespace kvc::cpu {

void copy_chunks(const CopyParams& p) {
  const int64_t* c = p.chunks;
  const int64_t count = p.num_chunks;
  if (count == 0) return;
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
      std::memcpy(p.dst + c[3 * i + 1], p.src + c[3 * i], c[3 * i + 2]);
  });
}

}  // namespace kvc::cpu

namespace kvc::cpu {

namespace {

// A regroup larger than this streams whole 64-B lines past the cache (non-temporal stores, as
// glibc's memcpy does for large copies): a destination that does not fit in cache would
// otherwise be read in before it is overwritten, a third pass over the bytes.
constexpr int64_t kStreamBytes = 8 << 20;

#if defined(__x86_64__) || defined(_M_X64)
// count pieces of len bytes (len a multiple of 64, every destination piece 64-B aligned) with
// SSE2 non-temporal stores; the caller fences.
void stream_pieces(const uint8_t* from, uint8_t* to, int64_t len, int64_t sa, int64_t sb,
                   int64_t count) {
  for (int64_t j = 0; j < count; ++j, from += sa, to += sb)
    for (int64_t k = 0; k < len; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(to + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + k)));
}
// the streamed lines are visible (to other threads, and after the op returns) once it is run
void stream_fence() { _mm_sfence(); }
constexpr bool kCanStream = true;
#else
void stream_pieces(const uint8_t*, uint8_t*, int64_t, int64_t, int64_t, int64_t) {}
void stream_fence() {}
constexpr bool kCanStream = false;
#endif

// count pieces of len bytes (a multiple of W) as W-byte moves the compiler inlines: the regroup
// of a channel-major page is 64..512-B pieces, where a call of memcpy per piece costs as much
// as its bytes.
template <int W>
void copy_pieces(const uint8_t* from, uint8_t* to, int64_t len, int64_t sa, int64_t sb,
                 int64_t count) {
  for (int64_t j = 0; j < count; ++j, from += sa, to += sb)
    for (int64_t k = 0; k < len; k += W) std::memcpy(to + k, from + k, W);
}

}  // namespace

// The CPU loop of copy_runs: every item's pieces in order, items in parallel (the op layer cut
// them to about kCpuCopyChunkBytes each, so equal items are equal work).
void copy_run_items(const RunCopyParams& p) {
  const int64_t* r = p.items;
  int64_t total = 0;
  for (int64_t i = 0; i < p.num_items; ++i) total += r[6 * i + 2] * r[6 * i + 5];
  const bool stream = kCanStream && total >= kStreamBytes;
  at::parallel_for(0, p.num_items, 4, [&](int64_t begin, int64_t end) {
    bool streamed = false;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t* c = r + 6 * i;
      const uint8_t* from = p.src + c[0];
      uint8_t* to = p.dst + c[1];
      const int64_t len = c[2], sa = c[3], sb = c[4], count = c[5];
      if (stream && len % 64 == 0 && sb % 64 == 0 && reinterpret_cast<uintptr_t>(to) % 64 == 0) {
        stream_pieces(from, to, len, sa, sb, count);
        streamed = true;
      } else if (count > 1 && len <= 1024 && len % 32 == 0)
        copy_pieces<32>(from, to, len, sa, sb, count);
      else if (count > 1 && len <= 1024 && len % 8 == 0)
        copy_pieces<8>(from, to, len, sa, sb, count);
      else
        for (int64_t j = 0; j < count; ++j, from += sa, to += sb) std::memcpy(to, from, len);
    }
    if (streamed) stream_fence();
  });
}

}  // namespace kvc::cpu
