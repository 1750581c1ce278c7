"""``apex.contrib``: of Ascend's contrib modules, ``apex.contrib.combine_tensors`` (which is
``amp.combine_tensors``)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "combine_tensors":
        return importlib.import_module("apex.contrib.combine_tensors")
    raise AttributeError(f"module 'apex.contrib' has no attribute {name!r}")
