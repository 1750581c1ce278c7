"""combine_grad on the `npu` test device (device/README.md), where amp's compiled kernels do
not run and every per-parameter operation is a device launch: the gradients move into one
device buffer, training equals the uncombined run on the same device, and the launches per
step for unscale + overflow check + zero_grad stay the same from 10 to 300 parameters (with
combining, and without it as well since amp copies the master gradients in one call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import quickstart, reset_amp
from npu_fused_ops import OpCounter

import amp


@pytest.fixture(autouse=True)
def _fresh_amp() -> Iterator[None]:
    yield
    reset_amp()


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_combined_quickstart_equals_uncombined_on_npu(npu: torch.device, level: str) -> None:
    ref = quickstart(npu, level, torch.float16, inject_inf_at=2)
    reset_amp()
    got = quickstart(npu, level, torch.float16, inject_inf_at=2, combine_grad=True)
    assert got.scales == ref.scales
    for a, b in zip(got.params() + got.masters(), ref.params() + ref.masters()):
        assert torch.equal(a, b)
    flat = got.optimizer.get_optimizer_combined_grads()[0]
    assert flat.device.type == "npu"
    for p in amp.master_params(got.optimizer):
        assert flat.untyped_storage().data_ptr() == p.grad.untyped_storage().data_ptr()


def _launches(npu: torch.device, n_params: int, combine: Optional[bool]) -> int:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(n_params // 2)]).to(npu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", verbosity=0, combine_grad=combine
    )
    x = torch.randn(2, 2).to(npu)
    for _ in range(2):
        optimizer.zero_grad()
        count = OpCounter("npu")
        with amp.scale_loss(F.mse_loss(model(x).float(), x), optimizer) as scaled:
            scaled.backward()
            count.__enter__()
        optimizer.zero_grad()
        count.__exit__(None, None, None)
        optimizer.step()
    reset_amp()
    return sum(count.launches.values()) + sum(count.syncs.values())


def test_launches_per_step_do_not_grow_with_parameters_on_npu(npu: torch.device) -> None:
    small, large = _launches(npu, 10, True), _launches(npu, 300, True)
    assert small == large <= 12, (small, large)
    # Without combining too: the master gradients are copied from the model's in one call
    # (it was one copy per parameter: 300 launches and more).
    small, large = _launches(npu, 10, None), _launches(npu, 300, None)
    assert small == large <= 12, (small, large)
