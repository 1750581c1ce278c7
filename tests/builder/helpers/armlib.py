"""Helpers for the emulated-ARM tests and the ARM build benchmark (imported by name: pytest puts
this folder on sys.path; benchmarks/build_arm.py imports it by path).

* :func:`wheelhouse_cp311_aarch64` -- the aarch64 CPU torch wheel (2.9.1: the index's aarch64
  2.13.0 is a CUDA build that cannot import without CUDA libraries) and everything a cp311
  build and smoke test install inside an arm64 container, gathered once with pip.
* :func:`busybox_rootfs` -- a tiny arm64 root filesystem (Debian's static busybox), so a test
  can run a real arm64 container in seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from builder.wheel.wheelmeta import target_requirements
from helpers.enginelib import filled_once

ARM_TORCH = "2.9.1"
CACHE = Path(os.environ.get("AMPFORGE_CACHE", Path.home() / ".cache" / "ampforge"))


def wheelhouse_cp311_aarch64(torch: str = ARM_TORCH) -> Path:
    """A folder with torch==*torch* for cp311 manylinux aarch64, its dependencies, setuptools
    and wheel. Filled by pip on first use (pip's own configuration -- find-links, proxy, CA --
    decides where the files come from); a stamp marks it complete."""
    return filled_once(
        CACHE / f"wheelhouse-cp311-aarch64-torch{torch}", lambda dest: _fill_aarch64(dest, torch)
    )


def _fill_aarch64(dest: Path, torch: str) -> None:
    # pip evaluates environment markers against *this* host even with --platform, so a plain
    # `pip download torch` for aarch64 also asks for torch's x86_64-only CUDA packages. Fetch
    # torch alone, evaluate its requirements for an aarch64 Linux cp311, then fetch those.
    _pip_download(dest, [f"torch=={torch}"], deps=False)
    wheel = next(dest.glob(f"torch-{torch}-*.whl"))
    _pip_download(dest, [*aarch64_requirements(wheel), "setuptools", "wheel"], deps=True)
    wheels = list(dest.glob("torch-*.whl"))
    if not wheels or not all(w.name.endswith("_aarch64.whl") for w in wheels):
        raise RuntimeError(f"expected an aarch64 torch wheel in {dest}, got {wheels}")


def _pip_download(dest: Path, requirements: list[str], *, deps: bool) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(dest),
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            # pip does not widen an explicit platform to older manylinux tags: list them.
            "--platform",
            "manylinux_2_28_aarch64",
            "--platform",
            "manylinux_2_17_aarch64",
            "--platform",
            "manylinux2014_aarch64",
            *([] if deps else ["--no-deps"]),
            *requirements,
        ],
        check=True,
    )


def aarch64_requirements(wheel: Path) -> list[str]:
    """*wheel*'s ``Requires-Dist`` entries (no extras) whose markers hold on aarch64 Linux
    CPython 3.11, without their markers."""
    return target_requirements(wheel, "aarch64", "3.11")


def busybox_rootfs(dest: Path) -> Path:
    """Unpack Debian's arm64 ``busybox-static`` into *dest* (``dest/bin/busybox``).

    Needs the arm64 architecture enabled in dpkg (``dpkg --add-architecture arm64``;
    builder/cross/provision.sh does it). The .deb is kept in the cache.
    """
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob("busybox-static_*_arm64.deb"))
    if not found:
        with tempfile.TemporaryDirectory(dir=debs) as tmp:
            subprocess.run(
                ["apt-get", "download", "busybox-static:arm64"],
                cwd=tmp,
                check=True,
                capture_output=True,
            )
            for deb in Path(tmp).glob("*.deb"):
                shutil.move(str(deb), debs / deb.name)
        found = sorted(debs.glob("busybox-static_*_arm64.deb"))
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(dest)], check=True)
    return dest / "bin" / "busybox"
