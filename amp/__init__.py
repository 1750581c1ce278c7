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
from .frontend import initialize, load_state_dict, state_dict
from .handle import scale_loss
from .master import master_params
from .scaler import LossScaler

__all__ = [
    "LossScaler",
    "__version__",
    "initialize",
    "load_state_dict",
    "master_params",
    "optimizers",
    "scale_loss",
    "state_dict",
]


def __getattr__(name: str) -> Any:
    # amp.optimizers (fused optimizers) is imported on first use, so the core works without it
    # and `import amp` stays light.
    if name == "optimizers":
        return importlib.import_module(".optimizers", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
