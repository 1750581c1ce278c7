"""The quick-start loop with the fused optimizers under amp.initialize at every opt level,
on the compiled kernels through the seam (_amp_grads_nonfinite / _amp_fused_step), against
the same loop with torch.optim on amp's generic path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import amp
from amp import _ext
from amp.optimizers import FusedAdam, FusedLAMB, FusedSGD

# (opt level, extra initialize kwargs, whether amp takes the fused path). O0 and O3 with
# their static loss scale of 1 have nothing to unscale: amp calls the plain step(), which
# runs the same compiled kernels standalone.
# O3 runs in bf16: torch.optim.AdamW on fp16 parameters overflows to NaN here (its eps and
# second moment underflow in fp16 storage), so it would be no reference.
BF16 = {"cast_model_type": torch.bfloat16}
# half_device (tests/conftest.py): the levels that compute in float16.
_HALF = pytest.mark.half_device
LEVELS = [
    ("O0", {}, False),
    pytest.param(("O1", {}, True), marks=_HALF),
    pytest.param(("O2", {}, True), marks=_HALF),
    ("O3", BF16, False),
    ("O3", dict(BF16, loss_scale="dynamic"), True),
]
LEVEL_IDS = ["O0", "O1", "O2", "O3", "O3-dynamic"]


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g)
    return x, x @ torch.randn(10, 1, generator=g) + 0.5


def _setup(make_opt, opt_level, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = make_opt(model.parameters())
    kw.setdefault("dynamic_init_scale", 2.0**10)  # no overflow-skipped steps in 8 steps
    return amp.initialize(model, opt, opt_level=opt_level, verbosity=0, **kw)


class _Spy:
    """Counts the fused-path calls amp core makes on an optimizer instance: the deferred
    step (``_amp_fused_step``) or the step after amp's unscale pass (``_amp_unscaled_step``)."""

    def __init__(self, opt, deferred: bool) -> None:
        self.fused = 0
        name = "_amp_fused_step" if deferred else "_amp_unscaled_step"
        inner = getattr(opt, name)

        def fused_step(*args):
            self.fused += 1
            # The model tensors passed in are those the user trains: at O2 half copies
            # distinct from the fp32 masters the optimizer holds.
            return inner(*args)

        setattr(opt, name, fused_step)


def _train(model, opt, steps=8, inject_at=None):
    x, y = _data()
    for s in range(steps):
        opt.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x).float(), y), opt) as scaled:
            scaled.backward()
            if s == inject_at:  # before the context exits, where amp checks the grads
                next(model.parameters()).grad.view(-1)[0] = float("inf")
        opt.step()


@pytest.mark.parametrize("deferred", [False, True], ids=["apex-exact", "deferred"])
@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize(
    "pair",
    [
        (
            lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.01),
            lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
        ),
        (
            lambda ps: FusedSGD(ps, lr=0.05, momentum=0.9),
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        ),
    ],
    ids=["adam", "sgd"],
)
def test_quickstart_fused_matches_generic_path(level, pair, deferred):
    assert _ext.load() is not None, "amp._C must be built"
    opt_level, kw, fused_path = level
    make_fused, make_torch = pair
    model_f, opt_f = _setup(make_fused, opt_level, defer_unscale=deferred, **kw)
    spy = _Spy(opt_f, deferred)
    _train(model_f, opt_f)
    model_t, opt_t = _setup(make_torch, opt_level, **kw)
    _train(model_t, opt_t)
    assert spy.fused == (8 if fused_path else 0)
    half = opt_level in ("O2", "O3")
    tol = dict(rtol=2e-2, atol=2e-3) if half else dict(rtol=1e-5, atol=1e-6)
    for a, b in zip(amp.master_params(opt_f), amp.master_params(opt_t)):
        torch.testing.assert_close(a.float(), b.float(), **tol)
    for a, b in zip(model_f.parameters(), model_t.parameters()):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), **tol)
    if opt_level == "O2":  # the half model copy was written from the fp32 masters
        for m, p in zip(model_f.parameters(), amp.master_params(opt_f)):
            if m.dtype != torch.float32:
                assert torch.equal(m, p.to(m.dtype))


@pytest.mark.parametrize("cast", [pytest.param(torch.float16, marks=_HALF), torch.bfloat16])
def test_o2_fused_lamb_trains_and_writes_half_model(cast):
    model, opt = _setup(lambda ps: FusedLAMB(ps, lr=1e-2), "O2", cast_model_type=cast)
    x, y = _data()
    first = F.mse_loss(model(x).float(), y).item()
    _train(model, opt, steps=30)
    assert F.mse_loss(model(x).float(), y).item() < first
    for m, p in zip(model.parameters(), amp.master_params(opt)):
        assert p.dtype == torch.float32
        assert torch.equal(m, p.to(m.dtype))


@pytest.mark.half_device
def test_o2_overflow_skips_step_and_backs_off():
    model, opt = _setup(lambda ps: FusedAdam(ps, lr=1e-2), "O2")
    _train(model, opt, steps=1)
    before = [p.detach().clone() for p in amp.master_params(opt)]
    model_before = [p.detach().clone() for p in model.parameters()]
    scale = amp.state_dict()["loss_scaler0"]["loss_scale"]
    _train(model, opt, steps=1, inject_at=0)
    assert all(torch.equal(a, b) for a, b in zip(before, amp.master_params(opt)))
    assert all(torch.equal(a, b) for a, b in zip(model_before, model.parameters()))
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == scale / 2
