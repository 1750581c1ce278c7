"""amp.optimizers on the `npu` test device: the compiled CPU kernels refuse npu tensors, the
pure-torch fallback takes over after exactly one warning, and the result is the same run's
on the CPU.

Two CPU references: the fallback forced on the CPU (AMP_DISABLE_EXTENSION=1) runs the very
same torch ops, so it must agree bit for bit (the device runs the CPU kernels underneath);
the compiled kernels compute the same float32 arithmetic but fuse it (one rounding where
torch's separate ops round twice, another summation order in norms), so they agree to a few
float32 ulps: assert_close at rtol 1e-5.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import CPU, data, reset_amp

import amp
from amp import _ext
from amp._device import AmpDeviceFallbackWarning, reset_device_warnings
from amp.optimizers import (
    FusedAdagrad,
    FusedAdam,
    FusedLAMB,
    FusedMixedPrecisionLamb,
    FusedNovoGrad,
    FusedSGD,
)

# Tests that count the device warning record it themselves; elsewhere it is expected.
pytestmark = pytest.mark.filterwarnings(
    "ignore::amp._device.AmpDeviceFallbackWarning",
    "ignore:GradScaler is going to stop passing itself:FutureWarning",
)

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "FusedAdam": lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.01),
    "FusedSGD": lambda ps: FusedSGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "FusedLAMB": lambda ps: FusedLAMB(ps, lr=1e-2, weight_decay=0.01),
    "FusedAdagrad": lambda ps: FusedAdagrad(ps, lr=0.05),
    "FusedNovoGrad": lambda ps: FusedNovoGrad(ps, lr=1e-2, weight_decay=0.01),
    "FusedMixedPrecisionLamb": lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-2),
}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_device_warnings()
    yield
    reset_amp()
    reset_device_warnings()


@pytest.fixture
def cpu_fallback(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AMP_DISABLE_EXTENSION", "1")
    _ext.reset()
    yield
    monkeypatch.delenv("AMP_DISABLE_EXTENSION")
    _ext.reset()


def _train(
    device: torch.device, name: str, opt_level: str | None, steps: int = 4
) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(
        device
    )
    opt = OPTIMIZERS[name](model.parameters())
    if opt_level is not None:
        model, opt = amp.initialize(
            model, opt, opt_level=opt_level, verbosity=0, dynamic_init_scale=2.0**10
        )
    x, y = data()
    for _ in range(steps):
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        if opt_level is None:
            loss.backward()
        else:
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
        opt.step()
    state = [
        t.detach().cpu()
        for st in opt.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor)
    ]
    assert state, "the optimizer kept no state"
    return [p.detach().cpu() for p in model.parameters()] + state


def _on_npu_with_one_warning(npu: torch.device, name: str, level: str | None) -> list[torch.Tensor]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _train(npu, name, level)
    assert [w.category for w in caught] == [AmpDeviceFallbackWarning], [
        str(w.message) for w in caught
    ]
    assert "take CPU tensors only" in str(caught[0].message)
    assert "npu" in str(caught[0].message)
    return got


LEVELS = [None, "O1", "O2"]
LEVEL_IDS = ["standalone", "O1", "O2"]


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_on_npu_equals_cpu_fallback(
    npu: torch.device, cpu_fallback: None, name: str, level: str | None
) -> None:
    got = _on_npu_with_one_warning(npu, name, level)
    reset_amp()
    want = _train(CPU, name, level)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert torch.equal(g, w)


@pytest.mark.parametrize("level", LEVELS, ids=LEVEL_IDS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_on_npu_close_to_cpu_kernels(npu: torch.device, name: str, level: str | None) -> None:
    assert _ext.load() is not None, "amp._C must be built for the test suite (make setup)"
    got = _on_npu_with_one_warning(npu, name, level)
    reset_amp()
    want = _train(CPU, name, level)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 if g.dtype == torch.float32 else 1e-3)


def test_warning_once_per_device_type(npu: torch.device) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in sorted(OPTIMIZERS):
            _train(npu, name, None, steps=2)
    assert [w.category for w in caught] == [AmpDeviceFallbackWarning]
    # CPU tensors never warn: the kernels take them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(CPU, "FusedAdam", None, steps=1)


def test_mixed_precision_lamb_with_grad_scaler(npu: torch.device) -> None:
    """FusedMixedPrecisionLamb with a bf16 model and torch.amp.GradScaler("npu"), overflow
    included, as on the CPU."""
    results = {}
    for device in (npu, CPU):
        torch.manual_seed(0)
        model = torch.nn.Linear(10, 1).to(device=device, dtype=torch.bfloat16)
        opt = FusedMixedPrecisionLamb(
            model.parameters(), lr=1e-2, reduced_precision_dtype=torch.bfloat16
        )
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8, growth_interval=1)
        x, y = data()
        scales = []
        for step in range(3):
            opt.zero_grad()
            loss = F.mse_loss(model(x.to(device, torch.bfloat16)).float(), y.to(device))
            scaler.scale(loss).backward()
            if step == 1:
                model.weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        master = opt.state[model.weight]["master_param"]
        assert master.device.type == device.type and master.dtype == torch.float32
        results[device.type] = (scales, model.weight.detach().cpu(), master.detach().cpu())
    assert results["npu"][0] == results["cpu"][0] == [512.0, 256.0, 512.0]
    assert torch.equal(results["npu"][1], results["cpu"][1].to(torch.bfloat16))
    torch.testing.assert_close(results["npu"][2], results["cpu"][2], rtol=1e-5, atol=1e-6)


def test_kernels_refuse_npu_tensors(npu: torch.device) -> None:
    """The compiled kernels, called directly, refuse npu tensors with a message saying why."""
    mod = _ext.load()
    assert mod is not None
    t = [torch.ones(4, device=npu)]
    with pytest.raises(
        ValueError,
        match=r"inputs\[0\] is on npu:0; the compiled kernels take "
        r"CPU tensors only",
    ):
        mod.scale(t, [torch.empty(4, device=npu)], 2.0)
    with pytest.raises(ValueError, match="is on npu:0; the compiled kernels take CPU tensors"):
        mod.adam(
            t,
            [torch.ones(4, device=npu)],
            [torch.zeros(4, device=npu)],
            [torch.zeros(4, device=npu)],
            None,
            1e-3,
            0.9,
            0.999,
            1e-8,
            1,
            True,
            True,
            0.0,
            1.0,
        )
