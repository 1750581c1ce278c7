"""What the project being built can be installed on: its ``requires-python`` and its torch bound.

A cell outside them would fail mid-build (pip refuses to install the project on that Python) or
build a wheel whose own metadata refuses its torch; ``plan`` must never list one. Both bounds
come from the project's ``pyproject.toml`` (``[project] requires-python`` and the ``torch``
entry of ``dependencies``), the file pip itself reads: one source. A project without that table
(a ``setup.py``-only project) has no bounds here; pip still checks it at build time.

The same file may declare that the project builds on torch's stable ABI (``[tool.ampforge.
stable-abi]``, ``torch = "2.10"``, ``python = "3.10"``): its wheel for a cell with torch and
Python at least those is one ``abi3`` wheel that serves every such cell of its architecture
(:class:`StableAbi`; builder.plan.builds decides which cell builds it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from builder.config.model import display_path
from builder.config.pyproject import load_pyproject, string_list
from builder.config.pyproject import table as pyproject_table
from builder.config.yamlfile import brief
from builder.errors import ConfigError


@dataclass(frozen=True)
class StableAbi:
    """A project's stable-ABI declaration: the oldest torch and Python its one wheel serves."""

    torch: str  # "2.10"
    python: str  # "3.10"
    source: str  # where it was declared, for the plan's reasons

    @staticmethod
    def _key(version: str) -> tuple[int, ...]:
        return tuple(int(x) for x in version.split("+")[0].split(".")[:2])

    def serves(self, python: str, torch: str) -> bool:
        """Whether the stable wheel serves the cell (Python *python*, torch *torch*)."""
        return self._key(python) >= self._key(self.python) and self._key(torch) >= self._key(
            self.torch
        )

    @property
    def requirement(self) -> str:
        """The stable wheel's torch requirement, e.g. ``torch>=2.10``."""
        return f"torch>={self.torch}"


@dataclass(frozen=True)
class ProjectBounds:
    """``requires-python`` and the torch requirement of one project (None: not stated)."""

    file: str  # pyproject.toml, as messages name it
    name: str
    requires_python: Optional[SpecifierSet] = None
    torch: Optional[SpecifierSet] = None
    stable_abi: Optional[StableAbi] = None
    #: ``[tool.ampforge] npu-extra = true``: the project asks for the ``npu`` extra (a
    #: torch-npu pin written into its METADATA); never added to a project that does not.
    npu_extra: bool = False

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
            return (
                f"{self.name} requires-python {self.requires_python} ({self.file}): "
                f"Python {python} cannot install it"
            )
        if not self.torch_ok(torch):
            return (
                f"{self.name} needs torch{self.torch} ({self.file}): torch {torch} is "
                "outside that bound"
            )
        return None


def read_bounds(project: Path) -> Optional[ProjectBounds]:
    """The bounds of the project at *project* (a folder), or None when its ``pyproject.toml``
    has no ``[project]`` table. A malformed one is a configuration error (exit 2)."""
    path = project / "pyproject.toml"
    shown = display_path(path)
    data = load_pyproject(path, shown)
    if data is None or "project" not in data:
        return None
    table = pyproject_table(data, "project", shown)
    name = str(table.get("name") or project.name)
    requires_python = None
    if table.get("requires-python"):
        try:
            requires_python = SpecifierSet(str(table["requires-python"]))
            requires_python.contains("3.11.0")  # its versions are read on first use
        except (InvalidSpecifier, ValueError):  # ValueError: a version part of 5000 digits
            raise ConfigError(
                f"{brief(table['requires-python'])} is not a version specifier; "
                'expected e.g. ">=3.9"',
                file=shown,
                key="project.requires-python",
            ) from None
    torch = None
    for i, raw in enumerate(string_list(data, "project.dependencies", shown)):
        try:
            req = Requirement(str(raw))
            req.specifier.contains("2.13.0")  # its versions are read on first use
        except (InvalidRequirement, ValueError):
            raise ConfigError(
                f'{brief(raw)} is not a requirement; expected e.g. "torch>=2.8"',
                file=shown,
                key=f"project.dependencies[{i}]",
            ) from None
        if canonicalize_name(req.name) == "torch" and req.marker is None:
            torch = req.specifier if str(req.specifier) else None
    return ProjectBounds(
        file=shown,
        name=name,
        requires_python=requires_python,
        torch=torch,
        stable_abi=_stable_abi(data, shown),
        npu_extra=_npu_extra(data, shown),
    )


_MINOR = re.compile(r"\d{1,4}\.\d{1,4}")  # fullmatch: "2.10\n" is not a version


NPU_EXTRA_KEY = "tool.ampforge.npu-extra"


def _npu_extra(data: dict, shown: str) -> bool:
    value = pyproject_table(data, "tool.ampforge", shown).get("npu-extra", False)
    if not isinstance(value, bool):
        raise ConfigError(
            f"is {brief(value)}; expected true (write the npu extra pinning the "
            "paired torch-npu into the wheel's METADATA) or false",
            file=shown,
            key=NPU_EXTRA_KEY,
        )
    return value


def _stable_abi(data: dict, shown: str) -> Optional[StableAbi]:
    table = pyproject_table(data, "tool.ampforge", shown).get("stable-abi")
    if table is None:
        return None
    key = "tool.ampforge.stable-abi"
    if not isinstance(table, dict):
        raise ConfigError(
            f"is {type(table).__name__}; expected a table with torch and python",
            file=shown,
            key=key,
        )
    found = {}
    for part in ("torch", "python"):
        value = table.get(part)
        if not isinstance(value, str) or not _MINOR.fullmatch(value):
            raise ConfigError(
                f"is {brief(value)}; expected a quoted major.minor version such as "
                f'"{"2.10" if part == "torch" else "3.10"}"',
                file=shown,
                key=f"{key}.{part}",
            )
        found[part] = value
    unknown = sorted(set(table) - {"torch", "python"})
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)}; expected torch and python", file=shown, key=key
        )
    # The project's own file, not its path: the record must not differ between a checkout and
    # a copy of it (build --project SNAPSHOT records what plan prints for the checkout).
    return StableAbi(torch=found["torch"], python=found["python"], source=f"pyproject.toml [{key}]")
