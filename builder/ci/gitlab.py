"""A GitLab CI pipeline (``.gitlab-ci.yml``) for a :class:`Workflow`.

GitLab hands a project's CI/CD variables to every job as environment variables under their
own names, so the settings need no mapping; the CA is a *File* variable (``BUILDER_CA_BUNDLE``
is then the path of a file holding it). A job that ``needs`` others gets their artifacts
unpacked at the paths they were saved from, so each job keeps its ``dist/`` as
``artifacts/dist-<cell>/``: the fan-in job sees one folder per job, as GitHub's does.
"""

from __future__ import annotations

import shlex
from typing import Any

from builder.backend_kinds import HOST, backend_kind
from builder.ci.jobs import (
    ARTIFACTS,
    INDEX,
    PYPI_ENVIRONMENT,
    RELEASE,
    TORCH_ENVS,
    CiJob,
    Workflow,
    builder_cli,
    header,
    install_tool,
    provision_command,
    publish_command,
    release_commands,
    set_up_commands,
)
from builder.ci.yamltext import dump
from builder.release.trusted import ID_TOKEN_ENV


def trusted_publish_command(cli: str) -> str:
    """Trusted publishing: the release's wheels PyPI takes (no local version), uploaded with
    the job's OIDC token exchanged for a short-lived one (`publish --trusted-publishing`)."""
    return f"{publish_command(cli)} --repository pypi --skip-local-versions --trusted-publishing"


TRUSTED_PUBLISH_COMMAND = trusted_publish_command(builder_cli())
#: A third-party job's builder venv, in the project's folder (GitLab caches and cleans only
#: there), and the builder's cache root beside it: a job's `cache:` keeps its torch-envs.
TOOL_VENV = "$CI_PROJECT_DIR/.ampforge-build"
CACHE_DIR = ".ampforge-cache"

SETTINGS_SCRIPT = """\
if [ -n "${BUILDER_CA_BUNDLE:-}" ]; then
  cat /etc/ssl/certs/ca-certificates.crt "$BUILDER_CA_BUNDLE" > "$CI_PROJECT_DIR/.pip-ca.pem"
  export PIP_CERT="$CI_PROJECT_DIR/.pip-ca.pem"
fi
if [ -n "${BUILDER_INDEX_URL:-}" ]; then export PIP_INDEX_URL="$BUILDER_INDEX_URL"; fi
"""


#: The hidden job every job extends: proxy/CA/index, then the builder's environment.
TEMPLATE = ".builder"


_PATH = f'export PATH="{TOOL_VENV}/bin:$PATH"'


def _cell_job(job: CiJob, wf: Workflow) -> dict[str, Any]:
    out = f"{ARTIFACTS}/{job.artifact}"
    script = []
    if job.builder_artifact:  # start from the wheel the builder job made (its dist/)
        script.append(f"cp -a {ARTIFACTS}/{job.builder_artifact} {out}")
    if wf.third_party:  # the installed tool, from the project's root (no make)
        script.append(shlex.join((*shlex.split(job.tool_build), "--out", out)))
    else:
        script.append(f"{job.make_wheel} OUT={out}")
    doc: dict[str, Any] = {
        "extends": TEMPLATE,
        "stage": job.kind,
        "tags": [job.runs_on],
        "needs": [{"job": job.builder, "artifacts": True}] if job.builder else [],
    }
    if wf.third_party:
        assert wf.tool is not None
        if backend_kind(job.backend).foreign:
            doc["before_script"] = [
                SETTINGS_SCRIPT,
                install_tool(wf.tool, TOOL_VENV, _PATH),
                provision_command(TOOL_VENV),
            ]
        if job.backend == HOST.name:
            # The host backend's torch environments (a venv per cell torch, minutes and GB to
            # make) under the builder's cache root, kept between pipelines by the cell
            # record's key (builder/ci/jobs.py env_key); a docker cell's is an engine layer.
            doc["variables"] = {"AMPFORGE_CACHE": f"$CI_PROJECT_DIR/{CACHE_DIR}"}
            doc["cache"] = {"key": job.env_key, "paths": [f"{CACHE_DIR}/{TORCH_ENVS}/"]}
    else:
        set_up = set_up_commands(job)
        if set_up != ["make builder-env"]:  # the cross / emulated tools first
            doc["before_script"] = [SETTINGS_SCRIPT, *set_up]
    doc.update(
        {
            "script": script,
            "artifacts": {"name": job.artifact, "paths": [f"{out}/"], "when": "on_success"},
        }
    )
    return doc


def render(wf: Workflow) -> str:
    cli = builder_cli(wf)
    set_up = install_tool(wf.tool, TOOL_VENV, _PATH) if wf.tool is not None else "make builder-env"
    jobs: dict[str, Any] = {TEMPLATE: {"before_script": [SETTINGS_SCRIPT, set_up]}}
    jobs.update({j.id: _cell_job(j, wf) for j in wf.jobs})
    jobs["release"] = {
        "extends": TEMPLATE,
        "stage": "release",
        "tags": [wf.release_runs_on],
        "needs": [{"job": j.id, "artifacts": True} for j in wf.jobs],
        "script": release_commands(cli),
        "artifacts": {"name": "release", "paths": [f"{RELEASE}/", f"{INDEX}/"]},
    }
    publish: dict[str, Any] = {
        "stage": "release",
        "tags": [wf.release_runs_on],
        "needs": [{"job": "release", "artifacts": True}],
        "rules": [{"if": "$CI_COMMIT_TAG"}],
        # TWINE_REPOSITORY_URL, TWINE_USERNAME, TWINE_PASSWORD: the project's CI/CD variables
        "extends": TEMPLATE,
        "script": [publish_command(cli)],
    }
    if wf.publish == "trusted":
        # The OIDC token only in this job, for PyPI's audience; the environment is the one
        # PyPI's trusted publisher names (and where GitLab's protection rules apply).
        publish.update(
            {
                "environment": PYPI_ENVIRONMENT,
                "id_tokens": {ID_TOKEN_ENV: {"aud": "pypi"}},
                "script": [trusted_publish_command(cli)],
            }
        )
    jobs["publish"] = publish
    doc = {"stages": ["build", "verify", "release"], **jobs}
    return header(wf, "gitlab") + dump(doc)
