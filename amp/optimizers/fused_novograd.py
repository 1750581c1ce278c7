"""FusedNovoGrad: apex.optimizers.FusedNovoGrad on amp._C's multi-tensor NovoGrad kernel."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..kernels import ops as mt
from .tensor_lists import Bucket, FusedOptimizer, check_betas


class FusedNovoGrad(FusedOptimizer):
    """NovoGrad (Ginsburg et al. 2019) with apex's signature and defaults: Adam-like, but
    the second moment is one number per tensor, a running blend of the gradient's norm
    (``norm_type`` 2: L2, 0: max norm). ``reg_inside_moment=True`` applies the weight decay
    inside the momentum (the paper), False decouples it into the update (apex's default).
    ``init_zero=False`` starts the blend from the first step's norm.

    State per parameter: 'exp_avg' (momentum) and 'exp_avg_sq', a 0-dim float32 tensor
    holding the blended *norm* (not its square, as apex stores it). Under amp O2 the half
    model copy is written in the same pass as the update.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        reg_inside_moment: bool = False,
        grad_averaging: bool = True,
        norm_type: int = 2,
        init_zero: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        if norm_type not in (0, 2):
            raise ValueError(
                f"FusedNovoGrad: norm_type must be 2 (L2) or 0 (max norm); got {norm_type!r}"
            )
        if not 0.0 <= lr:
            raise ValueError(f"FusedNovoGrad: invalid learning rate {lr}")
        check_betas(betas, "FusedNovoGrad")
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            grad_averaging=grad_averaging,
            norm_type=norm_type,
            init_zero=init_zero,
            step=0,
        )
        self.moment_mode = 0 if reg_inside_moment else 1
        super().__init__(params, defaults, set_grad_none)

    def _is_new(self, p: torch.Tensor) -> bool:
        return "exp_avg" not in self.state[p]

    def _update_group(
        self,
        group: dict[str, Any],
        models: list[torch.Tensor],
        grads: list[Optional[torch.Tensor]],
        grads_on_params: bool,
        grad_scale: mt.GradScale,
    ) -> None:
        buckets = self._group_plan(group, models, grads, grads_on_params, self._is_new)
        if not buckets:
            return
        group["step"] = int(group.get("step", 0)) + 1
        beta1, beta2 = group["betas"]

        def run(b: Bucket) -> None:
            new = self._is_new(b.params[0])
            states = [self.state[p] for p in b.params]
            for p, st in zip(b.params, states):
                if new:
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros((), dtype=torch.float32, device=p.device)
            norms = torch.stack([st["exp_avg_sq"].float().reshape(()) for st in states])
            try:
                mt.novograd(
                    b.grads,
                    b.params,
                    [st["exp_avg"] for st in states],
                    b.model_params,
                    grad_norms=norms,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    step=group["step"],
                    bias_correction=group["bias_correction"],
                    weight_decay=group["weight_decay"],
                    grad_averaging=group["grad_averaging"],
                    moment_mode=self.moment_mode,
                    norm_type=group["norm_type"],
                    init_norms=new and not group["init_zero"],
                    grad_scale=grad_scale,
                )
            except BaseException:
                # A call that fails leaves the parameters new (their first step starts the
                # blend, and a refused quick bucket is run again, split, as a first step).
                if new:
                    for st in states:
                        del st["exp_avg"], st["exp_avg_sq"]
                raise
            _store_norms(states, norms)

        self._run_group(group, buckets, run, self._is_new)


def _store_norms(states: list[dict], norms: torch.Tensor) -> None:
    """Each parameter's blended norm back into its own 0-dim 'exp_avg_sq' (state_dict keeps
    apex's per-parameter layout): one copy into the existing float32 tensors where they all
    are such, else fresh ones (a state loaded in another dtype or on another device)."""
    kept = [st["exp_avg_sq"] for st in states]
    if all(t.dtype == torch.float32 and t.dim() == 0 and t.device == norms.device for t in kept):
        torch._foreach_copy_(kept, list(norms.unbind()))
        return
    for st, n in zip(states, norms.unbind()):
        st["exp_avg_sq"] = n.clone()
