"""amp.parallel.LARC: apex's trust-ratio wrapper, against the formula written out here, and
through amp.initialize (an optimizer-like object) at every opt level."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data

import amp
from amp.optimizers import FusedSGD
from amp.parallel import LARC


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _reference_step(params, grads, lr, wd, trust, clip, eps):
    """SGD on LARC-rescaled gradients, in float64."""
    out = []
    for p, g in zip(params, grads):
        pn, gn = float(p.norm()), float(g.norm())
        if pn != 0 and gn != 0:
            local = trust * pn / (gn + pn * wd + eps)
            if clip:
                local = min(local / lr, 1.0)
            g = (g + wd * p) * local
        out.append(p - lr * g)
    return out


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_larc_matches_formula(clip, wd):
    model = _model()
    lr, trust = 0.1, 0.02
    opt = LARC(
        torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd),
        trust_coefficient=trust,
        clip=clip,
    )
    ref = [p.detach().double().clone() for p in model.parameters()]
    x, y = make_data()
    for _ in range(5):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads = [p.grad.detach().double().clone() for p in model.parameters()]
        ref = _reference_step(ref, grads, lr, wd, trust, clip, 1e-8)
        opt.step()
        assert opt.param_groups[0]["weight_decay"] == wd  # handed back after the step
    for p, r in zip(model.parameters(), ref):
        torch.testing.assert_close(p.detach().double(), r, rtol=1e-5, atol=1e-7)


def test_larc_clip_is_a_cap_scale_is_a_factor():
    """Large trust coefficient: clipping leaves plain SGD, scaling multiplies the step."""
    results = {}
    for clip in (True, False):
        p = torch.nn.Parameter(torch.ones(4))
        opt = LARC(torch.optim.SGD([p], lr=0.1), trust_coefficient=10.0, clip=clip)
        p.grad = torch.full((4,), 0.5)
        opt.step()
        results[clip] = p.detach().clone()
    torch.testing.assert_close(results[True], torch.full((4,), 1 - 0.1 * 0.5))
    local = 10.0 * 2.0 / (1.0 + 1e-8)  # trust * ||p|| / ||g||
    torch.testing.assert_close(results[False], torch.full((4,), 1 - 0.1 * 0.5 * local))


@pytest.mark.parametrize(
    "opt_level",
    ["O0", *(pytest.param(level, marks=pytest.mark.half_device) for level in ("O1", "O2", "O3"))],
)
def test_larc_through_amp_initialize(opt_level):
    model = _model()
    opt = LARC(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    model, opt = amp.initialize(model, opt, opt_level=opt_level, verbosity=0)
    assert isinstance(opt, LARC)
    x, y = make_data()
    first = None
    for _ in range(10):
        opt.zero_grad()
        loss = F.mse_loss(model(x).float(), y)
        first = first if first is not None else loss.item()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
    assert F.mse_loss(model(x).float(), y).item() < first
    if opt_level == "O2":  # LARC's inner optimizer steps the fp32 masters
        masters = list(amp.master_params(opt))
        assert all(p.dtype == torch.float32 for p in masters)
        for m, p in zip(model.parameters(), masters):
            assert torch.equal(m, p.to(m.dtype))


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.half_device
def test_larc_around_fused_sgd_matches_larc_around_torch_sgd(opt_level):
    results = []
    for make in (
        lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    ):
        model = _model()
        opt = LARC(make(model.parameters()))
        model, opt = amp.initialize(
            model, opt, opt_level=opt_level, verbosity=0, dynamic_init_scale=2.0**10
        )
        x, y = make_data()
        for _ in range(5):
            opt.zero_grad()
            with amp.scale_loss(F.mse_loss(model(x).float(), y), opt) as scaled:
                scaled.backward()
            opt.step()
        results.append(list(amp.master_params(opt)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_larc_state_dict_round_trip_and_validation():
    model = _model()
    opt = LARC(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = make_data()
    F.mse_loss(model(x), y).backward()
    opt.step()
    sd = opt.state_dict()
    other = LARC(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    other.load_state_dict(sd)
    assert len(other.state) == len(opt.state) > 0
    with pytest.raises(ValueError, match="trust_coefficient must be a number >= 0; got -1"):
        LARC(torch.optim.SGD(model.parameters(), lr=0.1), trust_coefficient=-1)
    with pytest.raises(TypeError, match="LARC: optimizer must be"):
        LARC("sgd")
