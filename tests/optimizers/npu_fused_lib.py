"""Helpers for the NpuFused optimizer tests: the cases, a run of the optimizers on amp's
combined buffers (amp.ascend.combined's own machinery, as amp's step hands it to them), and the
per-parameter formulas of Apex for Ascend's optimizers that have no torch.optim counterpart,
written out one parameter at a time as Ascend's code runs them (the reference for ours)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Callable, Dict

import torch
from torch import Tensor

import amp.optimizers as O
from amp.ascend.combined import CombinedGrads
from amp.optimizers.npu_fused_adam import SCHEDULES

SHAPES = [(3, 5), (7,), (2, 3, 4), (), (33,), (4, 1, 3)]

# (ours, torch.optim's, keywords): bit-equal pairs.
TORCH_PAIRS: list[tuple[type, type, dict[str, Any]]] = [
    (O.NpuFusedSGD, torch.optim.SGD, dict(lr=0.1)),
    (O.NpuFusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (O.NpuFusedSGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (O.NpuFusedAdam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    (O.NpuFusedAdam, torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    (O.NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.01)),
    (O.NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    (O.NpuFusedAdadelta, torch.optim.Adadelta, dict(weight_decay=0.01)),
    (O.NpuFusedRMSprop, torch.optim.RMSprop, dict(lr=0.01)),
    (
        O.NpuFusedRMSprop,
        torch.optim.RMSprop,
        dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1),
    ),
]


def case_id(case: tuple) -> str:
    kw = next(c for c in case if isinstance(c, dict))
    return f"{case[0].__name__}-" + "-".join(f"{k}={v}" for k, v in kw.items())


def leaves(
    shapes: Sequence[tuple], device: Any = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32
) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device, dtype).requires_grad_() for s in shapes]


def grad_series(shapes: Sequence[tuple], steps: int, seed: int = 1) -> list[list[Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def attach_combined(opt: torch.optim.Optimizer) -> CombinedGrads:
    """Combine ``opt``'s gradients the way amp does for an optimizer whose parameters are
    their own masters (O1), on amp's own ``CombinedGrads``."""
    combined = CombinedGrads(check=False)
    opt._amp_stash = SimpleNamespace(combined=combined)  # type: ignore[attr-defined]
    assert combined.build([[(p, p) for p in g["params"]] for g in opt.param_groups])
    return combined


def set_grads(params: Sequence[Tensor], grads: Sequence[Tensor]) -> None:
    """Write this step's gradients, into the combined buffers once they exist (in place, as
    autograd accumulates into them)."""
    for p, g in zip(params, grads):
        g = g.to(p.device, p.dtype)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)


def run_combined(
    opt: torch.optim.Optimizer, params: Sequence[Tensor], series: Sequence[Sequence[Tensor]]
) -> None:
    for i, grads in enumerate(series):
        set_grads(params, grads)
        if i == 0:
            attach_combined(opt)
        opt.step()


def run_plain(
    opt: torch.optim.Optimizer, params: Sequence[Tensor], series: Sequence[Sequence[Tensor]]
) -> None:
    for grads in series:
        set_grads(params, grads)
        opt.step()


# --- Ascend's formulas, one parameter at a time ------------------------------------------

# typing.Dict: the alias is evaluated at import, and Python 3.8's dict cannot be subscripted.
Step = Callable[[Tensor, Tensor, Dict[str, Any], Dict[str, Any]], None]


def _adam_moments(state: dict, p: Tensor, g: Tensor, beta1: float, beta2: float) -> None:
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    state["step"] += 1
    state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)


def ref_rmsprop_tf(p: Tensor, g: Tensor, state: dict, h: dict) -> None:
    if not state:
        state["square_avg"] = torch.zeros_like(p)
        state["momentum_buffer"] = torch.zeros_like(p)
        state["grad_avg"] = torch.zeros_like(p)
    a = 1.0 - h["alpha"]
    if h["weight_decay"]:
        if h["decoupled_decay"]:
            p.add_(p, alpha=-h["weight_decay"])
        else:
            g = g.add(p, alpha=h["weight_decay"])
    sq = state["square_avg"]
    sq.add_(g.pow(2) - sq, alpha=a)
    if h["centered"]:
        ga = state["grad_avg"]
        ga.add_(g - ga, alpha=a)
        avg = sq.addcmul(ga, ga, value=-1).add(h["eps"]).sqrt_()
    else:
        avg = sq.add(h["eps"]).sqrt_()
    if h["momentum"] > 0:
        buf = state["momentum_buffer"]
        if h["lr_in_momentum"]:
            buf.mul_(h["momentum"]).addcdiv_(g, avg, value=h["lr"])
            p.sub_(buf)
        else:
            buf.mul_(h["momentum"]).addcdiv_(g, avg)
            p.add_(buf, alpha=-h["lr"])
    else:
        p.addcdiv_(g, avg, value=-h["lr"])


def ref_bert_adam(p: Tensor, g: Tensor, state: dict, h: dict) -> None:
    step_before = state.get("step", 0)
    _adam_moments(state, p, g, h["b1"], h["b2"])
    update = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + h["e"])
    if h["weight_decay"] > 0:
        update += h["weight_decay"] * p
    lr = h["lr"]
    if h["t_total"] != -1:
        lr = lr * SCHEDULES[h["schedule"]](step_before / h["t_total"], h["warmup"])
    p.add_(-(lr * update))


def ref_lamb(p: Tensor, g: Tensor, state: dict, h: dict) -> None:
    beta1, beta2 = h["betas"]
    _adam_moments(state, p, g, beta1, beta2)
    weight_norm = p.pow(2).sum().sqrt().clamp(0, 10)
    adam_step = state["exp_avg"] / state["exp_avg_sq"].sqrt().add(h["eps"])
    if h["weight_decay"]:
        adam_step.add_(p, alpha=h["weight_decay"])
    adam_norm = adam_step.pow(2).sum().sqrt()
    ratio = 1.0 if weight_norm == 0 or adam_norm == 0 else float(weight_norm / adam_norm)
    state.update(weight_norm=weight_norm, adam_norm=adam_norm, trust_ratio=ratio)
    if h.get("adam"):
        ratio = 1.0
    p.add_(adam_step.mul_(-h["lr"] * ratio))


def ref_adamp(p: Tensor, g: Tensor, state: dict, h: dict) -> None:
    beta1, beta2 = h["betas"]
    _adam_moments(state, p, g, beta1, beta2)
    step, eps = state["step"], h["eps"]
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    step_size = h["lr"] / (1 - beta1**step)
    if h["nesterov"]:
        perturb = (beta1 * state["exp_avg"] + (1 - beta1) * g) / denom
    else:
        perturb = state["exp_avg"] / denom
    wd_ratio = 1.0
    if p.dim() > 1:
        expand = [-1] + [1] * (p.dim() - 1)
        for view in (lambda x: x.reshape(x.size(0), -1), lambda x: x.reshape(1, -1)):
            x, y = view(g), view(p)
            cosine = (x * y).sum(dim=1).abs() / x.norm(dim=1).add_(eps) / y.norm(dim=1).add_(eps)
            if cosine.max() < h["delta"] / math.sqrt(view(p).size(1)):
                p_n = p / view(p).norm(dim=1).view(expand).add_(eps)
                perturb -= p_n * view(p_n * perturb).sum(dim=1).view(expand)
                wd_ratio = h["wd_ratio"]
                break
    if h["weight_decay"] > 0:
        p.mul_(1 - h["lr"] * h["weight_decay"] * wd_ratio)
    p.add_(perturb, alpha=-step_size)


def run_reference(
    step: Step,
    params: Sequence[Tensor],
    series: Sequence[Sequence[Tensor]],
    hyper: dict[str, Any],
    clip_global: bool = False,
) -> list[dict]:
    """Ascend's per-parameter loop; ``clip_global``: divide the gradients by their global
    norm first when it is above 1 (BertAdam's max_grad_norm, Lamb's use_global_grad_norm)."""
    states: list[dict] = [{} for _ in params]
    with torch.no_grad():
        for grads in series:
            grads = [g.to(p.device, p.dtype) for p, g in zip(params, grads)]
            if clip_global:
                norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
                if norm > 1:
                    grads = [g / norm for g in grads]
            for p, g, state in zip(params, grads, states):
                step(p, g, state, hyper)
    return states


# (ours, Ascend's formula, keywords, whether the reference clips by the global norm)
ASCEND_CASES: list[tuple[type, Step, dict[str, Any], bool]] = [
    (O.NpuFusedRMSpropTF, ref_rmsprop_tf, dict(lr=0.01), False),
    (
        O.NpuFusedRMSpropTF,
        ref_rmsprop_tf,
        dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.01),
        False,
    ),
    (
        O.NpuFusedRMSpropTF,
        ref_rmsprop_tf,
        dict(lr=0.01, momentum=0.9, lr_in_momentum=False, decoupled_decay=True, weight_decay=0.01),
        False,
    ),
    (O.NpuFusedBertAdam, ref_bert_adam, dict(lr=0.01), False),
    (
        O.NpuFusedBertAdam,
        ref_bert_adam,
        dict(lr=0.01, warmup=0.5, t_total=4, schedule="warmup_cosine"),
        False,
    ),
    (
        O.NpuFusedBertAdam,
        ref_bert_adam,
        dict(lr=0.01, warmup=0.1, t_total=8, schedule="warmup_poly", max_grad_norm=1.0),
        True,
    ),
    (
        O.NpuFusedBertAdam,
        ref_bert_adam,
        dict(lr=0.01, warmup=0.25, t_total=8, schedule="warmup_constant"),
        False,
    ),
    (O.NpuFusedLamb, ref_lamb, dict(lr=0.01, weight_decay=0.01), False),
    (O.NpuFusedLamb, ref_lamb, dict(lr=0.01, adam=True), False),
    (O.NpuFusedLamb, ref_lamb, dict(lr=0.01, use_global_grad_norm=True), True),
    (O.NpuFusedAdamP, ref_adamp, dict(lr=0.01, weight_decay=0.1), False),
    (O.NpuFusedAdamP, ref_adamp, dict(lr=0.01, weight_decay=0.1, nesterov=True, delta=1.0), False),
]


def hyper_of(opt: torch.optim.Optimizer, kw: dict[str, Any]) -> dict[str, Any]:
    """The reference's hyper-parameters: the optimizer's group defaults plus its options."""
    hyper = dict(opt.defaults)
    hyper.update(kw)
    return hyper
