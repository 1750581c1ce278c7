"""Saturation mode (amp/ascend/saturation.py): on an Ascend NPU whose float overflow saturates,
gradients are always finite and only the device's overflow flag tells an overflowed step.

On the `npu` test device switched to saturation mode (fp16 overflow gives +-65504 and raises
its flag; torch_npu_standin.py answers ``is_support_inf_nan()`` with False), every run here
must behave exactly like the same run in inf/NaN mode, where the overflow shows up as inf in
the gradients: the same steps skipped, the same scales, the same parameters bit for bit. And
a scaler that ignores the flag is shown to apply the saturated steps, which is what the
feature exists to prevent."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import npu_module
import pytest
import torch
import torch.nn.functional as F
from amp_npu_lib import Run, data, quickstart, reset_amp, snapshot

import amp
import amp.optimizers
import amp.scaler
from amp._amp_state import _amp_state
from amp.ascend.saturation import saturation_flag

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "amp"))
from amp_testlib import run_ranks

FP16 = torch.float16
# From 2**20 the quick start's fp16 gradients overflow at 2**20 .. 2**16 and fit at 2**15:
# five overflowed steps, then clean ones.
OVERFLOWING = {"dynamic_init_scale": 2.0**20}


def _runs(npu: torch.device, level: str, steps: int = 7, **kw: Any) -> tuple[Run, Run]:
    """The same run in inf/NaN mode, then in saturation mode."""
    runs = []
    for saturate in (False, True):
        reset_amp()
        npu_module.set_saturation_mode(saturate)
        run = quickstart(npu, level, FP16, steps=steps, **kw)
        assert _amp_state.loss_scalers[0].mode == ("saturation" if saturate else "inf_nan")
        runs.append(run)
    npu_module.set_saturation_mode(False)
    return runs[0], runs[1]


def _same(a: Run, b: Run) -> None:
    assert a.scales == b.scales
    for got, want in zip(a.params() + a.masters(), b.params() + b.masters()):
        assert torch.equal(got, want)


# ------------------------------------------------------------------ the device's model
def test_the_device_saturates_fp16_overflow_and_raises_its_flag(
    saturating_npu: torch.device,
) -> None:
    big = torch.full((3,), 60000.0, dtype=FP16, device=saturating_npu)
    assert not npu_module.get_npu_overflow_flag()
    assert torch.equal((big + big).cpu(), torch.full((3,), 65504.0, dtype=FP16))
    assert npu_module.get_npu_overflow_flag()
    npu_module.clear_npu_overflow_flag()
    assert not npu_module.get_npu_overflow_flag()
    # A conversion, an in-place op, a _foreach_ list, a NaN: each saturates and raises it.
    cases: list[Callable[[], torch.Tensor]] = [
        lambda: torch.tensor([1e6, -1e6, 1.0]).to(saturating_npu).half(),
        lambda: big.clone().mul_(-2),
        lambda: torch._foreach_mul([big], 2.0)[0],
        lambda: torch.zeros(2, device=saturating_npu) / 0,
    ]
    wanted = [[65504.0, -65504.0, 1.0], [-65504.0] * 3, [65504.0] * 3, [0.0, 0.0]]
    for case, want in zip(cases, wanted):
        npu_module.clear_npu_overflow_flag()
        assert case().cpu().float().tolist() == want
        assert npu_module.get_npu_overflow_flag()
    npu_module.clear_npu_overflow_flag()
    (big / 4).sum()  # 45000: nothing overflows, the flag stays down
    assert not npu_module.get_npu_overflow_flag()
    npu_module.set_saturation_mode(False)  # inf/NaN mode: IEEE results, no flag
    assert torch.isinf((big + big).cpu()).all() and not npu_module.get_npu_overflow_flag()


# ------------------------------------------------------------------ choosing the mode
def test_the_mode_is_chosen_once_per_scaler_from_torch_npu(
    torch_npu: ModuleType, npu: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert amp.LossScaler("dynamic").mode == "inf_nan"  # the device supports inf/NaN
    npu_module.set_saturation_mode(True)
    assert torch_npu.npu.utils.is_support_inf_nan() is False
    for device_type, mode in (
        ("npu", "saturation"),
        (None, "saturation"),
        ("cpu", "inf_nan"),
        ("cuda", "inf_nan"),
    ):
        scaler = amp.LossScaler("dynamic", device_type=device_type)
        assert scaler.mode == mode and scaler._is_support_inf_nan == (mode == "inf_nan")
    scaler = amp.LossScaler("dynamic", device_type="npu")
    npu_module.set_saturation_mode(False)
    assert scaler.mode == "saturation"  # chosen once, at construction
    # A model on another device: amp.initialize passes its device type.
    # (bfloat16: a CPU model's O1 in float16 needs torch >= 2.2's CPU autocast)
    amp.initialize(torch.nn.Linear(2, 1), opt_level="O1", half_dtype=torch.bfloat16, verbosity=0)
    assert _amp_state.loss_scalers[0].mode == "inf_nan"
    # No torch_npu imported: inf/NaN mode, whatever the device.
    npu_module.set_saturation_mode(True)
    monkeypatch.delitem(sys.modules, "torch_npu")
    assert saturation_flag("npu") is None and amp.LossScaler("dynamic").mode == "inf_nan"


def test_a_torch_npu_older_than_inf_nan_support_is_saturation_mode(
    torch_npu: ModuleType, npu: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = ModuleType("torch_npu.npu")
    old.clear_npu_overflow_flag = npu_module.clear_npu_overflow_flag  # type: ignore[attr-defined]
    old.get_npu_overflow_flag = npu_module.get_npu_overflow_flag  # type: ignore[attr-defined]
    monkeypatch.setattr(torch_npu, "npu", old)
    assert amp.LossScaler("dynamic").mode == "saturation"  # no is_support_inf_nan: as Ascend
    del old.get_npu_overflow_flag
    with pytest.raises(RuntimeError, match="no get_npu_overflow_flag: amp could not see"):
        amp.LossScaler("dynamic")


# ------------------------------------------------------------------ training
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_saturated_steps_are_skipped_exactly_as_overflowed_ones(
    torch_npu: ModuleType, npu: torch.device, level: str
) -> None:
    inf_nan, saturated = _runs(npu, level, **OVERFLOWING)
    assert inf_nan.scales[:5] == [2.0**19, 2.0**18, 2.0**17, 2.0**16, 2.0**15]  # 5 skipped
    _same(inf_nan, saturated)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_a_scaler_that_ignores_the_flag_applies_the_saturated_steps(
    saturating_npu: torch.device, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without saturation mode (the scaler never reads the flag) the saturated gradients are
    finite, nothing is skipped, the scale never backs off: the overflowed steps are applied."""
    monkeypatch.setattr(amp.scaler, "saturation_flag", lambda device_type=None: None)
    reset_amp()
    ignoring = quickstart(saturating_npu, level, FP16, steps=7, **OVERFLOWING)
    assert _amp_state.loss_scalers[0].mode == "inf_nan"
    assert ignoring.scales == [2.0**20] * 7
    monkeypatch.undo()
    npu_module.set_saturation_mode(False)
    reset_amp()
    honest = quickstart(saturating_npu, level, FP16, steps=7, **OVERFLOWING)
    assert honest.scales != ignoring.scales
    assert any(not torch.equal(a, b) for a, b in zip(honest.params(), ignoring.params()))


def _npu_fused_sgd(ps: Any) -> Any:
    return amp.optimizers.NpuFusedSGD(ps, lr=0.05, momentum=0.9)


def _npu_fused_adam(ps: Any) -> Any:
    return amp.optimizers.NpuFusedAdam(ps, lr=1e-2)


def _sgd(ps: Any) -> Any:
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


@pytest.mark.filterwarnings("ignore::amp._device.AmpDeviceFallbackWarning")
@pytest.mark.parametrize(
    "make", [_sgd, _npu_fused_sgd, _npu_fused_adam], ids=["SGD", "NpuFusedSGD", "NpuFusedAdam"]
)
def test_o2_combine_grad_with_npu_fused_optimizers(
    torch_npu: ModuleType, npu: torch.device, make: Callable[[Any], Any]
) -> None:
    inf_nan, saturated = _runs(npu, "O2", make_opt=make, combine_grad=True, **OVERFLOWING)
    assert saturated.optimizer.get_model_combined_grads()  # the combined path was taken
    assert inf_nan.scales[4] == 2.0**15
    _same(inf_nan, saturated)


def test_the_flag_is_cleared_and_read_once_per_step_across_accumulation(
    saturating_npu: torch.device, torch_npu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    device_clear, device_get = npu_module.clear_npu_overflow_flag, npu_module.get_npu_overflow_flag

    def clear() -> None:
        calls.append("clear")
        device_clear()

    def get() -> bool:
        calls.append("get")
        return device_get()

    monkeypatch.setattr(torch_npu.npu, "clear_npu_overflow_flag", clear)
    monkeypatch.setattr(torch_npu.npu, "get_npu_overflow_flag", get)
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1).to(saturating_npu)
    opt = _sgd(model.parameters())
    model, opt = amp.initialize(model, opt, opt_level="O2", verbosity=0, dynamic_init_scale=2.0**12)
    x, y = data()
    before = [p.detach().clone() for p in amp.master_params(opt)]
    opt.zero_grad()
    for micro in range(3):
        # Only the first micro-batch overflows: a flag cleared again at the second pass's
        # entry would forget it.
        scale = 300.0 if micro == 0 else 1.0
        loss = F.mse_loss(model(x.to(saturating_npu) * scale), y.to(saturating_npu))
        with amp.scale_loss(loss, opt, delay_unscale=micro < 2) as scaled:
            scaled.backward()
    assert calls == ["clear", "get"]
    opt.step()
    assert _amp_state.loss_scalers[0].loss_scale() == 2.0**11  # skipped and backed off
    assert all(torch.equal(a, b) for a, b in zip(before, amp.master_params(opt)))


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_a_checkpoint_across_a_saturated_step_resumes_exactly(
    saturating_npu: torch.device, level: str
) -> None:
    # From 2**17 with a window of 2 the scale overflows, backs off, grows back and overflows
    # again: saturated steps before and after the checkpoint.
    init = dict(dynamic_init_scale=2.0**17, scale_window=2)
    full = quickstart(saturating_npu, level, FP16, steps=8, **init)
    reset_amp()
    first = quickstart(saturating_npu, level, FP16, steps=4, **init)
    saved = snapshot(first)
    assert saved["amp"]["loss_scaler0"]["loss_scale"] == first.scales[-1]
    reset_amp()
    torch.manual_seed(123)  # a different init: everything comes from the checkpoint
    model = torch.nn.Linear(10, 1).to(saturating_npu)
    opt = _sgd(model.parameters())
    model, opt = amp.initialize(model, opt, opt_level=level, half_dtype=FP16, verbosity=0, **init)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    amp.load_state_dict(saved["amp"])
    x, y = data()
    scales = []
    for _ in range(4):
        loss = F.mse_loss(model(x.to(saturating_npu)), y.to(saturating_npu))
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        scales.append(_amp_state.loss_scalers[0].loss_scale())
    backoffs = [i for i, (a, b) in enumerate(zip(full.scales, full.scales[1:]), 1) if b < a]
    assert backoffs and backoffs[0] < 4 <= backoffs[-1]  # saturated steps on both sides
    assert first.scales + scales == full.scales
    for got, want in zip(
        list(model.parameters()) + list(amp.master_params(opt)),
        list(full.model.parameters()) + list(amp.master_params(full.optimizer)),
    ):
        assert torch.equal(got.detach().cpu(), want.detach().cpu())


# ------------------------------------------------------------------ torch.distributed
def test_one_saturating_rank_makes_every_rank_skip(npu: torch.device, tmp_path: Path) -> None:
    """Two gloo ranks on the device in saturation mode; at step 2 only rank 1's gradients
    overflow (saturate): both ranks skip that step and back off to the same scale."""
    worker = Path(__file__).parent / "_saturation_worker.py"
    levels = ["O1", "O2"]
    ranks = run_ranks(
        tmp_path, 2, worker, lambda rank: [",".join(levels), str(tmp_path / f"rank{rank}.json")]
    )
    for level in levels:
        for run in ("alone", "combine_ddp"):
            r0, r1 = ranks[0][level][run], ranks[1][level][run]
            where = (level, run)
            assert r1["own_flag"] == [False, False, True, False, False], where
            assert r0["own_flag"] == [False] * 5, where  # rank 0 saw nothing itself ...
            assert r0["grads_finite"] == r1["grads_finite"] == [True] * 5, where  # ... no inf
            for r in (r0, r1):
                assert r["changed"] == [True, True, False, True, True], where  # ... yet skipped
                assert r["scales"] == [2.0**12, 2.0**12, 2.0**11, 2.0**11, 2.0**11], where
        combined = [r[level]["combine_ddp"]["checksum"] for r in ranks]
        assert combined[0] == combined[1], level  # replicas stayed identical
