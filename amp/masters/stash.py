"""What amp keeps on each optimizer (``optimizer._amp_stash``): the ``Stage`` of its step -- one
per optimizer per step, as torch's GradScaler keeps one ``OptState`` -- and the fp32 master
weights with the model parameters behind them.

Three paths reach the parameters:

* generic (any ``torch.optim`` optimizer, or optimizer-like object such as ``amp.parallel.LARC``):
  gradients are unscaled into the master gradients (fp32) with a non-finite check; ``step`` runs
  the optimizer on the masters, then copies them into the half model.
* fused, apex-exact (the default for an optimizer with ``_amp_unscaled_step``, i.e.
  ``amp.optimizers``): when ``scale_loss`` exits, one pass writes the unscaled gradients (the
  model's own in place, or fp32 master gradients under O2, views of a buffer kept between steps
  on the CPU: grad_pool.py), checks them and measures their norm
  (``unscale.unscale_one_pass``); ``step`` then runs the optimizer's kernel, which also writes
  the half model copy. Gradients look exactly as with apex between ``scale_loss`` and
  ``step``.
* fused, deferred (opt-in: ``amp.initialize(..., defer_unscale=True)``, or apex's
  ``FusedSGD(materialize_master_grads=False)`` under O2): gradients stay scaled in memory; the
  optimizer checks them read-only and unscales them inside its update kernel. Faster, but code
  that reads or clips gradients between ``scale_loss`` and ``step`` sees scaled values.

The fused paths are used only when they give the generic result: when a second backward pass
with possibly another scale comes before the step, or when gradients already exist before the
backward pass, that step falls back to the generic path.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any, Optional

import torch

from .._device import collective_device
from ..ascend.combined import CombinedGrads
from ..opt_levels import Properties
from .grad_pool import MasterGradPool
from .optimizer_like import DeferredStep, GradNormNote, UnscaledStep

MASTERS_KEY = "amp_master_weights"


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, DeferredStep)


def wants_deferred_unscale(optimizer: Any, props: Properties) -> bool:
    """Deferral is opt-in: ``defer_unscale=True``, or apex's own knob for it, FusedSGD's
    ``materialize_master_grads=False``, when master weights exist (O2)."""
    if props.defer_unscale:
        return True
    return (
        bool(props.master_weights) and getattr(optimizer, "materialize_master_grads", True) is False
    )


class Stage(enum.Enum):
    """Where one optimizer is in amp's step (torch's GradScaler keeps one ``OptState`` per
    optimizer the same way). ``step()`` and the next backward pass act on it:

    * READY -- nothing of amp's in flight: ``step()`` is the optimizer's own (then the masters
      are copied into the model). At initialize, after ``zero_grad``, a step or a failed backward
      pass, and after a ``scale_loss`` exit that unscaled per tensor list (or in one pass or
      combined, for an optimizer without ``_amp_unscaled_step``).
    * SCALED -- after a ``delay_unscale=True`` exit: the gradients hold scaled values; the next
      backward pass adds to them, the next exit unscales them per tensor list.
    * SCALED_FUSED -- the same, for amp's one-pass unscale (a fused optimizer whose gradients
      started from None), or the deferred check.
    * UNSCALED -- amp's one pass or the combined buffers unscaled the gradients for a fused
      optimizer: ``step()`` runs its ``_amp_unscaled_step`` (no closure), then READY.
    * DEFERRED -- the gradients were checked and stay scaled by 1/``inv_scale``: ``step()`` runs
      the optimizer's ``_amp_fused_step`` (no closure), then READY; a further backward pass
      before it unscales them per tensor list first.

    A backward pass's own stage (SCALED or SCALED_FUSED) is ``prepare_backward``'s answer, kept
    by ``scale_loss`` until the exit; the optimizer holds it only between accumulated passes.
    Whether the next ``step()`` is skipped (an overflow) is kept beside the stage
    (``skip_message``): the verdict holds until that step, whatever comes between."""

    READY = "ready"
    SCALED = "scaled"
    SCALED_FUSED = "scaled, for amp's one pass"
    UNSCALED = "unscaled, for the fused step"
    DEFERRED = "checked, still scaled"


ACCUMULATING = (Stage.SCALED, Stage.SCALED_FUSED)
CLOSURE_REFUSED = "amp does not support a closure with a fused optimizer's step"


class OptimizerStash:
    """What amp keeps on an optimizer (``optimizer._amp_stash``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        master_weights: bool,
        defer_unscale: bool = False,
        check_combined: bool = False,
    ) -> None:
        self.master_weights = master_weights
        self.fused = is_fused(optimizer)
        # deferred: grads stay scaled until the optimizer's kernel reads them (opt-in);
        # otherwise a fused optimizer gets apex's unscaled grads from amp's one-pass unscale.
        self.defer_unscale = defer_unscale
        self.unscaled_step = isinstance(optimizer, UnscaledStep)
        # Asked once here: a Protocol's isinstance costs microseconds, too much for every step.
        self.notes_grad_norm = isinstance(optimizer, GradNormNote)
        # model_params[g][i] is the model parameter behind optimizer.param_groups[g]["params"][i]
        # (the same object when no separate master exists).
        self.model_params: list[list[torch.Tensor]] = []
        self.stage = Stage.READY
        self.inv_scale = 1.0  # DEFERRED: the gradients are still scaled by 1/this
        # Per-tensor-list path: the (unscaled) gradients set aside before a backward pass, added
        # back by its unscale.
        self.set_aside: Optional[list[Optional[torch.Tensor]]] = None
        self.skip_message: Optional[str] = None  # the next step() is skipped, with this warning
        # Masters are checked against the model once, at the first backward pass (see
        # sync_masters_once): the model may have changed after initialize.
        self.masters_synced = False
        # The fp32 master gradients' memory under O2 on the CPU, kept between steps.
        self.grad_pool = MasterGradPool()
        # Apex for Ascend's combined gradients (combine_grad / NpuFused optimizers); used while
        # combining(optimizer) holds, built after the first backward pass.
        self.combined = CombinedGrads(check=check_combined)
        self.original_step: Any = optimizer.step
        self.original_zero_grad: Any = optimizer.zero_grad
        self.original_state_dict: Any = optimizer.state_dict
        self.original_load_state_dict: Any = optimizer.load_state_dict
        self.original_add_param_group: Any = optimizer.add_param_group

    def pairs(self, optimizer: torch.optim.Optimizer) -> Iterator[tuple]:
        for group, models in zip(optimizer.param_groups, self.model_params):
            yield from zip(models, group["params"])


def combining(optimizer: Any) -> bool:
    """Whether this optimizer's gradients are combined: Ascend reads the per-optimizer
    attributes at every step, so a script may turn one optimizer's off after initialize
    (``optimizer.accelerate = False``)."""
    stash: OptimizerStash = optimizer._amp_stash
    wanted = bool(getattr(optimizer, "accelerate", False)) or is_npu_fused(optimizer)
    if not wanted and stash.combined.valid:
        stash.combined.reset(quiet=True)  # the gradients stay where they are, as plain tensors
    return wanted


def is_npu_fused(optimizer: Any) -> bool:
    return getattr(optimizer, "is_npu_fused_optimizer", False) is True


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """The parameters the optimizer steps: fp32 masters under O2, the model's own otherwise.

    Use them for gradient clipping: ``torch.nn.utils.clip_grad_norm_(amp.master_params(opt), 1.0)``.
    """
    for group in optimizer.param_groups:
        yield from group["params"]


def separate_pairs(optimizer: torch.optim.Optimizer) -> list[tuple]:
    stash: OptimizerStash = optimizer._amp_stash
    return [(m, p) for m, p in stash.pairs(optimizer) if m is not p]


@torch.no_grad()
def copy_masters_to_model(optimizer: torch.optim.Optimizer) -> None:
    pairs = separate_pairs(optimizer)
    if pairs:
        torch._foreach_copy_([m for m, _ in pairs], [p for _, p in pairs])


@torch.no_grad()
def sync_masters_once(optimizer: torch.optim.Optimizer) -> None:
    """Before the first backward pass: if the half model no longer matches its masters -- weights
    loaded into the model after amp.initialize, or DistributedDataParallel broadcasting rank 0's
    weights -- rebuild the masters from the model (apex builds them lazily for the same reason).
    Under torch.distributed the decision is taken jointly, so every rank keeps identical masters.
    Untouched masters keep their exact fp32 initial values."""
    stash: OptimizerStash = optimizer._amp_stash
    if stash.masters_synced or not stash.master_weights:
        return
    stash.masters_synced = True
    pairs = separate_pairs(optimizer)
    stale = any(not torch.equal(m, p.to(m.dtype)) for m, p in pairs)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # On the model's device when the backend takes it; else where the backend reduces.
        device = collective_device(pairs[0][0].device if pairs else torch.device("cpu"))
        flag = torch.tensor([1.0 if stale else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stale = bool(flag.item() > 0)
    if stale:
        for model_param, master in pairs:
            master.copy_(model_param)
