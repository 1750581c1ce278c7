"""The per-test CPU record (tests/cpu_profile.py) and its sums (benchmarks/ci_cpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cpu_profile
import pytest
from cpu_profile import measured

REPO = Path(__file__).resolve().parents[1]
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_a_tests_children_are_counted_and_summed(tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    with measured(str(out), "tests/x/test_a.py::test_burns", "module:x/test_a.py", False):
        subprocess.run([sys.executable, "-c", BURN], check=True)
    with measured(str(out), "tests/x/test_a.py::test_idle", "module:x/test_a.py", False):
        pass
    burns, idle = (json.loads(line) for line in next(out.glob("*.jsonl")).read_text().splitlines())
    assert burns["id"].endswith("test_burns") and burns["children"] >= 0.3, burns
    assert idle["children"] < 0.1 and idle["engine"] == 0.0, idle

    table = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ci_cpu.py"), str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    row = next(line for line in table if line.startswith("tests/x/test_a.py"))
    assert row.split()[1] == "2"  # both tests in the module's row
    assert float(table[-1].split()[-1]) >= 0.3  # the total holds the child's CPU


def test_no_records_is_an_error_naming_the_folder(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ci_cpu.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and str(tmp_path) in r.stderr and "AMPFORGE_CPU_PROFILE" in r.stderr


def test_sessions_of_two_torches_stay_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's older-torch lanes run pytest beside the main suite, with workers of the same names:
    each torch's lines go to a file of their own, and --torch / --by torch tell them apart."""
    out = tmp_path / "cpu"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    for version, test in (("2.13.0+cpu", "test_main"), ("2.1.0", "test_lane"), ("2.1.0", "test_b")):
        monkeypatch.setattr(cpu_profile, "TORCH", version)
        with measured(str(out), f"tests/x/test_a.py::{test}", "module:x/test_a.py", False):
            pass
    assert sorted(p.name for p in out.iterdir()) == [
        "torch2.1.0-gw0.jsonl",
        "torch2.13.0+cpu-gw0.jsonl",
    ]

    def table(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "ci_cpu.py"), str(out), *args],
            capture_output=True,
            text=True,
        )

    rows = table("--by", "torch").stdout.splitlines()
    assert [r.split()[:2] for r in rows[1:-1]] in (
        [["2.1.0", "2"], ["2.13.0+cpu", "1"]],
        [["2.13.0+cpu", "1"], ["2.1.0", "2"]],
    ), rows
    lane = table("--torch", "2.1.0", "--by", "test").stdout
    assert "test_lane" in lane and "test_b" in lane and "test_main" not in lane, lane
    # 2.1. is a prefix of 2.1.0 only, not of 2.13.0+cpu
    assert "test_main" not in table("--torch", "2.1.", "--by", "test").stdout
    missing = table("--torch", "2.6")
    assert missing.returncode != 0 and "2.6" in missing.stderr, missing.stderr
