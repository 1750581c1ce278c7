"""Saturation mode: the one place amp asks torch_npu how the device reports a float overflow.

Ascend NPUs run in one of two modes, and torch_npu says which:
``torch_npu.npu.utils.is_support_inf_nan()``. True (inf/NaN mode): an overflow gives inf or
NaN, as IEEE 754 says, and amp finds it in the gradients themselves. False (saturation mode,
Atlas training hardware of the first generations): an overflow gives the largest finite value
of its sign, so the gradients are always finite and checking them finds nothing; instead the
device raises an overflow flag, which torch_npu clears with
``torch_npu.npu.clear_npu_overflow_flag()`` and reads with
``torch_npu.npu.get_npu_overflow_flag()``. A torch_npu without ``is_support_inf_nan`` predates
inf/NaN mode: saturation mode, as Apex for Ascend decides too.

torch_npu is looked up among the imported modules, never imported here: code that puts a
model on an ``npu`` device has imported it already, and importing it anywhere else needs
Ascend's CANN toolkit. Without torch_npu, and for models on any other device (CPU, CUDA),
there is no flag: inf/NaN mode. torch_npu's device is recognised by its device module
(``torch.get_device_module(type) is torch_npu.npu``), not by its name: amp names no device
type but the CPU's (tests/amp/test_device_agnostic.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .._torch_compat import get_device_module


@dataclass(frozen=True)
class OverflowFlag:
    """The device's overflow flag: ``clear()`` before a backward pass, ``read()`` after it."""

    clear: Callable[[], Any]
    get: Callable[[], Any]

    def read(self) -> torch.Tensor:
        """The flag as amp's found-inf flags are: a 1-element 0/1 float32 tensor (torch_npu
        returns a Python bool; a tensor is accepted too, and stays on its device)."""
        value = self.get()
        if isinstance(value, torch.Tensor):
            return (value.detach().reshape(-1)[:1] != 0).to(torch.float32)
        return torch.tensor([1.0 if value else 0.0])


def saturation_flag(device_type: Optional[str] = None) -> Optional[OverflowFlag]:
    """The overflow flag when the device saturates (saturation mode), else None (inf/NaN mode).

    ``device_type`` is where the model lives; None when unknown, in which case torch_npu alone
    decides (as in Apex for Ascend, which asks torch_npu whatever the model's device)."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is None:
        return None
    try:
        npu = torch_npu.npu  # its device module (torch.npu once torch_npu is imported)
    except AttributeError:
        return None
    if device_type is not None and not _is_torch_npus(device_type, npu):
        return None
    is_support_inf_nan = getattr(getattr(npu, "utils", None), "is_support_inf_nan", None)
    if is_support_inf_nan is not None and is_support_inf_nan():
        return None
    clear = getattr(npu, "clear_npu_overflow_flag", None)
    get = getattr(npu, "get_npu_overflow_flag", None)
    if clear is None or get is None:
        missing = [
            name
            for name, fn in (("clear_npu_overflow_flag", clear), ("get_npu_overflow_flag", get))
            if fn is None
        ]
        raise RuntimeError(
            "torch_npu reports a saturating device (no inf/NaN support), but torch_npu.npu has "
            f"no {' or '.join(missing)}: amp could not see an overflow, and every overflowed "
            "step would be applied. Install a torch_npu release that matches this torch."
        )
    return OverflowFlag(clear=clear, get=get)


def _is_torch_npus(device_type: str, npu: Any) -> bool:
    """Whether ``device_type`` is the device torch_npu registers: its device module (the one
    torch.autocast and torch.get_device_module find) is torch_npu's ``npu`` module."""
    try:
        return get_device_module(device_type) is npu
    except (AttributeError, RuntimeError, ValueError):  # no module for that type at all
        return False
