"""Apex for Ascend's NpuFused optimizers and Lamb on the `npu` test device: their updates on
combined buffers give the CPU's results bit for bit (the device runs the CPU's kernels), and
torch.optim's own run on the device; under amp O2 everything combined lives on the device;
and the device operations of a training step do not grow with the number of parameters
(Ascend's reason for combining), counted at the dispatcher."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import CPU, reset_amp
from npu_fused_ops import PHASES, count_step

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "optimizers"))
from npu_fused_lib import (
    ASCEND_CASES,
    SHAPES,
    TORCH_PAIRS,
    case_id,
    grad_series,
    leaves,
    run_combined,
    run_plain,
)

import amp
import amp.optimizers as O

pytestmark = pytest.mark.filterwarnings("ignore::amp._device.AmpDeviceFallbackWarning")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    yield
    reset_amp()


@pytest.mark.parametrize("case", TORCH_PAIRS + ASCEND_CASES, ids=case_id)
def test_combined_update_on_npu_equals_cpu(npu: torch.device, case: tuple) -> None:
    ours, kw = case[0], next(c for c in case if isinstance(c, dict))
    series = grad_series(SHAPES, steps=3)
    on_npu, on_cpu = leaves(SHAPES, npu), leaves(SHAPES, CPU)
    opt = ours(on_npu, **kw)
    run_combined(opt, on_npu, series)
    run_combined(ours(on_cpu, **kw), on_cpu, series)
    for a, b in zip(on_npu, on_cpu):
        assert a.device.type == "npu" and torch.equal(a.cpu(), b)
    for p in on_npu:  # the states were combined on the device
        assert all(
            t.device.type == "npu" for t in opt.state[p].values() if isinstance(t, torch.Tensor)
        )


@pytest.mark.parametrize("case", TORCH_PAIRS, ids=case_id)
def test_combined_update_on_npu_equals_torch_optim_there(npu: torch.device, case: tuple) -> None:
    ours, theirs, kw = case
    series = grad_series(SHAPES, steps=3)
    mine, ref = leaves(SHAPES, npu), leaves(SHAPES, npu)
    run_combined(ours(mine, **kw), mine, series)
    run_plain(theirs(ref, foreach=False, **kw), ref, series)
    assert all(torch.equal(a, b) for a, b in zip(mine, ref))


def _train(npu: torch.device, make: Any, steps: int = 4) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).to(npu)
    opt = make(model.parameters())
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0, dynamic_init_scale=2.0**10)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 10, generator=g)
    y = x.sum(1, keepdim=True)
    x, y = x.to(npu), y.to(npu)
    for _ in range(steps):
        opt.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x).float(), y), opt) as scaled:
            scaled.backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda ps: O.NpuFusedAdam(ps, lr=0.01, weight_decay=0.01),
            lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, foreach=False),
        ),
        (
            lambda ps: O.NpuFusedSGD(ps, lr=0.05, momentum=0.9, nesterov=True),
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, foreach=False),
        ),
    ],
    ids=["Adam", "SGD"],
)
def test_o2_on_npu_bit_equal_to_torch_optim(npu: torch.device, ours: Any, theirs: Any) -> None:
    model, opt = _train(npu, ours)
    reset_amp()
    ref_model, _ = _train(npu, theirs)
    combined = opt._amp_stash.combined
    assert combined.valid and all(b.flat.device.type == "npu" for b, _ in combined.param_buffers)
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert a.device.type == "npu" and a.dtype == b.dtype and torch.equal(a, b)


def test_lamb_under_o2_on_npu(npu: torch.device) -> None:
    _model, opt = _train(npu, lambda ps: O.Lamb(ps, lr=0.01, weight_decay=0.01))
    for p in amp.master_params(opt):
        state = opt.state[p]
        assert state["step"] == 4 and state["trust_ratio"].device.type == "npu"
        assert torch.isfinite(state["weight_norm"]) and state["adam_norm"] > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: O.NpuFusedAdam(ps, lr=1e-3),
        lambda ps: O.NpuFusedSGD(ps, lr=0.01, momentum=0.9),
    ],
    ids=["NpuFusedAdam", "NpuFusedSGD"],
)
def test_ops_per_step_do_not_grow_with_parameters(npu: torch.device, make: Any) -> None:
    """Unscale + overflow check + step + zero_grad: the same number of device operations
    for 10 and 100 parameters, within Ascend's budget (benchmarks/bench_ascend.py has the
    table, with torch.optim and amp's fused optimizers beside)."""
    totals = []
    for n in (10, 100):
        reset_amp()
        counter = count_step(make, n, 16, npu, opt_level="O2", dynamic_init_scale=2.0**10)
        totals.append(sum(counter.launches[p] for p in PHASES))
        assert sum(counter.syncs.values()) <= 1  # the loss scaler's overflow decision
    assert totals[0] == totals[1] <= 32, totals
