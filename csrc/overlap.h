// Overlap checks of op arguments, on their addresses only (no values read, no synchronisation).
#pragma once
#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>

namespace kvc {

// A tensor an op writes must not share bytes with another of its arguments (torch's rule for
// out= arguments): a gather into the cache it reads would overwrite rows; a write whose inputs or
// slot_mapping lie in the cache would read bytes it is changing. Each tensor counts as the span
// from its lowest to its highest byte, so one lying in a strided view's gaps counts as
// overlapping. Only tensors on one device are compared; empty ones and absent ones are skipped.
bool may_overlap_itself(const at::Tensor& t);  // two elements might share memory
struct NamedTensor {
  const at::Tensor* t;  // null: an absent optional argument
  const char* name;
};
NamedTensor named(const at::Tensor& t, const char* name);
NamedTensor named(const std::optional<at::Tensor>& t, const char* name);
void check_apart(std::initializer_list<NamedTensor> written, std::initializer_list<NamedTensor> others);
// An output (a gather's out) whose elements may share memory is refused; views are checked by
// paged_view (op_args.h).
void check_no_self_overlap(const NamedTensor& w);

}  // namespace kvc
