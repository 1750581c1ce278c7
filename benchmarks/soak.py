"""Soak: many builds of one cell, each ended by SIGINT, SIGTERM or SIGKILL at a random moment
while ``cache prune`` runs beside them; after each, dist/ and the cache must be consistent and
the next build must succeed (issue #38, part 7).

    .venv/bin/python benchmarks/soak.py [--builds N] [--max-minutes M] [--seed S]
        [--prune-every SECONDS] [--wheelhouse DIR] [--keep DIR]

``make soak N=…`` runs it. The cell is the host backend's (this interpreter's Python, the
torch of the wheelhouse) building a one-file C extension; each round bumps the project's
version, so every finished round adds a wheel (and entry) that must stay listed for the rest
of the run. A round:

1. a build, ended after a random delay (up to a warm build's duration: a faster one finishes
   first) by the round's signal, in turn SIGINT (to the builder's process group, as a
   terminal's Ctrl-C), SIGTERM (to the builder, as ``kill``), SIGKILL (to the builder alone,
   as the OOM killer: its pip and compiler may outlive it);
2. its exit code must be the signal's (130, 143, -9), or 0 when it finished first;
3. dist/ is checked (below), then the same build again, let finish: it must exit 0 and list
   the round's wheel (built now, or up to date when the signalled build finished first);
   dist/ is checked again.

Meanwhile a thread runs ``python -m builder cache prune`` (the default policy) against the same
cache every ``--prune-every`` seconds; it must never exit non-zero.

dist/ is consistent when manifest.json parses, every entry's file exists with the recorded
sha256, every wheel in dist/ is listed, no wheel listed by an earlier check is gone (nor are
its bytes other than then), and
nothing hidden is left but the builder's locks. The cache: ``cache list --format json`` reads
it (exit 0). Half-made cache folders a SIGKILL leaves (``.<entry>.<random>``) are counted in
the table, not failures: they are invisible to builds and ``cache prune`` removes them.

Not a test and not run by CI as such (tests/builder/e2e/test_soak.py runs a two-minute version).
Exit 0 when every check held, 1 otherwise; the table says which round failed and why.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the builder's own names for what it writes into dist/

from builder.release.manifest import LOCKS_DIR, sha256_file  # noqa: E402

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
EXPECTED_RC = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}

C_SOURCE = """\
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, methods};
PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&module); }
"""


def write_project(root: Path, version: str) -> Path:
    """``soakext``: one C module; only the version changes between rounds."""
    (root / "soakext").mkdir(parents=True, exist_ok=True)
    (root / "setup.py").write_text(
        textwrap.dedent(f"""\
        from setuptools import Extension, setup
        setup(name="soakext", version="{version}", packages=["soakext"],
              ext_modules=[Extension("soakext._c", ["soakext/c.c"],
                                     extra_compile_args=["-g0", "-O0"])])
        """)
    )
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n'
    )
    (root / "soakext" / "__init__.py").write_text("")
    (root / "soakext" / "c.c").write_text(C_SOURCE)
    return root


def _terminal_defaults() -> None:
    # A script started in the background passes SIGINT ignored (and nohup SIGHUP): the builder
    # gets a terminal's foreground dispositions, which is what the soak means to exercise.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@dataclass
class Soak:
    scratch: Path
    wheelhouse: Path
    log_dir: Path
    listed: dict[str, str] = field(default_factory=dict)  # wheel -> sha256, seen listed

    @property
    def dist(self) -> Path:
        return self.scratch / "dist"

    @property
    def cache(self) -> Path:
        return self.scratch / "cache"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDER_")}
        env["PYTHONPATH"] = str(ROOT)
        env["AMPFORGE_CACHE"] = str(self.cache)
        return env

    def start_build(self, name: str) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "builder",
            "build",
            "--backend",
            "host",
            "--project",
            str(self.scratch / "project"),
            "--wheelhouse",
            str(self.wheelhouse),
            "--out",
            str(self.dist),
            "--work-dir",
            str(self.scratch / "work"),
        ]
        log = (self.log_dir / f"{name}.log").open("w")
        return subprocess.Popen(
            argv,
            cwd=self.scratch,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_terminal_defaults,
            start_new_session=True,
        )

    def log_tail(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-1500:]

    def check(self, killed: bool = False) -> list[str]:
        """What is inconsistent in dist/ and the cache now (empty: nothing). *killed*: the last
        builder was SIGKILLed, so its cell lock may still name it (not clean it can)."""
        problems = []
        try:
            doc = json.loads((self.dist / "manifest.json").read_text())
            entries = {w["file"]: w for w in doc["wheels"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"manifest.json unreadable: {exc!r}"]
        for name, entry in entries.items():
            path = self.dist / name
            if not path.is_file():
                problems.append(f"{name}: listed, not in dist/")
            elif sha256_file(path) != entry.get("sha256"):
                problems.append(f"{name}: its bytes are not the listed sha256")
        wheels = {p.name for p in self.dist.glob("*.whl")}
        problems += [f"{w}: in dist/, not listed" for w in sorted(wheels - set(entries))]
        for w, digest in sorted(self.listed.items()):
            if w not in entries:
                problems.append(f"{w}: listed earlier, gone")
            elif entries[w].get("sha256") != digest:
                problems.append(f"{w}: listed earlier with other bytes (not reproducible?)")
        self.listed.update({w: str(entries[w].get("sha256")) for w in set(entries) & wheels})
        for p in self.dist.iterdir():
            if p.name.startswith(".") and p.name not in (".manifest.lock", LOCKS_DIR):
                problems.append(f"{p.name}: a hidden leftover in dist/")
        problems += _lock_problems(self.dist / LOCKS_DIR, killed)
        listing = subprocess.run(
            [sys.executable, "-m", "builder", "cache", "list", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.scratch,
        )
        if listing.returncode != 0:
            problems.append(
                f"cache list exited {listing.returncode}: {listing.stderr.strip()[-500:]}"
            )
        return problems

    def half_made(self) -> int:
        """Half-made cache entries (``.<entry>.<random>`` folders) left so far."""
        if not self.cache.is_dir():
            return 0
        return sum(
            1
            for kind in self.cache.iterdir()
            if kind.is_dir()
            for p in kind.iterdir()
            if p.name.startswith(".") and p.is_dir()
        )


class Pruner(threading.Thread):
    """``cache prune`` against the soak's cache every *every* seconds until stopped."""

    def __init__(self, soak: Soak, every: float) -> None:
        super().__init__(daemon=True)
        self.soak, self.every = soak, every
        self.runs = 0
        self.failures: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            proc = subprocess.run(
                [sys.executable, "-m", "builder", "cache", "prune"],
                capture_output=True,
                text=True,
                env=self.soak.env(),
                cwd=self.soak.scratch,
            )
            self.runs += 1
            if proc.returncode != 0:
                self.failures.append(
                    f"prune {self.runs} exited {proc.returncode}: "
                    f"{(proc.stdout + proc.stderr).strip()[-500:]}"
                )

    def finish(self) -> None:
        self._halt.set()
        self.join(timeout=300)


@dataclass
class Round:
    number: int
    sig: signal.Signals
    delay: float
    outcome: str = ""  # "signalled" | "finished first"
    rc: int | None = None
    problems: list[str] = field(default_factory=list)


def run_round(soak: Soak, r: Round) -> None:
    write_project(soak.scratch / "project", f"0.1.{r.number}")
    name = f"round{r.number}-{r.sig.name}"
    proc = soak.start_build(name)
    try:
        proc.wait(timeout=r.delay)
        r.outcome = "finished first"
    except subprocess.TimeoutExpired:
        r.outcome = "signalled"
        if r.sig == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(r.sig)
    try:
        r.rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        r.rc = proc.wait()
        r.problems.append(f"{name}: still running 300 s after {r.sig.name}")
    expected = 0 if r.outcome == "finished first" else EXPECTED_RC[r.sig]
    if r.rc != expected:
        r.problems.append(f"{name}: exit {r.rc}, expected {expected}: {soak.log_tail(name)}")
    killed = r.sig == signal.SIGKILL and r.outcome == "signalled"
    r.problems += [f"after {name}: {p}" for p in soak.check(killed)]
    again = soak.start_build(f"{name}-next")
    rc = again.wait(timeout=1800)
    if rc != 0:
        r.problems.append(f"the build after {name} exited {rc}: {soak.log_tail(f'{name}-next')}")
    elif not any(w.startswith(f"soakext-0.1.{r.number}+") for w in _listed(soak.dist)):
        r.problems.append(f"the build after {name} listed no soakext 0.1.{r.number} wheel")
    r.problems += [f"after {name}-next: {p}" for p in soak.check()]


def _lock_problems(locks: Path, killed: bool) -> list[str]:
    """A cell lock still held with no build running, or naming a holder after a builder that
    ended on its own or by a catchable signal (a SIGKILLed one cannot clear its name; the
    kernel still drops its flock, so the next build goes ahead: that name is no problem)."""
    problems = []
    for path in sorted(locks.iterdir()) if locks.is_dir() else []:
        with path.open("a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                problems.append(f"{LOCKS_DIR}/{path.name}: held, with no build running")
                continue
            fcntl.flock(fh, fcntl.LOCK_UN)
        if path.stat().st_size and not killed:
            problems.append(
                f"{LOCKS_DIR}/{path.name}: still names a holder: {path.read_text().strip()}"
            )
    return problems


def _listed(dist: Path) -> set[str]:
    try:
        return {w["file"] for w in json.loads((dist / "manifest.json").read_text())["wheels"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def table(rounds: Sequence[Round]) -> str:
    lines = [
        f"{'signal':<8} {'rounds':>6} {'signalled':>9} {'finished first':>14} {'failed':>6}",
        "-" * 48,
    ]
    for sig in SIGNALS:
        mine = [r for r in rounds if r.sig == sig]
        lines.append(
            f"{sig.name:<8} {len(mine):>6} "
            f"{sum(r.outcome == 'signalled' for r in mine):>9} "
            f"{sum(r.outcome == 'finished first' for r in mine):>14} "
            f"{sum(bool(r.problems) for r in mine):>6}"
        )
    return "\n".join(lines)


def default_wheelhouse() -> Path:
    """The test suite's cp311 wheelhouse (torch and the build requirements, filled by pip on
    first use), so the soak's torch environment installs from local files."""
    sys.path.insert(0, str(ROOT / "tests" / "builder"))
    from helpers.enginelib import wheelhouse_cp311  # noqa: PLC0415

    return wheelhouse_cp311()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", type=int, default=30, help="rounds (default 30)")
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="start no round after this many minutes"
    )
    parser.add_argument("--seed", type=int, default=None, help="the delays' seed")
    parser.add_argument(
        "--prune-every", type=float, default=3.0, help="seconds between cache prunes (default 3)"
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        default=None,
        help="torch and the build requirements (default: the test suite's)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=ROOT / "build" / "soak",
        help="where the builds' logs are kept (default build/soak)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    args.keep.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        soak = Soak(Path(tmp), (args.wheelhouse or default_wheelhouse()).resolve(), args.keep)
        write_project(soak.scratch / "project", "0.0.0")
        first = soak.start_build("round0")
        if first.wait(timeout=1800) != 0:
            print(f"the first build failed:\n{soak.log_tail('round0')}", file=sys.stderr)
            return 1
        # The rounds aim at a warm build (torch environment made, compiler cache filled).
        write_project(soak.scratch / "project", "0.1.0")  # a change: a real build
        warm_start = time.monotonic()
        if soak.start_build("round0-warm").wait(timeout=1800) != 0:
            print(f"the second build failed:\n{soak.log_tail('round0-warm')}", file=sys.stderr)
            return 1
        duration = time.monotonic() - warm_start
        setup_problems = soak.check()
        pruner = Pruner(soak, args.prune_every)
        pruner.start()
        try:
            for number in range(1, args.builds + 1):
                if (
                    args.max_minutes is not None
                    and time.monotonic() - start > 60 * args.max_minutes
                ):
                    break
                r = Round(number, SIGNALS[(number - 1) % len(SIGNALS)], rng.uniform(0, duration))
                run_round(soak, r)
                rounds.append(r)
                status = "; ".join(r.problems) if r.problems else "consistent"
                print(
                    f"round {number}: {r.sig.name} after {r.delay:.1f} s, {r.outcome}, "
                    f"exit {r.rc}: {status}",
                    flush=True,
                )
        finally:
            pruner.finish()
        half_made = soak.half_made()
    problems = setup_problems + [p for r in rounds for p in r.problems] + pruner.failures
    print()
    print(table(rounds))
    print(
        f"\n{len(rounds)} rounds of {args.builds} requested (seed {seed}); a warm build "
        f"{duration:.1f} s; wall {(time.monotonic() - start) / 60:.1f} min; "
        f"{pruner.runs} cache prunes beside them; {len(pruner.failures)} failed; "
        f"{half_made} half-made cache folders left; {len(problems)} problems"
    )
    for p in problems:
        print(f"  - {p}")
    return 1 if problems or not rounds else 0


if __name__ == "__main__":
    sys.exit(main())
