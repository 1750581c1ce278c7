// amp._C: apex's amp_C family of multi-tensor kernels for CPUs.
//
// One generic driver (`run_chunks`) splits every tensor of a model-sized list
// into fixed-size chunks and runs a small per-op lambda over the chunks with
// at::parallel_for (OpenMP: the module is compiled and linked with -fopenmp,
// so torch.set_num_threads governs it). The element-wise work lives in
// cpu_ops_impl.h, compiled per ISA and picked at import time.
#include "driver.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif

using namespace amp_driver;

// The ops, in a named namespace: apex_api.cpp re-exposes them with apex's signatures.
namespace amp_ops {

bool scale(const TensorList& in, const TensorList& out, double s) {
  const Checked ci = check_list(in, "inputs", nullptr);
  const Checked co = check_list(out, "outputs", &ci);
  int64_t total;
  const auto cs = make_chunks(ci.numels, &total);
  std::vector<char> ok(cs.size(), 1);
  const float sf = static_cast<float>(s);
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    ok[k] = g_ops->scale(ci.ref(c.tensor), co.ref(c.tensor), c.off, c.n, sf);
  });
  return std::find(ok.begin(), ok.end(), 0) != ok.end();
}

bool axpby(const TensorList& xs, const TensorList& ys, const TensorList& out, double a, double b,
           int arg_to_check) {
  if (arg_to_check < -1 || arg_to_check > 1)
    throw py::value_error("amp._C.axpby: arg_to_check must be -1 (both), 0 (x) or 1 (y)");
  const Checked cx = check_list(xs, "xs", nullptr);
  const Checked cy = check_list(ys, "ys", &cx);
  const Checked co = check_list(out, "outputs", &cx);
  int64_t total;
  const auto cs = make_chunks(cx.numels, &total);
  std::vector<char> ok(cs.size(), 1);
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    ok[k] = g_ops->axpby(cx.ref(c.tensor), cy.ref(c.tensor), co.ref(c.tensor), c.off, c.n,
                         static_cast<float>(a), static_cast<float>(b), arg_to_check);
  });
  return std::find(ok.begin(), ok.end(), 0) != ok.end();
}

// Returns (global L2 norm of x*s, per-tensor norms as a float64 tensor or None,
// whether any x*s was non-finite).
py::tuple l2norm(const TensorList& xs, double s, bool per_tensor) {
  const Checked cx = check_list(xs, "tensors", nullptr);
  int64_t total;
  const auto cs = make_chunks(cx.numels, &total);
  std::vector<NormPart> parts(cs.size());
  const float sf = static_cast<float>(s);
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    parts[k] = g_ops->sumsq(cx.ref(c.tensor), c.off, c.n, sf);
  });
  double sum = 0.0;
  bool finite = true;
  std::vector<double> per(cx.numels.size(), 0.0);
  for (size_t k = 0; k < cs.size(); ++k) {
    sum += parts[k].sumsq;
    per[cs[k].tensor] += parts[k].sumsq;
    finite = finite && parts[k].finite;
  }
  py::object per_obj = py::none();
  if (per_tensor) {
    at::Tensor t = at::empty({static_cast<int64_t>(per.size())}, at::kDouble);
    double* d = t.data_ptr<double>();
    for (size_t i = 0; i < per.size(); ++i) d[i] = std::sqrt(per[i]);
    per_obj = py::cast(t);
  }
  return py::make_tuple(std::sqrt(sum), per_obj, !finite);
}

void adam(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
          const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
          double lr, double beta1, double beta2, double eps, int64_t step, bool adam_w_mode,
          bool bias_correction, double weight_decay, double grad_scale) {
  if (step < 1) throw py::value_error("amp._C.adam: step must be >= 1");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cm = check_list(exp_avgs, "exp_avgs", &cg);
  const Checked cv = check_list(exp_avg_sqs, "exp_avg_sqs", &cg);
  const Checked ch = check_optional(model_params, "model_params", cg);
  const double bc1 = bias_correction ? 1.0 - std::pow(beta1, static_cast<double>(step)) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(beta2, static_cast<double>(step)) : 1.0;
  amp_kernels::AdamArgs a{};
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.eps = static_cast<float>(eps);
  a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.decay = static_cast<float>(1.0 - lr * weight_decay);
  a.step_size = static_cast<float>(lr / bc1);
  a.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  a.weight_decay = static_cast<float>(weight_decay);
  a.grad_scale = static_cast<float>(grad_scale);
  a.adam_w_mode = adam_w_mode ? 1 : 0;
  int64_t total;
  const auto cs = make_chunks(cg.numels, &total);
  const bool stream = stream_half(step_bytes(total, {&cg, &cp, &cm, &cv}, {&cp, &cm, &cv, &ch}));
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->adam(cg.ref(t), cp.ref(t), cm.ref(t), cv.ref(t), half_ref(ch, t, stream), c.off, c.n,
                a);
  });
}

void sgd(const TensorList& grads, const TensorList& params,
         const std::optional<TensorList>& momentum_buffers,
         const std::optional<TensorList>& model_params, double lr, double momentum,
         double dampening, double weight_decay, bool nesterov, bool wd_after_momentum,
         bool first_run, double grad_scale) {
  if (momentum != 0.0 && !momentum_buffers)
    throw py::value_error("amp._C.sgd: momentum != 0 needs momentum_buffers");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cb = momentum != 0.0 ? check_optional(momentum_buffers, "momentum_buffers", cg)
                                     : Checked{};
  const Checked ch = check_optional(model_params, "model_params", cg);
  amp_kernels::SgdArgs a{};
  a.lr = static_cast<float>(lr);
  a.momentum = static_cast<float>(momentum);
  a.dampening = static_cast<float>(dampening);
  a.one_minus_dampening = static_cast<float>(1.0 - dampening);
  a.weight_decay = static_cast<float>(weight_decay);
  a.grad_scale = static_cast<float>(grad_scale);
  a.nesterov = nesterov;
  a.wd_after_momentum = wd_after_momentum;
  a.first_run = first_run;
  int64_t total;
  const auto cs = make_chunks(cg.numels, &total);
  const bool stream = stream_half(step_bytes(total, {&cg, &cp, &cb}, {&cp, &cb, &ch}));
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->sgd(cg.ref(t), cp.ref(t), ref_or_null(cb, t), half_ref(ch, t, stream), c.off, c.n,
               a);
  });
}

// One LAMB step. `grad_scale` already folds in the inverse loss scale and the
// global clip ratio. Returns the per-tensor trust ratios applied (for tests).
at::Tensor lamb(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
                const TensorList& exp_avg_sqs, const std::optional<TensorList>& model_params,
                double lr, double beta1, double beta2, double eps, int64_t step,
                bool bias_correction, double weight_decay, bool grad_averaging,
                bool adam_w_mode, bool use_nvlamb, double grad_scale) {
  if (step < 1) throw py::value_error("amp._C.lamb: step must be >= 1");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cm = check_list(exp_avgs, "exp_avgs", &cg);
  const Checked cv = check_list(exp_avg_sqs, "exp_avg_sqs", &cg);
  const Checked ch = check_optional(model_params, "model_params", cg);
  amp_kernels::LambArgs a{};
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.beta3 = grad_averaging ? static_cast<float>(1.0 - beta1) : 1.f;
  a.eps = static_cast<float>(eps);
  a.bc1 = bias_correction ? static_cast<float>(1.0 - std::pow(beta1, double(step))) : 1.f;
  a.bc2 = bias_correction ? static_cast<float>(1.0 - std::pow(beta2, double(step))) : 1.f;
  a.weight_decay = static_cast<float>(weight_decay);
  a.grad_scale = static_cast<float>(grad_scale);
  a.adam_w_mode = adam_w_mode ? 1 : 0;
  int64_t total;
  const auto cs = make_chunks(cg.numels, &total);
  std::vector<double> usq(cs.size()), psq(cs.size());
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->lamb_stage1(cg.ref(t), cp.ref(t), cm.ref(t), cv.ref(t), c.off, c.n, a, &usq[k],
                       &psq[k]);
  });
  const size_t nt = cg.numels.size();
  std::vector<double> un(nt, 0.0), pn(nt, 0.0);
  for (size_t k = 0; k < cs.size(); ++k) {
    un[cs[k].tensor] += usq[k];
    pn[cs[k].tensor] += psq[k];
  }
  at::Tensor ratios = at::empty({static_cast<int64_t>(nt)}, at::kFloat);
  float* r = ratios.data_ptr<float>();
  for (size_t t = 0; t < nt; ++t) {
    const double u = std::sqrt(un[t]), p = std::sqrt(pn[t]);
    const bool trust = use_nvlamb || weight_decay != 0.0;
    r[t] = static_cast<float>(trust && u != 0.0 && p != 0.0 ? lr * (p / u) : lr);
  }
  const bool stream = stream_half(step_bytes(total, {&cp, &cm, &cv}, {&cp, &ch}));
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->lamb_stage2(cp.ref(t), cm.ref(t), cv.ref(t), half_ref(ch, t, stream), c.off, c.n, a,
                       r[t]);
  });
  return ratios;
}

// How many distinct threads at::parallel_for used for a 64-item loop: 1 would mean the
// module was compiled without OpenMP (then at::parallel_for silently runs serially).
int64_t parallel_threads_seen() {
  std::vector<int> seen(64, -1);
  at::parallel_for(0, 64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) seen[i] = at::get_thread_num();
  });
  std::sort(seen.begin(), seen.end());
  return std::unique(seen.begin(), seen.end()) - seen.begin();
}

}  // namespace amp_ops

using namespace amp_ops;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "amp._C: multi-tensor CPU kernels (scale, axpby, l2norm, adam, sgd, lamb, adagrad, "
            "novograd; apex's multi_tensor_* entry points)";
  // AMP_KERNEL_ISA forces a build (tests, benchmarks); one this CPU cannot run, or a
  // misspelt name, must not make the import fail: auto is used, and amp._ext warns with
  // the reason kept in _isa_note.
  std::string note;
  const char* forced = std::getenv("AMP_KERNEL_ISA");
  try {
    set_isa(forced && *forced ? forced : "auto");
  } catch (const std::exception& e) {
    note = e.what();
    set_isa("auto");
  }
  m.attr("_isa_note") = note;
  m.attr("__torch_version__") = AMP_TORCH_VERSION;
  m.attr("chunk_size") = kChunk;
  m.def("isa", [] { return std::string(g_ops->name); }, "ISA of the kernels in use");
  m.def("_parallel_threads_seen", &parallel_threads_seen,
        "threads at::parallel_for used (a build check: OpenMP must be on)");
  m.def("set_isa", &set_isa, py::arg("name"),
        "Select kernels: 'auto', 'generic', 'avx2' or 'avx512'");
  m.def("supported_isas", &supported_isas, "The kernel builds this CPU can run, best last");
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
  register_more_ops(m);
  register_apex_api(m);
}
