"""NVIDIA apex's old O1 API on torch.autocast: ``amp.init()`` returns a handle that casts for the
calling thread until ``handle._deactivate()``; ``amp.disable_casts()`` turns casting off for a
block (amp/casting/legacy.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import amp
from amp import _torch_compat as compat
from amp._amp_state import _amp_state
from amp.casting.legacy import InitHandle, NoOpHandle


@pytest.fixture(autouse=True)
def _deactivated() -> Iterator[None]:
    yield
    _amp_state.handle._deactivate()
    # nothing left behind for the next test
    for device_type in {"cpu", compat.current_accelerator() or "cpu"}:
        assert not compat.is_autocast_enabled(device_type)


def _device() -> str:
    """The type of torch's default device, which the tests below cast on: the CPU, or the npu
    test device where torch's CPU has no float16 (half_device, tests/conftest.py)."""
    return torch.empty(0).device.type


def _linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8)


@pytest.mark.half_device
def test_init_casts_per_autocast_until_deactivate() -> None:
    lin, x = _linear(), torch.randn(4, 8, requires_grad=True)
    handle = amp.init(device_type=_device())
    assert isinstance(handle, InitHandle) and handle.is_active()
    assert _amp_state.handle is handle and handle.has_cache
    out = lin(x)
    assert out.dtype == torch.float16  # linear: half
    assert F.mse_loss(out, torch.zeros_like(out)).dtype == torch.float32  # losses: float
    out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32  # grads match the input
    handle._deactivate()
    assert not handle.is_active() and lin(x).dtype == torch.float32
    handle._deactivate()  # twice: no error, as apex's tests call it unconditionally


def test_bf16_and_the_accelerator_by_default() -> None:
    handle = amp.init(patch_type=torch.bfloat16)  # the CPU, plus any current accelerator
    assert _linear()(torch.randn(2, 8)).dtype == torch.bfloat16
    handle._deactivate()
    with pytest.raises(TypeError, match=r"patch_type must be torch\.float16 or torch\.bfloat16"):
        amp.init(patch_type=torch.float32)


@pytest.mark.half_device
def test_disable_casts_inside_init_and_inside_an_o1_forward() -> None:
    lin, x = _linear(), torch.randn(2, 8)
    amp.init(device_type=_device())
    with amp.disable_casts():
        assert lin(x).dtype == torch.float32
        assert not _amp_state.handle.is_active()
    assert lin(x).dtype == torch.float16 and _amp_state.handle.is_active()
    _amp_state.handle._deactivate()

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = _linear(), _linear()
            self.seen: list[torch.dtype] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            with amp.disable_casts():  # this part in float32, as apex lets it be written
                out = self.b(h.float())
            self.seen += [h.dtype, out.dtype]
            return out

    model = Mixed()
    model, _ = amp.initialize(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        opt_level="O1",
        half_dtype=torch.bfloat16,
        verbosity=0,
    )
    model(x)
    assert model.seen == [torch.bfloat16, torch.float32]


@pytest.mark.half_device
def test_registered_functions_are_consumed_by_init_and_restored() -> None:
    class Lib:
        @staticmethod
        def concat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cat([a, b])

    original = Lib.concat
    amp.register_half_function(Lib, "concat")
    handle = amp.init(device_type=_device())
    assert Lib.concat is not original
    assert Lib.concat(torch.ones(2), torch.ones(2)).dtype == torch.float16
    handle._deactivate()
    assert Lib.concat is original


@pytest.mark.half_device
def test_binary_cross_entropy_is_banned_on_half_unless_allowed() -> None:
    original = F.binary_cross_entropy
    half, target = torch.rand(4).half(), torch.rand(4)
    handle = amp.init(device_type=_device())
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        torch.nn.BCELoss()(half, target)
    assert F.binary_cross_entropy(half.float(), target).dtype == torch.float32  # float: fine
    handle._deactivate()
    assert F.binary_cross_entropy is original
    handle = amp.init(device_type=_device(), allow_banned=True)
    assert torch.nn.BCELoss()(half, target).dtype == torch.float32
    handle._deactivate()
    assert F.binary_cross_entropy is original


@pytest.mark.half_device
def test_disabled_init_and_a_second_init() -> None:
    noop = amp.init(enabled=False)
    assert isinstance(noop, NoOpHandle) and not noop.is_active()
    assert _linear()(torch.randn(2, 8)).dtype == torch.float32
    first = amp.init(device_type=_device())
    second = amp.init(device_type=_device())  # replaces the first instead of nesting in it
    assert not first.is_active() and second.is_active()
    second._deactivate()
    assert _linear()(torch.randn(2, 8)).dtype == torch.float32


@pytest.mark.half_device
def test_casting_is_for_the_thread_that_called_init() -> None:
    """autocast's state is per thread: a thread of its own does not cast (apex's patching was
    process-wide; amp.initialize's O1 casts each model's forward on any thread)."""
    device = _device()
    handle = amp.init(device_type=device)
    seen: list[torch.dtype] = []
    worker = threading.Thread(
        target=lambda: seen.append(_linear().to(device)(torch.randn(2, 8, device=device)).dtype)
    )
    worker.start()
    worker.join()
    assert seen == [torch.float32]
    assert _linear()(torch.randn(2, 8)).dtype == torch.float16
    handle._deactivate()
