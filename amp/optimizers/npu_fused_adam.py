"""Apex for Ascend's Adam family on combined buffers: ``NpuFusedAdam``, ``NpuFusedAdamW``
(torch.optim's Adam/AdamW op for op: bit-equal), ``NpuFusedAdamP`` and ``NpuFusedBertAdam``
(Ascend's formulas: no torch counterpart)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

import torch
from torch import Tensor
from torch.optim.optimizer import required

from ..kernels import ops as kernel_ops
from .combined_buffers import (
    NpuFusedOptimizer,
    Run,
    check_nonnegative,
    global_norm,
    one_pass_ready,
)
from .tensor_lists import check_betas


class NpuFusedAdam(NpuFusedOptimizer):
    """Adam (L2 weight decay, optional AMSGrad) over amp's combined buffers: the operations of
    torch.optim.Adam's single-tensor step, once per buffer, so the results are torch's, bit
    for bit (Ascend's own code uses ``mul_().add_()`` where torch uses ``lerp_``: one rounding
    apart).

    ``one_pass=True`` (amp's extension, off by default) steps each CPU buffer in one pass of
    amp's compiled Adam kernel (``amp.kernels.ops.adam`` over the one tensor) instead of
    torch's seven operations: at 50M parameters about 2.4x less memory traffic (its time
    beside ``amp.optimizers.FusedAdam``'s: docs/benchmarks.md). It is **not** bit-equal to
    torch.optim.Adam: per step, the moments within a rounding of their inputs and the
    parameter within a few ulps of
    ``max(|p|, |update|)`` (4 measured on the AVX2 and AVX-512 builds, 38 on the generic one,
    which rounds ``g + wd * p`` twice; tests/optimizers/test_npu_fused_one_pass.py); the kernel
    multiplies by ``1 / sqrt(bias_correction2)`` where torch divides, and fuses the first
    moment's lerp into one FMA (docs/benchmarks.md). AMSGrad, buffers off the CPU and a missing
    extension keep torch's operations.

    Example::

        opt = NpuFusedAdam(model.parameters(), lr=1e-3)
        model, opt = amp.initialize(model, opt, opt_level="O2")
    """

    decoupled = False
    one_pass = False  # a class default too: optimizers unpickled from before it existed

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        one_pass: bool = False,
    ) -> None:
        check_nonnegative(lr=lr, eps=eps)
        check_betas(betas)
        check_nonnegative(weight_decay=weight_decay)
        # Not a param-group key: state_dict() stays Ascend's.
        self.one_pass = bool(one_pass)
        super().__init__(
            params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    def _one_pass_update(self, group: dict[str, Any], run: Run) -> bool:
        """The update in one kernel pass, when asked for and possible; False: not taken."""
        if not self.one_pass or group["amsgrad"] or run.whole:
            return False
        bufs = (run.param, run.grad, run.states["exp_avg"], run.states["exp_avg_sq"])
        if not one_pass_ready(bufs):
            return False
        beta1, beta2 = group["betas"]
        kernel_ops.adam(
            [run.grad],
            [run.param],
            [run.states["exp_avg"]],
            [run.states["exp_avg_sq"]],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            step=run.step,
            adam_w_mode=self.decoupled,
            weight_decay=group["weight_decay"],
        )
        return True

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        extra = ("max_exp_avg_sq",) if group["amsgrad"] else ()
        return ("exp_avg", "exp_avg_sq") + extra

    def _update(self, group: dict[str, Any], run: Run) -> None:
        if self._one_pass_update(group, run):
            return
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        param, grad = run.param, run.grad
        exp_avg, exp_avg_sq = run.states["exp_avg"], run.states["exp_avg_sq"]
        if wd != 0:
            if self.decoupled:
                param.mul_(1 - lr * wd)
            else:
                grad = torch.add(grad, param, alpha=wd, out=run.scratch(1))
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**run.step
        bias_correction2_sqrt = (1 - beta2**run.step) ** 0.5
        step_size = lr / bias_correction1
        if group["amsgrad"]:
            max_sq = run.states["max_exp_avg_sq"]
            torch.maximum(max_sq, exp_avg_sq, out=max_sq)
            exp_avg_sq = max_sq
        denom = torch.sqrt(exp_avg_sq, out=run.scratch()).div_(bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


class NpuFusedAdamW(NpuFusedAdam):
    """AdamW (decoupled weight decay, default 1e-2): torch.optim.AdamW's operations, once per
    buffer."""

    decoupled = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        one_pass: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, one_pass=one_pass)


class NpuFusedAdamP(NpuFusedOptimizer):
    """AdamP (Heo et al., "Slowing Down the Weight Norm Increase in Momentum-based
    Optimizers"), Ascend's formulas: Adam's moments once per buffer; the projection, which
    looks at each matrix-shaped parameter's cosine similarity with its gradient, per parameter
    (as in Ascend). Like Ascend's, the constructor checks nothing."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        delta: float = 0.1,
        wd_ratio: float = 0.1,
        nesterov: bool = False,
    ) -> None:
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                delta=delta,
                wd_ratio=wd_ratio,
                nesterov=nesterov,
            ),
        )

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    @staticmethod
    def _cosine_similarity(
        x: Tensor, y: Tensor, eps: float, view: Callable[[Tensor], Tensor]
    ) -> Tensor:
        x, y = view(x), view(y)
        return (x * y).sum(dim=1).abs() / x.norm(dim=1).add_(eps) / y.norm(dim=1).add_(eps)

    @classmethod
    def _projection(
        cls, p: Tensor, grad: Tensor, perturb: Tensor, delta: float, wd_ratio: float, eps: float
    ) -> float:
        """Project ``perturb`` (in place) off ``p`` when ``grad`` is nearly orthogonal to it,
        channel-wise first, then layer-wise; return the weight-decay ratio to use."""
        expand = [-1] + [1] * (p.dim() - 1)
        views: list[Callable[[Tensor], Tensor]] = [
            lambda x: x.reshape(x.size(0), -1),
            lambda x: x.reshape(1, -1),
        ]
        for view in views:
            cosine = cls._cosine_similarity(grad, p, eps, view)
            # A host decision per parameter, as in Ascend.
            if cosine.max() < delta / math.sqrt(view(p).size(1)):
                p_n = p / view(p).norm(dim=1).view(expand).add_(eps)
                perturb.sub_(p_n * view(p_n * perturb).sum(dim=1).view(expand))
                return wd_ratio
        return 1.0

    def _update(self, group: dict[str, Any], run: Run) -> None:
        beta1, beta2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        param, grad = run.param, run.grad
        exp_avg, exp_avg_sq = run.states["exp_avg"], run.states["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**run.step)).add_(eps)
        step_size = lr / (1 - beta1**run.step)
        if group["nesterov"]:
            perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
        else:
            perturb = exp_avg / denom
        ratios = []
        for i, p in enumerate(run.params):
            ratio = 1.0
            if p.dim() > 1 and p.numel() > 0:  # (an empty one has no direction to keep)
                ratio = self._projection(
                    run.shaped(param, i),
                    run.shaped(grad, i),
                    run.shaped(perturb, i),
                    group["delta"],
                    group["wd_ratio"],
                    eps,
                )
            ratios.append(ratio)
        if wd > 0:
            ratio_t = run.per_part(torch.tensor(ratios, dtype=param.dtype).to(param.device))
            param.mul_(1 - lr * wd * ratio_t)
        param.add_(perturb, alpha=-step_size)


def warmup_cosine(x: float, warmup: float = 0.002) -> float:
    if x < warmup:
        return x / warmup
    # Ascend calls torch.cos on this float, which raises; the formula is meant.
    return 0.5 * (1.0 + math.cos(math.pi * x))


def warmup_constant(x: float, warmup: float = 0.002) -> float:
    if x < warmup:
        return x / warmup
    return 1.0


def warmup_linear(x: float, warmup: float = 0.002) -> float:
    if x < warmup:
        return x / warmup
    return max((x - 1.0) / (warmup - 1.0), 0.0)


def warmup_poly(x: float, warmup: float = 0.002, degree: float = 0.5) -> float:
    if x < warmup:
        return x / warmup
    return (1.0 - x) ** degree


SCHEDULES: dict[str, Callable[[float, float], float]] = {
    "warmup_cosine": warmup_cosine,
    "warmup_constant": warmup_constant,
    "warmup_linear": warmup_linear,
    "warmup_poly": warmup_poly,
}


class NpuFusedBertAdam(NpuFusedOptimizer):
    """BERT's Adam (no bias correction, decoupled weight decay added to the update, a warmup
    schedule over ``t_total`` steps, optional clipping by the global gradient norm when
    ``max_grad_norm > 0``), Ascend's formulas, once per buffer. The global norm is computed
    and applied on the device (no host synchronisation): gradients are divided by it, in
    place as in Ascend, when it is finite and above 1."""

    def __init__(
        self,
        params: Any,
        lr: float = required,
        warmup: float = -1,
        t_total: float = -1,
        schedule: str = "warmup_linear",
        b1: float = 0.9,
        b2: float = 0.99,
        e: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = -1,
    ) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        if schedule not in SCHEDULES:
            raise ValueError(f"Invalid schedule parameter: {schedule}")
        if not 0.0 <= warmup < 1.0 and not warmup == -1:
            raise ValueError(f"Invalid warmup: {warmup} - should be in [0.0, 1.0[ or -1")
        if not 0.0 <= b1 < 1.0:
            raise ValueError(f"Invalid b1 parameter: {b1} - should be in [0.0, 1.0[")
        if not 0.0 <= b2 < 1.0:
            raise ValueError(f"Invalid b2 parameter: {b2} - should be in [0.0, 1.0[")
        if not e >= 0.0:
            raise ValueError(f"Invalid epsilon value: {e} - should be >= 0.0")
        self.max_grad_norm = max_grad_norm
        super().__init__(
            params,
            dict(
                lr=lr,
                schedule=schedule,
                warmup=warmup,
                t_total=t_total,
                b1=b1,
                b2=b2,
                e=e,
                weight_decay=weight_decay,
                max_grad_norm=max_grad_norm,
            ),
        )

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _prepare(self, runs: Sequence[tuple[dict[str, Any], Run]]) -> None:
        if self.max_grad_norm <= 0 or not runs:
            return
        norm = global_norm([run.grad for _, run in runs])
        divisor = torch.where(torch.isfinite(norm) & (norm > 1), norm, torch.ones_like(norm))
        for group, run in runs:
            if group["max_grad_norm"] > 0:
                run.grad.div_(divisor)

    def _update(self, group: dict[str, Any], run: Run) -> None:
        beta1, beta2 = group["b1"], group["b2"]
        param, grad = run.param, run.grad
        exp_avg, exp_avg_sq = run.states["exp_avg"], run.states["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        update = exp_avg / (exp_avg_sq.sqrt() + group["e"])
        if group["weight_decay"] > 0.0:
            update += group["weight_decay"] * param
        lr = group["lr"]
        if group["t_total"] != -1:
            # Ascend's schedule reads the step count before this step.
            schedule = SCHEDULES[group["schedule"]]
            lr = lr * schedule((run.step - 1) / group["t_total"], group["warmup"])
        param.add_(-(lr * update))
