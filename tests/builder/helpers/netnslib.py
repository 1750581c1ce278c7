"""A network namespace for builds that must reach the network only through a proxy (issue 11).

The docker proxy test (test_proxy_real.py) cuts a *container* off with a Docker ``--internal``
network. The host and cross backends run pip on this machine, so here the build process itself
is cut off: it runs in a fresh network namespace whose one link is a veth pair to this machine::

    build (netns, address .2 of a private /30) --veth--> tinyproxy on .1 (this machine)
        tinyproxy --(this machine's loopback)--> index on 127.0.0.1:<port>

Inside the namespace 127.0.0.1 is the namespace's own loopback and there is no default route, so
the index is reachable only through the proxy. Everything stays on this machine; the namespace,
its veth pair and any process left in it are removed on exit, also when a test fails.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from helpers.enginelib import missing

#: Where the test's /30 links come from: private addresses (RFC 1918) only this test uses.
POOL = ipaddress.ip_network("10.213.0.0/16")


def require_netns() -> str:
    """The ``ip`` binary (Debian's iproute2) when this process may create namespaces (root).
    Under CI (.ci/run runs as root and installs iproute2) their absence is a failure."""
    found = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin")
    problem = None
    if found is None:
        problem = "the ip command (apt-get install iproute2) is not installed"
    elif os.geteuid() != 0:
        problem = "creating a network namespace needs root"
    if problem is not None:
        missing(problem, ".ci/run provisions both")
    assert found is not None
    return found


@dataclass(frozen=True)
class Netns:
    ip: str  # the ip binary
    name: str
    host_if: str  # this machine's end of the veth pair
    host_addr: str  # this machine's address on the link: the proxy listens here
    inner_addr: str  # the namespace's address

    def argv(self, argv: Sequence[str]) -> list[str]:
        """*argv* run inside the namespace (environment, files and user unchanged)."""
        return [self.ip, "netns", "exec", self.name, *argv]

    def can_connect(self, host: str, port: int) -> bool:
        """Whether a process in the namespace can open a TCP connection to host:port."""
        code = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(({host!r}, {port}), timeout=5).close()\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        return subprocess.run(self.argv([sys.executable, "-c", code]), timeout=60).returncode == 0


def _used_networks(ip: str) -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address or a route in."""
    used = []
    addrs = subprocess.run(
        [ip, "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    for line in addrs.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    routes = subprocess.run(
        [ip, "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=True
    ).stdout
    for line in routes.splitlines():
        dst = line.split()[0] if line.split() else ""
        if dst in ("local", "broadcast", "unreachable", "blackhole", "prohibit"):
            dst = line.split()[1]
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(dst, strict=False))
    return [n for n in used if isinstance(n, ipaddress.IPv4Network)]


def _free_link(ip: str) -> ipaddress.IPv4Network:
    """A /30 of :data:`POOL` that overlaps nothing on this machine. The start is random so that
    two test runs at the same time (other worktrees) are unlikely to pick the same one."""
    used = _used_networks(ip)
    links = list(POOL.subnets(new_prefix=30))
    start = random.randrange(len(links))
    for link in links[start:] + links[:start]:
        if not any(link.overlaps(n) for n in used):
            return link
    raise RuntimeError(f"no free /30 in {POOL} on this machine")


@contextlib.contextmanager
def isolated_netns() -> Iterator[Netns]:
    """A namespace linked to this machine by one veth pair and nothing else; removed after."""
    ip = require_netns()
    tag = uuid.uuid4().hex[:8]
    name, host_if, inner_if = f"ampforge-proxy-{tag}", f"afh{tag}", f"afn{tag}"
    link = _free_link(ip)
    host_addr, inner_addr = (str(a) for a in list(link.hosts())[:2])

    def run(*args: str) -> None:
        subprocess.run([ip, *args], check=True, capture_output=True, timeout=60)

    run("netns", "add", name)
    try:
        run("link", "add", host_if, "type", "veth", "peer", "name", inner_if)
        run("link", "set", inner_if, "netns", name)
        run("addr", "add", f"{host_addr}/{link.prefixlen}", "dev", host_if)
        run("link", "set", host_if, "up")
        run(
            "netns",
            "exec",
            name,
            ip,
            "addr",
            "add",
            f"{inner_addr}/{link.prefixlen}",
            "dev",
            inner_if,
        )
        run("netns", "exec", name, ip, "link", "set", inner_if, "up")
        # Its own loopback up, as on any machine: 127.0.0.1 answers there, but it is not ours.
        run("netns", "exec", name, ip, "link", "set", "lo", "up")
        yield Netns(ip, name, host_if, host_addr, inner_addr)
    finally:
        # Processes still in the namespace are this test's (a build that timed out): end them
        # by id before the namespace goes.
        pids = subprocess.run(
            [ip, "netns", "pids", name], capture_output=True, text=True, timeout=60
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run([ip, "netns", "del", name], capture_output=True, timeout=60)
        # Deleting the namespace deletes its end of the pair, and with it this one; in case the
        # namespace was never populated, remove it by name as well.
        subprocess.run([ip, "link", "del", host_if], capture_output=True, timeout=60)
