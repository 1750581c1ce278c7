"""The base of Apex for Ascend's ``NpuFused*`` optimizers (and of ``Lamb``): steps over amp's
combined buffers, one update per buffer. (apex's fused optimizers step over tensor lists
instead: ``tensor_lists``.)

Under amp with combined gradients, every parameter an optimizer steps sits in one contiguous buffer
per dtype, and so does its gradient (``amp.ascend.combined``). An ``NpuFused*`` optimizer keeps its
per-parameter state tensors in ``self.state[p]`` (as torch.optim does, so ``state_dict`` works) and
re-points them, with ``combine_npu``, into buffers laid out element for element like the
parameters' buffer. A step is then a few tensor operations per buffer (a ``Run``), whatever the
number of parameters: each subclass writes its update once, as a function of a ``Run``.

A ``Run`` is a stretch of one segment (one param group, one buffer) whose parameters share a
step count (Adam's bias correction) and freshness (SGD's first momentum step); normally a
segment is one run. The padding between parameters stays zero under every update here: the
states start at zero there, and each update maps (zero parameter, zero gradient, zero states)
to zero, as long as ``eps > 0`` where an update divides by ``sqrt(state) + eps``.

``Lamb`` uses the same updates on one run per parameter, without amp and without combining.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer

from ..ascend import combined
from ..combine_tensors import combine_npu
from ..kernels import ops as kernel_ops
from .tensor_lists import closure_loss


@dataclass
class Run:
    """Parameters updated together: 1-D views of their values, gradients and states (padding
    included) and where each parameter sits in them. With ``whole``, the views are one
    parameter's own tensors, in its shape (``Lamb`` on a non-contiguous parameter)."""

    param: Tensor
    grad: Tensor
    states: dict[str, Tensor]
    step: int  # the step being taken, counted from 1 (torch.optim's convention)
    fresh: bool  # the states were created for this step (SGD's first momentum step)
    params: list[Tensor]
    offsets: list[int]
    numels: list[int]
    whole: bool = False
    # A temporary like ``param`` (slot 0, 1, ...), reused from step to step: with torch's
    # ``out=`` variants an update computes exactly what the allocating ops do, without a
    # fresh buffer per temporary (on the CPU, page faults on every step; half the step time
    # at 50M parameters).
    scratch_of: Optional[Callable[[Tensor, int], Tensor]] = field(default=None, repr=False)
    # Device tensors a run derives from its layout (per_part's repeats), kept by the
    # optimizer across steps: the layout only changes when amp combines again.
    cache: dict[Any, Tensor] = field(default_factory=dict, repr=False)

    def scratch(self, slot: int = 0) -> Tensor:
        if self.scratch_of is None or not self.param.is_contiguous():
            return torch.empty_like(self.param)
        return self.scratch_of(self.param, slot)

    def parts(self, flat: Tensor) -> list[Tensor]:
        """Each parameter's elements of ``flat`` (laid out like ``param``), as 1-D views (for
        per-tensor norms; the order of elements is the storage's)."""
        if self.whole:
            return [flat]
        return [flat.narrow(0, o, n) for o, n in zip(self.offsets, self.numels)]

    def shaped(self, flat: Tensor, i: int) -> Tensor:
        """Parameter ``i``'s elements of ``flat`` as a view with the parameter's shape."""
        if self.whole:
            return flat
        p = self.params[i]
        return flat.as_strided(p.shape, p.stride(), flat.storage_offset() + self.offsets[i])

    def per_part(self, values: Tensor) -> Tensor:
        """A tensor like ``param`` holding ``values[i]`` on parameter ``i``'s elements (and on
        the padding after it): one operation, for per-tensor factors such as a trust ratio."""
        if len(self.params) == 1:  # a 0-dim factor broadcasts over the padding too
            return values.reshape(())
        ends = self.offsets[1:] + [self.param.numel()]
        sizes = tuple(end - start for start, end in zip(self.offsets, ends))
        key = ("repeats", values.device, sizes)
        repeats = self.cache.get(key)
        if repeats is None:
            repeats = self.cache[key] = torch.tensor(sizes, device=values.device)
        return torch.repeat_interleave(values, repeats, output_size=self.param.numel())


class ElementwiseOptimizer(Optimizer):
    """A torch.optim optimizer whose update is written once, over ``Run``s (see the module
    docstring). Subclasses give ``_state_names``, optionally ``_init_state``, ``_prepare``
    (before any update: global norms) and ``_update``; they say where runs come from with
    ``_runs``."""

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        raise NotImplementedError

    def _init_state(self, p: Tensor, group: dict[str, Any], name: str) -> Tensor:
        return torch.zeros_like(p, memory_format=torch.preserve_format)

    def _runs(self) -> list[tuple[dict[str, Any], Run]]:
        raise NotImplementedError

    def _prepare(self, runs: Sequence[tuple[dict[str, Any], Run]]) -> None:
        """Called once per step with every run, before any update."""

    def _update(self, group: dict[str, Any], run: Run) -> None:
        raise NotImplementedError

    # torch.optim.SGD keeps no step count; the others keep one per parameter.
    counts_steps = True
    _scratch_bufs: Optional[dict[tuple[Any, ...], Tensor]] = None

    def _scratch(self, like: Tensor, slot: int) -> Tensor:
        """A temporary shaped like ``like``, shared by every run (runs update one at a
        time), grown to the largest."""
        if self._scratch_bufs is None:
            self._scratch_bufs = {}
        key = (like.device, like.dtype, slot)
        buf = self._scratch_bufs.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = self._scratch_bufs[key] = torch.empty(
                like.numel(), dtype=like.dtype, device=like.device
            )
        return buf.narrow(0, 0, like.numel()).view(like.shape)

    def _new_state(self, p: Tensor, group: dict[str, Any]) -> bool:
        """Create the missing states of ``p``; True when some were missing."""
        state = self.state[p]
        if self.counts_steps:
            state["step"] = int(state.get("step", 0))  # torch.optim saves a tensor
        fresh = False
        for name in self._state_names(group):
            if name not in state:
                state[name] = self._init_state(p, group, name)
                fresh = True
        return fresh

    def _step_runs(self) -> None:
        runs = self._runs()
        self._prepare(runs)
        for group, run in runs:
            self._update(group, run)
            if self.counts_steps:
                for p in run.params:
                    self.state[p]["step"] += 1

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = closure_loss(closure)
        self._step_runs()
        return loss


class NpuFusedOptimizer(ElementwiseOptimizer):
    """Base of the ``NpuFused*`` optimizers: steps on amp's combined buffers only.

    Outside amp, ``step`` raises Ascend's "should be used with AMP" error; amp's initialize
    accepts them at O1 and O2 only (``is_npu_fused_optimizer``)."""

    is_npu_fused_optimizer = True

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        # The combined states, per param group and segment: (names, {name: buffer}); rebuilt
        # when amp combines again (its generation changes) or a state dict is loaded.
        self._combined_states: Optional[list[list[tuple[tuple[str, ...], dict[str, Tensor]]]]]
        self._combined_states = None
        self._combined_for: Optional[int] = None
        self._fresh: set[int] = set()  # ids of parameters whose states this step created
        self._layout_cache: dict[Any, Tensor] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # torch's load_state_dict ends here with the new state tensors (as do copy.deepcopy
        # and pickle): combine those at the next step.
        super().__setstate__(state)
        self._combined_states, self._combined_for, self._fresh = None, None, set()
        self._layout_cache = {}

    def _combine_states(self, segments: list[list[combined.Segment]]) -> None:
        self._combined_states = []
        for group, segs in zip(self.param_groups, segments):
            names = self._state_names(group)
            per_seg = []
            for seg in segs:
                for p in seg.params:
                    if self._new_state(p, group):
                        self._fresh.add(id(p))
                per_seg.append((names, {n: self._combine_one(seg, n) for n in names}))
            self._combined_states.append(per_seg)

    def _combine_one(self, seg: combined.Segment, name: str) -> Tensor:
        """``state[p][name]`` of every parameter of ``seg`` re-pointed into one buffer laid
        out like ``seg.param`` (checked: an update maps element i of one onto the other)."""
        tensors = []
        for p in seg.params:
            t = self.state[p][name]
            if (
                t.shape != p.shape
                or t.stride() != p.stride()
                or t.dtype != p.dtype
                or t.device != p.device
            ):
                # combine_npu keeps each tensor's strides: give the state the parameter's.
                like = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device)
                t = self.state[p][name] = like.copy_(t)
            tensors.append(t)
        flat = combine_npu(tensors)
        offsets = [t.storage_offset() for t in tensors]
        if flat is None or flat.numel() != seg.param.numel() or offsets != seg.offsets:
            raise RuntimeError(
                f"{type(self).__name__}: the combined {name!r} states are not laid out like "
                f"the combined parameters ({None if flat is None else flat.numel()} elements "
                f"at offsets {offsets[:4]}..., expected {seg.param.numel()} at "
                f"{seg.offsets[:4]}...)"
            )
        return flat

    def _runs(self) -> list[tuple[dict[str, Any], Run]]:
        segments = combined.optimizer_segments(self)  # raises outside amp, as Ascend does
        generation = combined.combined_generation(self)
        stale = (
            self._combined_states is None
            or self._combined_for != generation
            or any(
                names != self._state_names(group)
                for group, segs in zip(self.param_groups, self._combined_states)
                for names, _ in segs
            )
        )
        if stale:
            self._combine_states(segments)
            self._combined_for = generation
            self._layout_cache = {}
        assert self._combined_states is not None
        runs: list[tuple[dict[str, Any], Run]] = []
        for group, segs, states in zip(self.param_groups, segments, self._combined_states):
            for seg, (_, bufs) in zip(segs, states):
                runs.extend((group, run) for run in self._split(seg, bufs))
        self._fresh = set()
        return runs

    def _split(self, seg: combined.Segment, bufs: dict[str, Tensor]) -> Iterator[Run]:
        """The segment as runs of consecutive parameters with one step count and freshness."""
        keys = [(self.state[p].get("step", 0), id(p) in self._fresh) for p in seg.params]
        start = 0
        while start < len(keys):
            end = start + 1
            while end < len(keys) and keys[end] == keys[start]:
                end += 1
            first = seg.offsets[start]
            stop = seg.offsets[end] if end < len(keys) else seg.param.numel()
            length = stop - first
            yield Run(
                param=seg.param.narrow(0, first, length),
                grad=seg.grad.narrow(0, first, length),
                states={n: b.narrow(0, first, length) for n, b in bufs.items()},
                step=keys[start][0] + 1,
                fresh=keys[start][1],
                params=seg.params[start:end],
                offsets=[o - first for o in seg.offsets[start:end]],
                numels=seg.numels[start:end],
                scratch_of=self._scratch,
                cache=self._layout_cache,
            )
            start = end


def one_pass_ready(bufs: Sequence[Tensor]) -> bool:
    """True when amp's compiled kernels can step these combined buffers in place (each
    contiguous, on the kernels' device, the extension loaded): the NpuFused one-pass paths."""
    return all(t.is_contiguous() for t in bufs) and kernel_ops.uses_kernels(bufs)


def global_norm(tensors: list[Tensor]) -> Tensor:
    """The L2 norm of all ``tensors`` together, in three operations whatever their number."""
    norms = torch._foreach_norm(tensors, 2)
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def check_nonnegative(**values: float) -> None:
    """Ascend's "Invalid <what> value" errors, in the order given."""
    words = {"lr": "learning rate", "eps": "epsilon value"}
    for name, value in values.items():
        if value < 0.0:
            what = words.get(name, f"{name} value")
            raise ValueError(f"Invalid {what}: {value}")
