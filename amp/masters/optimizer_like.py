"""What amp accepts as an optimizer: a ``torch.optim.Optimizer``, or an object that behaves like
one (apex accepts its LARC wrapper the same way): ``param_groups`` (a list of dicts with
"params"), ``state``, and the methods amp patches or calls; and the seam between amp's step and
a fused optimizer (``amp.optimizers``' tensor-list base, ``FusedOptimizer``), written once here
as Protocols: amp looks for these methods on any optimizer and takes the fused paths where they
are (amp/masters/stash.py, backward.py), and the optimizers implement them without importing
amp's step."""

from __future__ import annotations

from typing import Any, List, Protocol, Union, runtime_checkable

import torch
from torch import Tensor

REQUIRED_METHODS = ("step", "zero_grad", "state_dict", "load_state_dict")


def is_optimizer_like(obj: Any) -> bool:
    if isinstance(obj, torch.optim.Optimizer):
        return True
    groups = getattr(obj, "param_groups", None)
    return (
        isinstance(groups, list)
        and all(isinstance(g, dict) and "params" in g for g in groups)
        and hasattr(obj, "state")
        and all(callable(getattr(obj, name, None)) for name in REQUIRED_METHODS)
    )


def check_optimizer_like(where: str, obj: Any) -> None:
    if not is_optimizer_like(obj):
        raise TypeError(
            f"{where} must be a torch.optim.Optimizer, an optimizer-like object (param_groups, "
            f"state, {', '.join(REQUIRED_METHODS)}; e.g. amp.parallel.LARC), or a list of them; "
            f"got {type(obj).__name__}"
        )


# Parameters per param group, as amp hands them to a fused optimizer: the model's (half)
# parameters, whose fp32 masters, under O2, are the optimizer's own ``param_groups``. typing's
# generics: a module-level alias is evaluated at import, and Python 3.8's builtins cannot be
# subscripted.
ParamGroups = List[List[Tensor]]


@runtime_checkable
class DeferredStep(Protocol):
    """A fused optimizer that unscales as it steps (``amp.initialize(..., defer_unscale=True)``):
    when ``scale_loss`` exits amp asks it whether the still-scaled gradients hold an inf/NaN
    (read-only), and ``step()`` becomes one fused pass that unscales, updates and writes the half
    model copy. Having both methods is what makes amp treat an optimizer as fused."""

    def _amp_grads_nonfinite(
        self, model_params: ParamGroups, inv_scale: float
    ) -> Union[bool, Tensor]: ...

    def _amp_fused_step(self, model_params: ParamGroups, inv_scale: float) -> None: ...


@runtime_checkable
class UnscaledStep(Protocol):
    """A fused optimizer whose step follows amp's own one-pass unscale (apex's order, the
    default): the gradients it reads are unscaled already, and the step writes the half model
    copies in ``model_params`` in the same pass as the update."""

    def _amp_unscaled_step(self, model_params: ParamGroups) -> None: ...


@runtime_checkable
class GradNormNote(Protocol):
    """A fused optimizer that reuses the gradient norm amp's unscale pass measured (for its
    clipping) instead of measuring it again."""

    def _amp_note_grad_norm(self, norm: Union[float, Tensor], grads: list[Tensor]) -> None: ...
