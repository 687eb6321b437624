// How the ops meet autograd: not differentiable (Autograd falls through), and in place to it
// (ADInplaceOrView bumps the version counters of what they write).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <array>

namespace kvc {
namespace {

// Every op writes into tensors it is given (Tensor(a!) in its schema): their version counters
// are bumped, as torch's own in-place ops do, so autograd refuses a backward that would read
// bytes overwritten after they were saved. Inference tensors carry no counter: skipped. The ops
// are not differentiable: Autograd falls through to this key (the default autograd fallback
// would skip it, and torch's boxed ADInplaceOrView fallback bumps only returned tensors).
void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size(), first = stack->size() - n;
  std::array<at::Tensor, 2> written;  // at most two per op (dsa_write's views, codes + scales)
  size_t count = 0;
  for (size_t i = 0; i < n; ++i)
    if (schema.is_mutable({c10::SchemaArgType::input, i}) && (*stack)[first + i].isTensor()) {
      TORCH_INTERNAL_ASSERT(count < written.size());
      written[count++] = (*stack)[first + i].toTensor();
    }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (size_t i = 0; i < count; ++i)
    if (!written[i].is_inference()) torch::autograd::increment_version(written[i]);
}

}  // namespace

// Every op of schema.cpp (tests/test_opcheck.py checks that none is missing).
constexpr const char* kOps[] = {
    "reshape_and_cache", "reshape_and_cache_kv", "concat_and_cache_mla", "indexer_k_quant_and_cache",
    "dsa_write", "gather_mla", "gather_mla_slots", "gather_kv", "gather_kv_slots", "gather_indexer",
    "gather_indexer_slots", "v4_quant_and_cache", "v4_dsa_write", "gather_v4", "gather_v4_slots",
    "gather_v4_window", "copy_spans"};

TORCH_LIBRARY_IMPL(kvcache_ext, Autograd, m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(kvcache_ext, ADInplaceOrView, m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&bump_written_versions>());
}

}  // namespace kvc
