// Memory-overlap checks of op arguments, on their addresses only (no values read, no
// synchronisation), before anything is written.
#pragma once
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>

namespace kvc {

// Whether two elements of t might share memory: taken from the smallest stride up, each
// dimension must step over at least what the dimensions inside it cover (enough for no overlap,
// and what every view of a plan and every dense or sliced tensor satisfies).
bool may_overlap_itself(const at::Tensor& t);

struct NamedTensor {
  const at::Tensor* t;  // null: an absent optional argument
  const char* name;
};
NamedTensor named(const at::Tensor& t, const char* name);
NamedTensor named(const std::optional<at::Tensor>& t, const char* name);

// A tensor an op writes must not share bytes with another of its arguments (torch's rule for
// out= arguments): a gather into the cache it reads would overwrite rows; a write whose inputs or
// slot_mapping lie in the cache would read bytes it is changing. Each tensor counts as the span
// from its lowest to its highest byte, so one lying in a strided view's gaps counts as
// overlapping. Only tensors on one device are compared; empty and absent ones are skipped.
void check_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> others);
// Two tensors one op writes (K and V views, an MLA and an indexer view) must not share a byte,
// or the last write wins. Views of one plan interleave, so spans are too coarse here: views of
// one geometry (two specs' layers of a plan) are compared element by element, views with one
// block dimension in common block by block, others by span.
void check_outputs_apart(const NamedTensor& a, const NamedTensor& b);
// An output (a gather's out) whose elements may share memory is refused; views are checked by
// paged_view (tensor_args.h).
void check_no_self_overlap(const NamedTensor& w);

}  // namespace kvc
