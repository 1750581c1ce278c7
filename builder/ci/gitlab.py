"""A GitLab CI pipeline (``.gitlab-ci.yml``) for a :class:`Workflow`.

GitLab hands a project's CI/CD variables to every job as environment variables under their
own names, so the settings need no mapping; the CA is a *File* variable (``BUILDER_CA_BUNDLE``
is then the path of a file holding it). A job that ``needs`` others gets their artifacts
unpacked at the paths they were saved from, so each job keeps its ``dist/`` as
``artifacts/dist-<cell>/``: the fan-in job sees one folder per job, as GitHub's does.
"""

from __future__ import annotations

from typing import Any

from builder.ci.jobs import (
    ARTIFACTS,
    INDEX,
    PUBLISH_COMMAND,
    PYPI_ENVIRONMENT,
    RELEASE,
    CiJob,
    Workflow,
    header,
    release_commands,
    set_up_commands,
)
from builder.ci.yamltext import dump
from builder.release.trusted import ID_TOKEN_ENV

#: Trusted publishing: the release's wheels PyPI takes (no local version), uploaded with the
#: job's OIDC token exchanged for a short-lived one (`publish --trusted-publishing`).
TRUSTED_PUBLISH_COMMAND = (f"{PUBLISH_COMMAND} --repository pypi --skip-local-versions "
                           "--trusted-publishing")

SETTINGS_SCRIPT = """\
if [ -n "${BUILDER_CA_BUNDLE:-}" ]; then
  cat /etc/ssl/certs/ca-certificates.crt "$BUILDER_CA_BUNDLE" > "$CI_PROJECT_DIR/.pip-ca.pem"
  export PIP_CERT="$CI_PROJECT_DIR/.pip-ca.pem"
fi
if [ -n "${BUILDER_INDEX_URL:-}" ]; then export PIP_INDEX_URL="$BUILDER_INDEX_URL"; fi
"""


#: The hidden job every job extends: proxy/CA/index, then the builder's environment.
TEMPLATE = ".builder"


def _cell_job(job: CiJob) -> dict[str, Any]:
    out = f"{ARTIFACTS}/{job.artifact}"
    script = []
    if job.builder_artifact:  # start from the wheel the builder job made (its dist/)
        script.append(f"cp -a {ARTIFACTS}/{job.builder_artifact} {out}")
    script.append(f"{job.make_wheel} OUT={out}")
    doc: dict[str, Any] = {
        "extends": TEMPLATE,
        "stage": job.kind,
        "tags": [job.runs_on],
        "needs": [{"job": job.builder, "artifacts": True}] if job.builder else [],
    }
    set_up = set_up_commands(job)
    if set_up != ["make builder-env"]:  # the cross / emulated tools first
        doc["before_script"] = [SETTINGS_SCRIPT, *set_up]
    doc.update({
        "script": script,
        "artifacts": {"name": job.artifact, "paths": [f"{out}/"], "when": "on_success"},
    })
    return doc


def render(wf: Workflow) -> str:
    jobs: dict[str, Any] = {TEMPLATE: {"before_script": [SETTINGS_SCRIPT, "make builder-env"]}}
    jobs.update({j.id: _cell_job(j) for j in wf.jobs})
    jobs["release"] = {
        "extends": TEMPLATE,
        "stage": "release",
        "tags": [wf.release_runs_on],
        "needs": [{"job": j.id, "artifacts": True} for j in wf.jobs],
        "script": release_commands(),
        "artifacts": {"name": "release", "paths": [f"{RELEASE}/", f"{INDEX}/"]},
    }
    publish: dict[str, Any] = {
        "stage": "release",
        "tags": [wf.release_runs_on],
        "needs": [{"job": "release", "artifacts": True}],
        "rules": [{"if": "$CI_COMMIT_TAG"}],
        # TWINE_REPOSITORY_URL, TWINE_USERNAME, TWINE_PASSWORD: the project's CI/CD variables
        "extends": TEMPLATE,
        "script": [PUBLISH_COMMAND],
    }
    if wf.publish == "trusted":
        # The OIDC token only in this job, for PyPI's audience; the environment is the one
        # PyPI's trusted publisher names (and where GitLab's protection rules apply).
        publish.update({"environment": PYPI_ENVIRONMENT,
                        "id_tokens": {ID_TOKEN_ENV: {"aud": "pypi"}},
                        "script": [TRUSTED_PUBLISH_COMMAND]})
    jobs["publish"] = publish
    doc = {"stages": ["build", "verify", "release"], **jobs}
    return header(wf, "gitlab") + dump(doc)
