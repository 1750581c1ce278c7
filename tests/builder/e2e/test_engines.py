"""Engines against the real thing: dockerd (started by .ci/run) and this host.

Containers must be removed on every exit path; streamed output must be redacted; an engine that
does not answer must say where it looked and how to start one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine

from builder.engines.base import OutputLog
from builder.engines.docker import CONTAINER_LABEL, DockerEngine
from builder.engines.host import HostEngine, find_python
from builder.errors import EngineUnavailable, StepFailed
from builder.images.base_image import build_base_image
from builder.redact import Redactor

SENTINEL = "s3ntinelPassw0rd"
PROXY = f"http://builder:{SENTINEL}@127.0.0.1:3128"


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal, even when the suite
    was started with SIGINT ignored (a background job without job control): Python installs
    its handler only when SIGINT is at its default at start-up."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return docker_engine()


@pytest.fixture(scope="module")
def base(engine: DockerEngine) -> str:
    return build_base_image(engine).tag


def _exists(engine: DockerEngine, cid: str) -> bool:
    return any(c["Id"] == cid for c in engine.api.containers(all=True))


# -- engine not running --------------------------------------------------------------------
def test_dead_socket_names_it_and_how_to_start(tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/nothing-here.sock"
    with pytest.raises(EngineUnavailable) as err:
        DockerEngine(dead)
    msg = str(err.value)
    assert dead in msg
    assert ".ci/dockerd-up" in msg and "BACKEND=host" in msg and "podman.sock" in msg
    assert err.value.return_code == 1


def test_docker_host_env_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"unix://{tmp_path}/env.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    with pytest.raises(EngineUnavailable, match=r"env\.sock"):
        DockerEngine()


# -- containers ----------------------------------------------------------------------------
@pytest.mark.docker
def test_failing_command_shows_tail_and_container_is_removed(
    engine: DockerEngine, base: str
) -> None:
    seen: dict[str, str] = {}
    with pytest.raises(StepFailed) as err:
        with engine.container(base) as session:
            seen["id"] = session.id
            assert _exists(engine, session.id)
            session.run(
                ["sh", "-c", "echo compiling; echo 'fatal: boom' >&2; exit 3"], step="compile"
            )
    assert "exit code 3" in str(err.value) and "fatal: boom" in str(err.value)
    assert "step 'compile'" in str(err.value)
    assert not _exists(engine, seen["id"])


@pytest.mark.docker
def test_keyboard_interrupt_in_block_removes_container(engine: DockerEngine, base: str) -> None:
    seen: dict[str, str] = {}
    with pytest.raises(KeyboardInterrupt):
        with engine.container(base) as session:
            seen["id"] = session.id
            raise KeyboardInterrupt
    assert not _exists(engine, seen["id"])


@pytest.mark.docker
def test_ctrl_c_during_a_running_step_removes_container(
    engine: DockerEngine, base: str, ctrl_c: object
) -> None:
    """A real SIGINT while a command runs inside (what Ctrl-C in a terminal does)."""
    seen: dict[str, str] = {}
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        with engine.container(base) as session:
            seen["id"] = session.id
            timer.start()
            session.run(["sleep", "60"], step="long compile")
    timer.cancel()
    assert not _exists(engine, seen["id"])
    assert not [c for c in engine.leftover_containers() if c == seen["id"]]


@pytest.mark.docker
def test_exit_codes_env_copy_in_out_and_redacted_stream(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    redactor = Redactor()
    redactor.add_url(PROXY)
    log = OutputLog(redactor=redactor, sink=lines.append, log_file=tmp_path / "cell.log")
    src = tmp_path / "payload"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.txt").write_text("hello from the host\n")
    with engine.container(base, log=log, labels={"org.ampforge.cell": "test"}) as session:
        info = engine.api.inspect_container(session.id)
        assert info["Config"]["Labels"][CONTAINER_LABEL] == "1"
        assert session.run(["sh", "-c", "exit 7"], check=False).exit_code == 7
        res = session.run(
            ["sh", "-c", 'echo "proxy=$P"; echo "py=$(command -v python3)"'], env={"P": PROXY}
        )
        assert res.ok
        inside = session.copy_in(src, session.workdir + "/in")
        session.run(["sh", "-c", f"cat {inside}/sub/data.txt > {session.workdir}/out.txt"])
        back = session.copy_out(session.workdir + "/out.txt", tmp_path / "back")
    assert back.read_text() == "hello from the host\n"
    assert "proxy=http://builder:***@127.0.0.1:3128" in lines
    assert not any(SENTINEL in line for line in lines)
    assert SENTINEL not in (tmp_path / "cell.log").read_text()
    assert "py=/usr/bin/python3" in lines


@pytest.mark.docker
def test_build_image_proxy_reaches_run_but_not_history(
    engine: DockerEngine, base: str, tmp_path: Path
) -> None:
    """Proxies go in as build args: a RUN step sees them, the image keeps no trace."""
    lines: list[str] = []
    redactor = Redactor()
    redactor.add_url(PROXY)
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "hello.txt").write_text("context file\n")
    dockerfile = (
        f"FROM {base}\n"
        "COPY hello.txt /hello.txt\n"
        # No ARG line: Docker's predefined proxy args reach RUN without entering history.
        'RUN echo "build sees proxy: $HTTP_PROXY" && cat /hello.txt\n'
    )
    tag = "ampforge/test-proxy-build:latest"
    try:
        image = engine.build_image(
            dockerfile,
            tag,
            context=tmp_path / "ctx",
            build_args={"HTTP_PROXY": PROXY, "http_proxy": PROXY},
            log=OutputLog(redactor=redactor, sink=lines.append),
            nocache=True,
        )
        text = "\n".join(lines)
        assert "build sees proxy: http://builder:***@127.0.0.1:3128" in text
        assert "context file" in text
        assert SENTINEL not in text
        history = str(engine.api.history(image))
        config = str(engine.api.inspect_image(image))
        assert SENTINEL not in history and SENTINEL not in config
        assert "127.0.0.1:3128" not in config
    finally:
        engine.remove_image(tag)


@pytest.mark.docker
def test_build_error_is_a_step_failure_with_tail(engine: DockerEngine, base: str) -> None:
    with pytest.raises(StepFailed) as err:
        engine.build_image(
            f"FROM {base}\nRUN echo about-to-fail && false\n", "ampforge/test-broken:latest"
        )
    assert "about-to-fail" in str(err.value)
    assert "returned a non-zero code" in str(err.value)


# -- host backend ---------------------------------------------------------------------------
def test_host_session_runs_streams_and_cleans_up(tmp_path: Path) -> None:
    lines: list[str] = []
    log = OutputLog(redactor=Redactor([SENTINEL]), sink=lines.append)
    with pytest.raises(StepFailed) as err:
        with HostEngine().session(log=log, parent=tmp_path) as session:
            workdir = Path(session.workdir)
            copied = session.copy_in(Path(__file__), session.workdir + "/src")
            assert Path(copied).read_text() == Path(__file__).read_text()
            session.run(["sh", "-c", f"echo secret={SENTINEL}; exit 4"], step="probe")
    assert "exit code 4" in str(err.value)
    assert "secret=***" in lines
    assert not workdir.exists()


def test_host_session_steps_do_not_inherit_the_callers_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builder run from a checkout (PYTHONPATH=<checkout>) must not hand that path to the
    cell's interpreters: verification would import the checkout's package, not the wheel's. A
    step that sets PYTHONPATH itself (the cross build does) keeps its own."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "checkout"))
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "home"))
    lines: list[str] = []
    log = OutputLog(sink=lines.append)
    probe = 'echo "path=${PYTHONPATH-unset} home=${PYTHONHOME-unset}"'
    with HostEngine().session(log=log, parent=tmp_path) as session:
        session.run(["sh", "-c", probe], step="probe")
        session.run(["sh", "-c", probe], env={"PYTHONPATH": "/own"}, step="own")
    assert "path=unset home=unset" in lines and "path=/own home=unset" in lines, lines


def test_find_python_skips_a_broken_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyenv puts shims for every version on PATH; one for an unselected version fails."""

    version = "{}.{}".format(*sys.version_info[:2])
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / f"python{version}"
    shim.write_text("#!/bin/sh\necho 'pyenv: command not found' >&2; exit 127\n")
    shim.chmod(0o755)
    real = tmp_path / "pyenv" / "versions" / f"{version}.99" / "bin" / f"python{version}"
    real.parent.mkdir(parents=True)
    real.symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    assert find_python(version) == real
    with pytest.raises(StepFailed, match=r"no working Python 3\.1 interpreter"):
        find_python("3.1")


def test_ctrl_c_on_host_kills_the_whole_step_tree(tmp_path: Path, ctrl_c: object) -> None:
    pidfile = tmp_path / "grandchild.pid"
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        with HostEngine().session(parent=tmp_path) as session:
            timer.start()
            session.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], step="compile")
    timer.cancel()
    grandchild = int(pidfile.read_text())

    def alive() -> bool:
        try:  # a killed, not yet reaped process is a zombie ("Z"): dead for our purpose
            return Path(f"/proc/{grandchild}/stat").read_text().split()[2] != "Z"
        except FileNotFoundError:
            return False

    for _ in range(50):
        if not alive():
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail(f"the step's child process {grandchild} survived Ctrl-C")
