// No pybind11 (it needs the full CPython API): the operator is registered with torch's
// dispatcher and the module itself is a bare stable-ABI module.
#include <Python.h>
#include <ATen/ATen.h>
#include <torch/library.h>

namespace abi3ext {
at::Tensor twice(const at::Tensor& x) { return x * 2; }
}  // namespace abi3ext

TORCH_LIBRARY(abi3ext, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(abi3ext, CPU, m) { m.impl("twice", &abi3ext::twice); }

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&def);
}
