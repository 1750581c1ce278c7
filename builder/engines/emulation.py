"""Can this host run another architecture's containers? (QEMU user emulation via binfmt_misc)

The ``emulated`` backend and ``base-image --arch ARM`` on an x86_64 host run aarch64 programs
as if they were native: the kernel hands every aarch64 ELF to ``qemu-aarch64`` through a
``binfmt_misc`` entry. Inside a container the interpreter path of that entry usually does not
exist, so the entry must carry the ``F`` (fix-binary) flag: the kernel then opens the
interpreter once, at registration, and uses that file in every mount namespace.

:func:`detect_emulation` reads ``/proc/sys/fs/binfmt_misc`` (or a given folder, for tests) and
says yes or no with the reason; :func:`require_emulation` turns a no into an error that says
how to enable it. Nothing here changes the host.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.errors import StepFailed

BINFMT_ROOT = Path("/proc/sys/fs/binfmt_misc")
#: Another folder to read instead (tests point it at a fake, "unavailable" one).
BINFMT_ROOT_ENV = "AMPFORGE_BINFMT_ROOT"
PROVISION_SCRIPT = Path(__file__).resolve().parent.parent / "cross" / "provision.sh"

#: The first 20 bytes of a little-endian 64-bit executable for each machine (ELF ident,
#: e_type=EXEC, e_machine): what a binfmt_misc magic/mask pair is matched against.
_ELF_HEADERS: dict[str, bytes] = {
    "aarch64": bytes.fromhex("7f454c460201010000000000000000000200b700"),
    "x86_64": bytes.fromhex("7f454c4602010100000000000000000002003e00"),
}


class EmulationUnavailable(StepFailed):
    """This host cannot run the other architecture's binaries in containers. Exit code 1."""


@dataclass(frozen=True)
class Emulation:
    machine: str  # the target, e.g. aarch64
    available: bool
    reason: str  # what was found, or what is missing
    entry: Optional[str] = None  # binfmt_misc entry name, e.g. qemu-aarch64
    interpreter: Optional[str] = None
    flags: str = ""


@dataclass(frozen=True)
class _Entry:
    name: str
    enabled: bool
    interpreter: str
    flags: str
    offset: int
    magic: bytes
    mask: bytes

    def matches(self, header: bytes) -> bool:
        window = header[self.offset : self.offset + len(self.magic)]
        if len(window) < len(self.magic):
            return False
        mask = self.mask or b"\xff" * len(self.magic)
        return all((h & m) == (g & m) for h, g, m in zip(window, self.magic, mask))


def _read_entry(path: Path) -> Optional[_Entry]:
    """Parse one ``binfmt_misc`` entry file; None for extension (``E``) entries or garbage."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    fields: dict[str, str] = {}
    enabled = False
    for line in lines:
        if line.strip() == "enabled":
            enabled = True
        elif " " in line:
            key, value = line.split(" ", 1)
            fields[key.rstrip(":")] = value.strip()
    if "magic" not in fields:
        return None
    try:
        return _Entry(
            path.name,
            enabled,
            fields.get("interpreter", ""),
            fields.get("flags", ""),
            int(fields.get("offset", "0")),
            bytes.fromhex(fields["magic"]),
            bytes.fromhex(fields.get("mask", "")),
        )
    except ValueError:
        return None


def how_to_enable(machine: str = "aarch64") -> str:
    return (
        f"to enable it: `sudo {PROVISION_SCRIPT}` (installs qemu-user-static and "
        "binfmt-support and registers the interpreters), or by hand as root: `mount -t "
        "binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc` and register "
        f"qemu-{machine} with the F flag (`update-binfmts --enable qemu-{machine}` after "
        "installing qemu-user-static, or a container such as tonistiigi/binfmt where "
        "images can be pulled)"
    )


def binfmt_root() -> Path:
    return Path(os.environ.get(BINFMT_ROOT_ENV) or BINFMT_ROOT)


def detect_emulation(
    machine: str = "aarch64", root: Optional[Path] = None, host: Optional[str] = None
) -> Emulation:
    """Whether *machine* binaries run here, natively or under a binfmt_misc interpreter that
    also works inside containers (flag ``F``). *root*: default :func:`binfmt_root`."""
    root = root or binfmt_root()
    host = host or platform.machine()
    if machine == host:
        return Emulation(machine, True, f"native: this host is {host}")
    header = _ELF_HEADERS.get(machine)
    if header is None:
        return Emulation(
            machine,
            False,
            f"no known ELF header for machine {machine!r}; expected one of {sorted(_ELF_HEADERS)}",
        )
    status = root / "status"
    if not status.is_file():
        return Emulation(machine, False, f"binfmt_misc is not mounted at {root}")
    if status.read_text(errors="replace").strip() != "enabled":
        return Emulation(machine, False, f"binfmt_misc at {root} is disabled ({status})")
    entries = [
        e
        for e in (
            _read_entry(p) for p in sorted(root.iterdir()) if p.name not in ("status", "register")
        )
        if e is not None
    ]
    matching = [e for e in entries if e.matches(header)]
    if not matching:
        return Emulation(
            machine,
            False,
            f"no binfmt_misc entry in {root} runs {machine} "
            "binaries (qemu-" + machine + " is not registered)",
        )
    usable = [e for e in matching if e.enabled]
    if not usable:
        return Emulation(
            machine, False, f"the binfmt_misc entry {matching[0].name} for {machine} is disabled"
        )
    fixed = [e for e in usable if "F" in e.flags]
    if not fixed:
        e = usable[0]
        return Emulation(
            machine,
            False,
            f"the binfmt_misc entry {e.name} runs {machine} binaries with "
            f"{e.interpreter}, but without the F flag (flags {e.flags or 'none'!r})"
            ": inside a container that path does not exist",
            e.name,
            e.interpreter,
            e.flags,
        )
    e = fixed[0]
    return Emulation(
        machine,
        True,
        f"binfmt_misc entry {e.name} (flags {e.flags}) runs "
        f"{machine} binaries with {e.interpreter}",
        e.name,
        e.interpreter,
        e.flags,
    )


def require_emulation(
    machine: str = "aarch64", root: Optional[Path] = None, host: Optional[str] = None
) -> Emulation:
    """:func:`detect_emulation`, raising :class:`EmulationUnavailable` (with how to enable it)
    when the answer is no."""
    found = detect_emulation(machine, root, host)
    if not found.available:
        raise EmulationUnavailable(
            f"{machine} emulation is unavailable on this {host or platform.machine()} host: "
            f"{found.reason}; {how_to_enable(machine)}"
        )
    return found
