// amp._C's functions, each declared once: its schema (names, types, defaults, results) and its
// docstring. The stable binding registers these schemas with torch's dispatcher, and
// amp.kernels.stable_binding makes the Python functions from the registered ones; the pybind11
// binding takes each function's argument names and defaults from the same schema. What a
// function does is written once too, in adaptor.h, over either binding's tensor type.
//
// Schemas are torch's function schema language; the pybind11 binding reads the arguments only
// (one `Type name` or `Type name=default` per comma, defaults int/float/bool), so keep to that.
// Mutated lists are not annotated (`Tensor(a!)[]`): both bindings write through data pointers,
// which torch does not see either way. The stable ops return what the dispatcher can carry: a
// comma-joined string for supported_isas (a list in Python) and an empty tensor for l2norm's
// per-tensor norms when not asked for (None in Python); stable_binding makes them Python's.
#pragma once

#define AMP_C_OPS(X)                                                                           \
  X(isa, "isa() -> str", "ISA of the kernels in use")                                          \
  X(set_isa, "set_isa(str name) -> ()",                                                        \
    "Select kernels: 'auto', 'generic', 'avx2' or 'avx512'")                                   \
  X(supported_isas, "supported_isas() -> str", "The kernel builds this CPU can run, best last") \
  X(_parallel_threads_seen, "_parallel_threads_seen() -> int",                                 \
    "threads torch's parallel_for used (a build check: the loop must be parallel)")            \
  X(_cache_bytes, "_cache_bytes() -> int",                                                     \
    "the last-level cache the kernels size their stores by (sysfs, else sysconf), in bytes")   \
  X(scale, "scale(Tensor[] inputs, Tensor[] outputs, float scale) -> bool",                    \
    "outputs[i] = inputs[i] * scale; returns True if any result is non-finite")                \
  X(axpby,                                                                                     \
    "axpby(Tensor[] xs, Tensor[] ys, Tensor[] outputs, float a, float b, "                     \
    "int arg_to_check=-1) -> bool",                                                            \
    "outputs[i] = a*xs[i] + b*ys[i]; returns True if a checked input is non-finite")           \
  X(l2norm,                                                                                    \
    "l2norm(Tensor[] tensors, float scale=1.0, bool per_tensor=False) -> (float, Tensor, bool)", \
    "(norm of all tensors*scale, per-tensor norms or None, any non-finite)")                   \
  X(adam,                                                                                      \
    "adam(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "          \
    "Tensor[]? model_params, float lr, float beta1, float beta2, float eps, int step, "        \
    "bool adam_w_mode, bool bias_correction, float weight_decay, float grad_scale) -> ()",     \
    "Adam / AdamW over the lists in place (grads divided by grad_scale; model_params, when "   \
    "given, receive the updated params in their own dtype)")                                   \
  X(sgd,                                                                                       \
    "sgd(Tensor[] grads, Tensor[] params, Tensor[]? momentum_buffers, "                        \
    "Tensor[]? model_params, float lr, float momentum, float dampening, float weight_decay, "  \
    "bool nesterov, bool wd_after_momentum, bool first_run, float grad_scale) -> ()",          \
    "SGD with momentum over the lists in place (torch.optim.SGD's update)")                    \
  X(lamb,                                                                                      \
    "lamb(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "          \
    "Tensor[]? model_params, float lr, float beta1, float beta2, float eps, int step, "        \
    "bool bias_correction, float weight_decay, bool grad_averaging, bool adam_w_mode, "        \
    "bool use_nvlamb, float grad_scale) -> Tensor",                                            \
    "LAMB over the lists in place; returns the per-tensor trust ratios applied")               \
  X(scale_l2norm, "scale_l2norm(Tensor[] inputs, Tensor[] outputs, float scale) -> (float, bool)", \
    "outputs[i] = inputs[i] * scale; returns (norm of the outputs, any non-finite)")           \
  X(adagrad,                                                                                   \
    "adagrad(Tensor[] grads, Tensor[] params, Tensor[] sums, Tensor[]? model_params, "         \
    "float lr, float eps, float weight_decay, bool w_mode, float grad_scale) -> ()",           \
    "Adagrad over the lists in place")                                                         \
  X(novograd,                                                                                  \
    "novograd(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, Tensor[]? model_params, "    \
    "Tensor grad_norms, float lr, float beta1, float beta2, float eps, int step, "             \
    "bool bias_correction, float weight_decay, bool grad_averaging, int moment_mode, "         \
    "int norm_type, bool init_norms, float grad_scale) -> ()",                                 \
    "NovoGrad over the lists in place (grad_norms: the per-tensor second moments, updated)")   \
  X(_limit_probe,                                                                              \
    "_limit_probe(Tensor[] grads, Tensor[] params, Tensor[] exp_avgs, "                        \
    "Tensor[]? exp_avg_sqs, Tensor[]? model_params, int passes=3) -> float",                   \
    "benchmark yardstick: the ideal step's memory traffic with trivial arithmetic "            \
    "(overwrites params and moments)")
