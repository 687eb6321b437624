// The kernels every op has besides its CPU and CUDA ones, registered for every entry of
// op_list.h: how the ops meet autograd -- not differentiable (Autograd refuses to overwrite a
// tracked tensor), and in place (ADInplaceOrView bumps the version counters of what they write)
// -- and where their tensors may live (BackendSelect: the list's device rules, checked before
// any backend runs, so a real cache never reaches the Meta kernel because one argument is a meta
// tensor, and a CUDA kernel never gets a CPU tensor).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "op_list.h"

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

// The device rules of one op (op_list.h): tensors on the anchor's device; `host` ones on the CPU
// or there; `cpu` ones on the CPU. No anchor: only the `cpu` rule.
struct DeviceRule {
  std::string anchor;
  std::vector<std::string> host, cpu;
};

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t j = std::min(s.find(' ', i), s.size());
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

const DeviceRule& rule_of(const c10::OperatorHandle& op) {
  static const auto* rules = [] {
    auto* m = new std::unordered_map<std::string, DeviceRule>;
#define KVC_RULE(name, args, anchor, host, cpu) \
  (*m)["kvcache_ext::" #name] = DeviceRule{anchor, words(host), words(cpu)};
    KVC_OPS(KVC_RULE)
#undef KVC_RULE
    return m;
  }();
  return rules->at(op.schema().name());
}

bool among(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// BackendSelect: every tensor argument on the device its rule says, before any kernel runs.
void check_devices(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  const DeviceRule& rule = rule_of(op);
  std::optional<c10::Device> anchor;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name() == rule.anchor && (*stack)[first + i].isTensor())
      anchor = (*stack)[first + i].toTensor().device();
  const char* op_name = schema.name().c_str() + std::string_view("kvcache_ext::").size();
  const std::string *meta = nullptr, *real = nullptr;
  c10::Device real_device = c10::kCPU;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (!v.isTensor()) continue;
    const std::string& name = args[i].name();
    const c10::Device d = v.toTensor().device();
    if (d.is_meta()) {
      if (!meta) meta = &name;
    } else if (!real) {
      real = &name, real_device = d;
    }
    if (name == rule.anchor) continue;
    if (among(rule.cpu, name)) {
      TORCH_CHECK_VALUE(d.is_cpu(), op_name, ": ", name, " must be a CPU tensor, got one on ", d);
    } else if (anchor && among(rule.host, name)) {
      TORCH_CHECK_VALUE(d.is_cpu() ? !anchor->is_meta() : d == *anchor, op_name, ": ", name,
                        " must be on the CPU or on the device of ", rule.anchor, " (", *anchor,
                        "), got ", d);
    } else if (anchor) {
      TORCH_CHECK_VALUE(d == *anchor, op_name, ": ", name, " must be on the device of ",
                        rule.anchor, " (", *anchor, "), got ", d);
    }
  }
  // A meta tensor (no data) among real ones where no rule relates them (an op without an
  // anchor): refused too, so a real buffer never reaches the Meta kernel (which writes nothing).
  TORCH_CHECK_VALUE(!meta || !real, op_name, ": ", *meta, " is a meta tensor (no data) but ", *real,
                    " is on ", real_device, ": every tensor argument must be real, or every one fake");
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                                c10::DispatchKey::BackendSelect),
                     stack);
}

}  // namespace

#define KVC_BOXED(fn) torch::CppFunction::makeFromBoxedFunction<&fn>()
#define KVC_AUTOGRAD(name, args, anchor, host, cpu) m.impl(#name, KVC_BOXED(refuse_tracked_outputs));
#define KVC_INPLACE(name, args, anchor, host, cpu) m.impl(#name, KVC_BOXED(bump_written_versions));
#define KVC_DEVICES(name, args, anchor, host, cpu) m.impl(#name, KVC_BOXED(check_devices));
TORCH_LIBRARY_IMPL(kvcache_ext, Autograd, m) { KVC_OPS(KVC_AUTOGRAD) }
TORCH_LIBRARY_IMPL(kvcache_ext, ADInplaceOrView, m) { KVC_OPS(KVC_INPLACE) }
TORCH_LIBRARY_IMPL(kvcache_ext, BackendSelect, m) { KVC_OPS(KVC_DEVICES) }

}  // namespace kvc
