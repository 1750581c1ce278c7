"""The Python face of amp._C when it is built on torch's stable ABI (kernels/bindings_stable.cpp).

That module registers its ops with torch's dispatcher (``torch.ops.amp_C.*``) and, while it is
imported, hands itself to :func:`install`, which gives it the functions of the pybind11 module
(kernels/bindings.cpp) with the same names, keyword arguments, defaults and results, so
``amp._C.multi_tensor_scale(...)``, ``amp.multi_tensor_applier`` and the rest of ``amp`` do not
see which binding was built. What differs is translated here:

* apex's ``tensor_lists`` (a list of lists, which an op schema cannot express) is passed
  flattened with the length of each list; ``chunk_size`` is dropped (both bindings ignore it);
* a bad argument leaves the op as RuntimeError ``[ValueError] ...`` / ``[TypeError] ...`` and is
  raised again here as that type, as the pybind11 module raises it;
* ``l2norm``'s per-tensor norms are None unless asked for; ``supported_isas`` is a list.

Only torch is imported: this runs inside ``import amp._C``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Callable, Optional

import torch

__all__ = ["install"]

_TAGGED = re.compile(r"\[(ValueError|TypeError)\] (.*)", re.DOTALL)
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _op(name: str) -> Callable[..., Any]:
    return getattr(torch.ops.amp_C, name).default


def _call(op: Callable[..., Any], *args: Any) -> Any:
    try:
        return op(*args)
    except RuntimeError as exc:
        m = _TAGGED.search(str(exc))
        if m is None:
            raise
        # torch may append its own context after the kernel's message: keep the first line.
        raise _ERRORS[m.group(1)](_device_names(m.group(2).splitlines()[0])) from None


def _device_names(message: str) -> str:
    """The stable ABI knows PrivateUse1 only by its generic name; a backend that renamed it
    (torch_npu: "npu") is named as its users know it, as the pybind11 binding names it."""
    name = torch._C._get_privateuse1_backend_name()
    return message if name == "privateuseone" else message.replace("privateuseone", name)


def _flat(tensor_lists: Sequence[Sequence[torch.Tensor]]) -> tuple[list[torch.Tensor], list[int]]:
    lists = [list(x) for x in tensor_lists]
    return [t for x in lists for t in x], [len(x) for x in lists]


def _build() -> dict[str, Callable[..., Any]]:
    ops = {n: _op(n) for n in (
        "isa", "set_isa", "supported_isas", "parallel_threads_seen", "scale", "axpby", "l2norm",
        "adam", "sgd", "lamb", "scale_l2norm", "adagrad", "novograd", "limit_probe", "mt_scale",
        "mt_axpby", "mt_l2norm", "mt_adam", "mt_sgd", "mt_lamb", "mt_adagrad", "mt_novograd")}

    def isa() -> str:
        """ISA of the kernels in use"""
        return ops["isa"]()

    def set_isa(name: str) -> None:
        """Select kernels: 'auto', 'generic', 'avx2' or 'avx512'"""
        _call(ops["set_isa"], name)

    def supported_isas() -> list[str]:
        """The kernel builds this CPU can run, best last"""
        return ops["supported_isas"]().split(",")

    def _parallel_threads_seen() -> int:
        """threads torch's parallel_for used (a build check: the loop must be parallel)"""
        return ops["parallel_threads_seen"]()

    def scale(inputs, outputs, scale):  # type: ignore[no-untyped-def]
        """outputs[i] = inputs[i] * scale; returns True if any result is non-finite"""
        return _call(ops["scale"], inputs, outputs, scale)

    def axpby(xs, ys, outputs, a, b, arg_to_check=-1):  # type: ignore[no-untyped-def]
        """outputs[i] = a*xs[i] + b*ys[i]; returns True if a checked input is non-finite"""
        return _call(ops["axpby"], xs, ys, outputs, a, b, arg_to_check)

    def l2norm(tensors, scale=1.0, per_tensor=False):  # type: ignore[no-untyped-def]
        """(norm of all tensors*scale, per-tensor norms or None, any non-finite)"""
        norm, per, bad = _call(ops["l2norm"], tensors, scale, per_tensor)
        return norm, (per if per_tensor else None), bad

    def adam(grads, params, exp_avgs, exp_avg_sqs, model_params, lr, beta1, beta2, eps,  # type: ignore[no-untyped-def]
             step, adam_w_mode, bias_correction, weight_decay, grad_scale):
        _call(ops["adam"], grads, params, exp_avgs, exp_avg_sqs, model_params, lr, beta1, beta2,
              eps, step, adam_w_mode, bias_correction, weight_decay, grad_scale)

    def sgd(grads, params, momentum_buffers, model_params, lr, momentum, dampening,  # type: ignore[no-untyped-def]
            weight_decay, nesterov, wd_after_momentum, first_run, grad_scale):
        _call(ops["sgd"], grads, params, momentum_buffers, model_params, lr, momentum,
              dampening, weight_decay, nesterov, wd_after_momentum, first_run, grad_scale)

    def lamb(grads, params, exp_avgs, exp_avg_sqs, model_params, lr, beta1, beta2, eps,  # type: ignore[no-untyped-def]
             step, bias_correction, weight_decay, grad_averaging, adam_w_mode, use_nvlamb,
             grad_scale):
        return _call(ops["lamb"], grads, params, exp_avgs, exp_avg_sqs, model_params, lr,
                     beta1, beta2, eps, step, bias_correction, weight_decay, grad_averaging,
                     adam_w_mode, use_nvlamb, grad_scale)

    def scale_l2norm(inputs, outputs, scale):  # type: ignore[no-untyped-def]
        """outputs[i] = inputs[i] * scale; returns (norm of the outputs, any non-finite)"""
        return _call(ops["scale_l2norm"], inputs, outputs, scale)

    def adagrad(grads, params, sums, model_params, lr, eps, weight_decay, w_mode,  # type: ignore[no-untyped-def]
                grad_scale):
        _call(ops["adagrad"], grads, params, sums, model_params, lr, eps, weight_decay, w_mode,
              grad_scale)

    def novograd(grads, params, exp_avgs, model_params, grad_norms, lr, beta1, beta2, eps,  # type: ignore[no-untyped-def]
                 step, bias_correction, weight_decay, grad_averaging, moment_mode, norm_type,
                 init_norms, grad_scale):
        _call(ops["novograd"], grads, params, exp_avgs, model_params, grad_norms, lr, beta1,
              beta2, eps, step, bias_correction, weight_decay, grad_averaging, moment_mode,
              norm_type, init_norms, grad_scale)

    def _limit_probe(grads, params, exp_avgs, exp_avg_sqs, model_params, passes=3):  # type: ignore[no-untyped-def]
        """benchmark yardstick: the ideal step's memory traffic with trivial arithmetic
        (overwrites params and moments)"""
        return _call(ops["limit_probe"], grads, params, exp_avgs, exp_avg_sqs, model_params,
                     passes)

    def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):  # type: ignore[no-untyped-def]
        """apex: (chunk_size, noop_flag, [in, out], scale)"""
        _call(ops["mt_scale"], noop_flag, *_flat(tensor_lists), scale)

    def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):  # type: ignore[no-untyped-def]
        """apex: (chunk_size, noop_flag, [x, y, out], a, b, arg_to_check)"""
        _call(ops["mt_axpby"], noop_flag, *_flat(tensor_lists), a, b, arg_to_check)

    def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=None):  # type: ignore[no-untyped-def]
        """apex: (chunk_size, noop_flag, [x], per_tensor) -> (norm, per_tensor_norms)"""
        return _call(ops["mt_l2norm"], noop_flag, *_flat(tensor_lists), None, bool(per_tensor))

    def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale,  # type: ignore[no-untyped-def]
                                    per_tensor=None):
        """apex: norm of x * inv_scale, x untouched"""
        return _call(ops["mt_l2norm"], noop_flag, *_flat(tensor_lists), inv_scale,
                     bool(per_tensor))

    def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step,  # type: ignore[no-untyped-def]
                          mode, bias_correction, weight_decay):
        """apex: (chunk_size, noop_flag, [g, p, m, v(, p_half)], lr, beta1, beta2, eps, step,
        mode, bias_correction, weight_decay)"""
        _call(ops["mt_adam"], *_flat(tensor_lists), lr, beta1, beta2, eps, step, mode,
              bias_correction, weight_decay)

    def multi_tensor_sgd(chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr,  # type: ignore[no-untyped-def]
                         nesterov, first_run, wd_after_momentum, scale=1.0):
        """apex: (chunk_size, noop_flag, [g, p, mom(, p_half)], wd, momentum, dampening, lr,
        nesterov, first_run, wd_after_momentum, scale)"""
        _call(ops["mt_sgd"], noop_flag, *_flat(tensor_lists), wd, momentum, dampening, lr,
              nesterov, first_run, wd_after_momentum, scale)

    def multi_tensor_lamb(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step,  # type: ignore[no-untyped-def]
                          bias_correction, weight_decay, grad_averaging, mode, global_grad_norm,
                          max_grad_norm, use_nvlamb=None):
        """apex: (chunk_size, noop_flag, [g, p, m, v(, p_half)], lr, beta1, beta2, eps, step,
        bias_correction, weight_decay, grad_averaging, mode, global_grad_norm, max_grad_norm,
        use_nvlamb)"""
        _call(ops["mt_lamb"], *_flat(tensor_lists), lr, beta1, beta2, eps, step,
              bias_correction, weight_decay, grad_averaging, mode, global_grad_norm,
              max_grad_norm, bool(use_nvlamb))

    def multi_tensor_adagrad(chunk_size, noop_flag, tensor_lists, lr, eps, mode, weight_decay):  # type: ignore[no-untyped-def]
        """apex: (chunk_size, noop_flag, [g, p, sum(, p_half)], lr, eps, mode, weight_decay)"""
        _call(ops["mt_adagrad"], *_flat(tensor_lists), lr, eps, mode, weight_decay)

    def multi_tensor_novograd(chunk_size, noop_flag, tensor_lists, grad_norms, lr, beta1,  # type: ignore[no-untyped-def]
                              beta2, eps, step, bias_correction, weight_decay, grad_averaging,
                              moment_mode, norm_type):
        """apex: (chunk_size, noop_flag, [g, p, m(, p_half)], grad_norms, lr, beta1, beta2,
        eps, step, bias_correction, weight_decay, grad_averaging, moment_mode, norm_type)"""
        _call(ops["mt_novograd"], *_flat(tensor_lists), grad_norms, lr, beta1, beta2, eps,
              step, bias_correction, weight_decay, grad_averaging, moment_mode, norm_type)

    return {f.__name__: f for f in (
        isa, set_isa, supported_isas, _parallel_threads_seen, scale, axpby, l2norm, adam, sgd,
        lamb, scale_l2norm, adagrad, novograd, _limit_probe, multi_tensor_scale,
        multi_tensor_axpby, multi_tensor_l2norm, multi_tensor_unscale_l2norm, multi_tensor_adam,
        multi_tensor_sgd, multi_tensor_lamb, multi_tensor_adagrad, multi_tensor_novograd)}


def install(module: ModuleType, functions: Optional[dict[str, Callable[..., Any]]] = None) -> None:
    """Give the stable amp._C *module* the pybind11 module's functions."""
    for name, fn in (functions or _build()).items():
        fn.__module__ = module.__name__
        fn.__qualname__ = name
        setattr(module, name, fn)
