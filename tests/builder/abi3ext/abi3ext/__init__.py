"""``abi3ext.twice(x)``: a torch operator from a stable-ABI extension module."""

import torch

from . import _C  # noqa: F401  -- loading it registers torch.ops.abi3ext


def twice(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.abi3ext.twice(x)
