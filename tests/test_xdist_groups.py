"""`make test` relies on pytest-xdist's ``--dist loadgroup`` keeping each group on one worker
(tests/conftest.py: engine tests in one stream, a module's tests with their module fixtures).
A pytest/xdist pairing that silently ignores the groups (pytest 9 with xdist 3.8 does) would let
engine tests race; this runs a small session and checks where its tests ran."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = """
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's configuration
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:cacheprovider",
            "-c",
            "pytest.ini",
            "test_sample.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    found = re.findall(r"\[(gw\d)\].*PASSED \S*test_sample\.py::(test_\w+)", r.stdout)
    for worker, name in found:
        workers[name].add(worker)
    assert len(workers["test_grouped"]) == 1, r.stdout[-3000:]
    assert workers["test_free"], r.stdout[-3000:]
