"""What amp accepts as an optimizer: a ``torch.optim.Optimizer``, or an object that behaves like
one (apex accepts its LARC wrapper the same way): ``param_groups`` (a list of dicts with
"params"), ``state``, and the methods amp patches or calls."""
from __future__ import annotations

from typing import Any

import torch

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
