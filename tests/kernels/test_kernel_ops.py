"""Property tests: every multi-tensor kernel against a plain-torch reference, on every
backend (AVX2 and generic compiled kernels, pure-torch fallback)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp.kernels import ops as mt

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
# Sizes around the kernels' block (512) and chunk (32768) edges, plus empty tensors.
SIZES = [0, 1, 3, 7, 17, 511, 512, 513, 1000, 32769, 70001]
PROP = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

dtypes = st.sampled_from(FLOATS)
size_lists = st.lists(st.sampled_from(SIZES), min_size=1, max_size=6)
nonfinite = st.sampled_from([None, math.inf, -math.inf, math.nan])


def _tol(dtype: torch.dtype) -> dict:
    return {
        torch.float32: dict(rtol=1e-5, atol=1e-6),
        torch.float16: dict(rtol=2e-3, atol=1e-4),
        torch.bfloat16: dict(rtol=1.6e-2, atol=1e-3),
    }[dtype]


def _randn(sizes: list[int], dtype: torch.dtype, seed: int, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=gen) * scale).to(dtype) for n in sizes]


def _poison(ts: list[torch.Tensor], value, seed: int) -> bool:
    """Put `value` into one element of the first non-empty tensor; True if done."""
    if value is None:
        return False
    for t in ts:
        if t.numel():
            t.view(-1)[seed % t.numel()] = value
            return True
    return False


@PROP
@given(
    sizes=size_lists,
    din=dtypes,
    dout=dtypes,
    s=st.floats(1e-3, 1e3),
    bad=nonfinite,
    seed=st.integers(0, 2**16),
)
def test_scale_matches_torch(backend, sizes, din, dout, s, bad, seed):
    xs = _randn(sizes, din, seed)
    poisoned = _poison(xs, bad, seed)
    outs = [torch.full((n,), 7.0, dtype=dout) for n in sizes]
    found = mt.scale(xs, outs, s)
    s32 = torch.tensor(s, dtype=torch.float32)
    for x, o in zip(xs, outs):
        assert torch.equal(
            o,
            (x.float() * s32).to(dout),
        ) or (
            # NaN != NaN: compare NaN positions separately
            torch.equal(o.isnan(), (x.float() * s32).isnan())
            and torch.equal(torch.nan_to_num(o), torch.nan_to_num((x.float() * s32).to(dout)))
        )
    expected = any(not bool(torch.isfinite(x.float() * s32).all()) for x in xs)
    assert found == expected
    assert poisoned <= found  # an injected inf/nan is always reported


@PROP
@given(
    sizes=size_lists,
    dx=dtypes,
    dy=dtypes,
    dout=dtypes,
    a=st.floats(-4, 4),
    b=st.floats(-4, 4),
    check=st.sampled_from([-1, 0, 1]),
    bad=nonfinite,
    poison_y=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_axpby_matches_torch(backend, sizes, dx, dy, dout, a, b, check, bad, poison_y, seed):
    xs, ys = _randn(sizes, dx, seed), _randn(sizes, dy, seed + 1)
    poisoned = _poison(ys if poison_y else xs, bad, seed)
    outs = [torch.empty(n, dtype=dout) for n in sizes]
    found = mt.axpby(xs, ys, outs, a, b, check)
    a32, b32 = torch.tensor(a), torch.tensor(b)
    for x, y, o in zip(xs, ys, outs):
        ref = (x.float() * a32 + y.float() * b32).to(dout)
        torch.testing.assert_close(o, ref, rtol=0, atol=0, equal_nan=True)
    checked_poison = poisoned and (check == -1 or check == (1 if poison_y else 0))
    assert found == checked_poison


@PROP
@given(
    sizes=size_lists,
    dtype=dtypes,
    s=st.floats(1e-3, 1e3),
    bad=nonfinite,
    per_tensor=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_l2norm_matches_torch(backend, sizes, dtype, s, bad, per_tensor, seed):
    xs = _randn(sizes, dtype, seed)
    poisoned = _poison(xs, bad, seed)
    before = [x.clone() for x in xs]
    total, per, found = mt.l2norm(xs, s, per_tensor)
    for x, b in zip(xs, before):  # read-only
        assert torch.equal(x.isnan(), b.isnan()) and torch.equal(x.nan_to_num(), b.nan_to_num())
    scaled = [x.double() * float(torch.tensor(s, dtype=torch.float32)) for x in xs]
    ref_per = torch.stack([torch.linalg.vector_norm(v) for v in scaled])
    ref_total = float(torch.linalg.vector_norm(ref_per))
    assert found == poisoned
    if poisoned:
        assert not math.isfinite(total)
        return
    assert total == pytest.approx(ref_total, rel=1e-5, abs=1e-6)
    if per_tensor:
        torch.testing.assert_close(per, ref_per, rtol=1e-5, atol=1e-6)
    else:
        assert per is None


def _adam_reference(g, p, m, v, *, lr, beta1, beta2, eps, step, adam_w_mode, wd, gs):
    """torch.optim.Adam/AdamW's arithmetic on float32 copies."""
    g, p, m, v = g.float() * gs, p.float().clone(), m.float().clone(), v.float().clone()
    if adam_w_mode:
        p.mul_(1 - lr * wd)
    else:
        g = g.add(p, alpha=wd)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bc1)
    return p, m, v


@PROP
@given(
    sizes=size_lists,
    dg=dtypes,
    dp=dtypes,
    master=st.sampled_from([None, torch.float16, torch.bfloat16]),
    adam_w_mode=st.booleans(),
    step=st.integers(1, 50),
    wd=st.sampled_from([0.0, 0.01, 0.3]),
    gs=st.sampled_from([1.0, 2.0**-10, 0.37]),
    seed=st.integers(0, 2**16),
)
def test_adam_matches_reference(backend, sizes, dg, dp, master, adam_w_mode, step, wd, gs, seed):
    if master is not None:
        dp = torch.float32  # fp32 master weights with a half model copy
    grads = _randn(sizes, dg, seed, scale=1.0 / gs)
    params = _randn(sizes, dp, seed + 1)
    m = _randn(sizes, dp, seed + 2, scale=0.1)
    v = [t.abs() for t in _randn(sizes, dp, seed + 3, scale=0.01)]
    models = None if master is None else [torch.empty(n, dtype=master) for n in sizes]
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, step=step)
    refs = [
        _adam_reference(g, p, a, b, adam_w_mode=adam_w_mode, wd=wd, gs=gs, **hp)
        for g, p, a, b in zip(grads, params, m, v)
    ]
    g_before = [g.clone() for g in grads]
    mt.adam(
        grads, params, m, v, models, adam_w_mode=adam_w_mode, weight_decay=wd, grad_scale=gs, **hp
    )
    for g, gb in zip(grads, g_before):
        assert torch.equal(g, gb)  # gradients are never written
    for i, (rp, rm, rv) in enumerate(refs):
        torch.testing.assert_close(params[i].float(), rp, **_tol(dp))
        torch.testing.assert_close(m[i].float(), rm, **_tol(dp))
        torch.testing.assert_close(v[i].float(), rv, **_tol(dp))
        if models is not None:  # written from the same fp32 value, in the same pass
            assert torch.equal(models[i], params[i].to(master))


def _sgd_reference(g, p, b, *, lr, momentum, dampening, wd, nesterov, wd_after, first, gs):
    d, p = g.float() * gs, p.float().clone()
    if wd and not wd_after:
        d = d.add(p, alpha=wd)
    if momentum:
        b = d.clone() if first else b.float().clone().mul_(momentum).add_(d, alpha=1 - dampening)
        d = d.add(b, alpha=momentum) if nesterov else b
    if wd and wd_after:
        d = d.add(p, alpha=wd)
    return p.add_(d, alpha=-lr), b


@PROP
@given(
    sizes=size_lists,
    dg=dtypes,
    dp=dtypes,
    master=st.sampled_from([None, torch.bfloat16]),
    momentum=st.sampled_from([0.0, 0.9]),
    dampening=st.sampled_from([0.0, 0.1]),
    nesterov=st.booleans(),
    wd=st.sampled_from([0.0, 1e-2]),
    wd_after=st.booleans(),
    first=st.booleans(),
    gs=st.sampled_from([1.0, 0.25]),
    seed=st.integers(0, 2**16),
)
def test_sgd_matches_reference(
    backend, sizes, dg, dp, master, momentum, dampening, nesterov, wd, wd_after, first, gs, seed
):
    if master is not None:
        dp = torch.float32
    if nesterov:
        dampening = 0.0
    grads = _randn(sizes, dg, seed)
    params = _randn(sizes, dp, seed + 1)
    bufs = _randn(sizes, dp, seed + 2) if momentum else None
    models = None if master is None else [torch.empty(n, dtype=master) for n in sizes]
    hp = dict(lr=0.05, momentum=momentum, dampening=dampening, nesterov=nesterov)
    refs = [
        _sgd_reference(
            g, p, bufs[i] if bufs else None, wd=wd, wd_after=wd_after, first=first, gs=gs, **hp
        )
        for i, (g, p) in enumerate(zip(grads, params))
    ]
    mt.sgd(
        grads,
        params,
        bufs,
        models,
        weight_decay=wd,
        wd_after_momentum=wd_after,
        first_run=first,
        grad_scale=gs,
        **hp,
    )
    for i, (rp, rb) in enumerate(refs):
        torch.testing.assert_close(params[i].float(), rp, **_tol(dp))
        if momentum:
            torch.testing.assert_close(bufs[i].float(), rb, **_tol(dp))
        if models is not None:
            assert torch.equal(models[i], params[i].to(master))


def _lamb_paper(g, p, m, v, *, lr, beta1, beta2, eps, step, wd, gs, nvlamb):
    """LAMB from You et al. 2019 (Algorithm 2) in float64, decoupled weight decay."""
    g, p, m, v = g.double() * gs, p.double(), m.double(), v.double()
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    r = (m / (1 - beta1**step)) / ((v / (1 - beta2**step)).sqrt() + eps)
    u = r + wd * p
    pn, un = p.norm(), u.norm()
    trust = pn / un if (wd != 0 or nvlamb) and pn > 0 and un > 0 else 1.0
    return p - lr * trust * u, m, v


@PROP
@given(
    sizes=size_lists,
    dg=dtypes,
    master=st.sampled_from([None, torch.bfloat16]),
    step=st.integers(1, 20),
    wd=st.sampled_from([0.0, 0.01]),
    nvlamb=st.booleans(),
    gs=st.sampled_from([1.0, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_lamb_matches_paper(backend, sizes, dg, master, step, wd, nvlamb, gs, seed):
    grads = _randn(sizes, dg, seed)
    params = _randn(sizes, torch.float32, seed + 1)
    m = _randn(sizes, torch.float32, seed + 2, scale=0.1)
    v = [t.abs() for t in _randn(sizes, torch.float32, seed + 3, scale=0.01)]
    models = None if master is None else [torch.empty(n, dtype=master) for n in sizes]
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, step=step)
    refs = [
        _lamb_paper(g, p, a, b, wd=wd, gs=gs, nvlamb=nvlamb, **hp)
        for g, p, a, b in zip(grads, params, m, v)
    ]
    mt.lamb(grads, params, m, v, models, weight_decay=wd, use_nvlamb=nvlamb, grad_scale=gs, **hp)
    for i, (rp, rm, rv) in enumerate(refs):
        torch.testing.assert_close(params[i].double(), rp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m[i].double(), rm, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v[i].double(), rv, rtol=1e-5, atol=1e-7)
        if models is not None:
            assert torch.equal(models[i], params[i].to(master))
