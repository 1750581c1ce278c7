// amp._C through pybind11 over ATen: the binding for torch < 2.10 (no stable C ABI there)
// and for Python 3.9 (below the abi3 floor of bindings_stable.cpp). setup.py compiles exactly
// one of the two bindings with the shared ops (ops.cpp) and kernels; apex's multi_tensor_*
// entry points are amp.kernels.apex_ops' (Python: they serve every device), installed at import.
//
// apex's amp_C family of multi-tensor kernels for CPUs: one generic driver (`run_chunks`,
// driver.h) splits every tensor of a model-sized list into fixed-size chunks and runs a small
// per-op lambda over the chunks with at::parallel_for (OpenMP: this module is compiled and
// linked with -fopenmp, so torch.set_num_threads governs it). The element-wise work lives in
// cpu_ops_impl.h, compiled per ISA and picked at import time.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <optional>

#include "driver.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;
using amp_driver::View;
using amp_driver::ViewList;
using TensorList = std::vector<at::Tensor>;

namespace {

const at::Tensor& tensor_of(const View& v) { return *static_cast<const at::Tensor*>(v.tensor); }

int dtype_code(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return amp_kernels::kF32;
    case at::kHalf: return amp_kernels::kF16;
    case at::kBFloat16: return amp_kernels::kBF16;
    default: return -1;
  }
}

View view_of(const at::Tensor& t) {
  View v;
  v.tensor = &t;
  v.defined = t.defined();
  if (!v.defined) return v;
  v.cpu = t.device().is_cpu();
  v.dtype = dtype_code(t.scalar_type());
  v.sparse = t.is_sparse();
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

void parallel(int64_t n, void (*body)(int64_t, int64_t, void*), void* ctx) {
  py::gil_scoped_release no_gil;
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(b, e, ctx); });
}

const amp_driver::Binding kBinding = {
    [](const View& v) { return std::string(c10::toString(tensor_of(v).scalar_type())); },
    [](const View& v) { return tensor_of(v).device().str(); },
    [] { return static_cast<int64_t>(at::get_num_threads()); },
    &parallel,
};

at::Tensor double_tensor(const std::vector<double>& xs) {
  at::Tensor t = at::empty({static_cast<int64_t>(xs.size())}, at::kDouble);
  std::copy(xs.begin(), xs.end(), t.data_ptr<double>());
  return t;
}

// --- amp._C's ops ---------------------------------------------------------------------------

bool scale(const TensorList& in, const TensorList& out, double s) {
  return amp_ops::scale(views(in), views(out), s);
}

bool axpby(const TensorList& xs, const TensorList& ys, const TensorList& out, double a, double b,
           int arg_to_check) {
  return amp_ops::axpby(views(xs), views(ys), views(out), a, b, arg_to_check);
}

// (global L2 norm of x*s, per-tensor norms as a float64 tensor or None, any x*s non-finite).
py::tuple l2norm(const TensorList& xs, double s, bool per_tensor) {
  const amp_ops::L2Norm r = amp_ops::l2norm(views(xs), s, per_tensor);
  py::object per = per_tensor ? py::cast(double_tensor(r.per)) : py::none();
  return py::make_tuple(r.norm, per, r.nonfinite);
}

void adam(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
          const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
          double lr, double beta1, double beta2, double eps, int64_t step, bool adam_w_mode,
          bool bias_correction, double weight_decay, double grad_scale) {
  const OptViews half(model_params);
  amp_ops::adam(views(grads), views(params), views(exp_avgs), views(exp_avg_sqs), half.get(),
                lr, beta1, beta2, eps, step, adam_w_mode, bias_correction, weight_decay,
                grad_scale);
}

void sgd(const TensorList& grads, const TensorList& params,
         const std::optional<TensorList>& momentum_buffers,
         const std::optional<TensorList>& model_params, double lr, double momentum,
         double dampening, double weight_decay, bool nesterov, bool wd_after_momentum,
         bool first_run, double grad_scale) {
  const OptViews bufs(momentum_buffers), half(model_params);
  amp_ops::sgd(views(grads), views(params), bufs.get(), half.get(), lr, momentum, dampening,
               weight_decay, nesterov, wd_after_momentum, first_run, grad_scale);
}

// Returns the per-tensor trust ratios applied (for tests).
at::Tensor lamb(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
                double lr, double beta1, double beta2, double eps, int64_t step,
                bool bias_correction, double weight_decay, bool grad_averaging,
                bool adam_w_mode, bool use_nvlamb, double grad_scale) {
  const OptViews half(model_params);
  const std::vector<float> r = amp_ops::lamb(
      views(grads), views(params), views(exp_avgs), views(exp_avg_sqs), half.get(), lr, beta1,
      beta2, eps, step, bias_correction, weight_decay, grad_averaging, adam_w_mode, use_nvlamb,
      grad_scale);
  at::Tensor t = at::empty({static_cast<int64_t>(r.size())}, at::kFloat);
  std::copy(r.begin(), r.end(), t.data_ptr<float>());
  return t;
}

// outputs[i] = inputs[i] * s; returns (L2 norm of the outputs, any non-finite).
py::tuple scale_l2norm(const TensorList& in, const TensorList& out, double s) {
  const amp_ops::NormFlag r = amp_ops::scale_l2norm(views(in), views(out), s);
  return py::make_tuple(r.norm, r.nonfinite);
}

void adagrad(const TensorList& grads, const TensorList& params, const TensorList& sums,
             const std::optional<TensorList>& model_params, double lr, double eps,
             double weight_decay, bool w_mode, double grad_scale) {
  const OptViews half(model_params);
  amp_ops::adagrad(views(grads), views(params), views(sums), half.get(), lr, eps, weight_decay,
                   w_mode, grad_scale);
}

void novograd(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
              const std::optional<TensorList>& model_params, const at::Tensor& grad_norms,
              double lr, double beta1, double beta2, double eps, int64_t step,
              bool bias_correction, double weight_decay, bool grad_averaging, int moment_mode,
              int norm_type, bool init_norms, double grad_scale) {
  const OptViews half(model_params);
  amp_ops::novograd(views(grads), views(params), views(exp_avgs), half.get(),
                    view_of(grad_norms), lr, beta1, beta2, eps, step, bias_correction,
                    weight_decay, grad_averaging, moment_mode, norm_type, init_norms,
                    grad_scale);
}

double limit_probe(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
                   const std::optional<TensorList>& exp_avg_sqs,
                   const std::optional<TensorList>& model_params, int64_t passes) {
  const OptViews sqs(exp_avg_sqs), half(model_params);
  return amp_ops::limit_probe(views(grads), views(params), views(exp_avgs), sqs.get(),
                              half.get(), passes);
}

}  // namespace

const amp_driver::Binding& amp_driver::binding() { return kBinding; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "amp._C: multi-tensor CPU kernels (scale, axpby, l2norm, adam, sgd, lamb, adagrad, "
            "novograd; apex's multi_tensor_* entry points from amp.kernels.apex_ops)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const amp_driver::ArgError& e) {
      PyErr_SetString(e.type_error ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });
  m.attr("_isa_note") = amp_driver::init_isa();
  m.attr("__torch_version__") = AMP_TORCH_VERSION;
  m.attr("__torch_abi__") = "unstable";  // loads into the torch it was built against only
  m.attr("chunk_size") = amp_driver::kChunk;
  m.def("isa", [] { return std::string(amp_driver::g_ops->name); }, "ISA of the kernels in use");
  m.def("_parallel_threads_seen", &amp_ops::parallel_threads_seen,
        "threads at::parallel_for used (a build check: OpenMP must be on)");
  m.def("set_isa", &amp_driver::set_isa, py::arg("name"),
        "Select kernels: 'auto', 'generic', 'avx2' or 'avx512'");
  m.def("supported_isas", &amp_driver::supported_isas,
        "The kernel builds this CPU can run, best last");
  m.def("scale", &scale, py::arg("inputs"), py::arg("outputs"), py::arg("scale"),
        "outputs[i] = inputs[i] * scale; returns True if any result is non-finite");
  m.def("axpby", &axpby, py::arg("xs"), py::arg("ys"), py::arg("outputs"), py::arg("a"),
        py::arg("b"), py::arg("arg_to_check") = -1,
        "outputs[i] = a*xs[i] + b*ys[i]; returns True if a checked input is non-finite");
  m.def("l2norm", &l2norm, py::arg("tensors"), py::arg("scale") = 1.0,
        py::arg("per_tensor") = false,
        "(norm of all tensors*scale, per-tensor norms or None, any non-finite)");
  m.def("adam", &adam, py::arg("grads"), py::arg("params"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::arg("model_params"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("step"), py::arg("adam_w_mode"),
        py::arg("bias_correction"), py::arg("weight_decay"), py::arg("grad_scale"));
  m.def("sgd", &sgd, py::arg("grads"), py::arg("params"), py::arg("momentum_buffers"),
        py::arg("model_params"), py::arg("lr"), py::arg("momentum"), py::arg("dampening"),
        py::arg("weight_decay"), py::arg("nesterov"), py::arg("wd_after_momentum"),
        py::arg("first_run"), py::arg("grad_scale"));
  m.def("lamb", &lamb, py::arg("grads"), py::arg("params"), py::arg("exp_avgs"),
        py::arg("exp_avg_sqs"), py::arg("model_params"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("step"), py::arg("bias_correction"),
        py::arg("weight_decay"), py::arg("grad_averaging"), py::arg("adam_w_mode"),
        py::arg("use_nvlamb"), py::arg("grad_scale"));
  m.def("scale_l2norm", &scale_l2norm, py::arg("inputs"), py::arg("outputs"),
        py::arg("scale"),
        "outputs[i] = inputs[i] * scale; returns (norm of the outputs, any non-finite)");
  m.def("adagrad", &adagrad, py::arg("grads"), py::arg("params"), py::arg("sums"),
        py::arg("model_params"), py::arg("lr"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("w_mode"), py::arg("grad_scale"));
  m.def("novograd", &novograd, py::arg("grads"), py::arg("params"),
        py::arg("exp_avgs"), py::arg("model_params"), py::arg("grad_norms"), py::arg("lr"),
        py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("step"),
        py::arg("bias_correction"), py::arg("weight_decay"), py::arg("grad_averaging"),
        py::arg("moment_mode"), py::arg("norm_type"), py::arg("init_norms"),
        py::arg("grad_scale"));
  m.def("_limit_probe", &limit_probe, py::arg("grads"), py::arg("params"),
        py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("model_params"),
        py::arg("passes") = 3,
        "benchmark yardstick: the ideal step's memory traffic with trivial arithmetic "
        "(overwrites params and moments)");
  // apex's multi_tensor_* entry points: amp.kernels.apex_ops, the one place their conventions live.
  py::module_::import("amp.kernels.apex_ops").attr("install")(m);
}
