"""Optional third-party modules, imported when a command first needs them.

The builder's dependencies are declared (pyproject.toml's ``builder`` extra, pinned by
builder/requirements.lock), but an environment may still lack one -- a hand-made venv, a
distribution's python3-* packages. A module that needs ``rich``, ``jinja2`` or ``pyelftools``
imports it through :func:`require` inside the function that uses it, so that no subcommand's
import breaks another's ``--help``, and the command that does need it stops with one line naming
the distribution to install (exit 2) instead of a traceback.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from builder.errors import ConfigError


def require(module: str, distribution: str, purpose: str) -> ModuleType:
    """``import module``; ConfigError naming *distribution* and *purpose* when it is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but broken: its own traceback is the useful one
        raise ConfigError(
            f"the builder needs {distribution} for {purpose}, and this Python "
            f"({sys.executable}) does not have it; set up the builder's environment "
            "(`make builder-env`, or `python -m builder.lockfile install`)"
        ) from None
