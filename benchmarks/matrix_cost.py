"""What a whole matrix costs, before and after a change of the project, in one run: the same
builder (this checkout's) builds every cell of a config for the project as of git revision
BEFORE and as it is now, and prints builds, verifications, wheels, wall time and the time of
each step, side by side.

    .venv/bin/python benchmarks/matrix_cost.py --before REV [--config FILE] [--ccache]
                                               [--json FILE] [--keep DIR]

Each side builds into its own dist/ and work folder from a private copy of the project (the
checkout is never touched), with ``--no-ccache`` unless ``--ccache``: a compile is a compile.
The torch environments, sysroots and wheels come from the builder's shared caches, the same
for both sides (the same builder makes the same keys), so warm them first (one run with
``--ccache``) or the first side pays for them; the torch column shows whether it did.

"Builds" are the cells that compiled a wheel; "verified" the cells a wheel built for another
cell served (the manifest's ``extra.served_by``: a stable-ABI or abi3 wheel, installed and
tested there, not compiled again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from progress_lines import step_times, total_step_times
from project_copy import copy_project, copy_project_at

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = Path(__file__).resolve().parent / "matrix_cost.yaml"


def summarize(label: str, work: Path, stderr: str, exit_code: int, wall: float) -> dict[str, Any]:
    """One side's figures from its dist/ and the builder's progress lines."""
    dist = work / "dist"
    manifest = (
        json.loads((dist / "manifest.json").read_text())
        if (dist / "manifest.json").exists()
        else {"wheels": []}
    )
    entries = manifest["wheels"]
    served = [w for w in entries if w.get("extra", {}).get("served_by")]
    return {
        "side": label,
        "exit": exit_code,
        "wall_s": round(wall, 1),
        "cells": len(entries),
        "builds": len(entries) - len(served),
        "verified": len(served),
        "wheels": len(list(dist.glob("*.whl"))),
        "steps_s": total_step_times(stderr),
        "per_cell": step_times(stderr),
        "log": str(work / "build.log"),
    }


def run_side(label: str, project: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "builder",
        "build",
        "--all",
        "--keep-going",
        "--config",
        str(args.config),
        "--project",
        str(project),
        "--out",
        str(work / "dist"),
        "--work-dir",
        str(work / "work"),
        *([] if args.ccache else ["--no-ccache"]),
    ]
    print(f"[{label}] {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    wall = time.monotonic() - start
    (work / "build.log").write_text(proc.stderr)
    (work / "side.json").write_text(
        json.dumps({"exit": proc.returncode, "wall_s": wall, "builder": describe()})
    )
    return summarize(label, work, proc.stderr, proc.returncode, wall)


def describe() -> str:
    """This checkout's revision (the builder of both sides, and the "after" project)."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()


def reread_side(label: str, work: Path) -> dict[str, Any]:
    """A side already built into *work* (``--keep``), figures read again (``--report``)."""
    run = json.loads((work / "side.json").read_text())
    return summarize(label, work, (work / "build.log").read_text(), run["exit"], run["wall_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision of this repository")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--ccache", action="store_true", help="let the compiler cache serve objects")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--keep", type=Path, help="build here (kept) instead of a temporary folder")
    ap.add_argument(
        "--report",
        action="store_true",
        help="build nothing: print the table again from a --keep folder",
    )
    args = ap.parse_args()
    if args.report and not args.keep:
        ap.error("--report needs --keep DIR (the folder of an earlier run)")
    args.config = args.config.resolve()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        base = args.keep.resolve() if args.keep else Path(tmp)
        sides = []
        for label in ("before", "after"):
            work = base / label
            if args.report:
                sides.append(reread_side(label, work))
                continue
            work.mkdir(parents=True, exist_ok=True)
            project = (
                copy_project_at(args.before, work / "project")
                if label == "before"
                else copy_project(work / "project")
            )
            sides.append(run_side(label, project, work, args))
    head = (
        json.loads((base / "after" / "side.json").read_text()).get("builder", "?")
        if args.report
        else describe()
    )
    print(
        f"matrix_cost: config {args.config.name}; before = {args.before}, after = {head}; "
        f"ccache {'on' if args.ccache else 'off'}; {os.cpu_count()} CPUs; load average "
        f"{load:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    rows = [
        ("cells", "cells"),
        ("builds (compiles)", "builds"),
        ("verified with another cell's wheel", "verified"),
        ("wheels in dist/", "wheels"),
        ("wall time (s)", "wall_s"),
        ("exit code", "exit"),
    ]
    names = sorted(
        {n for s in sides for n in s["steps_s"]},
        key=lambda n: -max(s["steps_s"].get(n, 0) for s in sides),
    )
    print(f"{'':<38} {'before':>9} {'after':>9} {'after/before':>13}")
    for title, key in rows + [(f"  step '{n}' summed over cells (s)", n) for n in names]:
        b, a = (s.get(key, s["steps_s"].get(key, 0)) for s in sides)
        ratio = f"{a / b:12.2f}x" if isinstance(b, (int, float)) and b and key != "exit" else ""
        print(f"{title:<38} {b:>9} {a:>9} {ratio:>13}")
    for s in sides:
        if s["exit"] != 0:
            print(f"{s['side']}: the build exited {s['exit']}; its log: {s['log']}")
    if args.json:
        args.json.write_text(
            json.dumps({"before": args.before, "after": head, "sides": sides}, indent=1)
        )
    return 0 if all(s["exit"] == 0 for s in sides) else 1


if __name__ == "__main__":
    raise SystemExit(main())
