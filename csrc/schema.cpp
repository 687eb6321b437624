// The op schemas (one TORCH_LIBRARY block) and the Python module stub that lets `import kvcache_ext._C` load this
// library (with one function, cpu_isa).
#include <Python.h>
#include <torch/library.h>

#include "cpu/rows.h"

// Implementations: ops.cpp (CPU, CUDA); fake/meta ones in kvcache_ext/fake.py.
TORCH_LIBRARY(kvcache_ext, m) {
  // Writes: the cache view is mutated in place; T = slot_mapping.numel(), slot < 0 is padding.
  m.def("reshape_and_cache(Tensor key, Tensor(a!) view, Tensor slot_mapping, "
        "str kv_cache_dtype=\"auto\", Tensor? scale=None) -> ()");
  m.def("reshape_and_cache_kv(Tensor key, Tensor value, Tensor(a!) k_view, Tensor(b!) v_view, "
        "Tensor slot_mapping, str kv_cache_dtype=\"auto\", Tensor? k_scale=None, "
        "Tensor? v_scale=None) -> ()");
  m.def("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) view, Tensor slot_mapping, "
        "str kv_cache_dtype=\"fp8_ds_mla\", Tensor? scale=None, str? tile_scale=None) -> ()");
  m.def("indexer_k_quant_and_cache(Tensor k, Tensor(a!) view, Tensor slot_mapping, "
        "str? scale_fmt=None, str placement=\"row\") -> ()");
  m.def("dsa_write(Tensor kv_c, Tensor k_pe, Tensor(a!) mla_view, Tensor k_idx, "
        "Tensor(b!) indexer_view, Tensor slot_mapping, str kv_cache_dtype=\"fp8_ds_mla\", "
        "str? scale_fmt=None, str placement=\"row\", str? tile_scale=None) -> ()");
  // Reads into caller-provided outputs (fixed shapes, so they capture in CUDA graphs).
  m.def("gather_mla(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "str kv_cache_dtype, Tensor(a!) out, bool validate=True, Tensor? scale=None) -> ()");
  m.def("gather_mla_slots(Tensor view, Tensor slots, str kv_cache_dtype, Tensor(a!) out, "
        "bool validate=True, Tensor? scale=None) -> ()");
  m.def("gather_kv(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "Tensor(a!) out, bool validate=True, Tensor? scale=None) -> ()");
  m.def("gather_kv_slots(Tensor view, Tensor slots, Tensor(a!) out, bool validate=True, "
        "Tensor? scale=None) -> ()");
  m.def("gather_indexer(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "str placement, Tensor(a!) codes, Tensor(b!) scales, bool validate=True) -> ()");
  m.def("gather_indexer_slots(Tensor view, Tensor slots, str placement, Tensor(a!) codes, "
        "Tensor(b!) scales, bool validate=True) -> ()");
  // DeepSeek-V4 rows in split pages: format "fp8_ds_mla_v4" (584 B <-> 512 values) or "mxfp4"
  // (68 B <-> 128 values); reads give bf16 / fp32 values or raw rows (uint8 out).
  m.def("v4_quant_and_cache(Tensor x, Tensor(a!) view, Tensor slot_mapping, str format, "
        "str scale_floor=\"amax\") -> ()");
  m.def("v4_dsa_write(Tensor kv, Tensor(a!) mla_view, Tensor k_idx, Tensor(b!) indexer_view, "
        "Tensor slot_mapping, str scale_floor=\"amax\", str indexer=\"mxfp4\") -> ()");
  m.def("gather_v4(Tensor view, Tensor block_table, Tensor cu_seq_lens, Tensor? seq_starts, "
        "str format, Tensor(a!) out, bool validate=True) -> ()");
  m.def("gather_v4_slots(Tensor view, Tensor slots, str format, Tensor(a!) out, "
        "bool validate=True) -> ()");
  // Per request: its compressed rows, then its last `window` SWA rows (fp8_ds_mla_v4 views).
  m.def("gather_v4_window(Tensor c_view, Tensor c_block_table, Tensor swa_view, "
        "Tensor swa_block_table, Tensor seq_lens, Tensor cu_out, int ratio, int window, "
        "Tensor(a!) out, bool validate=True) -> ()");
  // Byte spans [S, 3] = (src offset, dst offset, length) between two flat buffers.
  m.def("copy_spans(Tensor src, Tensor(a!) dst, Tensor spans) -> ()");
}

namespace {
// kvcache_ext._C.cpu_isa(): which row loops the CPU kernels run (picked at load time, capped by
// KVC_CPU_ISA), for benchmark records.
PyObject* cpu_isa(PyObject*, PyObject*) { return PyUnicode_FromString(kvc::cpu::isa()); }
PyMethodDef methods[] = {{"cpu_isa", cpu_isa, METH_NOARGS, "the CPU kernels' row loops: scalar, avx2, avx512 or avx512+bf16"},
                         {nullptr, nullptr, 0, nullptr}};
}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module);
}
