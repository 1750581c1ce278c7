"""FusedLAMB: apex.optimizers.FusedLAMB on amp._C's multi-tensor LAMB kernel."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from ..kernels import ops as mt
from ..masters.unscale import Norm
from .tensor_lists import Bucket, FusedOptimizer, ParamGroups, check_betas


def _clipped_scale(norm: Norm, max_norm: float, inv_scale: float) -> mt.GradScale:
    """inv_scale divided by apex's clip ratio (norm / max_norm where the norm exceeds
    max_norm); for a norm on a device, a 0-dim tensor there (nothing is read back)."""
    if max_norm <= 0:
        return inv_scale
    if isinstance(norm, Tensor):
        # The host formula's float64 arithmetic: max(norm / max_norm, 1) (the quotient exceeds
        # 1 exactly when norm > max_norm); a NaN norm does not clip (NaN > max_norm is False).
        clip = torch.nan_to_num(norm / max_norm, nan=1.0, posinf=math.inf).clamp_min_(1.0)
        scale = torch.empty((), dtype=torch.float32, device=norm.device)
        if inv_scale == 1.0:  # 1 / clip, a true division, rounded to float32 as the kernels
            return torch.reciprocal(clip, out=scale)
        return torch.div(clip.new_full((), inv_scale), clip, out=scale)
    clip = norm / max_norm if norm > max_norm else 1.0
    return inv_scale / clip


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019) with apex's
    signature and defaults: Adam moments, then a per-tensor trust ratio
    ||param|| / ||update|| scaling the step. Gradients are first clipped by their global
    norm when it exceeds ``max_grad_norm`` (apex's behaviour; 0 disables). The trust
    ratio applies when ``weight_decay != 0`` or ``use_nvlamb``; otherwise the step is lr.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        if not 0.0 <= lr:
            raise ValueError(f"FusedLAMB: invalid learning rate {lr}")
        check_betas(betas, "FusedLAMB")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            max_grad_norm=max_grad_norm,
            step=0,
        )
        self.adam_w_mode = bool(adam_w_mode)
        self.use_nvlamb = bool(use_nvlamb)
        super().__init__(params, defaults, set_grad_none)

    def _update(
        self, model_params: ParamGroups, inv_scale: float, grads_on_params: bool = False
    ) -> None:
        raw = self._raw_grads(model_params, grads_on_params)
        # apex clips by the norm of all gradients of all groups, before any update (a read
        # pass that is skipped when no group clips, or reuses amp's measurement).
        norm: Norm = (
            self._global_norm(model_params, inv_scale, grads_on_params, raw)
            if self._clips()
            else 0.0
        )
        for group, models, grads in zip(self.param_groups, model_params, raw):
            self._lamb_group(group, models, grads, grads_on_params, norm, inv_scale)

    def _clips(self) -> bool:
        return any(g["max_grad_norm"] > 0 for g in self.param_groups)

    def _lamb_group(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads: list[Optional[Tensor]],
        grads_on_params: bool,
        norm: Norm,
        inv_scale: float,
    ) -> None:
        buckets = self._group_buckets(group, models, grads_on_params, grads)
        if not buckets:
            return
        grad_scale = _clipped_scale(norm, group["max_grad_norm"], inv_scale)
        group["step"] = int(group.get("step", 0)) + 1
        beta1, beta2 = group["betas"]

        def run(b: Bucket) -> None:
            exp_avgs, exp_avg_sqs = self._adam_moments(b.params)
            mt.lamb(
                b.grads,
                b.params,
                exp_avgs,
                exp_avg_sqs,
                b.model_params,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                step=group["step"],
                bias_correction=group["bias_correction"],
                weight_decay=group["weight_decay"],
                grad_averaging=group["grad_averaging"],
                adam_w_mode=self.adam_w_mode,
                use_nvlamb=self.use_nvlamb,
                grad_scale=grad_scale,
            )

        self._run_group(group, buckets, run)

    def _group_buckets(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads_on_params: bool,
        grads: list[Optional[Tensor]],
    ) -> list[Bucket]:
        """The group's kernel calls (*grads*: the ``.grad`` of its sources): unchecked buckets
        where they can be (``quick_buckets``)."""
        return self._group_plan(group, models, grads, grads_on_params)
