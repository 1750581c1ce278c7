"""A GitHub Actions workflow (``.github/workflows/wheels.yml``) for a :class:`Workflow`."""

from __future__ import annotations

from typing import Any

from builder.ci.jobs import (
    ARTIFACTS,
    BUILDER_PYTHON,
    INDEX,
    PROVISION,
    PUBLISH_SETTINGS,
    PYPI_ENVIRONMENT,
    PYPI_STAGE,
    RELEASE,
    SETTINGS,
    TOOL,
    TORCH_ENVS,
    CiJob,
    Setting,
    Workflow,
    builder_cli,
    header,
    install_tool,
    provision_command,
    publish_command,
    pypi_stage_command,
    release_commands,
)
from builder.ci.yamltext import Row, dump

CHECKOUT = "actions/checkout@v4"
SETUP_PYTHON = "actions/setup-python@v5"
UPLOAD = "actions/upload-artifact@v4"
DOWNLOAD = "actions/download-artifact@v4"
CACHE = "actions/cache@v4"
#: PyPA's uploader, pinned by the commit of a release tag: the one step that holds an upload
#: credential (the OIDC token it exchanges) runs code that cannot change under the same name.
#: Bump both together to a newer release's commit (the comment is its tag, as Dependabot
#: writes it): a re-render writes this pin over any edit of the file.
PYPI_PUBLISH_SHA = "ed0c53931b1dc9bd32cbe73a98c7f6766f8a527e"
PYPI_PUBLISH_VERSION = "v1.13.0"
PYPI_PUBLISH = f"pypa/gh-action-pypi-publish@{PYPI_PUBLISH_SHA}"
ON_TAG = "startsWith(github.ref, 'refs/tags/')"
VENV_KEY = (
    "builder-env-${{ runner.os }}-${{ runner.arch }}-${{ hashFiles('builder/requirements.lock') }}"
)

# The CA arrives as PEM text; the builder takes a file (BUILDER_CA_BUNDLE), and the runner's own
# pip (make builder-env) trusts it next to the system's CAs. The index reaches that pip too.
SETTINGS_SCRIPT = """\
if [ -n "$BUILDER_CA_PEM" ]; then
  printf '%s\\n' "$BUILDER_CA_PEM" > "$RUNNER_TEMP/builder-ca.pem"
  cat /etc/ssl/certs/ca-certificates.crt "$RUNNER_TEMP/builder-ca.pem" > "$RUNNER_TEMP/pip-ca.pem"
  echo "BUILDER_CA_BUNDLE=$RUNNER_TEMP/builder-ca.pem" >> "$GITHUB_ENV"
  echo "PIP_CERT=$RUNNER_TEMP/pip-ca.pem" >> "$GITHUB_ENV"
fi
if [ -n "$BUILDER_INDEX_URL" ]; then
  echo "PIP_INDEX_URL=$BUILDER_INDEX_URL" >> "$GITHUB_ENV"
fi
"""


def _ref(s: Setting) -> str:
    return "${{ " + ("secrets" if s.secret else "vars") + "." + s.name + " }}"


#: The cell's fields each matrix row carries (the record's), and the `make wheel` they give.
MATRIX_FIELDS = ("cell", "runs-on", "arch", "python", "torch", "backend", "pull")  # + cuda
MAKE_WHEEL = (
    "make wheel ARCH=${{ matrix.arch }} PY=${{ matrix.python }} "
    "TORCH=${{ matrix.torch }} BACKEND=${{ matrix.backend }} PULL=${{ matrix.pull }}"
)


def _row(job: CiJob, wf: Workflow) -> Row:
    values = dict(a.split("=", 1) for a in job.make_args)
    row = Row(
        {
            "cell": job.cell,
            "runs-on": job.runs_on,
            "arch": values["ARCH"],
            "python": values["PY"],
            "torch": values["TORCH"],
            "backend": values["BACKEND"],
            "pull": values["PULL"],
        }
    )
    if "CUDA" in values:
        row["cuda"] = values["CUDA"]
    if job.builder_artifact:
        row["built_by"] = job.builder_artifact
    if wf.third_party:
        row["env_key"] = job.env_key
    return row


#: The third-party job's build: the same record as `ampforge-build build` options, run from
#: the project's root (the installed tool builds the current folder).
TOOL_BUILD = (
    "ampforge-build build --arch ${{ matrix.arch }} --python ${{ matrix.python }} "
    "--torch ${{ matrix.torch }} --backend ${{ matrix.backend }} "
    "--pull ${{ matrix.pull }}"
)
#: The tool's own venv on a runner (a temporary folder of the job's, outside the checkout).
TOOL_VENV = "$RUNNER_TEMP/ampforge-build"
#: The builder's cache root on a hosted runner (builder/cache: ~/.cache/ampforge).
CACHE_ROOT = "~/.cache/ampforge"


def tool_build(job: CiJob) -> str:
    """A third-party job's build step: :data:`TOOL_BUILD`, the CUDA through the matrix, the
    config (a path in the project) as written, the output where `make wheel` puts it."""
    cuda = (
        ["--cuda ${{ matrix.cuda }}"] if any(a.startswith("CUDA=") for a in job.make_args) else []
    )
    config = [f"--config {a.split('=', 1)[1]}" for a in job.make_args if a.startswith("CONFIG=")]
    return " ".join([TOOL_BUILD, *cuda, *config, "--out dist"])


def make_wheel(job: CiJob) -> str:
    """The build step's command: the record's arguments through the matrix, the config's and
    project's (the same for every job) as written."""
    fixed = [a for a in job.make_args if a.split("=", 1)[0] in ("CONFIG", "PROJECT")]
    cuda = ["CUDA=${{ matrix.cuda }}"] if any(a.startswith("CUDA=") for a in job.make_args) else []
    return " ".join([MAKE_WHEEL, *cuda, *fixed])


#: What a CUDA cell's job removes first. Its torch with the nvidia-* wheels is a 3 GB download
#: and about 6 GB installed (the docker torch layer: 6.3 GB, docs/cuda-wheels.md), next to the
#: toolkit's 2 GB; GitHub states 14 GB of disk for a standard hosted runner. These folders are the
#: runner image's preinstalled toolchains no build here uses (.NET, Android SDK, GHC, CodeQL,
#: Swift): about 25 GB. Setup-python's interpreters (the rest of /opt/hostedtoolcache) stay.
FREE_DISK_PATHS = (
    "/usr/share/dotnet",
    "/usr/local/lib/android",
    "/opt/ghc",
    "/usr/local/.ghcup",
    "/opt/hostedtoolcache/CodeQL",
    "/usr/share/swift",
)
FREE_DISK_SCRIPT = (
    f"df -h / | tail -n 1\nsudo rm -rf {' '.join(FREE_DISK_PATHS)}\ndf -h / | tail -n 1\n"
)
FREE_DISK_NAME = "free disk for the CUDA torch"
FREE_DISK_IF = "matrix.cuda != 'cpu'"


def has_cuda(job: CiJob) -> bool:
    return any(a.startswith("CUDA=") and a != "CUDA=cpu" for a in job.make_args)


def _free_disk_step() -> dict[str, Any]:
    return {"name": FREE_DISK_NAME, "if": FREE_DISK_IF, "run": FREE_DISK_SCRIPT}


def _setup_steps(cell: bool, wf: Workflow) -> list[dict[str, Any]]:
    # The host backend builds with the cell's own Python, the builder runs on 3.11: the last
    # version listed is the default python3.
    versions = ("${{ matrix.python }}\n" if cell else "") + BUILDER_PYTHON + "\n"
    steps: list[dict[str, Any]] = [
        {"uses": CHECKOUT},
        {"uses": SETUP_PYTHON, "with": {"python-version": versions}},
        {"name": "proxy, CA and index", "run": SETTINGS_SCRIPT},
    ]
    if wf.third_party:
        return steps + _tool_steps(cell, wf)
    if cell:
        steps.append(
            {
                "name": "cross / emulation tools",
                "if": "matrix.backend == 'cross' || matrix.backend == 'emulated'",
                "run": PROVISION,
            }
        )
    # The builder's pinned environment, restored when the lock is unchanged (make builder-env
    # then finds its stamp and installs nothing).
    steps.append({"uses": CACHE, "with": {"path": ".venv", "key": VENV_KEY}})
    steps.append({"name": "set up", "run": "make builder-env"})
    return steps


def _tool_steps(cell: bool, wf: Workflow) -> list[dict[str, Any]]:
    """A project of its own: the builder installed as a tool (no ampforge checkout, no make),
    the cross/emulated tools from the script it carries, and the host backend's torch
    environments restored by the cell's key."""
    assert wf.tool is not None
    steps: list[dict[str, Any]] = [
        {
            "name": f"install {TOOL}",
            "run": install_tool(wf.tool, TOOL_VENV, f'echo "{TOOL_VENV}/bin" >> "$GITHUB_PATH"'),
        }
    ]
    if cell:
        steps.append(
            {
                "name": "cross / emulation tools",
                "if": "matrix.backend == 'cross' || matrix.backend == 'emulated'",
                "run": provision_command(TOOL_VENV),
            }
        )
        # The host backend's torch (several minutes and GB to install, CUDA's most) is a venv
        # under the builder's cache root, keyed by content; the key here is the cell record's
        # (builder/ci/jobs.py env_key), so a changed torch, CUDA pin or base image is a new
        # entry. A docker cell's torch is an image layer in the engine, not a folder to keep.
        steps.append(
            {
                "name": "torch environments",
                "if": "matrix.backend == 'host'",
                "uses": CACHE,
                "with": {"path": f"{CACHE_ROOT}/{TORCH_ENVS}", "key": "${{ matrix.env_key }}"},
            }
        )
    return steps


def _cell_jobs(jobs: list[CiJob], kind: str, needs: list[str], wf: Workflow) -> dict[str, Any]:
    steps = _setup_steps(cell=True, wf=wf)
    if any(has_cuda(j) for j in jobs):
        # First, before anything lands on the disk; only in a matrix with CUDA cells, so a
        # matrix without them renders as before.
        steps.insert(0, _free_disk_step())
    if kind == "verify":
        steps.append(
            {
                "name": "the stable-ABI wheel its build job made",
                "uses": DOWNLOAD,
                "with": {"name": "${{ matrix.built_by }}", "path": "dist"},
            }
        )
    steps.append(
        {"name": kind, "run": tool_build(jobs[0]) if wf.third_party else make_wheel(jobs[0])}
    )
    steps.append(
        {
            "name": "upload dist/",
            "uses": UPLOAD,
            "with": {
                "name": "dist-${{ matrix.cell }}",
                "path": "dist/",
                "if-no-files-found": "error",
            },
        }
    )
    doc: dict[str, Any] = {"name": kind + " ${{ matrix.cell }}", "runs-on": "${{ matrix.runs-on }}"}
    if needs:
        doc["needs"] = needs
    doc["strategy"] = {"fail-fast": False, "matrix": {"include": [_row(j, wf) for j in jobs]}}
    doc["steps"] = steps
    return doc


#: The count of wheels staged for PyPI, as a job output: the publish job is skipped when it
#: is 0 (a project with no stable-ABI wheel), where the uploader would fail on an empty folder.
PYPI_COUNT = f'echo "wheels=$(find {PYPI_STAGE} -name \'*.whl\' | wc -l)" >> "$GITHUB_OUTPUT"'


def _release_job(wf: Workflow, needs: list[str]) -> dict[str, Any]:
    steps = _setup_steps(cell=False, wf=wf)
    cli = builder_cli(wf)
    steps.append(
        {
            "name": "every job's dist/",
            "uses": DOWNLOAD,
            "with": {"pattern": "dist-*", "path": ARTIFACTS},
        }
    )
    steps += [{"name": cmd[len(cli) + 1 :], "run": cmd} for cmd in release_commands(cli)]
    steps.append(
        {
            "name": "upload the release",
            "uses": UPLOAD,
            "with": {"name": "release", "path": f"{RELEASE}/\n{INDEX}/\n"},
        }
    )
    if wf.publish == "token":
        steps.append(
            {
                "name": "publish",
                "if": ON_TAG,
                "env": {s.name: _ref(s) for s in PUBLISH_SETTINGS},
                "run": publish_command(cli),
            }
        )
        return {
            "name": "merge, index and publish",
            "runs-on": wf.release_runs_on,
            "needs": needs,
            "steps": steps,
        }
    # On every run, not only tags: a branch finds out what PyPI would get (and whether it
    # passes `twine check --strict`) before anyone pushes the tag.
    steps.append(
        {
            "name": "the wheels PyPI takes",
            "id": "pypi",
            "run": f"{pypi_stage_command(cli)}\n{PYPI_COUNT}\n",
        }
    )
    steps.append(
        {
            "name": "upload the wheels PyPI takes",
            "uses": UPLOAD,
            "with": {"name": "pypi", "path": f"{PYPI_STAGE}/", "if-no-files-found": "ignore"},
        }
    )
    return {
        "name": "merge and index",
        "runs-on": wf.release_runs_on,
        "needs": needs,
        "outputs": {"pypi_wheels": "${{ steps.pypi.outputs.wheels }}"},
        "steps": steps,
    }


def _publish_job(wf: Workflow) -> dict[str, Any]:
    """PyPI trusted publishing: a job of its own, so the OIDC token it may mint is reachable
    from two steps that run no project code (no checkout, no builder), on tags only, in the
    environment PyPI's publisher names."""
    return {
        "name": "publish to PyPI (trusted publishing)",
        "needs": ["release"],
        "if": f"{ON_TAG} && needs.release.outputs.pypi_wheels != '0'",
        "runs-on": wf.release_runs_on,
        "environment": PYPI_ENVIRONMENT,
        "permissions": {"contents": "read", "id-token": "write"},
        "steps": [
            {
                "name": "the wheels PyPI takes",
                "uses": DOWNLOAD,
                "with": {"name": "pypi", "path": PYPI_STAGE},
            },
            # No password: the action exchanges the job's OIDC token for a short-lived PyPI
            # token, and signs each wheel (PEP 740 attestations, shown on PyPI).
            {
                "name": "upload to PyPI",
                "uses": PYPI_PUBLISH,
                "with": {"packages-dir": f"{PYPI_STAGE}/", "attestations": True},
            },
        ],
    }


def render(wf: Workflow) -> str:
    """One matrix job of the build jobs (a job per wheel), one of the verify jobs after it
    (a verify job needs its builder's artifact; a matrix can only wait for a whole matrix),
    then the release job."""
    jobs: dict[str, Any] = {}
    for kind in ("build", "verify"):
        cells = [j for j in wf.jobs if j.kind == kind]
        if cells:
            jobs[kind] = _cell_jobs(cells, kind, needs=list(jobs), wf=wf)
    jobs["release"] = _release_job(wf, needs=list(jobs))
    if wf.publish == "trusted":
        jobs["publish"] = _publish_job(wf)
    doc: dict[str, Any] = {
        "name": "wheels",
        "on": {
            "push": {"branches": ["main"], "tags": ["v*"]},
            "pull_request": {},
            "workflow_dispatch": {},
        },
        "permissions": {"contents": "read"},
        "env": {s.name: _ref(s) for s in SETTINGS},
        "jobs": jobs,
    }
    # YAML has no place for the version in the data: the pin's comment, as Dependabot reads it.
    text = dump(doc).replace(
        f"uses: {PYPI_PUBLISH}\n", f"uses: {PYPI_PUBLISH}  # {PYPI_PUBLISH_VERSION}\n"
    )
    return header(wf, "github") + text
