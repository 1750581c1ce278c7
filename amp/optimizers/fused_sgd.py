"""FusedSGD: apex.optimizers.FusedSGD on amp._C's multi-tensor SGD kernel."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.optim.optimizer import required

from ..kernels import ops as mt
from .tensor_lists import Bucket, FusedOptimizer


class FusedSGD(FusedOptimizer):
    """SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's
    arithmetic; ``wd_after_momentum=True`` applies decay after the momentum update, as
    apex allows). State ('momentum_buffer') is compatible with torch.optim.SGD.

    ``materialize_master_grads=False`` is apex's opt-in to deferred unscaling under amp O2:
    the fp32 master gradients are then never materialized and the loss scale is removed
    inside the step (by default they are filled when ``scale_loss`` exits).
    ``max_grad_norm`` (not in apex; 0 disables) clips by the global gradient norm inside
    the step.
    """

    _group_step = False

    def __init__(
        self,
        params: Any,
        lr: float = required,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
        *,
        max_grad_norm: float = 0.0,
    ) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"FusedSGD: invalid learning rate {lr}")
        if momentum < 0.0:
            raise ValueError(f"FusedSGD: invalid momentum value {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"FusedSGD: invalid weight_decay value {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("FusedSGD: Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
        self.wd_after_momentum = bool(wd_after_momentum)
        self.materialize_master_grads = materialize_master_grads
        self.max_grad_norm = float(max_grad_norm)
        super().__init__(params, defaults, set_grad_none)

    def _first_run(self, p: torch.Tensor) -> bool:
        return self.state[p].get("momentum_buffer") is None

    def _update_group(
        self,
        group: dict[str, Any],
        models: list[torch.Tensor],
        grads: list[Optional[torch.Tensor]],
        grads_on_params: bool,
        grad_scale: mt.GradScale,
    ) -> None:
        momentum = group["momentum"]
        key = self._first_run if momentum != 0 else None

        buckets = self._group_plan(group, models, grads, grads_on_params, key)

        def run(b: Bucket) -> None:
            bufs = None
            first_run = False
            created: list[dict] = []
            if momentum != 0:
                first_run = self._first_run(b.params[0])
                bufs = []
                for p in b.params:
                    st = self.state[p]
                    if first_run:  # the kernel initialises it to the gradient
                        st["momentum_buffer"] = torch.empty_like(
                            p, memory_format=torch.preserve_format
                        )
                        created.append(st)
                    bufs.append(st["momentum_buffer"])
            try:
                mt.sgd(
                    b.grads,
                    b.params,
                    bufs,
                    b.model_params,
                    lr=group["lr"],
                    momentum=momentum,
                    dampening=group["dampening"],
                    weight_decay=group["weight_decay"],
                    nesterov=group["nesterov"],
                    wd_after_momentum=self.wd_after_momentum,
                    first_run=first_run,
                    grad_scale=grad_scale,
                )
            except BaseException:
                # A call that fails leaves no buffer the kernel did not initialise: the next
                # step would take it for one (and a refused quick bucket is run again, split,
                # as a first run).
                for st in created:
                    del st["momentum_buffer"]
                raise

        self._run_group(group, buckets, run, key)
