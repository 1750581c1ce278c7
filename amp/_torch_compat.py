"""What amp uses of torch that older torch lines (2.1 to 2.7, the ones Ascend's torch_npu users
run) do not have: each difference is detected here, once, by looking for the feature itself
(never by comparing version numbers), and answered with the fallback apex used before torch had
the feature. Nothing else in amp asks which torch it runs on.

* ``get_device_module(type)``: ``torch.get_device_module`` (torch >= 2.3); before it, a device
  backend registers its module as ``torch.<type>`` (torch.cuda, torch_npu's torch.npu).
* ``current_accelerator()``: ``torch.accelerator`` (torch >= 2.6); before it, CUDA when it is
  available, else the ``PrivateUse1`` backend (torch_npu's npu) when its module says it is.
* ``is_autocast_enabled(type)``: torch >= 2.4 takes the device type; before it, one function per
  device (``is_autocast_cpu_enabled``, ``is_autocast_enabled`` for CUDA, and the backend
  module's own for a PrivateUse1 device, as torch.autocast itself calls it there).
* ``autocast_supports(type, dtype)``: torch 2.1's CPU autocast takes bfloat16 only (float16 from
  2.2 on); asked by entering autocast once per (type, dtype).
* ``half_matmul_supported(type)``: torch 2.1's CPU has no float16 matmul ("addmm_impl_cpu_" not
  implemented for 'Half'); asked by running one 1x1 matmul once per device type.
* ``non_finite_check_and_unscale_``: GradScaler's fused kernel
  (``torch._amp_foreach_non_finite_check_and_unscale_``) has a CPU kernel from torch 2.3 on;
  where a device lacks it, the same arithmetic unfused (the first NotImplementedError per
  device type decides, the answer is kept).
* ``foreach_bumps_versions(type)``: an in-place foreach op (``torch._foreach_mul_``, which
  ``clip_grad_norm_`` uses) bumps its tensors' version counters from the autograd layer on
  newer torches; torch 2.1 has none for foreach ops, so there only a device whose foreach kernel
  runs per-tensor ops bumps them (the CPU's), not one with kernels of its own (CUDA's, an
  NPU's). Asked by running one such op once per device type.
* ``foreach_norm_takes_dtype()``: ``torch._foreach_norm(..., dtype=)`` (torch >= 2.3), which
  accumulates and returns each norm in that dtype; before it, a caller that wants float64 norms
  makes float64 copies first. Asked by one call, once.
* ``grad_scaler_class()``: ``torch.amp.GradScaler`` (torch >= 2.3; it takes a device type); None
  before it, where torch's only scaler is CUDA's.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional

import torch

__all__ = [
    "autocast_supports",
    "current_accelerator",
    "foreach_bumps_versions",
    "foreach_norm_takes_dtype",
    "get_device_module",
    "HalfUnsupportedError",
    "check_half_support",
    "grad_scaler_class",
    "half_matmul_supported",
    "is_autocast_enabled",
    "non_finite_check_and_unscale_",
    "unscale_unfused_",
]

_lock = threading.Lock()
_autocast_answers: dict[tuple[str, torch.dtype], bool] = {}
_matmul_answers: dict[tuple[str, torch.dtype], bool] = {}
_unfused_unscale: set = set()  # device types whose torch lacks the fused unscale kernel
_foreach_version_answers: dict[str, bool] = {}
_norm_dtype_answer: list[bool] = []  # empty until asked


def get_device_module(device_type: str) -> Any:
    """torch's module for a device type (torch.cuda, torch.npu, ...); RuntimeError when there
    is none, as ``torch.get_device_module`` raises."""
    find = getattr(torch, "get_device_module", None)
    if find is not None:
        return find(device_type)
    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "is_available"):
        raise RuntimeError(
            f"Device '{device_type}' does not have a corresponding module "
            "registered as 'torch.{device_type}'."
        )
    return module


def _privateuse1_type() -> Optional[str]:
    name = torch._C._get_privateuse1_backend_name()
    return None if name == "privateuseone" else name  # not renamed: no backend installed


def current_accelerator() -> Optional[str]:
    """The device type of the accelerator this process uses (None: the CPU only)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        if not accelerator.is_available():
            return None
        current = accelerator.current_accelerator()
        return None if current is None else current.type
    if torch.cuda.is_available():
        return "cuda"
    backend = _privateuse1_type()
    if backend is not None:
        try:
            if get_device_module(backend).is_available():
                return backend
        except RuntimeError:  # renamed, but its module is not registered (yet)
            return None
    return None


def is_autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` in this thread."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument; one function per device
        pass
    if device_type == "cpu":
        return bool(torch.is_autocast_cpu_enabled())
    # A PrivateUse1 backend's module has its own (torch.autocast calls it there); for CUDA,
    # torch's own argument-less function is the one.
    module_flag: Optional[Callable[[], bool]] = getattr(
        _module_or_none(device_type), "is_autocast_enabled", None
    )
    if module_flag is not None and device_type == _privateuse1_type():
        return bool(module_flag())
    return bool(torch.is_autocast_enabled())


def _module_or_none(device_type: str) -> Any:
    try:
        return get_device_module(device_type)
    except RuntimeError:
        return None


def autocast_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast(device_type, dtype=dtype)`` runs (rather than warning that it
    disables itself, or refusing the dtype, as torch 2.1's CPU autocast does for float16)."""
    key = (device_type, dtype)
    with _lock:
        known = _autocast_answers.get(key)
    if known is not None:
        return known
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "... Disabling autocast." is a warning
            with torch.autocast(device_type, dtype=dtype):
                ok = is_autocast_enabled(device_type)
    except (RuntimeError, UserWarning, ValueError):
        ok = False
    with _lock:
        _autocast_answers[key] = ok
    return ok


def half_matmul_supported(device_type: str, dtype: torch.dtype = torch.float16) -> bool:
    """Whether ``device_type`` multiplies matrices of ``dtype`` (torch 2.1's CPU: not float16)."""
    key = (device_type, dtype)
    with _lock:
        known = _matmul_answers.get(key)
    if known is not None:
        return known
    try:
        one = torch.ones(1, 1, dtype=dtype, device=device_type)
        torch.mm(one, one)
        ok = True
    except (RuntimeError, NotImplementedError):
        ok = False
    with _lock:
        _matmul_answers[key] = ok
    return ok


def foreach_bumps_versions(device_type: str) -> bool:
    """Whether an in-place foreach op on ``device_type`` bumps its tensors' ``_version`` (what
    tells amp that gradients were rewritten in place, e.g. clipped, since it measured them)."""
    with _lock:
        known = _foreach_version_answers.get(device_type)
    if known is not None:
        return known
    probe = torch.zeros(1, device=device_type)
    before = probe._version
    torch._foreach_mul_([probe], 1.0)
    ok = probe._version != before
    with _lock:
        _foreach_version_answers[device_type] = ok
    return ok


def foreach_norm_takes_dtype() -> bool:
    """Whether ``torch._foreach_norm`` takes ``dtype`` (the accumulator and result dtype)."""
    if _norm_dtype_answer:
        return _norm_dtype_answer[0]
    try:
        torch._foreach_norm([torch.zeros(1)], 2, dtype=torch.float64)
        ok = True
    except (TypeError, RuntimeError):  # torch < 2.3: no such argument
        ok = False
    with _lock:
        _norm_dtype_answer[:] = [ok]
    return ok


class HalfUnsupportedError(RuntimeError):
    """The model's device cannot compute the half type amp was asked for, in this torch."""


def check_half_support(
    device_type: str, dtype: torch.dtype, *, autocast: bool, matmul: bool
) -> None:
    """Raise HalfUnsupportedError when ``device_type`` lacks what an opt level needs for
    ``dtype`` here: autocast to it (O1) or its matrix products (a model cast to it, O2/O3).
    Said before training starts, rather than as torch's error from inside the first forward."""
    lacking = []
    if autocast and not autocast_supports(device_type, dtype):
        lacking.append(f"autocast to {dtype}")
    if matmul and not half_matmul_supported(device_type, dtype):
        lacking.append(f"{dtype} matrix products")
    if lacking:
        raise HalfUnsupportedError(
            f"amp: torch {torch.__version__} has no {' and no '.join(lacking)} on "
            f"'{device_type}', which this opt level needs for the model there. Pass "
            "half_dtype=torch.bfloat16, or move the model to the device it trains on (an "
            "NPU, a GPU) before amp.initialize."
        )


def non_finite_check_and_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """GradScaler's unscale: each gradient times ``inv_scale`` in place, ``found_inf`` set to 1
    when any is not finite. Fused where the device has torch's kernel, else unfused (the same
    float32 arithmetic: the product of each element and the float32 reciprocal, rounded once)."""
    device_type = found_inf.device.type
    if device_type not in _unfused_unscale:
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
            return
        except NotImplementedError:  # no kernel for this device in this torch
            with _lock:
                _unfused_unscale.add(device_type)
    unscale_unfused_(grads, found_inf, inv_scale)


def unscale_unfused_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """The arithmetic of torch's fused unscale, one gradient at a time."""
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        g.copy_((g.float() * inv_scale).to(g.dtype))


def grad_scaler_class() -> Optional[type]:
    """``torch.amp.GradScaler`` (it takes the device type), or None where torch has none that
    runs off CUDA (torch < 2.3)."""
    amp_module = getattr(torch, "amp", None)
    return getattr(amp_module, "GradScaler", None)
