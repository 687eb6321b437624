// The op schemas (one TORCH_LIBRARY block), the fake/meta implementations, and the Python
// module stub that lets `import kvcache_ext._C` load this library.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(kvcache_ext, m) {
  // Writes: the cache view is mutated in place; T = slot_mapping.numel(), slot < 0 is padding.
  m.def("reshape_and_cache(Tensor key, Tensor(a!) view, Tensor slot_mapping, "
        "str kv_cache_dtype=\"auto\", Tensor? scale=None) -> ()");
  m.def("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) view, Tensor slot_mapping, "
        "str kv_cache_dtype=\"fp8_ds_mla\") -> ()");
  m.def("indexer_k_quant_and_cache(Tensor k, Tensor(a!) view, Tensor slot_mapping, "
        "str? scale_fmt=None, str placement=\"row\") -> ()");
  m.def("dsa_write(Tensor kv_c, Tensor k_pe, Tensor(a!) mla_view, Tensor k_idx, "
        "Tensor(b!) indexer_view, Tensor slot_mapping, str kv_cache_dtype=\"fp8_ds_mla\", "
        "str? scale_fmt=None, str placement=\"row\") -> ()");
  // Reads into caller-provided outputs (fixed shapes, so they capture in CUDA graphs).
  m.def("gather_mla(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "str kv_cache_dtype, Tensor(a!) out, bool validate=True) -> ()");
  m.def("gather_mla_slots(Tensor view, Tensor slots, str kv_cache_dtype, Tensor(a!) out, "
        "bool validate=True) -> ()");
  m.def("gather_indexer(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "str placement, Tensor(a!) codes, Tensor(b!) scales, bool validate=True) -> ()");
  m.def("gather_indexer_slots(Tensor view, Tensor slots, str placement, Tensor(a!) codes, "
        "Tensor(b!) scales, bool validate=True) -> ()");
  // Byte spans [S, 3] = (src offset, dst offset, length) between two flat buffers.
  m.def("copy_spans(Tensor src, Tensor(a!) dst, Tensor spans) -> ()");
}

namespace {
// Every op mutates its outputs in place and returns nothing, so the fake implementation has
// no shapes to compute.
template <class... Args>
void no_op(Args...) {}
}  // namespace

TORCH_LIBRARY_IMPL(kvcache_ext, Meta, m) {
  using T = const at::Tensor&;
  using OT = const std::optional<at::Tensor>&;
  using S = c10::string_view;
  using OS = std::optional<c10::string_view>;
  m.impl("reshape_and_cache", &no_op<T, T, T, S, OT>);
  m.impl("concat_and_cache_mla", &no_op<T, T, T, T, S>);
  m.impl("indexer_k_quant_and_cache", &no_op<T, T, T, OS, S>);
  m.impl("dsa_write", &no_op<T, T, T, T, T, T, S, OS, S>);
  m.impl("gather_mla", &no_op<T, T, T, OT, S, T, bool>);
  m.impl("gather_mla_slots", &no_op<T, T, S, T, bool>);
  m.impl("gather_indexer", &no_op<T, T, T, OT, S, T, T, bool>);
  m.impl("gather_indexer_slots", &no_op<T, T, S, T, T, bool>);
  m.impl("copy_spans", &no_op<T, T, T>);
}

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
