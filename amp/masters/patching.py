"""``amp.initialize``'s optimizer side: the fp32 masters made, the stash attached, Apex for
Ascend's rules checked, and the patched ``step``/``zero_grad``/``state_dict``/
``load_state_dict``/``add_param_group``, which read the step's ``Stage``."""

from __future__ import annotations

import logging
import types
from typing import Any

import torch

from .._amp_state import maybe_log
from ..ascend.methods import attach_combined_methods
from ..opt_levels import HALF_DTYPES, Properties
from .backward import drop_master_grads
from .stash import (
    CLOSURE_REFUSED,
    MASTERS_KEY,
    OptimizerStash,
    Stage,
    combining,
    copy_masters_to_model,
    is_npu_fused,
    separate_pairs,
    wants_deferred_unscale,
)


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
    stash = OptimizerStash(
        optimizer,
        master_weights,
        wants_deferred_unscale(optimizer, props),
        check_combined=props.check_combined_tensors,
    )
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
                "With opt_level O2, master_weights should be True when npu fused optimizer is used"
            )
    elif props.check_combined_tensors and not props.combine_grad:
        maybe_log(
            "Because combine_grad != True and no npu fused optimizer is used, checking "
            "combined tensors function will not take effect!"
        )


# --- patched optimizer methods ------------------------------------------------------------------


def _step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
    stash: OptimizerStash = self._amp_stash
    if stash.skip_message is not None:
        maybe_log(stash.skip_message, logging.WARNING)
        stash.skip_message = None
        if stash.stage in (Stage.UNSCALED, Stage.DEFERRED):
            stash.stage = Stage.READY  # this step's gradients are not stepped
        drop_master_grads(self)  # not reached by model.zero_grad()
        return None
    if stash.stage is Stage.DEFERRED:
        if closure is not None:  # refused before anything changes: step() may follow
            raise RuntimeError(CLOSURE_REFUSED)
        stash.stage = Stage.READY
        self._amp_fused_step(stash.model_params, stash.inv_scale)
        return None
    if stash.stage is Stage.UNSCALED:
        stash.stage = Stage.READY  # refused after: a plain step() then steps as any optimizer
        if closure is not None:
            raise RuntimeError(CLOSURE_REFUSED)
        self._amp_unscaled_step(stash.model_params)  # also writes the half model copy
        drop_master_grads(self)  # as apex: drop the master grads after a step
        return None
    separate = bool(separate_pairs(self))
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
        drop_master_grads(self)
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
    for model_param, _ in separate_pairs(self):  # the half model's grads too
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
    if separate_pairs(self):
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
        if separate_pairs(self):
            # Saved without amp's masters (e.g. from plain torch): start them from the model.
            with torch.no_grad():
                for model_param, master in separate_pairs(self):
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
