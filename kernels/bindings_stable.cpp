// amp._C on torch's stable C ABI (torch/csrc/stable, TORCH_TARGET_VERSION 2.10) and Python's
// limited API (Py_LIMITED_API 3.10): one binary that loads into every torch >= 2.10 on every
// CPython >= 3.10, so one abi3 wheel per architecture. setup.py compiles it instead of the
// pybind11 binding (bindings.cpp) when the torch built against allows it; both compile the
// same ops (ops.cpp) and kernels.
//
// The ops are registered with torch's dispatcher as torch.ops.amp_C.* (STABLE_TORCH_LIBRARY:
// schemas of Tensor[] lists and scalars). The Python module itself has no functions of its
// own: PyInit__C records the module's facts and hands it to amp.kernels.stable_binding, which gives
// it the pybind11 module's functions (names, keyword arguments, defaults, results) over those
// ops; apex's multi_tensor_* entry points are amp.kernels.apex_ops' (Python, over these ops: they
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

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "driver.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif
#ifndef AMP_TORCH_MIN
#error "AMP_TORCH_MIN (the TORCH_TARGET_VERSION as major.minor) must be defined by setup.py"
#endif

using amp_driver::View;
using amp_driver::ViewList;
using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using TensorList = std::vector<Tensor>;

namespace {

const Tensor& tensor_of(const View& v) { return *static_cast<const Tensor*>(v.tensor); }

int dtype_code(ScalarType s) {
  switch (s) {
    case ScalarType::Float: return amp_kernels::kF32;
    case ScalarType::Half: return amp_kernels::kF16;
    case ScalarType::BFloat16: return amp_kernels::kBF16;
    default: return -1;
  }
}

bool strided(const Tensor& t) {
  int32_t layout = 0;
  STD_TORCH_CHECK(aoti_torch_get_layout(t.get(), &layout) == AOTI_TORCH_SUCCESS,
                  "amp._C: cannot read a tensor's layout");
  return layout == aoti_torch_layout_strided();
}

View view_of(const Tensor& t) {
  View v;
  v.tensor = &t;
  v.defined = t.defined();
  if (!v.defined) return v;
  v.cpu = t.is_cpu();
  v.dtype = dtype_code(t.scalar_type());
  v.sparse = !strided(t);
  v.contiguous = !v.sparse && t.is_contiguous();
  v.numel = t.numel();
  if (v.cpu && !v.sparse && v.numel) v.ptr = t.data_ptr();
  return v;
}

ViewList views(const TensorList& ts) { return amp_driver::views_of(ts, view_of); }

// An optional list's views (nullptr for None), alive while the op runs.
struct OptViews : amp_driver::OptionalViews {
  explicit OptViews(const std::optional<TensorList>& ts) : OptionalViews(ts, view_of) {}
};

// Device names as torch prints them (c10's DeviceTypeName is not part of the stable ABI).
std::string device_name(const View& v) {
  const torch::stable::Device d = tensor_of(v).device();
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

void parallel(int64_t n, void (*body)(int64_t, int64_t, void*), void* ctx) {
  torch::stable::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e, ctx); });
}

const amp_driver::Binding kBinding = {
    [](const View& v) { return std::string(torch::headeronly::toString(tensor_of(v).scalar_type())); },
    &device_name,
    [] { return static_cast<int64_t>(torch::stable::get_num_threads()); },
    &parallel,
};

// Runs an op body; an ArgError leaves as a runtime_error tagged with its Python type.
template <class F>
auto guarded(const F& f) -> decltype(f()) {
  try {
    return f();
  } catch (const amp_driver::ArgError& e) {
    throw std::runtime_error(std::string(e.type_error ? "[TypeError] " : "[ValueError] ") +
                             e.what());
  }
}

Tensor from_values(const std::vector<double>& xs, ScalarType dtype) {
  Tensor t = torch::stable::empty({static_cast<int64_t>(xs.size())}, ScalarType::Double);
  double* d = static_cast<double*>(t.data_ptr());
  for (size_t i = 0; i < xs.size(); ++i) d[i] = xs[i];
  return dtype == ScalarType::Double ? t : torch::stable::to(t, dtype);
}

// --- amp._C's ops ---------------------------------------------------------------------------

std::string isa() { return amp_driver::g_ops->name; }

void set_isa(std::string name) {
  guarded([&] { amp_driver::set_isa(name); });
}

// The ISAs this CPU runs, best last, comma-separated.
std::string supported_isas() {
  std::string out;
  for (const std::string& s : amp_driver::supported_isas()) out += (out.empty() ? "" : ",") + s;
  return out;
}

int64_t parallel_threads_seen() { return amp_ops::parallel_threads_seen(); }

bool scale(TensorList in, TensorList out, double s) {
  return guarded([&] { return amp_ops::scale(views(in), views(out), s); });
}

bool axpby(TensorList xs, TensorList ys, TensorList out, double a, double b,
           int64_t arg_to_check) {
  return guarded([&] {
    return amp_ops::axpby(views(xs), views(ys), views(out), a, b,
                          static_cast<int>(arg_to_check));
  });
}

// (norm, per-tensor norms as float64 (empty unless asked for), any non-finite).
std::tuple<double, Tensor, bool> l2norm(TensorList xs, double s, bool per_tensor) {
  return guarded([&] {
    const amp_ops::L2Norm r = amp_ops::l2norm(views(xs), s, per_tensor);
    return std::make_tuple(r.norm, from_values(r.per, ScalarType::Double), r.nonfinite);
  });
}

void adam(TensorList grads, TensorList params, TensorList exp_avgs, TensorList exp_avg_sqs,
          std::optional<TensorList> model_params, double lr, double beta1, double beta2,
          double eps, int64_t step, bool adam_w_mode, bool bias_correction, double weight_decay,
          double grad_scale) {
  guarded([&] {
    const OptViews half(model_params);
    amp_ops::adam(views(grads), views(params), views(exp_avgs), views(exp_avg_sqs), half.get(),
                  lr, beta1, beta2, eps, step, adam_w_mode, bias_correction, weight_decay,
                  grad_scale);
  });
}

void sgd(TensorList grads, TensorList params, std::optional<TensorList> momentum_buffers,
         std::optional<TensorList> model_params, double lr, double momentum, double dampening,
         double weight_decay, bool nesterov, bool wd_after_momentum, bool first_run,
         double grad_scale) {
  guarded([&] {
    const OptViews bufs(momentum_buffers), half(model_params);
    amp_ops::sgd(views(grads), views(params), bufs.get(), half.get(), lr, momentum, dampening,
                 weight_decay, nesterov, wd_after_momentum, first_run, grad_scale);
  });
}

Tensor lamb(TensorList grads, TensorList params, TensorList exp_avgs, TensorList exp_avg_sqs,
            std::optional<TensorList> model_params, double lr, double beta1, double beta2,
            double eps, int64_t step, bool bias_correction, double weight_decay,
            bool grad_averaging, bool adam_w_mode, bool use_nvlamb, double grad_scale) {
  return guarded([&] {
    const OptViews half(model_params);
    const std::vector<float> r = amp_ops::lamb(
        views(grads), views(params), views(exp_avgs), views(exp_avg_sqs), half.get(), lr,
        beta1, beta2, eps, step, bias_correction, weight_decay, grad_averaging, adam_w_mode,
        use_nvlamb, grad_scale);
    Tensor t = torch::stable::empty({static_cast<int64_t>(r.size())}, ScalarType::Float);
    float* d = static_cast<float*>(t.data_ptr());
    for (size_t i = 0; i < r.size(); ++i) d[i] = r[i];
    return t;
  });
}

std::tuple<double, bool> scale_l2norm(TensorList in, TensorList out, double s) {
  return guarded([&] {
    const amp_ops::NormFlag r = amp_ops::scale_l2norm(views(in), views(out), s);
    return std::make_tuple(r.norm, r.nonfinite);
  });
}

void adagrad(TensorList grads, TensorList params, TensorList sums,
             std::optional<TensorList> model_params, double lr, double eps, double weight_decay,
             bool w_mode, double grad_scale) {
  guarded([&] {
    const OptViews half(model_params);
    amp_ops::adagrad(views(grads), views(params), views(sums), half.get(), lr, eps,
                     weight_decay, w_mode, grad_scale);
  });
}

void novograd(TensorList grads, TensorList params, TensorList exp_avgs,
              std::optional<TensorList> model_params, Tensor grad_norms, double lr,
              double beta1, double beta2, double eps, int64_t step, bool bias_correction,
              double weight_decay, bool grad_averaging, int64_t moment_mode, int64_t norm_type,
              bool init_norms, double grad_scale) {
  guarded([&] {
    const OptViews half(model_params);
    amp_ops::novograd(views(grads), views(params), views(exp_avgs), half.get(),
                      view_of(grad_norms), lr, beta1, beta2, eps, step, bias_correction,
                      weight_decay, grad_averaging, moment_mode, norm_type, init_norms,
                      grad_scale);
  });
}

double limit_probe(TensorList grads, TensorList params, TensorList exp_avgs,
                   std::optional<TensorList> exp_avg_sqs, std::optional<TensorList> model_params,
                   int64_t passes) {
  return guarded([&] {
    const OptViews sqs(exp_avg_sqs), half(model_params);
    return amp_ops::limit_probe(views(grads), views(params), views(exp_avgs), sqs.get(),
                                half.get(), passes);
  });
}

}  // namespace

const amp_driver::Binding& amp_driver::binding() { return kBinding; }

// The schemas: the pybind11 module's argument names; mutated lists are not annotated, as the
// pybind11 module's are not visible to torch either (both write through data pointers).
STABLE_TORCH_LIBRARY(amp_C, m) {
  m.def("isa() -> str");
  m.def("set_isa(str name) -> ()");
  m.def("supported_isas() -> str");
  m.def("parallel_threads_seen() -> int");
  m.def("scale(Tensor[] inputs, Tensor[] outputs, float scale) -> bool");
  m.def("axpby(Tensor[] xs, Tensor[] ys, Tensor[] outputs, float a, float b, int arg_to_check)"
        " -> bool");
  m.def("l2norm(Tensor[] tensors, float scale, bool per_tensor) -> (float, Tensor, bool)");
  m.def("adam(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
        "Tensor[]? model_params, float lr, float beta1, float beta2, float eps, int step, "
        "bool adam_w_mode, bool bias_correction, float weight_decay, float grad_scale) -> ()");
  m.def("sgd(Tensor[] grads, Tensor[] params, Tensor[]? momentum_buffers, "
        "Tensor[]? model_params, float lr, float momentum, float dampening, float weight_decay, "
        "bool nesterov, bool wd_after_momentum, bool first_run, float grad_scale) -> ()");
  m.def("lamb(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
        "Tensor[]? model_params, float lr, float beta1, float beta2, float eps, int step, "
        "bool bias_correction, float weight_decay, bool grad_averaging, bool adam_w_mode, "
        "bool use_nvlamb, float grad_scale) -> Tensor");
  m.def("scale_l2norm(Tensor[] inputs, Tensor[] outputs, float scale) -> (float, bool)");
  m.def("adagrad(Tensor[] grads, Tensor[] params, Tensor[] sums, Tensor[]? model_params, "
        "float lr, float eps, float weight_decay, bool w_mode, float grad_scale) -> ()");
  m.def("novograd(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[]? model_params, "
        "Tensor grad_norms, float lr, float beta1, float beta2, float eps, int step, "
        "bool bias_correction, float weight_decay, bool grad_averaging, int moment_mode, "
        "int norm_type, bool init_norms, float grad_scale) -> ()");
  m.def("limit_probe(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, "
        "Tensor[]? exp_avg_sqs, Tensor[]? model_params, int passes) -> float");
}

// CompositeExplicitAutograd: one kernel for every device key, so a meta or CUDA tensor in a
// list reaches check_list and gets its clear error instead of "no kernel for Meta".
STABLE_TORCH_LIBRARY_IMPL(amp_C, CompositeExplicitAutograd, m) {
  m.impl("isa", TORCH_BOX(&isa));
  m.impl("set_isa", TORCH_BOX(&set_isa));
  m.impl("supported_isas", TORCH_BOX(&supported_isas));
  m.impl("parallel_threads_seen", TORCH_BOX(&parallel_threads_seen));
  m.impl("scale", TORCH_BOX(&scale));
  m.impl("axpby", TORCH_BOX(&axpby));
  m.impl("l2norm", TORCH_BOX(&l2norm));
  m.impl("adam", TORCH_BOX(&adam));
  m.impl("sgd", TORCH_BOX(&sgd));
  m.impl("lamb", TORCH_BOX(&lamb));
  m.impl("scale_l2norm", TORCH_BOX(&scale_l2norm));
  m.impl("adagrad", TORCH_BOX(&adagrad));
  m.impl("novograd", TORCH_BOX(&novograd));
  m.impl("limit_probe", TORCH_BOX(&limit_probe));
}

// --- the Python module ------------------------------------------------------------------------

namespace {
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "amp._C",
                       "amp._C: multi-tensor CPU kernels on torch's stable ABI (the functions "
                       "are set by amp.kernels.stable_binding over torch.ops.amp_C)",
                       -1, nullptr, nullptr, nullptr, nullptr, nullptr};

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
      PyModule_AddIntConstant(m, "chunk_size", static_cast<long>(amp_driver::kChunk)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  // The functions of the pybind11 module, then apex's multi_tensor_* entry points
  // (amp.kernels.apex_ops, the one place their conventions live).
  if (!install_from("amp.kernels.stable_binding", m) || !install_from("amp.kernels.apex_ops", m)) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
