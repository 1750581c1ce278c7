"""Which builder process made a container, and whether that process is gone.

Every container the builder creates carries its owner: the process id and that process's start
time (so a reused pid is not mistaken for the owner), the machine's id and its boot id. A builder
killed by SIGKILL or a power loss cannot remove its container (which runs ``sleep infinity``);
the next build, or ``python -m builder clean``, removes containers whose owner is gone. A
container made on another machine (a shared remote engine) or by a live process, this one or a
concurrent builder, is never touched: only this machine can tell whether its processes live.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

#: Every container the engine module creates carries this label
#: (``docker ps -a --filter label=org.ampforge.builder``).
CONTAINER_LABEL = "org.ampforge.builder"
PID_LABEL = f"{CONTAINER_LABEL}.pid"
PID_START_LABEL = f"{CONTAINER_LABEL}.pid-start"
HOST_LABEL = f"{CONTAINER_LABEL}.host"
BOOT_LABEL = f"{CONTAINER_LABEL}.boot"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def machine_id() -> str:
    """This machine's id (systemd's /etc/machine-id, else the host name)."""
    return _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or socket.gethostname()


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def process_start(pid: int) -> Optional[str]:
    """The start time of *pid* in clock ticks since boot (field 22 of /proc/PID/stat), or None
    when no such process exists."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def owner_labels() -> dict[str, str]:
    """The labels naming this process as a container's owner."""
    pid = os.getpid()
    return {
        PID_LABEL: str(pid),
        PID_START_LABEL: process_start(pid) or "",
        HOST_LABEL: machine_id(),
        BOOT_LABEL: boot_id(),
    }


def owner_gone(labels: Mapping[str, str]) -> Optional[str]:
    """Why the container's owner is gone (it may be removed), or None when the owner may still
    run: alive, on another machine, or not recorded (a container from an older builder)."""
    pid = labels.get(PID_LABEL, "")
    if not pid.isdigit() or labels.get(HOST_LABEL) != machine_id():
        return None
    if labels.get(BOOT_LABEL) and labels.get(BOOT_LABEL) != boot_id():
        return f"builder pid {pid} ran before this machine's last boot"
    start = process_start(int(pid))
    if start is None:
        return f"builder pid {pid} is gone"
    if labels.get(PID_START_LABEL) and start != labels[PID_START_LABEL]:
        return f"builder pid {pid} is gone (the pid now belongs to another process)"
    return None


@dataclass(frozen=True)
class Leftover:
    id: str
    name: str
    labels: Mapping[str, str]
    reason: str  # why its owner is gone, or why it is kept

    @property
    def cell(self) -> str:
        return self.labels.get(f"{CONTAINER_LABEL}.cell", "?")


def leftovers(api: Any) -> tuple[list[Leftover], list[Leftover]]:
    """(containers whose builder is gone, the builder's other containers with why they stay)."""
    gone: list[Leftover] = []
    kept: list[Leftover] = []
    for c in api.containers(all=True, filters={"label": CONTAINER_LABEL}):
        labels = c.get("Labels") or {}
        name = (c.get("Names") or ["?"])[0].lstrip("/")
        why = owner_gone(labels)
        if why is not None:
            gone.append(Leftover(str(c["Id"]), name, labels, why))
            continue
        pid = labels.get(PID_LABEL, "")
        if not pid.isdigit():
            keep = "no owner recorded (made by an older builder): docker rm -f it by hand"
        elif labels.get(HOST_LABEL) != machine_id():
            keep = f"made on another machine ({labels.get(HOST_LABEL, '?')[:12]})"
        else:
            keep = f"its builder (pid {pid}) is running"
        kept.append(Leftover(str(c["Id"]), name, labels, keep))
    return gone, kept


def remove_leftovers(api: Any, found: list[Leftover]) -> list[Leftover]:
    """Remove *found* containers (already gone ones count as removed); returns those removed."""
    removed = []
    for c in found:
        try:
            api.remove_container(c.id, force=True, v=True)
        except Exception as exc:  # the docker SDK's NotFound: removed meanwhile
            if getattr(getattr(exc, "response", None), "status_code", None) != 404:
                raise
        removed.append(c)
    return removed
