#include "spans.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace kvc {

void check_spans(const int64_t* spans, int64_t n, int64_t src_bytes, int64_t dst_bytes,
                 std::optional<int64_t> dst_minus_src, const char* name) {
  struct Range {
    int64_t begin, end, i;  // in src's address frame when the buffers share one
  };
  std::vector<Range> writes, reads;
  writes.reserve(n);
  const int64_t shift = dst_minus_src.value_or(0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = spans[3 * i], b = spans[3 * i + 1], len = spans[3 * i + 2];
    TORCH_CHECK_VALUE(len >= 0, name, "[", i, "] = (", a, ", ", b, ", ", len,
                      "): length must be >= 0");
    TORCH_CHECK_INDEX(a >= 0 && a <= src_bytes - len, name, "[", i, "] = (", a, ", ", b, ", ", len,
                      "): source range must lie in [0, ", src_bytes, ")");
    TORCH_CHECK_INDEX(b >= 0 && b <= dst_bytes - len, name, "[", i, "] = (", a, ", ", b, ", ", len,
                      "): destination range must lie in [0, ", dst_bytes, ")");
    if (len == 0) continue;
    writes.push_back({b + shift, b + shift + len, i});
    if (dst_minus_src) reads.push_back({a, a + len, i});
  }
  const auto by_begin = [](const Range& x, const Range& y) { return x.begin < y.begin; };
  std::sort(writes.begin(), writes.end(), by_begin);
  for (size_t k = 1; k < writes.size(); ++k)
    TORCH_CHECK_VALUE(writes[k].begin >= writes[k - 1].end, name, "[", writes[k - 1].i, "] and ",
                      name, "[", writes[k].i, "] write overlapping destination bytes");
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
                                     [](const Range& r, int64_t e) { return r.begin < e; });
    if (it == reads.begin()) continue;
    const Range& r = reads[reach[(it - reads.begin()) - 1]];
    TORCH_CHECK_VALUE(r.end <= w.begin, name, "[", w.i, "] writes bytes that ", name, "[", r.i,
                      "] reads (src and dst share memory): a copy's destinations must not "
                      "overlap its sources");
  }
}

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
