// apex's low-level entry points, `amp_C.multi_tensor_*(chunk_size, noop_flag, tensor_lists,
// *args)`, on top of amp._C's ops: code written for apex's multi_tensor_applier runs
// unchanged. Conventions kept from apex:
//   * tensor_lists is a list of lists (grads, params, ...), in apex's order;
//   * noop_flag (a one-element tensor) is set to 1 when scale/axpby/l2norm meet a
//     non-finite value, never cleared; multi_tensor_sgd does nothing when it is already set;
//   * chunk_size is accepted and ignored: the CPU driver uses its own chunking.
#include "driver.h"

using namespace amp_driver;

namespace {

const TensorList& list_at(const std::vector<TensorList>& lists, size_t i, const char* op) {
  if (i >= lists.size())
    throw py::value_error(std::string("amp._C.") + op + ": tensor_lists has " +
                          std::to_string(lists.size()) + " lists; expected at least " +
                          std::to_string(i + 1));
  return lists[i];
}

void check_count(const std::vector<TensorList>& lists, size_t lo, size_t hi, const char* op) {
  if (lists.size() < lo || lists.size() > hi)
    throw py::value_error(std::string("amp._C.") + op + ": tensor_lists has " +
                          std::to_string(lists.size()) + " lists; expected " +
                          std::to_string(lo) + (hi > lo ? " or " + std::to_string(hi) : ""));
}

void raise_flag(const at::Tensor& noop_flag, bool overflow) {
  if (overflow) noop_flag.fill_(1);
}

bool flag_set(const at::Tensor& noop_flag) { return noop_flag.item<double>() != 0.0; }

std::optional<TensorList> optional_list(const std::vector<TensorList>& lists, size_t i) {
  if (i < lists.size()) return lists[i];
  return std::nullopt;
}

void mt_scale(int64_t, const at::Tensor& noop, const std::vector<TensorList>& lists, double s) {
  check_count(lists, 2, 2, "multi_tensor_scale");
  raise_flag(noop, amp_ops::scale(lists[0], lists[1], s));
}

void mt_axpby(int64_t, const at::Tensor& noop, const std::vector<TensorList>& lists, double a,
              double b, int arg_to_check) {
  check_count(lists, 3, 3, "multi_tensor_axpby");
  raise_flag(noop, amp_ops::axpby(lists[0], lists[1], lists[2], a, b, arg_to_check));
}

// (norm as a one-element float32 tensor, per-tensor norms as float32 or an empty tensor).
py::tuple l2norm_impl(const at::Tensor& noop, const std::vector<TensorList>& lists, double s,
                      std::optional<bool> per_tensor, const char* op) {
  check_count(lists, 1, 1, op);
  const bool per = per_tensor.value_or(false);
  py::tuple r = amp_ops::l2norm(list_at(lists, 0, op), s, per);
  raise_flag(noop, r[2].cast<bool>());
  at::Tensor norm = at::full({1}, r[0].cast<double>(), at::kFloat);
  at::Tensor per_norms = per ? r[1].cast<at::Tensor>().to(at::kFloat) : at::empty({0}, at::kFloat);
  return py::make_tuple(norm, per_norms);
}

py::tuple mt_l2norm(int64_t, const at::Tensor& noop, const std::vector<TensorList>& lists,
                    std::optional<bool> per_tensor) {
  return l2norm_impl(noop, lists, 1.0, per_tensor, "multi_tensor_l2norm");
}

py::tuple mt_unscale_l2norm(int64_t, const at::Tensor& noop,
                            const std::vector<TensorList>& lists, const at::Tensor& inv_scale,
                            std::optional<bool> per_tensor) {
  return l2norm_impl(noop, lists, inv_scale.item<double>(), per_tensor,
                     "multi_tensor_unscale_l2norm");
}

// mode 0: L2 added to the gradient (Adam), 1: decoupled decay (AdamW), as apex's ADAM_MODE.
void mt_adam(int64_t, const at::Tensor&, const std::vector<TensorList>& lists, double lr,
             double beta1, double beta2, double eps, int64_t step, int mode, int bias_correction,
             double weight_decay) {
  check_count(lists, 4, 5, "multi_tensor_adam");
  amp_ops::adam(lists[0], lists[1], lists[2], lists[3], optional_list(lists, 4), lr, beta1,
                beta2, eps, step, mode == 1, bias_correction != 0, weight_decay, 1.0);
}

void mt_sgd(int64_t, const at::Tensor& noop, const std::vector<TensorList>& lists, double wd,
            double momentum, double dampening, double lr, bool nesterov, bool first_run,
            bool wd_after_momentum, double scale) {
  check_count(lists, 3, 4, "multi_tensor_sgd");
  if (flag_set(noop)) return;  // apex's SGD skips the step once an overflow was flagged
  amp_ops::sgd(lists[0], lists[1], lists[2], optional_list(lists, 3), lr, momentum, dampening,
               wd, nesterov, wd_after_momentum, first_run, scale);
}

// apex clips the gradients by global_grad_norm / max_grad_norm when the norm exceeds it.
void mt_lamb(int64_t, const at::Tensor&, const std::vector<TensorList>& lists, double lr,
             double beta1, double beta2, double eps, int64_t step, int bias_correction,
             double weight_decay, int grad_averaging, int mode,
             const at::Tensor& global_grad_norm, double max_grad_norm,
             std::optional<bool> use_nvlamb) {
  check_count(lists, 4, 5, "multi_tensor_lamb");
  const double norm = global_grad_norm.item<double>();
  const double clip = max_grad_norm > 0 && norm > max_grad_norm ? norm / max_grad_norm : 1.0;
  amp_ops::lamb(lists[0], lists[1], lists[2], lists[3], optional_list(lists, 4), lr, beta1,
                beta2, eps, step, bias_correction != 0, weight_decay, grad_averaging != 0,
                mode == 1, use_nvlamb.value_or(false), 1.0 / clip);
}

void mt_adagrad(int64_t, const at::Tensor&, const std::vector<TensorList>& lists, double lr,
                double eps, int mode, double weight_decay) {
  check_count(lists, 3, 4, "multi_tensor_adagrad");
  amp_ops::adagrad(lists[0], lists[1], lists[2], optional_list(lists, 3), lr, eps,
                   weight_decay, mode == 1, 1.0);
}

void mt_novograd(int64_t, const at::Tensor&, const std::vector<TensorList>& lists,
                 const at::Tensor& grad_norms, double lr, double beta1, double beta2, double eps,
                 int64_t step, int bias_correction, double weight_decay, int grad_averaging,
                 int moment_mode, int norm_type) {
  check_count(lists, 3, 4, "multi_tensor_novograd");
  amp_ops::novograd(lists[0], lists[1], lists[2], optional_list(lists, 3), grad_norms, lr, beta1,
                    beta2, eps, step, bias_correction != 0, weight_decay, grad_averaging != 0,
                    moment_mode, norm_type, false, 1.0);
}

}  // namespace

void amp_driver::register_apex_api(py::module& m) {
  m.def("multi_tensor_scale", &mt_scale, "apex: (chunk_size, noop_flag, [in, out], scale)");
  m.def("multi_tensor_axpby", &mt_axpby,
        "apex: (chunk_size, noop_flag, [x, y, out], a, b, arg_to_check)");
  m.def("multi_tensor_l2norm", &mt_l2norm, py::arg("chunk_size"), py::arg("noop_flag"),
        py::arg("tensor_lists"), py::arg("per_tensor") = py::none(),
        "apex: (chunk_size, noop_flag, [x], per_tensor) -> (norm, per_tensor_norms)");
  m.def("multi_tensor_unscale_l2norm", &mt_unscale_l2norm, py::arg("chunk_size"),
        py::arg("noop_flag"), py::arg("tensor_lists"), py::arg("inv_scale"),
        py::arg("per_tensor") = py::none(),
        "apex: norm of x * inv_scale, x untouched");
  m.def("multi_tensor_adam", &mt_adam,
        "apex: (chunk_size, noop_flag, [g, p, m, v(, p_half)], lr, beta1, beta2, eps, step, "
        "mode, bias_correction, weight_decay)");
  m.def("multi_tensor_sgd", &mt_sgd, py::arg("chunk_size"), py::arg("noop_flag"),
        py::arg("tensor_lists"), py::arg("wd"), py::arg("momentum"), py::arg("dampening"),
        py::arg("lr"), py::arg("nesterov"), py::arg("first_run"),
        py::arg("wd_after_momentum"), py::arg("scale") = 1.0,
        "apex: (chunk_size, noop_flag, [g, p, mom(, p_half)], wd, momentum, dampening, lr, "
        "nesterov, first_run, wd_after_momentum, scale)");
  m.def("multi_tensor_lamb", &mt_lamb, py::arg("chunk_size"), py::arg("noop_flag"),
        py::arg("tensor_lists"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
        py::arg("eps"), py::arg("step"), py::arg("bias_correction"), py::arg("weight_decay"),
        py::arg("grad_averaging"), py::arg("mode"), py::arg("global_grad_norm"),
        py::arg("max_grad_norm"), py::arg("use_nvlamb") = py::none(),
        "apex: (chunk_size, noop_flag, [g, p, m, v(, p_half)], lr, beta1, beta2, eps, step, "
        "bias_correction, weight_decay, grad_averaging, mode, global_grad_norm, "
        "max_grad_norm, use_nvlamb)");
  m.def("multi_tensor_adagrad", &mt_adagrad,
        "apex: (chunk_size, noop_flag, [g, p, sum(, p_half)], lr, eps, mode, weight_decay)");
  m.def("multi_tensor_novograd", &mt_novograd,
        "apex: (chunk_size, noop_flag, [g, p, m(, p_half)], grad_norms, lr, beta1, beta2, eps, "
        "step, bias_correction, weight_decay, grad_averaging, moment_mode, norm_type)");
}
