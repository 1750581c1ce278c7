"""FusedMixedPrecisionLamb: apex.optimizers.FusedMixedPrecisionLamb on amp._C's LAMB kernel."""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .fused_lamb import FusedLAMB
from .tensor_lists import Bucket, closure_loss, grad_norm, grads_of, grads_signature, make_buckets

_FP32_STATE = ("exp_avg", "exp_avg_sq", "master_param")


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB for a model held in reduced precision, without amp (apex's signature and
    defaults). Parameters of ``reduced_precision_dtype`` (torch.float16 or torch.bfloat16)
    get an fp32 master copy and fp32 moments in the optimizer state ('master_param',
    'exp_avg', 'exp_avg_sq', kept fp32 through ``load_state_dict``, so a resumed run is
    exact); one kernel pass reads the half gradient, updates the master and moments and
    writes the half parameter. Other parameters are stepped as by FusedLAMB.

    ``step(closure=None, grad_scaler=None)``: given a ``torch.amp.GradScaler`` (as
    ``scaler.step(optimizer)`` does), the gradients are unscaled as they are read and the
    step is skipped, step counter untouched, when they hold inf/NaN::

        opt = FusedMixedPrecisionLamb(model.parameters(), lr=1e-3,
                                      reduced_precision_dtype=torch.bfloat16)
    """

    # torch.amp.GradScaler hands itself to step() instead of unscaling first.
    _step_supports_amp_scaling = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        step: int = 0,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
        reduced_precision_dtype: Optional[torch.dtype] = None,
    ) -> None:
        if reduced_precision_dtype not in (None, torch.float16, torch.bfloat16):
            raise TypeError(
                "FusedMixedPrecisionLamb: reduced_precision_dtype must be None, "
                f"torch.float16 or torch.bfloat16; got {reduced_precision_dtype!r}"
            )
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"FusedMixedPrecisionLamb: step must be an int >= 0; got {step!r}")
        super().__init__(
            params,
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            adam_w_mode=adam_w_mode,
            grad_averaging=grad_averaging,
            set_grad_none=True,
            max_grad_norm=max_grad_norm,
            use_nvlamb=use_nvlamb,
        )
        for group in self.param_groups:
            group["step"] = step
        self.reduced_precision_dtype = reduced_precision_dtype
        self._owner: dict[int, Tensor] = {}  # id(master) -> the parameter it stands for

    def _master(self, p: Tensor) -> Tensor:
        st = self.state[p]
        if "master_param" not in st:  # at the first step, as apex (after any DDP broadcast)
            st["master_param"] = p.detach().float().clone()
        master = st["master_param"]
        self._owner[id(master)] = p
        return master

    def _group_buckets(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads_on_params: bool,
        grads: Optional[list[Optional[Tensor]]] = None,
    ) -> list[Bucket]:
        # The fp32 masters of the reduced-precision params are paired here, in make_buckets's
        # checked lists (*grads*, the sources' own, are not all those the kernel takes).
        reduced = self.reduced_precision_dtype
        params, halves, sources = [], [], []
        for p, mp in zip(group["params"], models):
            if reduced is not None and p.dtype == reduced:
                params.append(self._master(p))
                halves.append(p)
                sources.append(p)
            else:
                params.append(p)
                halves.append(mp)
                sources.append(p if grads_on_params else mp)
        return make_buckets(params, halves, grad_sources=sources)

    def _adam_moments(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        owners = [self._owner.get(id(t), t) for t in params]
        exp_avgs, exp_avg_sqs = [], []
        for owner, t in zip(owners, params):
            st = self.state[owner]
            if "exp_avg" not in st:  # fp32 like the tensor stepped (the master)
                st["exp_avg"] = torch.zeros_like(t, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(t, memory_format=torch.preserve_format)
            exp_avgs.append(st["exp_avg"])
            exp_avg_sqs.append(st["exp_avg_sq"])
        return exp_avgs, exp_avg_sqs

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, grad_scaler: Any = None) -> Any:
        if grad_scaler is None:
            return super().step(closure)
        loss = closure_loss(closure)
        state = grad_scaler._per_optimizer_states[id(self)]
        sources = [list(g["params"]) for g in self.param_groups]
        if state["stage"].name == "UNSCALED":  # the user called scaler.unscale_(opt) first
            inv_scale = 1.0
            flags = list(state["found_inf_per_device"].values())
            found_inf = sum(float(v.item()) for v in flags) > 0
        else:
            inv_scale = float(grad_scaler._get_scale_async().double().reciprocal().float().item())
            # One read checks the scaled gradients and measures their norm for clipping
            # (GradScaler's own check would read them once more); the verdict is recorded
            # where the scaler's update() looks for it.
            grads = grads_of(sources)
            norm, bad = grad_norm(grads, inv_scale)
            flag = (
                bad.reshape(1).float()
                if isinstance(bad, Tensor)
                else torch.tensor([1.0 if bad else 0.0], device=grads[0].device if grads else None)
            )
            state["found_inf_per_device"] = {flag.device: flag}
            found_inf = bool(flag.item() > 0)
            if self._clips():
                self._amp_cached_norm = (inv_scale, grads_signature(grads), norm)
        if found_inf:
            self._amp_cached_norm = None
            return loss
        try:
            self._update(sources, inv_scale, grads_on_params=True)
        finally:
            self._amp_cached_norm = None
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        saved = copy.deepcopy(state_dict)
        super().load_state_dict(state_dict)  # casts floating state to each param's dtype
        ids = [i for g in saved["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(ids, params):
            for key in _FP32_STATE:  # keep the full-precision state full precision
                value = saved["state"].get(i, {}).get(key)
                if isinstance(value, Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32)
