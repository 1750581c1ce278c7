"""Session fixtures for the builder tests: builds that several tests read.

A cold build of this repository compiles the kernels (minutes on two cores). Each fixture
builds once per test session and hands out a read-only record; a test that needs to change
something builds into its own folder. tests/conftest.py keeps every test that uses one of these
fixtures in one xdist group (FIXTURE_GROUPS), so a parallel run also builds each once.
"""

from __future__ import annotations

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311
from helpers.pipelinelib import AmpBuild, run_build, seed_dist, snapshot_of_this_repo

from builder.images.base_image import build_base_image


@pytest.fixture(scope="session")
def docker_amp_build(tmp_path_factory: pytest.TempPathFactory) -> AmpBuild:
    """This repository (a snapshot) built by the docker backend on the local base image."""
    root = tmp_path_factory.mktemp("docker-amp")
    base = build_base_image(docker_engine())
    project = snapshot_of_this_repo(root / "ampforge")
    seeded = seed_dist(root / "dist")
    args = (
        "--backend",
        "docker",
        "--base-image",
        base.tag,
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--project",
        str(project),
    )
    return AmpBuild(root, args, run_build(root, *args), seeded)


@pytest.fixture(scope="session")
def host_amp_build(tmp_path_factory: pytest.TempPathFactory) -> AmpBuild:
    """This repository built by the host backend (the default project: the checkout)."""
    root = tmp_path_factory.mktemp("host-amp")
    seeded = seed_dist(root / "dist")
    args = (
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    return AmpBuild(root, args, run_build(root, *args), seeded)
