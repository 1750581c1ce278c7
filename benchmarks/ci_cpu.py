"""Where the test suite's CPU went: sums the per-test lines ``AMPFORGE_CPU_PROFILE=DIR`` wrote
(tests/cpu_profile.py) by module, xdist stream, test or torch, most CPU first; `--torch`
keeps one torch's sessions (CI's older-torch lanes write beside the main suite).

    AMPFORGE_CPU_PROFILE=build/cpu CI=true make test
    .venv/bin/python benchmarks/ci_cpu.py build/cpu [--by module|stream|test|torch] [--top N]
        [--torch VERSION]

Columns: tests, wall seconds (summed; inflated wherever the machine was loaded), and the
CPU-seconds of the test process, of its waited-for children and of the engine's containers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

COLUMNS = ("wall", "own", "children", "engine")


def load(folder: Path) -> list[dict]:
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise SystemExit(
            f"ci_cpu: no *.jsonl in {folder} (run the suite with "
            "AMPFORGE_CPU_PROFILE set to that folder first)"
        )
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def key_of(record: dict, by: str) -> str:
    if by == "torch":
        return record.get("torch", "?")
    if by == "test":
        return record["id"]
    if by == "stream":
        return record["group"] or "(none)"
    return record["id"].split("::", 1)[0]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--by", choices=("module", "stream", "test", "torch"), default="module")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument(
        "--torch",
        metavar="VERSION",
        help="only the lines of the sessions that ran this torch (e.g. 2.13.0+cpu; a prefix "
        "such as 2.1. takes every such version): CI's older-torch lanes write beside the "
        "main suite",
    )
    args = ap.parse_args(argv)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(("n", *COLUMNS), 0.0))
    records = load(args.folder)
    if args.torch:
        records = [r for r in records if r.get("torch", "").startswith(args.torch)]
        if not records:
            raise SystemExit(f"ci_cpu: no line of {args.folder} ran torch {args.torch}")
    for record in records:
        row = sums[key_of(record, args.by)]
        row["n"] += 1
        for col in COLUMNS:
            row[col] += record.get(col, 0.0)
    cpu = {k: v["own"] + v["children"] + v["engine"] for k, v in sums.items()}
    width = max(len(k) for k in sums)
    print(
        f"{args.by:<{width}} {'tests':>6} {'wall s':>8} {'own':>7} {'children':>9} "
        f"{'engine':>7} {'CPU s':>7}"
    )
    for k in sorted(sums, key=lambda k: -cpu[k])[: args.top]:
        v = sums[k]
        print(
            f"{k:<{width}} {int(v['n']):>6} {v['wall']:>8.0f} {v['own']:>7.1f} "
            f"{v['children']:>9.1f} {v['engine']:>7.1f} {cpu[k]:>7.1f}"
        )
    total = {col: sum(v[col] for v in sums.values()) for col in ("n", *COLUMNS)}
    print(
        f"{'total':<{width}} {int(total['n']):>6} {total['wall']:>8.0f} {total['own']:>7.1f} "
        f"{total['children']:>9.1f} {total['engine']:>7.1f} {sum(cpu.values()):>7.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
