"""amp with model and data on the `npu` test device (device/README.md), against the same run
on the CPU: apex's quick start at O0-O3 in fp16 and bf16, dynamic loss scaling with an
injected overflow, O2 master weights, an exact save/resume, several losses.

Exactness: the device runs the CPU's kernels underneath, so the loss-scale schedule, the
skipped steps and every tensor's dtype and device are compared exactly; parameters are
compared with assert_close at float32 resolution because the linear layer's BLAS call may
block differently for operands the device's copies allocate elsewhere (the device tests'
own rule for matmul). Save/resume compares one device with itself: bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import CPU, data, quickstart, reset_amp, snapshot

import amp
from amp._amp_state import _amp_state
from amp.masters.stash import MASTERS_KEY

HALF = [torch.float16, torch.bfloat16]
LEVELS = ["O0", "O1", "O2", "O3"]


@pytest.fixture(autouse=True)
def _fresh_amp() -> Iterator[None]:
    yield
    reset_amp()


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        # Half tensors: one unit in the last place of the half type; fp32: a few of fp32's.
        torch.testing.assert_close(
            g,
            w,
            rtol=1e-5 if g.dtype == torch.float32 else 1e-2,
            atol=1e-6 if g.dtype == torch.float32 else 1e-3,
        )


@pytest.mark.parametrize("half", HALF, ids=str)
@pytest.mark.parametrize("level", LEVELS)
def test_quickstart_matches_cpu(npu: torch.device, level: str, half: torch.dtype) -> None:
    dev = quickstart(npu, level, half)
    reset_amp()
    ref = quickstart(CPU, level, half)
    model_dtype = {"O0": torch.float32, "O1": torch.float32, "O2": half, "O3": half}[level]
    assert {p.device.type for p in dev.model.parameters()} == {"npu"}
    assert {p.dtype for p in dev.model.parameters()} == {model_dtype}
    assert {p.device.type for p in amp.master_params(dev.optimizer)} == {"npu"}
    # Inside forward: O1's autocast ran for the model's device type ("npu", not "cpu").
    inner = half if level != "O0" else torch.float32
    assert set(dev.inner_dtypes) == set(ref.inner_dtypes) == {inner}
    assert dev.scales == ref.scales
    _close(dev.params(), ref.params())
    torch.testing.assert_close(dev.losses, ref.losses, rtol=1e-2, atol=1e-3)
    assert dev.losses[-1] < dev.losses[0]  # it trains


@pytest.mark.parametrize("half", HALF, ids=str)
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_overflow_skips_step_and_backs_off(
    npu: torch.device, level: str, half: torch.dtype
) -> None:
    init = dict(dynamic_init_scale=2.0**10, scale_window=2)
    runs = {}
    for device in (npu, CPU):
        reset_amp()
        clean = quickstart(device, level, half, steps=2, **init)
        before = (
            clean.params(),
            clean.masters(),
            {k: v.clone() for k, v in _momentum(clean.optimizer).items()},
        )
        # Continue the same run with one more step whose gradient overflows.
        x, y = data()
        loss = F.mse_loss(clean.model(x.to(device)), y.to(device))
        clean.optimizer.zero_grad()
        with amp.scale_loss(loss, clean.optimizer) as scaled:
            scaled.backward()
            clean.model.weight.grad[0, 0] = float("inf")
        clean.optimizer.step()
        scale = _amp_state.loss_scalers[0].loss_scale()
        # Skipped: parameters, masters and optimizer state untouched.
        assert all(torch.equal(a, b) for a, b in zip(clean.params(), before[0]))
        assert all(torch.equal(a, b) for a, b in zip(clean.masters(), before[1]))
        after = _momentum(clean.optimizer)
        assert after.keys() == before[2].keys() and after
        assert all(torch.equal(after[k], before[2][k]) for k in after)
        runs[device.type] = (clean.scales, scale)
    # Two clean steps grow 1024 -> 2048 (scale_window=2); the overflow halves it.
    assert runs["npu"] == runs["cpu"] == ([1024.0, 2048.0], 1024.0)


def _momentum(optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor]:
    return {
        i: st["momentum_buffer"].detach().cpu()
        for i, st in enumerate(optimizer.state.values())
        if "momentum_buffer" in st
    }


@pytest.mark.parametrize("half", HALF, ids=str)
def test_o2_master_weights_on_device(npu: torch.device, half: torch.dtype) -> None:
    run = quickstart(npu, "O2", half, steps=3)
    masters = list(amp.master_params(run.optimizer))
    models = list(run.model.parameters())
    assert [m.dtype for m in masters] == [torch.float32] * 2
    assert [p.dtype for p in models] == [half] * 2
    assert all(m.device.type == "npu" and p.device.type == "npu" for m, p in zip(masters, models))
    assert all(m is not p for m, p in zip(masters, models))
    # After a step the model holds its masters rounded to the half type.
    for m, p in zip(masters, models):
        assert torch.equal(p.detach().cpu(), m.detach().cpu().to(half))
    # The masters keep what the half copy cannot: they are not equal to it in fp32.
    assert any(
        not torch.equal(m.detach().cpu(), p.detach().cpu().float()) for m, p in zip(masters, models)
    )
    # The optimizer's state lives with the masters, on the device.
    state = [run.optimizer.state[m]["momentum_buffer"] for m in masters]
    assert all(s.device.type == "npu" and s.dtype == torch.float32 for s in state)


@pytest.mark.parametrize("half", HALF, ids=str)
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_save_resume_continues_exactly(npu: torch.device, level: str, half: torch.dtype) -> None:
    init = dict(dynamic_init_scale=2.0**12, scale_window=3)
    full = quickstart(npu, level, half, steps=7, inject_inf_at=2, **init)
    reset_amp()
    first = quickstart(npu, level, half, steps=4, inject_inf_at=2, **init)
    saved = snapshot(first)
    if level == "O2":
        masters = [t for group in saved["optimizer"][MASTERS_KEY] for t in group]
        assert masters and all(t.device.type == "npu" and t.dtype == torch.float32 for t in masters)
    bufs = [st["momentum_buffer"] for st in saved["optimizer"]["state"].values()]
    assert bufs and all(b.device.type == "npu" for b in bufs)
    assert saved["amp"]["loss_scaler0"] == {"loss_scale": first.scales[-1], "unskipped": 1}

    reset_amp()
    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    model = torch.nn.Linear(10, 1).to(npu)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=half, verbosity=0, **init)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    amp.load_state_dict(saved["amp"])
    x, y = data()
    scales = []
    for _ in range(3):
        loss = F.mse_loss(model(x.to(npu)), y.to(npu))
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        scales.append(_amp_state.loss_scalers[0].loss_scale())
    assert first.scales + scales == full.scales
    for got, want in zip(model.parameters(), full.model.parameters()):
        assert torch.equal(got.detach().cpu(), want.detach().cpu())
    for got, want in zip(amp.master_params(opt), amp.master_params(full.optimizer)):
        assert torch.equal(got.detach().cpu(), want.detach().cpu())


def _two_losses(device: torch.device, half: torch.dtype, inf_on: int) -> tuple[list, list]:
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = amp.initialize(
        model,
        opt,
        opt_level="O2",
        half_dtype=half,
        num_losses=2,
        verbosity=0,
        dynamic_init_scale=2.0**8,
        scale_window=2,
    )
    x, y = data()
    scales = []
    for step in range(3):
        out = model(x.to(device))
        losses = [F.mse_loss(out[:, 0:1], y.to(device)), out[:, 1].abs().mean()]
        opt.zero_grad()
        for loss_id, loss in enumerate(losses):
            with amp.scale_loss(loss, opt, loss_id=loss_id) as scaled:
                scaled.backward(retain_graph=loss_id == 0)
                if step == 1 and loss_id == inf_on:
                    model.bias.grad[1] = float("inf")
        opt.step()
        scales.append([s.loss_scale() for s in _amp_state.loss_scalers])
    return scales, [p.detach().cpu() for p in amp.master_params(opt)]


@pytest.mark.parametrize("half", HALF, ids=str)
@pytest.mark.parametrize("inf_on", [0, 1])
def test_several_losses(npu: torch.device, half: torch.dtype, inf_on: int) -> None:
    dev_scales, dev_masters = _two_losses(npu, half, inf_on)
    reset_amp()
    cpu_scales, cpu_masters = _two_losses(CPU, half, inf_on)
    assert dev_scales == cpu_scales
    # Each scaler starts at 256 and grows after 2 clean steps (scale_window=2): only the
    # scaler of the loss that overflowed at step 1 backs off, the other one grows then.
    clean, hit = [256.0, 512.0, 512.0], [256.0, 128.0, 128.0]
    per_scaler = [hit, clean] if inf_on == 0 else [clean, hit]
    assert dev_scales == [list(s) for s in zip(*per_scaler)]
    _close(dev_masters, cpu_masters)
