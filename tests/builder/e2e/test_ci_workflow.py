"""``render --ci github|gitlab``: a CI workflow a user can commit, from the resolved plan.

The default matrix's files validate against the GitHub-workflow and GitLab-CI schemas that
check-jsonschema bundles (no network), and say what ``plan`` says: one build job per wheel on
its record's runner with the record's ``make wheel`` arguments, a verify job per cell another
job's stable-ABI wheel serves (with that job's artifact), one release job over every artifact;
proxies by name, never by value. Then a tiny project's workflow is run here: its jobs' steps as
written, each job in its own fresh clone (tests/builder/helpers/cilib.py), the release job over
their artifacts.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import twine.utils
import yaml
from helpers.builder_testlib import run_cli
from helpers.cilib import (
    OWN_TINY_CONFIG,
    Runner,
    base_env,
    commit_all,
    condition,
    source_repository,
)
from helpers.enginelib import write_tiny_extension
from helpers.indexlib import make_wheel

from builder.config import REPO_ROOT
from builder.release.manifest import ManifestEntry, record_wheel

PASSWORD = "Pr0xy-s3cret-9d2e"
PROXY_ENV = {"HTTPS_PROXY": f"http://ci:{PASSWORD}@proxy.example:3128"}
SCHEMAS = {"github": "vendor.github-workflows", "gitlab": "vendor.gitlab-ci"}


def _validates(ci: str, path: Path) -> None:
    """*path* against the service's own schema (check-jsonschema's bundled copy, no network)."""
    check = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMAS[ci], str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def _render(tmp_path: Path, ci: str, *extra: str) -> tuple[str, dict]:
    out = tmp_path / f"{ci}.yml"
    res = run_cli("render", "--ci", ci, *extra, "--out", str(out), env=PROXY_ENV)
    assert res.rc == 0, res.err
    assert res.out.startswith(f"wrote {out}: 20 build job(s), 6 verify job(s), 1 release job")
    assert "note: --ci: BACKEND=docker for every job" in res.err
    _validates(ci, out)
    text = out.read_text()
    assert PASSWORD not in text and "proxy.example" not in text
    return text, yaml.safe_load(text)


def _plan_jobs(kind: str) -> list[dict]:
    res = run_cli("plan", "--format", "github", "--github-jobs", kind, "--backend", "docker")
    assert res.rc == 0, res.err
    return json.loads(res.out)["include"]


def test_the_default_matrix_github_workflow_validates_and_follows_the_plan(tmp_path: Path) -> None:
    text, doc = _render(tmp_path, "github")
    jobs = doc["jobs"]
    assert list(jobs) == ["build", "verify", "release", "publish"]
    fields = ("cell", "runs-on", "arch", "python", "torch", "backend")
    for kind in ("build", "verify"):
        rows = jobs[kind]["strategy"]["matrix"]["include"]
        plan = _plan_jobs(kind)
        assert [{k: r[k] for k in fields} for r in rows] == [
            {k: str(p[k]) for k in fields} for p in plan
        ]
        assert {r["pull"] for r in rows} == {"missing"}
        assert jobs[kind]["runs-on"] == "${{ matrix.runs-on }}"
        run = [s["run"] for s in jobs[kind]["steps"] if s.get("name") == kind]
        assert run == [
            "make wheel ARCH=${{ matrix.arch }} PY=${{ matrix.python }} TORCH=${{ "
            "matrix.torch }} BACKEND=${{ matrix.backend }} PULL=${{ matrix.pull }}"
        ]
        upload = jobs[kind]["steps"][-1]
        assert upload["with"] == {
            "name": "dist-${{ matrix.cell }}",
            "path": "dist/",
            "if-no-files-found": "error",
        }
    # 8 of 26 cells need an arm64 runner; the stable wheel's verifiers take its builder's dist/.
    build_rows = jobs["build"]["strategy"]["matrix"]["include"]
    assert sum(r["runs-on"] == "ubuntu-24.04-arm" for r in build_rows) == 10
    for row, plan in zip(jobs["verify"]["strategy"]["matrix"]["include"], _plan_jobs("verify")):
        assert row["built_by"] == f"dist-{plan['built_by']}"
    assert jobs["verify"]["needs"] == ["build"]
    download = [s for s in jobs["verify"]["steps"] if "download-artifact" in s.get("uses", "")]
    assert download[0]["with"] == {"name": "${{ matrix.built_by }}", "path": "dist"}
    release = jobs["release"]
    assert release["needs"] == ["build", "verify"]
    runs = [s["run"] for s in release["steps"] if "run" in s]
    assert ".venv/bin/python -m builder merge artifacts/dist-* --out release" in runs
    assert ".venv/bin/python -m builder index release --per-torch --out build/index" in runs
    assert ".venv/bin/python -m builder index release --out build/index" in runs
    # Settings by name: the proxy is a secret reference, whatever this shell held.
    assert doc["env"]["HTTPS_PROXY"] == "${{ secrets.HTTPS_PROXY }}"
    assert doc["env"]["BUILDER_INDEX_URL"] == "${{ vars.BUILDER_INDEX_URL }}"
    assert text.startswith(
        "# Rendered by `python -m builder render --ci github` from configs/matrix.yaml"
    )
    # Deterministic: the same plan gives the same bytes.
    assert _render(tmp_path / "again", "github")[0] == text


def _no_registry_host(text: str) -> None:
    """PyPI's upload URL is twine's (``publish --repository pypi``): no host of it is written
    into the file (the upload host, nor the index's domain under it)."""
    for url in (twine.utils.DEFAULT_REPOSITORY, twine.utils.TEST_REPOSITORY):
        host = urlsplit(url).hostname or ""
        assert host and host not in text and host.split(".", 1)[1] not in text, host


PINNED = re.compile(r"pypa/gh-action-pypi-publish@[0-9a-f]{40}")


def test_the_github_release_is_published_by_trusted_publishing_by_default(tmp_path: Path) -> None:
    """No stored password: the publish job alone may mint an OIDC token, runs no project code,
    and uploads only what PyPI takes, with the uploader pinned by commit."""
    text, doc = _render(tmp_path, "github")  # validated against GitHub's schema in _render
    jobs = doc["jobs"]
    assert doc["permissions"] == {"contents": "read"}
    for job_id, job in jobs.items():
        if job_id != "publish":
            assert "id-token" not in job.get("permissions", {}), job_id
    publish = jobs["publish"]
    assert publish["permissions"] == {"contents": "read", "id-token": "write"}
    assert publish["environment"] == "pypi"
    assert publish["needs"] == ["release"]
    assert publish["if"] == (
        "startsWith(github.ref, 'refs/tags/') && needs.release.outputs.pypi_wheels != '0'"
    )
    download, upload = publish["steps"]
    assert "run" not in download and "run" not in upload  # no checkout, no builder: no code
    assert download["uses"].startswith("actions/download-artifact@")
    assert download["with"] == {"name": "pypi", "path": "pypi-dist"}
    assert PINNED.fullmatch(upload["uses"]), upload["uses"]
    assert upload["with"] == {"packages-dir": "pypi-dist/", "attestations": True}
    (line,) = [ln for ln in text.splitlines() if "gh-action-pypi-publish@" in ln]
    assert re.search(r"@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line  # the tag it is
    # The release job stages what PyPI takes, on every run (a branch sees it before the tag).
    release = jobs["release"]
    (stage,) = [s for s in release["steps"] if s.get("id") == "pypi"]
    assert "if" not in stage
    assert stage["run"].startswith(
        ".venv/bin/python -m builder publish release --repository "
        "pypi --skip-local-versions --stage pypi-dist\n"
    )
    assert release["outputs"] == {"pypi_wheels": "${{ steps.pypi.outputs.wheels }}"}
    assert [
        s["with"]["name"] for s in release["steps"] if "upload-artifact" in s.get("uses", "")
    ] == ["release", "pypi"]
    assert "TWINE" not in text and "secrets.TWINE_PASSWORD" not in text
    _no_registry_host(text)


def test_the_token_mode_keeps_the_twine_secrets_publish_step(tmp_path: Path) -> None:
    text, doc = _render(tmp_path, "github", "--publish", "token")
    jobs = doc["jobs"]
    assert list(jobs) == ["build", "verify", "release"]
    publish = jobs["release"]["steps"][-1]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/')"
    assert publish["run"] == ".venv/bin/python -m builder publish release"
    assert publish["env"] == {
        "TWINE_REPOSITORY_URL": "${{ vars.TWINE_REPOSITORY_URL }}",
        "TWINE_USERNAME": "${{ secrets.TWINE_USERNAME }}",
        "TWINE_PASSWORD": "${{ secrets.TWINE_PASSWORD }}",
    }
    assert "id-token" not in text and "gh-action-pypi-publish" not in text
    assert text.startswith(
        "# Rendered by `python -m builder render --ci github --publish "
        "token` from configs/matrix.yaml"
    )
    # The default's other jobs are the same jobs.
    _, default = _render(tmp_path / "default", "github")
    assert {k: default["jobs"][k] for k in ("build", "verify")} == {
        k: jobs[k] for k in ("build", "verify")
    }


def test_the_default_matrix_gitlab_pipeline_validates_and_follows_the_plan(tmp_path: Path) -> None:
    _, doc = _render(tmp_path, "gitlab")
    plan = {j["cell"]: j for j in _plan_jobs("build") + _plan_jobs("verify")}
    cells = {k: v for k, v in doc.items() if k.startswith(("build-", "verify-"))}
    assert len(cells) == 26
    ids = {}
    for job_id, job in cells.items():
        (line,) = [s for s in job["script"] if s.startswith("make wheel")]
        cell = line.rsplit("OUT=artifacts/dist-", 1)[1]
        p = plan[cell]
        ids[cell] = job_id
        assert line == (
            f"make wheel ARCH={p['arch']} PY={p['python']} TORCH={p['torch']} "
            f"BACKEND=docker PULL=missing OUT=artifacts/dist-{cell}"
        )
        assert job["tags"] == [p["runs-on"]] and job["stage"] == p["job"]
        assert job["artifacts"]["paths"] == [f"artifacts/dist-{cell}/"]
    for cell, job_id in ids.items():
        if plan[cell]["job"] == "verify":
            builder = plan[cell]["built_by"]
            assert cells[job_id]["needs"] == [{"job": ids[builder], "artifacts": True}]
            assert cells[job_id]["script"][0] == (
                f"cp -a artifacts/dist-{builder} artifacts/dist-{cell}"
            )
    assert sorted(n["job"] for n in doc["release"]["needs"]) == sorted(cells)
    assert doc["publish"]["rules"] == [{"if": "$CI_COMMIT_TAG"}]


def test_the_gitlab_publish_job_uses_trusted_publishing_unless_told_token(tmp_path: Path) -> None:
    text, doc = _render(tmp_path, "gitlab")  # validated against GitLab's schema in _render
    publish = doc["publish"]
    assert publish["id_tokens"] == {"PYPI_ID_TOKEN": {"aud": "pypi"}}
    assert [k for k, job in doc.items() if isinstance(job, dict) and "id_tokens" in job] == [
        "publish"
    ]
    assert publish["environment"] == "pypi"
    assert publish["script"] == [
        ".venv/bin/python -m builder publish release --repository pypi "
        "--skip-local-versions --trusted-publishing"
    ]
    assert "TWINE" not in text
    _no_registry_host(text)

    text, doc = _render(tmp_path / "token", "gitlab", "--publish", "token")
    assert doc["publish"]["script"] == [".venv/bin/python -m builder publish release"]
    assert "id_tokens" not in text and "environment" not in doc["publish"]
    assert doc["publish"]["rules"] == [{"if": "$CI_COMMIT_TAG"}]


def test_each_job_of_a_cuda_matrix_builds_only_its_own_cell(tmp_path: Path) -> None:
    """configs/cuda.yaml has cells that differ only in CUDA (cpu and 13.0): every job names its
    CUDA, so its `make wheel` selects its cell alone (without it, the cpu job would build the
    CUDA cell too, and each CUDA job the cpu one)."""
    out = {ci: tmp_path / f"{ci}.yml" for ci in ("github", "gitlab")}
    for ci, path in out.items():
        res = run_cli("render", "--ci", ci, "--config", "configs/cuda.yaml", "--out", str(path))
        assert res.rc == 0, res.err
        _validates(ci, path)
    github = yaml.safe_load(out["github"].read_text())["jobs"]
    args = {}
    for kind in ("build", "verify"):
        (run,) = [s["run"] for s in github[kind]["steps"] if s.get("name") == kind]
        assert "CUDA=${{ matrix.cuda }}" in run, run
        for row in github[kind]["strategy"]["matrix"]["include"]:
            args[row["cell"]] = {
                "ARCH": row["arch"],
                "PY": row["python"],
                "TORCH": str(row["torch"]),
                "CUDA": str(row["cuda"]),
            }
    assert {a["CUDA"] for a in args.values()} == {"cpu", "13.0"}
    gitlab = yaml.safe_load(out["gitlab"].read_text())
    for job_id, job in gitlab.items():
        if job_id.startswith(("build-", "verify-")):
            (line,) = [s for s in job["script"] if s.startswith("make wheel")]
            cell = line.rsplit("OUT=artifacts/dist-", 1)[1]
            words = dict(w.split("=", 1) for w in line.split()[2:])
            assert {k: words[k] for k in ("ARCH", "PY", "TORCH", "CUDA")} == args[cell], line
    for cell, a in args.items():  # what each job's make wheel selects (make passes these on)
        res = run_cli(
            "plan",
            "--format",
            "json",
            "--config",
            "configs/cuda.yaml",
            "--arch",
            a["ARCH"],
            "--python",
            a["PY"],
            "--torch",
            a["TORCH"],
            "--cuda",
            a["CUDA"],
        )
        assert res.rc == 0, res.err
        assert [c["id"] for c in json.loads(res.out)["cells"]] == [cell]


def test_a_cuda_job_frees_the_runners_disk_first_and_a_cpu_job_does_not(tmp_path: Path) -> None:
    """A CUDA torch is several GB: each CUDA row's job removes the runner's preinstalled
    toolchains before anything is checked out or installed; a cpu row skips the step, and a
    matrix without CUDA cells has no such step at all (its file is as before)."""
    path = tmp_path / "github.yml"
    res = run_cli("render", "--ci", "github", "--config", "configs/cuda.yaml", "--out", str(path))
    assert res.rc == 0, res.err
    jobs = yaml.safe_load(path.read_text())["jobs"]
    build = jobs["build"]
    first = build["steps"][0]
    assert first["name"] == "free disk for the CUDA torch", first
    assert first["run"].splitlines()[1] == (
        "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /usr/local/.ghcup "
        "/opt/hostedtoolcache/CodeQL /usr/share/swift"
    )
    assert "/opt/hostedtoolcache " not in first["run"]  # setup-python's interpreters stay
    assert build["steps"][1]["uses"].startswith("actions/checkout@")
    rows = build["strategy"]["matrix"]["include"]
    frees = {r["cell"]: condition(first["if"], {"matrix": r}) for r in rows}
    assert frees == {r["cell"]: r["cell"].endswith("-cu130") for r in rows}
    assert sum(frees.values()) == 3 and not all(frees.values())
    # configs/cuda.yaml's verify rows are cpu cells (served by the cp311 cpu job's wheel).
    assert all(r["cuda"] == "cpu" for r in jobs["verify"]["strategy"]["matrix"]["include"])
    assert all(s.get("name") != "free disk for the CUDA torch" for s in jobs["verify"]["steps"])
    _, default = _render(tmp_path / "default", "github")
    for kind in ("build", "verify"):
        assert all("free disk" not in str(s.get("name")) for s in default["jobs"][kind]["steps"])


def test_the_merge_of_two_artifacts_differing_only_in_cuda_keeps_both(tmp_path: Path) -> None:
    """The release job's merge over a cpu job's and a CUDA job's dist/ of one (arch, Python,
    torch): two files (``+torch2.14`` and ``+torch2.14.cu130``), two entries, each keeping its
    CUDA record; `index --per-torch` gives each its own page."""
    folders = {
        cuda: tmp_path / f"dist-{cell}"
        for cuda, cell in (("cpu", CUDA_CELLS["cpu"]), ("13.0", CUDA_CELLS["13.0"]))
    }
    for cuda, folder in folders.items():
        _cuda_dist(folder, CUDA_CELLS[cuda], cuda)
    res = run_cli("merge", *map(str, folders.values()), "--out", str(tmp_path / "release"))
    assert res.rc == 0, res.err
    release = tmp_path / "release"
    names = sorted(p.name for p in release.glob("*.whl"))
    assert names == [
        "cudapkg-1.0+torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl",
        "cudapkg-1.0+torch2.14.cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
    ]
    entries = json.loads((release / "manifest.json").read_text())["wheels"]
    by_cell = {e["cell"]: e for e in entries}
    assert set(by_cell) == set(CUDA_CELLS.values())
    assert by_cell[CUDA_CELLS["13.0"]]["extra"]["resolved"]["cuda"]["version"] == "13.0"
    assert by_cell[CUDA_CELLS["13.0"]]["extra"]["cuda"]["version"] == "13.0"
    assert by_cell[CUDA_CELLS["cpu"]]["extra"]["resolved"]["cuda"] == {"version": "cpu"}
    for cuda, folder in folders.items():
        assert by_cell[CUDA_CELLS[cuda]]["built_by"]["sources"] == [folder.name]
    res = run_cli("index", str(release), "--per-torch", "--out", str(tmp_path / "index"))
    assert res.rc == 0, res.err
    pages = {
        p.parent.parent.parent.name: p.name
        for p in (tmp_path / "index").glob("*/simple/cudapkg/*.whl")
    }
    assert pages == {"torch2.14": names[0], "torch2.14.cu130": names[1]}


CUDA_CELLS = {
    "cpu": "cp311-manylinux_x86_64-torch2.14.1",
    "13.0": "cp311-manylinux_x86_64-torch2.14.1-cu130",
}


def _cuda_dist(dist: Path, cell: str, cuda: str) -> None:
    """A job's dist/ as `build` writes it for *cell*: the wheel its label names and a manifest
    entry carrying the resolved record (with its CUDA) and what verification found."""
    local = "torch2.14" + ("" if cuda == "cpu" else ".cu" + cuda.replace(".", ""))
    wheel = make_wheel(
        dist,
        "cudapkg",
        f"1.0+{local}",
        tag="cp311-cp311-manylinux_2_28_x86_64",
        requires_dist=["torch==2.14.*"],
        requires_python=">=3.9",
    )
    resolved = {
        "id": cell,
        "cp": "cp311",
        "python": "3.11",
        "torch": "2.14.1",
        "machine": "x86_64",
        "local_version": local,
        "cuda": {"version": cuda},
    }
    extra: dict[str, object] = {
        "resolved": resolved,
        "built_on": {
            "host": "runner",
            "machine": "x86_64",
            "ci": "github",
            "runner": f"GitHub Actions {cuda}",
            "job": "7",
        },
    }
    if cuda != "cpu":
        resolved["cuda"] = {"version": cuda, "tag": "cu130", "arch_list": "8.0;9.0+PTX"}
        extra["cuda"] = {"version": cuda, "arch_list": "8.0;9.0+PTX"}
    record_wheel(
        dist,
        ManifestEntry.for_wheel(
            wheel,
            cell=cell,
            torch="2.14.1",
            python="3.11",
            base_image="quay.io/pypa/manylinux_2_28",
            compiler="gcc-toolset-14",
            builder_version="0.1.0",
            started_at="2026-12-01T10:00:00Z",
            finished_at="2026-12-01T10:00:00Z",
            extra=extra,
        ),
    )


def test_the_docs_page_shows_what_render_writes() -> None:
    page = (REPO_ROOT / "docs" / "ci-fleets.md").read_text()
    # The block under its own heading (the page shows other YAML too: the Action's use).
    section = page.split("\n## The workflow for the default matrix\n", 1)[1]
    shown = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    res = run_cli("render", "--ci", "github")
    assert res.rc == 0, res.err
    assert res.out == shown, "docs/ci-fleets.md: re-render its workflow block"


def test_render_ci_usage_errors_exit_2_naming_the_option(tmp_path: Path) -> None:
    res = run_cli("render", "--ci", "github", "--print")
    assert res.rc == 2 and "--print" in res.err, res.err
    res = run_cli("render", "--publish", "token", "--out", str(tmp_path / "df0"))
    assert res.rc == 2 and "--publish" in res.err and "--ci" in res.err, res.err
    assert not (tmp_path / "df0").exists()
    res = run_cli("render", "--ci", "github", "--publish", "password")
    assert res.rc == 2 and "--publish" in res.err and "'trusted'" in res.err, res.err
    outside = tmp_path / "matrix.yaml"
    outside.write_text("matrix: {arch: [X86], python: ['3.11'], torch: ['2.13.0']}\n")
    res = run_cli("render", "--ci", "gitlab", "--config", str(outside))
    assert res.rc == 2 and "--config" in res.err and "outside this checkout" in res.err, res.err
    # The Dockerfiles are still what a plain render writes.
    res = run_cli(
        "render",
        "--out",
        str(tmp_path / "df"),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
    )
    assert (
        res.rc == 0
        and (tmp_path / "df" / "cp311-manylinux_x86_64-torch2.13.0" / "Dockerfile").is_file()
    ), res.err


TINY_CONFIG = """\
# Two cells: one this x86_64 host builds, one only an arm64 runner can.
support: configs/support.yaml
matrix:
  arch: [X86, ARM]
  python: ["3.11"]
  torch: ["2.13.0"]
"""


@pytest.mark.slow
def test_the_emitted_jobs_run_here_and_the_release_job_merges_their_dist(tmp_path: Path) -> None:
    if platform.machine() != "x86_64":
        pytest.skip("the emitted jobs for this host are the x86_64 runner's")
    origin = source_repository(REPO_ROOT, tmp_path / "origin")
    write_tiny_extension(origin / "tinyext")
    (origin / "ci.yaml").write_text(TINY_CONFIG)
    commit_all(origin)
    env = base_env()
    render = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "render",
            "--ci",
            "github",
            "--config",
            "ci.yaml",
            "--project",
            "tinyext",
            "--backend",
            "host",
            "--out",
            ".github/workflows/wheels.yml",
        ],
        cwd=origin,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert render.returncode == 0, render.stderr
    workflow = yaml.safe_load((origin / ".github/workflows/wheels.yml").read_text())
    rows = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert [(r["cell"], r["runs-on"]) for r in rows] == [
        ("cp311-manylinux_x86_64-torch2.13.0", "ubuntu-24.04"),
        ("cp311-manylinux_aarch64-torch2.13.0", "ubuntu-24.04-arm"),
    ]
    assert "verify" not in workflow["jobs"]  # tinyext is not on torch's stable ABI

    runner = Runner(origin, tmp_path / "runner", REPO_ROOT / ".venv", env)
    here = [r for r in rows if r["runs-on"] == "ubuntu-24.04"]
    ran = [runner.run_job(workflow, "build", row) for row in here]
    (job,) = ran
    assert "build: ran" in job.steps and "upload dist/: ran" in job.steps
    assert "cross / emulation tools: skipped" in " ".join(job.steps)
    dist = runner.artifacts / "dist-cp311-manylinux_x86_64-torch2.13.0"
    (wheel,) = dist.glob("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_*_x86_64*.whl")

    release = runner.run_job(workflow, "release")
    # The trusted-publishing default: what PyPI takes is staged on every run; tinyext has no
    # stable-ABI wheel, so nothing is, and the publish job is skipped even on a tag.
    assert "the wheels PyPI takes: ran" in release.steps
    assert list((release.workdir / "pypi-dist").iterdir()) == []
    assert release.outputs == {"pypi_wheels": "0"}
    assert not (runner.artifacts / "pypi").exists()
    for ref in ("refs/heads/main", "refs/tags/v0.0.1"):
        skipped = runner.run_job(workflow, "publish", ref=ref, needs={"release": release})
        assert skipped.skipped.startswith("startsWith(github.ref, 'refs/tags/')"), skipped
        assert skipped.steps == []
    merged = release.workdir / "release"
    doc = json.loads((merged / "manifest.json").read_text())
    (entry,) = doc["wheels"]
    assert entry["cell"] == "cp311-manylinux_x86_64-torch2.13.0"
    assert entry["built_by"] == {
        "runner": "github runner emulated cp311-manylinux_x86_64-torch2.13.0",
        "sources": ["dist-cp311-manylinux_x86_64-torch2.13.0"],
    }
    assert (merged / wheel.name).read_bytes() == wheel.read_bytes()
    for index in ("torch2.13/simple", "simple"):  # per torch series, and all in one
        page = release.workdir / "build/index" / index / "tinyext" / wheel.name
        assert page.read_bytes() == wheel.read_bytes()
    uploaded = runner.artifacts / "release"
    assert (uploaded / "release" / "manifest.json").is_file()
    for run in (job, release):  # where the time goes (pytest -s shows it)
        print(
            run.cell,
            f"{run.seconds:.1f} s:",
            {k: round(v, 1) for k, v in run.seconds_per_step.items()},
        )


def test_builder_index_url_is_the_environment_layer_of_pip_index_url(tmp_path: Path) -> None:
    """What the jobs' BUILDER_INDEX_URL variable feeds: over the config file, checked alike."""
    config = tmp_path / "matrix.yaml"
    config.write_text(
        f"support: {REPO_ROOT / 'configs' / 'support.yaml'}\n"
        "matrix: {arch: [X86], python: ['3.11'], torch: ['2.13.0']}\n"
        "pip: {index_url: 'https://file.example/simple/'}\n"
    )
    args = ("plan", "--format", "json", "--config", str(config))
    index = [
        json.loads(run_cli(*args, env=env).out)["cells"][0]["index"]["index_url"]
        for env in ({}, {"BUILDER_INDEX_URL": "https://ci.example/simple/"})
    ]
    assert index == ["https://file.example/simple/", "https://ci.example/simple/"]
    res = run_cli(*args, env={"BUILDER_INDEX_URL": "https://u:pw@ci.example/simple/"})
    assert res.rc == 2 and "environment BUILDER_INDEX_URL" in res.err, res.err
    assert "credentials" in res.err and "pw@" not in res.err


# --- a project of its own (#35 part 5): the workflow installs the tool, no ampforge checkout ---

OWN_CONFIG = """\
# Three cells: cpu on this x86_64 host's kind of runner, CUDA 13.0 beside it, and an arm64 one.
support: {support}
matrix:
  arch: [X86]
  python: ["3.11"]
  torch: ["2.14.1"]
  cuda: ["cpu", "13.0"]
  include:
    - {{arch: ARM, python: "3.11", torch: "2.13.0"}}
{extra}"""


def _own_project(root: Path, extra: str = "") -> Path:
    write_tiny_extension(root)
    (root / "ci").mkdir()
    (root / "ci" / "wheels.yaml").write_text(
        OWN_CONFIG.format(support=REPO_ROOT / "configs" / "support.yaml", extra=extra)
    )
    return root


def _render_own(tmp_path: Path, ci: str, project: Path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / f"{ci}.yml"
    res = run_cli(
        "render",
        "--ci",
        ci,
        "--project",
        str(project),
        "--config",
        str(project / "ci" / "wheels.yaml"),
        "--backend",
        "host",
        *extra,
        "--out",
        str(out),
        env=PROXY_ENV,
    )
    assert res.rc == 0, res.err
    _validates(ci, out)
    text = out.read_text()
    assert PASSWORD not in text and "proxy.example" not in text
    return text, yaml.safe_load(text)


def test_a_project_of_its_own_gets_a_workflow_that_installs_the_tool(tmp_path: Path) -> None:
    """--project outside this checkout: the workflow is that project's. Its jobs install the
    builder as a tool (the lock's pins) and run `ampforge-build build` from the project's root
    with the record's options; nothing of an ampforge checkout (make, .venv, the lock's path)
    is named; each host cell's torch environments are cached by a key from its record; the CUDA
    cell frees disk first. The files validate against both services' schemas."""
    project = _own_project(tmp_path / "myext")
    text, doc = _render_own(tmp_path, "github", project)
    for absent in (
        "make ",
        ".venv",
        "requirements.lock",
        "builder-env",
        str(REPO_ROOT),
        str(tmp_path),
    ):
        assert absent not in text, absent
    assert text.startswith(
        "# Rendered by `ampforge-build render --ci github --config "
        "ci/wheels.yaml` from ci/wheels.yaml"
    )
    assert "Each job installs the builder as a tool (ampforge-builder==0.1.0" in text
    build = doc["jobs"]["build"]
    steps = {s.get("name") or s["uses"].split("@")[0]: s for s in build["steps"]}
    install = steps["install ampforge-build"]["run"].splitlines()
    assert install == [
        'python3.11 -m venv "$RUNNER_TEMP/ampforge-build"',
        '"$RUNNER_TEMP/ampforge-build/bin/python" -m pip install --quiet --no-deps '
        "ampforge-builder==0.1.0",
        '"$RUNNER_TEMP/ampforge-build/bin/python" -m builder.lockfile install',
        'echo "$RUNNER_TEMP/ampforge-build/bin" >> "$GITHUB_PATH"',
        '"$RUNNER_TEMP/ampforge-build/bin/ampforge-build" --version',
    ]
    assert steps["build"]["run"] == (
        "ampforge-build build --arch ${{ matrix.arch }} --python ${{ matrix.python }} --torch "
        "${{ matrix.torch }} --backend ${{ matrix.backend }} --pull ${{ matrix.pull }} "
        "--cuda ${{ matrix.cuda }} --config ci/wheels.yaml --out dist"
    )
    cache = steps["torch environments"]
    assert cache["uses"].startswith("actions/cache@") and cache["if"] == "matrix.backend == 'host'"
    assert cache["with"] == {"path": "~/.cache/ampforge/torch-envs", "key": "${{ matrix.env_key }}"}
    assert "provision.sh" in steps["cross / emulation tools"]["run"]  # the tool's own copy
    assert build["steps"][0]["name"] == "free disk for the CUDA torch"
    rows = build["strategy"]["matrix"]["include"]
    assert [(r["cell"], r["cuda"], r["runs-on"]) for r in rows] == [
        ("cp311-manylinux_x86_64-torch2.14.1", "cpu", "ubuntu-24.04"),
        ("cp311-manylinux_x86_64-torch2.14.1-cu130", "13.0", "ubuntu-24.04"),
        ("cp311-manylinux_aarch64-torch2.13.0", "cpu", "ubuntu-24.04-arm"),
    ]
    keys = [r["env_key"] for r in rows]
    assert all(k.startswith(f"torch-env-{r['cell']}-") for k, r in zip(keys, rows))
    assert len(set(keys)) == 3
    # Each row's `ampforge-build build` options select exactly its own cell (run from the
    # project's root, as the job does).
    for row in rows:
        res = run_cli(
            "plan",
            "--format",
            "json",
            "--project",
            str(project),
            "--config",
            str(project / "ci" / "wheels.yaml"),
            "--arch",
            row["arch"],
            "--python",
            row["python"],
            "--torch",
            str(row["torch"]),
            "--cuda",
            str(row["cuda"]),
        )
        assert res.rc == 0, res.err
        assert [c["id"] for c in json.loads(res.out)["cells"]] == [row["cell"]]
    release = doc["jobs"]["release"]
    runs = [s["run"] for s in release["steps"] if "run" in s]
    assert "ampforge-build merge artifacts/dist-* --out release" in runs
    assert any(
        r.startswith(
            "ampforge-build publish release --repository pypi "
            "--skip-local-versions --stage pypi-dist\n"
        )
        for r in runs
    )
    assert doc["jobs"]["publish"]["permissions"] == {"contents": "read", "id-token": "write"}

    text, gitlab = _render_own(tmp_path / "gl", "gitlab", project)
    assert "make " not in text and ".venv" not in text
    assert "builder.lockfile install" in gitlab[".builder"]["before_script"][1]
    cells = {k: v for k, v in gitlab.items() if k.startswith("build-")}
    for job_id, job in cells.items():
        (line,) = job["script"]
        assert line.startswith("ampforge-build build --arch "), line
        cell = line.rsplit("--out artifacts/dist-", 1)[1]
        assert job["cache"] == {
            "key": dict(zip((r["cell"] for r in rows), keys))[cell],
            "paths": [".ampforge-cache/torch-envs/"],
        }, job_id
        assert job["variables"] == {"AMPFORGE_CACHE": "$CI_PROJECT_DIR/.ampforge-cache"}
    assert gitlab["release"]["script"][0] == "ampforge-build merge artifacts/dist-* --out release"
    assert gitlab["publish"]["script"] == [
        "ampforge-build publish release --repository pypi "
        "--skip-local-versions --trusted-publishing"
    ]


def test_the_torch_environment_key_follows_what_decides_the_environment(tmp_path: Path) -> None:
    """Another index for the same cell is another key; another arch list (the compile's, not
    the environment's) keeps it."""

    def keys(extra: str) -> dict[str, str]:
        project = _own_project(tmp_path / f"p{len(list(tmp_path.iterdir()))}", extra)
        _, doc = _render_own(tmp_path / project.name, "github", project)
        return {
            r["cell"]: r["env_key"] for r in doc["jobs"]["build"]["strategy"]["matrix"]["include"]
        }

    base = keys("")
    assert keys("cuda: {arch_list: {'13.0': '8.0'}}\n") == base
    mirrored = keys("pip: {index_url: 'https://mirror.example/simple/'}\n")
    assert set(mirrored) == set(base)
    assert all(mirrored[c] != base[c] for c in base)


def test_render_for_a_project_of_its_own_refuses_paths_outside_it(tmp_path: Path) -> None:
    project = _own_project(tmp_path / "myext")
    outside = tmp_path / "other.yaml"
    outside.write_text((project / "ci" / "wheels.yaml").read_text())
    res = run_cli("render", "--ci", "github", "--project", str(project), "--config", str(outside))
    assert res.rc == 2 and "--config" in res.err and "outside the project" in res.err, res.err
    wheel = tmp_path / "ampforge_builder-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    res = run_cli("render", "--ci", "github", "--project", str(project), "--tool", str(wheel))
    assert res.rc == 2 and "--tool" in res.err and "outside the project" in res.err, res.err
    # A wheel in the project is named from its root; a requirement is taken as written.
    (project / "tools").mkdir()
    inside = project / "tools" / wheel.name
    inside.write_bytes(b"")
    for tool, written in (
        (str(inside), f"tools/{wheel.name}"),
        ("ampforge-builder>=0.1", "'ampforge-builder>=0.1'"),
    ):
        res = run_cli("render", "--ci", "github", "--project", str(project), "--tool", tool)
        assert res.rc == 0, res.err
        assert f"-m pip install --quiet --no-deps {written}\n" in res.out
    # --tool is a third-party workflow's; this checkout's jobs use the Makefile.
    res = run_cli("render", "--ci", "github", "--tool", "ampforge-builder")
    assert res.rc == 2 and "--tool" in res.err and "this checkout" in res.err, res.err
    res = run_cli("render", "--tool", "ampforge-builder", "--out", str(tmp_path / "df"))
    assert res.rc == 2 and "--tool" in res.err and "--ci" in res.err, res.err


def _tool_wheel(dest: Path) -> Path:
    """The builder as its own distribution (builder-dist/), as a project would vendor it."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(dest),
            str(REPO_ROOT / "builder-dist"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = dest.glob("ampforge_builder-*-py3-none-any.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.starts_from("installed tool")
def test_a_project_of_its_own_runs_its_workflow_here_with_the_installed_tool(
    tmp_path: Path,
) -> None:
    """The tiny extension as a repository of its own (no ampforge files in it but the tool's
    wheel it vendors): its rendered workflow's build job installs the tool in a fresh venv
    (the wheel, then the lock's pins), builds its one cell from the project's root with the
    host backend, and the release job merges and indexes with the tool too."""
    if platform.machine() != "x86_64":
        pytest.skip("the emitted job for this host is the x86_64 runner's")
    origin = write_tiny_extension(tmp_path / "myext")
    (origin / "ci.yaml").write_text(OWN_TINY_CONFIG)
    wheel = _tool_wheel(origin / "tools")
    workflow_file = origin / ".github" / "workflows" / "wheels.yml"
    res = run_cli(
        "render",
        "--ci",
        "github",
        "--project",
        str(origin),
        "--config",
        str(origin / "ci.yaml"),
        "--backend",
        "host",
        "--tool",
        str(wheel),
        "--out",
        str(workflow_file),
    )
    assert res.rc == 0, res.err
    commit_all(origin)
    workflow = yaml.safe_load(workflow_file.read_text())
    (row,) = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert row["cell"] == "cp311-manylinux_x86_64-torch2.13.0" and row["backend"] == "host"

    runner = Runner(origin, tmp_path / "runner", REPO_ROOT / ".venv", base_env())
    job = runner.run_job(workflow, "build", row)
    assert not (job.workdir / ".venv").exists()  # nothing of an ampforge checkout
    assert job.steps[:4] == [
        "actions/checkout@v4: ran",
        "actions/setup-python@v5: ran",
        "proxy, CA and index: ran",
        "install ampforge-build: ran",
    ]
    assert "cross / emulation tools: skipped" in " ".join(job.steps)
    assert job.cache_keys == [row["env_key"]]
    (built,) = (runner.artifacts / f"dist-{row['cell']}").glob("*.whl")
    assert built.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_")
    entry = json.loads((runner.artifacts / f"dist-{row['cell']}" / "manifest.json").read_text())[
        "wheels"
    ][0]
    assert entry["extra"]["backend"] == "host" and entry["builder_version"] == "0.1.0"

    release = runner.run_job(workflow, "release")
    assert "install ampforge-build: ran" in release.steps
    assert "merge artifacts/dist-* --out release: ran" in release.steps
    assert (release.workdir / "release" / built.name).read_bytes() == built.read_bytes()
    page = release.workdir / "build/index/torch2.13/simple/tinyext" / built.name
    assert page.read_bytes() == built.read_bytes()
    assert release.outputs == {"pypi_wheels": "0"}  # no stable-ABI wheel: nothing for PyPI
    for run in (job, release):  # where the time goes (pytest -s shows it)
        print(
            run.cell,
            f"{run.seconds:.1f} s:",
            {k: round(v, 1) for k, v in run.seconds_per_step.items()},
        )
