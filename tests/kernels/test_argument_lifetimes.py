"""amp._C keeps no reference to its arguments once an op returns, whichever binding was built
and however the op ends: the stable binding takes each element of a Tensor[] as the handle
torch's dispatcher made for it and must delete every one (kernels/bindings_stable.cpp's Item),
through a list, an optional list, a single tensor and an error alike. A handle left behind
would keep the tensor's memory (a model's parameters, its gradients) alive for the process."""

from __future__ import annotations

from typing import Callable

import amp._C as C
import pytest
import torch


def _f32(n: int = 5) -> torch.Tensor:
    return torch.rand(n) + 0.5


def _calls(ts: list[torch.Tensor]) -> dict[str, Callable[[], object]]:
    g, p, m, v = ts[0], ts[1], ts[2], ts[3]
    half = ts[4]  # bfloat16 model copy of p
    norms = ts[5]  # novograd's per-tensor norms (a single Tensor argument)
    adam_args = (1e-3, 0.9, 0.999, 1e-8, 1, True, True, 0.0, 1.0)
    return {
        "scale": lambda: C.scale([g], [p], 1.0),
        "l2norm": lambda: C.l2norm([g], 1.0, True),
        "adam, optional list given": lambda: C.adam([g], [p], [m], [v], [half], *adam_args),
        "adam, optional list None": lambda: C.adam([g], [p], [m], [v], None, *adam_args),
        "lamb (returns a tensor)": lambda: C.lamb(
            [g], [p], [m], [v], None, 1e-3, 0.9, 0.999, 1e-6, 1, True, 0.01, True, True, False, 1.0
        ),
        "novograd (a single tensor)": lambda: C.novograd(
            [g], [p], [m], None, norms, 1e-3, 0.95, 0.98, 1e-8, 1, True, 0.0, True, 0, 2, True, 1.0
        ),
        "an error after every list was taken": lambda: C.scale([g, p], [m], 1.0),
        "an error in the optional list": lambda: C.adam(
            [g], [p], [m], [v], [half, half], *adam_args
        ),
    }


@pytest.mark.skipif(
    not hasattr(torch.Tensor, "_use_count"),
    reason=f"torch {torch.__version__} has no Tensor._use_count (torch 2.6 has it) to count "
    "references with; the handles this checks are the stable binding's (torch >= 2.10)",
)
@pytest.mark.parametrize("case", list(_calls([_f32()] * 6)))
def test_an_op_leaves_its_arguments_as_it_found_them(case: str) -> None:
    ts = [
        _f32(),
        _f32(),
        torch.zeros(5),
        torch.zeros(5),
        torch.ones(5, dtype=torch.bfloat16),
        torch.zeros(1),
    ]
    before = [t._use_count() for t in ts]
    call = _calls(ts)[case]
    for _ in range(3):
        raised = False
        try:
            call()
        except (ValueError, TypeError):
            raised = True
        assert raised == case.startswith("an error"), case
    assert [t._use_count() for t in ts] == before, case
