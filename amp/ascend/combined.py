"""Combined gradients (Apex for Ascend's ``combine_grad``): one buffer per dtype per optimizer.

After the first backward pass under ``combine_grad=True`` (or with an ``NpuFused*`` optimizer),
every gradient the optimizer steps is re-pointed into one contiguous buffer per dtype
(``amp.combine_tensors``): the model's gradients (``model_grads``), and under O2 the fp32 master
gradients (``master_grads``), laid out element for element like the half model's gradient
buffer so that filling them is one copy. From then on a step's unscale, overflow check,
``zero_grad`` and clipping are one operation per buffer instead of one per parameter, and
gradients are zeroed in place so that autograd keeps accumulating into the buffers.

``NpuFused*`` optimizers also need the parameters combined, laid out like their gradients:
``optimizer_segments`` combines them on first use and returns, per param group, the
``Segment`` views their update runs on (a few tensor operations per segment per step). Under O2
the half model parameters are combined too, so the copy of the masters into the model is one
operation.

A gradient can leave its buffer (``p.grad = None``, a new tensor assigned, ``set_``): every
use checks, on the host only, that each gradient is still the tensor that was combined, and
with ``check_combined_tensors=True`` also that its memory is still inside the buffer; when not,
the buffers are dropped (with Ascend's message under ``check_combined_tensors``) and combined
again after the next backward pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from .._amp_state import maybe_log
from ..combine_tensors import (
    _storage_span,
    combine_with_offsets,
    get_aligned_storage_size,
    is_combined_tensor_valid,
    repoint,
)
from ..masters.unscale import Unscaled, check_and_unscale_, dense, group_by

GRADS_DESTROYED = (
    "Combined grad has been destroyed and will be recombined afterwards, please check if there "
    "is any operation that may change the data_ptr/size/format of the grads."
)
PARAMS_DESTROYED = (
    "Combined param has been destroyed and will be recombined afterwards, please check if there "
    "is any operation that may change the data_ptr/size/format of the params."
)


@dataclass
class Segment:
    """The parameters of one param group and one buffer, and 1-D views of their combined
    values and gradients (padding included; element ``offsets[i]`` of the views is the first
    element of ``params[i]``). Elementwise updates of ``param`` from ``grad`` update every
    parameter of the segment at once."""

    params: list[Tensor]
    param: Tensor
    grad: Tensor
    offsets: list[int]
    numels: list[int]


@dataclass
class _Entry:
    group: int
    model: Tensor  # the model's parameter
    param: Tensor  # the parameter the optimizer steps (the fp32 master under O2, else model)

    @property
    def separate(self) -> bool:
        return self.model is not self.param


@dataclass
class _Buffer:
    """One combined buffer and the tensors it holds, with each tensor's offset into it."""

    flat: Tensor
    tensors: list[Tensor]
    offsets: list[int]
    owners: list[_Entry] = field(default_factory=list)

    def holds(self, tensors: Sequence[Optional[Tensor]], deep: bool) -> bool:
        if len(tensors) != len(self.tensors):
            return False
        if any(t is not mine for t, mine in zip(tensors, self.tensors)):
            return False
        return not deep or is_combined_tensor_valid(self.flat, self.tensors)


@torch.no_grad()
def _combine(tensors: list[Tensor], owners: list[_Entry]) -> _Buffer:
    """``combine_npu``, keeping each tensor's offset (the layout other buffers follow)."""
    flat, offsets = combine_with_offsets(tensors)
    assert flat is not None  # every tensor has at least its padding
    return _Buffer(flat, list(tensors), offsets, list(owners))


@torch.no_grad()
def _follow(layout: _Buffer, tensors: list[Tensor], dtype: torch.dtype, copy: bool) -> _Buffer:
    """A buffer of ``dtype`` laid out like ``layout``: tensors[i] takes the place (offset,
    shape, strides) of ``layout.tensors[i]``, so one elementwise op maps one onto the other."""
    flat = torch.zeros(layout.flat.numel(), dtype=dtype, device=layout.flat.device)
    for tensor, like, offset in zip(tensors, layout.tensors, layout.offsets):
        repoint(tensor, flat, offset, like, copy)
    return _Buffer(flat, list(tensors), list(layout.offsets), list(layout.owners))


class CombinedGrads:
    """The combined buffers of one optimizer (kept on its ``_amp_stash``)."""

    def __init__(self, check: bool) -> None:
        self.check = check  # check_combined_tensors: also verify memory, and say so
        self.valid = False
        self.generation = 0  # bumped at every (re)combination: NpuFused states follow it
        self.dirty = True  # the buffers may hold gradients from before this backward pass
        self.model_grads: list[_Buffer] = []  # one per model dtype, in first-seen order
        self.half_grads: Optional[_Buffer] = None  # O2: the half model's (which have masters)
        self.master_grads: Optional[_Buffer] = None  # O2: fp32, laid out like half_grads
        # NpuFused only: the stepped parameters, laid out like their gradients, per buffer.
        self.param_buffers: Optional[list[tuple[_Buffer, _Buffer]]] = None  # (params, grads)
        self.model_params: Optional[_Buffer] = None  # O2: the half model, laid out like masters
        self.segments: list[list[Segment]] = []
        self.saved: list[Tensor] = []  # copies of already-unscaled grads (a second loss)
        self.masters_zero = False  # the masters' gradient buffer is known to hold zeros
        self.masks: dict[str, list[Tensor]] = {}

    # --- (re)combining ------------------------------------------------------------------
    @torch.no_grad()
    def build(self, pairs_by_group: list[list[tuple[Tensor, Tensor]]]) -> bool:
        """Combine the gradients of every (model, stepped) parameter pair that has one.

        Model gradients hold this backward pass's scaled values and are moved with them; the
        masters' gradient buffer is created (its values are written by the unscale). Returns
        False (nothing combined) when no parameter has a gradient."""
        self.reset(quiet=True)
        entries = [
            _Entry(g, model, param)
            for g, pairs in enumerate(pairs_by_group)
            for model, param in pairs
            if model.grad is not None
        ]
        if not entries:
            return False
        # One buffer per (model dtype, has a separate master): under O2 the half parameters
        # all have masters and the float32 ones (batch-norm) are their own.
        for owners in group_by(entries, lambda e: (e.model.dtype, e.separate)).values():
            grads = [dense(e.model.grad) for e in owners]
            self.model_grads.append(_combine(grads, owners))
        # Separate masters first, as Ascend orders the buffers.
        self.model_grads.sort(key=lambda b: not b.owners[0].separate)
        half = self.model_grads[0] if self.model_grads[0].owners[0].separate else None
        if half is not None:
            masters = []
            for e in half.owners:
                # Its own memory for an instant: torch checks the size on assignment.
                e.param.grad = torch.empty_like(e.model.grad, dtype=e.param.dtype)
                masters.append(e.param.grad)
            self.half_grads = half
            self.master_grads = _follow(half, masters, torch.float32, copy=False)
        self.valid = True
        self.dirty = True
        self.masters_zero = False
        self.generation += 1
        return True

    def reset(self, quiet: bool = False, message: str = GRADS_DESTROYED) -> None:
        if self.valid and not quiet and self.check:
            maybe_log(message)
        self.valid = False
        self.model_grads, self.half_grads, self.master_grads = [], None, None
        self.param_buffers, self.model_params, self.segments = None, None, []
        self.saved, self.masks = [], {}

    def still_valid(self) -> bool:
        """Every combined gradient (and parameter) is still where it was put; else reset.
        Gradients set to None are first taken back into their buffers (``reclaim``)."""
        if not self.valid:
            return False
        self.reclaim()
        for buf in self.model_grads:
            if not buf.holds([e.model.grad for e in buf.owners], self.check):
                self.reset()
                return False
        if self.master_grads is not None and not self.master_grads.holds(
            [e.param.grad for e in self.master_grads.owners], self.check
        ):
            self.reset()
            return False
        if self.param_buffers is not None:
            for params, _ in self.param_buffers:
                if not params.holds([e.param for e in params.owners], self.check):
                    self.reset(message=PARAMS_DESTROYED)
                    return False
        return True

    @torch.no_grad()
    def reclaim(self) -> None:
        """Put gradients that were set to None back into their buffers, zeroed.

        ``torch.nn.Module.zero_grad()`` sets gradients to None by default (torch >= 2.0). amp
        makes the initialized model's own ``zero_grad`` zero in place, but a module built
        around it afterwards -- ``DistributedDataParallel(model)``, in the order ModelZoo's
        scripts use -- has torch's. A None gradient means zero under combining (Ascend's
        ``zero_grad`` zeroes in place whatever ``set_to_none`` says), so its slot in the
        buffer is zeroed and the gradient points at it again: the buffers stay, instead of
        being combined again after every backward pass. Costs one zero per buffer when all
        of a buffer's gradients were dropped (the usual case), else one per dropped gradient.
        """
        whole = [self._reclaim(b, [e.model for e in b.owners]) for b in self.model_grads]
        masters = self.master_grads
        if masters is not None and self._reclaim(masters, [e.param for e in masters.owners]):
            self.masters_zero = True
        if whole and all(whole):
            # Every model gradient was dropped: do what optimizer.zero_grad() would have done.
            self.zero_masters_()
            self.saved = []
            self.dirty = False

    @staticmethod
    def _reclaim(buf: _Buffer, params: list[Tensor]) -> bool:
        """Reclaim ``buf``'s dropped gradients; True when every one of them was dropped."""
        missing = [i for i, p in enumerate(params) if p.grad is None]
        if not missing:
            return False
        if len(missing) == len(params):
            buf.flat.zero_()
        else:
            for i in missing:
                buf.tensors[i].zero_()
        for i in missing:
            params[i].grad = buf.tensors[i]
        return len(missing) == len(params)

    # --- what amp does with them --------------------------------------------------------
    def _own_grads(self) -> list[_Buffer]:
        return [b for b in self.model_grads if not b.owners[0].separate]

    def optimizer_grads(self) -> list[Tensor]:
        """The buffers of the gradients the optimizer steps: the masters' under O2, then the
        model's own for parameters that are their own masters."""
        out = [] if self.master_grads is None else [self.master_grads.flat]
        return out + [b.flat for b in self._own_grads()]

    def model_grad_flats(self) -> list[Tensor]:
        return [b.flat for b in self.model_grads]

    @torch.no_grad()
    def save_existing(self) -> None:
        """Before a backward pass into buffers that hold unscaled gradients (a second loss
        before the step, or no zero_grad): set them aside and start from zero, as the
        per-parameter path sets the gradients aside."""
        self.saved = []
        if not self.dirty:
            return
        for flat in self.optimizer_grads():
            self.saved.append(flat.clone())
        for flat in self.model_grad_flats():
            flat.zero_()

    @torch.no_grad()
    def zero_(self) -> None:
        for flat in self.model_grad_flats():
            flat.zero_()
        self.zero_masters_()
        self.saved = []
        self.dirty = False

    @torch.no_grad()
    def zero_masters_(self) -> None:
        """Zero the masters' gradients, unless nothing was written since they last were
        (a step zeroes them, and zero_grad usually follows)."""
        if self.master_grads is not None and not self.masters_zero:
            self.master_grads.flat.zero_()
        self.masters_zero = True

    @torch.no_grad()
    def unscale(self, inv_scale: float) -> Unscaled:
        """master grads = model grads (one copy), then every stepped gradient buffer is
        unscaled and checked in one call; set-aside gradients are added back."""
        if self.master_grads is not None and self.half_grads is not None:
            self.master_grads.flat.copy_(self.half_grads.flat)
            self.masters_zero = False
        targets = self.optimizer_grads()
        found_inf = check_and_unscale_(targets, inv_scale)
        if self.saved:
            torch._foreach_add_(targets, self.saved)
            self.saved = []
        self.dirty = True
        return Unscaled(found_inf)

    # --- parameters (NpuFused optimizers) ------------------------------------------------
    @torch.no_grad()
    def combine_params(self, n_groups: int) -> list[list[Segment]]:
        """Combine the stepped parameters like their gradients (and, under O2, the half model
        like the masters); return the per-group segments. Idempotent while valid."""
        if self.param_buffers is not None:
            return self.segments
        pairs: list[tuple[_Buffer, _Buffer]] = []
        if self.master_grads is not None:
            grads = self.master_grads
            params = _follow(grads, [e.param for e in grads.owners], torch.float32, copy=True)
            pairs.append((params, grads))
            self.model_params = _follow(
                params, [e.model for e in grads.owners], grads.owners[0].model.dtype, copy=True
            )
        for grads in self.model_grads:
            if grads.owners[0].separate:
                continue
            params = _follow(grads, [e.param for e in grads.owners], grads.flat.dtype, copy=True)
            pairs.append((params, grads))
        # Own (fp32) buffers first, then the masters of half parameters, as Ascend orders them.
        pairs.sort(key=lambda pg: pg[0].owners[0].separate)
        self.param_buffers = pairs
        self.segments = [[] for _ in range(n_groups)]
        for params, grads in pairs:
            for group, segment in _group_segments(params, grads):
                self.segments[group].append(segment)
        return self.segments

    @torch.no_grad()
    def copy_masters_to_model(self) -> bool:
        """Under O2 with combined parameters: the half model = the masters, one operation."""
        if self.model_params is None or self.param_buffers is None:
            return False
        masters = next(p for p, _ in self.param_buffers if p.owners[0].separate)
        self.model_params.flat.copy_(masters.flat)
        return True

    @torch.no_grad()
    def grad_masks(self, which: str) -> list[Tensor]:
        """1 where a buffer holds a gradient element, 0 in the padding (Ascend's masks), for
        the ``optimizer_grads()`` (which="optimizer") or the model's gradient buffers."""
        if which not in self.masks:
            if which == "optimizer":
                masters = [] if self.master_grads is None else [self.master_grads]
                bufs = masters + self._own_grads()
            else:
                bufs = self.model_grads
            masks = []
            for buf in bufs:
                mask = torch.zeros_like(buf.flat)
                for tensor, offset in zip(buf.tensors, buf.offsets):
                    mask.narrow(0, offset, _storage_span(tensor)).fill_(1)
                masks.append(mask)
            self.masks[which] = masks
        return self.masks[which]

    def buffers(self, side: str, what: str) -> list[Optional[Tensor]]:
        """Ascend's ``get_{model,optimizer}_combined_{params,grads}()`` lists, positions
        included: with master weights [half-or-masters, own float32], else [own float32];
        None where a position has no buffer."""
        own_grads = self._own_grads()
        own_params = [p for p, _ in self.param_buffers or [] if not p.owners[0].separate]
        if what == "grads":
            own: Optional[Tensor] = own_grads[0].flat if own_grads else None
            first = self.half_grads if side == "model" else self.master_grads
        else:
            own = own_params[0].flat if own_params else None
            masters = [p for p, _ in self.param_buffers or [] if p.owners[0].separate]
            first = self.model_params if side == "model" else (masters[0] if masters else None)
        if self.half_grads is None:
            return [own]
        return [None if first is None else first.flat, own]


def _group_segments(params: _Buffer, grads: _Buffer) -> Iterator[tuple[int, Segment]]:
    """Split a buffer into the consecutive runs of one param group each."""
    start = 0
    owners = params.owners
    while start < len(owners):
        group = owners[start].group
        end = start
        while end < len(owners) and owners[end].group == group:
            end += 1
        first = params.offsets[start]
        last = params.offsets[end - 1] + get_aligned_storage_size(params.tensors[end - 1])
        yield (
            group,
            Segment(
                params=[e.param for e in owners[start:end]],
                param=params.flat.narrow(0, first, last - first),
                grad=grads.flat.narrow(0, first, last - first),
                offsets=[o - first for o in params.offsets[start:end]],
                numels=[t.numel() for t in params.tensors[start:end]],
            ),
        )
        start = end


def zero_grads_in_place(model: torch.nn.Module) -> None:
    """Under combining, ``model.zero_grad()`` zeroes in place whatever ``set_to_none`` says
    (Ascend patches ``Module.zero_grad`` the same way; here only this model instance): a
    gradient set to None would leave its buffer, and the next backward pass would allocate
    a fresh one outside it. ``optimizer.zero_grad()`` is faster still: one op per buffer."""
    zero_grad = model.zero_grad

    def zero_grad_in_place(set_to_none: bool = False) -> None:
        zero_grad(set_to_none=False)

    model.zero_grad = zero_grad_in_place


def optimizer_segments(optimizer: Any) -> list[list[Segment]]:
    """The combined parameters and gradients of an optimizer under amp, per param group: what
    an ``NpuFused*`` optimizer's step runs on. The parameters are combined on first use; the
    list changes (compare ``combined_generation``) whenever amp combines again."""
    stash = getattr(optimizer, "_amp_stash", None)
    combined: Optional[CombinedGrads] = getattr(stash, "combined", None)
    if combined is None:
        raise RuntimeError(
            f"apex.optimizers.{type(optimizer).__name__} should be used with AMP: pass it "
            "through amp.initialize(model, optimizer, opt_level='O1' or 'O2') first."
        )
    if not combined.still_valid():
        return [[] for _ in optimizer.param_groups]
    return combined.combine_params(len(optimizer.param_groups))


def combined_generation(optimizer: Any) -> int:
    """Changes whenever amp (re)combines the optimizer's buffers."""
    return optimizer._amp_stash.combined.generation
