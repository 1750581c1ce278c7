"""One index per torch series (``index --per-torch``), as PyG publishes its wheels.

A single index holding wheels for several torch series is safe with ``--index-url``: pip only
sees our wheels and backtracks to the one whose ``torch==X.Y.*`` pin the installed torch meets.
Added with ``--extra-index-url`` next to an index that serves torch, it is not: pip takes the
newest wheel (``+torch2.13``) and *upgrades* the user's torch to satisfy its pin. With one index
per series (``OUT/torch2.13/simple/``, ``OUT/torch2.9/simple/``) the user names the series of the
torch they have, and nothing on that page can ask for another torch.

The series of a wheel is its METADATA's ``Requires-Dist: torch==X.Y.*`` (the pin the builder
writes, :mod:`builder.wheel.localversion`). A wheel with no torch requirement serves every series,
so it is listed on every page; a stable-ABI wheel (``torch>=2.10``, no label) is listed on the
page of every series its range admits; when no wheel is pinned there is nothing to split (a usage
error).

A CUDA wheel (``+torch2.14.cu130``, docs/cuda-wheels.md) pins the same ``torch==2.14.*`` as the
cpu one, and pip cannot tell them apart by requirement; it is listed on the page of its torch
series and CUDA (``OUT/torch2.14.cu130/simple/``), never on the cpu page, so a CPU torch's user
is never handed device code that needs libtorch_cuda.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from builder.errors import ConfigError
from builder.release.simple_index import IndexResult, collect_wheels, write_simple_index
from builder.wheel.wheelmeta import requires_dist

_SERIES = re.compile(r"^==(\d+)\.(\d+)\.\*$")
#: The CUDA part of a CUDA wheel's local version label (builder.plan.cells.local_label).
_CUDA_LABEL = re.compile(r"(?:^|\.)torch\d+\.\d+\.(cu\d+)$")


def torch_range(wheel: Path) -> SpecifierSet | None:
    """The wheel's (unconditional) torch requirement; None when it requires no torch."""
    for line in requires_dist(wheel):
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and req.marker is None:
            return req.specifier
    return None


def torch_series(wheel: Path) -> str | None:
    """``torch2.13`` for a wheel pinned to ``torch==2.13.*``; None when it pins no series."""
    m = _SERIES.match(str(torch_range(wheel) or ""))
    if m is None:
        return None
    version = wheel.name.split("-")[1]
    cuda = _CUDA_LABEL.search(version.partition("+")[2])
    return f"torch{m.group(1)}.{m.group(2)}" + (f".{cuda.group(1)}" if cuda else "")


def split_by_torch(wheels: Iterable[Path]) -> dict[str, list[Path]]:
    """Series -> the wheels its page lists (its own, every wheel whose torch range admits the
    series, e.g. a stable-ABI ``torch>=2.10`` one, and every wheel with no torch requirement)."""
    pinned: dict[str, list[Path]] = {}
    others: list[tuple[Path, SpecifierSet | None]] = []
    for wheel in wheels:
        series = torch_series(wheel)
        if series:
            pinned.setdefault(series, []).append(wheel)
        else:
            others.append((wheel, torch_range(wheel)))
    if not pinned:
        raise ConfigError(
            "--per-torch: no wheel pins a torch series (Requires-Dist: "
            "torch==X.Y.*, as this builder's wheels do); write one index instead"
        )

    def admits(spec: SpecifierSet | None, series: str) -> bool:
        version = ".".join(series[len("torch") :].split(".")[:2])  # torch2.14.cu130 -> 2.14
        return spec is None or spec.contains(version + ".0", prereleases=True)

    return {
        s: sorted([*pinned[s], *(w for w, spec in others if admits(spec, s))])
        for s in sorted(pinned, key=_series_key)
    }


def _series_key(series: str) -> tuple[int, ...]:
    parts = series[len("torch") :].split(".")
    cuda = int(parts[2][2:]) if len(parts) > 2 else -1  # cpu first, then each CUDA
    return (int(parts[0]), int(parts[1]), cuda)


def write_per_torch_indexes(
    wheels: Iterable[Path] | Path, out: Path, *, link: bool = False, metadata: bool = False
) -> Mapping[str, IndexResult]:
    """``out/<series>/simple/`` for each torch series among *wheels*; each written (and
    swapped in) as :func:`write_simple_index` does."""
    groups = split_by_torch(collect_wheels(wheels))
    return {
        series: write_simple_index(group, Path(out) / series, link=link, metadata=metadata)
        for series, group in groups.items()
    }
