"""Python face of the multi-tensor kernels (apex's ``amp_C`` family).

Each function takes lists of tensors (one entry per model tensor) and applies one
operation to all of them in a single call. CPU tensors go to the compiled kernels in
``amp._C``; tensors on any other device (CUDA, or an out-of-tree device such as Ascend's
``npu``: the kernels refuse them), or a missing / mismatched extension (see ``amp._ext``),
use the pure-torch (``torch._foreach_*``) implementation below, on the tensors' own
device, which computes the same float32 arithmetic in the same order, so both agree to
rounding. The first call on a non-CPU device type warns once (``amp._device``).

Lists must be non-empty, of equal length, element-wise equal in size, contiguous, and
each list must share one dtype among float32, float16 and bfloat16; ``params`` must be
float32 whenever a separate half ``model_params`` copy is written.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import _ext
from .._device import KERNEL_DEVICE_TYPE, kernel_device_ok

__all__ = ["scale", "axpby", "l2norm", "scale_l2norm", "adam", "sgd", "lamb", "adagrad", "novograd",
           "uses_kernels"]

# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
TensorSeq = Sequence[Tensor]
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def uses_kernels(tensors: TensorSeq) -> bool:
    """True when a call on these tensors runs the compiled kernels."""
    return (bool(tensors) and tensors[0].device.type == KERNEL_DEVICE_TYPE
            and _ext.load() is not None)


def _kernels(first: TensorSeq):
    # Routed by the first tensor's device: the kernels check every tensor themselves and
    # refuse a non-CPU one, so a mixed list still fails with their message.
    if first and kernel_device_ok(first[0].device):
        return _ext.load()
    return None


# --- validation for the fallback (the kernels validate in C++) -------------------
# The messages keep this module's former name, amp.multi_tensor: error messages are part of
# amp's interface.
def _check(name: str, ts: TensorSeq, like: Optional[TensorSeq] = None,
           fp32_only: bool = False) -> None:
    if len(ts) == 0:
        raise ValueError(f"amp.multi_tensor: {name} is an empty list")
    if like is not None and len(ts) != len(like):
        raise ValueError(f"amp.multi_tensor: {name} has {len(ts)} tensors; expected "
                         f"{len(like)} (one per tensor of the first list)")
    dtype, device = ts[0].dtype, ts[0].device
    for i, t in enumerate(ts):
        where = f"amp.multi_tensor: {name}[{i}]"
        if t.dtype not in _FLOAT_TYPES:
            raise TypeError(f"{where} has dtype {t.dtype}; expected float32, float16 or bfloat16")
        if t.dtype != dtype:
            raise TypeError(f"{where} has dtype {t.dtype} but {name}[0] has {dtype}; "
                            "one list must share one dtype")
        if fp32_only and t.dtype != torch.float32:
            raise TypeError(f"{where} must be float32 when a half model copy is written")
        if t.device != device or (like is not None and t.device != like[i].device):
            raise ValueError(f"{where} is on {t.device}; all tensors must share one device")
        if not t.is_contiguous():
            raise ValueError(f"{where} is not contiguous")
        if like is not None and t.numel() != like[i].numel():
            raise ValueError(f"{where} has {t.numel()} elements; expected {like[i].numel()} "
                             "to match the first list")


def _f32(ts: TensorSeq) -> list[Tensor]:
    # fp32 tensors are returned as themselves, so in-place ops update them directly.
    return [t if t.dtype == torch.float32 else t.float() for t in ts]


def _write_back(dst: TensorSeq, src: list[Tensor]) -> None:
    for d, s in zip(dst, src):
        if d is not s:
            d.copy_(s)


def _any_nonfinite(ts: list[Tensor]) -> bool:
    return any(not bool(torch.isfinite(t).all()) for t in ts if t.numel())


# --- scale -----------------------------------------------------------------------
def scale(inputs: TensorSeq, outputs: TensorSeq, scale: float) -> bool:
    """outputs[i] = inputs[i] * scale (cast to outputs' dtype).

    Returns True if any result is non-finite; outputs are written regardless (the
    caller skips the step), like apex's multi_tensor_scale."""
    mod = _kernels(inputs)
    if mod is not None:
        return mod.scale(list(inputs), list(outputs), float(scale))
    _check("inputs", inputs)
    _check("outputs", outputs, inputs)
    vals = torch._foreach_mul(_f32(inputs), float(scale))
    bad = _any_nonfinite(vals)
    for o, v in zip(outputs, vals):
        o.copy_(v)
    return bad


def axpby(xs: TensorSeq, ys: TensorSeq, outputs: TensorSeq, a: float, b: float,
          arg_to_check: int = -1) -> bool:
    """outputs[i] = a*xs[i] + b*ys[i]; True if a checked input (-1 both, 0 xs, 1 ys)
    holds a non-finite value."""
    if arg_to_check not in (-1, 0, 1):
        raise ValueError("amp.multi_tensor.axpby: arg_to_check must be -1 (both), 0 (x) or 1 (y)")
    mod = _kernels(xs)
    if mod is not None:
        return mod.axpby(list(xs), list(ys), list(outputs), float(a), float(b), arg_to_check)
    _check("xs", xs)
    _check("ys", ys, xs)
    _check("outputs", outputs, xs)
    fx, fy = _f32(xs), _f32(ys)
    bad = (arg_to_check != 1 and _any_nonfinite(fx)) or (arg_to_check != 0 and _any_nonfinite(fy))
    vals = torch._foreach_mul(fx, float(a))
    torch._foreach_add_(vals, torch._foreach_mul(fy, float(b)))
    for o, v in zip(outputs, vals):
        o.copy_(v)
    return bool(bad)


def l2norm(tensors: TensorSeq, scale: float = 1.0,
           per_tensor: bool = False) -> tuple[float, Optional[Tensor], bool]:
    """(L2 norm of all tensors*scale, float64 tensor of per-tensor norms or None,
    True if any tensor*scale is non-finite). Read-only."""
    mod = _kernels(tensors)
    if mod is not None:
        return mod.l2norm(list(tensors), float(scale), bool(per_tensor))
    _check("tensors", tensors)
    vals = torch._foreach_mul(_f32(tensors), float(scale))
    bad = _any_nonfinite(vals)
    sq = torch.stack([torch.sum(v.double() * v.double()) for v in vals])
    total = math.sqrt(float(sq.sum()))
    return total, (sq.sqrt().cpu() if per_tensor else None), bad


# --- optimizers ------------------------------------------------------------------
def _check_step(name: str, step: int) -> None:
    if step < 1:
        raise ValueError(f"amp.multi_tensor.{name}: step must be >= 1")


def _check_adam_like(op: str, step: int, grads: TensorSeq, params: TensorSeq,
                     exp_avgs: TensorSeq, exp_avg_sqs: TensorSeq,
                     model_params: Optional[TensorSeq]) -> None:
    """The fallback's input checks for the Adam-family kernels (adam, lamb): the same
    errors the compiled kernels raise."""
    _check_step(op, step)
    _check("grads", grads)
    _check("params", params, grads, fp32_only=model_params is not None)
    _check("exp_avgs", exp_avgs, grads)
    _check("exp_avg_sqs", exp_avg_sqs, grads)
    if model_params is not None:
        _check("model_params", model_params, grads)


def adam(grads: TensorSeq, params: TensorSeq, exp_avgs: TensorSeq, exp_avg_sqs: TensorSeq,
         model_params: Optional[TensorSeq] = None, *, lr: float, beta1: float, beta2: float,
         eps: float, step: int, adam_w_mode: bool, bias_correction: bool = True,
         weight_decay: float = 0.0, grad_scale: float = 1.0) -> None:
    """One Adam/AdamW step (torch.optim.Adam/AdamW arithmetic) on every tensor.

    Gradients are multiplied by ``grad_scale`` (inverse loss scale x clip coefficient)
    as they are read and never written. When ``model_params`` is given, the updated
    fp32 params are also written, cast, into it in the same pass."""
    mod = _kernels(grads)
    if mod is not None:
        mod.adam(list(grads), list(params), list(exp_avgs), list(exp_avg_sqs),
                 None if model_params is None else list(model_params), float(lr),
                 float(beta1), float(beta2), float(eps), int(step), bool(adam_w_mode),
                 bool(bias_correction), float(weight_decay), float(grad_scale))
        return
    _check_adam_like("adam", step, grads, params, exp_avgs, exp_avg_sqs, model_params)
    bc1 = 1.0 - beta1 ** step if bias_correction else 1.0
    bc2 = 1.0 - beta2 ** step if bias_correction else 1.0
    g = torch._foreach_mul(_f32(grads), float(grad_scale))
    p, m, v = _f32(params), _f32(exp_avgs), _f32(exp_avg_sqs)
    if adam_w_mode:
        torch._foreach_mul_(p, 1.0 - lr * weight_decay)
    elif weight_decay != 0:
        g = torch._foreach_add(g, p, alpha=weight_decay)
    torch._foreach_lerp_(m, g, 1.0 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, 1.0 - beta2)
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, math.sqrt(bc2))
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(p, m, denom, -lr / bc1)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    _write_back(exp_avg_sqs, v)
    if model_params is not None:
        _write_back(model_params, p)


def sgd(grads: TensorSeq, params: TensorSeq, momentum_buffers: Optional[TensorSeq] = None,
        model_params: Optional[TensorSeq] = None, *, lr: float, momentum: float = 0.0,
        dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
        wd_after_momentum: bool = False, first_run: bool = False,
        grad_scale: float = 1.0) -> None:
    """One SGD step (torch.optim.SGD arithmetic; apex's ``wd_after_momentum``).

    With ``first_run`` the momentum buffers are initialised to the gradient (their
    old contents are ignored), as torch does on a parameter's first step."""
    mod = _kernels(grads)
    if mod is not None:
        mod.sgd(list(grads), list(params),
                None if momentum_buffers is None else list(momentum_buffers),
                None if model_params is None else list(model_params), float(lr),
                float(momentum), float(dampening), float(weight_decay), bool(nesterov),
                bool(wd_after_momentum), bool(first_run), float(grad_scale))
        return
    if momentum != 0 and momentum_buffers is None:
        raise ValueError("amp.multi_tensor.sgd: momentum != 0 needs momentum_buffers")
    _check("grads", grads)
    _check("params", params, grads, fp32_only=model_params is not None)
    if momentum != 0:
        _check("momentum_buffers", momentum_buffers, grads)  # type: ignore[arg-type]
    if model_params is not None:
        _check("model_params", model_params, grads)
    d = torch._foreach_mul(_f32(grads), float(grad_scale))
    p = _f32(params)
    if weight_decay != 0 and not wd_after_momentum:
        d = torch._foreach_add(d, p, alpha=weight_decay)
    if momentum != 0:
        if first_run:
            b = [t.clone() for t in d]
        else:
            b = _f32(momentum_buffers)  # type: ignore[arg-type]
            torch._foreach_mul_(b, momentum)
            torch._foreach_add_(b, d, alpha=1.0 - dampening)
        d = torch._foreach_add(d, b, alpha=momentum) if nesterov else b
        _write_back(momentum_buffers, b)  # type: ignore[arg-type]
    if weight_decay != 0 and wd_after_momentum:
        d = torch._foreach_add(d, p, alpha=weight_decay)
    torch._foreach_add_(p, d, alpha=-lr)
    _write_back(params, p)
    if model_params is not None:
        _write_back(model_params, p)


def lamb(grads: TensorSeq, params: TensorSeq, exp_avgs: TensorSeq, exp_avg_sqs: TensorSeq,
         model_params: Optional[TensorSeq] = None, *, lr: float, beta1: float, beta2: float,
         eps: float, step: int, bias_correction: bool = True, weight_decay: float = 0.0,
         grad_averaging: bool = True, adam_w_mode: bool = True, use_nvlamb: bool = False,
         grad_scale: float = 1.0) -> Tensor:
    """One LAMB step (apex's multi_tensor_lamb); ``grad_scale`` folds in the inverse
    loss scale and the global-norm clip ratio. Returns the per-tensor step sizes
    (lr x trust ratio) that were applied."""
    mod = _kernels(grads)
    if mod is not None:
        return mod.lamb(list(grads), list(params), list(exp_avgs), list(exp_avg_sqs),
                        None if model_params is None else list(model_params), float(lr),
                        float(beta1), float(beta2), float(eps), int(step),
                        bool(bias_correction), float(weight_decay), bool(grad_averaging),
                        bool(adam_w_mode), bool(use_nvlamb), float(grad_scale))
    _check_adam_like("lamb", step, grads, params, exp_avgs, exp_avg_sqs, model_params)
    # The kernel rounds these host-side constants to float32; do the same.
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))  # noqa: E731
    beta3 = f32(1.0 - beta1) if grad_averaging else 1.0
    bc1 = f32(1.0 - beta1 ** step) if bias_correction else 1.0
    bc2 = f32(1.0 - beta2 ** step) if bias_correction else 1.0
    g = torch._foreach_mul(_f32(grads), float(grad_scale))
    p, m, v = _f32(params), _f32(exp_avgs), _f32(exp_avg_sqs)
    if not adam_w_mode and weight_decay != 0:
        g = torch._foreach_add(g, p, alpha=weight_decay)
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=beta3)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, 1.0 - beta2)
    denom = torch._foreach_div(v, bc2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    upd = torch._foreach_div(m, bc1)
    torch._foreach_div_(upd, denom)
    if adam_w_mode and weight_decay != 0:
        torch._foreach_add_(upd, p, alpha=weight_decay)
    ratios = []
    trust = use_nvlamb or weight_decay != 0
    for pi, ui in zip(p, upd):
        pn = float(torch.sum(pi.double() ** 2)) ** 0.5
        un = float(torch.sum(ui.double() ** 2)) ** 0.5
        ratios.append(lr * (pn / un) if trust and pn != 0 and un != 0 else lr)
    r = torch.tensor(ratios, dtype=torch.float32)
    for pi, ui, ri in zip(p, upd, r.tolist()):
        pi.sub_(ui, alpha=ri)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    _write_back(exp_avg_sqs, v)
    if model_params is not None:
        _write_back(model_params, p)
    return r


def scale_l2norm(inputs: TensorSeq, outputs: TensorSeq, scale: float) -> tuple[float, bool]:
    """outputs[i] = inputs[i] * scale (outputs may be the inputs: in place); returns (L2 norm of
    the outputs, True if any is non-finite). One read of the inputs does both."""
    mod = _kernels(inputs)
    if mod is not None:
        norm, bad = mod.scale_l2norm(list(inputs), list(outputs), float(scale))
        return float(norm), bool(bad)
    _check("inputs", inputs)
    _check("outputs", outputs, inputs)
    vals = torch._foreach_mul(_f32(inputs), float(scale))
    bad = _any_nonfinite(vals)
    for o, v in zip(outputs, vals):
        o.copy_(v)
    total = sum(float(torch.sum(v.double() * v.double())) for v in vals)
    return math.sqrt(total), bad


def adagrad(grads: TensorSeq, params: TensorSeq, sums: TensorSeq,
            model_params: Optional[TensorSeq] = None, *, lr: float, eps: float,
            weight_decay: float = 0.0, w_mode: bool = False, grad_scale: float = 1.0) -> None:
    """One Adagrad step (torch.optim.Adagrad's arithmetic with ``w_mode=False``; apex's
    decoupled decay with ``w_mode=True``), writing the half ``model_params`` copy if given."""
    mod = _kernels(grads)
    if mod is not None:
        mod.adagrad(list(grads), list(params), list(sums),
                    None if model_params is None else list(model_params), float(lr),
                    float(eps), float(weight_decay), bool(w_mode), float(grad_scale))
        return
    _check("grads", grads)
    _check("params", params, grads, fp32_only=model_params is not None)
    _check("sums", sums, grads)
    if model_params is not None:
        _check("model_params", model_params, grads)
    g = torch._foreach_mul(_f32(grads), float(grad_scale))
    p, h = _f32(params), _f32(sums)
    if not w_mode and weight_decay != 0:
        g = torch._foreach_add(g, p, alpha=weight_decay)
    torch._foreach_addcmul_(h, g, g)
    std = torch._foreach_sqrt(h)
    torch._foreach_add_(std, eps)
    if w_mode:
        upd = torch._foreach_div(g, std)
        torch._foreach_add_(upd, p, alpha=weight_decay)
        torch._foreach_add_(p, upd, alpha=-lr)
    else:
        torch._foreach_addcdiv_(p, g, std, -lr)
    _write_back(params, p)
    _write_back(sums, h)
    if model_params is not None:
        _write_back(model_params, p)


def novograd(grads: TensorSeq, params: TensorSeq, exp_avgs: TensorSeq,
             model_params: Optional[TensorSeq] = None, *, grad_norms: Tensor, lr: float,
             beta1: float, beta2: float, eps: float, step: int, bias_correction: bool = True,
             weight_decay: float = 0.0, grad_averaging: bool = True, moment_mode: int = 1,
             norm_type: int = 2, init_norms: bool = False, grad_scale: float = 1.0) -> None:
    """One NovoGrad step (apex's multi_tensor_novograd). ``grad_norms`` (float32, one per
    tensor) holds the blended per-tensor gradient norms and is updated in place; with
    ``init_norms`` it is set to this step's norms. ``moment_mode`` 0 regularises inside the
    moment, 1 decouples the weight decay; ``norm_type`` 2 is L2, 0 the max norm."""
    mod = _kernels(grads)
    if mod is not None:
        mod.novograd(list(grads), list(params), list(exp_avgs),
                     None if model_params is None else list(model_params), grad_norms,
                     float(lr), float(beta1), float(beta2), float(eps), int(step),
                     bool(bias_correction), float(weight_decay), bool(grad_averaging),
                     int(moment_mode), int(norm_type), bool(init_norms), float(grad_scale))
        return
    _check_step("novograd", step)
    if norm_type not in (0, 2):
        raise ValueError(f"amp.multi_tensor.novograd: norm_type must be 2 (L2) or 0 (max); "
                         f"got {norm_type}")
    if moment_mode not in (0, 1):
        raise ValueError("amp.multi_tensor.novograd: moment_mode must be 0 or 1")
    _check("grads", grads)
    _check("params", params, grads, fp32_only=model_params is not None)
    _check("exp_avgs", exp_avgs, grads)
    if model_params is not None:
        _check("model_params", model_params, grads)
    g = torch._foreach_mul(_f32(grads), float(grad_scale))
    p, m = _f32(params), _f32(exp_avgs)
    bc1 = 1.0 - beta1 ** step if bias_correction else 1.0
    bc2 = math.sqrt(1.0 - beta2 ** step) if bias_correction else 1.0
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    for i, (gi, pi, mi) in enumerate(zip(g, p, m)):
        if norm_type == 2:
            n = math.sqrt(float(torch.sum(gi.double() * gi.double())))
        else:
            n = float(gi.abs().max()) if gi.numel() else 0.0
        old = float(grad_norms[i])
        if not init_norms:
            n = (math.sqrt(beta2 * old * old + (1 - beta2) * n * n) if norm_type == 2
                 else beta2 * old + (1 - beta2) * n)
        grad_norms[i] = n
        denom = float(torch.tensor(float(grad_norms[i]) / bc2 + eps, dtype=torch.float32))
        if moment_mode == 0:
            gi = gi / denom + weight_decay * pi
            mi.mul_(beta1).add_(gi * beta3)
            pi.sub_(lr * (mi / bc1))
        else:
            mi.mul_(beta1).add_(gi * beta3)
            pi.sub_(lr * ((mi / bc1) / denom + weight_decay * pi))
    _write_back(params, p)
    _write_back(exp_avgs, m)
    if model_params is not None:
        _write_back(model_params, p)
