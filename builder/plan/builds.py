"""Which build serves each cell: a stable-ABI wheel shared by many cells, or the cell's own.

A project on torch's stable ABI (``[tool.ampforge.stable-abi]`` in its pyproject.toml,
:class:`~builder.plan.project.StableAbi`) compiles, for a cell with torch and Python at least the
declared ones, a ``cpXY-abi3`` wheel that loads into every such torch and CPython. Those cells of
one architecture form one *build group*: one of them builds the wheel, every other one only
verifies that same file next to its own torch and Python (builder.release.shared), and each gets
its manifest entry. Every other cell is its own group per (arch, torch), as before: its wheel
carries ``+torchX.Y`` (an abi3 wheel of a ``py_limited_api`` project is still shared by the
Pythons of its (arch, torch) once built).

A project that declares nothing may still be on the stable ABI: after a build, the pipeline runs
torch-abi-audit on every abi3 wheel and records what it found (the manifest's
``extra.stable_abi`` with ``detected: true``); :func:`detected` reads that back, so the next
``plan``/``build`` for that output folder treats the project as declared (and says so).

The cell that builds a group's wheel: one this host can build, then the newest torch (its
headers are a superset; TORCH_TARGET_VERSION keeps the binary to the declared minimum), then the
builder's own Python (the one with a local torch wheel most often), then the oldest Python.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from builder.config import values
from builder.plan.project import StableAbi

STABLE = "stable"
PER_TORCH = "per-torch"


def min_torch(requirement: str) -> str:
    """``torch>=2.10`` (a stable record's ``torch_requirement``) -> ``2.10``."""
    return requirement.split(">=", 1)[1].strip()


def group_of(arch: str, torch: str, stable: bool, cuda: str = "cpu") -> str:
    """The build group's name: ``X86-stable``, ``X86-torch2.13.0`` or, for a CUDA cell (its
    own binary: device code beside the host code), ``X86-torch2.14.1-cu130``."""
    if stable:
        return f"{arch}-{STABLE}"
    return f"{arch}-torch{torch}" + (f"-cu{cuda.replace('.', '')}" if cuda != "cpu" else "")


def assign(
    records: Sequence, stable: Optional[StableAbi], builder_python: Optional[str] = None
) -> list:
    """*records* (ResolvedCell) with their build decided: ``wheel``, ``build_group``,
    ``built_by`` and ``build_reason`` (see the module docstring)."""
    py = builder_python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = []
    groups: dict[str, list] = {}
    for r in records:
        c = r.cell
        # A CUDA cell's wheel holds device code for its CUDA: never the cpu stable wheel.
        if stable is not None and c.cuda == "cpu" and stable.serves(c.python, c.torch):
            groups.setdefault(group_of(c.arch, c.torch, True), []).append(r)
        else:
            why = (
                "its own wheel, labelled +"
                + c.torch_local
                + ": "
                + (
                    f"torch {c.torch} / Python {c.python} is below the stable ABI's torch "
                    f">= {stable.torch}, Python >= {stable.python} ({stable.source})"
                    if stable is not None and c.cuda == "cpu"
                    else f"a CUDA {c.cuda} cell: its wheel carries device code for that CUDA"
                    if c.cuda != "cpu"
                    else "the project declares no stable ABI"
                )
            )
            out.append(
                replace(
                    r,
                    wheel=PER_TORCH,
                    build_group=group_of(c.arch, c.torch, False, c.cuda),
                    built_by=c.identifier,
                    build_reason=why,
                )
            )
    for group, members in groups.items():
        assert stable is not None  # only cells it serves are grouped
        # Stable sorts, the least important key first.
        ranked = sorted(members, key=lambda r: values.torch_key(r.cell.python))
        ranked = sorted(ranked, key=lambda r: r.cell.python != py)
        ranked = sorted(ranked, key=lambda r: values.torch_key(r.cell.torch), reverse=True)
        head = sorted(ranked, key=lambda r: not r.buildable)[0]
        served = len(members)
        for r in members:
            what = (
                f"builds the {group} wheel"
                if r is head
                else f"verifies the {group} wheel built by {head.identifier} (no compile)"
            )
            why = (
                f"{what}: one cp{stable.python.replace('.', '')}-abi3 wheel on torch's stable "
                f"ABI serves the {served} cell{'s' if served != 1 else ''} of {r.cell.arch} "
                f"with torch >= {stable.torch} and Python >= {stable.python} "
                f"({stable.source})"
            )
            out.append(
                replace(
                    r, wheel=STABLE, build_group=group, built_by=head.identifier, build_reason=why
                )
            )
    order = {r.identifier: i for i, r in enumerate(records)}
    return sorted(out, key=lambda r: order[r.identifier])


_ABI3 = re.compile(r"-cp(\d)(\d+)-abi3-")


def detected(doc: dict[str, Any], project: str, manifest: Path) -> Optional[StableAbi]:
    """The stable ABI torch-abi-audit found in a wheel of *project* (a manifest entry's
    ``extra.project``) recorded in *doc* (the manifest at *manifest*), or None."""
    for w in doc.get("wheels") or []:
        extra = w.get("extra") or {}
        found = extra.get("stable_abi") or {}
        m = _ABI3.search(str(w.get("file", "")))
        if extra.get("project") != project or not found.get("detected") or m is None:
            continue
        floor = str(found.get("min_torch") or "")
        if not re.match(r"^\d+\.\d+", floor):
            continue
        torch = ".".join(floor.split(".")[:2])
        return StableAbi(
            torch=torch,
            python=f"{m.group(1)}.{m.group(2)}",
            source=f"detected by torch-abi-audit in {w.get('file')} "
            f"({manifest}); declare [tool.ampforge.stable-abi] to keep it",
        )
    return None
