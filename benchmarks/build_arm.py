"""Whole-cell build times for the same ARM cell, emulated vs cross, and the x86 cell for scale.

Each case is one `python -m builder build --force` of a copy of this project (amp, kernels,
setup.py, pyproject.toml, README) into its own dist/, measured in the same run:

  emulated  ARM cp311 torch 2.9.1, --backend emulated: the docker steps in the local arm64 base
            image (`python -m builder base-image --arch ARM`), every process under QEMU
  cross     ARM cp311 torch 2.9.1, --backend cross: aarch64-linux-gnu-g++ on this host, verified
            under qemu-aarch64
  native    X86 cp311 torch 2.13.0, --backend docker, the local amd64 base image

Wheels come from wheelhouses (aarch64: tests/builder/helpers/armlib.py, x86_64:
tests/builder/helpers/enginelib.py),
filled with pip on first use. The base images are built (or found) first, outside the timings.
Targets (issue #7): cross >= 5x faster than emulated; cross within 1.5x of native X86.

    .venv/bin/python benchmarks/build_arm.py [--cases native,cross,emulated] [--jobs N]
                                             [--overlap] [--project DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from progress_lines import total_step_times
from project_copy import copy_project

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "builder")]
CASES = ("native", "cross", "emulated")
LOGS = ROOT / "build" / "bench-arm"  # each case's builder output, kept after the run


def base_image(arch: str) -> str:
    """Build or reuse the local base image of *arch*; return its tag (untimed set-up)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "builder", "base-image", "--arch", arch],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
    )
    if proc.returncode != 0:
        sys.exit(f"base-image --arch {arch} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    tag = proc.stdout.strip().splitlines()[-1]
    print(f"set-up: base image {arch}: {tag} ({time.monotonic() - start:.0f}s)", flush=True)
    return tag


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ARCH", "PY", "TORCH", "BACKEND", "BASE_IMAGE")
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


def build(
    project: Path, work: Path, name: str, args: list[str]
) -> tuple[float, dict[str, int], str]:
    """One forced cell build; (wall seconds, seconds per step, wheel name)."""
    out = work / name
    argv = [
        sys.executable,
        "-m",
        "builder",
        "build",
        "--project",
        str(project),
        "--force",
        "--out",
        str(out / "dist"),
        "--work-dir",
        str(out / "work"),
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=work)
    took = time.monotonic() - start
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"{name}.log").write_text(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"{name} build failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    steps = total_step_times(proc.stderr)
    wheel = Path(proc.stdout.strip().splitlines()[-1]).name
    return took, steps, wheel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}"
    )
    ap.add_argument("--jobs", type=int, default=None, help="compile jobs in each cell (JOBS)")
    ap.add_argument(
        "--overlap",
        action="store_true",
        help="build the emulated case at the same time as the others (they then "
        "share the CPU: the times say less, the run takes less)",
    )
    ap.add_argument(
        "--project",
        default=None,
        help="another project to build (default: a copy of this repository)",
    )
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {bad}; expected some of {', '.join(CASES)}")
    if args.jobs:
        os.environ["JOBS"] = str(args.jobs)

    from helpers.armlib import ARM_TORCH, wheelhouse_cp311_aarch64  # noqa: PLC0415
    from helpers.enginelib import TORCH, wheelhouse_cp311  # noqa: PLC0415

    arm_cell = ["--arch", "ARM", "--python", "3.11", "--torch", ARM_TORCH]
    argv: dict[str, list[str]] = {}
    if "native" in cases:
        argv["native"] = [
            "--arch",
            "X86",
            "--python",
            "3.11",
            "--torch",
            TORCH,
            "--backend",
            "docker",
            "--base-image",
            base_image("X86"),
            "--wheelhouse",
            str(wheelhouse_cp311()),
        ]
    if "cross" in cases:
        argv["cross"] = [*arm_cell, "--backend", "cross"]
    if "emulated" in cases:  # its base image is resolved right before it is built
        argv["emulated"] = [
            *arm_cell,
            "--backend",
            "emulated",
            "--wheelhouse",
            str(wheelhouse_cp311_aarch64()),
        ]

    results: dict[str, tuple[float, dict[str, int], str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-arm-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        if args.project:
            source = Path(args.project).resolve()
            project = copy_project(
                Path(tmp) / "project", source, [p.name for p in source.iterdir()]
            )
        else:
            project = copy_project(Path(tmp) / "project")
        if "emulated" in argv:
            argv["emulated"] += ["--base-image", base_image("ARM")]

        def one(name: str) -> None:
            print(f"building: {name} ...", flush=True)
            try:
                results[name] = build(project, work, name, argv[name])
            except SystemExit as exc:  # in the overlap thread it would vanish silently
                print(exc, file=sys.stderr, flush=True)
                return
            print(f"  {name}: {results[name][0]:.0f}s {results[name][2]}", flush=True)

        # --overlap: the emulated build (10x the others) runs alongside them, not after.
        background = None
        if args.overlap and "emulated" in argv:
            background = threading.Thread(target=one, args=("emulated",))
            background.start()
        for name in CASES:  # the fast ones first: a failure shows before the long one
            if name in argv and not (background and name == "emulated"):
                one(name)
        if background is not None:
            background.join()
        if set(results) != set(argv):
            sys.exit(f"not every case finished: {sorted(set(argv) - set(results))}")

    print(
        f"\nwhole-cell builds (--force), {os.cpu_count()} cores, jobs={args.jobs or 'default'}"
        + (", emulated overlapping the others" if args.overlap else ", one after another")
    )
    print(f"{'case':<9} {'cell':<36} {'seconds':>8}  wheel")
    cells = {
        "native": f"cp311-manylinux_x86_64-torch{TORCH}",
        "cross": f"cp311-manylinux_aarch64-torch{ARM_TORCH}",
        "emulated": f"cp311-manylinux_aarch64-torch{ARM_TORCH}",
    }
    for name, (took, _, wheel) in results.items():
        print(f"{name:<9} {cells[name]:<36} {took:8.0f}  {wheel}")
    print("\nper step (seconds; from the build's progress lines)")
    for name, (_, steps, _) in results.items():
        print(f"  {name:<9} " + ", ".join(f"{s} {t:.0f}" for s, t in steps.items()))
    if "cross" in results and "emulated" in results:
        r = results["emulated"][0] / results["cross"][0]
        print(
            f"\ncross vs emulated: {r:.1f}x faster (target >= 5x: {'met' if r >= 5 else 'NOT met'})"
        )
    if "cross" in results and "native" in results:
        r = results["cross"][0] / results["native"][0]
        print(
            f"cross vs native X86: {r:.2f}x the native time (target <= 1.5x: "
            f"{'met' if r <= 1.5 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
