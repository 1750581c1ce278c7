"""Loading the compiled kernels (`amp._C`) safely.

apex's most common failure is a stale binary: "No module named amp_C", or undefined
symbols after torch was upgraded underneath it. Here the extension records the torch
version it was compiled against and which ABI of torch it uses (`__torch_abi__`):

* "unstable" (the pybind11 binding, kernels/bindings.cpp): it loads into that torch only;
* "stable" (kernels/bindings_stable.cpp, torch's stable C ABI): it loads into every torch from
  `__torch_min__` on, whichever one it was compiled against.

`load()` refuses a binary the imported torch cannot use, or one that fails to import, and
returns None after ONE clear warning, so callers use the pure-torch fallback in
amp/kernels/ops.py.

Set AMP_DISABLE_EXTENSION=1 to force the fallback (no warning: it was asked for).

The module holds one build of its kernels per instruction set (generic, AVX2, AVX-512) and
picks the best this CPU runs when imported; AMP_KERNEL_ISA=generic|avx2|avx512 forces one
(tests, benchmarks), and `isa()` / `set_isa()` read and change the choice at run time. A
forced ISA the CPU lacks falls back to the automatic choice with one warning.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from types import ModuleType
from typing import Optional

import torch

__all__ = [
    "AmpExtensionWarning",
    "load",
    "available",
    "reset",
    "isa",
    "set_isa",
    "supported_isas",
    "torch_mismatch",
]


class AmpExtensionWarning(UserWarning):
    """amp._C could not be used; amp runs on its slower pure-torch fallback."""


_UNSET = object()
_lock = threading.Lock()
_cached: object = _UNSET
_MODULE = "amp._C"


def _disabled_by_env() -> bool:
    return os.environ.get("AMP_DISABLE_EXTENSION", "").strip().lower() in ("1", "true", "yes", "on")


def _warn(reason: str) -> None:
    warnings.warn(
        f"amp: compiled kernels unavailable ({reason}); using the pure-torch fallback, "
        "which is correct but slower. Install an ampforge wheel this torch can use (for "
        "torch >= 2.10 the one without a local version, built on torch's stable ABI; for "
        "older torches the one whose local version names it: +torchX.Y), or rebuild from a "
        "checkout with `pip install --no-build-isolation .`.",
        AmpExtensionWarning,
        stacklevel=3,
    )


def _try_load(module_name: str) -> Optional[ModuleType]:
    if _disabled_by_env():
        return None
    try:
        mod = importlib.import_module(module_name)
    except ImportError as exc:  # missing file, or undefined symbols from another torch
        _warn(f"cannot import {module_name}: {exc}")
        return None
    reason = torch_mismatch(mod, torch.__version__)
    if reason:
        _warn(f"{module_name} {reason}")
        return None
    note = getattr(mod, "_isa_note", "")
    if note:  # AMP_KERNEL_ISA named a build this CPU cannot run: the module chose itself
        warnings.warn(
            f"amp: AMP_KERNEL_ISA={os.environ.get('AMP_KERNEL_ISA', '')!r} ignored "
            f"({note}); using the {mod.isa()} kernels",
            AmpExtensionWarning,
            stacklevel=3,
        )
    return mod


def _minor(version: str) -> Optional[tuple[int, int]]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def torch_mismatch(mod: ModuleType, torch_version: str) -> str:
    """Why *mod* (an amp._C) cannot be used with torch *torch_version*; "" when it can."""
    built_for = getattr(mod, "__torch_version__", None)
    if getattr(mod, "__torch_abi__", "unstable") == "stable":
        floor = str(getattr(mod, "__torch_min__", ""))
        have, need = _minor(torch_version), _minor(floor)
        if need is None or have is None or have < need:
            return (
                f"is built on torch's stable ABI for torch >= {floor or '?'}, but torch "
                f"{torch_version} is imported"
            )
        return ""
    if built_for != torch_version:
        return f"was built against torch {built_for}, but torch {torch_version} is imported"
    return ""


def load(module_name: str = _MODULE) -> Optional[ModuleType]:
    """The kernel module, or None (after one warning) when it cannot be used."""
    global _cached
    if _cached is _UNSET:
        with _lock:
            if _cached is _UNSET:
                _cached = _try_load(module_name)
    return _cached  # type: ignore[return-value]


def available() -> bool:
    return load() is not None


def isa() -> Optional[str]:
    """The instruction set of the kernels in use ('generic', 'avx2', 'avx512'), or None
    when the fallback runs."""
    mod = load()
    return None if mod is None else str(mod.isa())


def supported_isas() -> list[str]:
    """The kernel builds this CPU can run, best last ([] when the fallback runs)."""
    mod = load()
    return [] if mod is None else [str(x) for x in mod.supported_isas()]


def set_isa(name: str) -> None:
    """Select the kernels' instruction set: 'auto', 'generic', 'avx2' or 'avx512'.

    Raises ValueError for one this CPU cannot run, RuntimeError when amp._C is not in use."""
    mod = load()
    if mod is None:
        raise RuntimeError("amp: the compiled kernels are not in use; there is no ISA to set")
    mod.set_isa(name)


def reset() -> None:
    """Forget the cached decision (tests; or after changing AMP_DISABLE_EXTENSION)."""
    global _cached
    with _lock:
        _cached = _UNSET
