// Memory-overlap checks of op arguments (overlap.h).
#include "overlap.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

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

// Two tensors of one geometry at byte distance `delta`: is there an element of each whose bytes
// meet, i.e. offsets e_d in (-n_d, n_d) with |delta - sum e_d s_d| < element size? With the
// dimensions sorted by stride, each stride exceeds the reach of the ones inside it (no self-
// overlap), so at each dimension only the two multiples of its stride around the rest can work.
bool translates_meet(const c10::SmallVector<std::pair<int64_t, int64_t>, 6>& dims, size_t k,
                     int64_t rest, int64_t es) {
  if (k == 0) return std::abs(rest) < es;
  const auto [stride, n] = dims[k - 1];  // bytes, size
  const int64_t lo = rest >= 0 ? rest / stride : -((-rest + stride - 1) / stride);
  for (int64_t e : {lo, lo + 1})
    if (e > -n && e < n && translates_meet(dims, k - 1, rest - e * stride, es)) return true;
  return false;
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == b.dim() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.element_size() == b.element_size();
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
  const int64_t es = static_cast<int64_t>(x.element_size());
  const auto delta = reinterpret_cast<intptr_t>(y.data_ptr()) - reinterpret_cast<intptr_t>(x.data_ptr());
  bool meet;
  if (same_geometry(x, y) && !may_overlap_itself(x)) {
    c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride in bytes, size)
    for (int64_t d = 0; d < x.dim(); ++d)
      if (x.size(d) > 1) dims.emplace_back(std::abs(x.stride(d)) * es, x.size(d));
    std::sort(dims.begin(), dims.end());
    meet = translates_meet(dims, dims.size(), delta, es);
  } else if (x.dim() > 1 && y.dim() > 1 && x.size(0) == y.size(0) && x.stride(0) == y.stride(0) &&
             x.element_size() == y.element_size() && x.stride(0) > 0) {
    // one block dimension (views of one block-outer plan): the blocks' inner spans, block by
    // block, for every block distance either way
    const ByteSpan xi = byte_span(x[0]), yi = byte_span(y[0]);
    const int64_t stride = x.stride(0) * es, n = x.size(0);
    const int64_t ex = xi.last - xi.first, ey = yi.last - yi.first;
    const int64_t d = yi.first - xi.first;  // block 0 of y minus block 0 of x
    meet = false;
    // y's block j meets x's block i iff d + (j - i) stride lies in (-ey, ex)
    const int64_t lo = (-ey - d) / stride - 1, hi = (ex - d) / stride + 1;
    for (int64_t e = std::max<int64_t>(lo, -(n - 1)); e <= std::min<int64_t>(hi, n - 1) && !meet; ++e)
      meet = d + e * stride > -ey && d + e * stride < ex;
  } else {
    meet = spans_meet(byte_span(x), byte_span(y));
  }
  TORCH_CHECK_VALUE(!meet, a.name, " and ", b.name, " (both written by this op) must not share "
                    "memory: their bytes overlap, and the last write would win");
}

}  // namespace kvc
