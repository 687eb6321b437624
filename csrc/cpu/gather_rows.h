// The loop the CPU row gathers share: output row t is read from the row at the slot locate(t)
// finds, zeroed for a token without a valid slot (slot < 0), left alone past the last request's
// tokens (kNoRow). Rows at explicit slots are prefetched by locate (gather.cpp).
#pragma once
#include <cstring>

#include "../core/paged_view.h"
#include "float_env.h"
#include "prefetch.h"

namespace kvc::cpu {

struct Located {
  int64_t slot;
  const PagedView* view;  // the view the slot belongs to
};

// Explicit slots (a sparse top-k) send each token to a random row: asking for the row kAhead
// tokens on overlaps those misses with the current token's decoding. Rows read through a
// block table are consecutive within a block, which the hardware prefetcher follows.
constexpr int64_t kAhead = 8;

// The slot token t + kAhead reads when it is an explicit valid one (its row is asked for now),
// else -1.
inline int64_t slot_ahead(const TokenSource& src, const PagedView& v, int64_t t, int64_t end) {
  if (src.slots == nullptr || t + kAhead >= end) return -1;
  const int64_t slot = src.slots[t + kAhead];
  return v.valid_slot(slot) ? slot : -1;
}

// Prefetches the first `bytes` of the row token t + kAhead reads (explicit slots only).
[[gnu::always_inline]] inline void prefetch_slot_row(const TokenSource& src, const PagedView& v, int64_t t, int64_t end,
                              int64_t bytes) {
  const int64_t slot = slot_ahead(src, v, t, end);
  if (slot >= 0) prefetch_lines(v.row(slot), bytes);
}

// The locate of a gather reading one view through a TokenSource, prefetching its rows.
inline auto token_locator(const TokenSource& src, const PagedView& v, int64_t bytes) {
  return [&src, &v, bytes](int64_t t, int64_t end) {
    prefetch_slot_row(src, v, t, end, bytes);
    return Located{src.slot_of(t, v), &v};
  };
}

// locate(t, end) -> Located; read(view, slot, out) fills one output row.
template <class Locate, class Read>
void gather_rows(int64_t num_tokens, uint8_t* out, int64_t out_stride, int64_t out_bytes,
                 const Locate& locate, const Read& read) {
  parallel_rows(0, num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      uint8_t* o = out + t * out_stride;
      const Located at = locate(t, end);
      if (at.slot == kNoRow) continue;
      if (at.slot < 0) {
        std::memset(o, 0, out_bytes);
        continue;
      }
      read(*at.view, at.slot, o);
    }
  });
}

}  // namespace kvc::cpu
