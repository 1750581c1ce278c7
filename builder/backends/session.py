"""The in-cell steps shared by the backends that run them in a session (docker, emulated, host):
compile, version label, repair, normalise, verify -- the same sequence wherever it runs."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

from builder.backends.base import Built, CellJob
from builder.config.buildoptions import NO_OPTIONS, CibwOptions
from builder.config.projecttest import NO_TEST, ProjectTest
from builder.engines.base import Session
from builder.errors import StepFailed
from builder.incell import build_in_session, copy_project_in, smoke_in_session
from builder.plan.cudacell import CudaRecord
from builder.wheel.cudacheck import check_device_code
from builder.wheel.modules import compiled_files
from builder.wheel.repair import audit_wheel, oldest_tag, repair_wheel, split_wheel_name
from builder.wheel.verify import Verification, check_name_against_audit, check_no_bundled_torch
from builder.wheel.wheelcheck import (
    check_needs_within,
    check_tag_covers_own_code,
    platform_record,
    version_needs,
)


def build_in_cell(
    job: CellJob,
    session: Session,
    *,
    python: str,
    wheelhouse: Optional[str],
    auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]],
    prepared: Optional[str] = None,
) -> Built:
    """compile -> version label -> repair -> normalise -> verify, inside *session*.

    *prepared*: the interpreter of the cell's cached torch environment (builder.backends.
    torchenv): the build uses it and verification layers its venv on it, so torch is not
    installed again."""
    cell, config, opts, steps, stage = job.cell, job.config, job.opts, job.steps, job.stage
    # The record's list: build.auditwheel_exclude, plus CUDA's libraries for a CUDA cell.
    excludes = tuple(job.resolved.auditwheel_exclude or config.build.auditwheel_exclude)
    if job.reuse is not None:
        return verify_shared_wheel(
            job,
            session,
            python=python,
            wheelhouse=wheelhouse,
            auditwheel=auditwheel,
            auditwheel_env=auditwheel_env,
        )
    built = steps(
        "compile",
        lambda: build_in_session(
            session,
            python=python,
            torch=cell.torch,
            project=opts.project,
            wheelhouse=wheelhouse,
            index_url=config.pip.index_url,
            local_version_label="",
            ccache=opts.ccache,
            prepared=prepared,
            cflags=config.build.extra_cflags,
            options=config.build_options,
            passed=config.build_options.passed(os.environ),
            cuda_arch_list=(
                job.resolved.cuda.arch_list.text if job.resolved.cuda.arch_list is not None else ""
            ),
            extra_requirements=config.support.build_requirements(cell.torch),
            cxx11_abi=job.resolved.cxx11_abi,
            cxx_floor=job.resolved.cxx_floor,
        ),
    )
    if built.ccache is not None:
        job.log.note(f"ampforge: ccache for {cell.identifier}: {built.ccache}")

    def label() -> Path:
        # The label is added outside the project's build, so any project gets +torchX.Y.
        raw = session.copy_out(built.wheel, stage / "raw")
        (stage / "labelled").mkdir(parents=True, exist_ok=True)
        return job.label(raw, stage / "labelled")

    labelled = steps("version label", label)
    # Before auditwheel: a wheel that needs a newer glibc than its torch fails here, with the
    # symbols that push it up (auditwheel would only say "too-recent versioned symbols").
    needs = steps(
        "symbol versions",
        lambda: check_needs_within(labelled, job.resolved.plat, job.resolved.plat_reason),
    )
    inside = session.copy_in(labelled, posixpath.join(session.workdir, "labelled"))
    (stage / "repaired").mkdir(parents=True, exist_ok=True)
    # The cell's resolved tag, explicitly: auditwheel adds every older tag the symbols allow
    # (manylinux_2_24_x86_64.manylinux_2_28_x86_64) and refuses anything newer.
    command = config.build_options.repair_wheel_command
    if command is not None:  # the project's own repair (cibuildwheel's repair-wheel-command)
        repaired_wheel = steps(
            "repair",
            lambda: repair_with_command(
                session,
                inside,
                stage / "repaired",
                command,
                project=built.project,
                options=config.build_options,
            ),
        )
    else:
        repaired_wheel = steps(
            "repair",
            lambda: repair_wheel(
                session,
                inside,
                stage / "repaired",
                auditwheel=auditwheel,
                env=auditwheel_env,
                excludes=excludes,
                plat=job.resolved.plat,
            ),
        ).wheel
    job.normalize(repaired_wheel)
    checked = steps(
        "verify",
        lambda: verify_cell_wheel(
            session,
            repaired_wheel,
            python=python,
            torch=cell.torch,
            auditwheel=auditwheel,
            auditwheel_env=auditwheel_env,
            excludes=excludes,
            wheelhouse=wheelhouse,
            index_url=config.pip.index_url,
            torch_site=built.torch_site,
            ceiling=job.resolved.plat,
            test=opts.test,
            project=built.project,
            options=config.build_options,
            cuda=job.resolved.cuda,
        ),
    )
    gxx = session.run(["g++", "--version"], check=False, step="compiler version")
    compiler = next((line for line in gxx.tail if line.strip()), "unknown") if gxx.ok else "?"
    out = Built(
        wheel=checked.wheel,
        torch=built.torch,
        compiler=compiler,
        tag=checked.tag,
        modules=checked.modules,
        base_image="",
        extra={"platform": platform_record(checked.tag, job.resolved.plat, needs)},
    )
    if built.ccache is not None:
        out.extra["ccache"] = asdict(built.ccache)
    libraries = compiled_files(checked.wheel).libraries  # loaded by verification, not imported
    if libraries:
        out.extra["libraries"] = list(libraries)
    if checked.cuda is not None:
        out.extra["cuda"] = checked.cuda  # version, arch list, each file's device code
    return out


def repair_with_command(
    session: Session,
    wheel: str,
    out_dir: Path,
    command: str,
    *,
    project: str,
    options: CibwOptions = NO_OPTIONS,
) -> Path:
    """cibuildwheel's ``repair-wheel-command`` through ``sh -c`` in the session (``{wheel}``:
    *wheel*, ``{dest_dir}``: an empty folder, ``{project}``/``{package}``: the project's copy);
    exactly one wheel must come out, a manylinux one (verification then checks it as it checks
    the builder's own repair). Returns it on the host, in *out_dir*."""
    dest = posixpath.join(session.workdir, f"repair-command-{uuid.uuid4().hex[:8]}")
    session.run(["mkdir", "-p", dest], step="repair-wheel-command")
    values = {
        "wheel": shlex.quote(wheel),
        "dest_dir": shlex.quote(dest),
        "project": shlex.quote(project),
        "package": shlex.quote(project),
    }
    line = re.sub(r"\{(wheel|dest_dir|project|package)\}", lambda m: values[m.group(1)], command)
    # cibuildwheel runs the repair in the build's environment: its assignments, as written,
    # evaluated by the same sh first (a passed variable is referred to by name only).
    assign = "".join(f"{name}={raw}; export {name}\n" for name, raw in options.environment)
    session.run(
        ["sh", "-c", assign + line],
        env=dict(options.passed(os.environ)) or None,
        step="repair-wheel-command",
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fetched = session.copy_out(dest, out_dir)
    produced = sorted(fetched.glob("*.whl"))
    if len(produced) != 1:
        raise StepFailed(
            f"repair-wheel-command {command!r} wrote {[p.name for p in produced]} "
            "to {dest_dir}; expected exactly one wheel"
        )
    tags = split_wheel_name(produced[0].name)[4]
    if not all(t.startswith("manylinux") for t in tags):
        raise StepFailed(
            f"repair-wheel-command {command!r} gave {produced[0].name}, which is "
            "not a manylinux wheel"
        )
    return produced[0]


def verify_shared_wheel(
    job: CellJob,
    session: Session,
    *,
    python: str,
    wheelhouse: Optional[str],
    auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]],
) -> Built:
    """Another cell's abi3 wheel, verified on this cell's Python (no compile, no repair)."""
    assert job.reuse is not None
    (job.stage / "shared").mkdir(parents=True, exist_ok=True)
    wheel = job.stage / "shared" / job.reuse.name
    shutil.copy2(job.reuse, wheel)
    # Nothing is compiled here, so the project is copied in only for its test-command.
    project = copy_project_in(session, job.opts.project) if job.opts.test.enabled else ""
    checked = job.steps(
        "verify",
        lambda: verify_cell_wheel(
            session,
            wheel,
            python=python,
            torch=job.cell.torch,
            auditwheel=auditwheel,
            auditwheel_env=auditwheel_env,
            excludes=tuple(job.config.build.auditwheel_exclude),
            wheelhouse=wheelhouse,
            index_url=job.config.pip.index_url,
            ceiling=job.resolved.plat,
            test=job.opts.test,
            project=project,
            options=job.config.build_options,
        ),
    )
    return Built(
        wheel=checked.wheel,
        torch=job.cell.torch,
        compiler="(not compiled: shared)",
        tag=checked.tag,
        modules=checked.modules,
        base_image="",
        extra={"platform": platform_record(checked.tag, job.resolved.plat, version_needs(wheel))},
    )


def verify_cell_wheel(
    session: Session,
    wheel: Path,
    *,
    python: str,
    torch: str,
    auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]],
    excludes: Sequence[str],
    wheelhouse: Optional[str],
    index_url: Optional[str],
    torch_site: str = "",
    ceiling: Optional[str] = None,
    test: ProjectTest = NO_TEST,
    project: str = "",
    options: CibwOptions = NO_OPTIONS,
    cuda: Optional[CudaRecord] = None,
) -> Verification:
    """D's three checks (builder.wheel.verify), with the tag check made exclusion-aware, plus
    the wheel's own ELF files against every tag in its name and the *ceiling* (torch's tag),
    and the project's own *test* (builder.config.projecttest) in the verification venv, with
    cibuildwheel's ``environment`` and ``environment-pass`` (*options*) applied as in the build.

    ``check_name_against_audit`` compares the name with ``auditwheel show``'s symbol tag,
    which counts the excluded libraries' own glibc needs (see builder.wheel.wheelcheck); when only
    that differs, the wheel's own ELF files decide.
    """
    check_no_bundled_torch(wheel)
    # A CUDA cell's device code against its arch list: read from the file, no GPU needed.
    device = check_device_code(wheel, cuda) if cuda is not None and cuda.enabled else None
    tags = split_wheel_name(wheel.name)[4]
    # Independent of auditwheel: what the wheel's own code needs, against each tag it claims.
    check_tag_covers_own_code(wheel, ceiling)
    inside = session.copy_in(wheel, posixpath.join(session.workdir, "audit"))
    audit = audit_wheel(session, inside, auditwheel=auditwheel, env=auditwheel_env)
    try:
        check_name_against_audit(wheel.name, audit, excludes)
    except StepFailed:
        if audit.sym_tag in tags or audit.unsupported_isa:
            raise
        # Only the symbol tag differs (excluded libraries counted): everything else still
        # checked; the own-code check above is what vouches for the tags.
        check_name_against_audit(wheel.name, replace(audit, sym_tag=tags[0]), excludes)
    modules = smoke_in_session(
        session,
        python=python,
        wheel=wheel,
        torch=torch,
        wheelhouse=wheelhouse,
        index_url=index_url,
        torch_site=torch_site or None,
        test=test,
        project=project,
        options=options,
        passed=options.passed(os.environ),
    )
    return Verification(wheel=wheel, tag=oldest_tag(tags), modules=tuple(modules), cuda=device)
