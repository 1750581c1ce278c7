"""The unscale pass amp runs for a fused optimizer when ``scale_loss`` exits (the default, as
apex): every gradient is read once, and that read writes the unscaled gradient (in place when
the model parameter is its own master, into a fresh fp32 master gradient under O2), checks it
for inf/NaN and measures its global norm. The optimizer is handed that norm, so clipping inside
its step needs no second read, and its update then reads the unscaled gradients with scale 1.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from . import multi_tensor_more as mtm
from .unscale import dense, group_by


def _contiguous_grad(param: torch.Tensor) -> torch.Tensor:
    grad = dense(param.grad)  # type: ignore[arg-type]
    if not grad.is_contiguous():
        param.grad = grad = grad.contiguous()
    return grad


def unscale_pairs(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]], inv_scale: float,
                  ) -> tuple[bool, float, list[torch.Tensor]]:
    """For each (model param, master) with a gradient: master.grad = model.grad * inv_scale.

    Returns (any non-finite, global L2 norm of the unscaled gradients, those gradients)."""
    moves: list[tuple[torch.Tensor, torch.Tensor]] = []  # (scaled grad, where it goes unscaled)
    for model_param, master in pairs:
        if model_param.grad is None:
            continue
        grad = _contiguous_grad(model_param)
        if model_param is master:
            out = grad
        else:
            out = torch.empty_like(master, memory_format=torch.contiguous_format)
            master.grad = out
        moves.append((grad, out))
    total_sq, bad, written = 0.0, False, []
    for kind in group_by(moves, lambda m: (m[0].dtype, m[1].dtype, m[0].device)).values():
        ins, outs = [g for g, _ in kind], [o for _, o in kind]
        norm, nonfinite = mtm.scale_l2norm(ins, outs, inv_scale)
        total_sq += norm * norm
        bad = bad or nonfinite
        written.extend(outs)
    return bad, math.sqrt(total_sq), written
