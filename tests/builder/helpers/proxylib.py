"""Fixtures for the real-proxy tests: a Docker ``--internal`` network, a tinyproxy process with
basic auth on that network's gateway, a PEP 503 index on the host's loopback (plain HTTP or
HTTPS with a certificate from a throwaway CA).

The topology the tests build::

    build container --(internal network, no way out)--> tinyproxy on the gateway IP
        tinyproxy --(host loopback)--> index on 127.0.0.1:<port>

A container's 127.0.0.1 is its own, so the index is reachable from inside only through the
proxy; a build that succeeds has used it. Everything here is started by the fixture on free
ports and stopped afterwards: nothing is started globally.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import textwrap
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.engines.docker import DockerEngine
from helpers.enginelib import missing

PROXY_USER = "ampforge"
#: The password: it must appear nowhere the builder writes (output, logs, image, wheel).
SENTINEL = "S3ntinel-" + uuid.uuid4().hex[:12]


def tinyproxy_binary() -> str:
    """tinyproxy from Debian (``apt-get install tinyproxy``; .ci/run installs it)."""
    found = shutil.which("tinyproxy") or shutil.which("tinyproxy", path="/usr/bin:/usr/sbin")
    if found is None:
        missing("tinyproxy is not installed (apt-get install tinyproxy)", ".ci/run installs it")
    return found


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- network


@dataclass(frozen=True)
class InternalNetwork:
    name: str
    gateway: str  # the host's address on the network's bridge: the proxy listens here


@contextlib.contextmanager
def internal_network(engine: DockerEngine) -> Iterator[InternalNetwork]:
    """A fresh ``docker network create --internal`` network, removed afterwards."""
    name = f"ampforge-proxytest-{uuid.uuid4().hex[:8]}"
    engine.api.create_network(
        name, driver="bridge", internal=True, labels={"org.ampforge.test": "proxy"}
    )
    try:
        config = engine.api.inspect_network(name)["IPAM"]["Config"]
        gateway = next(c["Gateway"] for c in config if c.get("Gateway"))
        yield InternalNetwork(name, gateway)
    finally:
        engine.api.remove_network(name)


# --------------------------------------------------------------------------- proxy


@dataclass
class Proxy:
    host: str
    port: int
    log: Path

    @property
    def url(self) -> str:
        """The proxy URL with credentials, as a user would export it."""
        return f"http://{PROXY_USER}:{SENTINEL}@{self.host}:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def tinyproxy(listen: str, folder: Path, connect_ports: tuple[int, ...]) -> Iterator[Proxy]:
    """tinyproxy in the foreground on *listen*:<free port>, basic auth, CONNECT only to
    *connect_ports*; stopped (and waited for) afterwards."""
    binary = tinyproxy_binary()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port(listen)
    log = folder / "tinyproxy.log"
    conf = folder / "tinyproxy.conf"
    lines = [
        f"Port {port}",
        f"Listen {listen}",
        "Timeout 120",
        f'LogFile "{log}"',
        # Connect level records every request line (GET http://..., CONNECT host:port).
        "LogLevel Connect",
        "MaxClients 50",
        f"BasicAuth {PROXY_USER} {SENTINEL}",
        "DisableViaHeader Yes",
        *(f"ConnectPort {p}" for p in connect_ports),
    ]
    conf.write_text("\n".join(lines) + "\n")
    out = (folder / "tinyproxy.out").open("w")
    proc = subprocess.Popen([binary, "-d", "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(listen, port, proc, folder / "tinyproxy.out")
        yield Proxy(listen, port, log)
    finally:
        stop(proc)
        out.close()


def stop(proc: subprocess.Popen) -> None:
    """End a server a test started: SIGTERM, then SIGKILL if it has not exited in 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_listening(host: str, port: int, proc: subprocess.Popen, output: Path) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tinyproxy exited with {proc.returncode}:\n{output.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"tinyproxy did not listen on {host}:{port}:\n{output.read_text()}")


# --------------------------------------------------------------------------- index


@dataclass(frozen=True)
class Index:
    url: str  # the --index-url, ending in /simple/
    port: int


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the stdlib's name
        pass  # the proxy's log is the record the tests read


def write_index(wheelhouse: Path, out: Path) -> Path:
    """The wheelhouse as PEP 503 pages under ``out/simple/`` (wheels hard-linked next to their
    page, ``#sha256=`` fragments); returns *out*.

    Not builder.release.simple_index: its PEP 658 ``.metadata`` files trip the pip 23.0.1 that
    Python 3.11's ensurepip puts in the build venv ("inconsistent Name: expected
    'typing-extensions', but metadata has 'typing_extensions'", a raw-name comparison that
    pip 23.1 fixed). Plain pages make pip read each wheel's metadata itself.
    """
    simple = out / "simple"
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(wheelhouse.glob("*.whl")):
        projects.setdefault(canonicalize_name(wheel.name.split("-")[0]), []).append(wheel)
    for project, wheels in projects.items():
        folder = simple / project
        folder.mkdir(parents=True)
        anchors = []
        for wheel in wheels:
            try:
                os.link(wheel, folder / wheel.name)
            except OSError:  # another file system
                shutil.copyfile(wheel, folder / wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            href = urllib.parse.quote(wheel.name)
            anchors.append(f'<a href="{href}#sha256={digest}">{html.escape(wheel.name)}</a>')
        (folder / "index.html").write_text(_page(f"Links for {project}", anchors))
    (simple / "index.html").write_text(
        _page("Simple index", (f'<a href="{p}/">{p}</a>' for p in projects))
    )
    return out


def _page(title: str, anchors: Iterable[str]) -> str:
    body = "\n".join(f"    {a}<br>" for a in anchors)
    return (
        f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head>\n"
        f"  <body>\n{body}\n  </body>\n</html>\n"
    )


@contextlib.contextmanager
def serve_index(root: Path, tls: tuple[Path, Path] | None = None) -> Iterator[Index]:
    """Serve *root* (holding ``simple/``) on 127.0.0.1:<free port>; *tls* = (cert, key)
    serves HTTPS. Stopped afterwards."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name=f"index-{port}", daemon=True)
    thread.start()
    try:
        yield Index(f"{scheme}://127.0.0.1:{port}/simple/", port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --------------------------------------------------------------------------- throwaway CA


@dataclass(frozen=True)
class ThrowawayCA:
    ca_pem: Path  # what --ca-bundle gets
    server_cert: Path  # for 127.0.0.1, signed by the CA
    server_key: Path


def make_ca(folder: Path) -> ThrowawayCA:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (openssl CLI)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ampforge throwaway test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (folder / "server.ext").write_text(
        textwrap.dedent("""\
        subjectAltName = IP:127.0.0.1, DNS:localhost
        basicConstraints = CA:FALSE
        keyUsage = critical, digitalSignature, keyEncipherment
        extendedKeyUsage = serverAuth
        authorityKeyIdentifier = keyid
        subjectKeyIdentifier = hash
        """)
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    )
    return ThrowawayCA(folder / "ca.pem", folder / "server.pem", folder / "server.key")
