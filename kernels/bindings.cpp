// amp._C: apex's amp_C family of multi-tensor kernels for CPUs.
//
// One generic driver (`run_chunks`) splits every tensor of a model-sized list
// into fixed-size chunks and runs a small per-op lambda over the chunks with
// at::parallel_for (OpenMP: the module is compiled and linked with -fopenmp,
// so torch.set_num_threads governs it). The element-wise work lives in
// cpu_ops_impl.h, compiled per ISA and picked at import time.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cpu_ops.h"

#ifndef AMP_TORCH_VERSION
#define AMP_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;
using amp_kernels::NormPart;
using amp_kernels::OpsTable;
using amp_kernels::Ref;
using TensorList = std::vector<at::Tensor>;

namespace {

constexpr int64_t kChunk = 32 * 1024;        // elements per unit of parallel work
constexpr int64_t kSerialBelow = 64 * 1024;  // below this many elements, no threads

const OpsTable* g_ops = nullptr;

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

void set_isa(const std::string& name) {
  if (name == "generic") {
    g_ops = &amp_kernels::ops_generic();
  } else if (name == "avx2") {
    if (!cpu_has_avx2()) throw py::value_error("amp._C: this CPU lacks AVX2/FMA/F16C");
    g_ops = &amp_kernels::ops_avx2();
  } else if (name == "auto") {
    g_ops = cpu_has_avx2() ? &amp_kernels::ops_avx2() : &amp_kernels::ops_generic();
  } else {
    throw py::value_error("amp._C: unknown ISA '" + name + "' (expected auto, generic or avx2)");
  }
}

int dtype_code(const at::Tensor& t, const char* list, size_t i) {
  switch (t.scalar_type()) {
    case at::kFloat: return amp_kernels::kF32;
    case at::kHalf: return amp_kernels::kF16;
    case at::kBFloat16: return amp_kernels::kBF16;
    default:
      throw py::type_error(std::string("amp._C: ") + list + "[" + std::to_string(i) +
                           "] has dtype " + std::string(c10::toString(t.scalar_type())) +
                           "; expected float32, float16 or bfloat16");
  }
}

// A validated tensor list: element type, data pointers and sizes.
struct Checked {
  int dtype = -1;
  std::vector<void*> ptrs;
  std::vector<int64_t> numels;
  Ref ref(size_t i) const { return Ref{ptrs[i], dtype}; }
};

// Every list must be non-empty, on the CPU, contiguous, of one float dtype,
// and (for lists after the first) pair element-wise with `like` in size.
Checked check_list(const TensorList& ts, const char* name, const Checked* like,
                   const std::vector<int>* allowed = nullptr) {
  if (ts.empty()) throw py::value_error(std::string("amp._C: ") + name + " is an empty list");
  if (like && ts.size() != like->numels.size())
    throw py::value_error(std::string("amp._C: ") + name + " has " + std::to_string(ts.size()) +
                          " tensors; expected " + std::to_string(like->numels.size()) +
                          " (one per tensor of the first list)");
  Checked c;
  c.ptrs.reserve(ts.size());
  c.numels.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    // Built only on error: this loop runs for every tensor of a model on every step.
    auto where = [&] { return std::string("amp._C: ") + name + "[" + std::to_string(i) + "]"; };
    if (!t.defined()) throw py::value_error(where() + " is an undefined tensor");
    if (!t.device().is_cpu())
      throw py::value_error(where() + " is on " + t.device().str() +
                            "; the compiled kernels take CPU tensors only");
    const int code = dtype_code(t, name, i);
    if (c.dtype < 0) c.dtype = code;
    if (code != c.dtype)
      throw py::type_error(where() + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                           " but " + name + "[0] has another; one list must share one dtype");
    if (allowed && std::find(allowed->begin(), allowed->end(), code) == allowed->end())
      throw py::type_error(where() + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                           ", which is not allowed here");
    if (t.is_sparse()) throw py::value_error(where() + " is sparse; expected a dense tensor");
    if (!t.is_contiguous()) throw py::value_error(where() + " is not contiguous");
    if (like && t.numel() != like->numels[i])
      throw py::value_error(where() + " has " + std::to_string(t.numel()) + " elements; expected " +
                            std::to_string(like->numels[i]) + " to match the first list");
    c.ptrs.push_back(t.numel() ? t.data_ptr() : nullptr);
    c.numels.push_back(t.numel());
  }
  return c;
}

Checked check_optional(const std::optional<TensorList>& ts, const char* name,
                       const Checked& like) {
  if (!ts) return Checked{};
  static const std::vector<int> halves = {amp_kernels::kF16, amp_kernels::kBF16,
                                          amp_kernels::kF32};
  return check_list(*ts, name, &like, &halves);
}

Ref ref_or_null(const Checked& c, size_t i) {
  return c.ptrs.empty() ? Ref{nullptr, 0} : c.ref(i);
}

struct Chunk {
  int32_t tensor;
  int64_t off;
  int64_t n;
};

std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels, int64_t* total) {
  std::vector<Chunk> cs;
  int64_t sum = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t off = 0; off < numels[t]; off += kChunk)
      cs.push_back(Chunk{static_cast<int32_t>(t), off, std::min(kChunk, numels[t] - off)});
    sum += numels[t];
  }
  *total = sum;
  return cs;
}

// The multi-tensor driver: f(chunk_index, chunk) for every chunk, in parallel
// when there is enough work. Results that need reducing go into per-chunk
// slots and are summed in chunk order, so they do not depend on thread count.
template <class F>
void run_chunks(const std::vector<Chunk>& cs, int64_t total, const F& f) {
  if (total < kSerialBelow || cs.size() < 2) {
    for (size_t i = 0; i < cs.size(); ++i) f(i, cs[i]);
    return;
  }
  py::gil_scoped_release no_gil;
  at::parallel_for(0, static_cast<int64_t>(cs.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(static_cast<size_t>(i), cs[i]);
  });
}

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

const std::vector<int> kF32Only = {amp_kernels::kF32};

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
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->adam(cg.ref(t), cp.ref(t), cm.ref(t), cv.ref(t), ref_or_null(ch, t), c.off, c.n, a);
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
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->sgd(cg.ref(t), cp.ref(t), ref_or_null(cb, t), ref_or_null(ch, t), c.off, c.n, a);
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
  run_chunks(cs, total, [&](size_t, const Chunk& c) {
    const size_t t = c.tensor;
    g_ops->lamb_stage2(cp.ref(t), cm.ref(t), cv.ref(t), ref_or_null(ch, t), c.off, c.n, a, r[t]);
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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "amp._C: multi-tensor CPU kernels (scale, axpby, l2norm, adam, sgd, lamb)";
  const char* forced = std::getenv("AMP_KERNEL_ISA");
  set_isa(forced && *forced ? forced : "auto");
  m.attr("__torch_version__") = AMP_TORCH_VERSION;
  m.attr("chunk_size") = kChunk;
  m.def("isa", [] { return std::string(g_ops->name); }, "ISA of the kernels in use");
  m.def("_parallel_threads_seen", &parallel_threads_seen,
        "threads at::parallel_for used (a build check: OpenMP must be on)");
  m.def("set_isa", &set_isa, py::arg("name"), "Select kernels: 'auto', 'generic' or 'avx2'");
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
}
