"""Host-side driver of the in-cell steps (``steps.py`` is what runs inside the environment).

:func:`build_in_session` runs the same sequence in a container session and in a host session:
copy the project and the step script in, make a venv from the cell's interpreter, install
``torch==X`` (index or wheelhouse), build the wheel without build isolation. It returns the raw
(unrepaired) wheel's path *inside* the session, ready for :func:`builder.wheel.repair.repair_wheel`.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from builder.config.buildoptions import NO_OPTIONS, CibwOptions
from builder.config.projecttest import NO_TEST, ProjectTest, expand
from builder.config.uvpin import uv_pin
from builder.engines.base import RunResult, Session
from builder.errors import StepFailed
from builder.projecttree import CopyReport, copy_project_tree
from builder.wheel.modules import compiled_files

STEPS_SCRIPT = Path(__file__).with_name("steps.py")
RESULT_PREFIX = "AMPFORGE_RESULT "

#: The name every session's work directory has inside compiled files (``-ffile-prefix-map``):
#: the docker backend's own workdir, so there the mapping changes nothing, and host builds in
#: different temporary folders compile to the same bytes.
BUILD_PATH_ALIAS = "/ampforge"
#: The name the cell's torch environment (its site-packages: torch's headers, whose paths
#: torch's assertion macros put into the compiled code) has inside compiled files. The host
#: backend's torch environment lives in a cache folder named after its inputs -- another one
#: for a wheelhouse, a bundle or an index -- and must not make the same cell's wheel differ.
TORCH_SITE_ALIAS = "/ampforge-site-packages"


def local_version(torch: str) -> str:
    """The wheel's local version label for a torch release: ``2.13.0`` -> ``torch2.13``."""
    parts = torch.split("+")[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise StepFailed(f"expected a torch version like 2.13.0, got {torch!r}")
    return f"torch{parts[0]}.{parts[1]}"


def parse_result(result: RunResult) -> dict[str, Any]:
    """The JSON a step printed as its final ``AMPFORGE_RESULT`` line."""
    for line in reversed(result.tail):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    raise StepFailed(f"step {' '.join(result.argv[:3])} printed no result line")


def stage_project(src: Path, parent: Path) -> tuple[Path, CopyReport]:
    """A clean copy of the project under *parent* (no venvs, build trees or compiled files,
    nothing from outside it: builder.projecttree) and what it left out."""
    if not (src / "pyproject.toml").exists() and not (src / "setup.py").exists():
        raise StepFailed(f"{src} is not a Python project (no pyproject.toml or setup.py)")
    dest = parent / "project"
    return dest, copy_project_tree(src, dest)


@dataclass(frozen=True)
class CellBuild:
    wheel: str  # the raw wheel, path inside the session
    venv_python: str  # the build venv's interpreter inside the session
    torch: str  # the torch version actually installed (e.g. 2.13.0+cpu)
    shim: bool  # whether the single_threaded.h shim was used
    ccache: Optional[CcacheStats] = None  # this build's compiler-cache counts (--ccache)
    #: The folders holding a prepared torch environment's torch and its requirements
    #: (``prepared=``; os.pathsep-separated, as their metadata locates them: ``lib64/...`` and
    #: ``lib/...`` on RHEL-family interpreters, the interpreter's own when the venv borrows its
    #: torch): verification layers its venv on them instead of installing torch again. ""
    #: when the build installed torch itself.
    torch_site: str = ""
    #: The project's copy inside the session (what ``{project}`` names in a test-command).
    project: str = ""


@dataclass(frozen=True)
class CcacheStats:
    hits: int
    misses: int

    def __str__(self) -> str:
        return f"{self.hits} hits, {self.misses} misses"


def ccache_stats(log: str) -> CcacheStats:
    """Counts from a ``CCACHE_STATSLOG`` file: one statistic name a line per compilation
    (``direct_cache_hit``, ``preprocessed_cache_hit``, ``cache_miss``; ``#`` lines name the
    object)."""
    hits = misses = 0
    for line in log.splitlines():
        word = line.strip()
        if word.endswith("cache_hit"):
            hits += 1
        elif word == "cache_miss":
            misses += 1
    return CcacheStats(hits=hits, misses=misses)


def build_in_session(
    session: Session,
    *,
    python: str,
    torch: str,
    project: Path,
    wheelhouse: Optional[str] = None,
    index_url: Optional[str] = None,
    local_version_label: Optional[str] = None,
    shim: str = "auto",
    ccache: Optional[bool] = False,
    extra_requirements: Sequence[str] = ("setuptools", "wheel"),
    make_venv: bool = True,
    prepared: Optional[str] = None,
    cflags: Sequence[str] = (),
    options: CibwOptions = NO_OPTIONS,
    passed: Optional[Mapping[str, str]] = None,
    cuda_arch_list: str = "",
    cxx11_abi: Optional[bool] = None,
    cxx_floor: bool = False,
) -> CellBuild:
    """Build *project*'s wheel for ``torch==torch`` with interpreter *python* (inside the session).

    *wheelhouse* is a directory inside the session (bind-mounted or copied in): when given the
    install is offline (``--no-index``). *local_version_label* defaults to ``torchX.Y``; ""
    turns the check off (for projects that do not read ``AMP_LOCAL_VERSION``).
    ``make_venv=False`` builds with *python* itself. *prepared*: the interpreter of a torch
    environment made (and cached) beforehand (builder.backends.torchenv); nothing is installed,
    its torch and site-packages are only read back. *cflags*: added to every compile
    (``build.extra_cflags``). *options*: cibuildwheel's build options
    (builder.config.buildoptions); *passed*: the ``environment-pass`` variables, given to the
    build step's process only (never in its command line or the log). *cxx11_abi*: the cell
    torch's string ABI (the resolved record's; None: torch's cpp_extension decides alone);
    *cxx_floor*: compile with the C++ floor header (a manylinux2014 ceiling).
    """
    work = session.workdir
    project_in = copy_project_in(session, project)
    steps = session.copy_in(STEPS_SCRIPT, work)
    if prepared is not None:
        vpy = prepared
        installed = parse_result(session.run([vpy, steps, "site"], step="prepared torch"))
    else:
        vpy = python
        if make_venv:
            venv_dir = posixpath.join(work, "build-venv")
            made = parse_result(
                session.run([python, steps, "venv", venv_dir], step="create build venv")
            )
            vpy = str(made["python"])
        installed = install_torch(
            session,
            vpy,
            steps,
            torch=torch,
            wheelhouse=wheelhouse,
            index_url=index_url,
            extra_requirements=extra_requirements,
        )
    if prepared is not None and (options.before_build or options.build_frontend != "pip"):
        # before-build's installs, pypa/build and uv go into a venv of this build layered on
        # the prepared (cached, shared) torch environment, never into that environment itself.
        made = parse_result(
            session.run(
                [
                    python,
                    steps,
                    "venv",
                    posixpath.join(work, "build-venv"),
                    "--layer",
                    os.pathsep.join(installed.get("sites", ())),
                ],
                step="create build venv",
            )
        )
        vpy = str(made["python"])
    label = local_version(torch) if local_version_label is None else local_version_label
    argv = [
        vpy,
        steps,
        "build-wheel",
        "--project",
        project_in,
        "--out",
        posixpath.join(work, "raw"),
        "--local-version",
        label,
        "--shim",
        shim,
        "--prefix-map",
        f"{work}={BUILD_PATH_ALIAS}",
    ]
    if installed.get("site"):  # a prepared torch environment (a build venv is under work/)
        argv += ["--prefix-map", f"{installed['site']}={TORCH_SITE_ALIAS}"]
    if cuda_arch_list:
        # A CUDA cell (builder.plan.cudacell): its prepared environment holds the toolkit.
        if not installed.get("cuda_home"):
            raise StepFailed(
                f"a CUDA cell's torch environment {vpy} has no CUDA toolkit "
                "(nvidia/cu*/bin/nvcc): the backend did not install it"
            )
        argv += ["--cuda-home", str(installed["cuda_home"]), f"--cuda-arch-list={cuda_arch_list}"]
    argv += ["--ccache", {None: "auto", True: "on", False: "off"}[ccache]]
    if cxx11_abi is False:
        # The pre-C++11 ABI (the Ascend lines' torches) is checked against the installed torch
        # and defined; the C++11 one is GCC's default and what torch 2.8+ assumes without a
        # define, so modern cells compile exactly as before.
        argv += ["--cxx11-abi", "0"]
    if cxx_floor:
        argv.append("--cxx-floor")
    argv += [f"--cflag={flag}" for flag in cflags]  # "=": a flag starts with "-"
    argv += build_option_args(options, project_in)
    if wheelhouse:  # where pypa/build and uv (build[uv], uv) are installed from
        argv += ["--wheelhouse", wheelhouse]
    elif index_url:
        argv += ["--index-url", index_url]
    built = parse_result(session.run(argv, env=dict(passed or {}) or None, step="build wheel"))
    stats = None
    if built.get("ccache"):
        with tempfile.TemporaryDirectory(prefix="ampforge-ccache-") as tmp:
            try:
                got = session.copy_out(posixpath.join(work, "ccache-stats.log"), Path(tmp))
                stats = ccache_stats(got.read_text(errors="replace"))
            except StepFailed:  # nothing compiled (a pure-Python project): no log
                stats = CcacheStats(hits=0, misses=0)
    return CellBuild(
        wheel=str(built["wheel"]),
        venv_python=vpy,
        torch=str(installed["torch"]),
        shim=bool(built["shim"]),
        ccache=stats,
        torch_site=os.pathsep.join(installed.get("sites", ())) if prepared else "",
        project=project_in,
    )


def build_option_args(options: CibwOptions, project: str) -> list[str]:
    """The build step's arguments for cibuildwheel's options (``{project}``/``{package}``
    naming *project*, the project's copy in the session); "=" forms, as values may start with
    "-"."""
    argv = environment_args(options)
    for flag, command in (
        ("--before-all", options.before_all),
        ("--before-build", options.before_build),
    ):
        if command:
            argv.append(f"{flag}={expand(command, project=project, package=project)}")
    argv += [f"--config-setting={k}={v}" for k, v in options.config_settings]
    argv += ["--frontend", options.build_frontend]
    argv += [f"--frontend-arg={a}" for a in options.build_frontend_args]  # "=": "-n" too
    if options.uses_uv:  # the pin (configs/uv.txt), hashes and all
        argv.append(f"--uv-requirement={uv_pin().requirements_line()}")
    return argv


def environment_args(options: CibwOptions) -> list[str]:
    """cibuildwheel's ``environment`` as the in-cell steps take it (values as written: each
    step evaluates them in its own environment)."""
    return [f"--environment={name}={raw}" for name, raw in options.environment]


def copy_project_in(session: Session, project: Path) -> str:
    """A clean copy of *project* in the session's work folder (the build never sees the
    caller's tree: it works in this copy); its path there. What the copy left out is said in
    the cell's log."""
    with tempfile.TemporaryDirectory(prefix="ampforge-stage-") as tmp:
        staged, report = stage_project(project, Path(tmp))
        for line in report.lines():
            session.log.note(f"ampforge: {line}")
        return session.copy_in(staged, session.workdir)


def install_torch(
    session: Session,
    vpy: str,
    steps: str,
    *,
    torch: str,
    wheelhouse: Optional[str],
    index_url: Optional[str],
    extra_requirements: Sequence[str] = ("setuptools", "wheel"),
    env: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """``pip install torch==X`` and the build requirements into *vpy*'s environment."""
    sources: list[str] = []
    if wheelhouse:
        sources += ["--wheelhouse", wheelhouse]
    elif index_url:
        sources += ["--index-url", index_url]
    extras: list[str] = []
    for req in extra_requirements:
        extras += ["--extra", req]
    return parse_result(
        session.run(
            [vpy, steps, "install-torch", "--torch", torch, *sources, *extras],
            env=env,
            step=f"install torch=={torch}",
        )
    )


def install_toolkit(
    session: Session,
    vpy: str,
    steps: str,
    *,
    requirements: Sequence[str],
    hashed: bool,
    wheelhouse: Optional[str],
    index_url: Optional[str],
    env: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """A CUDA cell's toolkit pins (the resolved record's, ``--hash`` options included) into
    *vpy*'s environment; returns ``cuda_home`` and the nvcc version line."""
    with tempfile.TemporaryDirectory(prefix="ampforge-toolkit-") as tmp:
        req = Path(tmp) / "cuda-toolkit.txt"
        req.write_text("".join(line + "\n" for line in requirements))
        inside = session.copy_in(req, session.workdir)
    argv = [vpy, steps, "install-toolkit", "--requirements", inside]
    if hashed:
        argv.append("--hashed")
    if wheelhouse:
        argv += ["--wheelhouse", wheelhouse]
    elif index_url:
        argv += ["--index-url", index_url]
    return parse_result(session.run(argv, env=env, step="install CUDA toolkit"))


def smoke_in_session(
    session: Session,
    *,
    python: str,
    wheel: Path,
    torch: str,
    wheelhouse: Optional[str] = None,
    index_url: Optional[str] = None,
    torch_site: Optional[str] = None,
    test: ProjectTest = NO_TEST,
    project: str = "",
    options: CibwOptions = NO_OPTIONS,
    passed: Optional[Mapping[str, str]] = None,
) -> list[str]:
    """Copy host *wheel* in, install it with ``torch==torch`` into a fresh venv made by
    *python* (layered on *torch_site*, a prepared torch install, when given), import every
    extension module it ships and load its other shared objects (builder.wheel.modules), and
    run the project's *test* (its placeholders naming *project*, the project's copy inside the
    session); returns the modules imported. cibuildwheel's ``environment`` (*options*) and the
    ``environment-pass`` variables (*passed*, given to the step's process only) apply to all of
    it, as they do to the build. Raises StepFailed with the output tail when anything fails
    (the full output is in the cell's log)."""
    inside = session.copy_in(wheel, posixpath.join(session.workdir, "verify"))
    steps = session.copy_in(STEPS_SCRIPT, session.workdir)
    argv = [
        python,
        steps,
        "smoke",
        "--wheel",
        inside,
        "--torch",
        torch,
        "--venv",
        posixpath.join(session.workdir, "smoke-venv"),
    ]
    if wheelhouse:
        argv += ["--wheelhouse", wheelhouse]
    elif index_url:
        argv += ["--index-url", index_url]
    if torch_site:
        argv += ["--torch-site", torch_site]
    argv += environment_args(options)
    compiled = compiled_files(wheel)
    for module in compiled.modules:
        argv += ["--module", module]
    for library in compiled.libraries:
        argv += ["--library", library]
    step = "smoke test"
    if test.enabled:
        assert project, "a test-command needs the project's copy in the session"
        argv += ["--test-command", test.command_for(project), "--project", project]
        for req in test.install:  # test-requires, then the test-groups' requirements
            argv += ["--test-requires", req]
        before = test.before_for(project)
        if before:
            argv += ["--before-test", before]
        for extra in test.extras:
            argv += ["--test-extra", extra]
        for source in test.sources:
            argv += ["--test-source", source]
        step = "smoke test + test-command"
    return list(
        parse_result(session.run(argv, env=dict(passed or {}) or None, step=step))["modules"]
    )
