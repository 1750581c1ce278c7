"""What Apex for Ascend's users' scripts do that amp did not yet meet: ``combine_ddp`` without
``combine_grad``; ``DistributedDataParallel`` built around an initialized model, whose
``zero_grad`` sets the combined gradients to None; the loss scaler's attributes GAN scripts
set (``_scale_seq_len``, ``_has_overflow``, ``update_scale()``)."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from amp_testlib import GLOO_TAKES_NO_NPU, needs_cpu_float16
from torch.nn.parallel import DistributedDataParallel

import amp
import amp.optimizers
from amp._amp_state import _amp_state


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 6),
        torch.nn.ReLU(),
        torch.nn.Linear(6, 6),
        torch.nn.ReLU(),
        torch.nn.BatchNorm1d(6),
        torch.nn.Linear(6, 1),
    )


# ------------------------------------------------------------------ combine_ddp
@pytest.mark.parametrize("combine_grad", [None, False])
def test_combine_ddp_without_combine_grad_raises(combine_grad: Any) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="Combine_grad should be True when combine_ddp"):
        amp.initialize(
            model,
            optimizer,
            opt_level="O1",
            verbosity=0,
            combine_ddp=True,
            combine_grad=combine_grad,
        )
    assert not hasattr(optimizer, "_amp_stash")  # refused before anything was touched
    assert next(model.parameters()).dtype == torch.float32


# ------------------------------------------------------------------ DDP around amp
def _sgd(ps: Any) -> Any:
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _npu_fused_sgd(ps: Any) -> Any:
    return amp.optimizers.NpuFusedSGD(ps, lr=0.05, momentum=0.9)


def _train_ddp(
    level: str, make: Callable[[Any], Any], zero: str, steps: int = 5
) -> tuple[torch.nn.Module, Any, list[float]]:
    """amp.initialize, then DistributedDataParallel (ModelZoo's order); each step zeroes the
    gradients through ``zero`` ("ddp": torch's Module.zero_grad, set_to_none=True)."""
    _amp_state.opt_properties = None
    model = _model()
    optimizer = make(model.parameters())
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=level,
        verbosity=1,
        combine_grad=True,
        check_combined_tensors=True,
        dynamic_init_scale=2.0**10,
    )
    ddp = DistributedDataParallel(model)
    g = torch.Generator().manual_seed(1)
    scales = []
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        (ddp if zero == "ddp" else optimizer).zero_grad()
        with amp.scale_loss(F.mse_loss(ddp(x).float(), x[:, :1]), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        scales.append(_amp_state.loss_scalers[0].loss_scale())
    return model, optimizer, scales


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "level,make",
    [("O1", _sgd), ("O2", _sgd), ("O2", _npu_fused_sgd)],
    ids=["O1-SGD", "O2-SGD", "O2-NpuFusedSGD"],
)
@needs_cpu_float16(GLOO_TAKES_NO_NPU)
def test_ddp_zero_grad_keeps_the_combined_buffers(
    one_rank_gloo: None, level: str, make: Callable[[Any], Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="amp"):
        model, optimizer, scales = _train_ddp(level, make, zero="ddp")
    # Combined once, after the first backward pass; never destroyed (Ascend's message).
    assert optimizer._amp_stash.combined.generation == 1
    assert "Combined grad has been destroyed" not in caplog.text
    flats = [f for f in optimizer.get_model_combined_grads() if f is not None]
    for p in model.parameters():
        assert any(
            f.untyped_storage().data_ptr() == p.grad.untyped_storage().data_ptr() for f in flats
        )
    # The same training as zeroing through the optimizer (amp's in-place, per buffer).
    ref_model, ref_opt, ref_scales = _train_ddp(level, make, zero="optimizer")
    assert scales == ref_scales
    for got, want in zip(
        list(model.parameters()) + list(amp.master_params(optimizer)),
        list(ref_model.parameters()) + list(amp.master_params(ref_opt)),
    ):
        assert torch.equal(got, want)


@pytest.mark.half_device
def test_a_gradient_set_to_none_comes_back_zeroed_in_its_buffer() -> None:
    model = _model()
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", verbosity=0, combine_grad=True
    )
    x = torch.randn(8, 6)
    for _ in range(2):
        optimizer.zero_grad()
        with amp.scale_loss(model(x).float().sum(), optimizer) as scaled:
            scaled.backward()
        optimizer.step()
    first, second = list(model.parameters())[:2]
    kept = second.grad
    first.grad = None  # one gradient dropped, the others kept
    optimizer.get_model_combined_grads()  # any use of the buffers takes it back ...
    assert first.grad is not None and not first.grad.any()  # ... zeroed
    assert second.grad is kept and second.grad.any()  # the others untouched
    assert optimizer._amp_stash.combined.generation == 1


# ------------------------------------------------------------------ the scaler's attributes
@pytest.mark.half_device
def test_scale_seq_len_is_the_scale_window() -> None:
    """GAN scripts: ``amp._amp_state.loss_scalers[0]._scale_seq_len = 50``."""
    amp.initialize(_model(), opt_level="O1", verbosity=0, dynamic_init_scale=8.0)
    scaler = _amp_state.loss_scalers[0]
    assert scaler._scale_seq_len == 2000
    scaler._scale_seq_len = 3
    for _ in range(3):
        scaler.update(found_inf=False)
    assert scaler.loss_scale() == 16.0  # grew after 3 clean steps, not 2000
    with pytest.raises(ValueError, match="_scale_seq_len must be an int >= 1"):
        scaler._scale_seq_len = 0


@pytest.mark.half_device
def test_has_overflow_is_the_last_verdict_and_update_scale_takes_it() -> None:
    model = _model()
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O1", verbosity=0, dynamic_init_scale=2.0**10
    )
    scaler = _amp_state.loss_scalers[0]
    x = torch.randn(8, 6)
    for inject in (False, True, False):
        optimizer.zero_grad()
        with amp.scale_loss(model(x).sum(), optimizer) as scaled:
            scaled.backward()
            if inject:
                next(model.parameters()).grad.view(-1)[0] = float("inf")
        assert scaler._has_overflow is inject
        optimizer.step()
    # apex's delay_overflow_check loop: the script sets the verdict, update_scale() applies it.
    scale = scaler.loss_scale()
    scaler._has_overflow = True
    assert scaler.update_scale() is True and scaler.loss_scale() == scale / 2
    scaler.clear_overflow_state()
    assert scaler._has_overflow is False
    assert scaler.update_scale() is False and scaler.loss_scale() == scale / 2
    static = amp.LossScaler(128.0)
    static._has_overflow = True
    assert static.update_scale() is False and static.loss_scale() == 128.0


# ------------------------------------------------------------------ clipping a NaN norm
@pytest.mark.parametrize("which", ["model", "optimizer"])
@pytest.mark.half_device
def test_fused_clipping_with_a_nan_norm_leaves_the_gradients_alone(which: str) -> None:
    model = _model()
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O1", verbosity=0, combine_grad=True, dynamic_init_scale=2.0**4
    )
    with amp.scale_loss(model(torch.randn(8, 6)).sum(), optimizer) as scaled:
        scaled.backward()
    assert all(p.grad.isfinite().all() and p.grad.any() for p in model.parameters())
    first = next(model.parameters())
    first.grad.view(-1)[0] = float("nan")
    before = [p.grad.clone() for p in model.parameters()]
    clip = getattr(optimizer, f"clip_{which}_grad_norm_fused")
    norm = clip(0.01)
    assert torch.isnan(norm)
    for got, want in zip([p.grad for p in model.parameters()], before):
        # Untouched: the one NaN where it was, every other value as it was (torch's
        # clip_grad_norm_ would have made them all NaN).
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    # An inf norm multiplies by 0 (max_norm / inf), as Ascend's: the other gradients vanish.
    first.grad.view(-1)[0] = float("inf")
    clip(0.01)
    assert all(not p.grad.any() for p in list(model.parameters())[1:])


# ------------------------------------------------------------------ apex's compiled modules
def test_change_data_ptr_and_apex_c_are_importable_top_level_modules() -> None:
    import apex_C  # noqa: PLC0415
    import change_data_ptr as module  # noqa: PLC0415
    from change_data_ptr import change_data_ptr  # noqa: PLC0415

    from amp import combine_tensors  # noqa: PLC0415

    assert module.change_data_ptr is combine_tensors.change_data_ptr is change_data_ptr
    assert apex_C.flatten is combine_tensors.flatten
    assert apex_C.unflatten is combine_tensors.unflatten


def test_change_data_ptr_repoints_as_ascends_custom_optimizers_use_it() -> None:
    from change_data_ptr import change_data_ptr  # noqa: PLC0415

    # Ascend's combining loop: each tensor's memory moves to its offset in one buffer.
    tensors = [torch.zeros(2, 3), torch.zeros(4)]
    buffer = torch.arange(16, dtype=torch.float32)
    change_data_ptr(tensors[0], buffer, 0)
    change_data_ptr(tensors[1], buffer, 8)
    assert tensors[0].tolist() == [[0, 1, 2], [3, 4, 5]] and tensors[1].tolist() == [8, 9, 10, 11]
    buffer.mul_(2)  # one op on the buffer is one op on every tensor in it
    assert tensors[1].tolist() == [16, 18, 20, 22]
    tensors[0].zero_()
    assert buffer[:6].tolist() == [0] * 6 and buffer[6] == 12
    with pytest.raises(RuntimeError, match="needs elements \\[14, 18\\) of src's storage"):
        change_data_ptr(torch.zeros(4), buffer, 14)
    with pytest.raises(ValueError, match="must share dtype and device"):
        change_data_ptr(torch.zeros(2, dtype=torch.float16), buffer, 0)


def test_apex_c_flatten_and_unflatten() -> None:
    import apex_C  # noqa: PLC0415

    tensors = [torch.randn(2, 3), torch.randn(0), torch.randn(4).half().float()]
    flat = apex_C.flatten(tensors)
    assert flat.shape == (10,) and torch.equal(flat, torch.cat([t.reshape(-1) for t in tensors]))
    views = apex_C.unflatten(flat, tensors)
    assert [v.shape for v in views] == [t.shape for t in tensors]
    assert all(torch.equal(v, t) for v, t in zip(views, tensors))
    flat.zero_()
    assert not views[0].any()  # views of flat, not copies
    single = torch.randn(3)
    assert apex_C.flatten([single]).data_ptr() == single.data_ptr()  # as apex_C: a view
    with pytest.raises(ValueError, match="1-D with 10 elements"):
        apex_C.unflatten(torch.zeros(9), tensors)


# ------------------------------------------------------------------ apex.normalization
def test_fused_layer_norm_and_rms_norm_run_anywhere() -> None:
    from apex.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedRMSNorm  # noqa: PLC0415

    import amp.normalization  # noqa: PLC0415

    assert FusedLayerNorm is amp.normalization.FusedLayerNorm
    x = torch.randn(4, 3, 8)
    ln = FusedLayerNorm(8)
    torch.nn.init.normal_(ln.weight)
    ref = torch.nn.LayerNorm(8)
    ref.load_state_dict(ln.state_dict())
    assert torch.equal(ln(x), ref(x))
    rms = FusedRMSNorm([3, 8], eps=1e-6)
    torch.nn.init.normal_(rms.weight)
    want = x / torch.sqrt(x.pow(2).mean(dim=(-2, -1), keepdim=True) + 1e-6) * rms.weight
    torch.testing.assert_close(rms(x), want)
    assert rms(x.half()).dtype == torch.float16  # apex's: the input's dtype
    mixed = MixedFusedRMSNorm(8)
    assert mixed(x.half()).dtype == torch.float32  # Megatron's mixed form: the weight's
    assert sorted(dict(rms.named_parameters())) == ["weight"]
    assert FusedRMSNorm(8, elementwise_affine=False).weight is None


def test_o2_trains_a_model_with_fused_norms() -> None:
    from apex.normalization import FusedLayerNorm, FusedRMSNorm  # noqa: PLC0415

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8),
        FusedLayerNorm(8),
        torch.nn.Linear(8, 8),
        FusedRMSNorm(8),
        torch.nn.Linear(8, 1),
    )
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O2", verbosity=0, half_dtype=torch.bfloat16
    )
    before = [p.detach().clone() for p in amp.master_params(optimizer)]
    with amp.scale_loss(model(torch.randn(4, 8)).sum(), optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, amp.master_params(optimizer)))


# ------------------------------------------------------------------ torch_npu's batch norms
class FastBatchNorm2d(torch.nn.Module):
    """A stand-in for torch_npu.contrib.module.FastBatchNorm2d (not a torch _BatchNorm):
    only its class name tells amp what it is."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.affine = True
        self.weight = torch.nn.Parameter(torch.ones(num_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1).to(x.dtype)


class MyFastBatchNorm(FastBatchNorm2d):
    pass


@pytest.mark.half_device
def test_o2_keeps_torch_npus_fast_batch_norms_in_float32() -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 1), FastBatchNorm2d(4), MyFastBatchNorm(4), torch.nn.BatchNorm2d(4)
    )
    amp.initialize(model, opt_level="O2", verbosity=0)
    assert model[0].weight.dtype == torch.float16
    for bn in model[1:]:
        assert bn.weight.dtype == torch.float32 and bn.running_mean.dtype == torch.float32
    plain = torch.nn.Sequential(FastBatchNorm2d(4))
    _amp_state.opt_properties = None
    amp.initialize(plain, opt_level="O2", keep_batchnorm_fp32=False, verbosity=0)
    assert plain[0].weight.dtype == torch.float16
