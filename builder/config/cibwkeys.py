"""What the builder does with each key of a project's ``[tool.cibuildwheel]``, so a key it does
not read is named, never dropped without a word.

cibuildwheel's options (its documentation's list): the builder reads the build options
(:data:`builder.config.buildoptions.KEYS`), the test keys (:mod:`builder.config.projecttest`),
the selection keys ``build``, ``skip``, ``test-skip``, ``archs``, the manylinux images of its
two arches and ``container-engine`` (:mod:`builder.config.cibwproject`), and the ``overrides``
(:mod:`builder.config.cibwtable`). For every other key the table below says what takes its
place here; a key cibuildwheel does not know either is reported as unknown (a typo in a key
cibuildwheel would also ignore is still worth a line). In an override, a key read only once
per build (:data:`builder.config.cibwtable.GLOBAL_ONLY`) is named as not read there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.config.buildoptions import KEYS
from builder.config.cibwtable import GLOBAL_ONLY, LINUX, OVERRIDES, read_table
from builder.config.projecttest import (
    BEFORE_KEY,
    COMMAND_KEY,
    EXTRAS_KEY,
    GROUPS_KEY,
    REQUIRES_KEY,
    SOURCES_KEY,
)

IMAGES: tuple[str, ...] = ("manylinux-x86_64-image", "manylinux-aarch64-image")
#: Keys read per cell: in the global and linux tables and in an override.
PER_CELL: frozenset[str] = frozenset(
    (*KEYS, REQUIRES_KEY, COMMAND_KEY, BEFORE_KEY, EXTRAS_KEY, SOURCES_KEY, GROUPS_KEY, *IMAGES)
)
#: Keys the builder reads from ``[tool.cibuildwheel]`` (and from its ``linux`` table).
READ: frozenset[str] = frozenset((*PER_CELL, *GLOBAL_ONLY, OVERRIDES))

_NOT_LINUX = "not used: the builder makes x86_64 and aarch64 wheels"

#: cibuildwheel's other keys -> what the builder does instead.
INSTEAD: dict[str, str] = {
    "enable": "not read: every Python the matrix names is built (pypy, free-threaded: none)",
    "test-environment": "not read: set it in environment, which the tests see too",
    "manylinux-i686-image": _NOT_LINUX,
    "manylinux-ppc64le-image": _NOT_LINUX,
    "manylinux-s390x-image": _NOT_LINUX,
    "manylinux-armv7l-image": _NOT_LINUX,
    "manylinux-riscv64-image": _NOT_LINUX,
    "manylinux-pypy_x86_64-image": "not used: the builder makes CPython wheels",
    "manylinux-pypy_aarch64-image": "not used: the builder makes CPython wheels",
    "manylinux-pypy_i686-image": "not used: the builder makes CPython wheels",
    "musllinux-x86_64-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-aarch64-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-i686-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-ppc64le-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-s390x-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-armv7l-image": "not used: the builder makes manylinux (glibc) wheels",
    "musllinux-riscv64-image": "not used: the builder makes manylinux (glibc) wheels",
    "dependency-versions": "not read: torch is pinned per cell (the support table), the build "
    "requirements by the project's build-system.requires",
    "build-verbosity": "not read: the cell's whole build output is in its log "
    "(build/ampforge/logs/<cell>.log)",
    "allow-empty": "not read: a selection with no cell is an error (exit 2) naming why",
    "xbuild-tools": "not used: the builder makes Linux wheels",
    "pyodide-version": "not used: the builder makes Linux wheels",
    "macos": "not used: the builder makes Linux wheels",
    "windows": "not used: the builder makes Linux wheels",
    "ios": "not used: the builder makes Linux wheels",
    "pyodide": "not used: the builder makes Linux wheels",
}
_GLOBAL_IN_OVERRIDE = (
    "not read in an override: cibuildwheel reads build, skip, test-skip, "
    "archs and container-engine once per build; set it in "
    "[tool.cibuildwheel] (or its linux table)"
)


def unread_keys(section: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, what the builder does instead) for each key of a ``[tool.cibuildwheel]`` table
    the builder does not read, in the table's order."""
    out = []
    for key in section:
        if key in READ or key == LINUX:
            continue
        out.append(
            (
                key,
                INSTEAD.get(
                    key,
                    "unknown: not a cibuildwheel option the builder knows (a typo?); it is ignored",
                ),
            )
        )
    return out


def project_warnings(project: Path) -> list[str]:
    """One line per key of the project's ``[tool.cibuildwheel]`` (its ``linux`` table and its
    overrides) that the builder does not read, naming the file, the key and what to do
    instead."""
    table = read_table(project)
    file = table.file
    lines = []
    for lay in table.base:
        prefix = lay.key_prefix.rstrip(".")
        lines += [
            f"{file}: {prefix}.{key} is {advice}"
            if advice.startswith("unknown")
            else f"{file}: {prefix}.{key}: {advice}"
            for key, advice in unread_keys(lay.data)
        ]
    for override in table.overrides:
        prefix = override.layer.key_prefix.rstrip(".")
        for key in override.layer.data:
            if key in PER_CELL:
                continue
            advice = (
                _GLOBAL_IN_OVERRIDE
                if key in GLOBAL_ONLY
                else INSTEAD.get(
                    key,
                    "unknown: not a cibuildwheel option the builder knows (a typo?); it is ignored",
                )
            )
            lines.append(
                f"{file}: {prefix}.{key} is {advice}"
                if advice.startswith("unknown")
                else f"{file}: {prefix}.{key}: {advice}"
            )
        for key in override.layer.inherit:
            if key not in PER_CELL:
                lines.append(
                    f"{file}: {prefix}.inherit.{key}: not used: the builder inherits "
                    "only the keys it reads per cell"
                )
    return lines
