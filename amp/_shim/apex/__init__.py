"""The ``apex`` import name, served by ampforge: code written for NVIDIA apex or Apex for Ascend
runs with its imports unchanged.

Every ``apex.X`` module is the ampforge module itself, not a copy (``apex.amp is amp``,
``apex.amp._amp_state is amp._amp_state``, ``apex.optimizers is amp.optimizers``), so state set
through one name is seen through the other, and names added to ``amp.optimizers`` appear under
``apex.optimizers`` without being listed here.

This package does not live at the top of site-packages: it sits in ``amp/_shim/``, which the
``ampforge-apex.pth`` file of the wheel appends to ``sys.path``. Another distribution's
``apex/`` (NVIDIA apex, Ascend's ``apex`` wheel) is therefore never overwritten by installing
ampforge, nor broken by uninstalling it, and it wins the ``apex`` name while it is installed
(the site directory comes before the paths its ``.pth`` files add); ``import amp`` always
gives ampforge.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Optional

# apex's module -> the ampforge module it is. A submodule of an alias is aliased as well:
# ``apex.amp._amp_state`` is ``amp._amp_state``, ``apex.amp.scaler`` is ``amp.scaler``.
ALIASES = {
    "apex.amp": "amp",
    "apex.optimizers": "amp.optimizers",
    "apex.parallel": "amp.parallel",
    "apex.contrib.combine_tensors": "amp.combine_tensors",
    "apex.dump": "amp.dump",
    "apex.multi_tensor_apply": "amp.multi_tensor_apply",
    "apex.normalization": "amp.normalization",
}


def _target(fullname: str) -> Optional[str]:
    for alias, target in ALIASES.items():
        if fullname == alias or fullname.startswith(alias + "."):
            return target + fullname[len(alias) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already-imported ampforge module instead of executing a new one."""

    def __init__(self, alias: str, target: str) -> None:
        self.alias = alias
        self.target = target
        self._spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just stamped the alias's spec on the module; give it back its
        # own, so that reload, pickling by reference and tracebacks still name amp's file.
        module.__spec__ = self._spec
        # The target's submodules imported with it are aliased now, not on first use: the
        # import system sets a freshly loaded submodule as an attribute of its parent, which
        # would replace what the package binds under that name (``amp._amp_state`` is the
        # state object, ``amp.parallel.LARC`` the class, not their modules).
        prefix = self.target + "."
        for name, loaded in list(sys.modules.items()):
            if name.startswith(prefix):
                sys.modules.setdefault(self.alias + name[len(self.target) :], loaded)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        name = _target(fullname)
        if name is None:
            return None
        if importlib.util.find_spec(name) is None:  # e.g. apex.amp.nonexistent
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, name))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    # First: an alias must never be searched for (and found again, as a copy) on apex's path.
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str) -> Any:
    # apex.amp, apex.optimizers, ... after a bare ``import apex``, imported on first use.
    if f"apex.{name}" in ALIASES or name == "contrib":
        return importlib.import_module(f"apex.{name}")
    raise AttributeError(f"module 'apex' has no attribute {name!r}")
