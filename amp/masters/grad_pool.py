"""The memory of the fp32 master gradients under O2 on the CPU, kept from one step to the next.

amp's unscale pass writes each master's gradient into a new tensor when ``scale_loss`` exits,
and the step drops them (``master.grad = None``), as apex does. On a GPU the caching allocator
keeps that memory for the next step. On the CPU glibc's allocator gives it back to the kernel
when the freed block is large enough, and the next step faults it in again, page by page: for
50M parameters that is 200 MB a step, about as long as the whole step (and only on some steps,
depending on what else the allocator holds, so step times become bimodal).

``MasterGradPool`` keeps one fp32 buffer instead, and the master gradients are views of it
(``master.grad`` is still None after each step). It holds 4 bytes per master between steps,
which is the price; ``AMP_MASTER_GRAD_POOL=0`` in the environment turns it off. A buffer is
reused only while nothing outside amp holds any part of it: not a gradient a script kept from
an earlier step, nor a view of one (the storage's use count and each view's reference count
say so). Otherwise, and where the masters are not all fp32 CPU tensors, the gradients are
fresh tensors as before.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

import torch
from torch import Tensor
from torch._utils import _unflatten_dense_tensors

ENV = "AMP_MASTER_GRAD_POOL"

# torch's count of the references to a storage (every tensor on it, views included); without
# it a view a script keeps could not be seen, and the pool stays off.
_use_count: Optional[Callable[[int], int]] = getattr(torch._C, "_storage_Use_Count", None)


def enabled() -> bool:
    return _use_count is not None and os.environ.get(ENV, "1") != "0"


def _storage_refs(buf: Tensor) -> int:
    assert _use_count is not None
    return int(_use_count(buf.untyped_storage()._cdata))


# Builds of one optimizer's buffer before its gradients go back to fresh tensors: the first,
# one for a change of parameters (add_param_group), one after a script kept a gradient. A
# layout that keeps changing (parameters unused in some steps) or gradients kept every step
# would otherwise cost a new buffer per step, faulted in page by page: more than the per-tensor
# allocations it replaces.
MAX_BUILDS = 3


class MasterGradPool:
    """One optimizer's master gradient buffer (held by its ``OptimizerStash``)."""

    def __init__(self) -> None:
        self._buf: Optional[Tensor] = None
        self._views: list[Tensor] = []
        self._storage_refs = 0  # the storage's use count while only amp holds the buffer
        self._view_refs = 0  # each view's reference count while only amp holds it
        self.builds = 0

    def outputs(self, masters: list[Tensor]) -> list[Tensor]:
        """Tensors to write the gradients of ``masters`` into, one each, contiguous, of each
        master's shape: the kept buffer's views when they fit and are free, else views of a
        new buffer (all masters fp32 on the CPU), else fresh tensors."""
        if self._views and len(self._views) == len(masters) and self._free():
            return list(self._views)
        self.forget()
        if self.builds >= MAX_BUILDS or not enabled() or not _poolable(masters):
            return fresh(masters)
        buf = torch.empty(sum(m.numel() for m in masters), dtype=torch.float32)
        self._views = list(_unflatten_dense_tensors(buf, masters))
        self._buf = buf
        self.builds += 1
        self._storage_refs = _storage_refs(buf)
        self._view_refs = max(self._ref_counts())
        return list(self._views)

    def checked_outputs(self, masters: list[Tensor]) -> list[Tensor]:
        """``outputs``, each checked to have its master's shape and dtype (a kept view made for
        other masters, of the same count, may not): for the paths that assign them without a
        kernel's check first. A mismatch lets the buffer go and gives fresh tensors."""
        outs = self.outputs(masters)
        if all(o.shape == m.shape and o.dtype == m.dtype for o, m in zip(outs, masters)):
            return outs
        self.forget()
        return fresh(masters)

    def forget(self) -> None:
        """Let the buffer go (a kernel refused its views, a master no longer fits its view, or
        someone else holds part of it): the next ``outputs`` builds one for the masters as
        they are then."""
        self._buf = None
        self._views = []

    def _ref_counts(self) -> list[int]:
        return [sys.getrefcount(v) for v in self._views]

    def _free(self) -> bool:
        """Whether only amp holds the buffer: no tensor beyond amp's views shares its storage,
        and nobody keeps one of those views (a ``.grad`` read in an earlier step)."""
        assert self._buf is not None
        if _storage_refs(self._buf) != self._storage_refs:
            return False
        return max(self._ref_counts()) == self._view_refs


def fresh(masters: list[Tensor]) -> list[Tensor]:
    """New contiguous tensors shaped as ``masters``: the gradients where no buffer serves."""
    return [torch.empty_like(m, memory_format=torch.contiguous_format) for m in masters]


def _poolable(masters: list[Tensor]) -> bool:
    return bool(masters) and all(m.is_cpu and m.dtype is torch.float32 for m in masters)
