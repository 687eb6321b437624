// The library as torch and Python see it, all from op_list.h: the schemas (one TORCH_LIBRARY
// block), the CPU and CUDA kernels of every op, and the module `kvcache_ext._C` with cpu_isa()
// and op_table() (the list's names and device rules, for the Python fakes).
#include <Python.h>
#include <torch/library.h>

#include "../core/entry.h"  // cpu::isa
#include "op_list.h"
#include "ops.h"

namespace kvc {

TORCH_LIBRARY(kvcache_ext, m) {
#define KVC_DEF(name, args, anchor, host, cpu) m.def(#name "(" args ") -> ()");
  KVC_OPS(KVC_DEF)
#undef KVC_DEF
}

#define KVC_IMPL(name, args, anchor, host, cpu) m.impl(#name, &ops::name);
TORCH_LIBRARY_IMPL(kvcache_ext, CPU, m) { KVC_OPS(KVC_IMPL) }
#if defined(KVC_WITH_CUDA)
TORCH_LIBRARY_IMPL(kvcache_ext, CUDA, m) { KVC_OPS(KVC_IMPL) }
#endif
#undef KVC_IMPL

namespace {

// kvcache_ext._C.cpu_isa(): which row loops the CPU kernels run (picked at load time, capped by
// KVC_CPU_ISA), for benchmark records.
PyObject* cpu_isa(PyObject*, PyObject*) { return PyUnicode_FromString(cpu::isa()); }

// kvcache_ext._C.op_table(): [(name, anchor, host, cpu), ...], the last three as op_list.h has
// them (argument names separated by spaces).
PyObject* op_table(PyObject*, PyObject*) {
  PyObject* list = PyList_New(0);
  if (list == nullptr) return nullptr;
#define KVC_ROW(name, args, anchor, host, cpu)                                       \
  {                                                                                   \
    PyObject* row = Py_BuildValue("(ssss)", #name, anchor, host, cpu);                \
    if (row == nullptr || PyList_Append(list, row) != 0) {                            \
      Py_XDECREF(row);                                                                \
      Py_DECREF(list);                                                                \
      return nullptr;                                                                 \
    }                                                                                 \
    Py_DECREF(row);                                                                   \
  }
  KVC_OPS(KVC_ROW)
#undef KVC_ROW
  return list;
}

PyMethodDef methods[] = {
    {"cpu_isa", cpu_isa, METH_NOARGS, "the CPU kernels' row loops: scalar, avx2, avx512 or avx512+bf16"},
    {"op_table", op_table, METH_NOARGS, "[(op, anchor, host args, cpu args)]: op_list.h's device rules"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace
}  // namespace kvc

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kvc::methods};
  return PyModule_Create(&module);
}
