"""The jobs of a CI workflow, from the resolved plan: what GitHub's and GitLab's files say.

One job per wheel to build (``plan --format github --github-jobs build``), on the runner its
record names; one job per cell that only verifies another job's stable-ABI wheel (``--github-
jobs verify``), after that job and with its ``dist/`` as input; one fan-in job that merges every
job's ``dist/`` (``merge``), indexes the release per torch series and publishes it on tags.
Each job's ``make wheel`` arguments are the record's (arch, Python, torch, backend, pull
policy); nothing here decides them again.

Proxy, CA and index reach the jobs by name from the CI's own settings (secrets and variables),
never by value: :data:`SETTINGS` lists them, each with the builder's variable it feeds.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.backend_kinds import backend_kind
from builder.ci import PUBLISH_MODES
from builder.commands.plan import github_job
from builder.config import Settings
from builder.config.cuda import CPU
from builder.errors import ConfigError
from builder.plan.resolve import Resolution

#: The builder's own Python (the Makefile's venv interpreter).
BUILDER_PYTHON = "3.11"
#: Where the fan-in job puts each job's dist/ (one folder per artifact) and what it writes.
ARTIFACTS = "artifacts"
RELEASE = "release"
INDEX = "build/index"
VENV_PYTHON = ".venv/bin/python"


@dataclass(frozen=True)
class Setting:
    """A value the CI provides by name: (variable, secret?, what it is)."""

    name: str
    secret: bool
    what: str


#: Proxy (secrets: they may carry a password), index and CA (variables: public).
SETTINGS: tuple[Setting, ...] = (
    Setting("HTTP_PROXY", True, "proxy for HTTP, may carry user:password"),
    Setting("HTTPS_PROXY", True, "proxy for HTTPS, may carry user:password"),
    Setting("NO_PROXY", False, "hosts reached directly"),
    Setting("BUILDER_INDEX_URL", False, "the package index the builds install from"),
    Setting("BUILDER_CA_PEM", False, "extra CA certificates (PEM text) of a proxy or index"),
)
#: The publish step's credentials in ``token`` mode, twine's own variables.
PUBLISH_SETTINGS: tuple[Setting, ...] = (
    Setting("TWINE_REPOSITORY_URL", False, "the repository `publish` uploads to"),
    Setting("TWINE_USERNAME", True, "its user"),
    Setting("TWINE_PASSWORD", True, "its password or token"),
)


@dataclass(frozen=True)
class CiJob:
    id: str  # a job id both services accept
    cell: str
    kind: str  # "build" or "verify"
    runs_on: str
    backend: str
    python: str
    make_args: tuple[str, ...]
    artifact: str  # the name of the dist/ it uploads: dist-<cell>
    builder: Optional[str] = None  # verify: the id of the job whose wheel it verifies
    builder_artifact: Optional[str] = None

    @property
    def make_wheel(self) -> str:
        return shlex.join(("make", "wheel", *self.make_args))


@dataclass(frozen=True)
class Workflow:
    jobs: tuple[CiJob, ...]
    release_runs_on: str
    config: str  # the config file the plan came from, as the workflow names it
    source: str  # the command that rendered it
    publish: str = PUBLISH_MODES[0]  # trusted | token (builder/ci/__init__.py)


def job_id(kind: str, cell: str) -> str:
    """``build-cp311-manylinux_x86_64-torch2_13_0``: letters, digits, ``-`` and ``_`` only."""
    return f"{kind}-" + re.sub(r"[^A-Za-z0-9_-]", "_", cell)


def in_checkout(value: Optional[str], option: str) -> Optional[str]:
    """*value* (a path) as a CI job names it: relative to the checkout (the current folder).
    A path outside it is a usage error: a runner has nothing but the checkout."""
    if value is None:
        return None
    here = Path.cwd().resolve()
    path = Path(value)
    full = (path if path.is_absolute() else here / path).resolve()
    try:
        return full.relative_to(here).as_posix()
    except ValueError:
        raise ConfigError(f"{value!r} is outside this checkout ({here}); a CI job has only "
                          "the checkout: give a path inside it", key=option) from None


def workflow(settings: Settings, resolution: Resolution, *, config: Optional[str],
             project: Optional[str], source: str,
             publish: str = PUBLISH_MODES[0]) -> Workflow:
    """The jobs for *resolution*, each with its ``make wheel`` arguments from its record."""
    by_cell = {c.identifier: c for c in resolution.cells}
    rows = [github_job(c, settings) for c in resolution.cells]
    # A matrix with a CUDA axis has cells that differ only in CUDA: each job names its own, or
    # `make wheel` would build every CUDA of its (arch, Python, torch), cpu included.
    with_cuda = any(c.cell.cuda != CPU for c in resolution.cells)
    ids = {str(r["cell"]): job_id(str(r["job"]), str(r["cell"])) for r in rows}
    jobs = []
    for row in rows:
        cell = by_cell[str(row["cell"])]
        args = [f"ARCH={row['arch']}", f"PY={row['python']}", f"TORCH={row['torch']}",
                f"BACKEND={row['backend']}", f"PULL={cell.settings['pull']['policy']}"]
        if with_cuda:
            args.append(f"CUDA={cell.cell.cuda}")
        if config:
            args.append(f"CONFIG={config}")
        if project:
            args.append(f"PROJECT={project}")
        builder = str(row["built_by"])
        verify = row["job"] == "verify"
        jobs.append(CiJob(
            id=ids[cell.identifier], cell=cell.identifier, kind=str(row["job"]),
            runs_on=str(row["runs-on"]), backend=cell.backend, python=cell.cell.python,
            make_args=tuple(args), artifact=artifact_name(cell.identifier),
            builder=ids[builder] if verify else None,
            builder_artifact=artifact_name(builder) if verify else None))
    runners = settings.config.runners
    release_on = runners.get("x86_64") or next(iter(runners.values()), "ubuntu-24.04")
    return Workflow(jobs=tuple(jobs), release_runs_on=release_on,
                    config=config or "configs/matrix.yaml", source=source, publish=publish)


def artifact_name(cell: str) -> str:
    return f"dist-{cell}"


#: The aarch64 cross toolchain, QEMU and binfmt_misc (idempotent; needs root).
PROVISION = "sudo builder/cross/provision.sh"


def set_up_commands(job: CiJob) -> list[str]:
    """The README's set-up for a job's backend: the cross/emulated tools, the builder's env."""
    steps = []
    if backend_kind(job.backend).foreign:
        steps.append(PROVISION)
    steps.append("make builder-env")
    return steps


def release_commands() -> list[str]:
    """The fan-in job's steps after every artifact is in ARTIFACTS/<name>/."""
    # One index per torch series (safe next to the index torch comes from), and one of every
    # wheel (build/index/simple/): a stable-ABI wheel is on every series page its range admits,
    # which may be none when every newer torch's cells take it.
    return [f"{VENV_PYTHON} -m builder merge {ARTIFACTS}/dist-* --out {RELEASE}",
            f"{VENV_PYTHON} -m builder index {RELEASE} --per-torch --out {INDEX}",
            f"{VENV_PYTHON} -m builder index {RELEASE} --out {INDEX}"]


PUBLISH_COMMAND = f"{VENV_PYTHON} -m builder publish {RELEASE}"
#: Where the release job puts the wheels PyPI takes (no local version: the stable-ABI ones),
#: checked as `publish` checks an upload to PyPI; the labelled ones stay in the per-torch index.
PYPI_STAGE = "pypi-dist"
PYPI_STAGE_COMMAND = (f"{VENV_PYTHON} -m builder publish {RELEASE} --repository pypi "
                      f"--skip-local-versions --stage {PYPI_STAGE}")
#: The GitHub environment the publish job runs in: PyPI's trusted publisher names it, and its
#: protection rules (required reviewers, tags only) are the maintainers' release approval.
PYPI_ENVIRONMENT = "pypi"


def header(wf: Workflow, service: str) -> str:
    """The comment at the top of the file: where it came from and what it needs."""
    names = ", ".join(s.name for s in SETTINGS if service == "github" or s.name != "BUILDER_CA_PEM")
    if service == "gitlab":
        names += ", BUILDER_CA_BUNDLE (a File variable)"
    builds = sum(j.kind == "build" for j in wf.jobs)
    if wf.publish == "token":
        release = "one release job (merge, index --per-torch; publish on tags)."
    elif service == "github":
        release = (f"one release job (merge, index --per-torch, the wheels PyPI takes), one "
                   f"publish job on tags (PyPI trusted publishing, environment "
                   f"{PYPI_ENVIRONMENT}).")
    else:
        release = ("one release job (merge, index --per-torch), one publish job on tags "
                   "(the wheels PyPI takes, by PyPI trusted publishing: id_tokens aud pypi).")
    lines = [
        f"Rendered by `{wf.source}` from {wf.config}: re-render it after changing the config.",
        f"{builds} build job(s) (one per wheel), {len(wf.jobs) - builds} verify job(s) (a cell "
        f"served by another job's stable-ABI wheel), {release}",
        f"Proxy / CA / index come from the CI's settings by name ({names}); unset ones are "
        "empty and ignored.",
    ]
    if service == "gitlab":
        lines.append("Runners are chosen by tag (the config's `runners:` labels); they need "
                     "make, python3.11 and the backend's tools (docker for BACKEND=docker).")
    return "".join(f"# {line}\n" for line in lines)

