"""Process-wide amp state, set by ``amp.initialize`` (apex keeps the same singleton)."""
from __future__ import annotations

import logging
from typing import Optional

from .opt_levels import Properties
from .scaler import LossScaler

logger = logging.getLogger("amp")


class AmpState:
    def __init__(self) -> None:
        self.opt_properties: Optional[Properties] = None  # None until amp.initialize runs
        self.loss_scalers: list[LossScaler] = []
        self.verbosity: int = 1


_amp_state = AmpState()


def maybe_log(message: str, level: int = logging.INFO) -> None:
    """Log when verbosity allows it; under torch.distributed only rank 0 speaks (as apex)."""
    if _amp_state.verbosity < 1:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    logger.log(level, message)
