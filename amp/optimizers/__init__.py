"""Fused optimizers (apex.optimizers signatures) backed by amp._C.

Usable standalone like torch.optim, and under ``amp.initialize`` at every opt level,
where the loss scaler's unscale, non-finite check and optional clipping are fused into
the step (see ``_amp_grads_nonfinite`` / ``_amp_fused_step``).
"""
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB
from .fused_sgd import FusedSGD

__all__ = ["FusedAdam", "FusedLAMB", "FusedSGD"]
