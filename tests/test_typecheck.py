"""amp/ and builder/ pass mypy as `make lint` runs it: `python -m mypy` from the checkout, with
pyproject.toml's [tool.mypy] (tests/test_precommit.py holds the Makefile's lint recipe and the
pre-commit hooks to that command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_amp_and_the_builder_type_check() -> None:
    # The checkout's .mypy_cache, as `make lint` uses it: a warm run takes a fraction of a second.
    run = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"mypy exited {run.returncode}:\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout, run.stdout
