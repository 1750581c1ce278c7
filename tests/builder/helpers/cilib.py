"""Run an emitted GitHub Actions workflow's jobs on this machine, as a runner would.

Only what the workflows ``render --ci github`` writes is understood, and anything else fails
the test (a new construct must be taught here, not skipped): ``run:`` steps go to
``bash -eo pipefail`` with the job's environment, ``$GITHUB_ENV`` and ``$GITHUB_PATH`` are
honoured between steps,
``$GITHUB_OUTPUT`` gives the step's outputs (``steps.<id>.outputs.*``, then the job's
``outputs:``, which a later job reads as ``needs.<job>.outputs.*``; a job's own ``if:`` is
checked before it starts), ``${{ matrix.* }}``, ``${{ secrets.* }}`` and ``${{ vars.* }}`` are
filled in (secrets and variables from this machine's environment: the CI's settings holding
this machine's proxy), and
the actions the workflow uses are done by hand: ``checkout`` is a fresh ``git clone`` per job,
``setup-python`` checks the interpreters are on PATH, ``cache`` restores ``.venv`` (a link to
this machine's builder environment) or the builder's torch environments (this machine's cache
root; the key is recorded), ``upload-artifact`` and
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
#: The torch environments' folder a project's own workflow caches (the builder's cache root).
TORCH_ENVS = "~/.cache/ampforge/torch-envs"


@dataclass
class JobRun:
    job: str
    cell: str
    workdir: Path
    seconds: float
    steps: list[str] = field(default_factory=list)  # "name: ran" / "name: skipped (why)"
    seconds_per_step: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # the job's `outputs:`, filled in
    cache_keys: list[str] = field(default_factory=list)  # torch-envs keys it restored
    skipped: str = ""  # the job's own `if:` when it was false (nothing ran)


def fill(text: str, context: Mapping[str, Any]) -> str:
    def value(m: re.Match[str]) -> str:
        expr = m.group(1)
        scope, _, key = expr.partition(".")
        if scope in ("matrix", "secrets", "vars") and key:
            return str(context[scope].get(key, ""))
        out = re.fullmatch(r"(steps|needs)\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if out:
            return str(context[out.group(1)].get(out.group(2), {}).get(out.group(3), ""))
        raise AssertionError(f"expression the emulator does not know: {expr!r}")

    return _EXPR.sub(value, text)


def condition(expr: str, context: Mapping[str, Any]) -> bool:
    """The ``if:`` forms the renderer writes: matrix comparisons (``==``, ``!=``) joined by ``||``,
    ``startsWith(github.ref, '...')``, and ``needs.<job>.outputs.<name> != '...'`` joined to it
    by ``&&``."""
    if "&&" in expr:
        return all(condition(part, context) for part in expr.split("&&"))
    result = False
    for part in expr.split("||"):
        part = part.strip()
        m = re.fullmatch(r"matrix\.([\w-]+) (==|!=) '([^']*)'", part)
        t = re.fullmatch(r"startsWith\(github\.ref, '([^']*)'\)", part)
        n = re.fullmatch(r"needs\.([\w-]+)\.outputs\.([\w-]+) != '([^']*)'", part)
        if m:
            same = str(context["matrix"].get(m.group(1))) == m.group(3)
            result |= same if m.group(2) == "==" else not same
        elif t:
            result |= str(context["github"]["ref"]).startswith(t.group(1))
        elif n:
            assert n.group(1) in context["needs"], f"if: {part!r}: give the run of {n.group(1)}"
            result |= str(context["needs"][n.group(1)].get(n.group(2), "")) != n.group(3)
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

    def run_job(
        self,
        workflow: Mapping[str, Any],
        job_id: str,
        matrix: Mapping[str, Any] | None = None,
        *,
        ref: str = "refs/heads/main",
        needs: Mapping[str, JobRun] | None = None,
    ) -> JobRun:
        """*ref*: what ``github.ref`` is (a tag: ``refs/tags/v1``); *needs*: the runs of the
        jobs this one needs, whose outputs it reads."""
        job = workflow["jobs"][job_id]
        name = str((matrix or {}).get("cell", job_id))
        work = self.root / "jobs" / name
        start = time.monotonic()
        run = JobRun(job_id, name, work, 0.0)
        context = {
            "matrix": dict(matrix or {}),
            "secrets": self.env,
            "vars": self.env,
            "github": {"ref": ref},
            "steps": {},
            "needs": {k: v.outputs for k, v in (needs or {}).items()},
        }
        # Only the jobs whose outputs it reads need their runs given (artifacts are shared).
        assert set(context["needs"]) <= set(job.get("needs", [])), (
            f"{job_id} needs only {job.get('needs')}"
        )
        if "if" in job and not condition(job["if"], context):
            run.skipped = str(job["if"])
            return run
        subprocess.run(["git", "clone", "-q", str(self.origin), str(work)], check=True)
        if any(s.get("with", {}).get("path") == ".venv" for s in job["steps"]):
            # The builder's environment as the workflow's actions/cache step restores it (make
            # builder-env finds its stamp and does nothing). A project's own workflow installs
            # the tool instead, and its checkout gets no such link.
            (work / ".venv").symlink_to(self.venv)
        temp = self.root / "tmp" / name
        temp.mkdir(parents=True)
        github_env = temp / "github_env"
        github_env.touch()
        github_path = temp / "github_path"
        github_path.touch()
        env = {
            **self.env,
            "GITHUB_ACTIONS": "true",
            "RUNNER_NAME": f"emulated {name}",
            "GITHUB_RUN_ID": "1",
            "RUNNER_TEMP": str(temp),
            "GITHUB_ENV": str(github_env),
            "GITHUB_PATH": str(github_path),
        }
        env.update({k: fill(str(v), context) for k, v in workflow.get("env", {}).items()})
        for step in job["steps"]:
            label = step.get("name") or step.get("uses") or step["run"].split("\n")[0]
            if "if" in step and not condition(step["if"], context):
                run.steps.append(f"{label}: skipped (if: {step['if']})")
                continue
            step_env = {**env, **{k: fill(str(v), context) for k, v in step.get("env", {}).items()}}
            began = time.monotonic()
            output = temp / f"github_output_{len(run.steps)}"
            output.touch()
            step_env["GITHUB_OUTPUT"] = str(output)
            if "uses" in step:
                self._action(step, context, work, run)
            else:
                script = fill(step["run"], context)
                proc = subprocess.run(
                    ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                    cwd=work,
                    env=step_env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                assert proc.returncode == 0, (
                    f"{name}: step {label!r} exited {proc.returncode}:\n{script}\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
                )
                for line in github_env.read_text().splitlines():
                    key, _, value = line.partition("=")
                    env[key] = value
                # $GITHUB_PATH: each line goes before PATH for the later steps, newest first.
                added = github_path.read_text().splitlines()[::-1]
                env["PATH"] = os.pathsep.join([*added, self.env.get("PATH", os.defpath)])
                if "id" in step:
                    context["steps"][step["id"]] = dict(
                        line.partition("=")[::2] for line in output.read_text().splitlines()
                    )
            run.steps.append(f"{label}: ran")
            run.seconds_per_step[label] = time.monotonic() - began
        run.outputs = {k: fill(str(v), context) for k, v in job.get("outputs", {}).items()}
        run.seconds = time.monotonic() - start
        return run

    def _action(
        self, step: Mapping[str, Any], context: Mapping[str, Any], work: Path, run: JobRun
    ) -> None:
        uses = str(step["uses"]).split("@")[0]
        if uses == "actions/cache":
            if step["with"]["path"] == TORCH_ENVS:
                # The builder's cache root here is this machine's, kept between jobs as the
                # restored cache would be: the key is what the test checks.
                run.cache_keys.append(fill(str(step["with"]["key"]), context))
                return
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
                if not (src.is_dir() and any(p.is_file() for p in src.rglob("*"))):
                    # upload-artifact's if-no-files-found: error fails, warn / ignore upload
                    # nothing (no artifact of that name exists afterwards)
                    assert args.get("if-no-files-found") != "error", path
                    continue
                # One path: its contents are the artifact's root; several: their common
                # folder is (here, the checkout), as upload-artifact v4 does.
                shutil.copytree(
                    src, dest if len(paths) == 1 else dest / path.rstrip("/"), dirs_exist_ok=True
                )
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
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=repo,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
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
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BUILDER_", "PYTEST_")) and k not in ("PYTHONPATH",)
    }


def action_context(
    action: Mapping[str, Any], inputs: Mapping[str, str], action_path: Path
) -> dict[str, Any]:
    """The expression context of a composite action's steps: its inputs (each default where
    not given; an input it does not declare fails), ``github.action_path``, the steps' outputs."""
    declared = action["inputs"]
    unknown = set(inputs) - set(declared)
    assert not unknown, f"inputs the action does not declare: {sorted(unknown)}"
    values = {k: str(inputs.get(k, spec.get("default", ""))) for k, spec in declared.items()}
    return {"inputs": values, "github": {"action_path": str(action_path)}, "steps": {}}


def fill_action(text: str, context: Mapping[str, Any]) -> str:
    """:func:`fill` plus the action's own scopes (``inputs.*``, ``github.action_path``)."""

    def value(m: re.Match[str]) -> str:
        expr = m.group(1)
        scope, _, key = expr.partition(".")
        if scope == "inputs":
            return context["inputs"][key]
        if expr == "github.action_path":
            return str(context["github"]["action_path"])
        out = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
        if out:
            return str(context["steps"][out.group(1)][out.group(2)])
        raise AssertionError(f"expression the emulator does not know: {expr!r}")

    return _EXPR.sub(value, text)


def run_action(
    action: Mapping[str, Any],
    action_path: Path,
    inputs: Mapping[str, str],
    workspace: Path,
    env: Mapping[str, str],
    temp: Path,
) -> list[str]:
    """Run a composite action's steps as a runner does: ``run:`` steps with ``shell: bash``
    in *workspace* (its working directory), their ``env:`` filled in, ``$GITHUB_ENV`` and
    ``$GITHUB_PATH`` honoured; ``actions/setup-python`` finds the interpreter on PATH and gives
    its ``python-path`` output (with ``update-environment: false``: nothing else changes).
    Returns each step's label and how long it took."""
    assert action["runs"]["using"] == "composite", action["runs"]
    context = action_context(action, inputs, action_path)
    temp.mkdir(parents=True, exist_ok=True)
    github_env, github_path = temp / "github_env", temp / "github_path"
    github_env.touch()
    github_path.touch()
    base = {
        **env,
        "GITHUB_ACTIONS": "true",
        "RUNNER_TEMP": str(temp),
        "GITHUB_ENV": str(github_env),
        "GITHUB_PATH": str(github_path),
        "GITHUB_ACTION_PATH": str(action_path),
        "GITHUB_WORKSPACE": str(workspace),
    }
    ran = []
    for step in action["runs"]["steps"]:
        label = step.get("name") or step.get("uses") or step["run"].split("\n")[0]
        began = time.monotonic()
        if "uses" in step:
            assert str(step["uses"]).split("@")[0] == "actions/setup-python", step
            args = {k: fill_action(str(v), context) for k, v in step["with"].items()}
            assert args.get("update-environment", "").lower() == "false", (
                "the action must leave the job's python and PATH as they were"
            )
            python = shutil.which(f"python{args['python-version']}")
            assert python, f"no python{args['python-version']} on PATH"
            context["steps"][step["id"]] = {"python-path": python}
        else:
            assert step.get("shell") == "bash", f"{label}: a composite run step names its shell"
            step_env = dict(base)
            for line in github_env.read_text().splitlines():
                key, _, val = line.partition("=")
                step_env[key] = val
            added = github_path.read_text().splitlines()[::-1]
            step_env["PATH"] = os.pathsep.join([*added, env.get("PATH", os.defpath)])
            step_env.update(
                {k: fill_action(str(v), context) for k, v in step.get("env", {}).items()}
            )
            script = fill_action(step["run"], context)
            # `shell: bash` is `bash --noprofile --norc -eo pipefail {0}` on GitHub's runners.
            proc = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                cwd=workspace,
                env=step_env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            assert proc.returncode == 0, (
                f"step {label!r} exited {proc.returncode}:\n{script}\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-5000:]}"
            )
        ran.append(f"{label}: {time.monotonic() - began:.1f} s")
    return ran


#: A project's own config: no `support:` (the installed tool's own table), one x86_64 cell.
OWN_TINY_CONFIG = """\
matrix:
  arch: [X86]
  python: ["3.11"]
  torch: ["2.13.0"]
"""
