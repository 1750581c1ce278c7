"""A sparse gradient (``nn.Embedding(sparse=True)``) stops every path of amp's step with one
message, amp/masters/unscale.py's SPARSE_GRADIENTS: the per-tensor unscale (any torch
optimizer), amp's one-pass unscale (fused optimizers), the combined buffers (combine_grad,
NpuFused*), the deferred check (defer_unscale=True) and a fused optimizer's own step without amp."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import amp
from amp.masters.unscale import SPARSE_GRADIENTS

MakeOpt = Callable[[Any], torch.optim.Optimizer]

PATHS: dict[str, tuple[MakeOpt, dict[str, Any]]] = {
    "lists O1": (lambda ps: torch.optim.SGD(ps, lr=0.1), {"opt_level": "O1"}),
    "lists O2": (lambda ps: torch.optim.SGD(ps, lr=0.1), {"opt_level": "O2"}),
    "combined": (lambda ps: torch.optim.SGD(ps, lr=0.1), {"opt_level": "O1", "combine_grad": True}),
    "combined npu fused": (lambda ps: amp.optimizers.NpuFusedSGD(ps, lr=0.1), {"opt_level": "O1"}),
    "one pass O1": (lambda ps: amp.optimizers.FusedSGD(ps, lr=0.1), {"opt_level": "O1"}),
    "one pass O2": (lambda ps: amp.optimizers.FusedAdam(ps, lr=0.1), {"opt_level": "O2"}),
    "deferred O1": (
        lambda ps: amp.optimizers.FusedSGD(ps, lr=0.1),
        {"opt_level": "O1", "defer_unscale": True},
    ),
    "deferred O2": (
        lambda ps: amp.optimizers.FusedAdam(ps, lr=0.1),
        {"opt_level": "O2", "defer_unscale": True},
    ),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_sparse_gradient_stops_scale_loss_with_one_message(path: str) -> None:
    make_opt, kwargs = PATHS[path]
    torch.manual_seed(0)
    model = torch.nn.Embedding(10, 4, sparse=True)
    model, opt = amp.initialize(model, make_opt(model.parameters()), verbosity=0, **kwargs)
    loss = model(torch.tensor([1, 2, 3])).float().sum()
    with pytest.raises(RuntimeError, match=f"^{SPARSE_GRADIENTS}$"):
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
    assert model.weight.grad is not None and model.weight.grad.is_sparse  # it was one


def test_a_sparse_gradient_stops_a_fused_optimizers_own_step() -> None:
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = amp.optimizers.FusedSGD(emb.parameters(), lr=0.1)
    emb(torch.tensor([1])).sum().backward()
    before = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match=f"^{SPARSE_GRADIENTS}$"):
        opt.step()
    assert torch.equal(emb.weight, before)
