"""More multi-tensor ops (see ``amp.multi_tensor`` for the conventions): the unscale pass that
also measures the norm, and the Adagrad and NovoGrad steps. CPU tensors run the compiled
kernels; elsewhere, or without ``amp._C``, the pure-torch code below computes the same float32
arithmetic in the same order."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .multi_tensor import (
    TensorSeq,
    _any_nonfinite,
    _check,
    _check_step,
    _f32,
    _kernels,
    _write_back,
)

__all__ = ["scale_l2norm", "adagrad", "novograd"]


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
