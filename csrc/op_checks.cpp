// Host-side checks that read tensor values (slots, block tables, lengths, copy spans), run
// before anything is written; and the chunking of copy spans. Declared in op_args.h.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "op_args.h"

namespace kvc {
namespace {

template <class T>
T* ptr(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void check_slots_in_range(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                          const char* arg, bool allow_negative) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  for (int64_t t = 0; t < num_tokens; ++t) {
    TORCH_CHECK_INDEX(s[t] < v.num_slots() && (allow_negative || s[t] >= 0), arg, "[", t, "] = ",
                      s[t], " is outside [", allow_negative ? "-inf" : "0", ", num_blocks x block_size = ",
                      v.num_slots(), ")");
  }
}

void check_gather_source(const GatherSource& g, const PagedView& v, int64_t out_rows) {
  if (g.slots) {
    check_slots_in_range(*g.slots, g.slots->numel(), v, "slots");
    return;
  }
  const at::Tensor& bt = *g.block_table;
  const int64_t reqs = bt.size(0);
  const int32_t* cu = g.cu_seq_lens->data_ptr<int32_t>();
  const int32_t* starts = g.seq_starts ? g.seq_starts->data_ptr<int32_t>() : nullptr;
  TORCH_CHECK_VALUE(cu[0] == 0, "cu_seq_lens[0] must be 0, got ", cu[0]);
  for (int64_t r = 0; r < reqs; ++r) {
    TORCH_CHECK_VALUE(cu[r + 1] >= cu[r], "cu_seq_lens must be non-decreasing, got cu_seq_lens[",
                      r, "] = ", cu[r], " > cu_seq_lens[", r + 1, "] = ", cu[r + 1]);
  }
  TORCH_CHECK_VALUE(cu[reqs] <= out_rows, "out must have at least cu_seq_lens[-1] = ", cu[reqs],
                    " rows, got ", out_rows);
  for (int64_t r = 0; r < reqs; ++r) {
    const int64_t start = starts ? starts[r] : 0;
    TORCH_CHECK_INDEX(start >= 0, "seq_starts[", r, "] must be >= 0, got ", start);
    const int64_t end = start + cu[r + 1] - cu[r];
    check_table_range(bt, "block_table", r, start, end, v, "positions");
  }
}

void check_table_range(const at::Tensor& bt, const char* arg, int64_t r, int64_t first,
                       int64_t end, const PagedView& v, const char* what) {
  if (end <= first) return;
  const int64_t width = bt.size(1), bs = v.block_size;
  TORCH_CHECK_INDEX(end <= width * bs, arg, ": request ", r, " reads ", what, " [", first, ", ", end,
                    ") but ", arg, " holds ", width, " blocks of ", bs, " ", what);
  const int32_t* row = ptr<int32_t>(bt) + r * bt.stride(0);
  for (int64_t j = first / bs; j <= (end - 1) / bs; ++j)
    TORCH_CHECK_INDEX(row[j] >= 0 && row[j] < v.num_blocks, arg, "[", r, ", ", j, "] = ", row[j],
                      " is outside [0, num_blocks = ", v.num_blocks, ")");
}

void check_unique_slots(const at::Tensor& slots, int64_t num_tokens, const PagedView& v,
                        const char* arg) {
  TORCH_INTERNAL_ASSERT(slots.device().is_cpu());
  const int64_t* s = ptr<int64_t>(slots);
  auto refuse = [&](int64_t slot) {
    int64_t first = -1, second = -1;
    for (int64_t t = 0; t < num_tokens && second < 0; ++t)
      if (s[t] == slot) (first < 0 ? first : second) = t;
    TORCH_CHECK_VALUE(false, arg, "[", first, "] and ", arg, "[", second, "] are both slot ", slot,
                      ": two tokens of one call must not share a slot");
  };
  const int64_t num_slots = v.num_slots();
  // A bitmap of the view's slots while it is small next to the call (O(T + slots / 64)),
  // else a sorted copy of the slots (O(T log T)).
  if (num_slots <= 64 * std::max<int64_t>(num_tokens, 4096)) {
    std::vector<uint64_t> seen((num_slots + 63) / 64, 0);
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (s[t] < 0) continue;
      uint64_t& word = seen[s[t] >> 6];
      const uint64_t bit = uint64_t{1} << (s[t] & 63);
      if (word & bit) refuse(s[t]);
      word |= bit;
    }
    return;
  }
  std::vector<int64_t> sorted;
  sorted.reserve(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t)
    if (s[t] >= 0) sorted.push_back(s[t]);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end()) refuse(*dup);
}

void check_spans(const uint8_t* src, int64_t src_bytes, const uint8_t* dst, int64_t dst_bytes,
                 const int64_t* spans, int64_t n, bool same_space) {
  struct Range {
    uintptr_t begin, end;
    int64_t i;
  };
  std::vector<Range> writes, reads;
  writes.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = spans[3 * i], b = spans[3 * i + 1], len = spans[3 * i + 2];
    TORCH_CHECK_VALUE(len >= 0, "spans[", i, "] = (", a, ", ", b, ", ", len, "): length must be >= 0");
    TORCH_CHECK_INDEX(a >= 0 && b >= 0 && a <= src_bytes - len && b <= dst_bytes - len,
                      "spans[", i, "] = (", a, ", ", b, ", ", len, ") is outside src (", src_bytes,
                      " bytes) or dst (", dst_bytes, " bytes)");
    if (len == 0) continue;
    const auto at = [](const uint8_t* base, int64_t off) { return reinterpret_cast<uintptr_t>(base + off); };
    writes.push_back({at(dst, b), at(dst, b + len), i});
    if (same_space) reads.push_back({at(src, a), at(src, a + len), i});
  }
  const auto by_begin = [](const Range& x, const Range& y) { return x.begin < y.begin; };
  std::sort(writes.begin(), writes.end(), by_begin);
  for (size_t k = 1; k < writes.size(); ++k)
    TORCH_CHECK_VALUE(writes[k].begin >= writes[k - 1].end, "spans[", writes[k - 1].i, "] and spans[",
                      writes[k].i, "] write overlapping destination bytes");
  if (reads.empty()) return;
  // Does any read range meet a write range? Reads sorted by start, with the running maximum of
  // their ends: the reads starting before a write's end reach into it iff that maximum passes
  // the write's start.
  std::sort(reads.begin(), reads.end(), by_begin);
  std::vector<size_t> reach(reads.size());  // index of the read with the largest end so far
  for (size_t k = 0; k < reads.size(); ++k)
    reach[k] = (k == 0 || reads[k].end > reads[reach[k - 1]].end) ? k : reach[k - 1];
  for (const Range& w : writes) {
    const auto it = std::lower_bound(reads.begin(), reads.end(), w.end,
                                     [](const Range& r, uintptr_t e) { return r.begin < e; });
    if (it == reads.begin()) continue;
    const Range& r = reads[reach[(it - reads.begin()) - 1]];
    TORCH_CHECK_VALUE(r.end <= w.begin, "spans[", w.i, "] writes bytes that spans[", r.i,
                      "] reads (src and dst share memory): a copy's destinations must not "
                      "overlap its sources");
  }
}

// Spans cut into chunks of at most `chunk` bytes, [n, 3] int64: even parallel work on CPU,
// one thread block each on CUDA.
at::Tensor chunk_spans(const int64_t* s, int64_t n, int64_t chunk) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += (s[3 * i + 2] + chunk - 1) / chunk;
  at::Tensor chunks = at::empty({count, 3}, at::TensorOptions().dtype(at::kLong));
  int64_t* c = chunks.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t off = 0; off < s[3 * i + 2]; off += chunk) {
      c[0] = s[3 * i] + off;
      c[1] = s[3 * i + 1] + off;
      c[2] = std::min(chunk, s[3 * i + 2] - off);
      c += 3;
    }
  }
  return chunks;
}

}  // namespace kvc
