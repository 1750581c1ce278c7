"""The builder's own environment in an offline bundle (``DIR/builder-wheels``).

The air-gapped machine has a checkout and the bundle, and nothing else: the builder's pinned
distributions (builder/requirements.lock) travel in the bundle as wheels for the builder's
Python and platform -- the interpreter running ``fetch``, which is the one the other machine
runs the builder with (``make``'s ``PYTHON``). There ``python -m builder.lockfile install
--bundle DIR`` installs them with ``--no-index``. bundle.json lists the files (sha256, like
every other file) and, under ``builder``, which pin each one is.
"""

from __future__ import annotations

import platform
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, TextIO

from packaging.utils import canonicalize_name, parse_wheel_filename

from builder import lockfile
from builder.errors import StepFailed
from builder.netpip import NetworkOptions, run_pip
from builder.offline.bundle import BUILDER_WHEELS_DIR


def download_argv(
    dest: Path, find_links: Sequence[str] = (), pip_args: Sequence[str] = ()
) -> list[str]:
    """``pip download`` of the lock, binary wheels only, for this interpreter and platform."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "--only-binary=:all:",
        "--no-deps",
        "--dest",
        str(dest),
        "-r",
        str(lockfile.LOCK_FILE),
    ]
    for link in find_links:
        argv += ["--find-links", link]
    return [*argv, *pip_args]


def fetch_builder_wheels(
    root: Path,
    env: Mapping[str, str],
    net: NetworkOptions,
    find_links: Sequence[str],
    pip_args: Sequence[str],
    log: TextIO,
    redact: Callable[[str], str],
) -> dict[str, Any]:
    """Download the lock's wheels into ``root/builder-wheels``; the ``builder`` section of
    bundle.json. StepFailed naming the pins pip did not deliver as wheels."""
    dest = root / BUILDER_WHEELS_DIR
    dest.mkdir(parents=True, exist_ok=True)
    # The lock carries every pin's sha256s: pip checks each download against them.
    run_pip(
        download_argv(dest, find_links, pip_args),
        env,
        net,
        log,
        redact,
        f"pip download of the builder's own environment ({lockfile.LOCK_FILE.name})",
    )
    pins = lockfile.read_pins()
    found: dict[str, str] = {}
    for whl in sorted(dest.glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(whl.name)
        if pins.get(str(canonicalize_name(name))) == str(version):
            found[str(canonicalize_name(name))] = whl.name
        else:
            whl.unlink()  # an older pin's wheel from an earlier fetch: not part of this lock
    missing = sorted(f"{n}=={v}" for n, v in pins.items() if n not in found)
    if missing:
        raise StepFailed(
            "pip download did not deliver wheels for the builder's pins "
            f"{', '.join(missing)} (see {log.name})"
        )
    return {
        "python": platform.python_version(),
        "platform": sysconfig.get_platform(),
        "lock_sha256": lockfile.digest(),
        "wheels": [
            {"name": n, "version": pins[n], "file": f"{BUILDER_WHEELS_DIR}/{found[n]}"}
            for n in sorted(found)
        ],
    }
