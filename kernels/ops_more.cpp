// amp._C ops beyond the first six: the unscale-and-measure pass amp runs after backward
// (scale_l2norm), and the Adagrad and NovoGrad steps. Each is a per-chunk lambda over
// the shared driver (driver.h), like the ops in bindings.cpp.
#include "driver.h"

using namespace amp_driver;

namespace amp_ops {

// outputs[i] = inputs[i] * s; returns (L2 norm of the outputs, any non-finite). The outputs
// may be the inputs themselves (in-place unscale) or fp32 tensors of another dtype.
py::tuple scale_l2norm(const TensorList& in, const TensorList& out, double s) {
  const Checked ci = check_list(in, "inputs", nullptr);
  const Checked co = check_list(out, "outputs", &ci);
  int64_t total;
  const auto cs = make_chunks(ci.numels, &total);
  std::vector<NormPart> parts(cs.size());
  const float sf = static_cast<float>(s);
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    parts[k] = g_ops->scale_sumsq(ci.ref(c.tensor), co.ref(c.tensor), c.off, c.n, sf);
  });
  double sum = 0.0;
  bool finite = true;
  for (const NormPart& p : parts) {  // chunk order: independent of the thread count
    sum += p.sumsq;
    finite = finite && p.finite;
  }
  return py::make_tuple(std::sqrt(sum), !finite);
}

void adagrad(const TensorList& grads, const TensorList& params, const TensorList& sums,
             const std::optional<TensorList>& model_params, double lr, double eps,
             double weight_decay, bool w_mode, double grad_scale) {
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cs_ = check_list(sums, "sums", &cg);
  const Checked ch = check_optional(model_params, "model_params", cg);
  amp_kernels::AdagradArgs a{};
  a.lr = static_cast<float>(lr);
  a.eps = static_cast<float>(eps);
  a.weight_decay = static_cast<float>(weight_decay);
  a.grad_scale = static_cast<float>(grad_scale);
  a.w_mode = w_mode ? 1 : 0;
  int64_t total;
  const auto cs = make_chunks(cg.numels, &total);
  const bool stream = stream_half(step_bytes(total, {&cg, &cp, &cs_}, {&cp, &cs_, &ch}));
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->adagrad(cg.ref(t), cp.ref(t), cs_.ref(t), half_ref(ch, t, stream), c.off, c.n, a);
  });
}

// NovoGrad: a read pass measures each gradient's norm (L2: norm_type 2, max: norm_type 0),
// which is blended into `grad_norms` (float32, one per tensor, updated in place; apex's
// blend: L2 sqrt(b2 n_old^2 + (1-b2) n^2), max b2 n_old + (1-b2) n; `init_norms` sets them
// to this step's norms instead), then the update pass uses norm / bias correction 2 + eps.
void novograd(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
              const std::optional<TensorList>& model_params, const at::Tensor& grad_norms,
              double lr, double beta1, double beta2, double eps, int64_t step,
              bool bias_correction, double weight_decay, bool grad_averaging, int moment_mode,
              int norm_type, bool init_norms, double grad_scale) {
  if (step < 1) throw py::value_error("amp._C.novograd: step must be >= 1");
  if (norm_type != 0 && norm_type != 2)
    throw py::value_error("amp._C.novograd: norm_type must be 2 (L2) or 0 (max); got " +
                          std::to_string(norm_type));
  if (moment_mode != 0 && moment_mode != 1)
    throw py::value_error("amp._C.novograd: moment_mode must be 0 or 1");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cm = check_list(exp_avgs, "exp_avgs", &cg);
  const Checked ch = check_optional(model_params, "model_params", cg);
  const size_t nt = cg.numels.size();
  if (grad_norms.scalar_type() != at::kFloat || !grad_norms.device().is_cpu() ||
      !grad_norms.is_contiguous() || grad_norms.numel() != static_cast<int64_t>(nt))
    throw py::value_error("amp._C.novograd: grad_norms must be a contiguous float32 CPU tensor "
                          "with one element per tensor (" + std::to_string(nt) + ")");
  int64_t total;
  const auto cs = make_chunks(cg.numels, &total);
  const float gs = static_cast<float>(grad_scale);
  std::vector<double> part(cs.size());
  run_chunks(cs, total, [&](size_t k, const Chunk& c) {
    part[k] = norm_type == 2 ? g_ops->sumsq(cg.ref(c.tensor), c.off, c.n, gs).sumsq
                             : g_ops->absmax(cg.ref(c.tensor), c.off, c.n, gs);
  });
  std::vector<double> norm(nt, 0.0);
  for (size_t k = 0; k < cs.size(); ++k) {
    const double v = part[k];
    double& acc = norm[cs[k].tensor];
    acc = norm_type == 2 ? acc + v : (std::isnan(v) || v > acc ? v : acc);
  }
  float* gn = grad_norms.data_ptr<float>();
  const double bc1 = bias_correction ? 1.0 - std::pow(beta1, double(step)) : 1.0;
  const double bc2 = bias_correction ? std::sqrt(1.0 - std::pow(beta2, double(step))) : 1.0;
  std::vector<float> denom(nt);
  for (size_t t = 0; t < nt; ++t) {
    const double n = norm_type == 2 ? std::sqrt(norm[t]) : norm[t];
    double blended = n;
    if (!init_norms) {
      const double old = gn[t];
      blended = norm_type == 2 ? std::sqrt(beta2 * old * old + (1.0 - beta2) * n * n)
                               : beta2 * old + (1.0 - beta2) * n;
    }
    gn[t] = static_cast<float>(blended);
    denom[t] = static_cast<float>(gn[t] / bc2 + eps);
  }
  amp_kernels::NovoGradArgs a{};
  a.beta1 = static_cast<float>(beta1);
  a.beta3 = grad_averaging ? static_cast<float>(1.0 - beta1) : 1.f;
  a.bc1 = static_cast<float>(bc1);
  a.lr = static_cast<float>(lr);
  a.weight_decay = static_cast<float>(weight_decay);
  a.grad_scale = gs;
  a.moment_mode = moment_mode;
  const bool stream = stream_half(step_bytes(total, {&cg, &cp, &cm}, {&cp, &cm, &ch}));
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->novograd(cg.ref(t), cp.ref(t), cm.ref(t), half_ref(ch, t, stream), c.off, c.n, a,
                    denom[t]);
  });
}

// The limit probe (benchmarks/optimizer_step.py): the ideal two-pass step's memory traffic
// over these very tensors, with trivial arithmetic, as a yardstick for the real kernels.
// Unlike run_chunks it has no chunk list at all: each thread takes one contiguous share of
// all the elements (split at 64-byte multiples, tensors cut wherever a share ends), in one
// parallel region per pass. `passes`: 1 the read pass, 2 the update pass, 3 both in order.
// exp_avg_sqs may be None: the one-state pattern (Adagrad's sums, NovoGrad's exp_avg).
// Returns the read pass's sum of squares (so the compiler cannot drop it), else 0.
double limit_probe(const TensorList& grads, const TensorList& params, const TensorList& exp_avgs,
                   const std::optional<TensorList>& exp_avg_sqs,
                   const std::optional<TensorList>& model_params, int64_t passes) {
  if (passes < 1 || passes > 3) throw py::value_error("amp._C._limit_probe: passes is 1, 2 or 3");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, &kF32Only);
  const Checked cm = check_list(exp_avgs, "exp_avgs", &cg, &kF32Only);
  const Checked cv = exp_avg_sqs ? check_list(*exp_avg_sqs, "exp_avg_sqs", &cg, &kF32Only)
                                 : Checked{};
  const Checked ch = check_optional(model_params, "model_params", cg);
  const size_t ntensors = cg.numels.size();
  std::vector<int64_t> start(ntensors + 1, 0);  // first global element of each tensor
  for (size_t t = 0; t < ntensors; ++t) start[t + 1] = start[t] + cg.numels[t];
  const int64_t total = start[ntensors];
  const bool stream = stream_half(step_bytes(total, {&cg, &cp, &cm, &cv}, {&cp, &cm, &cv, &ch}));
  const int64_t nt = total < kSerialBelow ? 1 : std::max(1, at::get_num_threads());
  std::vector<double> part(nt, 0.0);
  // f(tensor, offset, count) over the pieces of thread w's share.
  auto share = [&](int64_t w, auto&& f) {
    const int64_t lo = total * w / nt / 16 * 16;
    const int64_t hi = w + 1 == nt ? total : total * (w + 1) / nt / 16 * 16;
    size_t t = std::upper_bound(start.begin(), start.end(), lo) - start.begin() - 1;
    for (int64_t pos = lo; pos < hi && t < ntensors; ++t) {
      const int64_t end = std::min(hi, start[t + 1]);
      if (end > pos) f(t, pos - start[t], end - pos);
      pos = std::max(pos, end);
    }
  };
  py::gil_scoped_release no_gil;
  if (passes & 1) {
    at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w)
        share(w, [&](size_t t, int64_t off, int64_t n) {
          part[w] += g_ops->probe_read(cg.ref(t), off, n);
        });
    });
  }
  if (passes & 2) {
    at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w)
        share(w, [&](size_t t, int64_t off, int64_t n) {
          g_ops->probe_update(cg.ref(t), cp.ref(t), cm.ref(t), ref_or_null(cv, t),
                              half_ref(ch, t, stream), off, n);
        });
      store_fence();
    });
  }
  double sum = 0.0;
  for (double x : part) sum += x;
  return sum;
}

}  // namespace amp_ops

void amp_driver::register_more_ops(py::module& m) {
  m.def("scale_l2norm", &amp_ops::scale_l2norm, py::arg("inputs"), py::arg("outputs"),
        py::arg("scale"),
        "outputs[i] = inputs[i] * scale; returns (norm of the outputs, any non-finite)");
  m.def("adagrad", &amp_ops::adagrad, py::arg("grads"), py::arg("params"), py::arg("sums"),
        py::arg("model_params"), py::arg("lr"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("w_mode"), py::arg("grad_scale"));
  m.def("novograd", &amp_ops::novograd, py::arg("grads"), py::arg("params"),
        py::arg("exp_avgs"), py::arg("model_params"), py::arg("grad_norms"), py::arg("lr"),
        py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("step"),
        py::arg("bias_correction"), py::arg("weight_decay"), py::arg("grad_averaging"),
        py::arg("moment_mode"), py::arg("norm_type"), py::arg("init_norms"),
        py::arg("grad_scale"));
  m.def("_limit_probe", &amp_ops::limit_probe, py::arg("grads"), py::arg("params"),
        py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("model_params"),
        py::arg("passes") = 3,
        "benchmark yardstick: the ideal step's memory traffic with trivial arithmetic "
        "(overwrites params and moments)");
}
