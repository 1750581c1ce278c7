"""Typed results of the pipeline's steps and cells (shared by the pipeline and the display)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

#: Cell outcomes. ``up-to-date``: the manifest already holds a wheel built from the same inputs.
BUILT, UP_TO_DATE, FAILED, INTERRUPTED = "built", "up-to-date", "failed", "interrupted"


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class CellResult:
    cell: str
    status: str = FAILED
    steps: list[StepResult] = field(default_factory=list)
    wheel: Optional[Path] = None
    error: str = ""
    log: Optional[Path] = None
    seconds: float = 0.0
    #: Why the cell was built or skipped (e.g. which inputs changed), shown in the summary.
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status in (BUILT, UP_TO_DATE)
