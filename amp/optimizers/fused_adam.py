"""FusedAdam: apex.optimizers.FusedAdam on amp._C's multi-tensor Adam kernel."""
from __future__ import annotations

from typing import Any

from .. import multi_tensor as mt
from ._base import FusedOptimizer, ParamGroups, make_buckets


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``: L2 added to the gradient, like torch.optim.Adam) or
    AdamW (``adam_w_mode=True``, the default: decoupled decay, like torch.optim.AdamW),
    with apex's signature and defaults. All tensors of a param group are updated by one
    kernel call; under amp O2 the fp32 master and the half model copy are written in the
    same pass and the loss scale is removed as gradients are read.

    ``max_grad_norm`` (not in apex; 0 disables) clips by the global gradient norm
    inside the step, like ``clip_grad_norm_`` before ``step()``.

    State is compatible with torch.optim.Adam/AdamW ('step', 'exp_avg', 'exp_avg_sq')::

        opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True, capturable: bool = False,
                 master_weights: bool = False, *, max_grad_norm: float = 0.0) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if capturable or master_weights:
            raise ValueError("FusedAdam: capturable and master_weights are CUDA-graph/apex "
                             "options not supported here (amp O2 keeps the master weights)")
        if not 0.0 <= lr:
            raise ValueError(f"FusedAdam: invalid learning rate {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"FusedAdam: invalid epsilon {eps}")
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"FusedAdam: invalid beta at index {i}: {b}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"FusedAdam: invalid weight_decay {weight_decay}")
        if not 0.0 <= max_grad_norm:
            raise ValueError(f"FusedAdam: invalid max_grad_norm {max_grad_norm}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, amsgrad=False, step=0)
        self.adam_w_mode = bool(adam_w_mode)
        self.max_grad_norm = float(max_grad_norm)
        super().__init__(params, defaults, set_grad_none)

    def _torch_group_keys(self) -> dict:
        # torch.optim.AdamW is Adam with decoupled_weight_decay=True; a group without the
        # key would load as L2-regularised Adam.
        return {"decoupled_weight_decay": self.adam_w_mode, "maximize": False,
                "foreach": None, "capturable": False, "differentiable": False, "fused": None}

    def _update(self, model_params: ParamGroups, inv_scale: float,
                grads_on_params: bool = False) -> None:
        grad_scale = self._clipped_grad_scale(model_params, inv_scale, grads_on_params)
        for group, models in zip(self.param_groups, model_params):
            buckets = make_buckets(group["params"], models, grads_on_params=grads_on_params)
            if not buckets:
                continue
            group["step"] = int(group.get("step", 0)) + 1
            beta1, beta2 = group["betas"]
            for b in buckets:
                exp_avgs, exp_avg_sqs = self._adam_moments(b.params)
                mt.adam(b.grads, b.params, exp_avgs, exp_avg_sqs, b.model_params,
                        lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                        step=group["step"], adam_w_mode=self.adam_w_mode,
                        bias_correction=group["bias_correction"],
                        weight_decay=group["weight_decay"], grad_scale=grad_scale)
