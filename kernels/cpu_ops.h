// Torch-free interface between the multi-tensor driver (bindings.cpp, which
// needs torch headers and is slow to compile) and the element-wise kernels
// (cpu_ops_impl.h, compiled once per instruction set in small, fast
// translation units and chosen at run time: a portable wheel cannot assume
// AVX2, and -march=native is never used for what ships).
#pragma once

#include <cstdint>

namespace amp_kernels {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// One tensor's storage: data pointer of element 0 and its element type. `stream` (set by
// the driver only on the half model copy, and only when the step's arrays exceed the
// last-level cache) writes it with non-temporal stores: the copy is write-only here, so a
// normal store would first read every line from memory (write-allocate) only to evict it.
struct Ref {
  void* ptr;
  int dtype;
  int stream = 0;
};

// Sum of squares of (x * scale) over a range and whether every value was finite.
struct NormPart {
  double sumsq;
  bool finite;
};

// Constants like 1 - beta1 are computed in double on the host and rounded once,
// as torch does with Python-float scalars: float(1 - 0.9) != 1.f - 0.9f.
struct AdamArgs {
  float lr, beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float decay;       // 1 - lr * weight_decay (decoupled mode)
  float step_size;   // lr / bias_correction1
  float inv_bc2_sqrt;  // 1 / sqrt(bias_correction2)
  float weight_decay;
  float grad_scale;  // inverse loss scale x clip coefficient, applied on load
  int adam_w_mode;   // 1: decoupled weight decay (AdamW), 0: L2 added to the gradient
};

struct SgdArgs {
  float lr, momentum, dampening, weight_decay;
  float one_minus_dampening;
  float grad_scale;
  int nesterov, wd_after_momentum, first_run;
};

struct LambArgs {
  float beta1, beta2, beta3, eps;
  float one_minus_beta2;
  float bc1, bc2;
  float weight_decay;
  float grad_scale;  // inverse loss scale / global clip ratio
  int adam_w_mode;
};

struct AdagradArgs {
  float lr, eps, weight_decay;
  float grad_scale;
  int w_mode;  // 1: decoupled weight decay, 0: L2 added to the gradient (torch.optim.Adagrad)
};

struct NovoGradArgs {
  float beta1, beta3, bc1;  // beta3: 1 - beta1 with grad averaging, else 1
  float lr, weight_decay;
  float grad_scale;
  int moment_mode;  // 0: regularisation inside the moment, 1: decoupled
};

// Each function works on elements [off, off + n) of the tensors it is given.
// A Ref with ptr == nullptr means "absent" (e.g. no half model copy to write).
struct OpsTable {
  const char* name;
  bool (*scale)(Ref in, Ref out, int64_t off, int64_t n, float s);
  bool (*axpby)(Ref x, Ref y, Ref out, int64_t off, int64_t n, float a, float b,
                int arg_to_check);
  NormPart (*sumsq)(Ref x, int64_t off, int64_t n, float s);
  void (*adam)(Ref g, Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n,
               const AdamArgs& a);
  void (*sgd)(Ref g, Ref p, Ref buf, Ref half, int64_t off, int64_t n, const SgdArgs& a);
  // Updates the moments; returns sum of squares of the update and of the param; keeps each
  // element's update in `keep[0, n)` when given (for lamb_apply).
  void (*lamb_stage1)(Ref g, Ref p, Ref m, Ref v, int64_t off, int64_t n,
                      const LambArgs& a, double* update_sumsq, double* param_sumsq,
                      float* keep);
  // Recomputes the update from the new moments and applies p -= ratio * update.
  void (*lamb_stage2)(Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n,
                      const LambArgs& a, float ratio);
  // p -= ratio * update, from the updates stage 1 kept (`u[0, n)`): the same bits.
  void (*lamb_apply)(Ref p, const float* u, Ref half, int64_t off, int64_t n, float ratio);
  // out = in * s; returns the sum of squares of out and whether it is finite.
  NormPart (*scale_sumsq)(Ref in, Ref out, int64_t off, int64_t n, float s);
  // max |x * s| (NaN if any value is non-finite).
  float (*absmax)(Ref x, int64_t off, int64_t n, float s);
  void (*adagrad)(Ref g, Ref p, Ref sum, Ref half, int64_t off, int64_t n,
                  const AdagradArgs& a);
  // `denom`: this tensor's norm / bias correction 2 + eps.
  void (*novograd)(Ref g, Ref p, Ref m, Ref half, int64_t off, int64_t n,
                   const NovoGradArgs& a, float denom);
  // The limit probe (benchmarks/optimizer_step.py): the ideal two-pass step's memory traffic
  // with trivial arithmetic. Pass 1 reads g (sum of squares, as the norm/non-finite pass);
  // pass 2 reads g, p, m, v and writes p, m, v (fp32) and the half copy when given.
  double (*probe_read)(Ref g, int64_t off, int64_t n);
  void (*probe_update)(Ref g, Ref p, Ref m, Ref v, Ref half, int64_t off, int64_t n);
};

const OpsTable& ops_generic();
const OpsTable& ops_avx2();
const OpsTable& ops_avx512();

}  // namespace amp_kernels
