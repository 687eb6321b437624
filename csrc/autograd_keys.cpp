// How the ops meet autograd: not differentiable (Autograd refuses to overwrite a tracked
// tensor), and in place to it (ADInplaceOrView bumps the version counters of what they write).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <array>

namespace kvc {
namespace {

// The tensors an op writes: its Tensor(a!) arguments (at most two: dsa_write's views, indexer
// codes + scales).
struct Written {
  std::array<at::Tensor, 2> tensors;
  std::array<const char*, 2> names{};
  size_t count = 0;
};

Written written_args(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), first = stack.size() - n;
  Written w;
  for (size_t i = 0; i < n; ++i)
    if (schema.is_mutable({c10::SchemaArgType::input, i}) && stack[first + i].isTensor()) {
      TORCH_INTERNAL_ASSERT(w.count < w.tensors.size());
      w.names[w.count] = schema.arguments()[i].name().c_str();
      w.tensors[w.count++] = stack[first + i].toTensor();
    }
  return w;
}

// Autograd: the ops are not differentiable. Overwriting a tensor autograd tracks would leave its
// graph describing bytes that are gone (a silently wrong backward): refused, as torch refuses
// in-place writes to leaves that require grad. Inputs that require grad are read as values.
void refuse_tracked_outputs(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                            torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const Written w = written_args(op, *stack);
    for (size_t i = 0; i < w.count; ++i)
      TORCH_CHECK_VALUE(!w.tensors[i].requires_grad(), op.schema().name(), ": ", w.names[i],
                        " requires grad, and the op writes it in place without a derivative; "
                        "write into a tensor autograd does not track (detach it, or run under "
                        "torch.no_grad() / torch.inference_mode())");
  }
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

// ADInplaceOrView: the version counters of what an op wrote are bumped, as torch's own in-place
// ops do, so autograd refuses a backward that would read bytes overwritten after they were
// saved. Inference tensors carry no counter: skipped. (torch's boxed ADInplaceOrView fallback
// bumps only returned tensors; these ops return nothing.)
void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const Written w = written_args(op, *stack);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (size_t i = 0; i < w.count; ++i)
    if (!w.tensors[i].is_inference()) torch::autograd::increment_version(w.tensors[i]);
}

}  // namespace

// Every op of schema.cpp (tests/test_opcheck.py checks that none is missing).
constexpr const char* kOps[] = {
    "reshape_and_cache", "reshape_and_cache_kv", "concat_and_cache_mla", "indexer_k_quant_and_cache",
    "dsa_write", "gather_mla", "gather_mla_slots", "gather_kv", "gather_kv_slots", "gather_indexer",
    "gather_indexer_slots", "v4_quant_and_cache", "v4_dsa_write", "gather_v4", "gather_v4_slots",
    "gather_v4_window", "copy_spans"};

TORCH_LIBRARY_IMPL(kvcache_ext, Autograd, m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&refuse_tracked_outputs>());
}
TORCH_LIBRARY_IMPL(kvcache_ext, ADInplaceOrView, m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&bump_written_versions>());
}

}  // namespace kvc
