"""apex's ``multi_tensor_applier(amp_C.multi_tensor_*, noop_flag, lists, *args)`` with tensors
on the `npu` test device. The decision (amp/multi_tensor_apply.py): apex code written for its
device expects these calls to work on that device, so amp._C's ops given non-CPU tensors run
their pure-torch twins there (amp/kernels/apex_ops.py), with the same arguments and noop_flag rules,
results on the device. Checked against the same call with CPU tensors on the compiled ops
(close: the kernels fuse what torch rounds in separate ops; see test_fused_on_npu.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch

from amp import _ext, multi_tensor_applier
from amp._device import AmpDeviceFallbackWarning, reset_device_warnings

# Tests that count the device warning record it themselves; elsewhere it is expected.
pytestmark = pytest.mark.filterwarnings(
    "ignore::amp._device.AmpDeviceFallbackWarning",
    "ignore:GradScaler is going to stop passing itself:FutureWarning",
)

SIZES = [3, 17, 130]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_device_warnings()
    yield
    reset_device_warnings()


@pytest.fixture
def amp_C() -> Any:
    mod = _ext.load()
    assert mod is not None, "amp._C must be built for the test suite (make setup)"
    return mod


def _lists(
    count: int, dtype: torch.dtype = torch.float32, positive: bool = False
) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(count)
    out = []
    for _ in range(count):
        ts = [torch.randn(n, generator=g) for n in SIZES]
        out.append([(t.abs() + 0.1 if positive else t).to(dtype) for t in ts])
    return out


# test id -> (amp._C op, number of tensor lists, the op's other arguments on that device).
# All lists hold positive values: Adagrad's sums are square-rooted.
CALLS: dict[str, Callable[[Any], tuple[str, int, tuple]]] = {
    "scale": lambda dev: ("multi_tensor_scale", 2, (0.5,)),
    "axpby": lambda dev: ("multi_tensor_axpby", 3, (2.0, -0.5, -1)),
    "adam": lambda dev: ("multi_tensor_adam", 4, (1e-2, 0.9, 0.999, 1e-8, 3, 1, 1, 0.01)),
    "sgd": lambda dev: ("multi_tensor_sgd", 3, (0.01, 0.9, 0.0, 0.05, True, False, False, 0.5)),
    "lamb": lambda dev: (
        "multi_tensor_lamb",
        4,
        (1e-2, 0.9, 0.999, 1e-6, 2, 1, 0.01, 1, 1, torch.tensor([3.0], device=dev), 1.0),
    ),
    "adagrad": lambda dev: ("multi_tensor_adagrad", 3, (0.05, 1e-10, 1, 0.01)),
    "novograd": lambda dev: (
        "multi_tensor_novograd",
        3,
        (torch.tensor([0.5, 1.0, 2.0], device=dev), 1e-2, 0.95, 0.98, 1e-8, 2, 1, 0.01, 1, 1, 2),
    ),
}


def _run(amp_C: Any, device: torch.device, call: str) -> tuple[list[list[torch.Tensor]], list]:
    name, count, args = CALLS[call](device)
    lists = [[t.to(device) for t in ts] for ts in _lists(count, positive=True)]
    flag = torch.zeros(1, dtype=torch.int, device=device)
    multi_tensor_applier(getattr(amp_C, name), flag, lists, *args)
    extras = [a.cpu() for a in args if isinstance(a, torch.Tensor)]
    assert flag.item() == 0
    return [[t.cpu() for t in ts] for ts in lists], extras


@pytest.mark.parametrize("call", sorted(CALLS))
def test_apex_op_on_npu_matches_cpu(npu: torch.device, amp_C: Any, call: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, got_extra = _run(amp_C, npu, call)
    assert [w.category for w in caught] == [AmpDeviceFallbackWarning]
    want, want_extra = _run(amp_C, torch.device("cpu"), call)
    for g_list, w_list in zip(got + [got_extra], want + [want_extra]):
        for g, w in zip(g_list, w_list):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_l2norm_on_npu_returns_device_tensors(npu: torch.device, amp_C: Any) -> None:
    (xs,) = _lists(1)
    flag = torch.zeros(1, dtype=torch.int, device=npu)
    norm, per = multi_tensor_applier(
        amp_C.multi_tensor_l2norm, flag, [[x.to(npu) for x in xs]], True
    )
    ref_norm, ref_per = multi_tensor_applier(
        amp_C.multi_tensor_l2norm, torch.zeros(1, dtype=torch.int), [xs], True
    )
    assert norm.device.type == per.device.type == "npu"
    assert norm.dtype == per.dtype == torch.float32 and norm.shape == (1,)
    torch.testing.assert_close(norm.cpu(), ref_norm)
    torch.testing.assert_close(per.cpu(), ref_per)
    inv = torch.tensor([0.25], device=npu)
    scaled, empty = multi_tensor_applier(
        amp_C.multi_tensor_unscale_l2norm, flag, [[x.to(npu) for x in xs]], inv
    )
    torch.testing.assert_close(scaled.cpu(), ref_norm * 0.25)
    assert empty.numel() == 0 and empty.device.type == "npu"
    assert flag.item() == 0


def test_noop_flag_rules_on_npu(npu: torch.device, amp_C: Any) -> None:
    xs, outs = [[t.to(npu) for t in ts] for ts in _lists(2)]
    flag = torch.zeros(1, dtype=torch.int, device=npu)
    xs[1][4] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [xs, outs], 2.0)
    assert flag.item() == 1  # set on overflow...
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [outs[:1], outs[:1]], 1.0)
    assert flag.item() == 1  # ...and never cleared, as apex
    g, p, m = [[t.to(npu) for t in ts] for ts in _lists(3)]
    before = [t.cpu() for t in p]
    multi_tensor_applier(
        amp_C.multi_tensor_sgd, flag, [g, p, m], 0.0, 0.9, 0.0, 0.1, False, True, False
    )
    assert all(torch.equal(a.cpu(), b) for a, b in zip(p, before))  # SGD skips once flagged


def test_other_callables_are_called_as_given(npu: torch.device) -> None:
    seen = []

    def my_op(chunk_size: int, flag: torch.Tensor, lists: list, *args: Any) -> str:
        seen.append((chunk_size, lists[0][0].device.type, args))
        return "done"

    lists = [[torch.ones(2, device=npu)]]
    assert multi_tensor_applier(my_op, torch.zeros(1), lists, 7) == "done"
    assert seen == [(multi_tensor_applier.chunk_size, "npu", (7,))]


def test_apex_op_called_directly_serves_npu(npu: torch.device, amp_C: Any) -> None:
    # amp._C's multi_tensor_* are amp.kernels.apex_ops' (one place for apex's conventions): called
    # without multi_tensor_applier they run on the tensors' device too.
    lists = [[torch.ones(3, device=npu)], [torch.empty(3, device=npu)]]
    flag = torch.zeros(1, dtype=torch.int, device=npu)
    amp_C.multi_tensor_scale(2048, flag, lists, 2.0)
    assert lists[1][0].device.type == "npu" and lists[1][0].cpu().tolist() == [2.0, 2.0, 2.0]
    assert flag.item() == 0
