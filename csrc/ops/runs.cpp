// Strided runs (src offset, dst offset, length, src stride, dst stride, count) [R, 6]: `count`
// pieces of `length` bytes, piece j at src + j * src_stride -> dst + j * dst_stride. What NIXL's
// strided descriptor lists take, and a shorter form of a span list whose pieces step evenly (the
// K channels of a channel-major page, one token run across layers, ...).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <climits>
#include <queue>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "ops.h"
#include "runs.h"

namespace kvc::ops {

const int64_t* rows_arg(const Tensor& t, int64_t width, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(1) == width && t.is_contiguous() && t.is_cpu(), name,
                    " must be a contiguous CPU tensor [N, ", width, "], got shape ", t.sizes());
  return t.data_ptr<int64_t>();
}

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
// no two destination pieces overlapping. The overlap check sorts the runs' destination covers
// (first byte to last byte) and looks inside only where covers meet: two interleaved runs of
// one stride (the token runs of one channel-major page) by arithmetic, any other cluster by a
// k-way merge of its pieces by start.
void check_run_rows(const int64_t* r, int64_t n, int64_t src_bytes, int64_t dst_bytes,
                    const std::string& name) {
  const auto row = [&](int64_t i) {
    std::ostringstream o;
    o << name << "[" << i << "] = (" << r[6 * i] << ", " << r[6 * i + 1] << ", " << r[6 * i + 2]
      << ", " << r[6 * i + 3] << ", " << r[6 * i + 4] << ", " << r[6 * i + 5] << ")";
    return o.str();
  };
  struct Cover {
    int64_t begin, end, run;
  };
  std::vector<Cover> covers;
  covers.reserve(n);
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
    if (len > 0) covers.push_back({b, b + (cnt - 1) * (cnt > 1 ? sb : 0) + len, i});
  }
  std::sort(covers.begin(), covers.end(),
            [](const Cover& x, const Cover& y) { return x.begin < y.begin; });
  const auto overlap = [&](int64_t i, int64_t j) {
    TORCH_CHECK_VALUE(false, row(i), " and ", row(j), " write overlapping destination bytes");
  };
  // Two runs of one destination stride S, x starting first: piece p of x meets piece q of y iff
  // m = p - q has m S in (d - len_x, d + len_y), d = y's start - x's; lengths <= S leave two m.
  const auto check_pair = [&](int64_t x, int64_t y) {
    const int64_t* cx = r + 6 * x;
    const int64_t* cy = r + 6 * y;
    const int64_t S = cx[4], d = cy[1] - cx[1];
    const int64_t lo = d - cx[2];
    int64_t m0 = lo / S + 1;
    if (lo < 0 && lo % S != 0) m0 -= 1;  // floor division
    for (int64_t m = m0; m <= m0 + 1; ++m)
      if (m >= -(cy[5] - 1) && m <= cx[5] - 1 && m * S < d + cy[2]) overlap(x, y);
  };
  const auto check_cluster = [&](size_t first, size_t last) {  // covers[first, last)
    if (last - first == 2) {
      const int64_t x = covers[first].run, y = covers[first + 1].run;
      if (r[6 * x + 5] > 1 && r[6 * y + 5] > 1 && r[6 * x + 4] == r[6 * y + 4])
        return check_pair(x, y);
    }
    struct Next {
      int64_t begin, run, j;
      bool operator>(const Next& o) const { return begin > o.begin; }
    };
    std::priority_queue<Next, std::vector<Next>, std::greater<Next>> heap;
    for (size_t k = first; k < last; ++k) heap.push({covers[k].begin, covers[k].run, 0});
    int64_t end = INT64_MIN, end_run = -1;
    while (!heap.empty()) {
      const Next x = heap.top();
      heap.pop();
      const int64_t* c = r + 6 * x.run;
      if (x.begin < end) overlap(end_run, x.run);
      if (x.begin + c[2] > end) end = x.begin + c[2], end_run = x.run;
      if (x.j + 1 < c[5]) heap.push({x.begin + c[4], x.run, x.j + 1});
    }
  };
  for (size_t k = 0; k < covers.size();) {
    size_t last = k + 1;
    int64_t reach = covers[k].end;
    while (last < covers.size() && covers[last].begin < reach)
      reach = std::max(reach, covers[last++].end);
    if (last - k > 1) check_cluster(k, last);
    k = last;
  }
}

void check_runs(const Tensor& runs, int64_t src_bytes, int64_t dst_bytes, Str name_) {
  const std::string name(sv(name_));
  const int64_t* r = rows_arg(runs, 6, name.c_str());
  check_run_rows(r, runs.size(0), src_bytes, dst_bytes, name);
}

// Runs cut into items of about `chunk` bytes (whole pieces, or a piece longer than `chunk` cut
// into pieces of it): [num_items, 6], empty runs dropped.
Tensor run_items(const int64_t* r, int64_t n, int64_t chunk) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = r[6 * i + 2], cnt = r[6 * i + 5];
    if (len == 0) continue;
    count += len >= chunk ? cnt * ((len + chunk - 1) / chunk) : (cnt + chunk / len - 1) / (chunk / len);
  }
  Tensor items = at::empty({count, 6}, at::TensorOptions().dtype(at::kLong));
  int64_t* o = items.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = r[6 * i], b = r[6 * i + 1], len = r[6 * i + 2], sa = r[6 * i + 3],
                  sb = r[6 * i + 4], cnt = r[6 * i + 5];
    if (len == 0) continue;
    if (len >= chunk) {
      for (int64_t j = 0; j < cnt; ++j)
        for (int64_t off = 0; off < len; off += chunk, o += 6) {
          o[0] = a + j * sa + off, o[1] = b + j * sb + off, o[2] = std::min(chunk, len - off);
          o[3] = o[2], o[4] = o[2], o[5] = 1;
        }
      continue;
    }
    const int64_t per = chunk / len;
    for (int64_t j = 0; j < cnt; j += per, o += 6) {
      o[0] = a + j * sa, o[1] = b + j * sb, o[2] = len, o[3] = sa, o[4] = sb;
      o[5] = std::min(per, cnt - j);
    }
  }
  return items;
}

}  // namespace kvc::ops
