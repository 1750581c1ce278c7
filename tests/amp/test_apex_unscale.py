"""apex's gradient contract with the fused optimizers: when ``scale_loss`` exits, the model's
gradients (O1) or the fp32 master gradients (O2) hold the unscaled values, so clipping
``amp.master_params(optimizer)`` before ``step()`` clips the right numbers. Each fused optimizer is
run against the same optimizer seen by amp as a plain optimizer (the generic path: torch's
GradScaler unscale, separate master gradients, plain step) and, where torch has one, against the
torch.optim equivalent, step by step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data

import amp
from amp.optimizers import (
    FusedAdagrad,
    FusedAdam,
    FusedLAMB,
    FusedMixedPrecisionLamb,
    FusedNovoGrad,
    FusedSGD,
)

SCALE = 2.0**10
FUSED = {
    "adam": lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.01),
    "sgd": lambda ps: FusedSGD(ps, lr=0.05, momentum=0.9),
    "lamb": lambda ps: FusedLAMB(ps, lr=1e-2),
    "adagrad": lambda ps: FusedAdagrad(ps, lr=0.05),
    "novograd": lambda ps: FusedNovoGrad(ps, lr=1e-2, weight_decay=0.01),
    "mp_lamb": lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-2),
}
TORCH = {
    "adam": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, eps=1e-10),
}


class PlainView:
    """The same optimizer without amp's fused seam: amp treats it as any optimizer-like object
    (generic path), which is apex's behaviour by construction."""

    def __init__(self, inner) -> None:
        self.inner = inner

    param_groups = property(lambda self: self.inner.param_groups)
    state = property(lambda self: self.inner.state)

    def step(self, closure=None):
        return self.inner.step(closure)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, sd):
        self.inner.load_state_dict(sd)

    def add_param_group(self, group):
        self.inner.add_param_group(group)


def _setup(make_opt, opt_level, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = make_opt(list(model.parameters()))
    return amp.initialize(
        model, opt, opt_level=opt_level, verbosity=0, dynamic_init_scale=SCALE, **kw
    )


def _backward(model, opt, x, y, inject=False):
    opt.zero_grad()
    with amp.scale_loss(F.mse_loss(model(x).float(), y), opt) as scaled:
        scaled.backward()
        if inject:
            next(model.parameters()).grad.view(-1)[0] = float("inf")


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("name", list(FUSED))
@pytest.mark.half_device
def test_grads_unscaled_when_scale_loss_exits(opt_level, name):
    x, y = make_data()
    model_f, opt_f = _setup(FUSED[name], opt_level)
    model_g, opt_g = _setup(lambda ps: PlainView(FUSED[name](ps)), opt_level)
    _backward(model_f, opt_f, x, y)
    _backward(model_g, opt_g, x, y)
    for pf, pg in zip(amp.master_params(opt_f), amp.master_params(opt_g)):
        assert pf.dtype == torch.float32 and pf.grad is not None  # O2: masters filled
        assert pf.grad.dtype == torch.float32
        assert torch.equal(pf.grad, pg.grad)  # the same bits as torch's GradScaler unscale
    if opt_level == "O1":  # the model's own grads, unscaled in place
        for m, p in zip(model_f.parameters(), amp.master_params(opt_f)):
            assert m is p
    # unscaled, not carrying the loss scale: compare with an fp32 backward without amp
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    F.mse_loss(plain(x), y).backward()
    for pf, q in zip(amp.master_params(opt_f), plain.parameters()):
        torch.testing.assert_close(pf.grad, q.grad, rtol=5e-2, atol=5e-3)


def _train_with_clipping(model, opt, steps=6, max_norm=0.05, inject_at=None):
    x, y = make_data()
    norms = []
    for s in range(steps):
        _backward(model, opt, x, y, inject=s == inject_at)
        norms.append(float(torch.nn.utils.clip_grad_norm_(amp.master_params(opt), max_norm)))
        opt.step()
    return norms


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("name", list(FUSED))
@pytest.mark.half_device
def test_clip_grad_norm_through_master_params_matches_generic_path(opt_level, name):
    model_f, opt_f = _setup(FUSED[name], opt_level)
    norms_f = _train_with_clipping(model_f, opt_f, inject_at=2)
    model_g, opt_g = _setup(lambda ps: PlainView(FUSED[name](ps)), opt_level)
    norms_g = _train_with_clipping(model_g, opt_g, inject_at=2)
    assert not math.isfinite(norms_f[2])  # the injected inf: clip saw it, the step was skipped
    finite = [i for i in range(len(norms_f)) if i != 2]
    assert [norms_f[i] for i in finite] == pytest.approx([norms_g[i] for i in finite], rel=1e-5)
    assert min(norms_f[i] for i in finite) > 0.05  # clipping was active every step
    for a, b in zip(amp.master_params(opt_f), amp.master_params(opt_g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(model_f.parameters(), model_g.parameters()):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("name", list(TORCH))
@pytest.mark.half_device
def test_clip_grad_norm_fused_matches_torch_optim(opt_level, name):
    model_f, opt_f = _setup(FUSED[name], opt_level)
    _train_with_clipping(model_f, opt_f)
    model_t, opt_t = _setup(TORCH[name], opt_level)
    _train_with_clipping(model_t, opt_t)
    for a, b in zip(amp.master_params(opt_f), amp.master_params(opt_t)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if opt_level == "O2":  # the half model copy written by the kernel = masters cast
        for m, p in zip(model_f.parameters(), amp.master_params(opt_f)):
            assert torch.equal(m, p.to(m.dtype))


@pytest.mark.half_device
def test_clipping_between_scale_loss_and_step_invalidates_the_measured_norm():
    """FusedAdam's own max_grad_norm reuses the norm amp measured while unscaling -- but not
    once the user has clipped the gradients in between."""
    make = lambda ps: FusedAdam(ps, lr=1e-2, max_grad_norm=0.02)  # noqa: E731
    model_f, opt_f = _setup(make, "O2")
    _train_with_clipping(model_f, opt_f, max_norm=0.05)
    model_g, opt_g = _setup(lambda ps: PlainView(make(ps)), "O2")
    _train_with_clipping(model_g, opt_g, max_norm=0.05)
    for a, b in zip(amp.master_params(opt_f), amp.master_params(opt_g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.half_device
def test_deferred_unscale_is_opt_in_and_keeps_grads_scaled():
    x, y = make_data()
    model, opt = _setup(FUSED["adam"], "O2", defer_unscale=True)
    _backward(model, opt, x, y)
    assert all(p.grad is None for p in amp.master_params(opt))  # nothing materialized
    model_e, opt_e = _setup(FUSED["adam"], "O2")
    _backward(model_e, opt_e, x, y)
    for m, p in zip(model.parameters(), amp.master_params(opt_e)):
        torch.testing.assert_close(m.grad.float(), p.grad * SCALE, rtol=1e-3, atol=0)
    opt.step()
    opt_e.step()
    for a, b in zip(amp.master_params(opt), amp.master_params(opt_e)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.half_device
def test_fused_sgd_materialize_master_grads_false_defers_at_o2_only():
    x, y = make_data()
    make = lambda ps: FusedSGD(ps, lr=0.05, materialize_master_grads=False)  # noqa: E731
    model, opt = _setup(make, "O2")
    _backward(model, opt, x, y)
    assert all(p.grad is None for p in amp.master_params(opt))
    model1, opt1 = _setup(make, "O1")  # apex unscales in place at O1 regardless
    _backward(model1, opt1, x, y)
    model_g, opt_g = _setup(lambda ps: PlainView(make(ps)), "O1")
    _backward(model_g, opt_g, x, y)
    for a, b in zip(model1.parameters(), model_g.parameters()):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.half_device
def test_o2_master_grads_dropped_after_step_as_apex():
    x, y = make_data()
    model, opt = _setup(FUSED["sgd"], "O2")
    _backward(model, opt, x, y)
    opt.step()
    assert all(p.grad is None for p in amp.master_params(opt))


def test_a_cached_norm_is_reused_only_where_in_place_foreach_ops_bump_versions(monkeypatch):
    """The norm amp measured while unscaling is reused only while the gradients' versions are
    unchanged; on a device whose in-place foreach ops leave versions alone (torch 2.1 on an
    accelerator) a clip_grad_norm_ in between would go unseen, so nothing is reused there."""
    from amp import _torch_compat as compat  # noqa: PLC0415
    from amp.optimizers import tensor_lists  # noqa: PLC0415

    g = torch.ones(3)
    assert compat.foreach_bumps_versions("cpu")  # the CPU's foreach kernel runs per-tensor ops
    before = tensor_lists.grads_signature([g])
    torch._foreach_mul_([g], 0.5)  # what clip_grad_norm_ does
    assert tensor_lists.grads_signature([g]) != before
    opt = FusedAdam([torch.nn.Parameter(torch.ones(3))], lr=0.1, max_grad_norm=1.0)
    opt.param_groups[0]["params"][0].grad = torch.full((3,), 2.0)
    params = [list(opt.param_groups[0]["params"])]
    opt._amp_note_grad_norm(123.0, tensor_lists.grads_of(params))  # as if measured: reused
    assert opt._global_norm(params, 1.0, grads_on_params=True) == 123.0
    monkeypatch.setattr(compat, "_foreach_version_answers", {"cpu": False})
    assert tensor_lists.grads_signature([g]) is None
    opt._amp_note_grad_norm(123.0, tensor_lists.grads_of(params))  # untrusted: measured anew
    assert opt._global_norm(params, 1.0, grads_on_params=True) == pytest.approx(12**0.5)
