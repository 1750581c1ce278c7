"""The Python face of amp._C when it is built on torch's stable ABI (kernels/bindings_stable.cpp).

That module registers its ops with torch's dispatcher (``torch.ops.amp_C.*``) and, while it is
imported, hands itself to :func:`install`, which gives it the functions of the pybind11 module
(kernels/bindings.cpp) with the same names, keyword arguments, defaults and results, so
``amp._C.multi_tensor_scale(...)``, ``amp.multi_tensor_applier`` and the rest of ``amp`` do not
see which binding was built (apex's ``multi_tensor_*`` are amp.kernels.apex_ops', installed by both
bindings). What differs is translated here:

* a bad argument leaves the op as RuntimeError ``[ValueError] ...`` / ``[TypeError] ...`` and is
  raised again here as that type, as the pybind11 module raises it;
* ``l2norm``'s per-tensor norms are None unless asked for; ``supported_isas`` is a list.

Only torch is imported: this runs inside ``import amp._C``.
"""
from __future__ import annotations

import re
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


def _build() -> dict[str, Callable[..., Any]]:
    ops = {n: _op(n) for n in (
        "isa", "set_isa", "supported_isas", "parallel_threads_seen", "scale", "axpby", "l2norm",
        "adam", "sgd", "lamb", "scale_l2norm", "adagrad", "novograd", "limit_probe")}

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

    return {f.__name__: f for f in (
        isa, set_isa, supported_isas, _parallel_threads_seen, scale, axpby, l2norm, adam, sgd,
        lamb, scale_l2norm, adagrad, novograd, _limit_probe)}


def install(module: ModuleType, functions: Optional[dict[str, Callable[..., Any]]] = None) -> None:
    """Give the stable amp._C *module* the pybind11 module's functions."""
    for name, fn in (functions or _build()).items():
        fn.__module__ = module.__name__
        fn.__qualname__ = name
        setattr(module, name, fn)
