"""The per-test CPU record (tests/cpu_profile.py) and its sums (benchmarks/ci_cpu.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
