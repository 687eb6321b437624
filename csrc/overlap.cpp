// Memory-overlap checks of op arguments (overlap.h): byte spans compared before any write.
#include "overlap.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "op_args.h"  // shape_str

namespace kvc {

namespace {
struct ByteSpan {
  uintptr_t first, last;  // [first, last)
};
ByteSpan byte_span(const at::Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const int64_t es = static_cast<int64_t>(t.element_size());
  return {base + lo * es, base + (hi + 1) * es};
}
}  // namespace

// Whether two elements may share memory: taken from the smallest stride up, each dimension must
// step over at least what the dimensions inside it cover (enough for no overlap, and what every
// view of a plan and every dense or sliced tensor satisfies).
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
                    "gives), got shape ", shape_str(*w.t), " and strides ", w.t->strides());
}

void check_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> others) {
  for (const NamedTensor& w : written) {
    if (w.t == nullptr || w.t->numel() == 0) continue;
    const ByteSpan a = byte_span(*w.t);
    for (const NamedTensor& o : others) {
      if (o.t == nullptr || o.t->numel() == 0 || o.t->device() != w.t->device()) continue;
      const ByteSpan b = byte_span(*o.t);
      TORCH_CHECK_VALUE(a.last <= b.first || b.last <= a.first, w.name, " (written by this op) "
                        "must not share memory with ", o.name, ": their bytes overlap; pass a "
                        "separate tensor (clone() it)");
    }
  }
}

}  // namespace kvc
