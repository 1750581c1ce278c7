"""What every backend offers the build pipeline: a *session* in a build environment.

A session is one isolated place to run the in-cell steps: a container (``docker.py``) or a
temporary directory on this machine (``host.py``). The pipeline only talks to this protocol, so
the same steps run unchanged in both.

Every line a session prints or logs goes through a :class:`~builder.redact.Redactor` first:
proxy credentials must never reach a terminal, a log file or an error message.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, TextIO

from builder.diskspace import disk_full, is_disk_full
from builder.engines.tls_hint import tls_failure_hint
from builder.errors import StepFailed
from builder.netpip import explain
from builder.redact import Redactor

#: Receives each redacted output line (without its newline), e.g. a progress display.
LineSink = Callable[[str], None]

#: How many trailing output lines a failed step shows in its error message.
TAIL_LINES = 25


@dataclass(frozen=True)
class RunResult:
    """Outcome of one command in a session."""

    argv: tuple[str, ...]
    exit_code: int
    tail: tuple[str, ...]  # the last redacted output lines (TAIL_LINES unless asked otherwise)
    log_path: Optional[Path] = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Session(Protocol):
    """One build environment. Paths passed to ``run``/``copy_*`` are inside it (POSIX)."""

    #: A writable scratch directory inside the environment, private to this session.
    workdir: str
    #: Where the session's output lines go (and the builder's own notes about the cell).
    log: OutputLog

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
        step: str = "",
        tail_lines: int = TAIL_LINES,
    ) -> RunResult:
        """Run *argv*; output lines stream (redacted) to the session's log; the last
        *tail_lines* of them come back in the result. ``check`` raises StepFailed on failure."""
        ...

    def copy_in(self, src: Path, dest_dir: str) -> str:
        """Copy host file or directory *src* into *dest_dir*; return its path inside."""
        ...

    def copy_out(self, src: str, dest_dir: Path) -> Path:
        """Copy *src* (file or directory inside) into host *dest_dir*; return the host path."""
        ...


@dataclass
class OutputLog:
    """Fans redacted output lines out to a log file, a sink and a bounded tail buffer."""

    redactor: Redactor = field(default_factory=Redactor)
    sink: Optional[LineSink] = None
    log_file: Optional[Path] = None
    _fh: Optional[TextIO] = field(default=None, init=False, repr=False)

    def open(self) -> None:
        if self.log_file is not None and self._fh is None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.log_file.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None  # closed even when its last flush fails
            try:
                fh.close()
            except OSError as exc:
                self._raise_if_full(exc)
                raise

    def note(self, line: str) -> None:
        """One line of the builder's own into the log, outside any running step."""
        self.open()
        try:
            self.write_line(line)
        finally:
            self.close()

    def write_line(self, line: str) -> str:
        clean = self.redactor(line.rstrip("\r\n"))
        if self._fh is not None:
            try:
                self._fh.write(clean + "\n")
                self._fh.flush()
            except OSError as exc:
                self._raise_if_full(exc)
                raise
        if self.sink is not None:
            self.sink(clean)
        return clean

    def _raise_if_full(self, exc: OSError) -> None:
        """A failed write to the log: a full disk names the log file (builder.diskspace)."""
        if self.log_file is not None and is_disk_full(exc):
            raise disk_full(self.log_file, what="the log") from exc

    def capture(self, lines: Iterable[str], keep: int = TAIL_LINES) -> tuple[str, ...]:
        """Write every line; return the last *keep* of them (redacted)."""
        tail: collections.deque[str] = collections.deque(maxlen=keep)
        for line in lines:
            tail.append(self.write_line(line))
        return tuple(tail)


def iter_lines(chunks: Iterable[bytes]) -> Iterable[str]:
    """Split a byte stream into text lines (a chunk may end mid-line or mid-character)."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            yield raw.decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")


def check_result(
    result: RunResult, step: str, where: str, redactor: Redactor | None = None
) -> RunResult:
    """Raise StepFailed for a non-zero exit, showing the output tail and the full log's path."""
    if result.ok:
        return result
    shown = "\n".join("    " + line for line in result.tail[-TAIL_LINES:])
    log = f"\n  full log: {result.log_path}" if result.log_path else ""
    name = step or result.argv[0]
    message = (
        f"step '{name}' failed in {where} with exit code {result.exit_code}\n"
        f"  command: {' '.join(result.argv)}\n  last lines:\n{shown}{log}"
    )
    # pip inside the step: a TLS failure, a stall, a reset storm or a hash mismatch in one line
    hint = tls_failure_hint(result.tail) or explain("\n".join(result.tail))
    if hint:
        message += f"\n  hint: {hint}"
    raise StepFailed((redactor or Redactor())(message))
