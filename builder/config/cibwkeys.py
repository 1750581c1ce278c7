"""What the builder does with each key of a project's ``[tool.cibuildwheel]``, so a key it does
not read is named, never dropped without a word.

cibuildwheel's options (its documentation's list): the builder reads the build options
(:data:`builder.config.buildoptions.KEYS`) and the test keys (``test-requires``,
``test-command``: :mod:`builder.config.projecttest`). For every other key the table below says
what takes its place here; a key cibuildwheel does not know either is reported as unknown
(a typo in a key cibuildwheel would also ignore is still worth a line).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.config.buildoptions import KEYS
from builder.config.projecttest import (
    COMMAND_KEY,
    LINUX,
    REQUIRES_KEY,
    cibuildwheel_section,
    linux_section,
)

#: Keys the builder reads from ``[tool.cibuildwheel]`` (and from its ``linux`` table).
READ: frozenset[str] = frozenset((*KEYS, REQUIRES_KEY, COMMAND_KEY))

_MATRIX = ("the cells come from the build matrix (configs/matrix.yaml's arch/python/torch, or "
           "--config), narrowed with --arch/--python/--torch (make wheel ARCH= PY= TORCH=)")
_IMAGE = ("the base image is the config's images.<ARCH>.base, or --base-image "
          "(docs/base-images.md)")
_TEST = ("not read: put it in test-command (e.g. 'cd {project} && python -m pytest tests') or "
         "test-requires")

#: cibuildwheel's other keys -> what the builder does instead.
INSTEAD: dict[str, str] = {
    "build": _MATRIX,
    "skip": _MATRIX,
    "archs": _MATRIX,
    "enable": "not read: every Python the matrix names is built (pypy, free-threaded: none)",
    "test-skip": "not read: every cell runs the test-command (drop cells with the matrix's "
                 "exclude instead)",
    "before-test": _TEST,
    "test-extras": _TEST,
    "test-sources": "not read: test-command runs with {project} naming the project's copy, so "
                    "refer to the sources there",
    "test-groups": _TEST,
    "test-environment": "not read: set it in environment, which the tests see too",
    "manylinux-x86_64-image": _IMAGE,
    "manylinux-aarch64-image": _IMAGE,
    "manylinux-i686-image": "not used: the builder makes x86_64 and aarch64 wheels",
    "manylinux-ppc64le-image": "not used: the builder makes x86_64 and aarch64 wheels",
    "manylinux-s390x-image": "not used: the builder makes x86_64 and aarch64 wheels",
    "manylinux-armv7l-image": "not used: the builder makes x86_64 and aarch64 wheels",
    "manylinux-riscv64-image": "not used: the builder makes x86_64 and aarch64 wheels",
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
    "container-engine": "the engine is the one DOCKER_HOST names (a Podman socket works too); "
                        "--backend chooses docker, host, cross or emulated",
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
    "overrides": "not read yet: the builder applies no per-identifier overrides; a setting per "
                 "cell goes in the matrix config (its include entries)",
}


def unread_keys(section: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, what the builder does instead) for each key of a ``[tool.cibuildwheel]`` table
    the builder does not read, in the table's order."""
    out = []
    for key in section:
        if key in READ or key == LINUX:
            continue
        out.append((key, INSTEAD.get(key, "unknown: not a cibuildwheel option the builder "
                                          "knows (a typo?); it is ignored")))
    return out


def project_warnings(project: Path) -> list[str]:
    """One line per key of the project's ``[tool.cibuildwheel]`` (and its ``linux`` table)
    that the builder does not read, naming the file, the key and what to do instead."""
    section, file = cibuildwheel_section(project)
    lines = []
    for prefix, table in (("tool.cibuildwheel", section),
                          (f"tool.cibuildwheel.{LINUX}", linux_section(section, file))):
        lines += [f"{file}: {prefix}.{key} is {advice}" if advice.startswith("unknown")
                  else f"{file}: {prefix}.{key}: {advice}" for key, advice in unread_keys(table)]
    return lines
