"""What amp needs to know about devices, derived from the tensors themselves so that the same
code serves CPU, CUDA and out-of-tree devices (torch's ``PrivateUse1`` backends, such as
Ascend's ``npu`` from torch_npu): amp names no device type except ``"cpu"``, the one device
its compiled kernels (``amp._C``) run on.

* ``kernel_device_ok``: whether tensors on a device may go to ``amp._C``; for any other
  device the pure-torch (``torch._foreach_*``) fallback runs, after one warning per device
  type and process.
* ``collective_device``: where a flag reduced over ``torch.distributed``'s default group has
  to live for that group's backend (NCCL: CUDA only, HCCL: npu only, gloo: CPU).
"""

from __future__ import annotations

import threading
import warnings

import torch

from ._torch_compat import get_device_module

__all__ = ["AmpDeviceFallbackWarning", "collective_device", "kernel_device_ok"]

KERNEL_DEVICE_TYPE = "cpu"


class AmpDeviceFallbackWarning(UserWarning):
    """Tensors on a device other than the CPU: amp's multi-tensor ops (fused optimizers,
    the unscale pass) use the pure-torch fallback there, since ``amp._C`` is CPU code."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def kernel_device_ok(device: torch.device) -> bool:
    """True for CPU tensors (the compiled kernels take them). For any other device: False,
    after warning once per device type (a training loop would otherwise warn every step)."""
    if device.type == KERNEL_DEVICE_TYPE:
        return True
    with _warned_lock:
        first = device.type not in _warned
        _warned.add(device.type)
    if first:
        warnings.warn(
            f"amp: the compiled kernels (amp._C) take CPU tensors only; tensors on "
            f"{device.type} use amp's pure-torch fallback (torch._foreach_* ops on the "
            "device itself), which computes the same float32 arithmetic. Shown once per "
            "device type.",
            AmpDeviceFallbackWarning,
            stacklevel=4,
        )
    return False


def reset_device_warnings() -> None:
    """Forget which device types were warned about (tests)."""
    with _warned_lock:
        _warned.clear()


def _backend_device_types(backend: str) -> list[str]:
    """The device types a process-group backend reduces tensors on. A group given several
    backends ("cpu:gloo,cuda:nccl") lists them itself; a named backend was registered with
    its device types (torch's own, and third-party ones such as torch_npu's "hccl")."""
    if ":" in backend:
        return [part.split(":", 1)[0].strip() for part in backend.split(",") if ":" in part]
    capability = getattr(torch.distributed.Backend, "backend_capability", {})
    return list(capability.get(backend.lower(), []))


def collective_device(device: torch.device) -> torch.device:
    """The device to all-reduce a flag held on ``device`` on, for the default process group.

    ``device`` itself when the backend takes it (a CPU flag under gloo; an accelerator flag
    goes to the current device of its type, as each rank owns one device, the same rule
    that was written for NCCL before); otherwise the current device of the first
    accelerator type the backend takes (a CPU flag under NCCL or HCCL), or the CPU."""
    types = _backend_device_types(str(torch.distributed.get_backend()))
    if not types:  # an unknown backend: hand it the tensor as it is
        return device
    chosen = (
        device.type
        if device.type in types
        else next(
            (t for t in types if t != KERNEL_DEVICE_TYPE and _is_available(t)),
            KERNEL_DEVICE_TYPE if KERNEL_DEVICE_TYPE in types else device.type,
        )
    )
    if chosen == KERNEL_DEVICE_TYPE:
        return torch.device(KERNEL_DEVICE_TYPE)
    module = get_device_module(chosen)
    return torch.device(chosen, module.current_device())


def _is_available(device_type: str) -> bool:
    try:
        return bool(get_device_module(device_type).is_available())
    except (AttributeError, RuntimeError):  # a type named by the backend but not installed
        return False
