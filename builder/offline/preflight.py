"""Can this wheelhouse satisfy a cell offline? Answered before any image is built.

An offline build (``--offline``, ``--bundle``) installs with ``pip --no-index --find-links``;
when a wheel is missing, pip finds out only after the image was built, deep in a container, and
says ``from versions: none``. This module answers the same question up front, from file names
and metadata alone: the wheel file names are parsed with :mod:`packaging`, compared with the
tags the cell's interpreter accepts (``cpXY`` on the base image's ``manylinux_2_NN_<arch>``),
and every requirement -- ``torch==X``, the build tools, and, read from each chosen wheel's
``METADATA``, its ``Requires-Dist`` with markers evaluated for the *target* Python and machine
(not this host's) -- must be met by a compatible file. What is missing is named exactly:
package, version spec, Python and platform.

The same requirement list (:func:`cell_requirements`) drives ``fetch``, so what a bundle holds
and what a build checks for cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.config.pyproject import load_pyproject, string_list
from builder.config.yamlfile import brief, clip
from builder.errors import ConfigError
from builder.wheel.wheelmeta import marker_environment, requires_dist

#: What the in-cell steps install besides torch (builder/incell/steps.py: install-torch's
#: default ``--extra``); the smoke test installs torch and the wheel itself.
BUILD_TOOLS: tuple[str, ...] = ("setuptools", "wheel")

_PLAT_RE = re.compile(r"^manylinux_(\d+)_(\d+)_([a-z0-9_]+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@dataclass(frozen=True)
class Target:
    """The interpreter and platform a cell's wheels must install on."""

    python: str  # "3.11"
    machine: str  # "x86_64"
    plat: str  # the base image's glibc policy, e.g. "manylinux_2_28_x86_64"
    cell: str  # the cell identifier, for messages

    @property
    def cp(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def glibc(self) -> tuple[int, int]:
        m = _PLAT_RE.match(self.plat)
        if m:
            return int(m.group(1)), int(m.group(2))
        for legacy, version in _LEGACY.items():
            if self.plat.startswith(legacy + "_"):
                return version
        raise ConfigError(
            f"cannot read a glibc version from platform tag {self.plat!r}; "
            "expected manylinux_2_NN_<arch>",
            key=f"cell {self.cell}",
        )

    def platforms(self) -> list[str]:
        """Every platform tag a wheel for this target may carry, best first (pip's order)."""
        major, minor = self.glibc
        out = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        for legacy, (lmaj, lmin) in _LEGACY.items():
            # The old aliases exist for x86_64/i686; manylinux2014 also for the other arches.
            if (lmaj, lmin) <= (major, minor) and (
                legacy == "manylinux2014" or self.machine in ("x86_64", "i686")
            ):
                out.append(f"{legacy}_{self.machine}")
        return out

    def tags(self) -> frozenset[Tag]:
        version = tuple(int(x) for x in self.python.split("."))
        plats = self.platforms()
        found = set(cpython_tags(version, abis=[self.cp], platforms=plats))
        found.update(compatible_tags(version, interpreter=self.cp, platforms=plats))
        return frozenset(found)

    def environment(self) -> dict[str, str]:
        """PEP 508 marker values of the *target* (torch's dependencies differ per Python)."""
        return marker_environment(self.machine, self.python)

    def describe(self) -> str:
        return f"{self.cp} {self.plat}"


@dataclass(frozen=True)
class WheelFile:
    path: Path
    name: NormalizedName
    version: Version
    tags: frozenset[Tag]


@dataclass(frozen=True)
class Missing:
    requirement: str  # e.g. "torch==2.13.0"
    needed_by: str  # "the build" or "torch 2.13.0+cpu"
    near: tuple[str, ...] = ()  # files of that project that do not fit (wrong version/tag)


@dataclass
class Resolution:
    """What a wheelhouse offers one target: the files chosen, and what it lacks."""

    target: Target
    chosen: dict[str, WheelFile] = field(default_factory=dict)
    missing: list[Missing] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class HostTorch:
    """A torch environment some cells need on the build host itself (the cross backend's host
    torch): its Python, its torch, and the cells that need it."""

    python: str
    torch: str
    cells: tuple[str, ...]

    def target(self, machine: str, plat: str) -> Target:
        return Target(self.python, machine, plat, f"host torch of {', '.join(self.cells)}")


def host_torches(records: Sequence[tuple[str, Optional[tuple[str, str]]]]) -> list[HostTorch]:
    """The distinct host torch environments of ``(cell id, (python, torch) or None)`` records,
    in order of first use."""
    found: dict[tuple[str, str], list[str]] = {}
    for cell, host in records:
        if host is not None:
            found.setdefault(host, []).append(cell)
    return [HostTorch(py, torch, tuple(cells)) for (py, torch), cells in found.items()]


def cell_requirements(
    torch: str,
    project: Optional[Path] = None,
    toolkit: Sequence[str] = (),
    frontend: Sequence[str] = (),
) -> list[str]:
    """Everything a cell's build and smoke test pip-install: ``torch==X``, the build tools,
    and the project's static build-system requires and dependencies (the smoke test installs
    the wheel, so its dependencies too); a CUDA cell's *toolkit* pins (its resolved record's,
    ``--hash`` options dropped: the install checks them) too, and what its build frontend
    installs (*frontend*: pypa/build, the pinned uv; CibwOptions.frontend_requirements)."""
    reqs = [f"torch=={torch}", *BUILD_TOOLS, *(t.split(" ")[0] for t in toolkit), *frontend]
    names = {canonicalize_name(r.split("=")[0]) for r in reqs}
    for req in _project_requirements(project) if project else []:
        parsed = _requirement(req, "pyproject.toml")
        if not (parsed.specifier or parsed.marker or parsed.extras) and (
            canonicalize_name(parsed.name) in names
        ):
            continue  # a bare "torch" or "wheel" adds nothing
        if req not in reqs:
            reqs.append(req)
    return reqs


def _project_requirements(project: Path) -> list[str]:
    """The static ``[build-system] requires`` and ``[project] dependencies`` of *project*'s
    pyproject.toml; ConfigError naming the file and key when it cannot say them."""
    pyproject = project / "pyproject.toml"
    shown = str(pyproject)
    doc = load_pyproject(pyproject, shown)
    if doc is None:
        return []
    reqs = []
    for key in ("build-system.requires", "project.dependencies"):
        for i, text in enumerate(string_list(doc, key, shown)):
            try:
                Requirement(text).specifier.contains("1.0")  # its versions are read on use
            except (InvalidRequirement, ValueError) as exc:
                why = (
                    clip(exc)
                    if isinstance(exc, InvalidRequirement)
                    else "a version too long to read"
                )
                raise ConfigError(
                    f'{brief(text)} is not a requirement ({why}); expected e.g. "torch>=2.8"',
                    file=shown,
                    key=f"{key}[{i}]",
                ) from None
            reqs.append(text)
    return reqs


def index_wheelhouse(folder: Path) -> list[WheelFile]:
    """Every ``*.whl`` in *folder* whose name is a valid wheel file name."""
    out = []
    for path in sorted(folder.glob("*.whl")):
        try:
            name, version, _build, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue  # pip ignores such files too
        out.append(WheelFile(path, name, version, frozenset(tags)))
    return out


def resolve(wheels: Sequence[WheelFile], target: Target, requirements: Iterable[str]) -> Resolution:
    """Choose, for *target*, a wheel for every requirement and (transitively) its
    ``Requires-Dist``; the newest compatible version wins, as with pip."""
    tags = target.tags()
    env = target.environment()
    fitting = [w for w in wheels if w.tags & tags]
    result = Resolution(target)
    specs: dict[str, SpecifierSet] = {}
    expanded: set[tuple[str, str, frozenset[str]]] = set()  # cycles (A[x] -> B -> A[x])
    queue: list[tuple[Requirement, str]] = []
    for text in requirements:
        queue.append((_requirement(text, "the build"), "the build"))
    while queue:
        req, parent = queue.pop(0)
        if req.marker is not None and not _marker_applies(req.marker, env, ()):
            continue
        name = canonicalize_name(req.name)
        spec = specs.get(name, SpecifierSet()) & req.specifier
        specs[name] = spec
        have = result.chosen.get(name)
        if (
            have is not None
            and spec.contains(have.version, prereleases=True)
            and (name, str(have.version), frozenset(req.extras)) in expanded
        ):
            continue
        candidates = [
            w for w in fitting if w.name == name and spec.contains(w.version, prereleases=True)
        ]
        if not candidates:
            if any(
                canonicalize_name(Requirement(m.requirement).name) == name for m in result.missing
            ):
                continue  # named once, with the first (usually the tightest) spec
            near = tuple(w.path.name for w in wheels if w.name == name)
            result.missing.append(Missing(f"{req.name}{spec}", parent, near))
            continue
        best = (
            have
            if have is not None and have in candidates
            else max(candidates, key=lambda w: w.version)
        )
        result.chosen[name] = best
        seen = (name, str(best.version), frozenset(req.extras))
        if seen in expanded:
            continue
        expanded.add(seen)
        by = f"{best.name} {best.version}"
        for line in requires_dist(best.path):
            dep = _requirement(line, best.path.name)
            if dep.marker is None or _marker_applies(dep.marker, env, req.extras):
                queue.append((Requirement(_strip_marker(dep)), by))
    return result


def describe_missing(result: Resolution, where: str) -> str:
    """``offline bundle DIR lacks torch==2.13.0 for cp311 manylinux_2_28_x86_64 (cell ...)``."""
    t = result.target
    lines = []
    for m in result.missing:
        line = f"{where} lacks {m.requirement} for {t.describe()} (cell {t.cell})"
        if m.needed_by != "the build":
            line += f", required by {m.needed_by}"
        if m.near:
            shown = ", ".join(m.near[:3]) + (", ..." if len(m.near) > 3 else "")
            line += f"; present but not usable there: {shown}"
        lines.append(line)
    return "\n".join(lines)


def _requirement(text: str, source: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise ConfigError(f"invalid requirement {text!r} in {source}: {exc}") from exc


def _marker_applies(marker: Marker, env: dict[str, str], extras: Iterable[str]) -> bool:
    for extra in ("", *extras):
        if marker.evaluate({**env, "extra": extra}):
            return True
    return False


def _strip_marker(req: Requirement) -> str:
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"
