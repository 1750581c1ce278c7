"""What Apex for Ascend's users' scripts do that amp did not yet meet: ``combine_ddp`` without
``combine_grad``; ``DistributedDataParallel`` built around an initialized model, whose
``zero_grad`` sets the combined gradients to None; the loss scaler's attributes GAN scripts
set (``_scale_seq_len``, ``_has_overflow``, ``update_scale()``)."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import amp
import amp.optimizers
from amp._amp_state import _amp_state


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6),
                               torch.nn.ReLU(), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 1))


# ------------------------------------------------------------------ combine_ddp
@pytest.mark.parametrize("combine_grad", [None, False])
def test_combine_ddp_without_combine_grad_raises(combine_grad: Any) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="Combine_grad should be True when combine_ddp"):
        amp.initialize(model, optimizer, opt_level="O1", verbosity=0, combine_ddp=True,
                       combine_grad=combine_grad)
    assert not hasattr(optimizer, "_amp_stash")  # refused before anything was touched
    assert next(model.parameters()).dtype == torch.float32


# ------------------------------------------------------------------ DDP around amp
@pytest.fixture
def one_rank_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sgd(ps: Any) -> Any:
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9)


def _npu_fused_sgd(ps: Any) -> Any:
    return amp.optimizers.NpuFusedSGD(ps, lr=0.05, momentum=0.9)


def _train_ddp(level: str, make: Callable[[Any], Any], zero: str, steps: int = 5
               ) -> tuple[torch.nn.Module, Any, list[float]]:
    """amp.initialize, then DistributedDataParallel (ModelZoo's order); each step zeroes the
    gradients through ``zero`` ("ddp": torch's Module.zero_grad, set_to_none=True)."""
    _amp_state.opt_properties = None
    model = _model()
    optimizer = make(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=1,
                                      combine_grad=True, check_combined_tensors=True,
                                      dynamic_init_scale=2.0**10)
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
@pytest.mark.parametrize("level,make", [("O1", _sgd), ("O2", _sgd), ("O2", _npu_fused_sgd)],
                         ids=["O1-SGD", "O2-SGD", "O2-NpuFusedSGD"])
def test_ddp_zero_grad_keeps_the_combined_buffers(
        one_rank_group: None, level: str, make: Callable[[Any], Any],
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="amp"):
        model, optimizer, scales = _train_ddp(level, make, zero="ddp")
    # Combined once, after the first backward pass; never destroyed (Ascend's message).
    assert optimizer._amp_stash.combined.generation == 1
    assert "Combined grad has been destroyed" not in caplog.text
    flats = [f for f in optimizer.get_model_combined_grads() if f is not None]
    for p in model.parameters():
        assert any(f.untyped_storage().data_ptr() == p.grad.untyped_storage().data_ptr()
                   for f in flats)
    # The same training as zeroing through the optimizer (amp's in-place, per buffer).
    ref_model, ref_opt, ref_scales = _train_ddp(level, make, zero="optimizer")
    assert scales == ref_scales
    for got, want in zip(list(model.parameters()) + list(amp.master_params(optimizer)),
                         list(ref_model.parameters()) + list(amp.master_params(ref_opt))):
        assert torch.equal(got, want)


def test_a_gradient_set_to_none_comes_back_zeroed_in_its_buffer() -> None:
    model = _model()
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0,
                                      combine_grad=True)
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


def test_has_overflow_is_the_last_verdict_and_update_scale_takes_it() -> None:
    model = _model()
    optimizer = _sgd(model.parameters())
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0,
                                      dynamic_init_scale=2.0**10)
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
