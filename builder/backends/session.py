"""The in-cell steps shared by the backends that run them in a session (docker, emulated, host):
compile, version label, repair, normalise, verify -- the same sequence wherever it runs."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

from builder.backends.base import Built, CellJob
from builder.engines.base import Session
from builder.errors import StepFailed
from builder.incell import build_in_session, smoke_in_session
from builder.wheel.repair import audit_wheel, repair_wheel, split_wheel_name
from builder.wheel.verify import Verification, check_name_against_audit, check_no_bundled_torch
from builder.wheel.wheelcheck import check_tag_covers_own_code


def build_in_cell(
    job: CellJob, session: Session, *, python: str, wheelhouse: Optional[str],
    auditwheel: Sequence[str], auditwheel_env: Optional[Mapping[str, str]],
    prepared: Optional[str] = None,
) -> Built:
    """compile -> version label -> repair -> normalise -> verify, inside *session*.

    *prepared*: the interpreter of the cell's cached torch environment (builder.backends.
    torchenv): the build uses it and verification layers its venv on it, so torch is not
    installed again."""
    cell, config, opts, steps, stage = job.cell, job.config, job.opts, job.steps, job.stage
    excludes = tuple(config.build.auditwheel_exclude)
    built = steps("compile", lambda: build_in_session(
        session, python=python, torch=cell.torch, project=opts.project, wheelhouse=wheelhouse,
        index_url=config.pip.index_url, local_version_label="", ccache=opts.ccache,
        prepared=prepared))
    if built.ccache is not None:
        job.log.open()
        job.log.write_line(f"ampforge: ccache for {cell.identifier}: {built.ccache}")
        job.log.close()

    def label() -> str:
        # The label is added outside the project's build, so any project gets +torchX.Y.
        raw = session.copy_out(built.wheel, stage / "raw")
        (stage / "labelled").mkdir(parents=True, exist_ok=True)
        labelled = job.label(raw, stage / "labelled")
        return session.copy_in(labelled, posixpath.join(session.workdir, "labelled"))

    inside = steps("version label", label)
    (stage / "repaired").mkdir(parents=True, exist_ok=True)
    repaired = steps("repair", lambda: repair_wheel(
        session, inside, stage / "repaired", auditwheel=auditwheel, env=auditwheel_env,
        excludes=excludes))
    job.normalize(repaired.wheel)
    checked = steps("verify", lambda: verify_cell_wheel(
        session, repaired.wheel, python=python, torch=cell.torch, auditwheel=auditwheel,
        auditwheel_env=auditwheel_env, excludes=excludes, wheelhouse=wheelhouse,
        index_url=config.pip.index_url, torch_site=built.torch_site))
    gxx = session.run(["g++", "--version"], check=False, step="compiler version")
    compiler = next((line for line in gxx.tail if line.strip()), "unknown") if gxx.ok else "?"
    out = Built(wheel=checked.wheel, torch=built.torch, compiler=compiler, tag=checked.tag,
                modules=checked.modules, base_image="")
    if built.ccache is not None:
        out.extra["ccache"] = {"hits": built.ccache.hits, "misses": built.ccache.misses}
    return out


def verify_cell_wheel(
    session: Session, wheel: Path, *, python: str, torch: str, auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]], excludes: Sequence[str],
    wheelhouse: Optional[str], index_url: Optional[str], torch_site: str = "",
) -> Verification:
    """D's three checks (builder.wheel.verify), with the tag check made exclusion-aware.

    ``check_name_against_audit`` compares the name with ``auditwheel show``'s symbol tag,
    which counts the excluded libraries' own glibc needs (see builder.wheel.wheelcheck); when only
    that differs, the wheel's own ELF files decide.
    """
    check_no_bundled_torch(wheel)
    inside = session.copy_in(wheel, posixpath.join(session.workdir, "audit"))
    audit = audit_wheel(session, inside, auditwheel=auditwheel, env=auditwheel_env)
    try:
        check_name_against_audit(wheel.name, audit, excludes)
    except StepFailed as exc:
        if audit.sym_tag in split_wheel_name(wheel.name)[4] or audit.unsupported_isa:
            raise
        check_name_against_audit(wheel.name, replace(audit, sym_tag=split_wheel_name(
            wheel.name)[4][0]), excludes)  # everything but the symbol tag still checked
        try:
            check_tag_covers_own_code(wheel)
        except StepFailed:
            raise exc from None
    modules = smoke_in_session(session, python=python, wheel=wheel, torch=torch,
                               wheelhouse=wheelhouse, index_url=index_url,
                               torch_site=torch_site or None)
    return Verification(wheel=wheel, tag=split_wheel_name(wheel.name)[4][0],
                        modules=tuple(modules))
