"""amp/masters/unscale.py: the unscale passes answer with one type, ``Unscaled``, whose flag stays
on the device until someone asks the host (``nonfinite``)."""

from __future__ import annotations

import pytest
import torch

from amp.masters.unscale import Unscaled, group_by, unscale_lists, unscale_one_pass


def test_group_by_keeps_first_seen_order() -> None:
    groups = group_by([3, 10, 5, 12, 7], lambda n: n % 2)
    assert list(groups.items()) == [(1, [3, 5, 7]), (0, [10, 12])]


def test_a_device_flag_is_handed_on_as_it_is_and_read_only_when_asked() -> None:
    flag = torch.ones(1)
    result = Unscaled(flag)
    assert result.found_inf() is flag  # no copy, no host read on the way to scale_loss
    assert result.nonfinite is True
    assert Unscaled(False).found_inf().tolist() == [0.0]
    assert Unscaled(True).found_inf().tolist() == [1.0]


@pytest.mark.parametrize("poison", [None, float("inf"), float("nan")])
def test_lists_and_one_pass_agree(poison) -> None:
    torch.manual_seed(0)
    grads = [torch.randn(5) * 100, torch.randn(3, 2) * 100]
    results = []
    for unscale in ("lists", "one pass"):
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if poison is not None:
            params[1].grad[0, 1] = poison
        if unscale == "lists":
            result = unscale_lists([(p, p, None) for p in params], 1.0 / 64)
        else:
            result = unscale_one_pass([(p, p) for p in params], 1.0 / 64)
        assert isinstance(result, Unscaled)
        results.append((result, params))
    (lists, lp), (one, op) = results
    assert lists.nonfinite == one.nonfinite == (poison is not None)
    assert isinstance(lists.flag, torch.Tensor) and isinstance(one.flag, bool)
    if poison is None:
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(lp, op))
        expected = torch.cat([g.flatten() / 64 for g in grads]).norm().item()
        assert one.norm == pytest.approx(expected, rel=1e-6)
        assert [g.data_ptr() for g in one.grads] == [p.grad.data_ptr() for p in op]
