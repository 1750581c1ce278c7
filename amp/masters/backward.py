"""The backward-pass protocol ``scale_loss`` drives (amp/handle.py): before the backward pass
(``prepare_backward``: which ``Stage`` this step is in), after it (``post_backward``: unscale per
tensor list, in one pass, over the combined buffers, or check for the deferred step; every path
answers with ``unscale.Unscaled``), and after a failed one."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..ascend import ddp
from .stash import ACCUMULATING, OptimizerStash, Stage, combining, separate_pairs, sync_masters_once
from .unscale import Pair, Unscaled, check_deferred, unscale_lists, unscale_one_pass


def accumulating(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's gradients hold scaled values from a ``delay_unscale`` exit."""
    return optimizer._amp_stash.stage in ACCUMULATING


def prepare_backward(optimizer: torch.optim.Optimizer) -> Stage:
    """Before a backward pass whose gradients are not yet in flight: set aside gradients that are
    already unscaled (from an earlier loss), so this pass's scaled gradients start from None.
    Returns the pass's stage, which says how ``post_backward`` will unscale: SCALED (per tensor
    list) or SCALED_FUSED (amp's one pass, or the deferred check)."""
    stash: OptimizerStash = optimizer._amp_stash
    sync_masters_once(optimizer)
    if stash.stage in ACCUMULATING:
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


def _generic_unscale(
    optimizer: torch.optim.Optimizer, inv_scale: float, with_stash: bool
) -> Unscaled:
    stash: OptimizerStash = optimizer._amp_stash
    saved = stash.set_aside if with_stash else None
    pairs: list[Pair] = []
    for i, (model_param, master) in enumerate(stash.pairs(optimizer)):
        pairs.append((model_param, master, None if saved is None else saved[i]))
    result = unscale_lists(pairs, inv_scale, stash.grad_pool)
    stash.set_aside = None
    return result


def post_backward(optimizer: torch.optim.Optimizer, inv_scale: float, stage: Stage) -> Unscaled:
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
        result = unscale_one_pass(stash.pairs(optimizer), inv_scale, stash.grad_pool)
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
        if not combined.build(
            [
                list(zip(models, g["params"]))
                for models, g in zip(stash.model_params, optimizer.param_groups)
            ]
        ):
            return None
    if getattr(optimizer, "combine_ddp", False):
        ddp.all_reduce(combined.model_grad_flats(), optimizer.ddp_replica_count)
    result = combined.unscale(inv_scale)
    # Fused optimizers step from the unscaled gradients and write the half model themselves.
    stash.stage = Stage.UNSCALED if stash.unscaled_step else Stage.READY
    return result


def drop_master_grads(optimizer: Any) -> None:
    """After a step (or a skipped one), as apex: the masters' gradients, which
    model.zero_grad() does not reach, are dropped -- zeroed in their buffer when combined."""
    stash: OptimizerStash = optimizer._amp_stash
    combined = stash.combined
    if combined.valid and combined.master_grads is not None:
        combined.zero_masters_()
        return
    for _, master in separate_pairs(optimizer):
        master.grad = None
