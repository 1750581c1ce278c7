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
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import docker.errors
import pytest
from helpers.enginelib import missing, wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import CELL, hidden_leftovers, manifest, run_build

from builder.engines import docker as docker_engine
from builder.engines.base import OutputLog
from builder.engines.docker import DockerEngine, _one_label_each
from builder.engines.podman import podman_url, service_command, socket_path
from builder.errors import ConfigError, EngineUnavailable
from builder.images.base_image import BaseImageSpec, build_base_image
from builder.redact import Redactor


def _podman() -> DockerEngine:
    if shutil.which("podman") is None:
        missing("podman is not installed", ".ci/run installs Debian's podman with apt-get")
    url, _how = podman_url(env={"PATH": os.environ.get("PATH", "")})
    try:
        engine = DockerEngine(url)
    except EngineUnavailable as exc:
        missing(
            f"podman's socket does not answer: {exc.message.splitlines()[0]}",
            "the builder starts podman system service itself",
        )
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
        "podman system service --time=0 unix:///run/podman/podman.sock &"
    )


def test_the_service_runs_in_the_root_folder_not_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service outlives the build that starts it, and conmon takes its folder for every
    container: started in a folder removed later (a rehearsal's checkout), every container start
    failed with "write child: broken pipe" ("[conmon:e] Failed to get working directory")."""
    from builder.engines import podman as podman_engine  # noqa: PLC0415

    started: dict[str, object] = {}
    answers = iter([False, True])  # not yet running; answering once started
    monkeypatch.setattr(podman_engine, "socket_path", lambda: tmp_path / "podman.sock")
    monkeypatch.setattr(podman_engine, "_answers", lambda path: next(answers))
    monkeypatch.setattr(podman_engine.shutil, "which", lambda name, path=None: "/bin/podman")
    monkeypatch.setattr(
        podman_engine.subprocess, "Popen", lambda argv, **kw: started.update(kw, argv=argv)
    )
    monkeypatch.chdir(tmp_path)
    url, how = podman_engine.podman_url(env={"PATH": "/bin"})
    assert url == f"unix://{tmp_path / 'podman.sock'}" and "service started now" in how
    assert started["argv"] == ["/bin/podman", "system", "service", "--time=0", url]
    assert started["cwd"] == "/" and started["start_new_session"] is True


def test_the_callers_docker_host_wins_and_no_podman_exits_2(tmp_path: Path) -> None:
    assert podman_url(env={"DOCKER_HOST": "unix:///x.sock"}) == ("unix:///x.sock", "DOCKER_HOST")
    with pytest.raises(ConfigError) as info:
        podman_url(
            file="p/pyproject.toml",
            key="tool.cibuildwheel.container-engine",
            env={"PATH": str(tmp_path)},
        )
    assert info.value.return_code == 2
    assert str(info.value).startswith(
        "p/pyproject.toml: tool.cibuildwheel.container-engine: "
        "is 'podman', but podman is not installed here"
    )


def test_an_import_label_change_is_split_one_pair_each() -> None:
    """Podman 4.3 reads ``LABEL a=1 b=2`` as one label ``a`` of value ``1 b=2``."""
    assert _one_label_each(["LABEL a=1 b=2.36", "ENV X=1"]) == [
        "LABEL a=1",
        "LABEL b=2.36",
        "ENV X=1",
    ]


@pytest.mark.docker
@pytest.mark.slow
def test_podman_builds_repairs_and_verifies_a_cell(tmp_path: Path) -> None:
    podman = _podman()
    base = _base_image(podman)
    project = write_tiny_extension(tmp_path / "tinyext")
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + '\n[tool.cibuildwheel]\ncontainer-engine = "podman"\n'
    )
    # DOCKER_HOST empty: the engine comes from container-engine, not from the caller.
    r = run_build(
        tmp_path,
        "--backend",
        "docker",
        "--base-image",
        base,
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--project",
        str(project),
        DOCKER_HOST="",
    )
    assert r.rc == 0, r.err[-4000:]
    assert f"note: engine podman (tool.cibuildwheel.container-engine in {pyproject})" in r.err
    assert (
        f"backend for {CELL}: docker -- docker asked for (command line --backend): "
        f"engine {podman.base_url} (server {podman.server_version})" in r.err
    ), r.err[:3000]
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


class _StartRaceAPI:
    """The engine-API seam: containers whose first *fail* starts fail as podman 4.3's do under
    load (HTTP 500, "write child: broken pipe"), and execs of gcc whose first *exec_fail* starts
    fail alike; records the containers made and removed and each exec's command."""

    def __init__(self, fail: int, status: int = 500, exec_fail: int = 0) -> None:
        self.fail, self.status, self.exec_fail = fail, status, exec_fail
        self.made: list[str] = []
        self.removed: list[str] = []
        self.execs: list[str] = []  # argv[0] of each exec made, in order

    def create_host_config(self, **kwargs: object) -> dict[str, object]:
        return dict(kwargs)

    def create_container(self, image: str, **kwargs: object) -> dict[str, str]:
        self.made.append(f"c{len(self.made)}")
        return {"Id": self.made[-1]}

    def start(self, cid: str) -> None:
        if len(self.made) <= self.fail:
            raise self.broken_pipe(f"containers/{cid}/start")

    def broken_pipe(self, path: str) -> docker.errors.APIError:
        response = SimpleNamespace(  # what docker-py's APIError reads of a response
            status_code=self.status,
            reason="Internal Server Error",
            url=f"http+docker://localhost/v1.41/{path}",
        )
        return docker.errors.APIError(  # podman 4.3's words, as docker-py shows them
            "Internal Server Error",
            response=response,
            explanation="crun: write child: broken pipe: OCI runtime error",
        )

    def remove_container(self, cid: str, **kwargs: object) -> None:
        self.removed.append(cid)

    def exec_create(self, cid: str, argv: list[str], **kwargs: object) -> dict[str, str]:
        self.execs.append(argv[0])
        return {"Id": f"e{len(self.execs) - 1}"}

    def exec_start(self, exec_id: str, stream: bool) -> Iterator[bytes]:
        if self.execs[-1] == "gcc" and self.execs.count("gcc") <= self.exec_fail:
            raise self.broken_pipe(f"exec/{exec_id}/start")
        return iter((f"{self.execs[-1]} ran\n".encode(),))

    def exec_inspect(self, exec_id: str) -> dict[str, int]:
        return {"ExitCode": 0}


def _engine(api: _StartRaceAPI, *, podman: bool = True) -> DockerEngine:
    engine = DockerEngine.__new__(DockerEngine)  # no socket: the API is the fake
    engine.api, engine.is_podman, engine.redactor = api, podman, Redactor()
    engine.base_url, engine.server_version = "unix:///fake.sock", "4.3.1"
    return engine


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retries' pauses, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(docker_engine.time, "sleep", slept.append)
    return slept


def test_podmans_start_race_is_retried_with_a_new_container(pauses: list[float]) -> None:
    api, lines = _StartRaceAPI(fail=2), []
    with _engine(api).container("img", log=OutputLog(sink=lines.append)) as session:
        assert session.id == "c2"
    assert api.made == ["c0", "c1", "c2"] and api.removed == ["c0", "c1", "c2"]
    notes = [line for line in lines if line.startswith("podman:")]
    assert [line.split(" (")[0] for line in notes] == ["podman: the container did not start"] * 2
    assert notes[-1].endswith("podman's start race, starting a new one (2/5)"), lines
    assert pauses == [0.5, 1.0]


def test_the_start_race_gives_up_after_six_and_docker_never_retries(pauses: list[float]) -> None:
    api = _StartRaceAPI(fail=9)
    with pytest.raises(docker.errors.APIError, match="broken pipe"), _engine(api).container("img"):
        pass
    assert api.made == [f"c{i}" for i in range(6)] and api.removed == api.made
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0]  # 15.5 s for the load behind the race to pass
    for engine_api, podman in (
        (_StartRaceAPI(fail=1), False),
        (_StartRaceAPI(fail=1, status=409), True),
    ):
        engine = _engine(engine_api, podman=podman)
        with pytest.raises(docker.errors.APIError), engine.container("i"):
            pass
        assert engine_api.made == ["c0"] and engine_api.removed == ["c0"]


def test_an_exec_that_loses_the_start_race_runs_again_in_a_new_exec(pauses: list[float]) -> None:
    api, lines = _StartRaceAPI(fail=0, exec_fail=2), []
    with _engine(api).container("img", log=OutputLog(sink=lines.append)) as session:
        result = session.run(["gcc", "--version"])
    assert api.execs == ["mkdir", "gcc", "gcc", "gcc"] and result.exit_code == 0
    notes = [line for line in lines if line.startswith("podman:")]
    assert [line.split(" (")[0] for line in notes] == ["podman: the command gcc did not start"] * 2
    assert notes[-1].endswith("podman's start race, starting it again (2/5)"), lines
    assert lines.count("gcc ran") == 1, lines  # the command's own output, once it started


def test_an_exec_gives_up_after_six_and_docker_or_other_errors_never_retry(
    pauses: list[float],
) -> None:
    api = _StartRaceAPI(fail=0, exec_fail=9)
    with _engine(api).container("img") as session, pytest.raises(
        docker.errors.APIError, match="broken pipe"
    ):
        session.run(["gcc"])
    assert api.execs == ["mkdir"] + ["gcc"] * 6 and pauses == [0.5, 1.0, 2.0, 4.0, 8.0]
    for engine_api, podman in (
        (_StartRaceAPI(fail=0, exec_fail=1), False),
        (_StartRaceAPI(fail=0, exec_fail=1, status=409), True),
    ):
        with _engine(engine_api, podman=podman).container("i") as session, pytest.raises(
            docker.errors.APIError
        ):
            session.run(["gcc"])
        assert engine_api.execs == ["mkdir", "gcc"]


def test_an_engine_error_mid_build_is_reported_as_the_engines_not_as_gone(tmp_path: Path) -> None:
    """An error the engine answers with (HTTP 500 after the retries) is reported with its status
    and words, not as "stopped answering": the engine is there, and restarting it is not the
    fix. The backend is the seam: its build raises what the exec's start raised."""
    from builder.backends import registry  # noqa: PLC0415
    from builder.backends.base import CellJob, Host, PipelineOptions  # noqa: PLC0415
    from builder.config import CliOverrides, load_settings  # noqa: PLC0415
    from builder.pipeline import build_cell  # noqa: PLC0415
    from builder.plan.resolve import resolve  # noqa: PLC0415

    api = _StartRaceAPI(fail=0)
    backends = dict(registry())
    settings = load_settings(CliOverrides(), {})
    (resolved, *_) = resolve(settings, Host(Redactor()), backends, out=tmp_path / "dist").cells

    class EngineFails:
        name = resolved.backend

        def input_key(self, job: object) -> dict[str, object]:
            return {}

        def build(self, job: CellJob) -> NoReturn:
            def torch_step() -> NoReturn:
                raise api.broken_pipe("exec/e1/start")

            job.steps("torch", torch_step)
            raise AssertionError("the step raises")

    backends[resolved.backend] = EngineFails()  # type: ignore[assignment]
    opts = PipelineOptions(
        project=write_tiny_extension(tmp_path / "tinyext"),
        out=tmp_path / "dist",
        work=tmp_path / "work",
    )
    engine = _engine(api)
    result = build_cell(
        resolved, None, settings.config, opts, backends, engine, Redactor(), lambda c, s: None, "r"
    )
    assert result.status == "failed" and result.error is not None
    assert result.error.startswith(
        "the container engine at unix:///fake.sock failed step 'torch' with HTTP 500 ("
    ), result.error
    assert "write child: broken pipe" in result.error and "stopped answering" not in result.error
    assert "APIError" in (tmp_path / "work/logs" / f"{resolved.identifier}.log").read_text()
