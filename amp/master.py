"""Optimizer side of amp: fp32 master weights, the per-optimizer stash that ``scale_loss`` uses, and
the patched ``step``/``zero_grad``/``state_dict``/``load_state_dict``/``add_param_group``.

Three paths reach the parameters:

* generic (any ``torch.optim`` optimizer, or optimizer-like object such as ``amp.parallel.LARC``):
  gradients are unscaled into the master gradients (fp32) with a non-finite check; ``step`` runs
  the optimizer on the masters, then copies them into the half model.
* fused, apex-exact (the default for an optimizer with ``_amp_unscaled_step``, i.e.
  ``amp.optimizers``): when ``scale_loss`` exits, one pass writes the unscaled gradients (the
  model's own in place, or fresh fp32 master gradients under O2), checks them and measures their
  norm (``unscale.unscale_one_pass``); ``step`` then runs the optimizer's kernel, which also
  writes the half model copy. Gradients look exactly as with apex between ``scale_loss`` and
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
import logging
import types
from collections.abc import Iterator
from typing import Any, Optional

import torch

from ._amp_state import maybe_log
from ._device import collective_device
from .ascend import ddp
from .ascend.combined import CombinedGrads
from .ascend.methods import attach_combined_methods
from .opt_levels import HALF_DTYPES, Properties
from .optimizer_like import DeferredStep, GradNormNote, UnscaledStep
from .unscale import Pair, Unscaled, check_deferred, unscale_lists, unscale_one_pass

MASTERS_KEY = "amp_master_weights"


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, DeferredStep)


def wants_deferred_unscale(optimizer: Any, props: Properties) -> bool:
    """Deferral is opt-in: ``defer_unscale=True``, or apex's own knob for it, FusedSGD's
    ``materialize_master_grads=False``, when master weights exist (O2)."""
    if props.defer_unscale:
        return True
    return bool(props.master_weights) and getattr(optimizer, "materialize_master_grads", True) \
        is False


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


_ACCUMULATING = (Stage.SCALED, Stage.SCALED_FUSED)
_CLOSURE_REFUSED = "amp does not support a closure with a fused optimizer's step"


class OptimizerStash:
    """What amp keeps on an optimizer (``optimizer._amp_stash``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, master_weights: bool,
                 defer_unscale: bool = False, check_combined: bool = False) -> None:
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


def _make_masters(
    group: dict[str, Any], optimizer: torch.optim.Optimizer, fp32_sources: dict[int, torch.Tensor]
) -> list[torch.Tensor]:
    """Swap each half parameter of ``group`` for an fp32 master; return the model parameters."""
    models = list(group["params"])
    masters: list[torch.Tensor] = []
    for param in models:
        if param.dtype in HALF_DTYPES:
            source = fp32_sources.get(id(param))
            if source is None:
                source = param.detach().float()
            master = source.detach().clone().to(torch.float32)
            master.requires_grad_(param.requires_grad)
            if param in optimizer.state:  # carry existing optimizer state over to the master
                optimizer.state[master] = optimizer.state.pop(param)
            masters.append(master)
        else:
            masters.append(param)
    group["params"] = masters
    return models


def process_optimizer(
    optimizer: torch.optim.Optimizer, props: Properties, fp32_sources: dict[int, torch.Tensor]
) -> None:
    """Attach amp's stash to ``optimizer`` and patch its methods (once per optimizer)."""
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError(
            "An optimizer may be passed through amp.initialize only once; create a new optimizer "
            "for a new amp.initialize call."
        )
    check_ascend_rules(optimizer, props)
    master_weights = bool(props.master_weights)
    stash = OptimizerStash(optimizer, master_weights, wants_deferred_unscale(optimizer, props),
                           check_combined=props.check_combined_tensors)
    # Ascend's per-optimizer switches, read at every step (scripts change them after initialize).
    optimizer.accelerate = props.combine_grad
    optimizer.check_combined_tensors = props.check_combined_tensors
    optimizer.combine_ddp = props.combine_ddp
    optimizer.ddp_replica_count = props.ddp_replica_count
    if not is_npu_fused(optimizer):
        optimizer.is_npu_fused_optimizer = False
    had_state = len(optimizer.state) > 0
    for group in optimizer.param_groups:
        if master_weights:
            stash.model_params.append(_make_masters(group, optimizer, fp32_sources))
        else:
            stash.model_params.append(list(group["params"]))
    if had_state:
        # Recast preexisting per-parameter state to the new parameter types (apex's trick).
        optimizer.load_state_dict(optimizer.state_dict())
    optimizer._amp_stash = stash
    optimizer.step = types.MethodType(_step, optimizer)
    optimizer.zero_grad = types.MethodType(_zero_grad, optimizer)
    optimizer.state_dict = types.MethodType(_state_dict, optimizer)
    optimizer.load_state_dict = types.MethodType(_load_state_dict, optimizer)
    optimizer.add_param_group = types.MethodType(_add_param_group, optimizer)
    attach_combined_methods(optimizer)


def check_ascend_rules(optimizer: Any, props: Properties) -> None:
    """Apex for Ascend's rules for combining, with its messages."""
    o2 = props.opt_level == "O2"
    if o2 and props.combine_grad and props.master_weights is not True:
        raise RuntimeError(
            "With opt_level O2, master_weights should be True when combine_grad is True"
        )
    if is_npu_fused(optimizer):
        maybe_log("Use npu fused optimizer")
        if props.opt_level not in ("O1", "O2"):
            raise RuntimeError(
                "Currently, npu fused optimizer can only be used when opt_level='O1' or "
                "opt_level='O2'"
            )
        if o2 and props.master_weights is not True:
            raise RuntimeError(
                "With opt_level O2, master_weights should be True when npu fused optimizer is "
                "used"
            )
    elif props.check_combined_tensors and not props.combine_grad:
        maybe_log(
            "Because combine_grad != True and no npu fused optimizer is used, checking "
            "combined tensors function will not take effect!"
        )


def _separate_pairs(optimizer: torch.optim.Optimizer) -> list[tuple]:
    stash: OptimizerStash = optimizer._amp_stash
    return [(m, p) for m, p in stash.pairs(optimizer) if m is not p]


@torch.no_grad()
def copy_masters_to_model(optimizer: torch.optim.Optimizer) -> None:
    pairs = _separate_pairs(optimizer)
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
    pairs = _separate_pairs(optimizer)
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


# --- the backward-pass protocol used by scale_loss --------------------------------------------


def accumulating(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's gradients hold scaled values from a ``delay_unscale`` exit."""
    return optimizer._amp_stash.stage in _ACCUMULATING


def prepare_backward(optimizer: torch.optim.Optimizer) -> Stage:
    """Before a backward pass whose gradients are not yet in flight: set aside gradients that are
    already unscaled (from an earlier loss), so this pass's scaled gradients start from None.
    Returns the pass's stage, which says how ``post_backward`` will unscale: SCALED (per tensor
    list) or SCALED_FUSED (amp's one pass, or the deferred check)."""
    stash: OptimizerStash = optimizer._amp_stash
    sync_masters_once(optimizer)
    if stash.stage in _ACCUMULATING:
        return stash.stage  # accumulating with delay_unscale: keep adding scaled grads
    if combining(optimizer) and stash.combined.still_valid():
        # Gradients accumulate into the buffers; unscaled ones already there are set aside.
        stash.combined.save_existing()
        stash.stage = Stage.READY
        return Stage.SCALED
    if stash.stage is Stage.DEFERRED:
        # A second loss before the step: the fused path's still-scaled grads are unscaled now.
        _generic_unscale(optimizer, stash.inv_scale, with_stash=False)
    stash.stage = Stage.READY  # grads already unscaled now count as existing grads
    pairs = list(stash.pairs(optimizer))
    has_grads = any(m.grad is not None or p.grad is not None for m, p in pairs)
    if stash.fused and not has_grads:
        return Stage.SCALED_FUSED
    saved: list[Optional[torch.Tensor]] = []
    for model_param, master in pairs:
        saved.append(master.grad)
        master.grad = None
        model_param.grad = None
    stash.set_aside = saved if any(s is not None for s in saved) else None
    return Stage.SCALED


def keep_scaled(optimizer: torch.optim.Optimizer, stage: Stage) -> None:
    """A ``delay_unscale`` exit: the gradients stay scaled, and the next backward pass adds to
    them (``stage``: what ``prepare_backward`` answered for the first pass)."""
    optimizer._amp_stash.stage = stage


def restore_after_failed_backward(optimizer: torch.optim.Optimizer) -> None:
    """The backward pass raised: put set-aside gradients back, drop the partial ones."""
    stash: OptimizerStash = optimizer._amp_stash
    if stash.set_aside is not None:
        for (model_param, master), saved in zip(stash.pairs(optimizer), stash.set_aside):
            if model_param is not master:
                model_param.grad = None
            master.grad = saved
    stash.set_aside = None
    stash.stage = Stage.READY


def _generic_unscale(optimizer: torch.optim.Optimizer, inv_scale: float, with_stash: bool
                     ) -> Unscaled:
    stash: OptimizerStash = optimizer._amp_stash
    saved = stash.set_aside if with_stash else None
    pairs: list[Pair] = []
    for i, (model_param, master) in enumerate(stash.pairs(optimizer)):
        pairs.append((model_param, master, None if saved is None else saved[i]))
    result = unscale_lists(pairs, inv_scale)
    stash.set_aside = None
    return result


def post_backward(optimizer: torch.optim.Optimizer, inv_scale: float, stage: Stage
                  ) -> Unscaled:
    """After the last backward pass before a step (``stage``: ``prepare_backward``'s answer for
    it): unscale (per tensor list, one pass, combined) or check (deferred) the gradients."""
    stash: OptimizerStash = optimizer._amp_stash
    stash.stage = Stage.READY
    if combining(optimizer):
        combined = _post_backward_combined(optimizer, inv_scale)
        if combined is not None:
            return combined
    if stage is Stage.SCALED_FUSED and stash.defer_unscale:
        result = check_deferred(optimizer, stash.model_params, inv_scale)
        stash.stage, stash.inv_scale = Stage.DEFERRED, inv_scale
        return result
    if stage is Stage.SCALED_FUSED:
        result = unscale_one_pass(stash.pairs(optimizer), inv_scale)
        if stash.notes_grad_norm:
            optimizer._amp_note_grad_norm(result.norm, result.grads)
        stash.stage = Stage.UNSCALED if stash.unscaled_step else Stage.READY
        return result
    return _generic_unscale(optimizer, inv_scale, with_stash=True)


def _post_backward_combined(optimizer: Any, inv_scale: float) -> Optional[Unscaled]:
    """The combined path: (combine after the first backward pass,) all-reduce the model
    gradients in buckets under combine_ddp, then one unscale-and-check over every buffer.
    None when this pass must take the per-parameter path (gradients set aside before it
    could be combined: they are combined after a zero_grad)."""
    stash: OptimizerStash = optimizer._amp_stash
    combined = stash.combined
    if not combined.still_valid():
        if stash.set_aside is not None:
            return None
        if not combined.build([list(zip(models, g["params"])) for models, g in
                               zip(stash.model_params, optimizer.param_groups)]):
            return None
    if getattr(optimizer, "combine_ddp", False):
        ddp.all_reduce(combined.model_grad_flats(), optimizer.ddp_replica_count)
    result = combined.unscale(inv_scale)
    # Fused optimizers step from the unscaled gradients and write the half model themselves.
    stash.stage = Stage.UNSCALED if stash.unscaled_step else Stage.READY
    return result


def _drop_master_grads(optimizer: Any) -> None:
    """After a step (or a skipped one), as apex: the masters' gradients, which
    model.zero_grad() does not reach, are dropped -- zeroed in their buffer when combined."""
    stash: OptimizerStash = optimizer._amp_stash
    combined = stash.combined
    if combined.valid and combined.master_grads is not None:
        combined.zero_masters_()
        return
    for _, master in _separate_pairs(optimizer):
        master.grad = None


# --- patched optimizer methods ------------------------------------------------------------------


def _step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
    stash: OptimizerStash = self._amp_stash
    if stash.skip_message is not None:
        maybe_log(stash.skip_message, logging.WARNING)
        stash.skip_message = None
        if stash.stage in (Stage.UNSCALED, Stage.DEFERRED):
            stash.stage = Stage.READY  # this step's gradients are not stepped
        _drop_master_grads(self)  # not reached by model.zero_grad()
        return None
    if stash.stage is Stage.DEFERRED:
        if closure is not None:  # refused before anything changes: step() may follow
            raise RuntimeError(_CLOSURE_REFUSED)
        stash.stage = Stage.READY
        self._amp_fused_step(stash.model_params, stash.inv_scale)
        return None
    if stash.stage is Stage.UNSCALED:
        stash.stage = Stage.READY  # refused after: a plain step() then steps as any optimizer
        if closure is not None:
            raise RuntimeError(_CLOSURE_REFUSED)
        self._amp_unscaled_step(stash.model_params)  # also writes the half model copy
        _drop_master_grads(self)  # as apex: drop the master grads after a step
        return None
    separate = bool(_separate_pairs(self))
    if closure is not None and separate:
        raise RuntimeError(
            "amp does not support optimizer.step(closure) with master weights (O2); call "
            "step() without a closure."
        )
    result = stash.original_step() if closure is None else stash.original_step(closure)
    if separate:
        combined = stash.combined
        if not combined.valid or not combined.copy_masters_to_model():
            copy_masters_to_model(self)
        # As apex: drop the master grads, which model.zero_grad() would not reach.
        _drop_master_grads(self)
    return result


def _zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    stash: OptimizerStash = self._amp_stash
    if combining(self) and stash.combined.still_valid():
        # Combined: in place whatever set_to_none says (as Ascend), one op per buffer, so
        # autograd keeps accumulating into the buffers.
        stash.combined.zero_()
        stash.stage = Stage.READY
        return
    stash.original_zero_grad(set_to_none)
    for model_param, _ in _separate_pairs(self):  # the half model's grads too
        if set_to_none:
            model_param.grad = None
        elif model_param.grad is not None:
            model_param.grad.detach_().zero_()
    stash.stage = Stage.READY
    stash.set_aside = None


def _state_dict(self: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict plus, under master weights, the fp32 masters themselves, so a
    resumed run continues exactly (the model's half weights alone have lost precision)."""
    stash: OptimizerStash = self._amp_stash
    state = stash.original_state_dict()
    if _separate_pairs(self):
        state[MASTERS_KEY] = [
            [None if m is p else p.detach() for m, p in zip(models, group["params"])]
            for models, group in zip(stash.model_params, self.param_groups)
        ]
    return state


def _load_state_dict(self: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    stash: OptimizerStash = self._amp_stash
    state_dict = dict(state_dict)
    masters = state_dict.pop(MASTERS_KEY, None)
    stash.original_load_state_dict(state_dict)
    stash.masters_synced = True  # from here on the masters below are authoritative
    if masters is None:
        if _separate_pairs(self):
            # Saved without amp's masters (e.g. from plain torch): start them from the model.
            with torch.no_grad():
                for model_param, master in _separate_pairs(self):
                    master.copy_(model_param)
        return
    shape = [len(g["params"]) for g in self.param_groups]
    if [len(g) for g in masters] != shape:
        raise ValueError(
            f"optimizer state_dict[{MASTERS_KEY!r}] has groups of sizes "
            f"{[len(g) for g in masters]}, this optimizer has {shape}"
        )
    with torch.no_grad():
        for saved_group, group in zip(masters, self.param_groups):
            for saved, master in zip(saved_group, group["params"]):
                if saved is not None:
                    master.copy_(saved)
    copy_masters_to_model(self)


def _add_param_group(self: torch.optim.Optimizer, param_group: dict[str, Any]) -> None:
    stash: OptimizerStash = self._amp_stash
    stash.original_add_param_group(param_group)
    stash.combined.reset(quiet=True)  # combined again, new group included, after a backward
    group = self.param_groups[-1]
    if stash.master_weights:
        stash.model_params.append(_make_masters(group, self, {}))
    else:
        stash.model_params.append(list(group["params"]))
