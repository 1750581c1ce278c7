""".pre-commit-config.yaml runs what `make lint` runs, and needs no network: every hook is local
and runs this checkout's virtual environment."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _make_variable(makefile: str, name: str) -> str:
    match = re.search(rf"^{name} [?:]?= (.+)$", makefile, re.MULTILINE)
    assert match, f"Makefile sets no {name}"
    return match.group(1).strip()


def _lint_recipe() -> list[str]:
    """`make lint`'s commands with the Makefile's default VENV and PY_VENV put in."""
    makefile = (REPO / "Makefile").read_text()
    match = re.search(r"^lint:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, "the Makefile has no lint target"
    venv = _make_variable(makefile, "VENV")
    py_venv = _make_variable(makefile, "PY_VENV").replace("$(VENV)", venv)
    return [line.strip().replace("$(PY_VENV)", py_venv) for line in match.group(1).splitlines()]


def _hooks() -> list[dict]:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def test_every_hook_is_local_and_runs_the_checkouts_environment() -> None:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    for hook in _hooks():
        assert hook["language"] == "system", hook
        program, *args = shlex.split(hook["entry"])
        assert program == ".venv/bin/python", hook
        script = next((a for a in args if a.endswith(".py")), None)
        assert script is None or (REPO / script).is_file(), hook


LINT_HOOKS = ("ruff", "ruff-format", "mypy")  # one per line of `make lint`, in its order


def test_the_lint_hooks_are_make_lint() -> None:
    hooks = {hook["id"]: hook for hook in _hooks()}
    assert _lint_recipe() == [hooks[name]["entry"] for name in LINT_HOOKS]
    for name in LINT_HOOKS:
        # the whole tree (mypy: pyproject.toml's packages), as `make lint` and CI check it
        assert hooks[name]["pass_filenames"] is False, name
