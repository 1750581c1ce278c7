"""O2's fp32 master gradients on the CPU are views of one buffer amp keeps from step to step
(amp/masters/grad_pool.py), never of memory a script still holds: values, ``master.grad`` after
the step, and what a kept gradient sees, are those of fresh tensors every step
(``AMP_MASTER_GRAD_POOL=0``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest
import torch
from amp_state import reset_amp  # tests/amp_state.py

import amp
from amp.masters import grad_pool
from amp.masters.grad_pool import MasterGradPool
from amp.masters.stash import separate_pairs
from amp.masters.unscale import unscale_one_pass
from amp.optimizers import FusedAdam

pytestmark = pytest.mark.skipif(
    not grad_pool.enabled(),
    reason=f"torch {torch.__version__} has no storage use count (torch._C._storage_Use_Count): "
    "amp keeps no master gradient buffer there, and the fresh tensors are what every other test "
    "of O2 checks",
)

INV = 1.0 / 64


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    # BatchNorm: its params are their own masters (keep_batchnorm_fp32), so O2's unscale pass
    # takes its general path; without it, the one-call path.
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )


Hook = Optional[Callable[[int, torch.optim.Optimizer], None]]


def _train(
    batchnorm: bool, steps: int, after_unscale: Hook = None, make: Any = FusedAdam
) -> tuple[list, list, Any]:
    reset_amp()
    model = _model() if batchnorm else torch.nn.Sequential(*list(_model())[::3])
    opt = make(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(
        model, opt, opt_level="O2", cast_model_type=torch.bfloat16, verbosity=0
    )
    gen = torch.Generator().manual_seed(1)
    ptrs = []
    for step in range(steps):
        x = torch.randn(32, 8, generator=gen).to(torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        ptrs.append([p.grad.data_ptr() for _, p in separate_pairs(opt)])
        if after_unscale is not None:
            after_unscale(step, opt)
        opt.step()
        opt.zero_grad()
        assert all(p.grad is None for p in amp.master_params(opt))  # as apex after a step
    return [p.detach().clone() for p in amp.master_params(opt)], ptrs, opt


@pytest.mark.parametrize(
    ("batchnorm", "make"),
    [(False, FusedAdam), (True, FusedAdam), (True, torch.optim.Adam)],
    ids=["one-call", "general-path", "torch.optim"],
)
def test_master_grads_live_in_one_kept_buffer_and_step_as_fresh_ones(
    batchnorm: bool, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(grad_pool.ENV, "0")
    fresh, _, off = _train(batchnorm, 4, make=make)
    assert off._amp_stash.grad_pool.builds == 0
    monkeypatch.delenv(grad_pool.ENV)
    pooled, ptrs, opt = _train(batchnorm, 4, make=make)
    assert opt._amp_stash.grad_pool.builds == 1
    assert all(torch.equal(a, b) for a, b in zip(fresh, pooled))
    assert ptrs[1] == ptrs[2] == ptrs[3]  # the same memory every step
    # one buffer: consecutive views, in the masters' order
    sizes = [p.numel() * 4 for _, p in separate_pairs(opt)]
    assert [b - a for a, b in zip(ptrs[3], ptrs[3][1:])] == sizes[:-1]


@pytest.mark.parametrize(
    "keep",
    [lambda g: g, lambda g: g.view(-1)],
    ids=["the gradient", "a view of it"],
)
def test_a_gradient_a_script_keeps_is_never_written_again(
    keep: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep_first(step: int, opt: torch.optim.Optimizer) -> None:
        if step == 1:
            g = next(p.grad for p in amp.master_params(opt) if p.dim() == 2)
            kept.append((keep(g), g.clone()))

    _, ptrs, opt = _train(False, 4, keep_first)
    (held, value) = kept[0]
    assert torch.equal(held.view_as(value), value)  # steps 2 and 3 wrote elsewhere
    assert ptrs[2][0] != ptrs[1][0]
    assert opt._amp_stash.grad_pool.builds == 2  # a new buffer, kept again from then on
    assert ptrs[2] == ptrs[3]


def test_gradients_kept_every_step_go_back_to_fresh_tensors() -> None:
    kept: list[torch.Tensor] = []

    def keep_all(step: int, opt: torch.optim.Optimizer) -> None:
        kept.extend(p.grad for p in amp.master_params(opt) if p.grad is not None)

    fresh_run = []

    def record(step: int, opt: torch.optim.Optimizer) -> None:
        fresh_run.extend(p.grad.clone() for p in amp.master_params(opt) if p.grad is not None)

    _train(False, 6, record)
    _, _, opt = _train(False, 6, keep_all)
    assert opt._amp_stash.grad_pool.builds == grad_pool.MAX_BUILDS  # then no more buffers
    assert all(torch.equal(a, b) for a, b in zip(kept, fresh_run))  # none overwritten


def test_a_master_of_another_shape_gets_a_gradient_of_its_shape() -> None:
    # The one-call path with the kept views, then a master (and its model param) reshaped
    # with the same element count: the kernel takes the views, the .grad assignment refuses
    # the old shape, and the general path writes a gradient of the new one.
    model = [torch.randn(4, 8).to(torch.bfloat16) for _ in range(2)]
    masters = [m.float() for m in model]
    pool = MasterGradPool()
    for m in model:
        m.grad = torch.randn(m.shape).to(torch.bfloat16)
    unscale_one_pass(list(zip(model, masters)), INV, pool)
    for p in masters:
        p.grad = None
    masters[1].data = masters[1].data.reshape(8, 4)
    model[1].data = model[1].data.reshape(8, 4)
    model[1].grad = torch.randn(8, 4).to(torch.bfloat16)
    out = unscale_one_pass(list(zip(model, masters)), INV, pool)
    assert masters[1].grad.shape == (8, 4)
    assert torch.equal(masters[1].grad, model[1].grad.float() * INV)
    assert not out.nonfinite
    assert pool.builds == 2


def test_masters_off_the_cpu_or_not_fp32_get_fresh_tensors() -> None:
    pool = MasterGradPool()
    doubles = [torch.zeros(3, dtype=torch.float64)]
    outs = pool.outputs(doubles)
    assert outs[0].dtype == torch.float64 and pool.builds == 0


def test_other_masters_of_the_same_count_get_gradients_of_their_shapes() -> None:
    # The general path (a param without a gradient): the kept views were made for masters 0
    # and 1, the next step's gradients are on 0 and 2, two masters of other shapes.
    model = [torch.randn(*s).to(torch.bfloat16) for s in ((4, 8), (16,), (2, 3))]
    masters = [m.float() for m in model]
    pool = MasterGradPool()
    for i in (0, 1):
        model[i].grad = torch.randn(model[i].shape).to(torch.bfloat16)
    unscale_one_pass(list(zip(model, masters)), INV, pool)
    for t in model + masters:
        t.grad = None
    for i in (0, 2):
        model[i].grad = torch.randn(model[i].shape).to(torch.bfloat16)
    unscale_one_pass(list(zip(model, masters)), INV, pool)
    assert masters[1].grad is None
    for i in (0, 2):
        assert torch.equal(masters[i].grad, model[i].grad.float() * INV)
