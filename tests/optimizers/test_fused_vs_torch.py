"""FusedAdam / FusedSGD against torch.optim over many steps, state_dict interchange with
torch.optim, FusedLAMB against the paper, and compiled-vs-fallback agreement."""

from __future__ import annotations

import copy

import pytest
import torch

from amp.optimizers import FusedAdam, FusedLAMB, FusedSGD

SIZES = [1, 7, 300, 4097, 40000]  # 40000 spans two 32768-element kernel chunks


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).requires_grad_() for n in SIZES]


def _clone(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def _set_grads(step: int, *param_lists) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    grads = [torch.randn(p.shape, generator=g) for p in param_lists[0]]
    for ps in param_lists:
        for p, gr in zip(ps, grads):
            p.grad = gr.clone()


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    a = [x.detach().double() for x in a]
    b = [y.detach().double() for y in b]
    num = sum(float((x - y).norm() ** 2) for x, y in zip(a, b)) ** 0.5
    den = sum(float(y.norm() ** 2) for y in b) ** 0.5
    return num / den


def _groups(ps, **second):
    return [{"params": ps[:3]}, {"params": ps[3:], **second}]


def _run(opt_a, opt_b, pa, pb, steps):
    for s in range(steps):
        _set_grads(s, pa, pb)
        opt_a.step()
        opt_b.step()


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_fused_adamw_matches_torch_adamw(backend, wd):
    pa, pb = _params(), _params()
    ref = torch.optim.AdamW(
        _groups(pa, lr=3e-3), lr=1e-2, betas=(0.8, 0.99), eps=1e-8, weight_decay=wd
    )
    fused = FusedAdam(
        _groups(pb, lr=3e-3),
        lr=1e-2,
        betas=(0.8, 0.99),
        eps=1e-8,
        weight_decay=wd,
        adam_w_mode=True,
    )
    _run(ref, fused, pa, pb, 100)
    assert _rel(pb, pa) < 1e-6
    torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5)


def test_fused_adam_l2_matches_torch_adam(backend):
    pa, pb = _params(), _params()
    ref = torch.optim.Adam(pa, lr=1e-2, weight_decay=0.1)
    fused = FusedAdam(pb, lr=1e-2, weight_decay=0.1, adam_w_mode=False)
    _run(ref, fused, pa, pb, 100)
    assert _rel(pb, pa) < 1e-6


def test_fused_adam_without_bias_correction_matches_formula(backend):
    (p,) = [torch.ones(10, requires_grad=True)]
    opt = FusedAdam([p], lr=0.1, bias_correction=False, betas=(0.5, 0.75), eps=0.0)
    p.grad = torch.full((10,), 2.0)
    opt.step()  # m = 1, v = 1: update = lr * m / sqrt(v)
    torch.testing.assert_close(p.detach(), torch.full((10,), 0.9))


@pytest.mark.parametrize(
    "kw",
    [
        dict(momentum=0.0),
        dict(momentum=0.9, dampening=0.1, weight_decay=1e-2),
        dict(momentum=0.9, nesterov=True, weight_decay=1e-2),
    ],
)
def test_fused_sgd_matches_torch_sgd(backend, kw):
    pa, pb = _params(), _params()
    ref = torch.optim.SGD(_groups(pa, lr=0.02), lr=0.05, **kw)
    fused = FusedSGD(_groups(pb, lr=0.02), lr=0.05, **kw)
    _run(ref, fused, pa, pb, 100)
    assert _rel(pb, pa) < 1e-6
    torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5)


def test_fused_sgd_wd_after_momentum(backend):
    (p,) = [torch.ones(4, requires_grad=True)]
    opt = FusedSGD([p], lr=0.1, momentum=0.5, weight_decay=0.1, wd_after_momentum=True)
    for _ in range(2):
        p.grad = torch.ones(4)
        opt.step()
    # step 1: buf = 1, d = 1 + 0.1*1 -> p = 0.89; step 2: buf = 1.5, d = 1.5 + 0.089
    torch.testing.assert_close(p.detach(), torch.full((4,), 0.89 - 0.1 * (1.5 + 0.089)))


def test_state_dict_fused_adam_to_torch_adamw_and_back():
    pa, pb = _params(), _params()
    ref = torch.optim.AdamW(pa, lr=1e-2, weight_decay=0.01)
    fused = FusedAdam(pb, lr=1e-2, weight_decay=0.01)
    _run(ref, fused, pa, pb, 5)
    sd = fused.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["step"].item() == 5.0
    # Swap: torch continues from the fused state and fused from torch's state.
    pc, pd = _clone(pb), _clone(pa)
    ref2 = torch.optim.AdamW(pc, lr=1e-2, weight_decay=0.01)
    ref2.load_state_dict(copy.deepcopy(sd))  # as through torch.save/torch.load
    fused2 = FusedAdam(pd, lr=1e-2, weight_decay=0.01)
    fused2.load_state_dict(ref.state_dict())
    assert fused2.param_groups[0]["step"] == 5
    _run(ref2, fused2, pc, pd, 20)
    _run(ref, fused, pa, pb, 20)
    assert _rel(pc, pa) < 1e-6 and _rel(pd, pa) < 1e-6


def test_state_dict_fused_sgd_torch_sgd_round_trip():
    pa, pb = _params(), _params()
    ref = torch.optim.SGD(pa, lr=0.05, momentum=0.9)
    fused = FusedSGD(pb, lr=0.05, momentum=0.9)
    _run(ref, fused, pa, pb, 3)
    pc, pd = _clone(pb), _clone(pa)
    ref2 = torch.optim.SGD(pc, lr=0.05, momentum=0.9)
    ref2.load_state_dict(copy.deepcopy(fused.state_dict()))
    fused2 = FusedSGD(pd, lr=0.05, momentum=0.9)
    fused2.load_state_dict(ref.state_dict())
    _run(ref2, fused2, pc, pd, 10)
    _run(ref, fused, pa, pb, 10)
    assert _rel(pc, pa) < 1e-6 and _rel(pd, pa) < 1e-6


def _lamb_paper_step(params, grads, state, step, *, lr, b1, b2, eps, wd, max_norm):
    """LAMB (You et al. 2019, Alg. 2) with apex's global-norm pre-clipping, in float64."""
    gnorm = sum(float(g.double().norm() ** 2) for g in grads) ** 0.5
    clip = gnorm / max_norm if max_norm > 0 and gnorm > max_norm else 1.0
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
        g = g.double() / clip
        m, v = state.setdefault(i, (torch.zeros_like(g), torch.zeros_like(g)))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        state[i] = (m, v)
        u = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps) + wd * p
        pn, un = float(p.norm()), float(u.norm())
        trust = pn / un if pn > 0 and un > 0 else 1.0
        out.append(p - lr * trust * u)
    return out


@pytest.mark.parametrize("max_norm", [0.0, 1.0])
def test_fused_lamb_matches_paper(backend, max_norm):
    pb = _params()
    ref = [p.detach().double().clone() for p in pb]
    opt = FusedLAMB(pb, lr=1e-2, weight_decay=0.01, max_grad_norm=max_norm)
    state: dict = {}
    for s in range(1, 21):
        _set_grads(s, pb)
        grads = [p.grad for p in pb]
        ref = _lamb_paper_step(
            ref, grads, state, s, lr=1e-2, b1=0.9, b2=0.999, eps=1e-6, wd=0.01, max_norm=max_norm
        )
        opt.step()
    for p, r in zip(pb, ref):
        torch.testing.assert_close(p.detach().double(), r, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.01, max_grad_norm=0.5),
        lambda ps: FusedSGD(ps, lr=0.05, momentum=0.9, nesterov=True, max_grad_norm=0.5),
        lambda ps: FusedLAMB(ps, lr=1e-2),
    ],
    ids=["adam", "sgd", "lamb"],
)
def test_compiled_and_fallback_agree(make, monkeypatch):
    from amp import _ext  # noqa: PLC0415

    results = []
    for disable in ("0", "1"):
        monkeypatch.setenv("AMP_DISABLE_EXTENSION", disable)
        _ext.reset()
        ps = _params()
        opt = make(ps)
        for s in range(30):
            _set_grads(s, ps)
            opt.step()
        results.append(ps)
    _ext.reset()
    assert _rel(results[0], results[1]) < 1e-6


def test_constructor_validation():
    p = [torch.zeros(1, requires_grad=True)]
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam(p, amsgrad=True)
    with pytest.raises(ValueError, match="Nesterov"):
        FusedSGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="invalid beta"):
        FusedAdam(p, betas=(1.0, 0.999))


def test_step_with_closure_and_missing_grads():
    a, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    opt = FusedAdam([a, b], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (a * 2).sum()
        loss.backward()
        return loss

    assert float(opt.step(closure)) == 6.0
    assert bool((a < 1).all()) and torch.equal(b.detach(), torch.ones(3))  # b had no grad
    assert copy.deepcopy(opt.state_dict())["state"][0]["step"].item() == 1.0
