"""Loss scaling: the scale's state machine and the cross-rank agreement on overflow (the
gradients' unscale and non-finite check are amp/masters/unscale.py's).

The dynamic schedule is ``torch.amp.GradScaler``'s (same arithmetic, float32 scale, growth only when
the grown scale stays finite) plus apex's clamping to ``[min_loss_scale, max_loss_scale]``.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from ._device import collective_device
from .ascend.saturation import OverflowFlag, saturation_flag

_F32_MAX = float(torch.finfo(torch.float32).max)
# The floor of a dynamic scale that has no min_loss_scale: the smallest normal float32. Halving
# past it would reach subnormals, whose reciprocal (the unscale factor) is inf in float32, and
# then 0: every later step would overflow and the run could never recover.
_F32_TINY = float(torch.finfo(torch.float32).tiny)


def _f32(x: float) -> float:
    """Round to the nearest float32, as GradScaler keeps its scale in a float32 tensor."""
    if math.isnan(x):
        return x
    if abs(x) > _F32_MAX * (1 + 2**-24):  # beyond float32 range (after rounding): inf, as in C
        return math.copysign(math.inf, x)
    return torch.tensor(x, dtype=torch.float32).item()


def _one_of(name: str, value: float, default: float, **aliases: Optional[float]) -> float:
    """*value*, or the one alias given instead of it; two spellings of one knob are an error."""
    given = {k: v for k, v in aliases.items() if v is not None}
    if value != default:
        given = {name: value, **given}
    if len(given) > 1:
        raise TypeError(f"LossScaler: {' and '.join(given)} name the same setting; pass one")
    return float(next(iter(given.values()), value))


class LossScaler:
    """One loss's scale: static (a fixed number) or dynamic.

    Dynamic: starts at ``min(max_loss_scale, init_scale)``; multiplied by ``scale_growth_factor``
    after ``scale_window`` consecutive steps with finite gradients and by ``scale_backoff_factor``
    on a step with non-finite gradients (that step is skipped); always clamped to
    ``[min_loss_scale, max_loss_scale]``. Without a ``min_loss_scale`` the scale stops at the
    smallest normal float32 (2**-126) rather than reaching 0 as GradScaler's would after about
    150 consecutive overflows. A static scale never changes and never skips (apex's
    behaviour). The constructor is Apex for Ascend's; NVIDIA apex's positional order differs
    after ``init_scale`` (its third is ``scale_factor``, its fourth ``scale_window``), so pass
    those by keyword.

    ``device_type`` (keyword only; ``amp.initialize`` passes the model's) picks the overflow
    mode once: ``"saturation"`` on an Ascend NPU that saturates instead of producing inf/NaN
    (the device's overflow flag tells an overflow, see amp/ascend/saturation.py), else
    ``"inf_nan"`` (the gradients' non-finite check does); ``mode`` says which.

    Example::

        >>> s = LossScaler("dynamic", init_scale=8.0, scale_window=2)
        >>> s.update(found_inf=False), s.update(found_inf=False), s.loss_scale()
        (False, False, 16.0)
        >>> s.update(found_inf=True), s.loss_scale()  # True: skip this step
        (True, 8.0)
    """

    def __init__(
        self,
        loss_scale: Union[float, str],
        init_scale: float = 2.0**16,
        scale_growth_factor: float = 2.0,
        scale_backoff_factor: float = 0.5,
        scale_window: int = 2000,
        min_loss_scale: Optional[float] = None,
        max_loss_scale: float = 2.0**24,
        *,
        growth_factor: Optional[float] = None,
        backoff_factor: Optional[float] = None,
        scale_factor: Optional[float] = None,
        dynamic_init_scale: Optional[float] = None,
        device_type: Optional[str] = None,
    ) -> None:
        # Apex for Ascend's names and positions (``scale_growth_factor``, ``scale_backoff_factor``
        # third and fourth); as keywords also torch's (``growth_factor``, ``backoff_factor``),
        # NVIDIA apex's ``scale_factor`` (its growth factor) and ``dynamic_init_scale``
        # (``amp.initialize``'s name for ``init_scale``). One value per knob.
        init_scale = _one_of(
            "init_scale", init_scale, 2.0**16, dynamic_init_scale=dynamic_init_scale
        )
        growth_factor = _one_of(
            "scale_growth_factor",
            scale_growth_factor,
            2.0,
            growth_factor=growth_factor,
            scale_factor=scale_factor,
        )
        backoff_factor = _one_of(
            "scale_backoff_factor", scale_backoff_factor, 0.5, backoff_factor=backoff_factor
        )
        self.dynamic = loss_scale == "dynamic"
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._scale_window = int(scale_window)
        self._min_loss_scale = None if min_loss_scale is None else float(min_loss_scale)
        self._max_loss_scale = float(max_loss_scale)
        if self.dynamic:
            self._loss_scale = _f32(min(self._max_loss_scale, float(init_scale)))
        else:
            self._loss_scale = _f32(float(loss_scale))
        self._unskipped = 0  # clean steps since the last change (GradScaler's growth tracker)
        # The last step's verdict (apex's attribute: scripts read it, and set it before
        # calling update_scale() themselves).
        self._has_overflow = False
        # Saturation mode (amp/ascend/saturation.py), chosen once: ``device_type`` is the model's
        # (None: unknown, torch_npu alone decides).
        self._saturation: Optional[OverflowFlag] = saturation_flag(device_type)

    def loss_scale(self) -> float:
        return self._loss_scale

    # --- apex's and Ascend's attribute names, which training scripts use -----------------
    @property
    def _scale_seq_len(self) -> int:
        """apex's name for ``scale_window`` (GAN scripts set it, e.g. to 50)."""
        return self._scale_window

    @_scale_seq_len.setter
    def _scale_seq_len(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"LossScaler._scale_seq_len must be an int >= 1; got {value!r}")
        self._scale_window = value

    @property
    def _is_support_inf_nan(self) -> bool:
        """Ascend's attribute: False when the device saturates (saturation mode)."""
        return self._saturation is None

    def update_scale(self) -> bool:
        """apex's form of ``update``: the verdict is ``self._has_overflow``."""
        return self.update(self._has_overflow)

    def clear_overflow_state(self) -> None:
        self._has_overflow = False

    # --- saturation mode ----------------------------------------------------------------
    @property
    def mode(self) -> str:
        """``"saturation"`` when the device's overflow flag tells overflows (the device
        saturates instead of producing inf/NaN), else ``"inf_nan"``."""
        return "inf_nan" if self._saturation is None else "saturation"

    def clear_device_overflow(self) -> None:
        """Saturation mode, dynamic scale: clear the device's overflow flag before a step's
        backward pass (a static scale never skips, so it never reads the flag, as Ascend)."""
        if self._saturation is not None and self.dynamic:
            self._saturation.clear()

    def device_overflow(self) -> Optional[torch.Tensor]:
        """Saturation mode, dynamic scale: the device's overflow flag after the backward pass
        (a 0/1 float tensor, combined with the gradients' found-inf); None otherwise."""
        if self._saturation is None or not self.dynamic:
            return None
        return self._saturation.read()

    def update(self, found_inf: bool) -> bool:
        """Advance the schedule after one backward pass; True means: skip this step."""
        self._has_overflow = bool(found_inf) and self.dynamic
        if not self.dynamic:
            return False
        if found_inf:
            scale = _f32(self._loss_scale * self._backoff_factor)
            floor = _F32_TINY if self._min_loss_scale is None else self._min_loss_scale
            scale = max(floor, scale)
            self._loss_scale = scale
            self._unskipped = 0
            return True
        self._unskipped += 1
        if self._unskipped == self._scale_window:
            grown = _f32(self._loss_scale * self._growth_factor)
            if math.isfinite(grown):  # GradScaler never grows the scale to inf
                self._loss_scale = min(self._max_loss_scale, grown)
            self._unskipped = 0
        return False

    def state_dict(self) -> dict[str, Union[float, int]]:
        return {"loss_scale": self._loss_scale, "unskipped": self._unskipped}

    def load_state_dict(self, state: dict[str, Union[float, int]]) -> None:
        try:
            scale, unskipped = state["loss_scale"], state["unskipped"]
        except (KeyError, TypeError) as exc:
            raise ValueError(
                "a loss scaler state must be a dict with 'loss_scale' and 'unskipped'; "
                f"got {state!r}"
            ) from exc
        self._loss_scale = float(scale)
        self._unskipped = int(unskipped)


def any_rank_overflowed(found_inf: torch.Tensor) -> bool:
    """True if ``found_inf`` is set here or, under torch.distributed, on any rank of the default
    group: every rank then skips the same step and backs off to the same scale."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # The backend decides where the flag may live (NCCL: CUDA, HCCL: npu, gloo: CPU).
        device = collective_device(found_inf.device)
        flag = found_inf.detach().reshape(1).to(device=device, dtype=torch.float32, copy=True)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)
    return bool(found_inf.item() > 0)
