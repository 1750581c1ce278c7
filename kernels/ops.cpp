// amp._C's ops, for both bindings: each validates its lists (driver.h's check_list), then
// runs a per-chunk lambda over the shared driver with the element-wise kernels of the ISA
// chosen at import (cpu_ops_impl.h). No torch header: this file compiles in seconds, once.
//
// The ops: scale, axpby, l2norm, adam, sgd, lamb; the unscale-and-measure pass amp runs
// after backward (scale_l2norm); the Adagrad and NovoGrad steps; the benchmark's limit probe.
#include <thread>

#include "driver.h"

using namespace amp_driver;

namespace amp_ops {
bool scale(const ViewList& in, const ViewList& out, double s) {
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

bool axpby(const ViewList& xs, const ViewList& ys, const ViewList& out, double a, double b,
           int arg_to_check) {
  if (arg_to_check < -1 || arg_to_check > 1)
    value_error("amp._C.axpby: arg_to_check must be -1 (both), 0 (x) or 1 (y)");
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
L2Norm l2norm(const ViewList& xs, double s, bool per_tensor) {
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
  if (per_tensor) {
    for (double& x : per) x = std::sqrt(x);
  } else {
    per.clear();
  }
  return L2Norm{std::sqrt(sum), std::move(per), !finite};
}

void adam(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
          const ViewList& exp_avg_sqs, const ViewList* model_params,
          double lr, double beta1, double beta2, double eps, int64_t step, bool adam_w_mode,
          bool bias_correction, double weight_decay, double grad_scale) {
  if (step < 1) value_error("amp._C.adam: step must be >= 1");
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

void sgd(const ViewList& grads, const ViewList& params,
         const ViewList* momentum_buffers,
         const ViewList* model_params, double lr, double momentum,
         double dampening, double weight_decay, bool nesterov, bool wd_after_momentum,
         bool first_run, double grad_scale) {
  if (momentum != 0.0 && !momentum_buffers)
    value_error("amp._C.sgd: momentum != 0 needs momentum_buffers");
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
std::vector<float> lamb(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
                const ViewList& exp_avg_sqs, const ViewList* model_params,
                double lr, double beta1, double beta2, double eps, int64_t step,
                bool bias_correction, double weight_decay, bool grad_averaging,
                bool adam_w_mode, bool use_nvlamb, double grad_scale) {
  if (step < 1) value_error("amp._C.lamb: step must be >= 1");
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
  const size_t nt = cg.numels.size();
  std::vector<double> un(nt, 0.0), pn(nt, 0.0);
  std::vector<float> ratios(nt);
  float* r = ratios.data();
  const bool trust = use_nvlamb || weight_decay != 0.0;
  auto ratios_of = [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      const double u = std::sqrt(un[t]), p = std::sqrt(pn[t]);
      r[t] = static_cast<float>(trust && u != 0.0 && p != 0.0 ? lr * (p / u) : lr);
    }
  };
  const bool stream = stream_half(step_bytes(total, {&cp, &cm, &cv}, {&cp, &ch}));
  // Stage 1 (the moments, and the squares of each tensor's update and param), the trust
  // ratios, stage 2 (the update scaled by its tensor's ratio), per group of whole tensors
  // that fits the cache (cache_groups): there stage 1 keeps each element's update in `kept`,
  // and stage 2 applies it from the cache instead of recomputing it from the moments (the
  // same values; LAMB's divisions and square root were half its time). A tensor larger than
  // the cache is its own group and recomputes, reading the moments again.
  const int64_t per_element = step_bytes(1, {&cg, &cp, &cm, &cv, &ch}, {}) + 4;
  thread_local std::vector<float> kept;  // a calling thread's updates, reused across steps
  size_t done = 0;  // tensors whose ratio is known
  cache_groups(cs, per_element, [&](size_t lo, size_t hi, int64_t elems, bool fits) {
    std::vector<int64_t> at;  // each chunk's place in `kept`
    if (fits) {
      if (kept.size() < static_cast<size_t>(elems)) kept.resize(elems);
      at.resize(hi - lo);
      int64_t pos = 0;
      for (size_t k = lo; k < hi; ++k) {
        at[k - lo] = pos;
        pos += cs[k].n;
      }
    }
    float* u = fits ? kept.data() : nullptr;
    run_chunk_range(cs, lo, hi, elems, [&](size_t k, const Chunk& c) {
      const size_t t = c.tensor;
      g_ops->lamb_stage1(cg.ref(t), cp.ref(t), cm.ref(t), cv.ref(t), c.off, c.n, a, &usq[k],
                         &psq[k], u ? u + at[k - lo] : nullptr);
    });
    for (size_t k = lo; k < hi; ++k) {  // each tensor's sums in chunk order
      un[cs[k].tensor] += usq[k];
      pn[cs[k].tensor] += psq[k];
    }
    const size_t end = static_cast<size_t>(cs[hi - 1].tensor) + 1;
    ratios_of(done, end);  // empty tensors before the group's end included
    done = end;
    run_chunk_range(cs, lo, hi, elems, [&](size_t k, const Chunk& c) {
      const size_t t = c.tensor;
      if (u)
        g_ops->lamb_apply(cp.ref(t), u + at[k - lo], half_ref(ch, t, stream), c.off, c.n, r[t]);
      else
        g_ops->lamb_stage2(cp.ref(t), cm.ref(t), cv.ref(t), half_ref(ch, t, stream), c.off,
                           c.n, a, r[t]);
    });
  });
  ratios_of(done, nt);  // empty tensors after the last chunk
  return ratios;
}

// How many distinct threads torch's parallel_for used for a 64-item loop: 1 would mean a
// serial build (a pybind11 module compiled without OpenMP runs at::parallel_for serially).
int64_t parallel_threads_seen() {
  std::vector<std::thread::id> ids(64);
  parallel_for(64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ids[i] = std::this_thread::get_id();
  });
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}




// outputs[i] = inputs[i] * s; returns (L2 norm of the outputs, any non-finite). The outputs
// may be the inputs themselves (in-place unscale) or fp32 tensors of another dtype.
NormFlag scale_l2norm(const ViewList& in, const ViewList& out, double s) {
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
  return NormFlag{std::sqrt(sum), !finite};
}

void adagrad(const ViewList& grads, const ViewList& params, const ViewList& sums,
             const ViewList* model_params, double lr, double eps,
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
void novograd(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
              const ViewList* model_params, const View& grad_norms,
              double lr, double beta1, double beta2, double eps, int64_t step,
              bool bias_correction, double weight_decay, bool grad_averaging, int64_t moment_mode,
              int64_t norm_type, bool init_norms, double grad_scale) {
  if (step < 1) value_error("amp._C.novograd: step must be >= 1");
  if (norm_type != 0 && norm_type != 2)
    value_error("amp._C.novograd: norm_type must be 2 (L2) or 0 (max); got " +
                          std::to_string(norm_type));
  if (moment_mode != 0 && moment_mode != 1)
    value_error("amp._C.novograd: moment_mode must be 0 or 1");
  const Checked cg = check_list(grads, "grads", nullptr);
  const Checked cp = check_list(params, "params", &cg, model_params ? &kF32Only : nullptr);
  const Checked cm = check_list(exp_avgs, "exp_avgs", &cg);
  const Checked ch = check_optional(model_params, "model_params", cg);
  const size_t nt = cg.numels.size();
  if (!grad_norms.defined || grad_norms.dtype != amp_kernels::kF32 || !grad_norms.cpu ||
      grad_norms.sparse || !grad_norms.contiguous ||
      grad_norms.numel != static_cast<int64_t>(nt))
    value_error("amp._C.novograd: grad_norms must be a contiguous float32 CPU tensor "
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
  float* gn = static_cast<float*>(grad_norms.ptr);
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
  a.moment_mode = static_cast<int>(moment_mode);
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
double limit_probe(const ViewList& grads, const ViewList& params, const ViewList& exp_avgs,
                   const ViewList* exp_avg_sqs,
                   const ViewList* model_params, int64_t passes) {
  if (passes < 1 || passes > 3) value_error("amp._C._limit_probe: passes is 1, 2 or 3");
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
  const int64_t nt = total < kSerialBelow ? 1 : std::max<int64_t>(1, num_threads());
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
    if (passes & 1) {
    parallel_for(nt, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w)
        share(w, [&](size_t t, int64_t off, int64_t n) {
          part[w] += g_ops->probe_read(cg.ref(t), off, n);
        });
    });
  }
  if (passes & 2) {
    parallel_for(nt, [&](int64_t b, int64_t e) {
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
