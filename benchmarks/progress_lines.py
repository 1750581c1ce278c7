"""The builder's progress lines, read by the build benchmarks (imported by the scripts next to
it): ``[cell] step (Ns)`` when a cell starts a step, N seconds into the cell, and
``[cell] built (Ns): note`` when it ends. A step's name may hold parentheses
(``verify (qemu)``)."""

from __future__ import annotations

import re
from collections import defaultdict

STEP = re.compile(r"^\[(?P<cell>[^\]]+)\] (?P<step>.+?) \((?P<at>\d+)s\)(?:$|: )")
#: A cell's last line: what it came to, not a step.
END_STATES = ("built", "up-to-date", "failed", "skipped")


def step_times(stderr: str) -> dict[str, dict[str, int]]:
    """Per cell, seconds per step (summed when a step comes twice): a step lasts until the
    cell's next line."""
    marks: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for m in map(STEP.match, stderr.splitlines()):
        if m:
            marks[m["cell"]].append((m["step"].strip(), int(m["at"])))
    out: dict[str, dict[str, int]] = {}
    for cell, seq in marks.items():
        steps: dict[str, int] = {}
        for (name, at), (_, nxt) in zip(seq, seq[1:]):
            if name not in END_STATES:
                steps[name] = steps.get(name, 0) + nxt - at
        out[cell] = steps
    return out


def total_step_times(stderr: str) -> dict[str, int]:
    """Seconds per step summed over every cell of a run."""
    totals: dict[str, int] = defaultdict(int)
    for per_cell in step_times(stderr).values():
        for name, secs in per_cell.items():
            totals[name] += secs
    return dict(totals)
