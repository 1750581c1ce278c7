"""Helpers for the builder's config/plan/render tests (imported by name: pytest puts this
folder on sys.path). Every run goes through the real CLI entry point, in process, with an
explicit environment so the caller's proxies or ARCH/PY never leak into a test."""

from __future__ import annotations

import io
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from builder.cli import main
from builder.config import REPO_ROOT

SUPPORT = REPO_ROOT / "configs" / "support.yaml"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# A small valid config; cases edit it. Line numbers below are relative to this text.
BASE_CONFIG = f"""\
support: {SUPPORT}
matrix:
  arch: [X86, ARM]
  python: ["3.9", "3.11"]
  torch: ["2.8.0", "2.13.0"]
"""


@dataclass
class Result:
    rc: int
    out: str
    err: str


def run_cli(*argv: str, env: dict[str, str] | None = None) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv), env=env or {})
    return Result(rc, out.getvalue(), err.getvalue())


def write_config(tmp_path: Path, text: str, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def write_pem(path: Path, label: str = "test") -> Path:
    # Only the PEM framing is checked by the builder; the body is opaque to it.
    path.write_text(
        f"# {label}\n-----BEGIN CERTIFICATE-----\nMIIBtest{label}\n-----END CERTIFICATE-----\n"
    )
    return path
