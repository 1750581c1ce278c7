"""The methods Apex for Ascend adds to every optimizer that goes through ``amp.initialize``:
``get_{model,optimizer}_combined_{params,grads,grad_masks}()`` and
``clip_{model,optimizer}_grad_norm_fused(max_norm, norm_type=2)``, with its messages and rules.

With master weights (O2) the lists are ``[half model (or fp32 masters), float32 own]``, else
``[float32]``, with None where a position has no buffer, as in Ascend. Before the first backward
pass, or when combining is off for the optimizer, the getters log why and return ``[]``.
"""

from __future__ import annotations

import math
import types
from typing import Any, Optional

import torch
from torch import Tensor

from .._amp_state import maybe_log

NAMES = (
    "get_model_combined_params",
    "get_model_combined_grads",
    "get_model_combined_grad_masks",
    "get_optimizer_combined_params",
    "get_optimizer_combined_grads",
    "get_optimizer_combined_grad_masks",
    "clip_model_grad_norm_fused",
    "clip_optimizer_grad_norm_fused",
)


def _combined(optimizer: Any, what: str) -> Optional[Any]:
    """The optimizer's valid combined buffers, or None after logging Ascend's reason."""
    npu_fused = getattr(optimizer, "is_npu_fused_optimizer", False) is True
    if what == "params" and not npu_fused:
        maybe_log("To get combined params, please use npu fused optimizer.")
        return None
    if what in ("grads", "grad_masks") and not (
        npu_fused or getattr(optimizer, "accelerate", False)
    ):
        maybe_log(
            f"To get combined {what}, please set combine_grad=True or use npu fused optimizer."
        )
        return None
    combined = optimizer._amp_stash.combined
    if combined is None or not combined.still_valid():
        maybe_log(f"Please get the combined {what} after backward phase.")
        return None
    if what == "params":
        combined.combine_params(len(optimizer.param_groups))
    return combined


def _getter(side: str, what: str) -> Any:
    def get(self: Any) -> list[Optional[Tensor]]:
        combined = _combined(self, what)
        if combined is None:
            return []
        if what == "grad_masks":
            masks = combined.grad_masks(side)
            grads = combined.buffers(side, "grads")
            # Ascend's positions: a mask where there is a gradient buffer.
            it = iter(masks)
            return [None if g is None else next(it) for g in grads]
        return combined.buffers(side, what)

    get.__name__ = f"get_{side}_combined_{what}"
    get.__doc__ = f"Ascend's combined {what} of the {side} side (see amp.ascend.methods)."
    return get


@torch.no_grad()
def clip_grad_norm_fused(
    grads: list[Optional[Tensor]], max_norm: float, norm_type: float = 2.0
) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over whole buffers: one norm per buffer (the
    padding is zero, so it adds nothing), the total, one multiply per buffer. Returns the
    total norm. As Ascend's, a NaN norm leaves the gradients alone (its ``clip_coef < 1`` is
    False for NaN) where torch's would multiply them by NaN; an inf norm zeroes them."""
    flats = [g for g in grads if g is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if math.isnan(norm_type):
        raise ValueError(f"norm_type must be a number; got {norm_type}")
    if not flats:
        return torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in flats]
    device = norms[0].device
    total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in norms]), norm_type)
    coef = max_norm / (total + 1e-6)
    # Not clamp(max=1): clamp keeps a NaN. where(coef < 1) maps NaN to 1, on the device.
    coef = torch.where(coef < 1.0, coef, torch.ones_like(coef))
    for g in flats:
        g.mul_(coef.to(g.device))
    return total


def _clip_model(self: Any, max_norm: float, norm_type: float = 2) -> Tensor:
    if self._amp_stash.master_weights:
        raise RuntimeError("clip_model_grad_norm_fused can only be used when opt_level='O1'")
    return clip_grad_norm_fused(self.get_model_combined_grads(), max_norm, norm_type)


def _clip_optimizer(self: Any, max_norm: float, norm_type: float = 2) -> Tensor:
    return clip_grad_norm_fused(self.get_optimizer_combined_grads(), max_norm, norm_type)


def attach_combined_methods(optimizer: Any) -> None:
    for name in NAMES:
        if hasattr(optimizer, name):
            raise RuntimeError(f"Incoming optimizer already has {name} defined.")
    for side in ("model", "optimizer"):
        for what in ("params", "grads", "grad_masks"):
            method = _getter(side, what)
            setattr(optimizer, method.__name__, types.MethodType(method, optimizer))
    optimizer.clip_model_grad_norm_fused = types.MethodType(_clip_model, optimizer)
    optimizer.clip_optimizer_grad_norm_fused = types.MethodType(_clip_optimizer, optimizer)
