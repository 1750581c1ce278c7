"""The tree passes `make lint` in the suite, so CI enforces it: `ruff check .`, `ruff format
--check .` and `mypy` (amp/ and builder/, pyproject.toml's [tool.mypy]), each run from the
checkout as the Makefile runs it (tests/test_precommit.py holds the Makefile's lint recipe and
the pre-commit hooks to these commands)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("args", [("ruff", "check", "."), ("ruff", "format", "--check", ".")])
def test_the_tree_passes_ruff(args: tuple[str, ...]) -> None:
    run = _run(*args)
    assert run.returncode == 0, (
        f"{' '.join(args)} exited {run.returncode}:\n{run.stdout}{run.stderr}"
    )


def test_amp_and_the_builder_type_check() -> None:
    # The checkout's .mypy_cache, as `make lint` uses it: a warm run takes a fraction of a second.
    run = _run("mypy")
    assert run.returncode == 0, f"mypy exited {run.returncode}:\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout, run.stdout
