"""Run an emitted GitHub Actions workflow's jobs on this machine, as a runner would.

Only what the workflows ``render --ci github`` writes is understood, and anything else fails
the test (a new construct must be taught here, not skipped): ``run:`` steps go to
``bash -eo pipefail`` with the job's environment, ``$GITHUB_ENV`` is honoured between steps,
``${{ matrix.* }}``, ``${{ secrets.* }}`` and ``${{ vars.* }}`` are filled in (secrets and
variables from this machine's environment: the CI's settings holding this machine's proxy), and
the actions the workflow uses are done by hand: ``checkout`` is a fresh ``git clone`` per job,
``setup-python`` checks the interpreters are on PATH, ``cache`` restores ``.venv`` (a link to
this machine's builder environment), ``upload-artifact`` and
``download-artifact`` copy folders to and from one artifact store.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


@dataclass
class JobRun:
    job: str
    cell: str
    workdir: Path
    seconds: float
    steps: list[str] = field(default_factory=list)  # "name: ran" / "name: skipped (why)"
    seconds_per_step: dict[str, float] = field(default_factory=dict)


def fill(text: str, context: Mapping[str, Any]) -> str:
    def value(m: re.Match[str]) -> str:
        expr = m.group(1)
        scope, _, key = expr.partition(".")
        if scope in ("matrix", "secrets", "vars") and key:
            return str(context[scope].get(key, ""))
        raise AssertionError(f"expression the emulator does not know: {expr!r}")
    return _EXPR.sub(value, text)


def condition(expr: str, context: Mapping[str, Any]) -> bool:
    """The ``if:`` forms the renderer writes: matrix comparisons joined by ``||``, and
    ``startsWith(github.ref, '...')``."""
    result = False
    for part in expr.split("||"):
        part = part.strip()
        m = re.fullmatch(r"matrix\.([\w-]+) == '([^']*)'", part)
        t = re.fullmatch(r"startsWith\(github\.ref, '([^']*)'\)", part)
        if m:
            result |= str(context["matrix"].get(m.group(1))) == m.group(2)
        elif t:
            result |= str(context["github"]["ref"]).startswith(t.group(1))
        else:
            raise AssertionError(f"if: the emulator does not know {part!r}")
    return result


class Runner:
    """One machine: a source repository to clone, an artifact store, a base environment."""

    def __init__(self, origin: Path, root: Path, venv: Path, env: Mapping[str, str]) -> None:
        self.origin, self.root, self.venv = origin, root, venv
        self.artifacts = root / "artifact-store"
        self.artifacts.mkdir(parents=True)
        self.env = dict(env)

    def run_job(self, workflow: Mapping[str, Any], job_id: str,
                matrix: Mapping[str, Any] | None = None) -> JobRun:
        job = workflow["jobs"][job_id]
        name = str((matrix or {}).get("cell", job_id))
        work = self.root / "jobs" / name
        start = time.monotonic()
        run = JobRun(job_id, name, work, 0.0)
        subprocess.run(["git", "clone", "-q", str(self.origin), str(work)], check=True)
        # The builder's environment as the workflow's actions/cache step restores it (make
        # builder-env finds its stamp and does nothing).
        (work / ".venv").symlink_to(self.venv)
        temp = self.root / "tmp" / name
        temp.mkdir(parents=True)
        github_env = temp / "github_env"
        github_env.touch()
        context = {"matrix": dict(matrix or {}), "secrets": self.env, "vars": self.env,
                   "github": {"ref": "refs/heads/main"}}
        env = {**self.env, "GITHUB_ACTIONS": "true", "RUNNER_NAME": f"emulated {name}",
               "GITHUB_RUN_ID": "1", "RUNNER_TEMP": str(temp), "GITHUB_ENV": str(github_env)}
        env.update({k: fill(str(v), context) for k, v in workflow.get("env", {}).items()})
        for step in job["steps"]:
            label = step.get("name") or step.get("uses") or step["run"].split("\n")[0]
            if "if" in step and not condition(step["if"], context):
                run.steps.append(f"{label}: skipped (if: {step['if']})")
                continue
            step_env = {**env, **{k: fill(str(v), context) for k, v in
                                  step.get("env", {}).items()}}
            began = time.monotonic()
            if "uses" in step:
                self._action(step, context, work)
            else:
                script = fill(step["run"], context)
                proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail",
                                       "-c", script], cwd=work, env=step_env,
                                      capture_output=True, text=True, timeout=1800)
                assert proc.returncode == 0, (
                    f"{name}: step {label!r} exited {proc.returncode}:\n{script}\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
                for line in github_env.read_text().splitlines():
                    key, _, value = line.partition("=")
                    env[key] = value
            run.steps.append(f"{label}: ran")
            run.seconds_per_step[label] = time.monotonic() - began
        run.seconds = time.monotonic() - start
        return run

    def _action(self, step: Mapping[str, Any], context: Mapping[str, Any],
                work: Path) -> None:
        uses = str(step["uses"]).split("@")[0]
        if uses == "actions/cache":
            assert step["with"]["path"] == ".venv", step
            return  # restored: the job's .venv is this machine's builder environment
        args = {k: fill(str(v), context) for k, v in (step.get("with") or {}).items()}
        if uses == "actions/checkout":
            return  # the job's fresh clone
        if uses == "actions/setup-python":
            for version in args["python-version"].split():
                assert shutil.which(f"python{version}"), f"no python{version} on PATH"
            return
        if uses == "actions/upload-artifact":
            dest = self.artifacts / args["name"]
            assert not dest.exists(), f"artifact {args['name']} uploaded twice"
            paths = args["path"].split()
            for path in paths:
                src = work / path
                assert src.is_dir() or args.get("if-no-files-found") != "error", path
                # One path: its contents are the artifact's root; several: their common
                # folder is (here, the checkout), as upload-artifact v4 does.
                shutil.copytree(src, dest if len(paths) == 1 else dest / path.rstrip("/"),
                                dirs_exist_ok=True)
            return
        if uses == "actions/download-artifact":
            target = work / args["path"]
            if "pattern" in args:  # each artifact into its own folder, as v4 does
                for art in sorted(self.artifacts.glob(args["pattern"])):
                    shutil.copytree(art, target / art.name)
            else:
                shutil.copytree(self.artifacts / args["name"], target, dirs_exist_ok=True)
            return
        raise AssertionError(f"action the emulator does not know: {uses}")


def source_repository(repo: Path, dest: Path) -> Path:
    """A git repository holding this checkout's files as they are now (tracked and new ones
    git does not ignore): what a CI job checks out."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=repo, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = repo / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def commit_all(repo: Path) -> None:
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the commit CI builds"], check=True)


def base_env() -> dict[str, str]:
    """This machine's environment without the builder's own variables or a PYTHONPATH: a CI
    runner's, holding this machine's proxy and pip configuration."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("BUILDER_", "PYTEST_")) and k not in ("PYTHONPATH",)}
