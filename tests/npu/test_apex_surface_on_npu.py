"""Apex for Ascend's user-facing surface on the `npu` test device, as its users write it:
``from apex import amp`` and friends, O1 with a registered cast and ``user_cast_preferred``,
``_amp_state.handle``, ``FusedAdam(master_weights=True)`` on half parameters, and
``apex.dump`` of a step run on the device compared with the same step on the CPU."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from amp_npu_lib import CPU, reset_amp
from apex import amp
from apex.amp import _amp_state
from apex.dump import HookerAndDumper
from apex.optimizers import FusedAdam

from amp import _torch_compat as compat


@pytest.fixture(autouse=True)
def _fresh_amp() -> Iterator[None]:
    yield
    _amp_state.handle._deactivate()
    reset_amp()


class MatMul(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(16, dtype=torch.float32).view(4, 4) / 16)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.mm(x, self.weight)
        self.seen.append(y.dtype)
        return y.sum()


@pytest.mark.parametrize("preferred, want", [(False, torch.bfloat16), (True, torch.float32)])
def test_o1_with_a_registered_float_mm_on_npu(npu, preferred, want):
    amp.register_float_function(torch, "mm")
    model = MatMul().to(npu)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(
        model,
        opt,
        opt_level="O1",
        half_dtype=torch.bfloat16,
        user_cast_preferred=preferred,
        verbosity=0,
    )
    with amp.scale_loss(model(torch.ones(2, 4, device=npu)), opt) as scaled:
        scaled.backward()
    opt.step()
    assert model.seen == [want] and model.weight.device == npu
    assert _amp_state.handle.is_active()
    _amp_state.handle._deactivate()
    model(torch.ones(2, 4, device=npu))
    assert model.seen[-1] == torch.float32


def test_fused_adam_master_weights_on_npu_equals_the_cpu(npu):
    torch.manual_seed(0)
    cpu_model = torch.nn.Linear(4, 2).half()
    npu_model = copy.deepcopy(cpu_model).to(npu)
    runs = []
    for model in (cpu_model, npu_model):
        device = model.weight.device
        opt = FusedAdam(model.parameters(), lr=1e-2, master_weights=True, capturable=True)
        torch.manual_seed(1)
        for _ in range(3):
            opt.zero_grad()
            x = torch.randn(8, 4).half().to(device)
            (model(x).float() ** 2).mean().backward()
            opt.step()
        runs.append([p.detach().to(CPU) for p in model.parameters()])
        assert opt.state[model.weight]["exp_avg"].device == device
    for a, b in zip(*runs):
        assert a.dtype == b.dtype == torch.float16
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_dump_of_a_step_on_npu_matches_the_cpu(npu, tmp_path: Path):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    npu_model = copy.deepcopy(cpu_model).to(npu)
    x = torch.randn(5, 4)
    dumps = []
    for name, model in (("cpu", cpu_model), ("npu", npu_model)):
        dumper = HookerAndDumper(str(tmp_path / f"{name}_"))
        dumper.register_hooks(model, 0, 0)
        model(x.to(model[0].weight.device)).sum().backward()
        dumper.remove_hooks()
        dumps.append(dumper.read_h5py_data())
    cpu, dev = dumps
    assert list(cpu) == list(dev) and len(cpu) == 12  # 6 groups x 2 datasets
    for key in cpu:
        torch.testing.assert_close(
            torch.from_numpy(dev[key]), torch.from_numpy(cpu[key]), rtol=1e-5, atol=1e-6, msg=key
        )


def test_old_o1_api_casts_with_the_accelerators_lists(npu: torch.device) -> None:
    """``amp.init()`` (apex's old O1 API) enters autocast on the current accelerator too; there
    torch uses CUDA's op lists, which apex's own tests expect: linear half, softmax float."""
    handle = amp.init()
    x = torch.randn(4, 8, device=npu)
    assert torch.nn.Linear(8, 8).to(npu)(x).dtype == torch.float16
    assert torch.softmax(x.half(), dim=1).dtype == torch.float32
    with amp.disable_casts():
        assert torch.nn.Linear(8, 8).to(npu)(x).dtype == torch.float32
    # The CPU too, where its autocast takes float16 (torch >= 2.2); else init() leaves it out
    # (torch 2.1), and refuses it when asked for it alone.
    cpu_fp16 = compat.autocast_supports("cpu", torch.float16)
    cpu_out = torch.nn.Linear(8, 8)(torch.randn(4, 8)).dtype
    assert cpu_out == (torch.float16 if cpu_fp16 else torch.float32)
    handle._deactivate()
    assert torch.nn.Linear(8, 8).to(npu)(x).dtype == torch.float32
    if not cpu_fp16:
        with pytest.raises(compat.HalfUnsupportedError, match=r"patch_type=torch\.bfloat16"):
            amp.init(device_type="cpu")
