"""The one-call fast paths (amp/masters/unscale.py ``unscale_one_pass``, amp/optimizers/
tensor_lists.py ``make_buckets``) take a whole list at once only where one kernel call gives
what the per-tensor path gives; every irregular list below must come out as that path leaves
it (values, which tensor holds them, the split into kernel calls, the error)."""

from __future__ import annotations

import pytest
import torch

from amp.kernels import ops as mt
from amp.masters.unscale import SPARSE_GRADIENTS, unscale_one_pass
from amp.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedNovoGrad, FusedSGD, tensor_lists
from amp.optimizers.tensor_lists import grad_norm, make_buckets

INV = 1.0 / 64


def _params(shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def _give_grads(params):
    gen = torch.Generator().manual_seed(1)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 100).to(p.dtype)
    return [p.grad.clone() for p in params]


def _expected_norm(grads):
    return torch.cat([g.double().flatten() * INV for g in grads]).norm().item()


def test_regular_lists_are_one_call_in_place() -> None:
    params = _params([(5,), (3, 2), (7,)])
    before = _give_grads(params)
    ptrs = [p.grad.data_ptr() for p in params]
    out = unscale_one_pass([(p, p) for p in params], INV)
    assert [p.grad.data_ptr() for p in params] == ptrs  # in place
    assert all(torch.equal(p.grad, g * INV) for p, g in zip(params, before))
    assert out.norm == pytest.approx(_expected_norm(before), rel=1e-6)
    assert out.nonfinite is False and [g.data_ptr() for g in out.grads] == ptrs


def test_o2_lists_are_one_call_into_fresh_fp32_master_gradients() -> None:
    model = _params([(5,), (3, 2)], torch.bfloat16)
    masters = [p.detach().float() for p in model]
    before = _give_grads(model)
    out = unscale_one_pass(list(zip(model, masters)), INV)
    for m, p, g in zip(masters, model, before):
        assert m.grad.dtype == torch.float32 and m.grad.is_contiguous()
        assert torch.equal(m.grad, g.float() * INV) and torch.equal(p.grad, g)  # model's kept
    assert [g is m.grad for g, m in zip(out.grads, masters)] == [True, True]


def test_a_missing_gradient_is_skipped() -> None:
    params = _params([(5,), (4,), (6,)])
    before = _give_grads(params)
    params[1].grad = None
    out = unscale_one_pass([(p, p) for p in params], INV)
    assert params[1].grad is None and len(out.grads) == 2
    assert out.norm == pytest.approx(_expected_norm([before[0], before[2]]), rel=1e-6)


def test_mixed_gradient_dtypes_into_fp32_masters() -> None:
    model = _params([(5,), (4,)], torch.bfloat16) + _params([(3,)])
    masters = [p.detach().float() for p in model]
    before = _give_grads(model)
    out = unscale_one_pass(list(zip(model, masters)), INV)
    for m, g in zip(masters, before):
        assert m.grad.dtype == torch.float32 and torch.equal(m.grad, g.float() * INV)
    assert out.norm == pytest.approx(_expected_norm(before), rel=1e-6)


def test_a_non_contiguous_gradient_is_made_contiguous() -> None:
    params = _params([(3, 4), (5,)])
    before = _give_grads(params)
    params[0].grad = params[0].grad.t().contiguous().t()  # same values, transposed strides
    assert not params[0].grad.is_contiguous()
    unscale_one_pass([(p, p) for p in params], INV)
    assert params[0].grad.is_contiguous()
    assert all(torch.equal(p.grad, g * INV) for p, g in zip(params, before))


def test_a_channels_last_master_gets_a_contiguous_gradient() -> None:
    model = _params([(2, 3, 4, 4), (5,)], torch.bfloat16)
    masters = [model[0].detach().float().to(memory_format=torch.channels_last)]
    masters.append(model[1].detach().float())
    assert not masters[0].is_contiguous()
    before = _give_grads(model)
    unscale_one_pass(list(zip(model, masters)), INV)
    assert all(m.grad.is_contiguous() for m in masters)
    assert all(torch.equal(m.grad, g.float() * INV) for m, g in zip(masters, before))


def test_some_params_their_own_masters() -> None:
    model = [_params([(5,)], torch.bfloat16)[0], _params([(4,)])[0]]
    masters = [model[0].detach().float(), model[1]]
    before = _give_grads(model)
    unscale_one_pass(list(zip(model, masters)), INV)
    assert masters[1].grad is model[1].grad  # in place for its own master
    assert all(torch.equal(m.grad, g.float() * INV) for m, g in zip(masters, before))


def test_a_sparse_gradient_is_refused_with_amps_message() -> None:
    params = _params([(4,), (3,)])
    _give_grads(params)
    params[1].grad = torch.zeros(3).to_sparse()
    dense_before = params[0].grad.clone()
    with pytest.raises(RuntimeError, match=SPARSE_GRADIENTS):
        unscale_one_pass([(p, p) for p in params], INV)
    assert torch.equal(params[0].grad, dense_before)  # nothing half-written by a refused call


def test_an_overflow_is_found_in_one_call() -> None:
    params = _params([(5,), (4,)])
    _give_grads(params)
    params[1].grad[2] = float("inf")
    assert unscale_one_pass([(p, p) for p in params], INV).nonfinite is True


# --- make_buckets ---------------------------------------------------------------------------


def _split(buckets):
    return [[id(p) for p in b.params] for b in buckets]


def test_a_regular_group_is_one_bucket_in_order() -> None:
    params = _params([(5,), (3, 2), (7,)])
    _give_grads(params)
    (b,) = make_buckets(params, params, grads_on_params=True)
    assert _split([b]) == [[id(p) for p in params]] and b.model_params is None
    assert [g is p.grad for g, p in zip(b.grads, params)] == [True] * 3


def test_half_model_copies_ride_along() -> None:
    model = _params([(5,), (4,)], torch.bfloat16)
    masters = [p.detach().float() for p in model]
    _give_grads(model)
    (b,) = make_buckets(masters, model)
    assert b.model_params == model and b.grads == [p.grad for p in model]


@pytest.mark.parametrize("irregular", ["none grad", "grad dtypes", "param dtypes", "key", "own"])
def test_irregular_groups_are_split_as_per_tensor(irregular: str) -> None:
    params = _params([(5,), (4,), (6,)])
    models = list(params)
    _give_grads(params)
    key, sources = None, None
    if irregular == "none grad":
        params[1].grad = None
        expected = [[id(params[0]), id(params[2])]]
    elif irregular == "grad dtypes":
        half = params[1].detach().bfloat16().requires_grad_()
        half.grad = torch.ones(4, dtype=torch.bfloat16)
        sources = [params[0], half, params[2]]  # the grads of half params (master_weights)
        expected = [[id(params[0]), id(params[2])], [id(params[1])]]
    elif irregular == "param dtypes":
        params[2] = params[2].detach().half().requires_grad_()
        params[2].grad = torch.ones(6, dtype=torch.half)
        models = list(params)
        expected = [[id(params[0]), id(params[1])], [id(params[2])]]
    elif irregular == "key":
        key = lambda p: p is params[0]  # noqa: E731
        expected = [[id(params[0])], [id(params[1]), id(params[2])]]
    else:  # one half copy among params that are their own
        models[1] = params[1].detach().bfloat16()
        models[1].grad = torch.ones(4, dtype=torch.bfloat16)
        expected = [[id(params[0]), id(params[2])], [id(params[1])]]
    buckets = make_buckets(
        params, models, key, grads_on_params=irregular != "own", grad_sources=sources
    )
    assert _split(buckets) == expected


def test_a_shape_mismatch_is_named() -> None:
    masters = _params([(6,), (4,)])
    model = [masters[0].detach().reshape(2, 3).bfloat16(), masters[1].detach().bfloat16()]
    _give_grads(model)
    with pytest.raises(ValueError, match=r"differ in shape \(\(2, 3\) vs \(6,\)\)"):
        make_buckets(masters, model)


def _op_calls(monkeypatch, name: str, module=mt):
    """Records the lengths of the first lists ``module.<name>`` (amp.kernels.ops by default)
    is called with."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(first, *args, **kwargs):
        calls.append(len(first))
        return real(first, *args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_grad_norm_takes_one_dtype_in_one_call(monkeypatch) -> None:
    calls = _op_calls(monkeypatch, "l2norm")
    grads = _give_grads(_params([(5,), (3, 2), (7,)]))
    norm, bad = grad_norm(grads, INV)
    assert calls == [3]
    assert norm == pytest.approx(_expected_norm(grads), rel=1e-6) and bad is False


def test_grad_norm_splits_what_one_call_refuses(monkeypatch) -> None:
    calls = _op_calls(monkeypatch, "l2norm")
    grads = _give_grads(_params([(5,), (4,)])) + _give_grads(_params([(6,)], torch.bfloat16))
    grads[0][2] = float("inf")
    norm, bad = grad_norm(grads, INV)
    # The whole list once (refused: two dtypes), then one call per dtype, as before.
    assert calls == [3, 2, 1]
    assert bad is True and norm == float("inf")
    grads[0][2] = 1.0
    calls.clear()
    norm, bad = grad_norm(grads, INV)
    assert calls == [3, 2, 1] and bad is False
    assert norm == pytest.approx(_expected_norm(grads), rel=1e-6)


# --- the fused optimizers' step: unchecked calls per group (quick_buckets, run_buckets) -----

#: (optimizer, its keywords, the amp.kernels.ops function its step calls)
OPTIMIZERS = {
    "adam": (FusedAdam, dict(lr=0.1, weight_decay=0.01, adam_w_mode=True), "adam"),
    "sgd": (FusedSGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01), "sgd"),
    "lamb": (FusedLAMB, dict(lr=0.1, weight_decay=0.01), "lamb"),
    "adagrad": (FusedAdagrad, dict(lr=0.1), "adagrad"),
    "novograd": (FusedNovoGrad, dict(lr=0.1, init_zero=False), "novograd"),
}


def _pair(name: str, params_of):
    """Two optimizers over equal copies of *params_of()*: one over them as one group, the
    other with a group per tensor (each its own kernel call: the reference)."""
    cls, kw, _ = OPTIMIZERS[name]
    one, each = params_of(), params_of()
    for ps in (one, each):
        _give_grads(ps)
    return one, each, cls(one, **kw), cls([{"params": [p]} for p in each], **kw)


def _same_state(opt, ref, one, each) -> bool:
    for a, b in zip(one, each):
        sa, sb = opt.state[a], ref.state[b]
        if sorted(sa) != sorted(sb):
            return False
        for k in sa:
            if isinstance(sa[k], torch.Tensor) and not torch.equal(sa[k], sb[k]):
                return False
    return True


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("irregular", ["two dtypes", "non-contiguous grad"])
def test_a_group_the_kernel_refuses_steps_as_split_and_is_split_from_then_on(
    monkeypatch, name: str, irregular: str
) -> None:
    def params_of():
        ps = _params([(5,), (3, 4), (7,)])
        if irregular == "two dtypes":  # no master weights: each dtype's own call
            ps[1] = ps[1].detach().bfloat16().requires_grad_()
        return ps

    one, each, opt, ref = _pair(name, params_of)
    if irregular == "non-contiguous grad":
        for ps in (one, each):
            ps[1].grad = ps[1].grad.t().contiguous().t()  # same values, transposed strides
        assert not one[1].grad.is_contiguous()
    calls = _op_calls(monkeypatch, OPTIMIZERS[name][2])
    # Step 1: the whole group once (refused before anything was written or kept: no state
    # is left half made), then the split; step 2: the split directly.
    split = [2, 1] if irregular == "two dtypes" else [3]
    for step in range(2):
        calls.clear()
        opt.step()
        assert calls == ([3, *split] if step == 0 else split)
        ref.step()
        assert all(torch.equal(a, b) for a, b in zip(one, each)), (irregular, step)
        assert _same_state(opt, ref, one, each), (irregular, step)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_regular_group_steps_in_one_call_and_equals_the_split(monkeypatch, name: str) -> None:
    one, each, opt, ref = _pair(name, lambda: _params([(5,), (3, 4), (7,)]))
    calls = _op_calls(monkeypatch, OPTIMIZERS[name][2])
    for _ in range(2):
        calls.clear()
        opt.step()
        assert calls == [3]
        ref.step()
        assert all(torch.equal(a, b) for a, b in zip(one, each))
        assert _same_state(opt, ref, one, each)


def test_a_model_copy_of_another_shape_is_still_named_on_the_quick_path() -> None:
    masters = _params([(6,), (4,)])
    model = [masters[0].detach().reshape(2, 3).bfloat16(), masters[1].detach().bfloat16()]
    _give_grads(model)
    opt = FusedAdam(masters, lr=0.1)
    with pytest.raises(ValueError, match=r"differ in shape \(\(2, 3\) vs \(6,\)\)"):
        opt._amp_fused_step([model], 1.0)


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_the_gradients_signature_is_taken_only_for_a_step_that_clips(
    monkeypatch, max_grad_norm: float
) -> None:
    """The note of amp's pass keeps the norm, with a signature of every gradient, only for an
    optimizer that will read it; the step still clips by the measured norm."""
    taken: list[int] = []
    real = tensor_lists.grads_signature

    def counted(grads):
        taken.append(len(grads))
        return real(grads)

    monkeypatch.setattr(tensor_lists, "grads_signature", counted)
    params = _params([(5,), (3, 4)])
    _give_grads(params)
    opt = FusedAdam(params, lr=0.1, max_grad_norm=max_grad_norm)
    out = unscale_one_pass([(p, p) for p in params], INV)
    opt._amp_note_grad_norm(out.norm, out.grads)
    calls = _op_calls(monkeypatch, "l2norm")  # a norm measured again: one more read pass
    opt._amp_unscaled_step([params])
    # Clipping: the note's signature and the step's, which match, so no second norm pass.
    assert (taken, calls) == (([2, 2], []) if max_grad_norm else ([], []))


def _o2_group(own_dtypes):
    """fp32 masters with bf16 model copies, and params that are their own masters (O2's
    keep_batchnorm_fp32) of *own_dtypes*, interleaved: (masters, models)."""
    masters = _params([(5,), (3, 4), (7,), (2, 3)][: 2 + len(own_dtypes)])
    models: list = []
    for i, m in enumerate(masters):
        if i % 2 == 0:
            models.append(m.detach().bfloat16())
        else:
            own = m.detach().to(own_dtypes[i // 2]).requires_grad_()
            masters[i] = own
            models.append(own)
    _give_grads(masters)  # the unscaled gradients amp's pass leaves on the masters
    return masters, models


@pytest.mark.parametrize("own_dtypes", [[torch.float32], [torch.float32, torch.bfloat16]])
def test_an_o2_group_with_params_that_are_their_own_masters(monkeypatch, own_dtypes) -> None:
    """Two calls without make_buckets (the masters with half copies, then the rest); a bucket
    the kernel refuses (two dtypes among the params that are their own) is split alone, and
    the group goes to make_buckets from then on. The reference: one group per parameter."""
    masters, models = _o2_group(own_dtypes)
    ref_masters, ref_models = _o2_group(own_dtypes)
    opt = FusedAdam(masters, lr=0.1, weight_decay=0.01)
    ref = FusedAdam([{"params": [m]} for m in ref_masters], lr=0.1, weight_decay=0.01)
    calls = _op_calls(monkeypatch, "adam")
    split = _op_calls(monkeypatch, "make_buckets", tensor_lists)
    copied = (len(masters) + 1) // 2
    for step in range(2):
        calls.clear()
        split.clear()
        opt._amp_unscaled_step([models])
        if len(own_dtypes) == 1:
            assert (calls, split) == ([copied, 1], [])
        elif step == 0:  # the second bucket refused, then split by dtype
            assert (calls, split) == ([copied, 2, 1, 1], [2])
        else:  # the group's own make_buckets from then on
            assert split == [len(masters)] and sorted(calls) == [1, 1, copied]
        ref._amp_unscaled_step([[m] for m in ref_models])
        assert all(torch.equal(a, b) for a, b in zip(masters, ref_masters))
        assert all(torch.equal(a, b) for a, b in zip(models, ref_models))
        assert _same_state(opt, ref, masters, ref_masters)
