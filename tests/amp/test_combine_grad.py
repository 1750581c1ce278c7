"""amp.initialize(..., combine_grad=True) (Apex for Ascend): gradients in one buffer per dtype,
the same training as without combining, a constant number of operations per step, Ascend's
getters, fused clipping, checks, rules and messages."""

from __future__ import annotations

import logging
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import amp
from amp.ascend.combined import optimizer_segments


def _model(n_linear: int = 4, bn: bool = True, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(n_linear):
        layers += [torch.nn.Linear(6, 6), torch.nn.ReLU()]
    if bn:
        layers.append(torch.nn.BatchNorm1d(6))
    return torch.nn.Sequential(*layers, torch.nn.Linear(6, 1))


def _train(
    level: str,
    opt_factory: Any,
    combine: Optional[bool],
    steps: int = 5,
    inject: tuple[int, ...] = (),
    losses: int = 1,
    accumulate: int = 1,
    zero: str = "optimizer",
    **init: Any,
) -> tuple[torch.nn.Module, Any, list[float]]:
    model = _model()
    optimizer = opt_factory(model.parameters())
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=level,
        verbosity=0,
        combine_grad=combine,
        num_losses=losses,
        dynamic_init_scale=2.0**10,
        **init,
    )
    g = torch.Generator().manual_seed(1)
    scales = []
    for step in range(steps):
        (optimizer if zero == "optimizer" else model).zero_grad()
        for micro in range(accumulate):
            x = torch.randn(8, 6, generator=g)
            out = model(x).float()
            for loss_id in range(losses):
                loss = F.mse_loss(out, x[:, :1] * (loss_id + 1))
                last = micro == accumulate - 1
                with amp.scale_loss(
                    loss, optimizer, loss_id=loss_id, delay_unscale=not last
                ) as scaled:
                    scaled.backward(retain_graph=loss_id < losses - 1)
                    if step in inject and last:
                        next(iter(model.parameters())).grad.view(-1)[0] = float("inf")
        scales.append(amp._amp_state.loss_scalers[0].loss_scale())
        optimizer.step()
    return model, optimizer, scales


SGD = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3)  # noqa: E731
ADAM = lambda ps: torch.optim.Adam(ps, lr=1e-3)  # noqa: E731
FUSED_ADAM = lambda ps: amp.optimizers.FusedAdam(ps, lr=1e-3)  # noqa: E731


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q), name


@pytest.mark.parametrize("opt", [SGD, ADAM, FUSED_ADAM], ids=["SGD", "Adam", "FusedAdam"])
@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.half_device
def test_combined_training_is_bit_equal_to_per_parameter(level: str, opt: Any) -> None:
    """An overflow step included: it is skipped and the scale backs off the same way."""
    ref, _, ref_scales = _train(level, opt, None, inject=(2,))
    got, optimizer, scales = _train(level, opt, True, inject=(2,))
    _same(ref, got)
    assert scales == ref_scales and scales[2] == scales[1] / 2
    grads = optimizer.get_model_combined_grads()
    # The model's gradients live in the combined buffer(s).
    flats = [g for g in grads if g is not None]
    for p in got.parameters():
        assert any(
            f.data_ptr() <= p.grad.data_ptr() < f.data_ptr() + f.numel() * f.element_size()
            for f in flats
        )
    expected_len = 2 if level == "O2" else 1  # Ascend: [half, fp32 own] with master weights
    assert len(grads) == expected_len


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.half_device
def test_two_losses_and_accumulation_match(level: str) -> None:
    ref, _, _ = _train(level, SGD, None, losses=2, accumulate=2)
    got, _, _ = _train(level, SGD, True, losses=2, accumulate=2)
    _same(ref, got)


@pytest.mark.half_device
def test_model_zero_grad_zeroes_in_place() -> None:
    model, optimizer, _ = _train("O1", SGD, True, steps=2, zero="model")
    before = [p.grad for p in model.parameters()]
    model.zero_grad()  # torch's default would set them to None
    optimizer.zero_grad(set_to_none=True)  # so would torch.optim's
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), before))
    ref, _, _ = _train("O1", SGD, None, steps=2, zero="model")
    _same(ref, model)


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _ops_of_unscale_and_zero(n_linear: int, level: str, combine: Optional[bool]) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(n_linear)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=level, verbosity=0, combine_grad=combine
    )
    x = torch.randn(2, 3)
    for _ in range(2):  # the first backward pass combines
        optimizer.zero_grad()
        loss = model(x).float().sum()
        count = _Count()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
            count.__enter__()  # the exit of scale_loss: unscale + overflow check
        optimizer.zero_grad()
        count.__exit__(None, None, None)
        optimizer.step()
    return count.ops


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.half_device
def test_operations_per_step_do_not_grow_with_the_parameters(level: str) -> None:
    small = _ops_of_unscale_and_zero(5, level, True)
    large = _ops_of_unscale_and_zero(500, level, True)
    assert small == large and len(large) <= 12, large
    assert "aten._amp_foreach_non_finite_check_and_unscale_.default" in large
    if level == "O2":
        # Without combining, O2 writes each master gradient by itself (O1's per-parameter
        # path is one foreach call already, and zero_grad sets the gradients to None).
        assert len(_ops_of_unscale_and_zero(500, level, None)) >= 1000


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")], ids=str)
@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.half_device
def test_fused_clipping_equals_clip_grad_norm(level: str, norm_type: float) -> None:
    got, optimizer, _ = _train(level, SGD, True, steps=1)
    ref, ref_opt, _ = _train(level, SGD, None, steps=1)
    with amp.scale_loss(got(torch.ones(8, 6)).float().sum(), optimizer) as s:
        s.backward()
    with amp.scale_loss(ref(torch.ones(8, 6)).float().sum(), ref_opt) as s:
        s.backward()
    total = optimizer.clip_optimizer_grad_norm_fused(0.01, norm_type)
    want = torch.nn.utils.clip_grad_norm_(list(amp.master_params(ref_opt)), 0.01, norm_type)
    torch.testing.assert_close(total, want)
    for p, q in zip(amp.master_params(optimizer), amp.master_params(ref_opt)):
        torch.testing.assert_close(p.grad, q.grad)
    if level == "O1":
        assert float(optimizer.clip_model_grad_norm_fused(1e9, norm_type)) > 0
    else:
        with pytest.raises(RuntimeError, match="only be used when opt_level='O1'"):
            optimizer.clip_model_grad_norm_fused(1.0)


@pytest.mark.half_device
def test_getters_before_backward_and_without_combining(caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", combine_grad=True)
    with caplog.at_level(logging.INFO, logger="amp"):
        assert optimizer.get_model_combined_grads() == []
        assert optimizer.get_optimizer_combined_params() == []
    assert "Please get the combined grads after backward phase." in caplog.text
    assert "To get combined params, please use npu fused optimizer." in caplog.text
    amp._amp_state.opt_properties = None
    plain_model = _model()
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.1)
    plain_model, plain = amp.initialize(plain_model, plain, opt_level="O1", combine_grad=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="amp"):
        assert plain.get_optimizer_combined_grads() == []
    assert "please set combine_grad=True or use npu fused optimizer" in caplog.text


@pytest.mark.half_device
def test_masks_cover_exactly_the_gradients() -> None:
    _, optimizer, _ = _train("O2", SGD, True, steps=1)
    grads = optimizer.get_optimizer_combined_grads()
    masks = optimizer.get_optimizer_combined_grad_masks()
    assert len(masks) == len(grads) == 2
    n = sum(p.numel() for p in amp.master_params(optimizer))
    assert sum(int(m.sum()) for m in masks) == n
    for g, m in zip(grads, masks):
        assert torch.equal(g * m, g)  # the padding is zero


@pytest.mark.half_device
def test_a_gradient_that_left_its_buffer_is_combined_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level="O1",
        verbosity=1,
        combine_grad=True,
        check_combined_tensors=True,
    )
    x = torch.randn(8, 6)
    for step in range(4):
        optimizer.zero_grad()
        with amp.scale_loss(model(x).sum(), optimizer) as scaled:
            scaled.backward()
        if step == 1:
            first = next(iter(model.parameters()))
            with caplog.at_level(logging.INFO, logger="amp"):
                first.grad = first.grad.clone()  # out of the buffer
                assert optimizer.get_model_combined_grads() == []
        optimizer.step()
    assert "Combined grad has been destroyed and will be recombined afterwards" in caplog.text
    flat = optimizer.get_model_combined_grads()[0]
    assert all(
        flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.numel() * 4
        for p in model.parameters()
    )
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    amp._amp_state.opt_properties = None
    ref, ref_opt = amp.initialize(ref, ref_opt, opt_level="O1", verbosity=0)
    for _ in range(4):
        ref_opt.zero_grad()
        with amp.scale_loss(ref(x).sum(), ref_opt) as scaled:
            scaled.backward()
        ref_opt.step()
    _same(ref, model)


class _ToyNpuFusedSGD(torch.optim.Optimizer):
    """The seam an NpuFused optimizer uses: plain SGD over amp's combined segments."""

    is_npu_fused_optimizer = True

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group, segments in zip(self.param_groups, optimizer_segments(self)):
            for seg in segments:
                seg.param.add_(seg.grad, alpha=-group["lr"])


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.half_device
def test_segments_step_like_torch(level: str) -> None:
    def groups(cls: Any) -> Any:
        def make(params: Any) -> Any:
            params = list(params)
            return cls([{"params": params[:3]}, {"params": params[3:], "lr": 0.02}], lr=0.05)

        return make

    ref, _, _ = _train(level, groups(torch.optim.SGD), None)
    got, optimizer, _ = _train(level, groups(_ToyNpuFusedSGD), None)
    _same(ref, got)
    segments = optimizer_segments(optimizer)
    assert [len(s) for s in segments] == ([1, 1] if level == "O1" else [1, 2])
    # O2: the half model sits in one buffer too (the masters' copy into it is one op).
    params = optimizer.get_model_combined_params()
    assert len(params) == (2 if level == "O2" else 1) and params[0] is not None
    with pytest.raises(RuntimeError, match="should be used with AMP"):
        _ToyNpuFusedSGD(torch.nn.Linear(2, 2).parameters(), lr=0.1).step()


def test_ascend_rules_and_messages() -> None:
    def init(opt: Any = None, **kw: Any) -> None:
        amp._amp_state.opt_properties = None
        model = torch.nn.Linear(2, 2)
        amp.initialize(
            model, (opt or torch.optim.SGD)(model.parameters(), lr=0.1), verbosity=0, **kw
        )

    with pytest.raises(RuntimeError, match="master_weights should be True when combine_grad"):
        init(opt_level="O2", combine_grad=True, master_weights=False)
    with pytest.raises(RuntimeError, match="should only be set by selecting opt_level='O1'"):
        init(opt_level="O3", combine_grad=True)
    with pytest.raises(RuntimeError, match="npu fused optimizer can only be used when"):
        init(lambda ps, lr: _ToyNpuFusedSGD(ps, lr), opt_level="O0")
    with pytest.raises(RuntimeError, match="master_weights should be True when npu fused"):
        init(lambda ps, lr: _ToyNpuFusedSGD(ps, lr), opt_level="O2", master_weights=False)
    with pytest.raises(TypeError, match="combine_grad must be True, False or None"):
        init(opt_level="O1", combine_grad="yes")
    with pytest.raises(ValueError, match="ddp_replica_count must be an int >= 1"):
        init(opt_level="O1", ddp_replica_count=0)
    with pytest.raises(RuntimeError, match=r"call torch\.distributed\.init_process_group"):
        init(opt_level="O1", combine_grad=True, combine_ddp=True)


@pytest.mark.half_device
def test_per_optimizer_switch_after_initialize() -> None:
    """Ascend's scripts turn combining off for one optimizer: `optimizer.accelerate = False`."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O1", verbosity=0, combine_grad=True
    )
    optimizer.accelerate = False
    x = torch.randn(8, 6)
    optimizer.zero_grad()
    with amp.scale_loss(model(x).sum(), optimizer) as scaled:
        scaled.backward()
    assert optimizer._amp_stash.combined.valid is False
    assert optimizer.get_model_combined_grads() == []


@pytest.mark.half_device
def test_delay_overflow_check_unscales_but_neither_skips_nor_rescales() -> None:
    """apex's keyword: the scale stays and the step runs, inf and all."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level="O1", verbosity=0, combine_grad=True, dynamic_init_scale=8.0
    )
    for delayed in (False, True):
        optimizer.zero_grad()
        with amp.scale_loss(
            model(torch.ones(2, 3)).sum(), optimizer, delay_overflow_check=delayed
        ) as scaled:
            scaled.backward()
        assert torch.equal(model.bias.grad, torch.tensor([2.0]))  # unscaled either way
        scale = amp._amp_state.loss_scalers[0].loss_scale()
        with amp.scale_loss(
            model(torch.ones(2, 3)).sum(), optimizer, delay_overflow_check=delayed
        ) as scaled:
            scaled.backward()
            model.bias.grad.fill_(float("inf"))
        before = model.weight.detach().clone()
        optimizer.step()
        after = amp._amp_state.loss_scalers[0].loss_scale()
        assert after == (scale if delayed else scale / 2)
        assert torch.equal(model.weight, before) != delayed  # delayed: the step ran
    with pytest.raises(TypeError, match="delay_overflow_check must be True or False"):
        with amp.scale_loss(model(torch.ones(2, 3)).sum(), optimizer, delay_overflow_check=1):
            pass
