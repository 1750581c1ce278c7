"""Run the multi-process tests many times in a row on a loaded machine; print runs and failures
per test (issue #40: a DDP rank aborted at exit about one run in ten).

    .venv/bin/python benchmarks/stress_multiprocess.py [--runs 100] [--group amp builder]
        [--test NODEID ...] [--load kernels|hogs|none] [--hogs K] [--max-minutes M]
        [--keep DIR]

A round is one pytest session of the chosen tests (no -x: every test runs every round); the
outcome of each test is read from the round's JUnit XML. Meanwhile a second workload competes
for the CPUs: ``kernels`` (the default) runs ``pytest tests/kernels`` over and over, ``hogs``
runs K busy loops. The project's pytest configuration applies as it is (it blocks rerun
plugins), so a test counts as passed only when it passed the first time, in its round.

Not a test (benchmarks/ is outside pytest's testpaths) and not run by CI: it takes minutes to
an hour. With --max-minutes no round starts after that time; the table says how many ran.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The tests that start processes of their own and make them meet (DDP ranks, combine_ddp
#: ranks, a checkpoint resumed in a fresh process; builders and writers sharing one dist/).
GROUPS: dict[str, list[str]] = {
    "amp": [
        "tests/amp/test_distributed.py",
        "tests/amp/test_resume.py",
        # the saturation mode's DDP ranks (tests/npu/_saturation_worker.py)
        "tests/npu/test_saturation.py::test_one_saturating_rank_makes_every_rank_skip",
    ],
    "builder": [
        "tests/builder/e2e/test_faults_concurrency.py",
        # writers in forked processes sharing one manifest
        "tests/builder/e2e/test_repair.py::test_parallel_cells_do_not_lose_entries",
        # a lock holder in another process while prune runs
        "tests/builder/e2e/test_cache_prune.py::"
        "test_prune_removes_superseded_torch_envs_and_never_one_in_use",
        "tests/builder/e2e/test_cache_prune.py::"
        "test_a_build_waiting_while_prune_removes_the_entry_holds_the_new_lock",
    ],
}


@dataclass
class Tally:
    runs: int = 0
    failed: int = 0
    skipped: int = 0
    failed_rounds: list[int] = field(default_factory=list)


class Load:
    """The competing workload, started before the first round and stopped after the last."""

    def __init__(self, kind: str, hogs: int) -> None:
        self.kind = kind
        self.hogs = hogs
        self.passes = 0  # completed tests/kernels sessions (kind == "kernels")
        self._stop = threading.Event()
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        if self.kind == "kernels":
            return f"pytest tests/kernels in a loop ({self.passes} sessions completed)"
        if self.kind == "hogs":
            return f"{self.hogs} busy-loop processes"
        return "none"

    def start(self) -> None:
        if self.kind == "hogs":
            for _ in range(self.hogs):
                self._spawn([sys.executable, "-c", "while True: pass"])
        elif self.kind == "kernels":
            self._thread = threading.Thread(target=self._kernels_loop, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:  # under the lock: no process is spawned after this snapshot
            self._stop.set()
            procs = list(self._procs)
        for proc in procs:
            # Each load process leads its own session: end it and whatever it started.
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self._thread is not None:
            self._thread.join()

    def _spawn(self, argv: list[str]) -> subprocess.Popen | None:
        with self._lock:
            if self._stop.is_set():
                return None
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._procs.append(proc)
        return proc

    def _kernels_loop(self) -> None:
        argv = [sys.executable, "-m", "pytest", "tests/kernels", "-q", "-p", "no:cacheprovider"]
        while (proc := self._spawn(argv)) is not None:
            proc.wait()
            with self._lock:
                self._procs.remove(proc)
            if not self._stop.is_set():
                self.passes += 1


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> "passed" | "failed" | "skipped", from one round's JUnit XML."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result[test_id] = "failed"
        elif case.find("skipped") is not None:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def run_round(number: int, tests: Sequence[str], scratch: Path) -> tuple[dict[str, str], str]:
    """One pytest session of *tests*; the outcome per test and pytest's output."""
    junit = scratch / f"round{number}.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *tests,
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    output = proc.stdout + proc.stderr
    if not junit.exists():  # pytest itself failed (a usage or collection error)
        raise SystemExit(f"round {number}: pytest exited {proc.returncode}:\n{output[-3000:]}")
    return outcomes(junit), output


def table(tallies: dict[str, Tally]) -> str:
    width = max(len(t) for t in tallies)
    lines = [
        f"{'test':<{width}}  {'runs':>5}  {'failed':>6}  {'skipped':>7}  failed in round",
        "-" * (width + 40),
    ]
    for test_id, t in tallies.items():
        rounds = ", ".join(map(str, t.failed_rounds[:10])) + (" ..." if t.failed > 10 else "")
        lines.append(f"{test_id:<{width}}  {t.runs:>5}  {t.failed:>6}  {t.skipped:>7}  {rounds}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="rounds (default 100)")
    parser.add_argument(
        "--group",
        nargs="+",
        choices=sorted(GROUPS),
        default=["amp"],
        help="test groups (default: amp)",
    )
    parser.add_argument(
        "--test", nargs="+", default=[], help="pytest node ids or paths, instead of --group"
    )
    parser.add_argument("--load", choices=["kernels", "hogs", "none"], default="kernels")
    parser.add_argument(
        "--hogs",
        type=int,
        default=os.cpu_count() or 2,
        help="busy loops for --load hogs (default: one per CPU)",
    )
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="start no round after this many minutes"
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=ROOT / "build" / "stress",
        help="where a failing round's output is kept (default build/stress)",
    )
    args = parser.parse_args(argv)
    tests = args.test or [t for g in args.group for t in GROUPS[g]]

    tallies: dict[str, Tally] = {}
    load = Load(args.load, args.hogs)
    start = time.monotonic()
    load.start()
    rounds = 0
    try:
        with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
            for number in range(1, args.runs + 1):
                elapsed = time.monotonic() - start
                if args.max_minutes is not None and elapsed > 60 * args.max_minutes:
                    break
                result, output = run_round(number, tests, Path(tmp))
                rounds = number
                failed = [t for t, o in result.items() if o == "failed"]
                for test_id, outcome in result.items():
                    tally = tallies.setdefault(test_id, Tally())
                    tally.runs += 1
                    tally.skipped += outcome == "skipped"
                    if outcome == "failed":
                        tally.failed += 1
                        tally.failed_rounds.append(number)
                if failed:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    kept = args.keep / f"round{number}.txt"
                    kept.write_text(output)
                    print(
                        f"round {number}: FAILED {', '.join(failed)} (output: {kept})", flush=True
                    )
                elif number % 10 == 0:
                    print(
                        f"round {number}: all passed ({time.monotonic() - start:.0f} s)", flush=True
                    )
    finally:
        load.stop()
    wall = time.monotonic() - start
    print()
    print(table(tallies) if tallies else "no round ran")
    print(
        f"\n{rounds} rounds of {args.runs} requested; wall {wall / 60:.1f} min; "
        f"{os.cpu_count()} CPUs; load: {load.describe()}"
    )
    return 1 if any(t.failed for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
