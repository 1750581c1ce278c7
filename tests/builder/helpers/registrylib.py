"""A real container registry on loopback for the pull tests (imported by name: pytest puts this
folder on sys.path).

Debian's ``docker-registry`` package (the CNCF distribution registry; ``.ci/run`` installs it)
runs in the foreground with a config of our own: ``127.0.0.1:<free port>``, storage in a temporary
folder, stopped (and waited for) afterwards. Nothing is started globally: the package's own
service is not used. Docker pulls plain HTTP from it because the daemon's default
``insecure-registries`` include 127.0.0.0/8 -- hence ``127.0.0.1``, never ``localhost`` names
that might resolve elsewhere.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.engines.docker import DockerEngine
from helpers.enginelib import missing
from helpers.proxylib import free_port, stop


def registry_binary() -> str:
    found = shutil.which("docker-registry") or shutil.which(
        "docker-registry", path="/usr/bin:/usr/sbin"
    )
    if found is None:
        missing(
            "docker-registry is not installed (apt-get install docker-registry)",
            ".ci/run installs it",
        )
    return found


@dataclass(frozen=True)
class Registry:
    host: str  # "127.0.0.1:<port>": the registry part of an image reference
    log: Path

    def ref(self, name: str) -> str:
        return f"{self.host}/{name}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def local_registry(folder: Path) -> Iterator[Registry]:
    """``docker-registry serve`` on 127.0.0.1:<free port>, storage under *folder*."""
    binary = registry_binary()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port("127.0.0.1")
    conf = folder / "registry.yml"
    conf.write_text(
        "version: 0.1\n"
        "log:\n  level: info\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'storage'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = folder / "registry.log"
    out = log.open("w")
    proc = subprocess.Popen([binary, "serve", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_answering(f"http://127.0.0.1:{port}/v2/", proc, log)
        yield Registry(f"127.0.0.1:{port}", log)
    finally:
        stop(proc)
        out.close()


def _wait_answering(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    # The registry is on loopback: no proxy of the caller's may stand in between.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"docker-registry exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        with contextlib.suppress(OSError, urllib.error.URLError):
            with opener.open(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.2)
    raise RuntimeError(f"docker-registry did not answer {url}:\n{log.read_text(errors='replace')}")


def push(engine: DockerEngine, source: str, target: str) -> str:
    """Tag *source* as *target* and push it; the tag is removed again afterwards (the image
    stays under *source*), so the engine lacks *target* as a user's engine would. Returns the
    manifest digest the registry stored (what a pin names)."""
    repository, _, tag = target.rpartition(":")
    engine.api.tag(source, repository, tag)
    digest = ""
    try:
        for event in engine.api.push(repository, tag, stream=True, decode=True):
            if "error" in event:
                raise RuntimeError(f"push of {target} failed: {event['error']}")
            digest = (event.get("aux") or {}).get("Digest") or digest
    finally:
        engine.api.remove_image(target)  # untags only: *source* still names the image
    if not digest:
        raise RuntimeError(f"push of {target}: the engine reported no digest")
    return str(digest)
