"""``Requires-Dist`` lines of a METADATA header: re-pin one distribution, markers kept (the torch
pin of the version label and the torch-npu pin of the ``npu`` extra both rewrite this way)."""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.errors import StepFailed


def repin(lines: list[str], name: str, requirement: str) -> bool:
    """Replace, in the header *lines* (in place), every ``Requires-Dist`` naming *name* by
    *requirement* with that line's marker kept; whether there was one."""
    found = False
    for i, line in enumerate(lines):
        if not line.startswith("Requires-Dist:"):
            continue
        value = line.split(":", 1)[1].strip()
        try:
            req = Requirement(value)
        except InvalidRequirement as exc:
            raise StepFailed(f"METADATA has an invalid Requires-Dist {value!r}: {exc}") from exc
        if canonicalize_name(req.name) == canonicalize_name(name):
            found = True
            lines[i] = f"Requires-Dist: {requirement}" + (f"; {req.marker}" if req.marker else "")
    return found
