"""Live progress of a build (cell, step, elapsed) and the summary table at the end.

On a terminal a ``rich`` live table redraws in place; in a log or a CI job (not a terminal)
each step change is one plain line, so logs stay readable. Everything shown is redacted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Optional, TextIO

from builder.deps import require
from builder.pipeline_types import CellResult
from builder.wheel.repair import oldest_tag, split_wheel_name

if TYPE_CHECKING:  # rich is imported when a build shows progress (builder.deps)
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table


def _rich(module: str) -> ModuleType:  # a module of rich
    return require(f"rich.{module}", "rich", "the build's progress display")


class Progress:
    """Thread-safe: cells built in parallel report into one display."""

    def __init__(
        self, stream: TextIO, redact: Callable[[str], str] = str, live: Optional[bool] = None
    ) -> None:
        self.console = _rich("console").Console(file=stream, highlight=False, soft_wrap=True)
        if not self.console.is_terminal:
            self.console.width = 160  # logs: no folding of cell ids and errors
        self.redact = redact
        self.live_mode = self.console.is_terminal if live is None else live
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[str, float, str]] = {}  # cell -> (step, started, status)
        self._live: Optional[Live] = None

    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = _rich("live").Live(
                self._table(),
                console=self.console,
                refresh_per_second=2,
                get_renderable=self._table,
                transient=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def step(self, cell: str, step: str) -> None:
        with self._lock:
            started = self._rows.get(cell, ("", time.monotonic(), ""))[1]
            self._rows[cell] = (step, started, "running")
            if not self.live_mode:
                self._line(f"[{cell}] {step} ({time.monotonic() - started:.0f}s)")

    def finish(self, result: CellResult) -> None:
        with self._lock:
            started = self._rows.get(result.cell, ("", time.monotonic(), ""))[1]
            self._rows[result.cell] = (result.status, started, result.status)
            if not self.live_mode:
                why = f": {result.note}" if result.note else ""
                self._line(f"[{result.cell}] {result.status} ({result.seconds:.0f}s){why}")

    def note(self, text: str) -> None:
        with self._lock:
            self._line(text)

    def _line(self, text: str) -> None:
        self.console.print(self.redact(text), markup=False)

    def _table(self) -> Table:
        table = _rich("table").Table(box=None, pad_edge=False)
        for col in ("CELL", "STEP", "ELAPSED"):
            table.add_column(col)
        now = time.monotonic()
        for cell, (step, started, status) in self._rows.items():
            elapsed = f"{now - started:.0f}s" if status == "running" else "-"
            table.add_row(cell, self.redact(step), elapsed)
        return table


def summary_table(
    results: Iterable[CellResult], console: Console, redact: Callable[[str], str] = str
) -> None:
    table = _rich("table").Table(title="build summary", title_justify="left")
    for col in ("CELL", "RESULT", "TIME", "TAG", "WHEEL / ERROR"):
        table.add_column(col, overflow="fold")
    for r in results:
        what = r.wheel.name if r.wheel is not None else (r.error.splitlines() or [""])[0]
        if r.note and r.wheel is not None:
            what += f" ({r.note})"
        # The tag the wheel achieved: its most compatible one (where it installs).
        tag = oldest_tag(split_wheel_name(r.wheel.name)[4]) if r.wheel is not None else "-"
        table.add_row(r.cell, r.status, f"{r.seconds:.0f}s", tag, redact(what))
    console.print(table)
