// amp._C's functions over a binding's tensor type, written once for both bindings (the
// pybind11 one over ATen, bindings.cpp, and the stable-ABI one, bindings_stable.cpp). Each
// function turns the binding's tensors into Views (driver.h) and calls the shared op (ops.cpp);
// op_table.h has each one's schema. A binding supplies `B`:
//
//   using Tensor;                                   its tensor type
//   using Item;                                     a Tensor[]'s element (Tensor, or lighter)
//   static View view_of(const Tensor&), view_of(const Item&);   one tensor as a View
//   static auto call(F f);                          runs an op body (errors as the binding
//                                                   raises them)
//   static Tensor floats(const std::vector<float>&);     a float32 tensor of values
//   static PerNorms per_norms(const std::vector<double>&, bool asked);  l2norm's second result
//   static Isas isas(const std::vector<std::string>&);    supported_isas' result
//
// Lists are taken by const reference: TORCH_BOX unboxes into values and passes them on (a
// by-value parameter would copy every list once more per call), and pybind11's casters build
// the vectors either way.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "driver.h"

namespace amp_adaptor {

template <class B>
struct Ops {
  using Tensor = typename B::Tensor;
  using List = std::vector<typename B::Item>;
  using OptList = std::optional<List>;

  static amp_driver::ViewList views(const List& ts) {
    return amp_driver::views_of(ts, [](const auto& t) { return B::view_of(t); });
  }
  // An optional list's views (nullptr for None), alive while the op runs.
  struct Opt : amp_driver::OptionalViews {
    explicit Opt(const OptList& ts)
        : OptionalViews(ts, [](const auto& t) { return B::view_of(t); }) {}
  };

  static std::string isa() { return amp_driver::g_ops->name; }

  static void set_isa(std::string name) {
    B::call([&] { amp_driver::set_isa(name); });
  }

  static typename B::Isas supported_isas() { return B::isas(amp_driver::supported_isas()); }

  static int64_t _parallel_threads_seen() { return amp_ops::parallel_threads_seen(); }

  static int64_t _cache_bytes() { return amp_driver::last_level_cache_bytes(); }

  static bool scale(const List& in, const List& out, double s) {
    return B::call([&] { return amp_ops::scale(views(in), views(out), s); });
  }

  static bool axpby(const List& xs, const List& ys, const List& out, double a, double b,
                    int64_t arg_to_check) {
    return B::call([&] {
      return amp_ops::axpby(views(xs), views(ys), views(out), a, b,
                            static_cast<int>(arg_to_check));
    });
  }

  static std::tuple<double, typename B::PerNorms, bool> l2norm(const List& xs, double s,
                                                               bool per_tensor) {
    return B::call([&] {
      const amp_ops::L2Norm r = amp_ops::l2norm(views(xs), s, per_tensor);
      return std::make_tuple(r.norm, B::per_norms(r.per, per_tensor), r.nonfinite);
    });
  }

  static void adam(const List& grads, const List& params, const List& exp_avgs,
                   const List& exp_avg_sqs, const OptList& model_params, double lr, double beta1,
                   double beta2, double eps, int64_t step, bool adam_w_mode, bool bias_correction,
                   double weight_decay, double grad_scale) {
    B::call([&] {
      const Opt half(model_params);
      amp_ops::adam(views(grads), views(params), views(exp_avgs), views(exp_avg_sqs),
                    half.get(), lr, beta1, beta2, eps, step, adam_w_mode, bias_correction,
                    weight_decay, grad_scale);
    });
  }

  static void sgd(const List& grads, const List& params, const OptList& momentum_buffers,
                  const OptList& model_params, double lr, double momentum, double dampening,
                  double weight_decay, bool nesterov, bool wd_after_momentum, bool first_run,
                  double grad_scale) {
    B::call([&] {
      const Opt bufs(momentum_buffers), half(model_params);
      amp_ops::sgd(views(grads), views(params), bufs.get(), half.get(), lr, momentum,
                   dampening, weight_decay, nesterov, wd_after_momentum, first_run, grad_scale);
    });
  }

  static Tensor lamb(const List& grads, const List& params, const List& exp_avgs,
                     const List& exp_avg_sqs, const OptList& model_params, double lr, double beta1,
                     double beta2, double eps, int64_t step, bool bias_correction,
                     double weight_decay, bool grad_averaging, bool adam_w_mode, bool use_nvlamb,
                     double grad_scale) {
    return B::call([&] {
      const Opt half(model_params);
      return B::floats(amp_ops::lamb(
          views(grads), views(params), views(exp_avgs), views(exp_avg_sqs), half.get(), lr,
          beta1, beta2, eps, step, bias_correction, weight_decay, grad_averaging, adam_w_mode,
          use_nvlamb, grad_scale));
    });
  }

  static std::tuple<double, bool> scale_l2norm(const List& in, const List& out, double s) {
    return B::call([&] {
      const amp_ops::NormFlag r = amp_ops::scale_l2norm(views(in), views(out), s);
      return std::make_tuple(r.norm, r.nonfinite);
    });
  }

  static void adagrad(const List& grads, const List& params, const List& sums,
                      const OptList& model_params, double lr, double eps, double weight_decay,
                      bool w_mode, double grad_scale) {
    B::call([&] {
      const Opt half(model_params);
      amp_ops::adagrad(views(grads), views(params), views(sums), half.get(), lr, eps,
                       weight_decay, w_mode, grad_scale);
    });
  }

  static void novograd(const List& grads, const List& params, const List& exp_avgs,
                       const OptList& model_params, const Tensor& grad_norms, double lr,
                       double beta1, double beta2, double eps, int64_t step, bool bias_correction,
                       double weight_decay, bool grad_averaging, int64_t moment_mode,
                       int64_t norm_type, bool init_norms, double grad_scale) {
    B::call([&] {
      const Opt half(model_params);
      amp_ops::novograd(views(grads), views(params), views(exp_avgs), half.get(),
                        B::view_of(grad_norms), lr, beta1, beta2, eps, step, bias_correction,
                        weight_decay, grad_averaging, moment_mode, norm_type, init_norms,
                        grad_scale);
    });
  }

  static double _limit_probe(const List& grads, const List& params, const List& exp_avgs,
                             const OptList& exp_avg_sqs, const OptList& model_params,
                             int64_t passes) {
    return B::call([&] {
      const Opt sqs(exp_avg_sqs), half(model_params);
      return amp_ops::limit_probe(views(grads), views(params), views(exp_avgs), sqs.get(),
                                  half.get(), passes);
    });
  }
};

}  // namespace amp_adaptor
