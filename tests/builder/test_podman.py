"""Podman as the engine, for real: one cell of the tiny torch extension built end to end through
podman's Docker-API socket, selected the way a cibuildwheel project selects it
(``container-engine = "podman"`` in its pyproject.toml).

Rootful podman (Debian's, which .ci/run installs): under CI a missing podman FAILS the test, as
a missing dockerd fails the docker tests. The base image is the one the docker tests build
(same content key), copied from dockerd when it has it (a minute) instead of debootstrapping
again (three); podman keeps it, so later runs reuse it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from enginelib import missing, wheelhouse_cp311, write_tiny_extension
from pipelinelib import CELL, hidden_leftovers, manifest, run_build

from builder.engines.docker import DockerEngine, _one_label_each
from builder.engines.podman import podman_url, service_command, socket_path
from builder.errors import ConfigError, EngineUnavailable
from builder.images.base_image import BaseImageSpec, build_base_image


def _podman() -> DockerEngine:
    if shutil.which("podman") is None:
        missing("podman is not installed", ".ci/run installs Debian's podman with apt-get")
    url, _how = podman_url(env={"PATH": os.environ.get("PATH", "")})
    try:
        engine = DockerEngine(url)
    except EngineUnavailable as exc:
        missing(f"podman's socket does not answer: {exc.message.splitlines()[0]}",
                "the builder starts podman system service itself")
    assert engine.is_podman, f"{url} answers, but not as podman: {engine.server_version}"
    return engine


def _base_image(podman: DockerEngine) -> str:
    """The local base image in podman: found, copied from dockerd, or built."""
    tag = BaseImageSpec().tag
    if podman.image_id(tag) is None:
        try:
            docker = DockerEngine()  # the docker tests' engine (DOCKER_HOST or dockerd's)
        except EngineUnavailable:
            docker = None
        if docker is not None and not docker.is_podman:
            podman.copy_image_from(docker, build_base_image(docker).tag)
    return build_base_image(podman).tag  # found now, or made in podman (debootstrap)


def test_the_socket_is_podmans_own_per_user() -> None:
    assert socket_path(0) == Path("/run/podman/podman.sock")
    assert socket_path(1000, "/run/user/1000") == Path("/run/user/1000/podman/podman.sock")
    assert service_command(socket_path(0)) == (
        "podman system service --time=0 unix:///run/podman/podman.sock &")


def test_the_callers_docker_host_wins_and_no_podman_exits_2(tmp_path: Path) -> None:
    assert podman_url(env={"DOCKER_HOST": "unix:///x.sock"}) == ("unix:///x.sock", "DOCKER_HOST")
    with pytest.raises(ConfigError) as info:
        podman_url(file="p/pyproject.toml", key="tool.cibuildwheel.container-engine",
                   env={"PATH": str(tmp_path)})
    assert info.value.return_code == 2
    assert str(info.value).startswith("p/pyproject.toml: tool.cibuildwheel.container-engine: "
                                      "is 'podman', but podman is not installed here")


def test_an_import_label_change_is_split_one_pair_each() -> None:
    """Podman 4.3 reads ``LABEL a=1 b=2`` as one label ``a`` of value ``1 b=2``."""
    assert _one_label_each(["LABEL a=1 b=2.36", "ENV X=1"]) == [
        "LABEL a=1", "LABEL b=2.36", "ENV X=1"]


@pytest.mark.docker
@pytest.mark.slow
def test_podman_builds_repairs_and_verifies_a_cell(tmp_path: Path) -> None:
    podman = _podman()
    base = _base_image(podman)
    project = write_tiny_extension(tmp_path / "tinyext")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text()
                         + '\n[tool.cibuildwheel]\ncontainer-engine = "podman"\n')
    # DOCKER_HOST empty: the engine comes from container-engine, not from the caller.
    r = run_build(tmp_path, "--backend", "docker", "--base-image", base, "--arch", "X86",
                  "--python", "3.11", "--wheelhouse", str(wheelhouse_cp311()),
                  "--project", str(project), DOCKER_HOST="")
    assert r.rc == 0, r.err[-4000:]
    assert f"note: engine podman (tool.cibuildwheel.container-engine in {pyproject})" in r.err
    assert f"backend for {CELL}: docker -- docker asked for (command line --backend): " \
           f"engine {podman.base_url} (server {podman.server_version})" in r.err, r.err[:3000]
    dist = tmp_path / "dist"
    (wheel,) = dist.glob("*.whl")
    # Built, repaired (auditwheel's tag, torch's libraries not bundled) and published.
    assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_"), wheel.name
    assert wheel.name.endswith("_x86_64.whl"), wheel.name
    (entry,) = manifest(dist)["wheels"]
    assert entry["cell"] == CELL and entry["file"] == wheel.name
    assert entry["extra"]["backend"] == "docker" and entry["extra"]["modules"] == ["tinyext._C"]
    assert entry["extra"]["platform"]["tag"] == entry["extra"]["tag"]
    assert not hidden_leftovers(dist)
    # Verified: the smoke test imported the module in a fresh venv in the container.
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "smoke: imported ['tinyext._C']" in log
    # The cell's image layers are podman's, and its container is gone.
    assert podman.image_id(entry["extra"]["torch_image"]), entry["extra"]["torch_image"]
    assert not podman.leftover_containers(), "the build left a container behind"
