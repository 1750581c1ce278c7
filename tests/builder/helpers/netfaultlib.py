"""Networks that lie, as small real servers on loopback.

* :func:`faulty_proxy` -- an HTTP forward proxy (absolute-URI requests, one request per
  connection) that resets every Nth connection with a TCP RST, or (``stall=True``) accepts
  every connection and never answers;
* :func:`lying_index` -- a PEP 503 index whose page names a wheel's sha256 while the file it
  serves under that name has other bytes (a mirror or caching proxy that went wrong).

The index itself is tests/builder/helpers/proxylib.py's (``write_index`` / ``serve_index``).
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers.indexlib import make_wheel
from helpers.proxylib import Index, serve_index, write_index


@dataclass
class ProxyRecord:
    url: str
    connections: int = 0
    resets: int = 0
    stalled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _reset(sock: socket.socket) -> None:
    # SO_LINGER on with a zero timeout: close() sends RST, what a proxy that drops a
    # connection mid-flight looks like to the client ("Connection reset by peer").
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _forward(client: socket.socket) -> None:
    """One request: ``GET http://host:port/path`` -> origin form, ``Connection: close``, the
    answer relayed until the origin closes."""
    head, _, body = _read_head(client).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    rest = target.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    headers = [
        h
        for h in lines[1:]
        if h and not h.lower().startswith(("connection:", "proxy-connection:", "keep-alive:"))
    ]
    request = "\r\n".join([f"{method} /{path} {version}", *headers, "Connection: close", "", ""])
    with socket.create_connection((host, int(port or 80)), timeout=30) as upstream:
        upstream.sendall(request.encode("latin-1") + body)
        while chunk := upstream.recv(65536):
            client.sendall(chunk)


@contextlib.contextmanager
def faulty_proxy(*, reset_every: int = 0, stall: bool = False) -> Iterator[ProxyRecord]:
    """A proxy on 127.0.0.1:<free port>: connection number k (from 1) is reset when
    ``k % reset_every == 0``; with *stall* every connection is held open, unanswered, until
    the proxy stops. Counts in the yielded record."""
    stop = threading.Event()
    record = ProxyRecord(url="")

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with record.lock:
                record.connections += 1
                number = record.connections
            if stall:
                with record.lock:
                    record.stalled += 1
                stop.wait()
                return
            if reset_every and number % reset_every == 0:
                with record.lock:
                    record.resets += 1
                _reset(self.request)
                return
            _forward(self.request)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    record.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="faulty-proxy", daemon=True)
    thread.start()
    try:
        yield record
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass(frozen=True)
class LyingIndex:
    index: Index
    wheel_name: str
    listed_sha256: str  # what the page says
    served: Path  # the file with other bytes


@contextlib.contextmanager
def lying_index(folder: Path, name: str = "liar", version: str = "1.0") -> Iterator[LyingIndex]:
    """An index serving *name*'s wheel under its real name and sha256 fragment, with bytes
    that are not that wheel's (another build of the same name and version)."""
    honest = make_wheel(folder / "wheelhouse", name, version)
    root = write_index(folder / "wheelhouse", folder / "index")
    page = (root / "simple" / name / "index.html").read_text()
    listed = page.split("#sha256=", 1)[1][:64]
    served = root / "simple" / name / honest.name
    served.unlink()  # a hard link to the honest wheel: replace it, do not write through it
    other = make_wheel(folder / "other", name, version, requires_python=">=3")
    served.write_bytes(other.read_bytes())
    with serve_index(root) as index:
        yield LyingIndex(index, honest.name, listed, served)
