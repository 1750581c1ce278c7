"""What the project being built can be installed on: its ``requires-python`` and its torch bound.

A cell outside them would fail mid-build (pip refuses to install the project on that Python) or
build a wheel whose own metadata refuses its torch; ``plan`` must never list one. Both bounds
come from the project's ``pyproject.toml`` (``[project] requires-python`` and the ``torch``
entry of ``dependencies``), the file pip itself reads: one source. A project without that table
(a ``setup.py``-only project) has no bounds here; pip still checks it at build time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from builder.config.model import display_path
from builder.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the builder runs on 3.11 here; tomli is what 3.9/3.10 have
    import tomli as tomllib


@dataclass(frozen=True)
class ProjectBounds:
    """``requires-python`` and the torch requirement of one project (None: not stated)."""

    file: str  # pyproject.toml, as messages name it
    name: str
    requires_python: Optional[SpecifierSet] = None
    torch: Optional[SpecifierSet] = None

    def python_ok(self, python: str) -> bool:
        """Whether some patch release of *python* ("3.9") satisfies ``requires-python``."""
        if self.requires_python is None:
            return True
        spec = self.requires_python
        return any(spec.contains(f"{python}.{patch}") for patch in (0, 99))

    def torch_ok(self, torch: str) -> bool:
        return self.torch is None or self.torch.contains(torch, prereleases=True)

    def why_not(self, python: str, torch: str) -> Optional[str]:
        """Why the project cannot be installed in the cell (None: it can)."""
        if not self.python_ok(python):
            return (f"{self.name} requires-python {self.requires_python} ({self.file}): "
                    f"Python {python} cannot install it")
        if not self.torch_ok(torch):
            return (f"{self.name} needs torch{self.torch} ({self.file}): torch {torch} is "
                    "outside that bound")
        return None


def read_bounds(project: Path) -> Optional[ProjectBounds]:
    """The bounds of the project at *project* (a folder), or None when its ``pyproject.toml``
    has no ``[project]`` table. A malformed one is a configuration error (exit 2)."""
    path = project / "pyproject.toml"
    if not path.is_file():
        return None
    shown = display_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read it: {exc}; expected a TOML file", file=shown) from None
    table = data.get("project")
    if not isinstance(table, dict):
        return None
    name = str(table.get("name") or project.name)
    requires_python = None
    if table.get("requires-python"):
        try:
            requires_python = SpecifierSet(str(table["requires-python"]))
        except InvalidSpecifier:
            raise ConfigError(f"{table['requires-python']!r} is not a version specifier; "
                              'expected e.g. ">=3.9"', file=shown,
                              key="project.requires-python") from None
    torch = None
    for i, raw in enumerate(table.get("dependencies") or ()):
        try:
            req = Requirement(str(raw))
        except InvalidRequirement:
            raise ConfigError(f"{raw!r} is not a requirement; expected e.g. \"torch>=2.8\"",
                              file=shown, key=f"project.dependencies[{i}]") from None
        if canonicalize_name(req.name) == "torch" and req.marker is None:
            torch = req.specifier if str(req.specifier) else None
    return ProjectBounds(file=shown, name=name, requires_python=requires_python, torch=torch)
