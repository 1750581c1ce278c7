"""LAMB as Apex for Ascend has it: ``NpuFusedLamb`` (on amp's combined buffers) and ``Lamb`` (a
plain torch.optim optimizer: any opt level, with or without amp), one update for both.

Ascend's LAMB (You et al., v3 of the paper: no bias correction): Adam's moments, the Adam step
``m / (sqrt(v) + eps)`` plus L2 weight decay, scaled per parameter by the trust ratio
``clamp(|w|, 0, 10) / |step|`` (1 where either norm is 0, always 1 with ``adam=True``). The
per-parameter norms of a buffer are one ``_foreach_norm``, and the ratios are spread back over
the buffer in one operation, so a step is a fixed number of operations per buffer. ``Lamb``
also records ``weight_norm``, ``adam_norm`` and ``trust_ratio`` in each parameter's state, as
Ascend's does (its MNIST example logs them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from .combined_buffers import (
    ElementwiseOptimizer,
    NpuFusedOptimizer,
    Run,
    check_nonnegative,
    global_norm,
)
from .tensor_lists import check_betas


def _check(lr: float, betas: tuple[float, float], eps: float) -> None:
    check_nonnegative(lr=lr, eps=eps)
    check_betas(betas)


def lamb_update(
    group: dict[str, Any],
    run: Run,
    adam: bool,
    grad_divisor: Optional[Tensor] = None,
    norms: bool = True,
) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """One LAMB step on ``run``; returns the per-parameter weight norms, Adam-step norms and
    trust ratios (1-D, one entry per parameter of the run), unless ``adam`` and not
    ``norms`` (nothing needs them then)."""
    beta1, beta2 = group["betas"]
    param, grad = run.param, run.grad
    if grad_divisor is not None:
        grad = grad / grad_divisor
    exp_avg, exp_avg_sq = run.states["exp_avg"], run.states["exp_avg_sq"]
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
    if group["weight_decay"] != 0:
        adam_step.add_(param, alpha=group["weight_decay"])
    if adam and not norms:
        param.add_(adam_step, alpha=-group["lr"])
        return None
    weight_norm = torch.stack(torch._foreach_norm(run.parts(param), 2)).clamp(0, 10)
    adam_norm = torch.stack(torch._foreach_norm(run.parts(adam_step), 2))
    ratio = torch.where(
        (weight_norm == 0) | (adam_norm == 0), torch.ones_like(weight_norm), weight_norm / adam_norm
    )
    if adam:
        param.add_(adam_step, alpha=-group["lr"])
    else:
        param.addcmul_(adam_step, run.per_part(ratio), value=-group["lr"])
    return weight_norm, adam_norm, ratio


class NpuFusedLamb(NpuFusedOptimizer):
    """LAMB on amp's combined buffers. With ``use_global_grad_norm``, gradients are first
    divided by their global norm when it exceeds 1 (Ascend's option), on the device."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0,
        adam: bool = False,
        use_global_grad_norm: bool = False,
    ) -> None:
        _check(lr, betas, eps)
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm
        self._divisor: Optional[Tensor] = None
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _prepare(self, runs: Sequence[tuple[dict[str, Any], Run]]) -> None:
        self._divisor = None
        if self.use_global_grad_norm and runs:
            norm = global_norm([run.grad for _, run in runs])
            self._divisor = torch.where(norm > 1, norm, torch.ones_like(norm))

    def _update(self, group: dict[str, Any], run: Run) -> None:
        lamb_update(group, run, self.adam, self._divisor, norms=False)


class Lamb(ElementwiseOptimizer):
    """Ascend's plain LAMB: one parameter at a time, standalone or under amp at any opt level.

    Example::

        opt = Lamb(model.parameters(), lr=2.5e-3, weight_decay=0.01)
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0,
        adam: bool = False,
    ) -> None:
        _check(lr, betas, eps)
        self.adam = adam
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def _runs(self) -> list[tuple[dict[str, Any], Run]]:
        runs = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(
                        "Lamb does not support sparse gradients, consider SparseAdam instad."
                    )
                fresh = self._new_state(p, group)
                runs.append((group, _single_run(p, self.state[p], fresh)))
        return runs

    def _update(self, group: dict[str, Any], run: Run) -> None:
        result = lamb_update(group, run, self.adam)
        assert result is not None
        weight_norm, adam_norm, ratio = result
        state = self.state[run.params[0]]
        state["weight_norm"], state["adam_norm"] = weight_norm[0], adam_norm[0]
        state["trust_ratio"] = ratio[0]


def _single_run(p: Tensor, state: dict[str, Any], fresh: bool) -> Run:
    """One parameter as a run: 1-D views of it, its gradient and states when all are
    contiguous, else the tensors themselves (``whole``)."""
    grad = p.grad
    assert grad is not None
    tensors = [p, grad, state["exp_avg"], state["exp_avg_sq"]]
    flat = all(t.is_contiguous() for t in tensors)
    as_run = [t.view(-1) if flat else t for t in tensors]
    return Run(
        param=as_run[0],
        grad=as_run[1],
        states={"exp_avg": as_run[2], "exp_avg_sq": as_run[3]},
        step=state["step"] + 1,
        fresh=fresh,
        params=[p],
        offsets=[0],
        numels=[p.numel()],
        whole=not flat,
    )
