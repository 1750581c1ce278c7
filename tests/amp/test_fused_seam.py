"""amp core's side of the fused-optimizer seam, exercised with a tiny fused-style SGD written
here in plain torch (the real fused optimizers are tested in tests/optimizers). The deferred
path (gradients kept scaled until the step) is opt-in: ``defer_unscale=True``; by default amp
unscales when scale_loss exits, as apex does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data

import amp


class TinyFusedSGD(torch.optim.Optimizer):
    """Plain SGD that also speaks the seam: a read-only non-finite check and an update that
    unscales inside the step and writes the half model copy in the same pass."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})
        self.calls: list[str] = []

    @torch.no_grad()
    def step(self, closure=None):
        self.calls.append("step")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])

    @torch.no_grad()
    def _amp_grads_nonfinite(self, model_params, inv_scale):
        self.calls.append("check")
        return any(
            not bool(torch.isfinite(m.grad.float() * inv_scale).all())
            for group in model_params
            for m in group
            if m.grad is not None
        )

    @torch.no_grad()
    def _amp_fused_step(self, model_params, inv_scale):
        self.calls.append("fused")
        for group, models in zip(self.param_groups, model_params):
            for p, m in zip(group["params"], models):
                if m.grad is None:
                    continue
                p.add_(m.grad.float() * inv_scale, alpha=-group["lr"])
                if m is not p:
                    m.copy_(p)


def _setup(opt_class, opt_level, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = opt_class(model.parameters(), lr=0.05)
    kwargs.setdefault("defer_unscale", True)
    return amp.initialize(
        model, optimizer, opt_level=opt_level, verbosity=0, dynamic_init_scale=2.0**10, **kwargs
    )


def _step(model, optimizer, x, y, loss_ids=(0,), inject=False):
    optimizer.zero_grad()
    for loss_id in loss_ids:
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer, loss_id=loss_id) as scaled:
            scaled.backward()
            if inject:
                model[0].weight.grad[0, 0] = float("inf")
    optimizer.step()


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.half_device
def test_fused_path_matches_generic_path(opt_level):
    x, y = make_data()
    fused_model, fused_opt = _setup(TinyFusedSGD, opt_level)
    ref_model, ref_opt = _setup(torch.optim.SGD, opt_level)
    amp_scales = []
    for _ in range(5):
        _step(fused_model, fused_opt, x, y)
        amp_scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    assert fused_opt.calls == ["check", "fused"] * 5  # never the plain step
    # Gradients were never rewritten: the model's grads still hold the scaled values, and no
    # fp32 master-gradient buffers were allocated.
    assert all(p.grad is None for p in amp.master_params(fused_opt) if opt_level == "O2")
    for _ in range(5):
        _step(ref_model, ref_opt, x, y)
    for a, b in zip(amp.master_params(fused_opt), amp.master_params(ref_opt)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(fused_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_fused_grads_stay_scaled_in_memory():
    x, y = make_data()
    model, optimizer = _setup(TinyFusedSGD, "O1", patch_torch_functions=False)
    optimizer.zero_grad()
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
        scaled.backward()
    scaled_grad = model[0].weight.grad.clone()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    F.mse_loss(ref(x), y).backward()
    torch.testing.assert_close(scaled_grad, ref[0].weight.grad * 2.0**10)


@pytest.mark.half_device
def test_fused_overflow_skips_without_calling_the_update():
    x, y = make_data()
    model, optimizer = _setup(TinyFusedSGD, "O2")
    before = [p.detach().clone() for p in amp.master_params(optimizer)]
    _step(model, optimizer, x, y, inject=True)
    assert optimizer.calls == ["check"]
    assert all(torch.equal(a, b) for a, b in zip(before, amp.master_params(optimizer)))
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2.0**9
    _step(model, optimizer, x, y)
    assert optimizer.calls == ["check", "check", "fused"]


@pytest.mark.half_device
def test_two_losses_before_one_step_fall_back_to_generic_path():
    x, y = make_data()
    fused_model, fused_opt = _setup(TinyFusedSGD, "O2", num_losses=2)
    ref_model, ref_opt = _setup(torch.optim.SGD, "O2", num_losses=2)
    for model, opt in ((fused_model, fused_opt), (ref_model, ref_opt)):
        amp.load_state_dict(
            {
                "loss_scaler0": {"loss_scale": 1024.0, "unskipped": 0},
                "loss_scaler1": {"loss_scale": 16.0, "unskipped": 0},
            }
        )
        _step(model, opt, x, y, loss_ids=(0, 1))
    # First loss checked by the fused path; the second forced the generic path for this step.
    assert fused_opt.calls == ["check", "step"]
    for a, b in zip(amp.master_params(fused_opt), amp.master_params(ref_opt)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    _step(fused_model, fused_opt, x, y)
    assert fused_opt.calls[-2:] == ["check", "fused"]  # back on the fused path


def test_fused_optimizer_at_o0_uses_its_plain_step():
    x, y = make_data()
    model, optimizer = _setup(TinyFusedSGD, "O0")
    _step(model, optimizer, x, y)
    assert optimizer.calls == ["step"]


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.half_device
def test_default_unscales_on_exit_and_uses_the_generic_step(opt_level):
    """An optimizer that speaks only the deferred seam (no _amp_unscaled_step): by default amp
    unscales in its own pass and runs the optimizer's plain step on the unscaled grads."""
    x, y = make_data()
    model, optimizer = _setup(TinyFusedSGD, opt_level, defer_unscale=False)
    ref_model, ref_opt = _setup(torch.optim.SGD, opt_level, defer_unscale=False)
    for m, o in ((model, optimizer), (ref_model, ref_opt)):
        o.zero_grad()
        with amp.scale_loss(F.mse_loss(m(x), y), o) as scaled:
            scaled.backward()
    for a, b in zip(amp.master_params(optimizer), amp.master_params(ref_opt)):
        assert torch.equal(a.grad, b.grad)  # unscaled, fp32 masters filled at O2
    optimizer.step()
    ref_opt.step()
    assert optimizer.calls == ["step"]
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
