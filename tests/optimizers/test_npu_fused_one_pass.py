"""NpuFusedSGD / NpuFusedAdam's one-pass path (issue 37 part 3): amp's compiled kernel over
each combined buffer instead of torch's operations. SGD takes it by default where it is
bit-equal to torch.optim.SGD (kernel build and torch's CPU capability round alike), Adam only
with ``one_pass=True``, within the ulps its docstring documents. Every compiled kernel build is
checked (``compiled_backend``); which path ran is observed by counting the kernel calls."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from npu_fused_lib import SHAPES, grad_series, leaves, run_combined, run_plain

import amp.optimizers as O
from amp.kernels import ops as kernel_ops
from amp.optimizers import npu_fused_sgd

SGD_CASES: list[dict[str, Any]] = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
]
ADAM_CASES: list[tuple[type, type, dict[str, Any]]] = [
    (O.NpuFusedAdam, torch.optim.Adam, dict(lr=0.01)),
    (O.NpuFusedAdam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    (O.NpuFusedAdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
]


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Counts the calls of amp.kernels.ops.<name> (still calling it)."""
    calls = [0]
    real = getattr(kernel_ops, name)

    def spy(*args: Any, **kw: Any) -> None:
        calls[0] += 1
        real(*args, **kw)

    monkeypatch.setattr(kernel_ops, name, spy)
    return calls


def _ulps(diff: torch.Tensor, mag: torch.Tensor) -> float:
    """|diff| in units of the last place (float32) of `mag`."""
    mag = mag.detach().double().clamp_min(2.0**-126)
    return float((diff.detach().double().abs() / 2.0 ** (torch.floor(torch.log2(mag)) - 23)).max())


@pytest.mark.parametrize("kw", SGD_CASES, ids=str)
def test_sgd_one_pass_by_default_where_bit_equal(
    compiled_backend: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count(monkeypatch, "sgd")
    mine, ref = leaves(SHAPES), leaves(SHAPES)
    series = grad_series(SHAPES, steps=4)
    run_combined(O.NpuFusedSGD(mine, **kw), mine, series)
    run_plain(torch.optim.SGD(ref, foreach=False, **kw), ref, series)
    # whichever path the default took, the bits are torch's
    for a, b in zip(mine, ref):
        assert torch.equal(a, b), (compiled_backend, (a - b).abs().max())
    assert (calls[0] > 0) == npu_fused_sgd.sgd_kernel_bit_equal()


@pytest.mark.parametrize("kw", SGD_CASES, ids=str)
def test_sgd_forced_one_pass_is_bit_equal_on_pairing_builds(
    compiled_backend: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pairing table's claim, per build: where the kernel build rounds as torch's CPU
    capability does, the kernel's bits are torch's; elsewhere within a rounding per op."""
    calls = _count(monkeypatch, "sgd")
    mine, ref = leaves(SHAPES), leaves(SHAPES)
    series = grad_series(SHAPES, steps=4)
    run_combined(O.NpuFusedSGD(mine, one_pass=True, **kw), mine, series)
    run_plain(torch.optim.SGD(ref, foreach=False, **kw), ref, series)
    assert calls[0] == len(series)  # one call per step: one buffer
    for a, b in zip(mine, ref):
        if npu_fused_sgd.sgd_kernel_bit_equal():
            assert torch.equal(a, b), (compiled_backend, (a - b).abs().max())
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sgd_one_pass_false_never_calls_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count(monkeypatch, "sgd")
    mine = leaves(SHAPES)
    run_combined(
        O.NpuFusedSGD(mine, lr=0.1, momentum=0.9, one_pass=False),
        mine,
        grad_series(SHAPES, steps=3),
    )
    assert calls[0] == 0


def test_sgd_auto_is_off_where_the_rounding_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npu_fused_sgd._ext, "isa", lambda: "generic")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not npu_fused_sgd.sgd_kernel_bit_equal()
    monkeypatch.setattr(npu_fused_sgd._ext, "isa", lambda: None)  # the fallback runs
    assert not npu_fused_sgd.sgd_kernel_bit_equal()


@pytest.mark.parametrize("case", ADAM_CASES, ids=lambda c: f"{c[0].__name__}-{c[2]}")
def test_adam_one_pass_within_documented_ulps(
    compiled_backend: str, case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step by step from the same state (each step re-seeded from the kernel's result): the
    moments within a rounding and the parameter within the documented bound of max(|p|, |update|);
    the one-pass path is taken (one kernel call per step)."""
    ours, _, kw = case
    calls = _count(monkeypatch, "adam")
    shapes = [(64, 33), (1000,), (7,)]
    fast, exact = leaves(shapes), leaves(shapes)
    fast_opt, exact_opt = ours(fast, one_pass=True, **kw), ours(exact, **kw)
    bound = 4.0 if compiled_backend in ("avx2", "avx512") else 64.0
    for i, grads in enumerate(grad_series(shapes, steps=5)):
        before = [p.detach().clone() for p in fast]
        run_combined(fast_opt, fast, [grads]) if i == 0 else _step(fast_opt, fast, grads)
        calls_after_fast = calls[0]
        run_combined(exact_opt, exact, [grads]) if i == 0 else _step(exact_opt, exact, grads)
        assert calls[0] == calls_after_fast  # the default path never calls the kernel
        for a, b, p0 in zip(fast, exact, before):
            mag = torch.maximum(p0.abs(), (b - p0).abs())
            assert _ulps(a - b, mag) <= bound, (compiled_backend, i)
            sa, sb = fast_opt.state[a], exact_opt.state[b]
            for name in ("exp_avg", "exp_avg_sq"):
                # atol: one rounding of the L2-decayed gradient (|g| up to ~4: 4.8e-7), times
                # 1 - beta1 (the generic build rounds g + wd * p twice)
                torch.testing.assert_close(sa[name], sb[name], rtol=2.0**-22, atol=1e-7)
        # the next step starts from one state: copy the kernel's into the reference
        with torch.no_grad():
            for a, b in zip(fast, exact):
                b.copy_(a)
                for name in ("exp_avg", "exp_avg_sq"):
                    exact_opt.state[b][name].copy_(fast_opt.state[a][name])
    assert calls[0] == 5


def _step(
    opt: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[torch.Tensor]
) -> None:
    for p, g in zip(params, grads):
        p.grad.copy_(g)  # type: ignore[union-attr]
    opt.step()


def test_adam_one_pass_is_off_by_default_and_for_amsgrad(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count(monkeypatch, "adam")
    for kw in (dict(), dict(one_pass=True, amsgrad=True)):
        mine, ref = leaves(SHAPES), leaves(SHAPES)
        series = grad_series(SHAPES, steps=3)
        run_combined(O.NpuFusedAdam(mine, lr=0.01, **kw), mine, series)
        run_plain(
            torch.optim.Adam(ref, lr=0.01, foreach=False, amsgrad=bool(kw.get("amsgrad"))),
            ref,
            series,
        )
        assert all(torch.equal(a, b) for a, b in zip(mine, ref))
    assert calls[0] == 0


def test_one_pass_keeps_ascends_state_dict() -> None:
    for cls, kw in ((O.NpuFusedAdam, dict(one_pass=True)), (O.NpuFusedSGD, dict(lr=0.1))):
        params = leaves(SHAPES)
        opt = cls(params, **kw)
        run_combined(opt, params, grad_series(SHAPES, steps=2))
        groups = opt.state_dict()["param_groups"]
        assert all("one_pass" not in g for g in groups)
        plain = cls(leaves(SHAPES), **{k: v for k, v in kw.items() if k != "one_pass"})
        assert set(groups[0]) == set(plain.state_dict()["param_groups"][0])
