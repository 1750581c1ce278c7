// amp._C on torch's stable C ABI (torch/csrc/stable, TORCH_TARGET_VERSION 2.10) and Python's
// limited API (Py_LIMITED_API 3.10): one binary that loads into every torch >= 2.10 on every
// CPython >= 3.10, so one abi3 wheel per architecture. setup.py compiles it instead of the
// pybind11 binding (bindings.cpp) when the torch built against allows it; both compile the
// same ops (ops.cpp) and kernels.
//
// The ops are registered with torch's dispatcher as torch.ops.amp_C.* (STABLE_TORCH_LIBRARY:
// op_table.h's schemas; the functions are adaptor.h's over stable tensors). The Python module
// itself has no functions of its own: PyInit__C records the module's facts and hands it to
// amp.kernels.stable_binding, which makes the pybind11 module's functions (names, keyword
// arguments, defaults, results) from the registered schemas; apex's multi_tensor_* entry points are amp.kernels.apex_ops' (Python, over these ops: they
// serve every device), installed at import as the pybind11 module installs them.
//
// Errors: bad arguments leave the op as a std::runtime_error whose message starts with
// "[ValueError] " or "[TypeError] "; torch raises it as RuntimeError and amp.kernels.stable_binding
// re-raises it as that type, as the pybind11 module raises it.
#include <Python.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "adaptor.h"
#include "driver.h"
#include "op_table.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif
#ifndef AMP_TORCH_MIN
#error "AMP_TORCH_MIN (the TORCH_TARGET_VERSION as major.minor) must be defined by setup.py"
#endif

using amp_driver::View;
using torch::stable::Tensor;
using torch::headeronly::ScalarType;

namespace {

// The shim's codes for what view_of compares, read once: each aoti_torch_dtype_*() and
// aoti_torch_device_type_cpu() is a call into libtorch, and stable::Tensor::scalar_type() walks
// a chain of them (seven for float32) on every tensor.
struct Codes {
  int32_t f32, f16, bf16, cpu, strided;
};
const Codes& codes() {
  static const Codes c = {aoti_torch_dtype_float32(), aoti_torch_dtype_float16(),
                          aoti_torch_dtype_bfloat16(), aoti_torch_device_type_cpu(),
                          aoti_torch_layout_strided()};
  return c;
}

// A View's tensor is its AtenTensorHandle (what both a list's items and stable::Tensor hold).
AtenTensorHandle handle_of(const View& v) {
  return static_cast<AtenTensorHandle>(const_cast<void*>(v.tensor));
}

void check(AOTITorchError err, const char* what) {
  STD_TORCH_CHECK(err == AOTI_TORCH_SUCCESS, "amp._C: cannot read a tensor's ", what);
}

// The View's tensor as a stable::Tensor of its own (a new handle): for an error's names only.
Tensor named(const View& v) {
  AtenTensorHandle copy = nullptr;
  check(aoti_torch_new_tensor_handle(handle_of(v), &copy), "handle");
  return Tensor(copy);
}

std::string dtype_name(const View& v) {
  return std::string(torch::headeronly::toString(named(v).scalar_type()));
}

// Device names as torch prints them (c10's DeviceTypeName is not part of the stable ABI).
std::string device_name(const View& v) {
  const torch::stable::Device d = named(v).device();
  using torch::headeronly::DeviceType;
  std::string name;
  switch (d.type()) {
    case DeviceType::CPU: name = "cpu"; break;
    case DeviceType::CUDA: name = "cuda"; break;
    case DeviceType::HIP: name = "hip"; break;
    case DeviceType::XLA: name = "xla"; break;
    case DeviceType::MPS: name = "mps"; break;
    case DeviceType::XPU: name = "xpu"; break;
    case DeviceType::HPU: name = "hpu"; break;
    case DeviceType::Meta: name = "meta"; break;
    case DeviceType::MTIA: name = "mtia"; break;
    case DeviceType::PrivateUse1: name = "privateuseone"; break;
    default: name = "device type " + std::to_string(static_cast<int>(d.type())); break;
  }
  return d.has_index() ? name + ":" + std::to_string(d.index()) : name;
}

// One tensor of a Tensor[] argument, owned: the handle the dispatcher made for it, deleted
// with the item. stable::Tensor would wrap each in a shared_ptr (a heap block and atomic
// counts per tensor per call) that an op's argument, never shared, does not need.
class Item {
 public:
  explicit Item(AtenTensorHandle h) : h_(h) {}
  Item(Item&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Item& operator=(Item&&) = delete;
  Item(const Item&) = delete;
  Item& operator=(const Item&) = delete;
  ~Item() {
    if (h_ != nullptr) aoti_torch_delete_tensor_object(h_);
  }
  AtenTensorHandle get() const { return h_; }

 private:
  AtenTensorHandle h_;
};

// --- the GIL around an op ---------------------------------------------------------------------
// torch calls an op from Python with the GIL released, and a tensor that has a Python object
// takes the GIL whenever its C++ reference count drops from 2 to 1 (c10's PyObject
// preservation: the object is released there). An op's arguments are one such reference per
// tensor (the handles it is given), dropped when it returns: without the GIL, a GIL round
// trip per tensor, most of the stable binding's per-tensor cost over pybind11's. So each op
// holds the GIL from its start to after its arguments are gone, and lets it go only while its
// parallel loops run (`parallel` below), which is where the time of a large call goes: other
// Python threads wait no longer than they would for any short C call.
thread_local bool t_op_holds_gil = false;

class OpGil {
 public:
  OpGil() : held_(Py_IsInitialized() != 0 && !t_op_holds_gil) {
    if (held_) {
      state_ = PyGILState_Ensure();
      t_op_holds_gil = true;
    }
  }
  ~OpGil() {
    if (held_) {
      t_op_holds_gil = false;
      PyGILState_Release(state_);
    }
  }
  OpGil(const OpGil&) = delete;
  OpGil& operator=(const OpGil&) = delete;

 private:
  bool held_;
  PyGILState_STATE state_{};
};

// TORCH_BOX's boxed kernel under the op's GIL (its arguments are destroyed inside it).
template <void (*Boxed)(StableIValue*, uint64_t, uint64_t)>
void with_gil(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  OpGil gil;
  Boxed(stack, num_args, num_outputs);
}

// The GIL let go for the length of a parallel loop, if the op holds it.
class LoopWithoutGil {
 public:
  LoopWithoutGil() : saved_(t_op_holds_gil ? PyEval_SaveThread() : nullptr) {}
  ~LoopWithoutGil() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  LoopWithoutGil(const LoopWithoutGil&) = delete;
  LoopWithoutGil& operator=(const LoopWithoutGil&) = delete;

 private:
  PyThreadState* saved_;
};

void parallel(int64_t n, void (*body)(int64_t, int64_t, void*), void* ctx) {
  LoopWithoutGil no_gil;
  torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e, ctx); });
}

const amp_driver::Binding kBinding = {
    &dtype_name,
    &device_name,
    [] { return static_cast<int64_t>(torch::stable::get_num_threads()); },
    &parallel,
};

// The adaptor's binding (adaptor.h): stable tensors, and what the dispatcher can carry back
// (op_table.h says which results amp.kernels.stable_binding turns into Python's).
struct Stable {
  using Tensor = torch::stable::Tensor;
  using Item = ::Item;  // a Tensor[]'s element
  using PerNorms = Tensor;  // empty unless asked for
  using Isas = std::string;  // comma-separated

  // The shim's calls, one per fact (stable::Tensor's methods make two to nine each).
  static View view_of(AtenTensorHandle h) {
    const Codes& c = codes();
    View v;
    v.tensor = h;
    check(aoti_torch_is_defined(h, &v.defined), "definedness");
    if (!v.defined) return v;
    int32_t device = 0, dtype = 0, layout = 0;
    check(aoti_torch_get_device_type(h, &device), "device");
    check(aoti_torch_get_dtype(h, &dtype), "dtype");
    check(aoti_torch_get_layout(h, &layout), "layout");
    v.cpu = device == c.cpu;
    v.dtype = dtype == c.f32    ? amp_kernels::kF32
              : dtype == c.f16  ? amp_kernels::kF16
              : dtype == c.bf16 ? amp_kernels::kBF16
                                : -1;
    v.sparse = layout != c.strided;
    if (!v.sparse) check(aoti_torch_is_contiguous(h, &v.contiguous), "contiguity");
    check(aoti_torch_get_numel(h, &v.numel), "size");
    if (v.cpu && !v.sparse && v.numel) check(aoti_torch_get_data_ptr(h, &v.ptr), "data");
    return v;
  }
  static View view_of(const Tensor& t) { return view_of(t.get()); }
  static View view_of(const Item& t) { return view_of(t.get()); }
  // Runs an op body; an ArgError leaves as a runtime_error tagged with its Python type.
  template <class F>
  static auto call(const F& f) -> decltype(f()) {
    try {
      return f();
    } catch (const amp_driver::ArgError& e) {
      throw std::runtime_error(std::string(e.type_error ? "[TypeError] " : "[ValueError] ") +
                               e.what());
    }
  }
  // A 1-d tensor of *xs* (T: float or double, *dtype* its ScalarType).
  template <class T>
  static Tensor filled(const std::vector<T>& xs, ScalarType dtype) {
    Tensor t = torch::stable::empty({static_cast<int64_t>(xs.size())}, dtype);
    std::copy(xs.begin(), xs.end(), static_cast<T*>(t.data_ptr()));
    return t;
  }
  static Tensor floats(const std::vector<float>& xs) { return filled(xs, ScalarType::Float); }
  static PerNorms per_norms(const std::vector<double>& xs, bool /*asked*/) {
    return filled(xs, ScalarType::Double);
  }
  static Isas isas(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& s : names) out += (out.empty() ? "" : ",") + s;
    return out;
  }
};
using Ops = amp_adaptor::Ops<Stable>;

}  // namespace

// How TORCH_BOX takes a Tensor[]'s element as an Item: the dispatcher's handle, owned, unwrapped.
HIDDEN_NAMESPACE_BEGIN(torch, stable, detail)
template <>
struct ToImpl<Item> {
  static Item call(StableIValue val, uint64_t /*extension_build_version*/, bool /*is_internal*/) {
    return Item(to<AtenTensorHandle>(val));
  }
};
// torch's ToImpl<std::optional<T>> copies the list out (Item moves only): the same steps, moved.
template <>
struct ToImpl<std::optional<std::vector<Item>>> {
  static std::optional<std::vector<Item>> call(StableIValue val, uint64_t version, bool internal) {
    auto* sivp = to<StableIValue*>(val);
    if (sivp == nullptr) return std::nullopt;
    std::optional<std::vector<Item>> out(ToImpl<std::vector<Item>>::call(*sivp, version, internal));
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
    TORCH_ERROR_CODE_CHECK(torch_delete_stable_ivalue(sivp));
#else
    delete sivp;
#endif
    return out;
  }
};
HIDDEN_NAMESPACE_END(torch, stable, detail)

const amp_driver::Binding& amp_driver::binding() { return kBinding; }

STABLE_TORCH_LIBRARY(amp_C, m) {
#define AMP_C_SCHEMA(name, schema, doc) m.def(schema);
  AMP_C_OPS(AMP_C_SCHEMA)
#undef AMP_C_SCHEMA
}

// CompositeExplicitAutograd: one kernel for every device key, so a meta or CUDA tensor in a
// list reaches check_list and gets its clear error instead of "no kernel for Meta".
STABLE_TORCH_LIBRARY_IMPL(amp_C, CompositeExplicitAutograd, m) {
#define AMP_C_IMPL(name, schema, doc) m.impl(#name, &with_gil<TORCH_BOX(&Ops::name)>);
  AMP_C_OPS(AMP_C_IMPL)
#undef AMP_C_IMPL
}

// --- the Python module ------------------------------------------------------------------------

namespace {
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "amp._C",
                       "amp._C: multi-tensor CPU kernels on torch's stable ABI (the functions "
                       "are set by amp.kernels.stable_binding over torch.ops.amp_C)",
                       -1, nullptr, nullptr, nullptr, nullptr, nullptr};

// m.<attr> = {op name: text} over op_table.h (the schemas, or the docstrings); false with the
// Python error set on failure.
bool add_table(PyObject* m, const char* attr, bool docs) {
  PyObject* table = PyDict_New();
  bool ok = table != nullptr;
#define AMP_C_ENTRY(name, schema, doc)                                     \
  if (ok) {                                                                \
    PyObject* text = PyUnicode_FromString(docs ? doc : schema);            \
    ok = text != nullptr && PyDict_SetItemString(table, #name, text) == 0; \
    Py_XDECREF(text);                                                      \
  }
  AMP_C_OPS(AMP_C_ENTRY)
#undef AMP_C_ENTRY
  // PyModule_AddObject steals the reference only when it succeeds.
  if (ok && PyModule_AddObject(m, attr, table) == 0) return true;
  Py_XDECREF(table);
  return false;
}

// `<module>.install(m)`; false with the Python error set when the import or the call fails.
bool install_from(const char* module, PyObject* m) {
  PyObject* api = PyImport_ImportModule(module);
  PyObject* done = api ? PyObject_CallMethod(api, "install", "O", m) : nullptr;
  Py_XDECREF(api);
  Py_XDECREF(done);
  return done != nullptr;
}
}  // namespace

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&kModule);
  if (m == nullptr) return nullptr;
  const std::string note = amp_driver::init_isa();
  if (PyModule_AddStringConstant(m, "_isa_note", note.c_str()) < 0 ||
      PyModule_AddStringConstant(m, "__torch_version__", AMP_TORCH_VERSION) < 0 ||
      PyModule_AddStringConstant(m, "__torch_abi__", "stable") < 0 ||
      PyModule_AddStringConstant(m, "__torch_min__", AMP_TORCH_MIN) < 0 ||
      PyModule_AddIntConstant(m, "chunk_size", static_cast<long>(amp_driver::kChunk)) < 0 ||
      !add_table(m, "_schemas", false) || !add_table(m, "_docs", true)) {
    Py_DECREF(m);
    return nullptr;
  }
  // The functions of the pybind11 module (made from the registered schemas), then apex's
  // multi_tensor_* entry points
  // (amp.kernels.apex_ops, the one place their conventions live).
  if (!install_from("amp.kernels.stable_binding", m) || !install_from("amp.kernels.apex_ops", m)) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
