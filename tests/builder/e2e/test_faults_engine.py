"""Issue 27, part 2: the container engine stops while a cell runs in it.

Never the shared engine: the test starts a dockerd of its own (faultlib.PrivateDockerd: own
data root, exec root, pid file and socket, no bridge, no iptables) and stops it under a running
build. The base image is one static program standing in for every tool the recipe and the
engine's sessions call (faultlib.FAKE_TOOLS): the cell image builds in a second and the
build then waits inside its container, where the engine is stopped. That image cannot make a
wheel, so "the rerun" is shown running the cell again from the start on the restarted engine
(its cell image intact and reused), not finishing it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311
from helpers.faultlib import (
    C_CELL,
    CELL_MARK,
    PrivateDockerd,
    fake_base_image,
    wait_for_text,
    write_c_project,
)
from helpers.pipelinelib import build_argv, builder_env, dist_state, run_subprocess, seed_dist

pytestmark = pytest.mark.slow

FAKE_IMAGE = "ampforge-fault/tools:1"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[PrivateDockerd]:
    daemon = PrivateDockerd()
    try:
        daemon.start()
        fake_base_image(daemon.host, tmp_path / "image", FAKE_IMAGE)
        yield daemon
    finally:
        daemon.stop()


@pytest.mark.promise(
    promise="an engine that stops mid-cell fails the cell naming the engine; no wheel reaches "
    "dist/; after the engine is back, clean leaves nothing and the rerun runs the cell",
    fault="the test's own dockerd stopped (SIGTERM) while the cell runs in its container, "
    "then started again on the same data root",
    result="exit 1 naming the engine's socket and the step; dist/ byte-identical; clean "
    "removes the dead build's container and the engine holds none; the rerun reuses "
    "the cell image and runs in a new container (then is interrupted: exit 130, no "
    "container left)",
)
def test_an_engine_stopped_mid_cell_fails_naming_it_and_clean_leaves_nothing(
    tmp_path: Path, engine: PrivateDockerd
) -> None:
    project = write_c_project(tmp_path / "src")
    before = seed_dist(tmp_path / "dist")
    env = {"DOCKER_HOST": engine.host}
    argv = build_argv(
        tmp_path,
        "--backend",
        "docker",
        "--base-image",
        FAKE_IMAGE,
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    log = tmp_path / "work" / "logs" / f"{C_CELL}.log"

    proc = run_subprocess(argv, tmp_path, **env)
    wait_for_text(log, CELL_MARK, proc)
    assert len(engine.containers()) == 1
    engine.stop_daemon()
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert f"the container engine at {engine.host} stopped answering during step" in err, err
    assert "Traceback" not in err
    assert dist_state(tmp_path / "dist") == before
    assert not list((tmp_path / "work" / "stage").iterdir())

    engine.start()
    left = engine.containers()
    clean = subprocess.run(
        [sys.executable, "-m", "builder", "clean"],
        cwd=tmp_path,
        env=builder_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert clean.returncode == 0, clean.stderr
    assert all(f"removed {c[:12]}" in clean.stdout for c in left), clean.stdout
    assert engine.containers() == []

    log.unlink()  # it holds the first run's mark
    rerun = run_subprocess(argv, tmp_path, **env)
    wait_for_text(log, CELL_MARK, rerun)
    rerun.send_signal(signal.SIGINT)
    _out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 130, err
    assert engine.containers() == []
    assert dist_state(tmp_path / "dist") == before
