"""Process-wide amp state, set by ``amp.initialize``: apex's ``_amp_state`` object.

``amp._amp_state`` is this object (as ``apex.amp._amp_state`` is apex's), so training scripts can
log ``_amp_state.loss_scalers[0].loss_scale()`` or read ``_amp_state.opt_properties``;
``from amp._amp_state import _amp_state`` gives the same object."""

from __future__ import annotations

import logging
from typing import Optional

from .casting.o1 import AmpHandle
from .opt_levels import Properties
from .scaler import LossScaler

logger = logging.getLogger("amp")


class AmpState:
    def __init__(self) -> None:
        self.opt_properties: Optional[Properties] = None  # None until amp.initialize runs
        self.loss_scalers: list[LossScaler] = []
        self.verbosity: int = 1
        # apex's other fields, with apex's defaults (amp.initialize sets the scale bounds).
        self.hard_override: bool = False
        self.allow_incoming_model_not_fp32: bool = False
        self.min_loss_scale: Optional[float] = None
        self.max_loss_scale: float = 2.0**24
        # apex's O1 handle (``_amp_state.handle._deactivate()``); an inactive one until an O1
        # amp.initialize makes its own (amp/casting/registry.py; the class: amp/casting/o1.py).
        self.handle: AmpHandle = AmpHandle()

    @property
    def _amp_state(self) -> AmpState:
        # Code written when amp._amp_state was this module reads amp._amp_state._amp_state.
        return self


_amp_state = AmpState()


def maybe_log(message: str, level: int = logging.INFO) -> None:
    """Log when verbosity allows it; under torch.distributed only rank 0 speaks (as apex)."""
    if _amp_state.verbosity < 1:
        return
    import torch.distributed as dist  # noqa: PLC0415 (only when a message is logged)

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    logger.log(level, message)
