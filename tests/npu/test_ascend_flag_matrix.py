"""Apex for Ascend's L1 runner (tests/L1/common/run_test_npu.sh in Ascend's repository) on the
`npu` test device: its flag matrix -- opt level O1/O2 x combine_grad on/off x NpuFusedSGD
on/off, static loss scale 1024 -- over a training loop written the way its main_amp_npu.py
writes one (a conv net with batch-norm moved to the device, SGD with momentum and weight
decay, amp.initialize, scale_loss, step), with a small synthetic dataset instead of ImageNet.
Every combination trains, and the ones with the same arithmetic are the same bit for bit:
combining and the fused optimizer change how many operations a step takes, not its result.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import reset_amp
from torch import nn

import amp
from amp.optimizers import NpuFusedSGD


@pytest.fixture(autouse=True)
def _fresh_amp() -> Iterator[None]:
    yield
    reset_amp()


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _run(
    npu: torch.device, level: str, combine_grad: bool, npu_fused_sgd: bool, steps: int = 4
) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = _net().to(npu)
    opt_cls = NpuFusedSGD if npu_fused_sgd else torch.optim.SGD
    optimizer = opt_cls(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=level,
        loss_scale=1024.0,
        combine_grad=combine_grad or None,
        verbosity=0,
    )
    g = torch.Generator().manual_seed(1)
    images = torch.randn(16, 3, 8, 8, generator=g)
    labels = torch.randint(0, 4, (16,), generator=g)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(images.to(npu)).float(), labels.to(npu))
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        losses.append(float(loss))
    reset_amp()
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_flag_matrix_trains_and_agrees(npu: torch.device, level: str) -> None:
    runs = {
        (combine, fused): _run(npu, level, combine, fused)
        for combine, fused in itertools.product([False, True], repeat=2)
    }
    base_losses, base_params = runs[(False, False)]
    assert base_losses[-1] < base_losses[0]  # it trains
    for flags, (losses, params) in runs.items():
        assert losses == base_losses, flags
        for got, want in zip(params, base_params):
            assert got.dtype == want.dtype and torch.equal(got, want), flags
