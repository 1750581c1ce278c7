"""Podman as the engine: its Docker-API socket found, or started, for :class:`DockerEngine`.

Podman answers the Docker API on a socket of its own (``podman system service``); the rest of
the builder talks to it through :mod:`builder.engines.docker` unchanged, with the differences
handled there (``is_podman``). Selecting podman (cibuildwheel's ``container-engine =
"podman"``) means: ``DOCKER_HOST`` when the caller set it (their socket, their choice), else
the socket of this user's podman (rootful ``/run/podman/podman.sock``, rootless
``$XDG_RUNTIME_DIR/podman/podman.sock``), started with ``podman system service --time=0``
when nothing answers there yet. The service is left running afterwards, as a started dockerd
would be: the next build finds it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from builder.errors import ConfigError, EngineUnavailable

#: How long a service we start may take to answer (it answers in well under a second here).
START_TIMEOUT_S = 15.0


def socket_path(uid: Optional[int] = None, runtime_dir: Optional[str] = None) -> Path:
    """Where podman's API socket lives for *uid* (this process's by default)."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return Path("/run/podman/podman.sock")
    base = runtime_dir or os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    return Path(base) / "podman" / "podman.sock"


def service_command(path: Path) -> str:
    """The command that serves podman's API on *path* (shown when we cannot run it)."""
    return f"podman system service --time=0 unix://{path} &"


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the unix socket *path*."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def podman_url(
    *, file: str = "", key: str = "container-engine", env: Optional[dict[str, str]] = None
) -> tuple[str, str]:
    """(the Docker-API URL to build with, how it was found) for podman.

    ConfigError (exit 2) naming *key* when podman is not installed; EngineUnavailable with the
    exact command when its service cannot be started."""
    env = dict(os.environ) if env is None else env
    if env.get("DOCKER_HOST"):
        return env["DOCKER_HOST"], "DOCKER_HOST"
    binary = shutil.which("podman", path=env.get("PATH"))
    if binary is None:
        raise ConfigError(
            "is 'podman', but podman is not installed here (no podman on PATH): "
            "install it (Debian: apt-get install podman) or set "
            "container-engine = 'docker'",
            file=file or None,
            key=key,
        )
    path = socket_path()
    url = f"unix://{path}"
    if _answers(path):
        return url, f"podman's socket {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.parent / "ampforge-podman-service.log"
    try:
        with open(log, "ab") as out:
            # Its own session: the service outlives this build (and a Ctrl-C of it), as a
            # started dockerd does, and the next build finds it answering.
            # In /, not the caller's folder: the conmon it starts for every container takes
            # the service's folder, and once that folder is gone (a temporary checkout, a test's
            # tmp dir) every start fails with "write child: broken pipe" ("[conmon:e] Failed to
            # get working directory" in the log).
            subprocess.Popen(
                [binary, "system", "service", "--time=0", url],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                cwd="/",
            )
    except OSError as exc:
        raise EngineUnavailable(
            f"could not start podman's API service ({exc}); start it "
            f"and try again:\n  {service_command(path)}"
        ) from exc
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _answers(path):
            return url, f"podman's socket {path} (service started now: {service_command(path)})"
        time.sleep(0.2)
    raise EngineUnavailable(
        f"podman's API service did not answer on {path} within "
        f"{START_TIMEOUT_S:.0f}s (its log: {log}); start it and try "
        f"again:\n  {service_command(path)}"
    )
