"""FusedAdagrad, FusedNovoGrad and FusedMixedPrecisionLamb against plain-torch references,
step by step, in fp32 and with a half model copy written by the kernel (apex's run_optimizers
style), on every backend (AVX2, generic, pure-torch fallback)."""

from __future__ import annotations

import math

import pytest
import torch

from amp.kernels import ops as mt
from amp.optimizers import FusedAdagrad, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad

SIZES = [1, 7, 300, 4097, 40000]  # 40000 spans two 32768-element kernel chunks


def _params(seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype).requires_grad_() for n in SIZES]


def _clone(ps, dtype=None):
    return [p.detach().clone().to(dtype or p.dtype).requires_grad_() for p in ps]


def _grads(step: int, like) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) for p in like]


def _set(ps, grads) -> None:
    for p, g in zip(ps, grads):
        p.grad = g.to(p.dtype).clone()


class RefNovoGrad:
    """NovoGrad in float64, written from the paper (per-tensor second moment of the grad
    norm), with apex's bias correction and moment modes."""

    def __init__(
        self,
        params,
        lr,
        betas,
        eps,
        wd,
        grad_averaging,
        reg_inside_moment,
        bias_correction=True,
        norm_type=2,
        init_zero=False,
    ) -> None:
        self.p = [p.detach().double().clone() for p in params]
        self.m = [torch.zeros_like(p) for p in self.p]
        self.n: list = [None] * len(self.p)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, wd
        self.b3 = 1 - self.b1 if grad_averaging else 1.0
        self.inside, self.bc, self.norm_type, self.init_zero = (
            reg_inside_moment,
            bias_correction,
            norm_type,
            init_zero,
        )
        self.t = 0

    def step(self, grads) -> None:
        self.t += 1
        bc1 = 1 - self.b1**self.t if self.bc else 1.0
        bc2 = math.sqrt(1 - self.b2**self.t) if self.bc else 1.0
        for i, g in enumerate(grads):
            g = g.double()
            n = float(g.norm()) if self.norm_type == 2 else float(g.abs().max())
            first = self.n[i] is None
            if first and not self.init_zero:
                self.n[i] = n  # the blend starts from the first step's norm
            elif self.norm_type == 2:
                old = 0.0 if first else self.n[i]
                self.n[i] = math.sqrt(self.b2 * old**2 + (1 - self.b2) * n * n)
            else:
                old = 0.0 if first else self.n[i]
                self.n[i] = self.b2 * old + (1 - self.b2) * n
            denom = self.n[i] / bc2 + self.eps
            p = self.p[i]
            if self.inside:
                self.m[i] = self.b1 * self.m[i] + self.b3 * (g / denom + self.wd * p)
                self.p[i] = p - self.lr * self.m[i] / bc1
            else:
                self.m[i] = self.b1 * self.m[i] + self.b3 * g
                self.p[i] = p - self.lr * ((self.m[i] / bc1) / denom + self.wd * p)


def ref_adagrad_w(p, g, h, lr, eps, wd):
    """apex's decoupled Adagrad mode in float64."""
    h = h + g * g
    return p - lr * (g / (h.sqrt() + eps) + wd * p), h


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_fused_adagrad_matches_torch_adagrad(backend, wd):
    fused, ref = _params(), _params()
    opt = FusedAdagrad(fused, lr=0.05, weight_decay=wd)
    ref_opt = torch.optim.Adagrad(ref, lr=0.05, weight_decay=wd, eps=1e-10)
    for s in range(15):
        grads = _grads(s, fused)
        _set(fused, grads)
        _set(ref, grads)
        opt.step()
        ref_opt.step()
        for a, b in zip(fused, ref):  # step by step, as apex's tests
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # torch.optim.Adagrad reads FusedAdagrad's state as its own
    back = torch.optim.Adagrad(_clone(fused), lr=0.05, weight_decay=wd)
    back.load_state_dict(opt.state_dict())
    for st_b, p in zip(back.state.values(), fused):
        torch.testing.assert_close(st_b["sum"], opt.state[p]["sum"])


def test_fused_adagrad_w_mode_matches_reference(backend):
    fused = _params()
    ref = [p.detach().double() for p in fused]
    hs = [torch.zeros_like(r) for r in ref]
    opt = FusedAdagrad(fused, lr=0.05, weight_decay=0.1, adagrad_w_mode=True)
    for s in range(10):
        grads = _grads(s, fused)
        _set(fused, grads)
        opt.step()
        for i, g in enumerate(grads):
            ref[i], hs[i] = ref_adagrad_w(ref[i], g.double(), hs[i], 0.05, 1e-10, 0.1)
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a.detach().double(), b, rtol=1e-5, atol=1e-6)


NOVO_CASES = [
    dict(
        betas=(0.95, 0.0),
        wd=0.0,
        grad_averaging=False,
        reg_inside_moment=True,
        bias_correction=False,
    ),  # apex's own test configuration
    dict(betas=(0.9, 0.999), wd=0.01, grad_averaging=True, reg_inside_moment=False),
    dict(betas=(0.9, 0.98), wd=0.01, grad_averaging=True, reg_inside_moment=True),
    dict(
        betas=(0.9, 0.98),
        wd=0.0,
        grad_averaging=True,
        reg_inside_moment=False,
        norm_type=0,
        init_zero=True,
    ),
]


@pytest.mark.parametrize("case", NOVO_CASES, ids=["apex-test", "decoupled", "inside", "max"])
def test_fused_novograd_matches_reference(backend, case):
    fused = _params()
    ref = RefNovoGrad(fused, lr=1e-2, eps=1e-8, **case)
    kw = {k: v for k, v in case.items() if k != "wd"}
    opt = FusedNovoGrad(fused, lr=1e-2, eps=1e-8, weight_decay=case["wd"], **kw)
    for s in range(15):
        grads = _grads(s, fused)
        _set(fused, grads)
        opt.step()
        ref.step(grads)
        for a, b in zip(fused, ref.p):
            torch.testing.assert_close(a.detach().double(), b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["adagrad", "novograd"])
def test_kernel_writes_half_copy_of_fp32_master(backend, op, half):
    """The O2 shape: half grads in, fp32 master updated, half model copy written in the same
    pass -- equal to the fp32 step on the widened grads, then a cast."""
    masters = [p.detach().clone() for p in _params()]
    ref = [m.clone() for m in masters]
    halves = [m.to(half) for m in masters]
    grads = [g.to(half) for g in _grads(0, masters)]
    wide = [g.float() for g in grads]
    if op == "adagrad":
        sums, rsums = [torch.zeros_like(m) for m in masters], [torch.zeros_like(m) for m in ref]
        mt.adagrad(
            grads, masters, sums, halves, lr=0.1, eps=1e-10, weight_decay=0.01, grad_scale=0.5
        )
        mt.adagrad(wide, ref, rsums, lr=0.1, eps=1e-10, weight_decay=0.01, grad_scale=0.5)
    else:
        ms, rms = [torch.zeros_like(m) for m in masters], [torch.zeros_like(m) for m in ref]
        n1, n2 = torch.zeros(len(SIZES)), torch.zeros(len(SIZES))
        kw = dict(
            lr=0.1,
            beta1=0.9,
            beta2=0.99,
            eps=1e-8,
            step=1,
            weight_decay=0.01,
            init_norms=True,
            grad_scale=0.5,
        )
        mt.novograd(grads, masters, ms, halves, grad_norms=n1, **kw)
        mt.novograd(wide, ref, rms, grad_norms=n2, **kw)
        assert torch.equal(n1, n2)
    for m, r, h in zip(masters, ref, halves):
        assert torch.equal(m, r)
        assert torch.equal(h, m.to(half))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_mixed_precision_lamb_matches_fp32_lamb_on_masters(backend, half):
    """Reduced-precision params + internal fp32 masters give the fp32 FusedLAMB run on the
    same (half-rounded) gradients, and the params are the masters cast to half."""
    base = _params()
    model = _clone(base, half)
    masters = [p.detach().to(half).float().requires_grad_() for p in base]
    mp = FusedMixedPrecisionLamb(model, lr=1e-2, reduced_precision_dtype=half)
    ref = FusedLAMB(masters, lr=1e-2)
    for s in range(10):
        grads = [g.to(half) for g in _grads(s, base)]
        _set(model, grads)
        _set(masters, [g.float() for g in grads])
        mp.step()
        ref.step()
        for p, m in zip(model, masters):
            st = mp.state[p]
            assert st["master_param"].dtype == st["exp_avg"].dtype == torch.float32
            torch.testing.assert_close(st["master_param"], m.detach(), rtol=1e-6, atol=1e-7)
            assert torch.equal(p.detach(), st["master_param"].to(half))
    assert mp.param_groups[0]["step"] == 10


def test_mixed_precision_lamb_resume_keeps_fp32_state():
    model = _clone(_params(), torch.bfloat16)
    opt = FusedMixedPrecisionLamb(model, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    _set(model, _grads(0, model))
    opt.step()
    saved = opt.state_dict()
    model2 = [p.detach().clone().requires_grad_() for p in model]
    opt2 = FusedMixedPrecisionLamb(model2, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    opt2.load_state_dict(saved)
    for p, q in zip(model, model2):
        for key in ("master_param", "exp_avg", "exp_avg_sq"):
            assert opt2.state[q][key].dtype == torch.float32
            assert torch.equal(opt2.state[q][key], opt.state[p][key])
    grads = _grads(1, model)
    _set(model, grads)
    _set(model2, grads)
    opt.step()
    opt2.step()
    assert all(torch.equal(a, b) for a, b in zip(model, model2))


def test_mixed_precision_lamb_with_grad_scaler_skips_overflow_and_unscales():
    model = _clone(_params(), torch.bfloat16)
    ref = _clone(model)
    opt = FusedMixedPrecisionLamb(model, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    ref_opt = FusedMixedPrecisionLamb(ref, lr=1e-2, reduced_precision_dtype=torch.bfloat16)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))
    grads = _grads(0, model)
    _set(model, [g * 1024.0 for g in grads])
    model[1].grad.view(-1)[0] = float("inf")
    before = [p.detach().clone() for p in model]
    with pytest.warns(FutureWarning):  # torch deprecates step(grad_scaler=...), apex's API
        scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model))
    assert opt.param_groups[0]["step"] == 0 and scaler.get_scale() == 512.0
    _set(model, [g * 512.0 for g in grads])
    _set(ref, grads)
    with pytest.warns(FutureWarning):
        scaler.step(opt)
    ref_opt.step()
    for a, b in zip(model, ref):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)  # one bf16 rounding apart


@pytest.mark.parametrize("clip", [1.0, 0.0], ids=["clipping", "no clipping"])
def test_mixed_precision_lamb_after_scaler_unscale_is_unscaled_once(clip):
    """scaler.unscale_(opt) before scaler.step(opt) (to clip or log true gradients): the step
    takes the gradients as unscaled, as torch's own optimizers do, and steps as without it."""
    results = []
    for unscale_first in (False, True):
        model = _clone(_params(), torch.bfloat16)
        opt = FusedMixedPrecisionLamb(
            model, lr=1e-2, max_grad_norm=clip, reduced_precision_dtype=torch.bfloat16
        )
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))
        _set(model, [g * 1024.0 for g in _grads(0, model)])
        if unscale_first:
            scaler.unscale_(opt)
        with pytest.warns(FutureWarning):
            scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == 1024.0
        results.append([p.detach().clone() for p in model])
    plain, unscaled = results
    assert all(torch.equal(a, b) for a, b in zip(plain, unscaled))


def test_new_optimizers_validate_arguments():
    p = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="FusedAdagrad: invalid lr -1"):
        FusedAdagrad(p, lr=-1)
    with pytest.raises(ValueError, match="norm_type must be 2"):
        FusedNovoGrad(p, norm_type=1)
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedNovoGrad(p, amsgrad=True)
    with pytest.raises(TypeError, match="reduced_precision_dtype"):
        FusedMixedPrecisionLamb(p, reduced_precision_dtype=torch.float32)
    with pytest.raises(ValueError, match="step must be an int"):
        FusedMixedPrecisionLamb(p, step=-1)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: FusedAdagrad(ps, lr=0.05, weight_decay=0.01),
        lambda ps: FusedNovoGrad(ps, lr=1e-2, weight_decay=0.01),
        lambda ps: FusedNovoGrad(ps, lr=1e-2, norm_type=0, reg_inside_moment=True),
    ],
    ids=["adagrad", "novograd", "novograd-max"],
)
def test_compiled_and_fallback_agree(make, monkeypatch):
    from amp import _ext  # noqa: PLC0415

    results = []
    for disable in ("0", "1"):
        monkeypatch.setenv("AMP_DISABLE_EXTENSION", disable)
        _ext.reset()
        ps = _params()
        opt = make(ps)
        for s in range(20):
            _set(ps, _grads(s, ps))
            opt.step()
        results.append(ps)
    _ext.reset()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
