"""Each way a cell can fail, for real: a clear message, exit 1 (130 for Ctrl-C), no container
left, no partial file in dist/, the earlier wheel and the manifest untouched.

Uses small broken extension projects (``--project``) so each failure is reached quickly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import (
    CELL,
    broken_project,
    dist_state,
    run_build,
    seed_dist,
    start_blocked_docker_build,
)

from builder.images.base_image import build_base_image

pytestmark = pytest.mark.slow


def _host_build(tmp_path: Path, project: Path):
    return run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )


def _no_leftovers(tmp_path: Path, before: dict[str, bytes]) -> None:
    assert dist_state(tmp_path / "dist") == before
    assert not list((tmp_path / "work" / "stage").glob("*")), "staging folder left behind"


def test_compile_error_shows_the_compiler_lines_and_the_log(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    r = _host_build(tmp_path, broken_project(tmp_path / "src", "compile"))
    assert r.rc == 1, r.err
    assert "step 'build wheel' failed" in r.err
    assert "sentinel_undeclared_xyz" in r.err  # the compiler's own error line is shown
    log = tmp_path / "work" / "logs" / f"{CELL}.log"
    assert f"full log: {log}" in r.err and "sentinel_undeclared_xyz" in log.read_text()
    assert "Traceback" not in r.err
    _no_leftovers(tmp_path, before)


def test_repair_refuses_a_library_outside_the_policy(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    r = _host_build(tmp_path, broken_project(tmp_path / "src", "repair"))
    assert r.rc == 1, r.err
    assert "refusing to repair" in r.err and "libexpat.so.1" in r.err
    _no_leftovers(tmp_path, before)


def test_a_wheel_needing_a_newer_glibc_than_its_torch_fails_naming_the_symbol(
    tmp_path: Path,
) -> None:
    before = seed_dist(tmp_path / "dist")
    r = _host_build(tmp_path, broken_project(tmp_path / "src", "glibc"))
    assert r.rc == 1, r.err
    assert "step 'symbol versions'" in r.err or "symbol versions" in r.err, r.err
    assert (
        "needs glibc 2.34 (manylinux_2_34 at best), newer than manylinux_2_28_x86_64: "
        "torch 2.13.0's own wheel is manylinux_2_28_x86_64" in r.err
    ), r.err
    assert "close_range@GLIBC_2.34 (libc.so.6)" in r.err, r.err
    assert "pow@" not in r.err  # the libm floor keeps pow out of it
    _no_leftovers(tmp_path, before)


def test_failing_smoke_test_keeps_the_wheel_out_of_dist(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    r = _host_build(tmp_path, broken_project(tmp_path / "src", "smoke"))
    assert r.rc == 1, r.err
    # A top-level module (tinyext_top.cpython-311-...so) is imported too (issue 28).
    assert "smoke test" in r.err and "undefined symbol: smoke_sentinel_undefined" in r.err, r.err
    _no_leftovers(tmp_path, before)


def test_a_module_that_does_not_import_fails_the_cell_though_its_test_passes(
    tmp_path: Path,
) -> None:
    """The import check runs beside the project's test-command (both import torch first): a
    test that passes without importing the broken module must not hide the failed import."""
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(broken_project(tmp_path / "src", "smoke")),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--test-command",
        "python -c 'print(\"passing-test-sentinel\")'",
    )
    assert r.rc == 1, r.err
    assert "undefined symbol: smoke_sentinel_undefined" in r.err, r.err
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "passing-test-sentinel" in log and "test-command exit 0" in log, log[-3000:]
    _no_leftovers(tmp_path, before)


def test_failing_test_command_fails_the_cell_with_its_output_tail(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    project = write_tiny_extension(tmp_path / "src")
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--test-command",
        "python -c 'import torch, tinyext._C; print(\"test-sentinel-out\")' && exit 3",
    )
    assert r.rc == 1, r.err
    assert "test-command failed with exit code 3" in r.err, r.err
    # The tail of its output is in the error; all of it in the cell's log.
    assert "test-sentinel-out" in r.err and "Traceback" not in r.err
    log = tmp_path / "work" / "logs" / f"{CELL}.log"
    assert f"full log: {log}" in r.err and "test-sentinel-out" in log.read_text()
    _no_leftovers(tmp_path, before)


@pytest.mark.docker
def test_ctrl_c_mid_build_removes_the_container_and_leaves_dist_intact(tmp_path: Path) -> None:
    engine = docker_engine()
    base = build_base_image(engine)
    before = seed_dist(tmp_path / "dist")
    # The project's build blocks inside the container until interrupted: the interrupt lands
    # mid-build whatever is cached.
    proc, seen = start_blocked_docker_build(engine, tmp_path, "ctrl-c-tinyext", base.tag)
    try:
        # The build is blocked in the container now (a condition, not a delay).
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    left = {c["Id"] for c in engine.api.containers(all=True)}
    assert not (seen & left), "the build's container was left behind"
    _no_leftovers(tmp_path, before)
