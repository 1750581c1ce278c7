"""Cells: one (arch, Python, torch) combination of the matrix, and how to pick them.

A cell's identifier names it everywhere (logs, selectors, file names, CI jobs). It
extends cibuildwheel's ``cp311-manylinux_x86_64`` with the torch release the wheel is
built against::

    cp311-manylinux_x86_64-torch2.13.0
    cp39-manylinux_aarch64-torch2.8.0

The platform part is ``manylinux_<machine>`` whatever the base image (the repaired wheel
is manylinux either way; the exact glibc tag is ``Cell.plat``). The full torch release is
used, not ``2.13``, because two patch releases may both be in a matrix. A CUDA cell (the
``cuda`` axis: ``cpu``, the default, or a CUDA version) appends its CUDA, so a cpu cell keeps
its identifier and file name::

    cp311-manylinux_x86_64-torch2.14.1-cu130

``expand`` turns a BuildConfig into a Plan (buildable cells plus dropped ones with their
reasons); ``select`` narrows a Plan to what a command asked for (selectors: any of
them, see :mod:`builder.plan.selectors`; --arch/--python/--torch: all of them). When a
selection names a Python but no torch, each (arch, Python) resolves to the newest torch
in the matrix that publishes a wheel for it, and a note says which one was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builder.arch import ARCHES
from builder.config import BaseImage, BuildConfig, Selection, Settings, values
from builder.config.cuda import CPU, cuda_tag
from builder.errors import ConfigError
from builder.plan import selectors
from builder.plan.project import ProjectBounds


def cell_id(arch: str, python: str, torch: str, cuda: str = CPU) -> str:
    base = f"{values.cp_tag(python)}-manylinux_{ARCHES[arch].machine}-torch{torch}"
    return f"{base}-{cuda_tag(cuda)}" if cuda != CPU else base


def local_label(torch: str, cuda: str = CPU) -> str:
    """The wheel's local version label: ``torch2.13`` for a cpu cell (README.md's contract),
    ``torch2.14.cu130`` for a CUDA one (docs/cuda-wheels.md says why this spelling)."""
    major, minor = torch.split(".")[:2]
    label = f"torch{major}.{minor}"
    return f"{label}.{cuda_tag(cuda)}" if cuda != CPU else label


@dataclass(frozen=True)
class Cell:
    arch: str  # X86 | ARM
    python: str  # "3.11"
    torch: str  # "2.13.0"
    image: BaseImage
    cuda: str = CPU  # "cpu" | "13.0"

    @property
    def identifier(self) -> str:
        return cell_id(self.arch, self.python, self.torch, self.cuda)

    @property
    def machine(self) -> str:
        return ARCHES[self.arch].machine

    @property
    def docker_platform(self) -> str:
        return ARCHES[self.arch].docker_platform

    @property
    def cp(self) -> str:
        return values.cp_tag(self.python)

    @property
    def abi_tag(self) -> str:
        return f"{self.cp}-{self.cp}"

    @property
    def plat(self) -> str:
        return self.image.plat

    @property
    def python_path(self) -> str:
        """The cell's interpreter inside the base image."""
        return self.image.python_path.replace("{cp}", self.cp).replace("{version}", self.python)

    @property
    def torch_local(self) -> str:
        """The wheel's local version label, ``torch2.13`` (README.md's contract, "wheel names"),
        ``torch2.14.cu130`` for a CUDA cell."""
        return local_label(self.torch, self.cuda)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.identifier,
            "arch": self.arch,
            "machine": self.machine,
            "python": self.python,
            "cp": self.cp,
            "torch": self.torch,
            # only a CUDA cell's (a cpu cell's record, hence its input key, stays as it was)
            **({"cuda": self.cuda} if self.cuda != CPU else {}),
            "base_image": self.image.ref,
            "family": self.image.family,
            "plat": self.plat,
            "python_path": self.python_path,
            "docker_platform": self.docker_platform,
            "local_version": self.torch_local,
        }


@dataclass(frozen=True)
class DroppedCell:
    arch: str
    python: str
    torch: str
    reason: str
    cuda: str = CPU

    @property
    def identifier(self) -> str:
        return cell_id(self.arch, self.python, self.torch, self.cuda)

    def to_dict(self) -> dict[str, str]:
        return {
            "id": self.identifier,
            "arch": self.arch,
            "python": self.python,
            "torch": self.torch,
            "cuda": self.cuda,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...]
    dropped: tuple[DroppedCell, ...] = ()
    notes: tuple[str, ...] = ()  # e.g. which torch a selection resolved to
    warnings: tuple[str, ...] = field(default=())

    def by_id(self) -> dict[str, Cell]:
        return {c.identifier: c for c in self.cells}


def _order(arch: str, python: str, torch: str, arches: tuple[str, ...], cuda: str = CPU) -> tuple:
    a = arches.index(arch) if arch in arches else len(arches)
    return (a, values.python_key(python), values.torch_key(torch), values.cuda_key(cuda))


def why_no_cuda(config: BuildConfig, torch: str, machine: str, cuda: str) -> str | None:
    """Why a (torch, machine) has no reachable CUDA *cuda* build (None: it has, or cpu)."""
    if cuda == CPU:
        return None
    return (
        config.support.cuda.torch_source(
            torch, machine, cuda, config.cuda.index_urls, config.cuda.origin
        )[1]
        or None
    )


def expand(config: BuildConfig, bounds: ProjectBounds | None = None) -> Plan:
    """All cells of the matrix: buildable ones and dropped ones with reasons. *bounds*: the
    project's requires-python and torch bound; a cell outside them is dropped (it could not
    install the project), before the support table is asked."""
    m = config.matrix
    sup = config.support
    cells: dict[str, Cell] = {}
    dropped: dict[str, DroppedCell] = {}
    warnings: list[str] = []
    matched_rules: set[int] = set()
    for arch in m.arches:
        machine = ARCHES[arch].machine
        for python in m.pythons:
            for torch in m.torches:
                for cuda in m.cudas:
                    cid = cell_id(arch, python, torch, cuda)
                    rule = next(
                        (r for r in m.exclude if r.matches(arch, python, torch, cuda)), None
                    )
                    for r in m.exclude:
                        if r.matches(arch, python, torch, cuda):
                            matched_rules.add(r.index)
                    refused = bounds.why_not(python, torch) if bounds is not None else None
                    no_cuda = why_no_cuda(config, torch, machine, cuda)
                    if rule is not None:
                        dropped[cid] = DroppedCell(
                            arch, python, torch, f"excluded by {rule.describe()}", cuda
                        )
                    elif refused is not None:
                        dropped[cid] = DroppedCell(arch, python, torch, refused, cuda)
                    elif not sup.supports(torch, python, machine):
                        dropped[cid] = DroppedCell(
                            arch, python, torch, sup.why_not(torch, python, machine), cuda
                        )
                    elif no_cuda is not None:
                        dropped[cid] = DroppedCell(arch, python, torch, no_cuda, cuda)
                    else:
                        cells[cid] = Cell(arch, python, torch, config.images[arch], cuda)
    for r in m.exclude:
        if r.index not in matched_rules:
            where = f"{r.file}:{r.line}" if r.line else r.file
            warnings.append(f"{where}: {r.key}: {r.describe()} matches no cell of the matrix")
    for r in m.include:
        arch, python, torch = r.arch[0], r.python[0], r.torch[0]  # type: ignore[index]
        cuda = r.cuda[0] if r.cuda else CPU
        machine = ARCHES[arch].machine
        refused = bounds.why_not(python, torch) if bounds is not None else None
        if refused is not None:
            raise ConfigError(
                f"includes {cell_id(arch, python, torch)}, which cannot install the project: "
                f"{refused}; expected a cell inside the project's bounds",
                file=r.file,
                line=r.line,
                key=r.key,
            )
        if not sup.supports(torch, python, machine):
            raise ConfigError(
                f"includes {cell_id(arch, python, torch)}, which cannot be built: "
                f"{sup.why_not(torch, python, machine)}; expected a supported combination",
                file=r.file,
                line=r.line,
                key=r.key,
            )
        no_cuda = why_no_cuda(config, torch, machine, cuda)
        if no_cuda is not None:
            raise ConfigError(
                f"includes {cell_id(arch, python, torch, cuda)}, which cannot be built: "
                f"{no_cuda}; expected a reachable CUDA build",
                file=r.file,
                line=r.line,
                key=r.key,
            )
        cid = cell_id(arch, python, torch, cuda)
        dropped.pop(cid, None)  # an explicit include wins over an exclude
        cells[cid] = Cell(arch, python, torch, config.images[arch], cuda)
    if not cells:
        reasons = "; ".join(f"{d.identifier}: {d.reason}" for d in list(dropped.values())[:3])
        raise ConfigError(
            f"the matrix has no buildable cell (all {len(dropped)} dropped, e.g. {reasons}); "
            "expected at least one supported arch/python/torch combination",
            file=config.source_name,
            key="matrix",
        )
    order = lambda c: _order(c.arch, c.python, c.torch, m.arches, c.cuda)  # noqa: E731
    return Plan(
        cells=tuple(sorted(cells.values(), key=order)),
        dropped=tuple(sorted(dropped.values(), key=order)),
        warnings=tuple(warnings),
    )


def _describe_selection(sel: Selection) -> str:
    parts = []
    for axis in ("arch", "python", "torch", "cuda"):
        vals = getattr(sel, axis)
        if vals is not None:
            parts.append(f"{axis} {','.join(vals)} ({sel.origins.get(axis, '?')})")
    if sel.patterns:
        parts.append(f"pattern {' '.join(sel.patterns)}")
    return ", ".join(parts)


def oldest_supported(config: BuildConfig, bounds: ProjectBounds | None) -> str:
    """The oldest (Python, torch) the project supports, per the support table and its bounds."""
    found = config.support.oldest(lambda py, t: bounds is None or bounds.why_not(py, t) is None)
    if found is None:
        return "none: no torch of the support table is inside the project's bounds"
    python, torch, machine = found
    arch = next(a for a, spec in ARCHES.items() if spec.machine == machine)
    return f"Python {python} with torch {torch} ({cell_id(arch, python, torch)})"


def unsupported(
    axis: str, value: str, config: BuildConfig, bounds: ProjectBounds | None
) -> str | None:
    """Why Python or torch *value* is not supported (the project's bound, the support table's
    recorded reason), with the oldest supported combination; None when nothing refuses it."""
    refused = None
    if bounds is not None:
        ok = bounds.python_ok(value) if axis == "python" else bounds.torch_ok(value)
        if not ok:
            refused = (
                f"{bounds.name} requires-python {bounds.requires_python}"
                if axis == "python"
                else f"{bounds.name} needs torch{bounds.torch}"
            ) + (f" ({bounds.file})")
    recorded = config.support.why_unsupported(axis, value)
    if refused is None and recorded is None:
        return None
    why = "; ".join(
        w for w in (refused, recorded and f"{recorded} (per {config.support.file})") if w
    )
    name = "Python" if axis == "python" else "torch"
    return (
        f"{name} {value} is not supported: {why}. The oldest supported combination is "
        f"{oldest_supported(config, bounds)}"
    )


def select(
    plan: Plan,
    selection: Selection,
    newest: bool = True,
    config: BuildConfig | None = None,
    bounds: ProjectBounds | None = None,
) -> Plan:
    """Narrow *plan* to *selection*; ConfigError (exit 2) when it selects nothing buildable.

    *newest*: a Python named without a torch keeps only the newest torch per (arch, Python);
    False keeps every candidate (the resolver then picks among them with this host in mind).
    *config*, *bounds*: what says why an unsupported Python or torch is (its end of life, a
    missing API) and names the oldest supported combination."""
    if selection.empty:
        return plan
    everything: list[Cell | DroppedCell] = [*plan.cells, *plan.dropped]
    # Each named value must exist somewhere in the matrix: say which one does not.
    for axis in ("arch", "python", "torch", "cuda"):
        wanted = getattr(selection, axis)
        if wanted is None:
            continue
        have = sorted(
            {getattr(c, axis) for c in everything},
            key=values.python_key
            if axis == "python"
            else (
                values.torch_key
                if axis == "torch"
                else (values.cuda_key if axis == "cuda" else str)
            ),
        )
        for w in wanted:
            why = (
                unsupported(axis, w, config, bounds)
                if config is not None and axis in ("python", "torch")
                else None
            )
            if why is not None and not any(getattr(c, axis) == w for c in plan.cells):
                raise ConfigError(why, key=selection.origins.get(axis, axis))
            if w not in have:
                raise ConfigError(
                    f"{axis} {w} is not in the matrix; expected one of {', '.join(have)} "
                    "(or add it to the config's matrix)",
                    key=selection.origins.get(axis, axis),
                )
    by_pattern = selectors.parse(selection.patterns)
    for sel in by_pattern:
        # A typo is an error even when another selector matches (cp3{11,13}-* may name a
        # Python the matrix lacks: a selector is checked as typed, not per expansion).
        if not any(sel.matches(c.identifier) for c in everything):
            raise ConfigError(
                f"selector {sel.text!r} matches no cell; expected a pattern on identifiers like "
                f"{everything[0].identifier} (see `python -m builder plan`)",
                key="selector",
            )

    def keep(c: Cell | DroppedCell) -> bool:
        for axis in ("arch", "python", "torch", "cuda"):
            wanted = getattr(selection, axis)
            if wanted is not None and getattr(c, axis) not in wanted:
                return False
        return selectors.matches(by_pattern, c.identifier)

    cells = [c for c in plan.cells if keep(c)]
    dropped = [d for d in plan.dropped if keep(d)]
    if not cells:
        if dropped:
            reasons = "; ".join(f"{d.identifier}: {d.reason}" for d in dropped)
            oldest = (
                f". The oldest supported combination is {oldest_supported(config, bounds)}"
                if config is not None
                else ""
            )
            raise ConfigError(
                f"the selection ({_describe_selection(selection)}) has no buildable cell: "
                f"{reasons}{oldest}",
                key="selection",
            )
        raise ConfigError(
            f"the selection ({_describe_selection(selection)}) selects no cell; "
            "see `python -m builder plan` for the cells of the matrix",
            key="selection",
        )
    notes: list[str] = []
    if newest and selection.torch is None and selection.python is not None:
        # Resolve to the newest torch per (arch, python) and say which.
        newest_of: dict[tuple[str, str, str], Cell] = {}
        for c in cells:
            k = (c.arch, c.python, c.cuda)  # a cpu and a CUDA cell each keep their newest torch
            if k not in newest_of or values.torch_key(c.torch) > values.torch_key(
                newest_of[k].torch
            ):
                newest_of[k] = c
        for (arch, python, _cuda), c in newest_of.items():
            skipped = sorted(
                {
                    d.torch
                    for d in dropped
                    if d.arch == arch
                    and d.python == python
                    and values.torch_key(d.torch) > values.torch_key(c.torch)
                },
                key=values.torch_key,
            )
            why = (
                f"; newer {', '.join(skipped)} publish no {c.cp} wheel for {c.machine}"
                if skipped
                else ""
            )
            notes.append(
                f"{arch} / Python {python}: no torch named, chose torch {c.torch} "
                f"(the newest in the matrix with a {c.cp} wheel for {c.machine}{why}) "
                f"-> {c.identifier}"
            )
        chosen = set(id(c) for c in newest_of.values())
        cells = [c for c in cells if id(c) in chosen]
    return replace(
        plan, cells=tuple(cells), dropped=tuple(dropped), notes=plan.notes + tuple(notes)
    )


def widen(config: BuildConfig, selection: Selection) -> tuple[BuildConfig, tuple[str, ...]]:
    """*config* with the torch releases and Pythons that *selection* names explicitly added to
    its matrix's axes when the support table has wheels for them (``make wheel PY=3.8
    TORCH=2.1.0`` with the modern default matrix builds that Ascend line), with a note for
    each. A named value the table does not know stays out: `select` says why."""
    m, sup = config.matrix, config.support
    torches = [t for t in (selection.torch or ()) if t not in m.torches and sup.knows(t)]
    known_pythons = {
        py
        for t in sup.wheels
        for machine in ARCHES.values()
        for py in sup.pythons(t, machine.machine)
    }
    pythons = [py for py in (selection.python or ()) if py not in m.pythons and py in known_pythons]
    if not torches and not pythons:
        return config, ()
    notes = tuple(
        f"{axis} {value} is not on {config.source_name}'s matrix axis: named "
        f"({selection.origins.get(axis, axis)}), taken from {sup.file}"
        for axis, added in (("torch", torches), ("python", pythons))
        for value in added
    )
    matrix = replace(m, torches=(*m.torches, *torches), pythons=(*m.pythons, *pythons))
    return replace(config, matrix=matrix), notes


def plan_for(settings: Settings, bounds: ProjectBounds | None = None) -> Plan:
    """The cells a command acts on: the expanded matrix narrowed to the selection."""
    config, notes = widen(settings.config, settings.selection)
    plan = select(expand(config, bounds), settings.selection, config=config, bounds=bounds)
    return replace(plan, notes=notes + plan.notes)
