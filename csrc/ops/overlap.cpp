// Memory-overlap checks of op arguments (overlap.h).
#include "overlap.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cstdlib>
#include <utility>
#include <vector>

namespace kvc {

namespace {
struct ByteSpan {
  intptr_t first, last;  // [first, last)
};

ByteSpan byte_span(const at::Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<intptr_t>(t.data_ptr());
  const int64_t es = static_cast<int64_t>(t.element_size());
  return {base + lo * es, base + (hi + 1) * es};
}

bool spans_meet(const ByteSpan& a, const ByteSpan& b) { return a.first < b.last && b.first < a.last; }

// A tensor's bytes as a lattice: base + sum i_d stride_d + [0, es), 0 <= i_d < n_d, strides
// in bytes made positive (base moved to the lowest element), dimensions of size 1 dropped,
// largest stride first.
struct Lattice {
  intptr_t base;
  int64_t es;
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, n), stride descending
  c10::SmallVector<int64_t, 6> reach;  // reach[k]: bytes the dimensions after k cover, es included
};

Lattice lattice(const at::Tensor& t) {
  Lattice l{reinterpret_cast<intptr_t>(t.data_ptr()), static_cast<int64_t>(t.element_size()), {}, {}};
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) <= 1) continue;
    const int64_t s = t.stride(d) * l.es;
    if (s < 0) l.base += (t.size(d) - 1) * s;
    l.dims.emplace_back(std::abs(s), t.size(d));
  }
  std::sort(l.dims.begin(), l.dims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  l.reach.assign(l.dims.size(), 0);
  int64_t inner = l.es;
  for (size_t k = l.dims.size(); k-- > 0;) {
    l.reach[k] = inner;
    inner += (l.dims[k].second - 1) * l.dims[k].first;
  }
  return l;
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Does the lattice (without self-overlap: each stride at least the reach inside it) have a byte
// in [lo, hi), offsets from its base? At each dimension only the indices whose block of inner
// bytes meets the interval can (at most two when the interval is shorter than the stride).
bool lattice_meets(const Lattice& l, size_t k, int64_t lo, int64_t hi) {
  if (hi <= lo) return false;
  if (k == l.dims.size()) return lo < l.es && hi > 0;
  const auto [s, n] = l.dims[k];
  const int64_t first = std::max<int64_t>(0, floor_div(lo - l.reach[k], s) + 1);
  const int64_t last = std::min<int64_t>(n - 1, floor_div(hi - 1, s));
  for (int64_t i = first; i <= last; ++i)
    if (lattice_meets(l, k + 1, lo - i * s, hi - i * s)) return true;
  return false;
}

// Exactly whether x and y share a byte: every run of x's contiguous innermost bytes is looked
// up in y. Used when no structure decides it; costs one lookup per run of x (the smaller).
bool lattices_meet(const Lattice& x, const Lattice& y) {
  size_t outer = x.dims.size();
  int64_t run = x.es;  // bytes of one run: the innermost dimensions that are contiguous
  while (outer > 0 && x.dims[outer - 1].first == run) {
    run *= x.dims[outer - 1].second;
    --outer;
  }
  std::vector<int64_t> idx(outer, 0);
  const intptr_t shift = x.base - y.base;
  for (;;) {
    int64_t off = 0;
    for (size_t k = 0; k < outer; ++k) off += idx[k] * x.dims[k].first;
    if (lattice_meets(y, 0, shift + off, shift + off + run)) return true;
    size_t k = outer;
    while (k > 0 && ++idx[k - 1] == x.dims[k - 1].second) idx[--k] = 0;
    if (k == 0) return false;
  }
}

int64_t runs_of(const Lattice& l) {
  int64_t runs = 1, run = l.es;
  size_t outer = l.dims.size();
  while (outer > 0 && l.dims[outer - 1].first == run) run *= l.dims[--outer].second;
  for (size_t k = 0; k < outer; ++k) runs *= l.dims[k].second;
  return runs;
}

// x and y with the same strides (their sizes may differ): is there e_k in (-nx_k, ny_k) with
// y.base - x.base + sum e_k s_k in (-es_y, es_x)? Largest stride first; at each, the e_k whose
// multiple of s_k the inner dimensions' differences can still reach.
bool same_strides_meet(const c10::SmallVector<std::array<int64_t, 3>, 6>& dims, size_t k,
                       int64_t lo, int64_t hi, const c10::SmallVector<std::pair<int64_t, int64_t>, 6>& inner) {
  // open interval (lo, hi) for the sum of dims k.. ; inner[k] = (min, max) of that sum past k
  if (k == dims.size()) return lo < 0 && 0 < hi;
  const auto [s, nx, ny] = dims[k];
  const auto [imin, imax] = inner[k];
  const int64_t first = std::max<int64_t>(-(nx - 1), floor_div(lo - imax, s) + 1);
  const int64_t last = std::min<int64_t>(ny - 1, -floor_div(-(hi - imin), s) - 1);
  for (int64_t e = first; e <= last; ++e)
    if (same_strides_meet(dims, k + 1, lo - e * s, hi - e * s, inner)) return true;
  return false;
}

// Some(meet) when x and y have one stride per dimension (any sizes), else nothing.
std::optional<bool> meet_by_strides(const at::Tensor& x, const at::Tensor& y) {
  if (x.dim() != y.dim()) return std::nullopt;
  const int64_t ex = x.element_size(), ey = y.element_size();
  intptr_t bx = reinterpret_cast<intptr_t>(x.data_ptr()), by = reinterpret_cast<intptr_t>(y.data_ptr());
  c10::SmallVector<std::array<int64_t, 3>, 6> dims;  // (stride, nx, ny) in bytes
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t nx = x.size(d), ny = y.size(d);
    if (nx <= 1 && ny <= 1) continue;
    const int64_t s = x.stride(d) * ex;
    if (s != y.stride(d) * ey || s == 0) return std::nullopt;
    if (s < 0) {
      bx += (nx - 1) * s;
      by += (ny - 1) * s;
    }
    dims.push_back({std::abs(s), nx, ny});
  }
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a[0] > b[0]; });
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> inner(dims.size());
  int64_t mn = 0, mx = 0;
  for (size_t k = dims.size(); k-- > 0;) {
    inner[k] = {mn, mx};
    mn -= (dims[k][1] - 1) * dims[k][0];
    mx += (dims[k][2] - 1) * dims[k][0];
  }
  const int64_t delta = by - bx;  // sum e_k s_k must lie in (-es_y - delta, es_x - delta)
  return same_strides_meet(dims, 0, -ey - delta, ex - delta, inner);
}
}  // namespace

bool may_overlap_itself(const at::Tensor& t) {
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (|stride|, size) of dimensions of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(std::abs(t.stride(d)), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t covered = 1;  // elements
  for (const auto& [stride, n] : dims) {
    if (stride < covered) return true;
    covered += (n - 1) * stride;
  }
  return false;
}

NamedTensor named(const at::Tensor& t, const char* name) { return {&t, name}; }
NamedTensor named(const std::optional<at::Tensor>& t, const char* name) {
  return {t ? &*t : nullptr, name};
}

void check_no_self_overlap(const NamedTensor& w) {
  TORCH_CHECK_VALUE(w.t == nullptr || w.t->numel() == 0 || !may_overlap_itself(*w.t), w.name,
                    " (written by this op) must not have elements sharing memory (as expand() "
                    "gives), got shape ", c10::str(w.t->sizes()), " and strides ", w.t->strides());
}

void check_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> others) {
  for (const NamedTensor& w : written) {
    if (w.t == nullptr || w.t->numel() == 0) continue;
    const ByteSpan a = byte_span(*w.t);
    for (const NamedTensor& o : others) {
      if (o.t == nullptr || o.t->numel() == 0 || o.t->device() != w.t->device()) continue;
      TORCH_CHECK_VALUE(!spans_meet(a, byte_span(*o.t)), w.name, " (written by this op) must not "
                        "share memory with ", o.name, ": their bytes overlap; pass a separate "
                        "tensor (clone() it)");
    }
  }
}

void check_outputs_apart(const NamedTensor& a, const NamedTensor& b) {
  if (a.t == nullptr || b.t == nullptr || a.t->numel() == 0 || b.t->numel() == 0 ||
      a.t->device() != b.t->device())
    return;
  const at::Tensor &x = *a.t, &y = *b.t;
  bool meet;
  if (may_overlap_itself(x) || may_overlap_itself(y)) {
    meet = spans_meet(byte_span(x), byte_span(y));  // refused elsewhere; no lattice to walk
  } else if (const auto by_strides = meet_by_strides(x, y)) {
    meet = *by_strides;  // views of one plan's spec, K | V halves of one row: exact, O(dims)
  } else if (!spans_meet(byte_span(x), byte_span(y))) {
    meet = false;
  } else if (x.dim() > 1 && y.dim() > 1 && x.size(0) == y.size(0) && x.size(0) > 1 &&
             x.stride(0) * x.element_size() == y.stride(0) * y.element_size()) {
    // one block dimension (views of one block-outer plan): only the few block distances at
    // which the blocks' inner spans meet, each checked exactly on one block of each
    const ByteSpan xi = byte_span(x[0]), yi = byte_span(y[0]);
    const int64_t stride = std::abs(x.stride(0) * static_cast<int64_t>(x.element_size()));
    const int64_t n = x.size(0), ex = xi.last - xi.first, ey = yi.last - yi.first;
    const int64_t d = yi.first - xi.first;  // y's block j meets x's block i only if
    Lattice lx = lattice(x[0]), ly = lattice(y[0]);  // d + (j - i) stride lies in (-ey, ex)
    const bool x_fewer = runs_of(lx) <= runs_of(ly);
    const intptr_t y0 = ly.base;
    meet = false;
    for (int64_t e = std::max<int64_t>(floor_div(-ey - d, stride), -(n - 1));
         e <= std::min<int64_t>(floor_div(ex - d, stride) + 1, n - 1) && !meet; ++e) {
      ly.base = y0 + e * stride;
      meet = x_fewer ? lattices_meet(lx, ly) : lattices_meet(ly, lx);
    }
  } else {  // exact: the one with fewer contiguous runs looked up in the other
    const Lattice lx = lattice(x), ly = lattice(y);
    meet = runs_of(lx) <= runs_of(ly) ? lattices_meet(lx, ly) : lattices_meet(ly, lx);
  }
  TORCH_CHECK_VALUE(!meet, a.name, " and ", b.name, " (both written by this op) must not share "
                    "memory: their bytes overlap, and the last write would win");
}

}  // namespace kvc
