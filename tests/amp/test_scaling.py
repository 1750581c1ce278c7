"""Dynamic loss scaling: side by side with torch.amp.GradScaler, clamping, skipped steps that leave
parameters and optimizer state bit-identical, and amp's state round trip in one process."""

from __future__ import annotations

import copy
import logging
import random

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data, quickstart_model

import amp
from amp._torch_compat import unscale_unfused_
from amp.masters.unscale import unscale_lists
from amp.scaler import LossScaler


def _overflow_pattern(steps: int, seed: int, p: float = 0.25) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < p for _ in range(steps)]


def _side_by_side(pattern, init_scale, growth, backoff, window, min_scale=None, max_scale=None):
    """Train the same fp32 model twice -- amp (dynamic scaling, no casts) and plain torch with
    GradScaler -- injecting an inf gradient at the steps the pattern marks."""
    x, y = make_data()
    amp_model, amp_opt = quickstart_model()
    amp_model, amp_opt = amp.initialize(
        amp_model,
        amp_opt,
        opt_level="O1",
        patch_torch_functions=False,
        verbosity=0,
        dynamic_init_scale=init_scale,
        scale_growth_factor=growth,
        scale_backoff_factor=backoff,
        scale_window=window,
        min_loss_scale=min_scale,
        max_loss_scale=float("inf") if max_scale is None else max_scale,  # GradScaler: no cap
    )
    ref_model, ref_opt = quickstart_model()
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=init_scale,
        growth_factor=growth,
        backoff_factor=backoff,
        growth_interval=window,
    )
    amp_scales, ref_scales = [], []
    for overflow in pattern:
        amp_opt.zero_grad()
        with amp.scale_loss(F.mse_loss(amp_model(x), y), amp_opt) as scaled:
            scaled.backward()
            if overflow:
                amp_model.weight.grad[0, 0] = float("inf")
        amp_opt.step()
        amp_scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])

        ref_opt.zero_grad()
        scaler.scale(F.mse_loss(ref_model(x), y)).backward()
        if overflow:
            ref_model.weight.grad[0, 0] = float("inf")
        scaler.step(ref_opt)
        scaler.update()
        if min_scale is not None or max_scale is not None:  # apex's clamp, applied by hand
            clamped = min(max(scaler.get_scale(), min_scale or 0.0), max_scale or float("inf"))
            scaler.update(new_scale=float(clamped))
        ref_scales.append(scaler.get_scale())
    return amp_scales, ref_scales, (amp_model, ref_model)


@pytest.mark.parametrize(
    "init_scale,growth,backoff,window,seed",
    [(2.0**16, 2.0, 0.5, 3, 0), (1000.1, 3.3, 0.37, 2, 1), (2.0**10, 1.5, 0.9, 4, 2)],
)
def test_scale_sequence_and_trajectory_equal_gradscaler(init_scale, growth, backoff, window, seed):
    pattern = _overflow_pattern(40, seed)
    amp_scales, ref_scales, (amp_model, ref_model) = _side_by_side(
        pattern, init_scale, growth, backoff, window
    )
    assert amp_scales == ref_scales
    assert len(set(amp_scales)) > 3  # the pattern exercised growth and backoff
    # Same unscale kernel, same skipped steps: the parameters agree bit for bit.
    assert torch.equal(amp_model.weight, ref_model.weight)
    assert torch.equal(amp_model.bias, ref_model.bias)


def test_scale_is_clamped_to_min_and_max():
    pattern = [True] * 8 + [False] * 12 + [True, False] * 3
    amp_scales, ref_scales, _ = _side_by_side(
        pattern, init_scale=16.0, growth=2.0, backoff=0.5, window=2, min_scale=2.0, max_scale=64.0
    )
    assert amp_scales == ref_scales
    assert min(amp_scales) == 2.0 and max(amp_scales) == 64.0


def test_scaler_never_grows_to_inf_and_static_scale_never_moves():
    s = LossScaler(
        "dynamic", init_scale=3e38, growth_factor=2.0, scale_window=1, max_loss_scale=float("inf")
    )
    assert s.update(found_inf=False) is False and s.loss_scale() == pytest.approx(3e38)
    static = LossScaler(128.0)
    assert static.update(found_inf=True) is False and static.loss_scale() == 128.0


def _train_steps(model, optimizer, x, y, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
            scaled.backward()
        optimizer.step()


def _snapshot(model, optimizer):
    return (
        [p.detach().clone() for p in model.parameters()],
        [p.detach().clone() for p in amp.master_params(optimizer)],
        copy.deepcopy(optimizer.state_dict()["state"]),
    )


def _assert_identical(a, b):
    for xs, ys in zip(a[:2], b[:2]):
        assert all(torch.equal(x, y) for x, y in zip(xs, ys))
    assert a[2].keys() == b[2].keys()
    for key in a[2]:
        for name, value in a[2][key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[2][key][name])), name


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
@pytest.mark.half_device
def test_overflow_step_is_skipped_bit_identically_and_logged_once(opt_level, bad, caplog):
    x, y = make_data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=opt_level, verbosity=1, dynamic_init_scale=2.0**8
    )
    _train_steps(model, optimizer, x, y, 3)
    before = _snapshot(model, optimizer)
    scale = amp.state_dict()["loss_scaler0"]["loss_scale"]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp"):
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
            scaled.backward()
            model[2].weight.grad[0, 0] = bad  # one bad gradient element
        optimizer.step()
    _assert_identical(before, _snapshot(model, optimizer))
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == scale / 2
    messages = [r.getMessage() for r in caplog.records if r.name == "amp"]
    assert messages == [
        f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scale / 2}"
    ]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amp"):
        _train_steps(model, optimizer, x, y, 1)  # the next clean step updates again
    assert not caplog.records
    assert not torch.equal(before[1][0], next(amp.master_params(optimizer)))


@pytest.mark.half_device
def test_overflow_not_logged_at_verbosity_zero(caplog):
    x, y = make_data()
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    with caplog.at_level(logging.DEBUG, logger="amp"):
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
            scaled.backward()
            model.weight.grad.fill_(float("inf"))
        optimizer.step()
    assert not caplog.records
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2.0**15


def test_unscale_matches_gradscaler_and_fallback():
    torch.manual_seed(0)
    grads = [torch.randn(100) * 1000, torch.randn(7, 3).half() * 100]
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    found = unscale_lists([(p, p, None) for p in params], 1.0 / 1024)
    assert found.found_inf().item() == 0.0 and found.nonfinite is False
    expected = [g.clone() for g in grads]
    flag = torch.zeros(1)
    unscale_unfused_(expected, flag, torch.tensor(1.0 / 1024))
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected)) and flag.item() == 0
    params[1].grad[0, 0] = float("nan")
    found = unscale_lists([(p, p, None) for p in params], 1.0)
    assert found.found_inf().item() == 1.0 and found.nonfinite is True
    unscale_unfused_([params[1].grad], flag, torch.tensor(1.0))
    assert flag.item() == 1.0


@pytest.mark.half_device
def test_amp_state_round_trip_in_process():
    model, optimizer = quickstart_model()
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level="O1",
        num_losses=2,
        scale_window=3,
        dynamic_init_scale=256.0,
        verbosity=0,
    )
    x, y = make_data()
    for overflow in (False, True, False, False):
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer, loss_id=1) as scaled:
            scaled.backward()
            if overflow:
                model.weight.grad.fill_(float("inf"))
        optimizer.step()
        optimizer.zero_grad()
    saved = copy.deepcopy(amp.state_dict())
    assert saved["loss_scaler1"] == {"loss_scale": 128.0, "unskipped": 2}
    model2, optimizer2 = quickstart_model()
    amp.initialize(model2, optimizer2, opt_level="O1", num_losses=2, scale_window=3, verbosity=0)
    assert amp.state_dict() != saved
    amp.load_state_dict(saved)
    assert amp.state_dict() == saved
