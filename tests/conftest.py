"""Shared fixtures. `backend`: run a kernel/optimizer test on every backend (the compiled
kernels per ISA, and the pure-torch fallback)."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from amp import _ext

# Under CI the property tests draw the same examples every run (derandomize): a CI run must
# not pass or fail by chance. Locally they explore new examples each run, and a failure
# prints the @reproduce_failure blob that replays it.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def _select(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = request.param
    if name == "fallback":
        monkeypatch.setenv("AMP_DISABLE_EXTENSION", "1")
        _ext.reset()
        yield name
        monkeypatch.delenv("AMP_DISABLE_EXTENSION")
        _ext.reset()
        return
    mod = _ext.load()
    assert mod is not None, "amp._C must be built for the test suite (make setup)"
    try:
        mod.set_isa(name)
    except ValueError:
        pytest.skip(f"this CPU cannot run the {name} kernels")
    yield name
    mod.set_isa("auto")


# Every compiled build: one the CPU cannot run (AVX-512 on most machines) is skipped, and
# the skip says so; the dispatch itself is tested in tests/kernels/test_ext_loading.py.
@pytest.fixture(params=["avx512", "avx2", "generic", "fallback"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _select(request, monkeypatch)


@pytest.fixture(params=["avx512", "avx2", "generic"])
def compiled_backend(request: pytest.FixtureRequest,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The compiled kernels only, per ISA (for what exists only in amp._C)."""
    yield from _select(request, monkeypatch)
