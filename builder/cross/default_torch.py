"""Which torch an ARM cell gets on the cross path when the user named none.

The selection's default is the newest torch with a wheel for the cell's Python (builder.plan.cells).
On the cross path a cell can only be verified when its aarch64 torch is a CPU build (it runs under
QEMU, without CUDA); the index's newest aarch64 torch may be a CUDA build (2.13.0 is). Building
that cell would end in a clear failure, so when the torch was *not* named the cross backend takes
the newest torch of the matrix whose aarch64 wheel is a CPU build instead -- and says so. A named
torch is never replaced (it fails clearly in the pipeline instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from builder.config import values
from builder.cross.sysroot import ensure_target_python
from builder.cross.target_torch import cuda_requirements, download_torch_wheel
from builder.errors import StepFailed
from builder.plan.cells import Cell


def newest_verifiable(cell: Cell, matrix: Sequence[Cell]) -> tuple[Cell, Optional[str]]:
    """*cell*, or the newest cell of *matrix* with the same arch and Python whose target torch is
    a CPU build, with a note saying why it was swapped (None when it was not).

    Reads each candidate torch wheel's metadata (downloaded once into the cross cache), newest
    first, stopping at the first CPU build. When none is, or a download fails, *cell* is kept
    and the pipeline reports its failure.
    """
    candidates = sorted((c for c in matrix if c.arch == cell.arch and c.python == cell.python
                         and values.torch_key(c.torch) <= values.torch_key(cell.torch)),
                        key=lambda c: values.torch_key(c.torch), reverse=True)
    try:
        python = ensure_target_python(cell.python, cell.machine)
        cuda_builds = []
        for candidate in candidates:
            if not cuda_requirements(download_torch_wheel(candidate.torch, python), python):
                break
            cuda_builds.append(candidate.torch)
        else:
            return cell, None
    except StepFailed:
        return cell, None
    if candidate is cell or not cuda_builds:
        return cell, None
    return candidate, (
        f"{cell.arch} / Python {cell.python}, cross backend: torch {', '.join(cuda_builds)} for "
        f"{cell.machine} is a CUDA build that cannot be verified under QEMU here, so no torch "
        f"named means torch {candidate.torch}, the newest CPU build -> {candidate.identifier} "
        f"(name --torch {cell.torch} to build that one on an {cell.machine} machine)")
