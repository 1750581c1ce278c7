"""amp under numeric storms: long streaks of overflowing steps, denormal and mixed NaN/inf
gradients, a non-finite loss at O0, and a checkpoint taken in the middle of a streak.

Each test states the promise it proves (the ``promise`` marker; docs/promises.md lists them)."""

from __future__ import annotations

import copy
import io
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import make_data

import amp
from amp.scaler import LossScaler

# The apex levels that scale dynamically, and Ascend's combined gradients on top of O2.
CONFIGS = {
    "O1": {"opt_level": "O1"},
    "O2": {"opt_level": "O2"},
    "O2-combine_grad": {"opt_level": "O2", "combine_grad": True},
}
F32_TINY = float(torch.finfo(torch.float32).tiny)


def _build(config: dict, seed: int = 0, **scaling):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return amp.initialize(model, optimizer, verbosity=0, **config, **scaling)


def _step(model, optimizer, x, y, poison=None) -> float:
    optimizer.zero_grad()
    loss = F.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
        if poison is not None:
            poison(model)
    optimizer.step()
    return loss.item()


def _scale() -> float:
    return amp.state_dict()["loss_scaler0"]["loss_scale"]


def _inf_in_last_layer(model) -> None:
    model[2].weight.grad[0, 0] = float("inf")


def _snapshot(model, optimizer):
    return (
        [p.detach().clone() for p in model.parameters()],
        [p.detach().clone() for p in amp.master_params(optimizer)],
        copy.deepcopy(optimizer.state_dict()["state"]),
    )


def _assert_identical(a, b) -> None:
    for xs, ys in zip(a[:2], b[:2]):
        assert len(xs) == len(ys) and all(torch.equal(p, q) for p, q in zip(xs, ys))
    assert a[2].keys() == b[2].keys()
    for key in a[2]:
        for name, value in a[2][key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[2][key][name])), name


def _checkpoint(model, optimizer) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()},
        buffer,
    )
    return buffer.getvalue()


def _restore(config: dict, blob: bytes, **scaling):
    """A new model and optimizer (from another seed, so everything must come from the
    checkpoint), initialized as the original was, then loaded in apex's order."""
    model, optimizer = _build(config, seed=123, **scaling)
    saved = torch.load(io.BytesIO(blob), weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    amp.load_state_dict(saved["amp"])
    return model, optimizer


def _clean_run(model, optimizer, x, y, steps: int):
    losses = [_step(model, optimizer, x, y) for _ in range(steps)]
    return losses, [_scale()], _snapshot(model, optimizer)


@pytest.mark.promise(
    promise="A long streak of overflowing steps backs the loss scale off to min_loss_scale and "
    "no further; no parameter, master weight or optimizer state moves; afterwards training "
    "continues exactly as a run started from that state without the streak",
    fault="40 consecutive steps with an inf gradient (O1, O2, O2 with combine_grad; Adam)",
    result="the scale halves step by step to min_loss_scale=1 and stays there; parameters, "
    "masters and Adam state bit-identical; the next 6 clean steps bit-equal to a "
    "restored run's",
)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.half_device
def test_overflow_storm_stops_at_min_scale_and_moves_nothing(name):
    config = CONFIGS[name]
    scaling = {"dynamic_init_scale": 2.0**10, "min_loss_scale": 1.0, "scale_window": 3}
    x, y = make_data()
    model, optimizer = _build(config, **scaling)
    for _ in range(3):
        _step(model, optimizer, x, y)
    before = _snapshot(model, optimizer)
    start = _scale()
    scales = []
    for _ in range(40):
        _step(model, optimizer, x, y, poison=_inf_in_last_layer)
        scales.append(_scale())
    halvings = int(math.log2(start))
    assert scales[:halvings] == [start / 2.0**k for k in range(1, halvings + 1)]
    assert set(scales[halvings:]) == {1.0}
    _assert_identical(before, _snapshot(model, optimizer))

    blob = _checkpoint(model, optimizer)
    after_storm = _clean_run(model, optimizer, x, y, 6)
    restored = _restore(config, blob, **scaling)
    without_storm = _clean_run(*restored, x, y, 6)
    assert after_storm[0] == without_storm[0] and after_storm[1] == without_storm[1]
    _assert_identical(after_storm[2], without_storm[2])
    assert after_storm[1] == [4.0]  # each window of 3 clean steps doubled the scale again


@pytest.mark.promise(
    promise="Without a min_loss_scale the scale never reaches 0, NaN or inf, however long the "
    "streak: it stops at the smallest normal float32, whose reciprocal is still finite",
    fault="1,000 consecutive overflowing updates of a dynamic LossScaler with no minimum",
    result="the scale stays finite and positive, ends at float32's tiny (2^-126); one clean "
    "window grows it again",
)
def test_endless_storm_never_drives_the_scale_to_zero():
    scaler = LossScaler("dynamic", init_scale=2.0**16, scale_window=1)
    seen = set()
    for _ in range(1000):
        assert scaler.update(found_inf=True) is True
        seen.add(scaler.loss_scale())
    assert all(math.isfinite(s) and s > 0 and math.isfinite(1.0 / s) for s in seen)
    assert scaler.loss_scale() == F32_TINY
    assert math.isfinite(float(torch.tensor(1.0 / scaler.loss_scale(), dtype=torch.float32)))
    scaler.update(found_inf=False)
    assert scaler.loss_scale() == 2 * F32_TINY


def _grads_of(model):
    return [p.grad for p in model.parameters()]


POISONS = {
    "nan-and-neg-inf-in-two-tensors": lambda m: (
        m[0].weight.grad.view(-1)[3:4].fill_(float("nan")),
        m[2].bias.grad.fill_(float("-inf")),
    ),
    "inf-and-nan-in-one-tensor": lambda m: (
        m[2].weight.grad.view(-1)[0:1].fill_(float("inf")),
        m[2].weight.grad.view(-1)[1:2].fill_(float("nan")),
    ),
    "every-gradient-nan": lambda m: [g.fill_(float("nan")) for g in _grads_of(m)],
}


@pytest.mark.promise(
    promise="A step whose gradients mix NaN, +inf and -inf (in one tensor or several) is skipped "
    "once: the scale backs off by one factor, nothing moves",
    fault="NaN and -inf in two tensors, inf and NaN in one tensor, every gradient NaN",
    result="one halving of the scale per bad step; parameters and optimizer state bit-identical",
)
@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("name", ["O1", "O2-combine_grad"])
@pytest.mark.half_device
def test_mixed_non_finite_gradients_skip_one_step_and_back_off_once(name, poison):
    x, y = make_data()
    model, optimizer = _build(CONFIGS[name], dynamic_init_scale=2.0**8)
    _step(model, optimizer, x, y)
    before, scale = _snapshot(model, optimizer), _scale()
    _step(model, optimizer, x, y, poison=POISONS[poison])
    assert _scale() == scale / 2
    _assert_identical(before, _snapshot(model, optimizer))


@pytest.mark.promise(
    promise="Denormal gradients are numbers, not overflows: the step is taken, the tiny values "
    "are unscaled exactly as torch's GradScaler does, none is flushed to zero or skipped",
    fault="gradients overwritten with float32 and float16 subnormals (O1: fp32 grads; O2: fp16 "
    "model grads into fp32 masters)",
    result="no skip, scale unchanged; the master gradients equal GradScaler's unscale bit for bit "
    "and stay non-zero",
)
@pytest.mark.parametrize("name", ["O1", "O2"])
@pytest.mark.half_device
def test_denormal_gradients_are_unscaled_not_skipped(name):
    x, y = make_data()
    model, optimizer = _build(CONFIGS[name], dynamic_init_scale=4.0)
    _step(model, optimizer, x, y)
    scale = _scale()
    dtype = next(model.parameters()).dtype
    tiny = float(torch.finfo(dtype).tiny) / 8  # subnormal in the model's gradient dtype
    captured = {}

    def denormals(m):
        for i, g in enumerate(_grads_of(m)):
            g.fill_(tiny * (i + 1))
        captured["grads"] = [g.detach().clone() for g in _grads_of(m)]

    optimizer.zero_grad()
    with amp.scale_loss(F.mse_loss(model(x).float(), y), optimizer) as scaled:
        scaled.backward()
        denormals(model)
    masters = list(amp.master_params(optimizer))
    unscaled = [p.grad.detach().clone() for p in masters]
    optimizer.step()
    assert _scale() == scale  # not an overflow

    expected = [g.float() for g in captured["grads"]]
    found = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(
        expected, found, torch.tensor(1.0 / scale, dtype=torch.float64).float()
    )
    assert found.item() == 0.0
    assert all(torch.equal(u, e) for u, e in zip(unscaled, expected))
    assert all(bool((u != 0).all()) for u in unscaled)


@pytest.mark.promise(
    promise="At O0 a non-finite loss is not caught (apex's behaviour: a static scale of 1 and no "
    "overflow check), so an O0 run matches plain PyTorch step for step, NaN included",
    fault="a NaN loss at O0 (Adam), next to the same step in plain torch",
    result="amp and plain torch both take the step: the same NaN parameters and Adam step "
    "count; no overflow message; the scale stays 1.0",
)
def test_non_finite_loss_at_o0_behaves_as_apex_and_plain_torch(caplog):
    x, y = make_data()
    model, optimizer = _build({"opt_level": "O0"})
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    _step(model, optimizer, x, y)
    ref_opt.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()

    with caplog.at_level(logging.DEBUG, logger="amp"):
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y) * float("nan"), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    ref_opt.zero_grad()
    (F.mse_loss(ref(x), y) * float("nan")).backward()
    ref_opt.step()

    assert not [r for r in caplog.records if "overflow" in r.getMessage().lower()]
    assert _scale() == 1.0
    for p, q in zip(model.parameters(), ref.parameters()):
        assert bool(torch.isnan(p).all()) and bool(torch.isnan(q).all())
    steps = [s["step"] for s in optimizer.state_dict()["state"].values()]
    assert [float(s) for s in steps] == [2.0] * len(steps)


@pytest.mark.promise(
    promise="A checkpoint taken in the middle of an overflow streak resumes bit-exactly: the "
    "rest of the streak and the recovery are the same as in the uninterrupted run",
    fault="model, optimizer and amp state saved after 5 of 12 overflowing steps, restored into "
    "new objects built from another seed (O1, O2, O2 with combine_grad)",
    result="the same loss scales, losses, parameters, masters and Adam state as the "
    "uninterrupted run, bit for bit",
)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.half_device
def test_checkpoint_mid_streak_resumes_bit_exactly(name):
    config = CONFIGS[name]
    scaling = {"dynamic_init_scale": 2.0**12, "min_loss_scale": 2.0**4, "scale_window": 2}
    x, y = make_data()

    def rest_of_run(model, optimizer, storm_left: int):
        record = []
        for _ in range(storm_left):
            record.append((_step(model, optimizer, x, y, poison=_inf_in_last_layer), _scale()))
        for _ in range(6):
            record.append((_step(model, optimizer, x, y), _scale()))
        return record, _snapshot(model, optimizer)

    model, optimizer = _build(config, **scaling)
    for _ in range(2):
        _step(model, optimizer, x, y)
    for _ in range(5):
        _step(model, optimizer, x, y, poison=_inf_in_last_layer)
    blob = _checkpoint(model, optimizer)
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 2.0**8, "unskipped": 0}
    uninterrupted = rest_of_run(model, optimizer, 7)
    resumed = rest_of_run(*_restore(config, blob, **scaling), 7)
    assert uninterrupted[0] == resumed[0]
    assert [s for _, s in uninterrupted[0]][:7] == [
        2.0**7,
        2.0**6,
        2.0**5,
        2.0**4,
        2.0**4,
        2.0**4,
        2.0**4,
    ]
    _assert_identical(uninterrupted[1], resumed[1])
