"""What one optimizer's step does at each of its stages (amp/masters/stash.py ``Stage``), seen from
the public API: which method the step runs, when a closure is refused and what that refusal leaves,
and an overflow's skip, which holds until the next ``step()`` whatever comes between."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data

import amp

CLOSURE_REFUSED = "amp does not support a closure with a fused optimizer's step"
pytestmark = pytest.mark.half_device  # O1 computes in float16 on torch's default device


class SeamSGD(torch.optim.Optimizer):
    """Plain SGD speaking the whole fused seam, recording which of its entries amp calls."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})
        self.calls: list[str] = []

    def _sgd(self, grads_of, inv_scale: float) -> None:
        for group, models in zip(self.param_groups, grads_of):
            for p, m in zip(group["params"], models):
                if m.grad is not None:
                    p.add_(m.grad.float() * inv_scale, alpha=-group["lr"])
                    if m is not p:
                        m.copy_(p)

    @torch.no_grad()
    def step(self, closure=None):
        self.calls.append("step")
        self._sgd([g["params"] for g in self.param_groups], 1.0)

    def _amp_grads_nonfinite(self, model_params, inv_scale):
        self.calls.append("check")
        return any(
            not bool(torch.isfinite(m.grad).all())
            for group in model_params
            for m in group
            if m.grad is not None
        )

    @torch.no_grad()
    def _amp_fused_step(self, model_params, inv_scale):
        self.calls.append("fused")
        self._sgd(model_params, inv_scale)

    @torch.no_grad()
    def _amp_unscaled_step(self, model_params):
        self.calls.append("unscaled")
        self._sgd([g["params"] for g in self.param_groups], 1.0)


def _setup(defer: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    opt = SeamSGD(model.parameters(), lr=0.05)
    return amp.initialize(
        model, opt, opt_level="O1", verbosity=1, defer_unscale=defer, dynamic_init_scale=2.0**10
    )


def _backward(model, opt, inject: bool = False) -> None:
    x, y = make_data()
    with amp.scale_loss(F.mse_loss(model(x), y), opt) as scaled:
        scaled.backward()
        if inject:
            model.weight.grad[0, 0] = float("inf")


@pytest.mark.parametrize("defer", [False, True])
def test_each_stage_steps_with_its_own_method(defer: bool) -> None:
    model, opt = _setup(defer)
    _backward(model, opt)
    opt.step()
    opt.step()  # nothing of amp's in flight any more: the optimizer's own step
    assert opt.calls == (["check", "fused", "step"] if defer else ["unscaled", "step"])


def test_a_deferred_step_refuses_a_closure_before_anything_changes() -> None:
    model, opt = _setup(defer=True)
    _backward(model, opt)
    with pytest.raises(RuntimeError, match=CLOSURE_REFUSED):
        opt.step(lambda: 0.0)
    opt.step()  # still the deferred step: the gradients are still scaled
    assert opt.calls == ["check", "fused"]


def test_an_unscaled_fused_step_refuses_a_closure_after_leaving_its_stage() -> None:
    model, opt = _setup(defer=False)
    _backward(model, opt)
    with pytest.raises(RuntimeError, match=CLOSURE_REFUSED):
        opt.step(lambda: 0.0)
    opt.step()  # the gradients are unscaled: the optimizer's own step takes them
    assert opt.calls == ["step"]


@pytest.mark.parametrize("defer", [False, True])
def test_the_skip_holds_until_the_next_step(defer: bool, caplog) -> None:
    model, opt = _setup(defer)
    _backward(model, opt, inject=True)  # overflow: the next step is skipped
    opt.zero_grad()
    _backward(model, opt)  # finite, but the verdict stands
    before = model.weight.detach().clone()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp"):
        opt.step()
    assert torch.equal(model.weight, before)
    assert [r.getMessage() for r in caplog.records if r.name == "amp"] == [
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 512.0"
    ]
    assert "fused" not in opt.calls and "unscaled" not in opt.calls
    opt.step()  # the skipped step took the stage with it: the optimizer's own step now
    assert opt.calls[-1] == "step" and not torch.equal(model.weight, before)
