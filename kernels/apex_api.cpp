// apex's low-level entry points, `amp_C.multi_tensor_*(chunk_size, noop_flag, tensor_lists,
// *args)`, on top of amp._C's ops: code written for apex's multi_tensor_applier runs
// unchanged. Conventions kept from apex:
//   * tensor_lists is a list of lists (grads, params, ...), in apex's order;
//   * noop_flag (a one-element tensor) is set to 1 when scale/axpby/l2norm meet a
//     non-finite value, never cleared; multi_tensor_sgd does nothing when it is already set;
//   * chunk_size is accepted and ignored: the CPU driver uses its own chunking.
// Torch-free like the ops: the bindings read the one-element tensors, raise the flag and
// build the result tensors.
#include "driver.h"

using namespace amp_driver;

namespace {

using amp_apex::Lists;

const ViewList& list_at(const Lists& lists, size_t i, const char* op) {
  if (i >= lists.size())
    value_error(std::string("amp._C.") + op + ": tensor_lists has " +
                std::to_string(lists.size()) + " lists; expected at least " +
                std::to_string(i + 1));
  return lists[i];
}

void check_count(const Lists& lists, size_t lo, size_t hi, const char* op) {
  if (lists.size() < lo || lists.size() > hi)
    value_error(std::string("amp._C.") + op + ": tensor_lists has " +
                std::to_string(lists.size()) + " lists; expected " + std::to_string(lo) +
                (hi > lo ? " or " + std::to_string(hi) : ""));
}

const ViewList* optional_list(const Lists& lists, size_t i) {
  return i < lists.size() ? &lists[i] : nullptr;
}

}  // namespace

namespace amp_apex {

bool scale(const Lists& lists, double s) {
  check_count(lists, 2, 2, "multi_tensor_scale");
  return amp_ops::scale(lists[0], lists[1], s);
}

bool axpby(const Lists& lists, double a, double b, int64_t arg_to_check) {
  check_count(lists, 3, 3, "multi_tensor_axpby");
  return amp_ops::axpby(lists[0], lists[1], lists[2], a, b, static_cast<int>(arg_to_check));
}

amp_ops::L2Norm l2norm(const Lists& lists, double s, bool per_tensor, const char* op) {
  check_count(lists, 1, 1, op);
  return amp_ops::l2norm(list_at(lists, 0, op), s, per_tensor);
}

// mode 0: L2 added to the gradient (Adam), 1: decoupled decay (AdamW), as apex's ADAM_MODE.
void adam(const Lists& lists, double lr, double beta1, double beta2, double eps, int64_t step,
          int64_t mode, int64_t bias_correction, double weight_decay) {
  check_count(lists, 4, 5, "multi_tensor_adam");
  amp_ops::adam(lists[0], lists[1], lists[2], lists[3], optional_list(lists, 4), lr, beta1,
                beta2, eps, step, mode == 1, bias_correction != 0, weight_decay, 1.0);
}

void sgd(const Lists& lists, bool flag_set, double wd, double momentum, double dampening,
         double lr, bool nesterov, bool first_run, bool wd_after_momentum, double scale) {
  check_count(lists, 3, 4, "multi_tensor_sgd");
  if (flag_set) return;  // apex's SGD skips the step once an overflow was flagged
  amp_ops::sgd(lists[0], lists[1], &lists[2], optional_list(lists, 3), lr, momentum, dampening,
               wd, nesterov, wd_after_momentum, first_run, scale);
}

// apex clips the gradients by global_grad_norm / max_grad_norm when the norm exceeds it.
void lamb(const Lists& lists, double lr, double beta1, double beta2, double eps, int64_t step,
          int64_t bias_correction, double weight_decay, int64_t grad_averaging, int64_t mode,
          double global_grad_norm, double max_grad_norm, bool use_nvlamb) {
  check_count(lists, 4, 5, "multi_tensor_lamb");
  const double norm = global_grad_norm;
  const double clip = max_grad_norm > 0 && norm > max_grad_norm ? norm / max_grad_norm : 1.0;
  amp_ops::lamb(lists[0], lists[1], lists[2], lists[3], optional_list(lists, 4), lr, beta1,
                beta2, eps, step, bias_correction != 0, weight_decay, grad_averaging != 0,
                mode == 1, use_nvlamb, 1.0 / clip);
}

void adagrad(const Lists& lists, double lr, double eps, int64_t mode, double weight_decay) {
  check_count(lists, 3, 4, "multi_tensor_adagrad");
  amp_ops::adagrad(lists[0], lists[1], lists[2], optional_list(lists, 3), lr, eps,
                   weight_decay, mode == 1, 1.0);
}

void novograd(const Lists& lists, const View& grad_norms, double lr, double beta1,
              double beta2, double eps, int64_t step, int64_t bias_correction,
              double weight_decay, int64_t grad_averaging, int64_t moment_mode,
              int64_t norm_type) {
  check_count(lists, 3, 4, "multi_tensor_novograd");
  amp_ops::novograd(lists[0], lists[1], lists[2], optional_list(lists, 3), grad_norms, lr, beta1,
                    beta2, eps, step, bias_correction != 0, weight_decay, grad_averaging != 0,
                    moment_mode, norm_type, false, 1.0);
}

}  // namespace amp_apex
