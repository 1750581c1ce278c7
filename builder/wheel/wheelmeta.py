"""What a wheel requires on a *target* machine: its METADATA's ``Requires-Dist`` with PEP 508
markers evaluated for the target's Python and machine, not for the host running the builder.

torch's dependencies differ per platform (the x86_64 and aarch64 CUDA builds pull ``nvidia-*``
wheels, the CPU builds do not) and per Python, so an offline bundle, a cross build's target
site-packages and the emulated backend's wheelhouse all need the target's view. pip's own
``--platform``/``--python-version`` do not change how it evaluates markers.
"""

from __future__ import annotations

import email.parser
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from builder.errors import BuilderError, ConfigError


def marker_environment(machine: str, python: str) -> dict[str, str]:
    """PEP 508 marker values of CPython *python* (``"3.11"``) on Linux *machine*."""
    full = python + ".0"
    return {
        "python_version": python,
        "python_full_version": full,
        "implementation_name": "cpython",
        "implementation_version": full,
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def read_metadata(wheel: Path, error: type[BuilderError] = ConfigError) -> bytes:
    """The bytes of *wheel*'s top-level ``.dist-info/METADATA``; *error* (naming the file) when
    it is not a readable zip or does not hold exactly one."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            metas = [
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(metas) != 1:
                raise error(
                    f"{wheel}: expected exactly one <name>-<version>.dist-info/"
                    f"METADATA in the wheel, found {len(metas)}"
                )
            return zf.read(metas[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise error(f"{wheel}: cannot read it as a wheel (zip archive): {exc}") from exc


def requires_dist(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA (read from the zip, not installed)."""
    text = read_metadata(wheel).decode("utf-8", errors="replace")
    return list(
        email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []
    )


def target_requirements(wheel: Path, machine: str, python: str) -> list[str]:
    """*wheel*'s requirements (no extras) whose markers hold on the target, markers removed."""
    env = marker_environment(machine, python)
    wanted: list[str] = []
    for line in requires_dist(wheel):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            wanted.append(str(req))
    return wanted
