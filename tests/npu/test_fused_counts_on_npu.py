"""amp's own fused optimizers (apex's names) on the `npu` test device step in a fixed number of
device operations whatever the number of parameters, with at most one host read per step: the
counts are deterministic (torch's dispatcher, tests/npu/npu_fused_ops.py), so they are asserted
here, at 10 and 1,000 parameters, under amp O2 (unscale + check, step, zero_grad) and without
amp (the step alone). The results match the CPU kernels' (a few float32 ulps: the kernels fuse
what the device path rounds twice), and the optimizers keep apex's per-parameter state."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import CPU, reset_amp
from npu_fused_ops import PHASES, ManyParams, OpCounter, count_step

import amp
from amp import _torch_compat as compat
from amp._amp_state import _amp_state
from amp.optimizers import (
    FusedAdagrad,
    FusedAdam,
    FusedLAMB,
    FusedMixedPrecisionLamb,
    FusedNovoGrad,
    FusedSGD,
)

pytestmark = pytest.mark.filterwarnings("ignore::amp._device.AmpDeviceFallbackWarning")

# The budget: ops per step <= 32 and host syncs <= 1 at 1,000 parameters.
MAX_OPS, MAX_SYNCS = 32, 1
# torch < 2.3 (the Ascend lane's 2.1) costs LAMB a few more calls, still a fixed number: its
# `_foreach_norm` takes no dtype, so each float64 norm copies its tensors to float64 first (one
# call), and its in-place foreach ops on a device leave tensor versions alone, so LAMB's clip
# cannot tell whether amp's measured norm is still the gradients' and measures again
# (grads_signature: four calls). Measured: 37 (31 on later torches), 41 deferred (33).
OLD_TORCH_EXTRA = 0 if compat.foreach_norm_takes_dtype() else 8

Make = Callable[[Any], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Make] = {
    "FusedAdam": lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01),
    "FusedSGD": lambda ps: FusedSGD(ps, lr=0.01, momentum=0.9),
    "FusedLAMB": lambda ps: FusedLAMB(ps, lr=1e-3),  # clips by max_grad_norm=1 by default
    "FusedAdagrad": lambda ps: FusedAdagrad(ps, lr=1e-2),
    "FusedNovoGrad": lambda ps: FusedNovoGrad(ps, lr=1e-3, weight_decay=0.01),
    "FusedMixedPrecisionLamb": lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-3),
}
# The variants whose extra work must not bring per-parameter calls back.
VARIANTS: dict[str, Make] = {
    "FusedAdam-clip": lambda ps: FusedAdam(ps, lr=1e-3, max_grad_norm=0.5),
    "FusedSGD-nesterov-clip": lambda ps: FusedSGD(
        ps, lr=0.01, momentum=0.9, nesterov=True, max_grad_norm=0.5
    ),
    "FusedNovoGrad-max-norm": lambda ps: FusedNovoGrad(
        ps, lr=1e-3, norm_type=0, reg_inside_moment=True
    ),
    "FusedAdagrad-w-mode": lambda ps: FusedAdagrad(
        ps, lr=1e-2, weight_decay=0.01, adagrad_w_mode=True
    ),
}
ALL = {**OPTIMIZERS, **VARIANTS}


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    reset_amp()
    yield
    reset_amp()


def _amp_counts(make: Make, n: int, npu: torch.device, **init_kw: Any) -> tuple[int, int]:
    reset_amp()
    init_kw.setdefault("opt_level", "O2")
    counter = count_step(make, n, 16, npu, dynamic_init_scale=2.0**10, **init_kw)
    return sum(counter.launches[p] for p in PHASES), sum(counter.syncs.values())


def _standalone_counts(
    make: Make, n: int, npu: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[int, int]:
    """The launches and syncs of one steady-state ``step()`` (after two), without amp."""
    model = ManyParams(n, 16).to(device=npu, dtype=dtype)
    opt = make(model.parameters())
    x = torch.randn(n * 16, generator=torch.Generator().manual_seed(1)).to(npu)
    counter = OpCounter("npu")
    for i in range(3):
        opt.zero_grad()
        model(x).backward()
        with counter if i == 2 else contextlib.nullcontext():
            with counter.phase("step"):
                opt.step()
    return counter.launches["step"], sum(counter.syncs.values())


@pytest.mark.promise(
    promise="amp's fused optimizers (FusedAdam, FusedSGD, FusedLAMB, FusedAdagrad, "
    "FusedNovoGrad, FusedMixedPrecisionLamb) step on a device in a fixed number of "
    "device operations, whatever the number of parameters, and read the device at "
    "most once per step (the loss scaler's overflow decision)",
    fault="amp O2 on the npu test device, 10 and 1,000 parameters; the operations of "
    "unscale + overflow check, step and zero_grad counted at torch's dispatcher",
    result="the same count at 10 and 1,000 parameters, at most 32 operations and 1 host "
    "read per step for each optimizer",
)
@pytest.mark.parametrize("name", sorted(ALL))
def test_amp_o2_step_ops_do_not_grow_with_parameters(npu: torch.device, name: str) -> None:
    small, large = _amp_counts(ALL[name], 10, npu), _amp_counts(ALL[name], 1000, npu)
    assert small == large, (small, large)
    ops, syncs = large
    assert ops <= MAX_OPS + OLD_TORCH_EXTRA and syncs <= MAX_SYNCS, large


# amp's other paths into these optimizers: a few more operations each (the deferred check
# measures the still-scaled gradients, the combined unscale leaves LAMB's clip its own norm),
# still a fixed number, and still one read.
OTHER_PATHS = {
    "O1": {"opt_level": "O1"},
    "O2-defer_unscale": {"opt_level": "O2", "defer_unscale": True},
    "O2-combine_grad": {"opt_level": "O2", "combine_grad": True},
}
MAX_OPS_OTHER_PATHS = 36


@pytest.mark.parametrize("path", sorted(OTHER_PATHS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_other_amp_paths_do_not_grow_with_parameters(
    npu: torch.device, name: str, path: str
) -> None:
    small = _amp_counts(OPTIMIZERS[name], 10, npu, **OTHER_PATHS[path])
    large = _amp_counts(OPTIMIZERS[name], 1000, npu, **OTHER_PATHS[path])
    assert small == large, (small, large)
    assert large[0] <= MAX_OPS_OTHER_PATHS + OLD_TORCH_EXTRA and large[1] <= MAX_SYNCS, large


@pytest.mark.promise(
    promise="Without amp, a fused optimizer's step() on a device is a fixed number of device "
    "operations and never reads a value back to the host (clipping included)",
    fault="each fused optimizer stepped directly on the npu test device, 10 and 1,000 "
    "parameters (fp32; FusedMixedPrecisionLamb also with a bf16 model and fp32 masters)",
    result="the same count at 10 and 1,000 parameters, at most 32 operations, no host read",
)
@pytest.mark.parametrize("name", sorted(ALL) + ["FusedMixedPrecisionLamb-bf16"])
def test_standalone_step_ops_do_not_grow_with_parameters(npu: torch.device, name: str) -> None:
    if name == "FusedMixedPrecisionLamb-bf16":

        def make(ps: Any) -> torch.optim.Optimizer:
            return FusedMixedPrecisionLamb(ps, lr=1e-3, reduced_precision_dtype=torch.bfloat16)

        dtype = torch.bfloat16
    else:
        make, dtype = ALL[name], torch.float32
    small = _standalone_counts(make, 10, npu, dtype)
    large = _standalone_counts(make, 1000, npu, dtype)
    assert small == large, (small, large)
    assert large[0] <= MAX_OPS and large[1] == 0, large


def _train(
    device: torch.device, make: Make, level: str | None, steps: int = 4
) -> tuple[list[torch.Tensor], dict]:
    """Many small parameters (the count the device path is for), a few steps; the final
    parameters and the optimizer's state_dict."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(12)]).to(device)
    opt = make(model.parameters())
    if level is not None:
        model, opt = amp.initialize(
            model, opt, opt_level=level, verbosity=0, dynamic_init_scale=2.0**10
        )
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 6, generator=g).to(device)
    y = torch.randn(16, 6, generator=g).to(device)
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x).float(), y) * 50  # large enough for LAMB's clip to act
        if level is None:
            loss.backward()
        else:
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()], opt.state_dict()


@pytest.mark.parametrize("level", [None, "O2"], ids=["standalone", "O2"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_device_path_matches_cpu_kernels(npu: torch.device, name: str, level: str | None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, got_sd = _train(npu, ALL[name], level)
    reset_amp()
    want, want_sd = _train(CPU, ALL[name], level)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 if g.dtype == torch.float32 else 1e-3)
    # apex's per-parameter layout: the same parameters, keys, shapes and dtypes.
    assert got_sd["param_groups"] == want_sd["param_groups"]
    assert sorted(got_sd["state"]) == sorted(want_sd["state"])
    for i, st in want_sd["state"].items():
        mine = got_sd["state"][i]
        assert sorted(mine) == sorted(st)
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                assert mine[key].shape == value.shape and mine[key].dtype == value.dtype
                torch.testing.assert_close(mine[key].cpu(), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_added_group_and_replaced_data_on_npu(npu: torch.device, name: str) -> None:
    """add_param_group after steps, and a parameter whose .data was replaced, keep stepping on
    the device like on the CPU."""
    results = []
    for device in (npu, CPU):
        torch.manual_seed(0)
        a = torch.nn.Parameter(torch.randn(5, device=device))
        b = torch.nn.Parameter(torch.randn(3, device=device))
        opt = OPTIMIZERS[name]([a])
        for step in range(4):
            if step == 2:
                opt.add_param_group({"params": [b]})
                a.data = a.data.clone() * 0.5
            opt.zero_grad()
            (a.square().sum() + (b**3).sum() if step >= 2 else a.square().sum()).backward()
            opt.step()
        results.append([a.detach().cpu(), b.detach().cpu()])
    for g, w in zip(*results):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_an_overflow_is_found_on_the_device_and_skips_the_step(npu: torch.device) -> None:
    """The found-inf flag computed on the device (one read, by the loss scaler) still skips
    an overflowing step and backs the scale off."""
    model = ManyParams(50, 8).to(npu)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0, dynamic_init_scale=2.0**10)
    x = torch.ones(50 * 8).to(npu)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    with amp.scale_loss(model(x), opt) as scaled:
        scaled.backward()
        model.ps[7].grad[3] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.step()
    assert all(torch.equal(p.detach().cpu(), q) for p, q in zip(model.parameters(), before))
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**9


@pytest.mark.parametrize("name", ["FusedAdam-clip", "FusedLAMB"])
def test_one_group_on_two_devices(npu: torch.device, name: str) -> None:
    """A group holding npu and CPU parameters: each device's tensors in their own calls (the
    CPU ones on the kernels), one global norm for clipping, the CPU-only run's results."""
    results = []
    for devices in ((npu, CPU), (CPU, CPU)):
        torch.manual_seed(0)
        a = torch.nn.Parameter(torch.randn(7, device=devices[0]))
        b = torch.nn.Parameter(torch.randn(4, device=devices[1]))
        opt = ALL[name]([a, b])
        for _ in range(3):
            opt.zero_grad()
            (a.square().sum() * 3 + (b**3).sum().to(a.device)).backward()
            opt.step()
        assert a.device == devices[0] and b.device == devices[1]
        results.append([a.detach().cpu(), b.detach().cpu()])
    for g, w in zip(*results):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_capturable_adam_with_grad_scaler_reads_the_scale_on_the_device(npu: torch.device) -> None:
    """FusedAdam(capturable=True) under torch.amp.GradScaler: the fp32 gradients are unscaled
    by the scaler's scale on the device (its only read is found_inf's), with the CPU's
    results, an overflowing step skipped on both."""
    results = []
    for device in (npu, CPU):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 1)).to(device)
        opt = FusedAdam(model.parameters(), lr=1e-2, capturable=True)
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**6 * 3, growth_interval=1)
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(8, 6, generator=g).to(device), torch.randn(8, 1, generator=g)
        scales = []
        for step in range(3):
            opt.zero_grad()
            scaler.scale(F.mse_loss(model(x), y.to(device))).backward()
            if step == 1:
                model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        results.append((scales, [p.detach().cpu() for p in model.parameters()]))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ALL))
def test_an_empty_parameter_on_npu(npu: torch.device, name: str) -> None:
    """A parameter with no elements among others (its norm 0, its max norm 0 as the kernels
    take it) steps like on the CPU."""
    results = []
    for device in (npu, CPU):
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(n, device=device)) for n in (4, 0, 3)]
        opt = ALL[name](ps)
        for _ in range(3):
            opt.zero_grad()
            sum((p**3).sum() for p in ps).backward()
            opt.step()
        results.append([p.detach().cpu() for p in ps])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
