"""Typed fatal errors of the builder; each carries its exit code.

Errors are part of the interface: every message says what was wrong (file, key, value)
and what was expected, for the person reading it at 2 a.m. Configuration and usage
errors exit 2; failed build, repair or verification steps exit 1.

Shared module: add new classes by appending, keep existing names.
"""

from __future__ import annotations


class BuilderError(Exception):
    """Base class; ``return_code`` is the process exit code for this error."""

    return_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(BuilderError):
    """Bad configuration or usage (YAML, CLI flags, environment). Exit code 2."""

    return_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        where = ""
        if file is not None:
            where = file + (f":{line}" if line is not None else "")
        if key is not None:
            where = f"{where}: {key}" if where else key
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.line = line
        self.key = key


class StepFailed(BuilderError):
    """A build, repair, verification or publish step failed. Exit code 1."""

    return_code = 1


class EngineUnavailable(BuilderError):
    """The container engine does not answer (not installed / not running). Exit code 1."""

    return_code = 1


class DiskFull(StepFailed):
    """A write did not fit on its file system (builder.diskspace builds the message: the path,
    its free space and what was needed). Exit code 1."""

    return_code = 1

    def __init__(
        self,
        message: str,
        *,
        path: object = None,
        free: int | None = None,
        needed: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.free = free
        self.needed = needed
