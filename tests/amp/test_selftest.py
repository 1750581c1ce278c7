"""``python -m amp.selftest``: the check every built wheel passes (the project's test-command)
answers for this installation too, and fails when the compiled kernels are not in use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from amp import _ext


def _selftest(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amp.selftest", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


@pytest.mark.skipif(
    not _ext.available(), reason="amp._C is not built in this checkout (make setup builds it)"
)
def test_selftest_passes_with_the_compiled_kernels() -> None:
    r = _selftest()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("amp selftest: ok -- amp "), r.stdout
    assert "max |fused - reference|" in r.stdout


def test_selftest_fails_on_the_fallback() -> None:
    r = _selftest(AMP_DISABLE_EXTENSION="1")
    assert r.returncode == 1, r.stdout
    assert "amp selftest: FAILED: amp._C cannot be used" in r.stderr, r.stderr
