"""tests/builder/unit/ holds what its name says (docs/development.md): no test here builds a
wheel through the builder, drives a container engine or is marked as slow -- those are e2e/'s.
Read from the sources, so a test moved here by mistake fails at once."""

from __future__ import annotations

import re
from pathlib import Path

UNIT = Path(__file__).resolve().parent
#: What only an end-to-end test uses: the slow/engine/CUDA-build marks, the engine, the shared
#: amp builds and the builder run as a build.
E2E_ONLY = re.compile(
    r"pytest\.mark\.(slow|docker|cuda_build)\b|\bdocker_engine\(|"
    r"\b(host|docker)_amp_build\b|\brun_build\(|\bpytest\.mark\.starts_from\b"
)


def test_no_unit_test_uses_what_only_end_to_end_tests_use() -> None:
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(UNIT.glob("test_*.py"))
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if E2E_ONLY.search(line)
    ]
    assert not found, "move these modules to tests/builder/e2e/:\n" + "\n".join(found)
    assert len(list(UNIT.glob("test_*.py"))) > 10
