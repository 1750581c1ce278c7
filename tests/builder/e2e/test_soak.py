"""CI's short soak (issue #38, part 7): benchmarks/soak.py, three rounds (one per signal), a
fixed seed: about three minutes on 2 cores (a cold torch environment, then eight builds). The
long one is ``make soak N=...``; what a round does and checks is in the script's docstring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


@pytest.mark.promise(
    promise="a build ended by SIGINT, SIGTERM or SIGKILL at any moment, with `cache prune` "
    "running beside it, leaves dist/ and the cache consistent, and the next build "
    "succeeds",
    fault="builds of one cell each signalled after a random delay (seeded), one round per "
    "signal; `cache prune` every 3 s against the same cache",
    result="each signalled build exits 130 / 143 / -9 (or 0 if it finished first); after each, "
    "manifest.json parses, every wheel is listed with its sha256, nothing hidden is "
    "left, `cache list` reads the cache; the next build exits 0; no prune fails",
)
def test_builds_killed_at_random_moments_leave_dist_and_cache_consistent(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "soak.py"),
            "--builds",
            "3",
            "--seed",
            "28",
            "--wheelhouse",
            str(wheelhouse_cp311()),
            "--keep",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=1500,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    rounds = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert [r.split(":")[1].split()[0] for r in rounds] == ["SIGINT", "SIGTERM", "SIGKILL"], out
    assert all(r.endswith(": consistent") for r in rounds), out
    # Seed 28 sends them at 11%, 13% and 60% of a warm build's time: mid-build, unless a
    # build ran in less than two thirds of the warm one's time.
    assert sum(", signalled, " in r for r in rounds) >= 2, out
    assert "0 failed;" in out and "; 0 problems" in out, out
