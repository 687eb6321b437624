// Strided runs (src offset, dst offset, length, src stride, dst stride, count) [R, 6]: `count`
// pieces of `length` bytes, piece j at src + j * src_stride -> dst + j * dst_stride. What NIXL's
// strided descriptor lists take, and a shorter form of a span list whose pieces step evenly (the
// K channels of a channel-major page, one token run across layers, ...).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <climits>
#include <queue>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ops.h"

namespace kvc::ops {
namespace {

const int64_t* rows_arg(const Tensor& t, int64_t width, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(1) == width && t.is_contiguous() && t.is_cpu(), name,
                    " must be a contiguous CPU tensor [N, ", width, "], got shape ", t.sizes());
  return t.data_ptr<int64_t>();
}

}  // namespace

// Greedy, in the spans' order: a piece joins the current run when it has the run's length and
// steps from the run's last piece by the run's strides (set by its second piece). Strides are
// at least the length on both sides, so a run's pieces never overlap (NIXL's rule too).
void runs_of_spans(const Tensor& spans, const Tensor& runs, const Tensor& count) {
  const int64_t* s = rows_arg(spans, 3, "spans");
  int64_t* r = const_cast<int64_t*>(rows_arg(runs, 6, "runs"));
  TORCH_CHECK_VALUE(runs.size(0) >= spans.size(0), "runs must have room for one run per span (",
                    spans.size(0), " rows), got ", runs.size(0));
  TORCH_CHECK_VALUE(count.scalar_type() == at::kLong && count.numel() == 1 && count.is_cpu(),
                    "count must be a CPU int64 tensor of one element");
  const int64_t n = spans.size(0);
  int64_t k = -1;  // the current run
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = s[3 * i], b = s[3 * i + 1], len = s[3 * i + 2];
    if (k >= 0) {
      int64_t* c = r + 6 * k;
      const int64_t last_a = c[0] + (c[5] - 1) * c[3], last_b = c[1] + (c[5] - 1) * c[4];
      if (len == c[2] && len > 0) {
        if (c[5] == 1 && a - last_a >= len && b - last_b >= len) {
          c[3] = a - last_a, c[4] = b - last_b, c[5] = 2;
          continue;
        }
        if (c[5] > 1 && a - last_a == c[3] && b - last_b == c[4]) {
          ++c[5];
          continue;
        }
      }
    }
    int64_t* c = r + 6 * ++k;
    c[0] = a, c[1] = b, c[2] = len, c[3] = len, c[4] = len, c[5] = 1;
  }
  count.data_ptr<int64_t>()[0] = k + 1;
}

// The rules of a span list, on runs, without expanding them: count >= 1, length >= 0, a
// destination stride of at least the length and a source stride >= 0 when count > 1, every
// piece inside both buffers (the first and the last: 64-bit arithmetic that cannot wrap), and
// no two destination pieces overlapping -- a k-way merge of the runs' pieces by start.
void check_runs(const Tensor& runs, int64_t src_bytes, int64_t dst_bytes, Str name_) {
  const std::string name(sv(name_));
  const int64_t* r = rows_arg(runs, 6, name.c_str());
  const int64_t n = runs.size(0);
  const auto row = [&](int64_t i) {
    std::ostringstream o;
    o << name << "[" << i << "] = (" << r[6 * i] << ", " << r[6 * i + 1] << ", " << r[6 * i + 2]
      << ", " << r[6 * i + 3] << ", " << r[6 * i + 4] << ", " << r[6 * i + 5] << ")";
    return o.str();
  };
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* c = r + 6 * i;
    const int64_t a = c[0], b = c[1], len = c[2], sa = c[3], sb = c[4], cnt = c[5];
    TORCH_CHECK_VALUE(cnt >= 1, row(i), ": count must be >= 1");
    TORCH_CHECK_VALUE(len >= 0, row(i), ": length must be >= 0");
    TORCH_CHECK_VALUE(cnt == 1 || (sb >= len && sa >= 0), row(i),
                      ": a run of several pieces needs a destination stride >= its length and a "
                      "source stride >= 0");
    for (const auto& [start, stride, size, side] :
         {std::tuple{a, sa, src_bytes, "source"}, std::tuple{b, sb, dst_bytes, "destination"}}) {
      // last piece: start + (cnt - 1) * stride <= size - len, computed without overflow
      const bool inside = start >= 0 && len <= size && start <= size - len &&
                          (cnt == 1 || stride <= (size - len - start) / (cnt - 1));
      TORCH_CHECK_INDEX(inside, row(i), ": its ", side, " pieces must lie in [0, ", size, ")");
    }
  }
  struct Next {
    int64_t begin, run, j;
    bool operator>(const Next& o) const { return begin > o.begin; }
  };
  std::priority_queue<Next, std::vector<Next>, std::greater<Next>> heap;
  for (int64_t i = 0; i < n; ++i)
    if (r[6 * i + 2] > 0) heap.push({r[6 * i + 1], i, 0});
  int64_t end = INT64_MIN, end_run = -1;
  while (!heap.empty()) {
    const Next x = heap.top();
    heap.pop();
    const int64_t* c = r + 6 * x.run;
    TORCH_CHECK_VALUE(x.begin >= end, row(end_run), " and ", row(x.run),
                      " write overlapping destination bytes");
    if (x.begin + c[2] > end) end = x.begin + c[2], end_run = x.run;
    if (x.j + 1 < c[5]) heap.push({x.begin + c[4], x.run, x.j + 1});
  }
}

}  // namespace kvc::ops
