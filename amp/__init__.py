"""Apex-compatible mixed precision for PyTorch.

Quick start (runs on CPU)::

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .casting.legacy import disable_casts, init
from .casting.registry import (
    float_function,
    half_function,
    promote_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from .frontend import initialize, load_state_dict, state_dict
from .handle import scale_loss
from .masters.stash import master_params
from .multi_tensor_apply import multi_tensor_applier
from .scaler import LossScaler

# Last, after every submodule import: the package attribute `_amp_state` is apex's state object,
# not the submodule of the same name (`from amp._amp_state import ...` still finds the module).
from ._amp_state import _amp_state as _amp_state  # isort: skip

__all__ = [
    "LossScaler",
    "__version__",
    "disable_casts",
    "float_function",
    "half_function",
    "init",
    "initialize",
    "load_state_dict",
    "master_params",
    "multi_tensor_applier",
    "optimizers",
    "parallel",
    "promote_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
    "scale_loss",
    "state_dict",
]


def __getattr__(name: str) -> Any:
    # amp.optimizers (fused optimizers) and amp.parallel (LARC) are imported on first use, so
    # the core works without them and `import amp` stays light.
    if name in ("optimizers", "parallel"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
