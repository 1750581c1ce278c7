"""The NpuFused optimizers and Lamb under amp.initialize, as Ascend's scripts use them: at O1
and O2 a training loop with an NpuFused optimizer (its gradients, masters and states combined)
gives torch.optim's run on amp's per-parameter path, bit for bit; Ascend's opt-level errors;
Ascend's LAMB test (tests/L0/run_optimizers/test_lamb_mnist.py) on synthetic data."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from npu_fused_lib import TORCH_PAIRS, case_id
from torch import nn

import amp
import amp.optimizers as O
from amp._amp_state import _amp_state


@pytest.fixture(autouse=True)
def _fresh_amp_state() -> Iterator[None]:
    yield
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []
    _amp_state.verbosity = 1


def _data(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 10, generator=g)
    return x, x @ torch.randn(10, 1, generator=g) + 0.5


# Models and data are made on torch's default device (the CPU; the npu test device for the
# half_device tests where torch's CPU has no float16: tests/conftest.py).
def _model() -> nn.Module:
    torch.manual_seed(0)
    # BatchNorm: under O2 its parameters stay fp32 (their own masters: a second buffer).
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))


def train(
    make_opt: Callable[[Any], Any], opt_level: str, steps: int = 5, **kw: Any
) -> tuple[nn.Module, Any]:
    model = _model()
    opt = make_opt(model.parameters())
    model, opt = amp.initialize(
        model, opt, opt_level=opt_level, verbosity=0, dynamic_init_scale=2.0**10, **kw
    )
    loop(model, opt, steps)
    return model, opt


def loop(model: nn.Module, opt: Any, steps: int) -> None:
    x, y = _data()
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()


# A representative subset (the arithmetic of every pair is tested on the buffers directly):
# one state-less, one momentum, one Adam with amsgrad, AdamW, Adadelta, centered RMSprop.
AMP_PAIRS = [TORCH_PAIRS[i] for i in (0, 2, 4, 5, 7, 9)]


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
@pytest.mark.parametrize("case", AMP_PAIRS, ids=case_id)
@pytest.mark.half_device
def test_under_amp_bit_equal_to_torch_optim(case: tuple, opt_level: str) -> None:
    ours, theirs, kw = case
    model, opt = train(lambda ps: ours(ps, **kw), opt_level)
    ref_model, ref_opt = train(lambda ps: theirs(ps, foreach=False, **kw), opt_level)
    assert opt._amp_stash.combined.valid and opt._amp_stash.combined.param_buffers
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for a, b in zip(amp.master_params(opt), amp.master_params(ref_opt)):
        assert torch.equal(a, b)
    # torch.optim's state, value for value (ours keeps int steps, as Ascend does)
    for p, q in zip(amp.master_params(opt), amp.master_params(ref_opt)):
        for key, value in ref_opt.state[q].items():
            if value is None:  # torch 2.1's SGD records a momentum_buffer of None without momentum
                assert opt.state[p].get(key) is None, key
                continue
            mine = opt.state[p][key]
            if key == "step":
                assert mine == int(value)
            else:
                assert torch.equal(mine, value), key


@pytest.mark.parametrize("opt_level", ["O0", "O3"])
def test_npu_fused_refused_outside_o1_o2(opt_level: str) -> None:
    model = _model()
    with pytest.raises(
        RuntimeError,
        match="npu fused optimizer can only be used when opt_level='O1' or opt_level='O2'",
    ):
        amp.initialize(model, O.NpuFusedAdam(model.parameters()), opt_level=opt_level, verbosity=0)


@pytest.mark.half_device
def test_state_dict_under_amp_resumes_exactly() -> None:
    def make(ps: Any) -> Any:
        return O.NpuFusedAdam(ps, lr=0.01)

    straight, _ = train(make, "O2", steps=6)
    model, opt = train(make, "O2", steps=3)
    saved_opt, saved_model = opt.state_dict(), model.state_dict()
    _amp_state.loss_scalers = []
    model2 = _model()
    opt2 = make(model2.parameters())
    model2, opt2 = amp.initialize(
        model2, opt2, opt_level="O2", verbosity=0, dynamic_init_scale=2.0**10
    )
    model2.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    loop(model2, opt2, 3)
    for a, b in zip(model2.parameters(), straight.parameters()):
        assert torch.equal(a, b)


class _Net(nn.Module):
    """Ascend's LAMB test network, scaled to 12x12 synthetic images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.fc1 = nn.Linear(8 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


def _images(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, each a bright quadrant, plus noise."""
    g = torch.Generator().manual_seed(0)
    target = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 1, 12, 12, generator=g) * 0.5
    for k in range(4):
        r, c = divmod(k, 2)
        x[target == k, :, r * 6 : (r + 1) * 6, c * 6 : (c + 1) * 6] += 1.5
    return x, target


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: O.Lamb(ps, lr=0.01, weight_decay=0.01, betas=(0.9, 0.999)),
        lambda ps: O.NpuFusedLamb(ps, lr=0.01, weight_decay=0.01, betas=(0.9, 0.999)),
    ],
    ids=["Lamb", "NpuFusedLamb"],
)
@pytest.mark.half_device
def test_ascend_lamb_example_learns(make: Callable[[Any], Any]) -> None:
    torch.manual_seed(1)
    model = _Net()
    opt = make(model.parameters())
    model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=1024, verbosity=0)
    x, target = _images()
    logged: dict[str, list] = collections.defaultdict(list)
    for _epoch in range(4):
        for i in range(0, len(x), 64):
            opt.zero_grad()
            loss = F.nll_loss(model(x[i : i + 64]).float(), target[i : i + 64])
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
            opt.step()
            # Ascend's log_lamb_rs: the trust-ratio scalars of every layer
            for group in opt.param_groups:
                for p in group["params"]:
                    for key in ("weight_norm", "adam_norm", "trust_ratio"):
                        if key in opt.state[p]:
                            logged[key].append(float(opt.state[p][key]))
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == target).float().mean().item()
    assert accuracy > 0.97
    if isinstance(opt, O.Lamb):
        assert len(logged["trust_ratio"]) == 4 * 4 * 6  # steps x parameters
        assert all(r > 0 for r in logged["trust_ratio"])
    else:
        assert not logged  # Ascend's NpuFusedLamb keeps no per-parameter norms
