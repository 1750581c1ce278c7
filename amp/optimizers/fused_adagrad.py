"""FusedAdagrad: apex.optimizers.FusedAdagrad on amp._C's multi-tensor Adagrad kernel."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from ..kernels import ops as mt
from .tensor_lists import Bucket, FusedOptimizer


class FusedAdagrad(FusedOptimizer):
    """Adagrad with apex's signature and defaults. ``adagrad_w_mode=False`` (default) adds
    the L2 penalty to the gradient, exactly torch.optim.Adagrad (with ``lr_decay=0`` and
    ``initial_accumulator_value=0``); ``adagrad_w_mode=True`` decouples the weight decay
    from the adaptive update (apex's AdamW-style mode). All tensors of a param group are
    updated by one kernel call; under amp O2 the half model copy is written in the same
    pass. State ('sum', 'step') is compatible with torch.optim.Adagrad::

        opt = FusedAdagrad(model.parameters(), lr=1e-2)
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
        adagrad_w_mode: bool = False,
    ) -> None:
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if not 0.0 <= value:
                raise ValueError(f"FusedAdagrad: invalid {name} {value!r}; expected >= 0")
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, step=0)
        self.adagrad_w_mode = bool(adagrad_w_mode)
        super().__init__(params, defaults, set_grad_none)

    def _torch_group_keys(self) -> dict:
        return {
            "lr_decay": 0.0,
            "initial_accumulator_value": 0.0,
            "foreach": None,
            "maximize": False,
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
        buckets = self._group_plan(group, models, grads, grads_on_params)
        if not buckets:
            return
        group["step"] = int(group.get("step", 0)) + 1

        def run(b: Bucket) -> None:
            sums = []
            for p in b.params:
                st = self.state[p]
                if "sum" not in st:  # zeros: created again unchanged if the call is refused
                    st["sum"] = p.new_zeros(p.shape)
                sums.append(st["sum"])
            mt.adagrad(
                b.grads,
                b.params,
                sums,
                b.model_params,
                lr=group["lr"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                w_mode=self.adagrad_w_mode,
                grad_scale=grad_scale,
            )

        self._run_group(group, buckets, run)
