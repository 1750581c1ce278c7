"""Loading the compiled kernels (`amp._C`) safely.

apex's most common failure is a stale binary: "No module named amp_C", or undefined
symbols after torch was upgraded underneath it. Here the extension records the torch
version it was compiled against; `load()` refuses a binary built for another torch, or
one that fails to import, and returns None after ONE clear warning, so callers use the
pure-torch fallback in amp/multi_tensor.py.

Set AMP_DISABLE_EXTENSION=1 to force the fallback (no warning: it was asked for).
"""
from __future__ import annotations

import importlib
import os
import threading
import warnings
from types import ModuleType
from typing import Optional

import torch

__all__ = ["AmpExtensionWarning", "load", "available", "reset"]


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
        "which is correct but slower. Install an ampforge wheel built for this torch "
        "(its local version says which: +torchX.Y), or rebuild from a checkout with "
        "`pip install --no-build-isolation .`.",
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
    built_for = getattr(mod, "__torch_version__", None)
    if built_for != torch.__version__:
        _warn(f"{module_name} was built against torch {built_for}, but torch "
              f"{torch.__version__} is imported")
        return None
    return mod


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


def reset() -> None:
    """Forget the cached decision (tests; or after changing AMP_DISABLE_EXTENSION)."""
    global _cached
    with _lock:
        _cached = _UNSET
