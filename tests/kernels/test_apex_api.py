"""apex's low-level API: ``amp.multi_tensor_applier(op, noop_flag, tensor_lists, *args)`` with
the ``amp._C.multi_tensor_*`` ops in apex's argument order, checked against plain torch, and the
overflow flag set (never cleared) as apex sets it."""

from __future__ import annotations

import pytest
import torch

from amp import _ext, multi_tensor_applier
from amp.kernels import ops as mt

SIZES = [1, 5, 513, 40000]


@pytest.fixture
def amp_C(compiled_backend):
    return _ext.load()  # the multi_tensor_* entry points are the compiled module's


def _t(dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * scale).to(dtype) for n in SIZES]


def _flag():
    return torch.zeros(1, dtype=torch.int)


@pytest.mark.parametrize("dout", [torch.float32, torch.float16])
def test_multi_tensor_scale(amp_C, dout):
    xs, outs, flag = _t(torch.float16), [torch.empty(n, dtype=dout) for n in SIZES], _flag()
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [xs, outs], 0.25)
    assert flag.item() == 0
    for x, o in zip(xs, outs):
        assert torch.equal(o, (x.float() * 0.25).to(dout))
    xs[2][7] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [xs, outs], 0.25)
    assert flag.item() == 1
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [_t(), _t()], 1.0)
    assert flag.item() == 1  # never cleared by a clean call, as apex


def test_multi_tensor_axpby(amp_C):
    xs, ys, outs, flag = _t(seed=1), _t(seed=2), _t(seed=3), _flag()
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [xs, ys, outs], 2.0, -0.5, -1)
    for x, y, o in zip(xs, ys, outs):
        torch.testing.assert_close(o, 2.0 * x - 0.5 * y)
    ys[0][0] = float("nan")
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [xs, ys, outs], 2.0, -0.5, 0)
    assert flag.item() == 0  # only x is checked
    multi_tensor_applier(amp_C.multi_tensor_axpby, flag, [xs, ys, outs], 2.0, -0.5, 1)
    assert flag.item() == 1


def test_multi_tensor_l2norm(amp_C):
    xs, flag = _t(torch.bfloat16), _flag()
    norm, per = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [xs], True)
    ref = torch.stack([x.double().norm() for x in xs])
    assert norm.dtype == per.dtype == torch.float32 and norm.shape == (1,)
    torch.testing.assert_close(norm.double(), ref.norm().reshape(1), rtol=1e-6, atol=0)
    torch.testing.assert_close(per.double(), ref, rtol=1e-6, atol=0)
    norm2, per2 = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [xs], False)
    assert torch.equal(norm2, norm) and per2.numel() == 0 and flag.item() == 0
    unscaled, _ = multi_tensor_applier(
        amp_C.multi_tensor_unscale_l2norm, flag, [xs], torch.tensor([0.5]), False
    )
    torch.testing.assert_close(unscaled, norm * 0.5)
    xs[3][9] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_l2norm, flag, [xs])
    assert flag.item() == 1


def _adam_state():
    return _t(seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES], [torch.zeros(n) for n in SIZES]


@pytest.mark.parametrize("mode", [0, 1])
def test_multi_tensor_adam_equals_amp_adam(amp_C, mode):
    g, p, m, v = _adam_state()
    g2, p2, m2, v2 = _adam_state()
    multi_tensor_applier(
        amp_C.multi_tensor_adam, _flag(), [g, p, m, v], 1e-2, 0.9, 0.999, 1e-8, 3, mode, 1, 0.01
    )
    mt.adam(
        g2,
        p2,
        m2,
        v2,
        lr=1e-2,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        step=3,
        adam_w_mode=mode == 1,
        weight_decay=0.01,
    )
    assert all(torch.equal(a, b) for a, b in zip(p + m + v, p2 + m2 + v2))


def test_multi_tensor_sgd_skips_when_flag_set_and_writes_half_copy(amp_C):
    g, p, mom = _t(torch.float16, seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES]
    half = [x.half() for x in p]
    before = [x.clone() for x in p]
    flag = torch.ones(1, dtype=torch.int)
    multi_tensor_applier(
        amp_C.multi_tensor_sgd, flag, [g, p, mom, half], 0.0, 0.9, 0.0, 0.1, False, True, False, 1.0
    )
    assert all(torch.equal(a, b) for a, b in zip(p, before))  # apex's SGD: no step on overflow
    flag.zero_()
    multi_tensor_applier(
        amp_C.multi_tensor_sgd, flag, [g, p, mom, half], 0.0, 0.9, 0.0, 0.1, False, True, False, 0.5
    )
    for pi, bi, gi, hi in zip(p, before, g, half):
        torch.testing.assert_close(pi, bi - 0.1 * (gi.float() * 0.5), rtol=1e-6, atol=1e-7)
        assert torch.equal(hi, pi.half())


def test_multi_tensor_lamb_clips_by_the_global_norm(amp_C):
    g, p, m, v = _adam_state()
    g2, p2, m2, v2 = _adam_state()
    multi_tensor_applier(
        amp_C.multi_tensor_lamb,
        _flag(),
        [g, p, m, v],
        1e-2,
        0.9,
        0.999,
        1e-6,
        1,
        1,
        0.01,
        1,
        1,
        torch.tensor([8.0]),
        2.0,
        False,
    )
    mt.lamb(
        g2,
        p2,
        m2,
        v2,
        lr=1e-2,
        beta1=0.9,
        beta2=0.999,
        eps=1e-6,
        step=1,
        weight_decay=0.01,
        grad_scale=2.0 / 8.0,
    )
    assert all(torch.equal(a, b) for a, b in zip(p + m + v, p2 + m2 + v2))


def test_multi_tensor_adagrad_and_novograd_equal_amp_ops(amp_C):
    g, p, h = _t(seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES]
    g2, p2, h2 = _t(seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES]
    multi_tensor_applier(amp_C.multi_tensor_adagrad, _flag(), [g, p, h], 0.1, 1e-10, 1, 0.01)
    mt.adagrad(g2, p2, h2, lr=0.1, eps=1e-10, weight_decay=0.01, w_mode=True)
    assert all(torch.equal(a, b) for a, b in zip(p + h, p2 + h2))
    g, p, m = _t(seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES]
    g2, p2, m2 = _t(seed=1), _t(seed=2), [torch.zeros(n) for n in SIZES]
    norms, norms2 = torch.ones(len(SIZES)), torch.ones(len(SIZES))
    multi_tensor_applier(
        amp_C.multi_tensor_novograd,
        _flag(),
        [g, p, m],
        norms,
        1e-2,
        0.9,
        0.98,
        1e-8,
        2,
        1,
        0.01,
        1,
        1,
        2,
    )
    mt.novograd(
        g2,
        p2,
        m2,
        grad_norms=norms2,
        lr=1e-2,
        beta1=0.9,
        beta2=0.98,
        eps=1e-8,
        step=2,
        weight_decay=0.01,
        moment_mode=1,
    )
    assert torch.equal(norms, norms2)
    assert all(torch.equal(a, b) for a, b in zip(p + m, p2 + m2))


def test_apex_api_errors_name_the_problem(amp_C):
    with pytest.raises(
        ValueError, match="multi_tensor_scale: tensor_lists has 1 lists; expected 2"
    ):
        multi_tensor_applier(amp_C.multi_tensor_scale, _flag(), [_t()], 1.0)
    with pytest.raises(TypeError, match="op must be callable"):
        multi_tensor_applier("multi_tensor_scale", _flag(), [_t(), _t()], 1.0)
    assert multi_tensor_applier.available
