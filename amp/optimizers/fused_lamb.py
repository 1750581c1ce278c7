"""FusedLAMB: apex.optimizers.FusedLAMB on amp._C's multi-tensor LAMB kernel."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from ..kernels import ops as mt
from .tensor_lists import Bucket, FusedOptimizer, ParamGroups, make_buckets


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019) with apex's
    signature and defaults: Adam moments, then a per-tensor trust ratio
    ||param|| / ||update|| scaling the step. Gradients are first clipped by their global
    norm when it exceeds ``max_grad_norm`` (apex's behaviour; 0 disables). The trust
    ratio applies when ``weight_decay != 0`` or ``use_nvlamb``; otherwise the step is lr.
    """

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, amsgrad: bool = False, adam_w_mode: bool = True,
                 grad_averaging: bool = True, set_grad_none: bool = True,
                 max_grad_norm: float = 1.0, use_nvlamb: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        if not 0.0 <= lr:
            raise ValueError(f"FusedLAMB: invalid learning rate {lr}")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"FusedLAMB: invalid beta at index {i}: {b}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging,
                        max_grad_norm=max_grad_norm, step=0)
        self.adam_w_mode = bool(adam_w_mode)
        self.use_nvlamb = bool(use_nvlamb)
        super().__init__(params, defaults, set_grad_none)

    def _update(self, model_params: ParamGroups, inv_scale: float,
                grads_on_params: bool = False) -> None:
        # apex clips by the norm of all gradients of all groups, before any update (a read
        # pass that is skipped when no group clips, or reuses amp's measurement).
        clipping = any(g["max_grad_norm"] > 0 for g in self.param_groups)
        norm = self._global_norm(model_params, inv_scale, grads_on_params) if clipping else 0.0
        for group, models in zip(self.param_groups, model_params):
            buckets = self._group_buckets(group, models, grads_on_params)
            if not buckets:
                continue
            max_norm = group["max_grad_norm"]
            clip = norm / max_norm if max_norm > 0 and norm > max_norm else 1.0
            group["step"] = int(group.get("step", 0)) + 1
            beta1, beta2 = group["betas"]
            for b in buckets:
                exp_avgs, exp_avg_sqs = self._adam_moments(b.params)
                mt.lamb(b.grads, b.params, exp_avgs, exp_avg_sqs, b.model_params,
                        lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                        step=group["step"], bias_correction=group["bias_correction"],
                        weight_decay=group["weight_decay"],
                        grad_averaging=group["grad_averaging"], adam_w_mode=self.adam_w_mode,
                        use_nvlamb=self.use_nvlamb, grad_scale=inv_scale / clip)

    def _group_buckets(self, group: dict[str, Any], models: list[Tensor],
                       grads_on_params: bool) -> list[Bucket]:
        return make_buckets(group["params"], models, grads_on_params=grads_on_params)
