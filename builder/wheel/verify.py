"""Verification of a repaired wheel before it may enter ``dist/``.

Three independent checks, each with a message naming the wheel and what was expected:

1. the file name agrees with ``auditwheel show`` (its symbol-version tag is among the name's
   platform tags; no unsupported ISA; no non-policy library other than the excluded torch ones);
2. the wheel carries no torch (or OpenMP) library of its own;
3. it installs into a fresh environment with the cell's torch, and its smoke test passes
   (``amp._C`` imports and the quick-start loop trains with a fused optimizer; for another
   project, every extension module imports).
"""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.engines.base import Session
from builder.errors import StepFailed
from builder.incell import smoke_in_session
from builder.wheel.repair import (
    CONTAINER_AUDITWHEEL,
    DEFAULT_EXCLUDES,
    WheelAudit,
    audit_wheel,
    is_excluded,
    split_wheel_name,
)

#: Shared libraries that must never be inside our wheels (the user's torch provides them).
FORBIDDEN_LIBRARIES: tuple[str, ...] = (
    "libtorch*.so*",
    "libc10*.so*",
    "libgomp*.so*",
    "libshm*.so*",
    "libtorch_*",
    # the CUDA driver and runtime: the machine's and torch's
    "libcuda.so*",
    "libcudart*.so*",
)


def check_name_against_audit(
    wheel_name: str, audit: WheelAudit, excludes: Sequence[str] = DEFAULT_EXCLUDES
) -> None:
    """The name's platform tags must include the tag auditwheel derives from the symbols."""
    tags = split_wheel_name(wheel_name)[4]
    if not all(t.startswith("manylinux") for t in tags):
        raise StepFailed(f"{wheel_name}: platform tag {'.'.join(tags)} is not manylinux")
    if audit.sym_tag not in tags:
        raise StepFailed(
            f"{wheel_name}: auditwheel show says its symbols need {audit.sym_tag}, but the file "
            f"name claims {'.'.join(tags)}"
        )
    if audit.unsupported_isa:
        raise StepFailed(
            f"{wheel_name}: uses an instruction-set extension auditwheel rejects "
            "(built with -march=native?)"
        )
    extra = sorted(lib for lib in audit.external_libs if not is_excluded(lib, excludes))
    if extra:
        raise StepFailed(
            f"{wheel_name}: needs external libraries outside the manylinux policy "
            f"and the torch exclusions: {extra}"
        )


def check_no_bundled_torch(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        bad = sorted(
            n for n in zf.namelist() if is_excluded(posixpath.basename(n), FORBIDDEN_LIBRARIES)
        )
    if bad:
        raise StepFailed(f"{wheel.name} contains torch/OpenMP libraries it must not ship: {bad}")


@dataclass(frozen=True)
class Verification:
    wheel: Path
    tag: str  # the symbol-version tag auditwheel confirmed
    modules: tuple[str, ...]  # extension modules the smoke test imported
    #: A CUDA wheel's device code check (builder.wheel.cudacheck); None for a cpu wheel
    cuda: Optional[dict] = None


def verify_wheel(
    session: Session,
    wheel: Path,
    *,
    python: str,
    torch: str,
    auditwheel: Sequence[str] = CONTAINER_AUDITWHEEL,
    auditwheel_env: Mapping[str, str] | None = None,
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    wheelhouse: Optional[str] = None,
    index_url: Optional[str] = None,
    smoke: bool = True,
) -> Verification:
    """Run all checks on the repaired host *wheel*, using *session* for auditwheel and the
    smoke test (*python* is the cell's interpreter inside the session)."""
    check_no_bundled_torch(wheel)
    inside = session.copy_in(wheel, posixpath.join(session.workdir, "audit"))
    audit = audit_wheel(session, inside, auditwheel=auditwheel, env=auditwheel_env)
    check_name_against_audit(wheel.name, audit, excludes)
    modules: list[str] = []
    if smoke:
        modules = smoke_in_session(
            session,
            python=python,
            wheel=wheel,
            torch=torch,
            wheelhouse=wheelhouse,
            index_url=index_url,
        )
    return Verification(wheel=wheel, tag=audit.sym_tag, modules=tuple(modules))
