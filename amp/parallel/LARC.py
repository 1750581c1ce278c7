"""LARC (You et al., "Large Batch Training of Convolutional Networks", 2017) as apex's
``apex.parallel.LARC``: a wrapper around any optimizer that rescales each parameter's gradient
by a local learning rate, the trust ratio ``trust_coefficient * ||p|| / (||g|| + wd * ||p|| +
eps)``, before the wrapped optimizer's step.

It is optimizer-like (``param_groups``, ``state``, ``step``, ``zero_grad``, ``state_dict``,
``load_state_dict``, ``add_param_group``), so it goes through ``amp.initialize`` like an
optimizer. Under amp the wrapped optimizer steps the fp32 masters, whose unscaled gradients
LARC rescales.
"""

from __future__ import annotations

from typing import Any

import torch


class LARC:
    """Wrap ``optimizer``; ``clip=True`` (default) clips each parameter's learning rate to
    ``min(local_lr, lr)``, ``clip=False`` scales it to ``local_lr * lr``. The groups' weight
    decay is taken over by LARC (added to the gradient before the rescaling) and handed back
    to the optimizer after its step, as apex does::

        optimizer = amp.parallel.LARC(torch.optim.SGD(model.parameters(), lr=0.1))
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    """

    def __init__(
        self, optimizer: Any, trust_coefficient: float = 0.02, clip: bool = True, eps: float = 1e-8
    ) -> None:
        for name, value in (("trust_coefficient", trust_coefficient), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"LARC: {name} must be a number >= 0; got {value!r}")
        if not isinstance(clip, bool):
            raise TypeError(f"LARC: clip must be True or False; got {clip!r}")
        if not hasattr(optimizer, "param_groups") or not callable(getattr(optimizer, "step", None)):
            raise TypeError(
                "LARC: optimizer must be a torch.optim.Optimizer (or behave like "
                f"one); got {type(optimizer).__name__}"
            )
        self.optim = optimizer
        self.trust_coefficient = float(trust_coefficient)
        self.clip = clip
        self.eps = float(eps)

    # --- the wrapped optimizer's surface -------------------------------------------------
    def __getstate__(self) -> Any:
        return self.optim.__getstate__()

    def __setstate__(self, state: Any) -> None:
        self.optim.__setstate__(state)

    def __repr__(self) -> str:
        return self.optim.__repr__()

    @property
    def state(self) -> Any:
        return self.optim.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optim.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optim.defaults

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    # --- the step ------------------------------------------------------------------------
    @torch.no_grad()
    def _rescale_grads(self) -> list[float]:
        """Fold weight decay and the trust ratio into each gradient; returns the groups' weight
        decays, which are set to 0 for the wrapped step."""
        decays = []
        for group in self.optim.param_groups:
            wd = float(group.get("weight_decay", 0.0))
            decays.append(wd)
            if "weight_decay" in group:
                group["weight_decay"] = 0.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                p_norm = torch.linalg.vector_norm(p.float())
                g_norm = torch.linalg.vector_norm(p.grad.float())
                if p_norm == 0 or g_norm == 0:
                    continue  # as apex: such a parameter keeps its plain gradient
                local_lr = self.trust_coefficient * p_norm / (g_norm + p_norm * wd + self.eps)
                if self.clip:  # min(local_lr, lr), expressed as a factor on lr
                    local_lr = torch.clamp(local_lr / group["lr"], max=1.0)
                p.grad.add_(p, alpha=wd)
                p.grad.mul_(local_lr.to(p.grad.dtype))
        return decays

    def step(self, closure: Any = None) -> Any:
        decays = self._rescale_grads()
        try:
            return self.optim.step() if closure is None else self.optim.step(closure)
        finally:
            for group, wd in zip(self.optim.param_groups, decays):
                if "weight_decay" in group:
                    group["weight_decay"] = wd
