"""FusedAdam: apex.optimizers.FusedAdam on amp._C's multi-tensor Adam kernel."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ..kernels import ops as mt
from ..masters.unscale import group_by
from .tensor_lists import Bucket, FusedOptimizer, check_betas, closure_loss, make_buckets

_HALF = (torch.float16, torch.bfloat16)


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``: L2 added to the gradient, like torch.optim.Adam) or
    AdamW (``adam_w_mode=True``, the default: decoupled decay, like torch.optim.AdamW),
    with apex's signature and defaults. All tensors of a param group are updated by one
    kernel call; under amp O2 the fp32 master and the half model copy are written in the
    same pass and the loss scale is removed as gradients are read.

    ``max_grad_norm`` (not in apex; 0 disables) clips by the global gradient norm
    inside the step, like ``clip_grad_norm_`` before ``step()``.

    ``master_weights=True`` (apex's, for half parameters used without amp O2): the optimizer
    keeps an fp32 master copy of every fp16/bf16 parameter, updates the master with fp32
    moments, and writes the rounded result into the half parameter in the same pass. Like
    apex, the masters are not part of ``state_dict()``; after ``load_state_dict`` they are
    taken again from the (half) parameters. ``capturable=True`` (apex: a CUDA-graph
    capturable step that reads the scale of ``torch.amp.GradScaler`` on the device) is
    accepted and steps the same numbers. As in apex, such an optimizer tells the scaler it
    removes the scale itself (``_step_supports_amp_scaling``): the scaler then hands it
    ``grad_scale`` and ``found_inf`` instead of unscaling, which is what lets fp16 parameters
    (``master_weights=True``) go through ``GradScaler.step`` -- the scaler refuses to unscale
    fp16 gradients itself. The step unscales the gradients in place (as apex's does) and
    reads both values on the host (nothing here is captured into a CUDA graph).

    State is compatible with torch.optim.Adam/AdamW ('step', 'exp_avg', 'exp_avg_sq')::

        opt = FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
        *,
        max_grad_norm: float = 0.0,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        for name, flag in (("capturable", capturable), ("master_weights", master_weights)):
            if not isinstance(flag, bool):
                raise TypeError(f"FusedAdam: {name} must be True or False; got {flag!r}")
        if not 0.0 <= lr:
            raise ValueError(f"FusedAdam: invalid learning rate {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"FusedAdam: invalid epsilon {eps}")
        check_betas(betas, "FusedAdam")
        if not 0.0 <= weight_decay:
            raise ValueError(f"FusedAdam: invalid weight_decay {weight_decay}")
        if not 0.0 <= max_grad_norm:
            raise ValueError(f"FusedAdam: invalid max_grad_norm {max_grad_norm}")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=False,
            step=0,
        )
        self.adam_w_mode = bool(adam_w_mode)
        self.max_grad_norm = float(max_grad_norm)
        self.capturable = capturable
        self.master_weights = master_weights
        # id(half param) -> its fp32 master (master_weights=True); made on first use.
        self._masters: dict[int, Tensor] = {}
        super().__init__(params, defaults, set_grad_none)
        if capturable:
            self._step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        # torch.amp.GradScaler sets these two for the duration of its step() call when
        # _step_supports_amp_scaling is set (capturable=True).
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is None and found_inf is None:
            return super().step(closure)
        loss = closure_loss(closure)
        if found_inf is not None and bool(found_inf.item()):
            return loss  # an overflowed step is skipped (its step count too), as the scaler's
        params = [list(g["params"]) for g in self.param_groups]
        if grad_scale is not None:
            # Unscaled in place, as apex's capturable kernel leaves them: code that reads the
            # gradients after the step (logging, clipping next time) sees the true values.
            grads = [p.grad for group in params for p in group if p.grad is not None]
            if grads and all(g.dtype == torch.float32 for g in grads):
                # 1 / scale in float64, then float32 (what the host's 1.0 / float(scale) gives
                # a float32 multiply), computed where the scale is: no read back.
                inv = grad_scale.double().reciprocal().float()
                for kind in group_by(grads, lambda g: g.device).values():
                    torch._foreach_mul_(kind, inv.to(kind[0].device))
            elif grads:
                # Half gradients (master_weights): a number keeps the multiply's float32
                # arithmetic, where a half tensor would take a 0-dim tensor's value as half.
                torch._foreach_mul_(grads, 1.0 / float(grad_scale.item()))
        self._amp_cached_norm = None
        self._update(params, 1.0, grads_on_params=True)
        return loss

    def _master_of(self, p: Tensor) -> Tensor:
        master = self._masters.get(id(p))
        if master is None or master.shape != p.shape:
            master = self._masters[id(p)] = p.detach().float()
        return master

    def _fp32_moments(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Moments of half *params* in fp32, keyed by the parameters (so state_dict() stays
        torch's); torch's load_state_dict casts them to the parameter's dtype, undone here."""
        exp_avgs, exp_avg_sqs = [], []
        for p in params:
            st = self.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                if key not in st:
                    st[key] = torch.zeros_like(p, dtype=torch.float32)
                elif st[key].dtype != torch.float32:
                    st[key] = st[key].float()
            exp_avgs.append(st["exp_avg"])
            exp_avg_sqs.append(st["exp_avg_sq"])
        return exp_avgs, exp_avg_sqs

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._masters.clear()  # as apex: masters come again from the loaded parameters

    def _torch_group_keys(self) -> dict:
        # torch.optim.AdamW is Adam with decoupled_weight_decay=True; a group without the
        # key would load as L2-regularised Adam.
        return {
            "decoupled_weight_decay": self.adam_w_mode,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
        }

    def _update_group(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads: list[Optional[Tensor]],
        grads_on_params: bool,
        grad_scale: mt.GradScale,
    ) -> None:
        owner: dict[int, Tensor] = {}  # id(master) -> the half parameter it stands for
        if self.master_weights and any(p.dtype in _HALF for p in group["params"]):
            # The kernel's O2 form: fp32 masters stepped, the half parameter written.
            opt_params, copies = [], []
            for p, mp in zip(group["params"], models):
                if p.dtype in _HALF:
                    master = self._master_of(p)
                    owner[id(master)] = p
                    opt_params.append(master)
                    copies.append(p)
                else:
                    opt_params.append(p)
                    copies.append(mp)
            sources = list(group["params"]) if grads_on_params else list(models)
            buckets = make_buckets(opt_params, copies, grad_sources=sources)
        else:
            buckets = self._group_plan(group, models, grads, grads_on_params)
        if not buckets:
            return
        group["step"] = int(group.get("step", 0)) + 1
        beta1, beta2 = group["betas"]

        def run(b: Bucket) -> None:
            if owner and id(b.params[0]) in owner:
                exp_avgs, exp_avg_sqs = self._fp32_moments([owner[id(m)] for m in b.params])
            else:
                exp_avgs, exp_avg_sqs = self._adam_moments(b.params)
            mt.adam(
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
                adam_w_mode=self.adam_w_mode,
                bias_correction=group["bias_correction"],
                weight_decay=group["weight_decay"],
                grad_scale=grad_scale,
            )

        self._run_group(group, buckets, run)
