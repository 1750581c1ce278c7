"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

``kill``, ``timeout``, a CI cancel and a closed terminal send SIGTERM or SIGHUP. Python's default
for both is to die on the spot, skipping every ``finally``: a cell's container (which runs
``sleep infinity``) would run forever, host sessions would keep compiling, staging folders would
stay. Here both raise :class:`Terminated`, a ``KeyboardInterrupt``, so every cleanup path written
for Ctrl-C (containers removed, host process groups killed, ``dist/`` untouched) runs for them
too, and the command exits with 128 + the signal's number, as a shell reports a signal death.

A signal the parent set to *ignored* stays ignored (``nohup`` ignores SIGHUP on purpose), as
Python itself leaves an ignored SIGINT alone.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Optional

#: The signals handled like Ctrl-C (SIGINT is Python's own KeyboardInterrupt).
HANDLED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """A handled signal arrived; ``exit_code`` is what the command returns."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return interrupt.exit_code if isinstance(interrupt, Terminated) else 128 + signal.SIGINT


def describe(interrupt: KeyboardInterrupt) -> str:
    return (
        f"terminated by {interrupt.name}" if isinstance(interrupt, Terminated) else ("interrupted")
    )


def _raise(signum: int, _frame: Optional[FrameType]) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise :class:`Terminated` in the main thread (the
    previous handlers come back afterwards). Outside the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in HANDLED:
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
