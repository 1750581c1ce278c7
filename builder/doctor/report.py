"""The doctor's report: one :class:`Check` per line, the exit code, and its two forms.

Levels: ``OK``; ``WARN`` -- missing or risky, but the selected builds can still run (another
way, or only slower); ``FAIL`` -- a selected build would fail on it as things stand. The exit
code is 1 when any line is FAIL, else 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

OK, WARN, FAIL = "OK", "WARN", "FAIL"
LEVELS = (OK, WARN, FAIL)


@dataclass(frozen=True)
class Check:
    name: str  # e.g. "engine", "base image X86"
    status: str  # OK | WARN | FAIL
    detail: str  # what was found
    fix: str = ""  # what to do (empty for OK)

    def __post_init__(self) -> None:
        if self.status not in LEVELS:
            raise ValueError(f"check {self.name}: status {self.status!r}; expected {LEVELS}")


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def summary(checks: Sequence[Check]) -> str:
    counts = {level: sum(c.status == level for c in checks) for level in LEVELS}
    verdict = (
        "the selected builds should run here"
        if not counts[FAIL]
        else ("fix the FAIL lines before building")
    )
    return f"{counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL: {verdict}"


def table(checks: Sequence[Check]) -> list[str]:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name.ljust(width)}  {c.detail}")
        for i, fix_line in enumerate(c.fix.splitlines()):
            label = "fix: " if i == 0 else "     "
            lines.append(f"{'':<4}  {'':<{width}}  {label}{fix_line}")
    lines.append(summary(checks))
    return lines


def document(checks: Sequence[Check]) -> str:
    """``{"ok": bool, "exit_code": 0|1, "checks": [{"name", "status", "detail", "fix"}]}``."""
    return json.dumps(
        {
            "ok": exit_code(checks) == 0,
            "exit_code": exit_code(checks),
            "checks": [asdict(c) for c in checks],
        },
        indent=2,
    )
