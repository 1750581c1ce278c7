"""``amp.scale_loss``: the context manager around ``backward`` that applies the loss scale."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Sequence, Union

import torch

from ._amp_state import _amp_state
from .masters.backward import (
    accumulating,
    keep_scaled,
    post_backward,
    prepare_backward,
    restore_after_failed_backward,
)
from .masters.optimizer_like import check_optimizer_like
from .scaler import any_rank_overflowed

# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]


def _as_amp_optimizers(optimizers: Optimizers) -> list[torch.optim.Optimizer]:
    opts = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
    for opt in opts:
        check_optimizer_like("scale_loss(loss, optimizers): optimizers", opt)
        if not hasattr(opt, "_amp_stash"):
            raise RuntimeError(
                f"scale_loss was given a {type(opt).__name__} that did not go through "
                "amp.initialize; pass the optimizer(s) returned by "
                "amp.initialize(model, optimizer)."
            )
    return opts


@contextlib.contextmanager
def scale_loss(
    loss: torch.Tensor,
    optimizers: Optimizers,
    loss_id: int = 0,
    model: Any = None,
    delay_unscale: bool = False,
    delay_overflow_check: bool = False,
) -> Iterator[torch.Tensor]:
    """Yield ``loss * scale`` for ``backward``; on exit unscale the gradients and check them.

    When the gradients are not finite, the scale backs off and the next ``optimizer.step()`` is
    skipped (parameters and optimizer state untouched). Arguments:

    * ``optimizers`` -- the optimizer(s) (as returned by ``amp.initialize``) owning the parameters
      this loss reaches.
    * ``loss_id`` -- which loss scaler to use, ``0 <= loss_id < num_losses`` (``num_losses`` given
      to ``amp.initialize``): one scaler per loss when several losses are backpropagated.
    * ``model`` -- accepted for apex compatibility; unused.
    * ``delay_unscale`` -- True for all but the last of several backward passes accumulated into
      one step (gradient accumulation): gradients stay scaled until the last pass.
    * ``delay_overflow_check`` -- as in apex (and Apex for Ascend): gradients are unscaled
      when the block exits, but the overflow check is left to the caller -- the scale is not
      updated and the next step is not skipped (no host synchronisation either). For
      optimizers or loops that check gradients themselves.

    With ``combine_grad=True`` (or an ``NpuFused*`` optimizer) the exit is one
    unscale-and-check per gradient buffer instead of one per parameter.

    On an Ascend NPU that saturates instead of producing inf/NaN (saturation mode, see
    ``amp/ascend/saturation.py``) the gradients are always finite: the device's overflow flag is
    cleared when a step's first block is entered and read when its last exits, and a raised
    flag counts as found-inf (skip, backoff, agreement across ranks).

    Example (runs on CPU)::

        >>> import torch, amp
        >>> model = torch.nn.Linear(10, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        >>> model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
        >>> loss = torch.nn.functional.mse_loss(model(torch.randn(4, 10)), torch.randn(4, 1))
        >>> with amp.scale_loss(loss, optimizer) as scaled_loss:
        ...     scaled_loss.backward()
        >>> optimizer.step()
    """
    props = _amp_state.opt_properties
    if props is None:
        raise RuntimeError(
            "amp.scale_loss was called before amp.initialize; call "
            "model, optimizer = amp.initialize(model, optimizer, opt_level=...) first."
        )
    if not props.enabled:
        yield loss
        return
    opts = _as_amp_optimizers(optimizers)
    scalers = _amp_state.loss_scalers
    if not isinstance(delay_overflow_check, bool):
        raise TypeError(f"delay_overflow_check must be True or False; got {delay_overflow_check!r}")
    if isinstance(loss_id, bool) or not isinstance(loss_id, int):
        raise TypeError(f"loss_id must be an int; got {loss_id!r}")
    if not 0 <= loss_id < len(scalers):
        raise ValueError(
            f"loss_id={loss_id} is out of range: amp.initialize was called with "
            f"num_losses={len(scalers)}, so loss_id must be in [0, {len(scalers) - 1}]"
        )
    scaler = scalers[loss_id]
    if not props.master_weights and not scaler.dynamic and scaler.loss_scale() == 1.0:
        # Nothing to scale, nothing to copy (O0, O3): plain fp32 loss, untouched gradients.
        yield loss.float()
        return

    scale = scaler.loss_scale()
    # A step's first backward pass (not one more accumulated with delay_unscale): in
    # saturation mode the device's overflow flag starts clear, so that reading it at the
    # step's last exit covers every backward pass of the step and nothing before them.
    first_pass = not any(accumulating(opt) for opt in opts)
    stages = [prepare_backward(opt) for opt in opts]
    if first_pass:
        scaler.clear_device_overflow()
    try:
        yield loss.float() * scale
    except BaseException:
        for opt in opts:
            restore_after_failed_backward(opt)
        raise
    if delay_unscale:
        for opt, stage in zip(opts, stages):
            keep_scaled(opt, stage)
        return
    # Read before the unscale: the flag answers for the backward passes alone.
    saturated = None if delay_overflow_check else scaler.device_overflow()
    flags = [post_backward(opt, 1.0 / scale, stage).found_inf() for opt, stage in zip(opts, stages)]
    if delay_overflow_check:
        return
    if saturated is not None:
        flags.append(saturated)  # one more found-inf: the same skip, backoff and agreement
    found_inf = (
        flags[0]
        if len(flags) == 1
        else torch.stack([f.reshape(1).to(flags[0].device) for f in flags]).amax()
    )
    if scaler.update(any_rank_overflowed(found_inf)):
        message = (
            f"Gradient overflow.  Skipping step, loss scaler {loss_id} reducing loss scale to "
            f"{scaler.loss_scale()}"
        )
        for opt in opts:
            opt._amp_stash.skip_message = message
