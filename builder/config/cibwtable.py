"""A project's whole ``[tool.cibuildwheel]`` as layers, in cibuildwheel's precedence.

Lowest to highest: the global keys, the ``linux`` table, then every
``[[tool.cibuildwheel.overrides]]`` entry whose ``select`` matches the cell, in the order they
are written (a later one wins). An override may say, per key, ``inherit.KEY = "append"`` or
``"prepend"``: its value is then added after (or before) the one it would replace instead of
replacing it (commands joined with ``&&``, lists and assignments concatenated), as cibuildwheel
does; ``"none"`` is the default.

``select`` takes cibuildwheel's identifier globs (:mod:`builder.plan.selectors`, braces
expanded) and matches a cell when it matches the cell's cibuildwheel identifier
(``cp311-manylinux_x86_64``) or the builder's own (``cp311-manylinux_x86_64-torch2.13.0``).

Some keys are read once for the whole build, not per cell, as cibuildwheel reads them
(:data:`GLOBAL_ONLY`): an override that sets one is named in a warning (builder.config.cibwkeys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from builder.config import pyproject as pp
from builder.config.yamlfile import brief
from builder.errors import ConfigError
from builder.plan.selectors import Selector, parse

#: Read once for the whole build (cibuildwheel's global options): never from an override.
GLOBAL_ONLY: tuple[str, ...] = ("build", "skip", "test-skip", "archs", "container-engine")
INHERIT_RULES: tuple[str, ...] = ("none", "append", "prepend")
OVERRIDES = "overrides"


def cibuildwheel_section(project: Path) -> tuple[dict[str, Any], str]:
    """The project's ``pyproject.toml`` ``[tool.cibuildwheel]`` table (empty without one) and
    the file's name; ConfigError (exit 2) when it cannot be read as one."""
    path = project / "pyproject.toml"
    doc = pp.load_pyproject(path, str(path))
    if doc is None:
        return {}, str(path)
    return pp.table(doc, "tool.cibuildwheel", str(path)), str(path)


#: cibuildwheel's platform table the builder reads (it makes Linux wheels only).
LINUX = "linux"


def linux_section(section: dict[str, Any], file: str) -> dict[str, Any]:
    """``[tool.cibuildwheel.linux]`` of *section*: its keys replace the global ones, as in
    cibuildwheel; ConfigError when it is not a table."""
    value = section.get(LINUX, {})
    if not isinstance(value, dict):
        raise ConfigError(
            f"is {type(value).__name__} ({brief(value)}); expected a table of "
            "the same keys as [tool.cibuildwheel]",
            file=file,
            key=f"tool.cibuildwheel.{LINUX}",
        )
    return value


@dataclass(frozen=True)
class Layer:
    """One table of settings, where it is written, and how its keys combine with the layer
    below (``inherit``: key -> append | prepend; absent: replace)."""

    data: Mapping[str, Any]
    origin: str  # "/p/pyproject.toml [tool.cibuildwheel.linux]", for messages and records
    key_prefix: str  # "tool.cibuildwheel.linux.", for errors naming the key
    inherit: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Override:
    index: int
    select_text: str
    selectors: tuple[Selector, ...]
    layer: Layer

    def matches(self, identifiers: Iterable[str]) -> bool:
        return any(s.matches(i) for s in self.selectors for i in identifiers)


@dataclass(frozen=True)
class CibwTable:
    file: str
    base: tuple[Layer, ...]  # [tool.cibuildwheel], [tool.cibuildwheel.linux]
    overrides: tuple[Override, ...] = ()

    def layers(self, identifiers: Optional[Sequence[str]] = None) -> list[Layer]:
        """The layers that apply to the cell named *identifiers* (its cibuildwheel and its
        builder identifier), lowest first; None: the global and linux tables only."""
        out = list(self.base)
        if identifiers:
            out += [o.layer for o in self.overrides if o.matches(identifiers)]
        return out

    def global_value(self, key: str) -> Optional[tuple[Any, Layer]]:
        """A :data:`GLOBAL_ONLY` key's value and the layer that sets it (linux over global)."""
        found = None
        for lay in self.base:
            if lay.data.get(key) is not None:
                found = (lay.data[key], lay)
        return found


EMPTY_TABLE = CibwTable(file="pyproject.toml", base=())


def _shown(file: str) -> str:
    """*file* as an origin names it: its name in the project's root (``pyproject.toml``)."""
    return Path(file).name


def read_table(project: Path) -> CibwTable:
    """The project's table as layers; ConfigError (exit 2) naming the key of a malformed
    ``overrides`` entry."""
    section, file = cibuildwheel_section(project)
    # Origins name the file as the project has it (pyproject.toml), not where it is checked
    # out: they are in each cell's record, which must be the same for `plan` run in the
    # project and for the build of a copy of it (and in the input key, stable across folders).
    # Errors still name the whole path.
    shown = _shown(file)
    base = (
        Layer(section, f"{shown} [tool.cibuildwheel]", "tool.cibuildwheel."),
        Layer(
            linux_section(section, file),
            f"{shown} [tool.cibuildwheel.{LINUX}]",
            f"tool.cibuildwheel.{LINUX}.",
        ),
    )
    raw = section.get(OVERRIDES)
    if raw is None:
        return CibwTable(file, base)
    key = f"tool.cibuildwheel.{OVERRIDES}"
    if not isinstance(raw, list):
        raise ConfigError(
            f"is {brief(raw)}; expected an array of tables "
            "([[tool.cibuildwheel.overrides]]), each with a select",
            file=file,
            key=key,
        )
    return CibwTable(file, base, tuple(_override(i, entry, file) for i, entry in enumerate(raw)))


def _override(index: int, entry: Any, file: str) -> Override:
    key = f"tool.cibuildwheel.{OVERRIDES}[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(
            f"is {brief(entry)}; expected a table with select and the settings "
            "for the cells it selects",
            file=file,
            key=key,
        )
    select = entry.get("select")
    if isinstance(select, list) and select and all(isinstance(s, str) for s in select):
        select = " ".join(select)
    if not isinstance(select, str) or not select.strip():
        raise ConfigError(
            f"is {brief(select)}; expected identifier globs such as 'cp312-*' "
            "(a string or a list of strings): an override must select cells",
            file=file,
            key=f"{key}.select",
        )
    inherit = entry.get("inherit", {})
    if not isinstance(inherit, dict) or not all(v in INHERIT_RULES for v in inherit.values()):
        raise ConfigError(
            f"is {brief(inherit)}; expected a table of key = "
            f"{' | '.join(repr(r) for r in INHERIT_RULES)}",
            file=file,
            key=f"{key}.inherit",
        )
    data = {k: v for k, v in entry.items() if k not in ("select", "inherit")}
    origin = f"{_shown(file)} [[tool.cibuildwheel.overrides]] #{index + 1} (select = {select!r})"
    rules = {k: v for k, v in inherit.items() if v != "none"}
    return Override(index, select, parse([select]), Layer(data, origin, f"{key}.", rules))
