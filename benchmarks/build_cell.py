"""Rebuild speed of one cell, per backend, in one run: cold, nothing changed, one Python file
touched, one kernel source touched; with each build's step times.

    .venv/bin/python benchmarks/build_cell.py [--backends host docker] [--base-image REF]
                                              [--wheelhouse DIR] [--before REV]

A copy of this project (amp, kernels, setup.py, pyproject.toml, README) is built into a fresh
dist/ per backend, so the repository is never touched. "Cold" is a first build on a machine:
an empty cache folder (``AMPFORGE_CACHE``: the host backend's torch environments and compiler
cache), an empty compiler-cache volume (``AMPFORGE_CCACHE_VOLUME``) and no torch layer for the
cell (this cell's ``ampforge/torch`` layers are removed first). "Touched" appends to the file
(a comment to the Python file; a declaration to the kernel source, since a comment-only change
preprocesses to the same input and is a compiler-cache hit); a bare mtime touch is, correctly,
still up to date.

``--before REV`` measures the project as of git revision REV too, in the same run and with the
same builder (this checkout's), each side from its own cold caches, and prints both side by side.

Targets (issue 15): nothing changed < 1 s; kernel touched >= 5x faster than cold; Python file
touched >= 10x faster than cold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from progress_lines import step_times
from project_copy import copy_project, copy_project_at

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CELL = "cp311-manylinux_x86_64-torch2.13.0"


def build(
    project: Path, work: Path, extra: list[str], env: dict[str, str]
) -> tuple[float, str, dict[str, int], str]:
    argv = [
        sys.executable,
        "-m",
        "builder",
        "build",
        "--project",
        str(project),
        "--out",
        str(work / "dist"),
        "--work-dir",
        str(work / "work"),
        "--python",
        "3.11",
        "--arch",
        "X86",
        *extra,
    ]
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    status = "up-to-date" if "] up-to-date (" in proc.stderr else "built"
    steps = step_times(proc.stderr).get(CELL, {})
    ccache = ""
    dist = work / "dist" / "manifest.json"
    if status == "built" and dist.exists():
        entry = [w for w in json.loads(dist.read_text())["wheels"] if w["cell"] == CELL][-1]
        stats = entry.get("extra", {}).get("ccache")
        ccache = f"{stats['hits']}h/{stats['misses']}m" if stats else "-"
    return took, status, steps, ccache


def cold_docker(engine_cell: str) -> None:
    """No torch layer for the cell: remove this cell's layers (none in use by a container)."""
    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - docker runs only

    engine = DockerEngine()
    for image in engine.api.images(filters={"label": f"org.ampforge.torch.cell={engine_cell}"}):
        engine.remove_image(image["Id"])


def run_backend(
    backend: str, args: argparse.Namespace, tmp: Path, rev: str | None = None
) -> list[tuple]:
    """The four cases for one backend, for the project now (*rev* None) or as of *rev*."""
    extra = ["--backend", backend]
    if backend == "docker":
        extra += ["--base-image", args.base_image]
    if args.wheelhouse:
        extra += ["--wheelhouse", args.wheelhouse]
    volume = f"ampforge-bench-ccache-{uuid.uuid4().hex[:8]}"
    side = f"{backend}-{rev or 'now'}"
    env = {"AMPFORGE_CACHE": str(tmp / f"cache-{side}"), "AMPFORGE_CCACHE_VOLUME": volume}
    if backend == "docker":
        cold_docker(CELL)
    work = tmp / side
    project = copy_project_at(rev, work / "project") if rev else copy_project(work / "project")
    rows = [("cold", *build(project, work, extra, env))]
    rows.append(("nothing changed", *build(project, work, extra, env)))
    py = project / "amp" / "scaler.py"
    with py.open("a") as fh:
        fh.write("\n# benchmark: one Python file touched\n")
    rows.append((f"{py.name} touched", *build(project, work, extra, env)))
    # The shared ops (setup.py's CORE_SOURCES), compiled into either binding: the row then
    # recompiles one file whichever binding the cell builds (the first source by name,
    # bindings.cpp, is the pybind11 binding's, which a stable-ABI cell does not compile at all).
    # Older trees (--before) had no ops.cpp: the first source by name there.
    kernel = project / "kernels" / "ops.cpp"
    if not kernel.is_file():
        kernel = sorted((project / "kernels").glob("*.cpp"))[0]
    with kernel.open("a") as fh:
        # Code, not a comment: the preprocessor drops comments, and ccache rightly serves a
        # comment-only change from the cache (a hit, not a recompile).
        fh.write("\n[[maybe_unused]] static const int ampforge_bench_touched = 1;\n")
    rows.append((f"{kernel.name} touched", *build(project, work, extra, env)))
    if backend == "docker":
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, check=False)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["host", "docker"], choices=("host", "docker"))
    ap.add_argument(
        "--base-image",
        default="local",
        help="docker backend's base image (default: local, built on first use)",
    )
    ap.add_argument("--wheelhouse", default=None, help="find-links folder for torch")
    ap.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help="also build the project as of this git revision (side by side)",
    )
    args = ap.parse_args()
    print(f"build_cell: cell {CELL}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        for backend in args.backends:
            sides = [(args.before, f"before ({args.before})")] if args.before else []
            for rev, label in [*sides, (None, "now" if args.before else "")]:
                rows = run_backend(backend, args, Path(tmp), rev)
                cold = rows[0][1]
                print(f"\nbackend {backend}{', ' + label if label else ''}")
                print(
                    f"{'case':<24} {'seconds':>8} {'vs cold':>8} {'ccache':>8}  result, steps (s)"
                )
                for name, took, status, steps, ccache in rows:
                    detail = ", ".join(f"{k} {v}" for k, v in steps.items())
                    print(
                        f"{name:<24} {took:8.1f} {cold / took:7.1f}x {ccache:>8}  {status}: "
                        f"{detail}",
                        flush=True,
                    )
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
