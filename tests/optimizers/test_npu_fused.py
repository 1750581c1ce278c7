"""Apex for Ascend's NpuFused optimizers and Lamb, on the CPU: step for step equal to
torch.optim (bit for bit) or to Ascend's formulas, on amp's combined buffers; Ascend's
constructors and errors; state that survives state_dict and re-combination; Ascend's fuzz
inputs (tests/fuzz/*_samples/samples1.txt) as fixed cases."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
import torch
from npu_fused_lib import (
    ASCEND_CASES,
    SHAPES,
    TORCH_PAIRS,
    attach_combined,
    case_id,
    grad_series,
    hyper_of,
    leaves,
    ref_lamb,
    run_combined,
    run_plain,
    run_reference,
    set_grads,
)

import amp.optimizers as O
from amp.combine_tensors import is_combined_tensor_valid

NPU_FUSED = [
    O.NpuFusedSGD,
    O.NpuFusedAdam,
    O.NpuFusedAdamW,
    O.NpuFusedAdamP,
    O.NpuFusedBertAdam,
    O.NpuFusedAdadelta,
    O.NpuFusedLamb,
    O.NpuFusedRMSprop,
    O.NpuFusedRMSpropTF,
]


def _kw(cls: type) -> dict[str, Any]:
    return {"lr": 0.1} if cls in (O.NpuFusedSGD, O.NpuFusedBertAdam) else {}


@pytest.mark.parametrize("case", TORCH_PAIRS, ids=case_id)
def test_bit_equal_to_torch_optim(case: tuple) -> None:
    ours, theirs, kw = case
    mine, ref = leaves(SHAPES), leaves(SHAPES)
    series = grad_series(SHAPES, steps=4)
    run_combined(ours(mine, **kw), mine, series)
    run_plain(theirs(ref, foreach=False, **kw), ref, series)
    for a, b in zip(mine, ref):
        assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize("case", ASCEND_CASES, ids=case_id)
def test_equal_to_ascend_formulas(case: tuple) -> None:
    ours, formula, kw, clip = case
    mine, ref = leaves(SHAPES), leaves(SHAPES)
    series = grad_series(SHAPES, steps=4)
    opt = ours(mine, **kw)
    run_combined(opt, mine, series)
    run_reference(formula, ref, series, hyper_of(opt, kw), clip_global=clip)
    for a, b in zip(mine, ref):
        # Elementwise updates are bit-equal; norms (Lamb's trust ratio, the global norm)
        # are summed in another order than Ascend's pow(2).sum(): a few float32 ulps.
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)


def test_lamb_plain_state_and_formula() -> None:
    mine, ref = leaves(SHAPES), leaves(SHAPES)
    series = grad_series(SHAPES, steps=3)
    opt = O.Lamb(mine, lr=0.01, weight_decay=0.01)
    run_plain(opt, mine, series)
    states = run_reference(ref_lamb, ref, series, hyper_of(opt, {}))
    for p, q, expected in zip(mine, ref, states):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
        state = opt.state[p]
        assert state["step"] == 3
        for key in ("weight_norm", "adam_norm", "trust_ratio"):
            torch.testing.assert_close(
                state[key].float(), torch.tensor(float(expected[key])), rtol=2e-6, atol=0
            )


def test_lamb_needs_no_amp_and_skips_params_without_grad() -> None:
    a, b = leaves([(4, 4), (3,)])
    before = b.detach().clone()
    a.grad = torch.ones(4, 4)
    opt = O.Lamb([a, b], adam=True)
    opt.step()
    assert torch.equal(b, before) and b not in opt.state
    assert opt.state[a]["trust_ratio"] > 0


def test_states_live_in_the_combined_buffers_and_round_trip() -> None:
    """state_dict/load_state_dict: a resumed run continues exactly; the loaded states are
    combined again (laid out like the parameters)."""
    series = grad_series(SHAPES, steps=5)
    straight = leaves(SHAPES)
    run_combined(O.NpuFusedAdam(straight, lr=0.01, amsgrad=True), straight, series)

    first = leaves(SHAPES)
    opt = O.NpuFusedAdam(first, lr=0.01, amsgrad=True)
    run_combined(opt, first, series[:3])
    saved = opt.state_dict()
    bufs = opt._combined_states[0][0][1]
    for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert is_combined_tensor_valid(bufs[name], [opt.state[p][name] for p in first])
    assert {opt.state[p]["step"] for p in first} == {3}

    resumed = [p.detach().clone().requires_grad_() for p in first]
    opt2 = O.NpuFusedAdam(resumed, lr=0.01, amsgrad=True)
    opt2.load_state_dict(saved)
    run_combined(opt2, resumed, series[3:])
    for a, b in zip(resumed, straight):
        assert torch.equal(a, b)


def test_recombined_when_amp_combines_again() -> None:
    params = leaves(SHAPES)
    series = grad_series(SHAPES, steps=4)
    opt = O.NpuFusedSGD(params, lr=0.1, momentum=0.9)
    run_combined(opt, params, series[:2])
    old = opt._combined_states[0][0][1]["momentum_buffer"]
    for p in params:  # as amp does after a gradient left its buffer: new buffers
        p.grad = p.grad.clone()
    attach_combined(opt)
    opt._amp_stash.combined.generation = 7
    for grads in series[2:]:
        set_grads(params, grads)
        opt.step()
    new = opt._combined_states[0][0][1]["momentum_buffer"]
    assert new.data_ptr() != old.data_ptr()
    ref = leaves(SHAPES)
    run_plain(torch.optim.SGD(ref, lr=0.1, momentum=0.9, foreach=False), ref, series)
    assert all(torch.equal(a, b) for a, b in zip(params, ref))


def test_param_groups_and_mixed_step_counts() -> None:
    """Two groups with their own options; a parameter that joins later (its own step count,
    its own fresh momentum) is a run of its own, and the result is still torch's."""
    late_shape = (5, 2)
    ours, ref = leaves(SHAPES), leaves(SHAPES)
    ours_late, ref_late = leaves([late_shape], seed=3)[0], leaves([late_shape], seed=3)[0]
    mk = [dict(params=ours[:3], lr=0.05), dict(params=ours[3:] + [ours_late])]
    rk = [dict(params=ref[:3], lr=0.05), dict(params=ref[3:] + [ref_late])]
    opt = O.NpuFusedAdam(mk, lr=0.01)
    tref = torch.optim.Adam(rk, lr=0.01, foreach=False)
    series = grad_series(SHAPES, steps=4)
    late = grad_series([late_shape], steps=4, seed=5)
    run_combined(opt, ours, series[:2])
    run_plain(tref, ref, series[:2])
    set_grads([ours_late], late[2])  # joins: amp combines again with it
    for p in ours:
        p.grad = p.grad.clone()
    attach_combined(opt)
    opt._amp_stash.combined.generation = 2
    for i in (2, 3):
        set_grads(ours + [ours_late], series[i] + late[i])
        set_grads(ref + [ref_late], series[i] + late[i])
        opt.step()
        tref.step()
    assert opt.state[ours_late]["step"] == 2 and opt.state[ours[0]]["step"] == 4
    for a, b in zip(ours + [ours_late], ref + [ref_late]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls", NPU_FUSED, ids=lambda c: c.__name__)
def test_outside_amp_raises_ascends_error(cls: type) -> None:
    p = leaves([(2, 2)])[0]
    p.grad = torch.ones(2, 2)
    opt = cls([p], **_kw(cls))
    assert opt.is_npu_fused_optimizer is True and cls.is_npu_fused_optimizer is True
    with pytest.raises(
        RuntimeError, match=f"apex.optimizers.{cls.__name__} should be used with AMP"
    ):
        opt.step()


DEFAULTS = {
    O.NpuFusedSGD: dict(momentum=0, dampening=0, weight_decay=0, nesterov=False),
    O.NpuFusedAdam: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False),
    O.NpuFusedAdamW: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False),
    O.NpuFusedAdamP: dict(
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0,
        delta=0.1,
        wd_ratio=0.1,
        nesterov=False,
    ),
    O.NpuFusedBertAdam: dict(
        warmup=-1,
        t_total=-1,
        schedule="warmup_linear",
        b1=0.9,
        b2=0.99,
        e=1e-6,
        weight_decay=0.01,
        max_grad_norm=-1,
    ),
    O.NpuFusedAdadelta: dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0),
    O.NpuFusedLamb: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0),
    O.NpuFusedRMSprop: dict(
        lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False
    ),
    O.NpuFusedRMSpropTF: dict(
        lr=1e-2,
        alpha=0.9,
        eps=1e-10,
        weight_decay=0,
        momentum=0.0,
        centered=False,
        decoupled_decay=False,
        lr_in_momentum=True,
    ),
    O.Lamb: dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0),
}


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda c: c.__name__)
def test_ascends_defaults(cls: type) -> None:
    opt = cls(leaves([(2,)]), **_kw(cls))
    for key, value in DEFAULTS[cls].items():
        assert opt.defaults[key] == value, key


@pytest.mark.parametrize(
    "cls, kw, message",
    [
        (O.NpuFusedSGD, dict(lr=-1), "Invalid learning rate: -1"),
        (O.NpuFusedSGD, dict(lr=0.1, momentum=-1), "Invalid momentum value: -1"),
        (O.NpuFusedSGD, dict(lr=0.1, weight_decay=-1), "Invalid weight_decay value: -1"),
        (
            O.NpuFusedSGD,
            dict(lr=0.1, nesterov=True),
            "Nesterov momentum requires a momentum and zero dampening",
        ),
        (O.NpuFusedAdam, dict(eps=-1), "Invalid epsilon value: -1"),
        (O.NpuFusedAdam, dict(betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
        (O.NpuFusedAdamW, dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
        (O.NpuFusedAdadelta, dict(rho=1.5), "Invalid rho value: 1.5"),
        (O.NpuFusedRMSprop, dict(alpha=-0.5), "Invalid alpha value: -0.5"),
        (O.NpuFusedRMSpropTF, dict(momentum=-0.5), "Invalid momentum value: -0.5"),
        (O.NpuFusedBertAdam, dict(lr=0.1, schedule="cosine"), "Invalid schedule parameter: cosine"),
        (
            O.NpuFusedBertAdam,
            dict(lr=0.1, warmup=1.0),
            r"Invalid warmup: 1.0 - should be in \[0.0, 1.0\[ or -1",
        ),
        (O.NpuFusedBertAdam, dict(lr=0.1, e=-1), "Invalid epsilon value: -1 - should be >= 0.0"),
        (O.NpuFusedLamb, dict(lr=-0.1), "Invalid learning rate: -0.1"),
        (O.Lamb, dict(betas=(0.9, 1.0)), "Invalid beta parameter at index 1: 1.0"),
    ],
)
def test_ascends_constructor_errors(cls: type, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(leaves([(2,)]), **kw)


def test_sgd_and_bert_adam_require_lr() -> None:
    for cls in (O.NpuFusedSGD, O.NpuFusedBertAdam):
        with pytest.raises(ValueError, match="lr"):
            cls(leaves([(2,)]))


# Ascend's fuzz harnesses draw every hyper-parameter as random() * sample[i] and build
# `count` parameters of random shapes (up to 5 dims of up to `size`, zero-sized ones
# included), float32 or float16, all but the last with a gradient; samples1.txt fixes the
# inputs. Here the draw is seeded and every optimizer also takes two steps on the combined
# buffers: finite results, the gradient-less parameter untouched.
FUZZ_SAMPLES: dict[type, tuple[str, ...]] = {
    O.NpuFusedAdam: ("5,1,1,1,1,0,5", "lr betas0 betas1 eps wd"),
    O.NpuFusedAdamW: ("5,1,1,1,1,0,5", "lr betas0 betas1 eps wd"),
    O.NpuFusedAdamP: ("5,1,1,1,1,0,5", "lr betas0 betas1 eps wd"),
    O.NpuFusedLamb: ("5,1,1,1,1,0,5", "lr betas0 betas1 eps wd"),
    O.Lamb: ("5,1,1,1,1,0,5", "lr betas0 betas1 eps wd"),
    O.NpuFusedSGD: ("5,1,1,0,0,5", "lr momentum dampening wd"),
    O.NpuFusedAdadelta: ("5,1,1,1,0,5", "lr rho eps wd"),
    O.NpuFusedRMSprop: ("5,1,1,1,0,1,5", "lr alpha eps wd momentum"),
    O.NpuFusedRMSpropTF: ("5,1,1,1,0,1,5", "lr alpha eps wd momentum"),
    O.NpuFusedBertAdam: ("5,1,0.5,10,1,1,1e-6,0.01,1,5", "lr warmup t_total b1 b2 e wd mgn"),
}


def _fuzz_case(
    cls: type, sample: str, names: str, rng: random.Random
) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    values = [float(v) for v in sample.split(",")]
    size, count, hyper = int(values[0]), int(values[-1]), values[1:-1]
    drawn = {n: rng.random() * v for n, v in zip(names.split(), hyper)}
    kw: dict[str, Any] = {"lr": drawn["lr"]}
    if "betas0" in drawn:
        kw.update(
            betas=(drawn["betas0"], drawn["betas1"]),
            eps=drawn["eps"] + 1e-8,
            weight_decay=drawn["wd"],
        )
    elif cls is O.NpuFusedBertAdam:
        kw.update(
            warmup=drawn["warmup"],
            t_total=drawn["t_total"],
            b1=drawn["b1"],
            b2=drawn["b2"],
            e=values[6],
            weight_decay=values[7],
            max_grad_norm=values[8],
            schedule=rng.choice(sorted(O.npu_fused_adam.SCHEDULES)),
        )
    else:
        kw.update({k: drawn[k] for k in drawn if k != "wd" and k != "lr"})
        kw["weight_decay"] = drawn["wd"]
        if "eps" in kw:
            kw["eps"] += 1e-8
    params = []
    for _ in range(count):
        shape = [rng.randint(0, size) for _ in range(rng.randint(0, 5))]
        dtype = torch.float32 if rng.random() < 0.5 else torch.float16
        params.append(torch.randn(shape).to(dtype).requires_grad_())
    for p in params[:-1]:
        p.grad = p.detach().clone() / 100
    return cls(params, **kw), params


@pytest.mark.parametrize("cls", list(FUZZ_SAMPLES), ids=lambda c: c.__name__)
def test_ascend_fuzz_samples(cls: type) -> None:
    rng = random.Random(1234)
    torch.manual_seed(1234)
    opt, params = _fuzz_case(cls, *FUZZ_SAMPLES[cls], rng)
    last = params[-1].detach().clone()
    with_grads = [p for p in params if p.grad is not None]
    before = [p.detach().clone() for p in with_grads]
    if cls is not O.Lamb:
        attach_combined(opt)
    for _ in range(2):
        opt.step()
    assert torch.equal(params[-1], last)
    for p, b in zip(with_grads, before):
        assert torch.isfinite(p).all(), (cls.__name__, p.shape, p.dtype)
        assert p.dtype == b.dtype and p.shape == b.shape
    moved = [not torch.equal(p, b) for p, b in zip(with_grads, before) if p.numel() > 0]
    lr_factors = [1.0]
    if cls is O.NpuFusedBertAdam:  # its schedule may be 0 at both steps (t_total < 1)
        d = opt.defaults
        lr_factors = [
            O.npu_fused_adam.SCHEDULES[d["schedule"]](k / d["t_total"], d["warmup"]) for k in (0, 1)
        ]
    assert any(moved) == (bool(moved) and any(f != 0 for f in lr_factors))


def test_loading_an_earlier_state_into_the_same_optimizer() -> None:
    """load_state_dict replaces the state tensors: the next step combines the loaded ones
    (stepping the old buffers would continue from the later state)."""
    series = grad_series(SHAPES, steps=5)
    params = leaves(SHAPES)
    opt = O.NpuFusedRMSprop(params, lr=0.01, momentum=0.9)
    run_combined(opt, params, series[:3])
    saved = copy.deepcopy(opt.state_dict())  # state_dict() holds references, as torch's
    at3 = [p.detach().clone() for p in params]
    for grads in series[3:]:
        set_grads(params, grads)
        opt.step()
    with torch.no_grad():
        for p, v in zip(params, at3):
            p.copy_(v)
    opt.load_state_dict(saved)
    for grads in series[3:]:
        set_grads(params, grads)
        opt.step()
    ref = leaves(SHAPES)
    run_plain(torch.optim.RMSprop(ref, lr=0.01, momentum=0.9, foreach=False), ref, series)
    assert all(torch.equal(a, b) for a, b in zip(params, ref))
