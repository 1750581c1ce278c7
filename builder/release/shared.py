"""One wheel for several cells: abi3 (``cp39-abi3``) and pure (``py3-none``) wheels.

Cells share a wheel within their *build group* (builder.plan.builds, the resolved record's
``build_group``): by default one per (arch, torch); a project on torch's stable ABI has one
group per arch for every cell with torch and Python at least its declared minimum, whose one
wheel is built by the record's ``built_by`` cell and verified by all the others next to their
own torch.

A project built with ``py_limited_api`` produces one file name for every Python of an (arch,
torch) pair: built for cp311 and then cp312 into one ``dist/``, the second build would replace
the first's wheel under the same name, and the manifest would lose the first cell. Instead the
wheel is built once per (arch, torch) -- by the first cell of the run, or found in ``dist/``
when an earlier run built it from the same project and builder -- and every other cell it
serves only *verifies* it on its own Python (install + smoke test) and gets its own manifest
entry for the same file (``extra.served_by``).

Which cells a wheel serves is decided from its file name's tags alone (PEP 425/427): the same
rule pip applies when it installs the wheel.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from builder.plan.builds import STABLE, group_of
from builder.plan.cells import Cell
from builder.release.manifest import read_manifest, sha256_file

T = TypeVar("T")

#: Input-key parts that do not depend on the cell's Python: equal ones mean the wheel in
#: ``dist/`` was built from the same project, builder and settings (builder.pipeline).
PYTHON_INDEPENDENT_INPUTS: tuple[str, ...] = (
    "builder",
    "builder_sources",
    "project",
    "excludes",
    "index_url",
    "offline",
    "wheelhouse",
    "source_date_epoch",
)


def _cp_version(tag: str) -> Optional[tuple[int, int]]:
    if tag.startswith("cp") and tag[2:].isdigit() and len(tag) >= 4:
        return int(tag[2]), int(tag[3:])
    return None


def tag_serves(tag: Tag, cp: str) -> bool:
    """Whether a wheel tag installs on CPython *cp* (``cp311``), platform aside."""
    want = _cp_version(cp)
    if want is None:
        return False
    if tag.abi == "abi3":  # the stable ABI of that version and every later CPython 3
        have = _cp_version(tag.interpreter)
        return have is not None and have[0] == want[0] and have <= want
    if tag.abi == "none":
        return tag.interpreter in (f"py{want[0]}", f"py{want[0]}{want[1]}", cp)
    return tag.interpreter == cp and tag.abi == cp


def python_agnostic(wheel_name: str) -> bool:
    """True for a wheel that is not tied to one CPython (abi3, or no ABI at all)."""
    tags = parse_wheel_filename(wheel_name)[3]
    return any(t.abi in ("abi3", "none") for t in tags)


def serves(wheel_name: str, cell: Cell) -> bool:
    """Whether the wheel named *wheel_name* installs for *cell* (its Python and machine)."""
    tags = parse_wheel_filename(wheel_name)[3]
    return any(tag_serves(t, cell.cp) and t.platform.endswith("_" + cell.machine) for t in tags)


@dataclass(frozen=True)
class SharedWheel:
    wheel: Path  # the file in dist/
    built_by: str  # the cell whose build produced it


def default_group(cell: Cell) -> str:
    """A cell's build group when no record says otherwise: its (arch, torch)."""
    return group_of(cell.arch, cell.torch, stable=False, cuda=cell.cuda)


class SharedWheels:
    """The Python-agnostic wheels of one run, per build group; thread-safe.

    *groups*: cell identifier -> (build group, the cell that builds its wheel), from the
    resolved records; a cell not in it is in its (arch, torch) group, built by whichever of
    its cells comes first."""

    def __init__(
        self, cells: Sequence[Cell] = (), groups: Optional[Mapping[str, tuple[str, str]]] = None
    ) -> None:
        self._lock = threading.Lock()
        self._groups = dict(groups or {})
        self._by_group: dict[str, SharedWheel] = {}
        self._run: dict[str, list[str]] = {}
        for c in cells:
            self._run.setdefault(self.group_name(c), []).append(c.identifier)
        for members in self._run.values():  # the group's builder first
            head = self._groups.get(members[0], ("", members[0]))[1]
            if head in members:
                members.remove(head)
                members.insert(0, head)

    def group_name(self, cell: Cell) -> str:
        found = self._groups.get(cell.identifier)
        return found[0] if found else default_group(cell)

    def group(self, cell: Cell) -> tuple[str, ...]:
        """The cells of this run in *cell*'s build group: those one wheel may serve."""
        return tuple(self._run.get(self.group_name(cell), [cell.identifier]))

    def ordered(self, items: Sequence[T], cell_of: Callable[[T], Cell]) -> list[T]:
        """*items* with the builder of each group before the cells that reuse its wheel."""
        return [i for phase in self.phases(items, cell_of) for i in phase]

    def phases(self, items: Sequence[T], cell_of: Callable[[T], Cell]) -> list[list[T]]:
        """*items* in two phases for parallel runs: the first cell of each build group, then
        the rest, which may reuse what the first built."""
        firsts = {group[0] for group in self._run.values()}
        heads = [i for i in items if cell_of(i).identifier in firsts]
        return [heads, [i for i in items if cell_of(i).identifier not in firsts]]

    def add(self, cell: Cell, wheel: Path, built_by: str) -> None:
        """Record *cell*'s wheel (built or up to date) when other Pythons could share it."""
        if python_agnostic(wheel.name):
            with self._lock:
                self._by_group.setdefault(self.group_name(cell), SharedWheel(wheel, built_by))

    def for_cell(
        self, cell: Cell, out: Path, inputs: Mapping[str, str], from_dist: bool = True
    ) -> Optional[SharedWheel]:
        """The wheel *cell* should verify instead of building its own: one this run built for
        its build group, else (*from_dist*) one in *out* whose manifest entry has the same
        build group and the same Python-independent inputs (*inputs*: part -> digest, as
        recorded)."""
        group = self.group_name(cell)
        with self._lock:
            found = self._by_group.get(group)
        if found is not None and serves(found.wheel.name, cell) and found.wheel.is_file():
            return found
        return _from_manifest(cell, group, out, inputs) if from_dist else None


def _from_manifest(
    cell: Cell, group: str, out: Path, inputs: Mapping[str, str]
) -> Optional[SharedWheel]:
    if not (out / "manifest.json").exists():
        return None
    for w in read_manifest(out)["wheels"]:
        extra: Mapping[str, Any] = w.get("extra") or {}
        resolved = extra.get("resolved") or {}
        name = str(w.get("file", ""))
        recorded = resolved.get("build_group") or group_of(
            str(resolved.get("arch")),
            str(resolved.get("torch")),
            stable=False,
            cuda=str((resolved.get("cuda") or {}).get("version") or "cpu"),
        )
        if (
            recorded != group
            or not name.endswith(".whl")
            or not python_agnostic(name)
            or not serves(name, cell)
        ):
            continue
        recorded = extra.get("inputs") or {}
        # A stable-ABI group spans torches: where each cell's torch came from (its wheelhouse)
        # is not an input of the shared wheel.
        parts = [
            k
            for k in PYTHON_INDEPENDENT_INPUTS
            if not (k == "wheelhouse" and group.endswith("-" + STABLE))
        ]
        if any(recorded.get(k) != inputs.get(k) for k in parts):
            continue
        path = out / name
        if path.is_file() and sha256_file(path) == w.get("sha256"):
            return SharedWheel(path, str(extra.get("served_by") or w.get("cell")))
    return None
