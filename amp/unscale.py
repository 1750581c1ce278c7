"""Gradients on their way to a step: the one grouper that splits tensors into kernel calls, and
the one check that a gradient is dense (every kernel amp calls reads strided memory)."""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Callable, TypeVar

import torch
from torch import Tensor

# One message for every path (per-tensor lists, amp's one-pass unscale, combined buffers, the
# fused optimizers' own reads): torch's unscale kernel would fail on a sparse gradient too,
# with a dispatcher dump instead of a reason.
SPARSE_GRADIENTS = "amp: sparse gradients are not supported"

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def group_by(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """``items`` split by ``key``: groups in the order their first item came, items in their
    own order within a group (the order a kernel call then sees them in)."""
    groups: dict[K, list[T]] = {}
    for item in items:
        k = key(item)
        group = groups.get(k)
        if group is None:
            groups[k] = [item]
        else:
            group.append(item)
    return groups


def dense(grad: Tensor) -> Tensor:
    """``grad``, which must be dense (strided); a sparse gradient raises ``SPARSE_GRADIENTS``."""
    if grad.layout is not torch.strided:
        raise RuntimeError(SPARSE_GRADIENTS)
    return grad
