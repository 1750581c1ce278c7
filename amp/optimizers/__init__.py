"""Fused optimizers (apex.optimizers signatures) backed by amp._C, and Apex for Ascend's
``NpuFused*`` optimizers and ``Lamb`` (``combined_buffers``: one update per combined buffer).

Usable standalone like torch.optim, and under ``amp.initialize`` at every opt level. By
default amp unscales the gradients when ``scale_loss`` exits (apex's behaviour) in one pass
that also checks them and measures their norm, and the step writes the half model copy
(see ``_amp_unscaled_step``); with ``amp.initialize(..., defer_unscale=True)`` the unscale
happens inside the step instead (``_amp_grads_nonfinite`` / ``_amp_fused_step``).
"""

from .fused_adagrad import FusedAdagrad
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB
from .fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from .fused_novograd import FusedNovoGrad
from .fused_sgd import FusedSGD
from .lamb import Lamb, NpuFusedLamb
from .npu_fused_adam import NpuFusedAdam, NpuFusedAdamP, NpuFusedAdamW, NpuFusedBertAdam
from .npu_fused_sgd import NpuFusedAdadelta, NpuFusedRMSprop, NpuFusedRMSpropTF, NpuFusedSGD

__all__ = [
    "FusedAdagrad",
    "FusedAdam",
    "FusedLAMB",
    "FusedMixedPrecisionLamb",
    "FusedNovoGrad",
    "FusedSGD",
    "Lamb",
    "NpuFusedAdadelta",
    "NpuFusedAdam",
    "NpuFusedAdamP",
    "NpuFusedAdamW",
    "NpuFusedBertAdam",
    "NpuFusedLamb",
    "NpuFusedRMSprop",
    "NpuFusedRMSpropTF",
    "NpuFusedSGD",
]
