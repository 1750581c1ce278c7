"""Build one cell three times and print a table: cold, nothing changed, one kernel source changed.

    .venv/bin/python benchmarks/build_cell.py [--backend host|docker] [--base-image REF]
                                              [--wheelhouse DIR] [--ccache]

A copy of this project (amp, kernels, setup.py, pyproject.toml, README) is built into a fresh
dist/, so the repository is never touched. "Nothing changed" must be recognised from the
manifest's input key (target < 2 s); "one source changed" appends a comment to one kernel file
(content changes: a bare mtime touch is, correctly, still up to date) and rebuilds
(target >= 5x faster than cold, which needs a compiler cache that outlives the cell).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from project_copy import copy_project

ROOT = Path(__file__).resolve().parent.parent


def build(project: Path, work: Path, extra: list[str]) -> tuple[float, str]:
    argv = [sys.executable, "-m", "builder", "build", "--project", str(project),
            "--out", str(work / "dist"), "--work-dir", str(work / "work"), "--python", "3.11",
            "--arch", "X86", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    # The progress line "[cell] up-to-date (0s)" (not the "up-to-date check" step).
    status = "up-to-date" if "] up-to-date (" in proc.stderr else "built"
    return took, status


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="host", choices=("host", "docker"))
    ap.add_argument("--base-image", default=None)
    ap.add_argument("--wheelhouse", default=None)
    ap.add_argument("--ccache", action="store_true")
    args = ap.parse_args()
    extra = ["--backend", args.backend]
    if args.base_image:
        extra += ["--base-image", args.base_image]
    if args.wheelhouse:
        extra += ["--wheelhouse", args.wheelhouse]
    if args.ccache:
        extra.append("--ccache")
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        work = Path(tmp)
        project = copy_project(work / "project")
        rows = []
        rows.append(("cold build", *build(project, work, extra)))
        rows.append(("nothing changed", *build(project, work, extra)))
        kernel = sorted((project / "kernels").glob("*.cpp"))[0]
        with kernel.open("a") as fh:
            fh.write("\n// benchmark: one source changed\n")
        rows.append((f"{kernel.name} changed", *build(project, work, extra)))
    cold = rows[0][1]
    print(f"build_cell: backend={args.backend} ccache={args.ccache} "
          f"cell=cp311-manylinux_x86_64-torch2.13.0")
    print(f"{'case':<24} {'seconds':>8} {'vs cold':>8}  result")
    for name, took, status in rows:
        print(f"{name:<24} {took:8.1f} {cold / took:7.1f}x  {status}")


if __name__ == "__main__":
    main()
