"""Where a wheel was built: the machine, and the CI runner and job when a CI service ran it.

Every manifest entry carries this (``extra.built_on``) so that a release merged from many
runners' ``dist/`` folders (``python -m builder merge``) still says which runner built each
wheel. Only names are recorded, never a token or any other CI variable's value.
"""

from __future__ import annotations

import platform
import socket
from collections.abc import Mapping

#: CI service -> (the variable that says it runs the job, the runner's name, the job's id).
_SERVICES: tuple[tuple[str, str, str, str], ...] = (
    ("github", "GITHUB_ACTIONS", "RUNNER_NAME", "GITHUB_RUN_ID"),
    ("gitlab", "GITLAB_CI", "CI_RUNNER_DESCRIPTION", "CI_JOB_ID"),
)


def built_on(env: Mapping[str, str]) -> dict[str, str]:
    """``{"host", "machine"}``, plus ``ci``, ``runner`` and ``job`` inside a CI job."""
    found = {"host": socket.gethostname(), "machine": platform.machine()}
    for service, marker, runner, job in _SERVICES:
        if env.get(marker) == "true":
            found.update(ci=service, runner=env.get(runner) or found["host"], job=env.get(job, ""))
            break
    return found


def runner_of(entry: Mapping[str, object]) -> str:
    """A manifest entry's runner, for people: ``github runner NAME`` or ``host NAME``;
    ``unknown`` for an entry written before builds recorded it."""
    extra = entry.get("extra")
    where = extra.get("built_on") if isinstance(extra, Mapping) else None
    if not isinstance(where, Mapping):
        return "unknown"
    if where.get("ci"):
        return f"{where['ci']} runner {where.get('runner')}"
    return f"host {where.get('host')}"
