"""The host tools a cross build needs: the aarch64 GNU toolchain and QEMU user emulation.

``find_toolchain`` and ``find_qemu`` fail with :class:`CrossToolchainMissing` naming what is absent
and the one command that provisions it, instead of a FileNotFoundError deep in a compile.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from builder.errors import StepFailed

PROVISION_SCRIPT = Path(__file__).with_name("provision.sh")

# Debian cross-toolchain triplet per wheel architecture (the only one supported so far).
TRIPLETS = {"aarch64": "aarch64-linux-gnu"}


class CrossToolchainMissing(StepFailed):
    """A host tool for cross-building or emulating the target is not installed."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is not installed on this host. Provision the aarch64 cross toolchain and "
            f"QEMU with `sudo {PROVISION_SCRIPT}` (Debian/Ubuntu: g++-aarch64-linux-gnu, "
            "libc6-dev-arm64-cross, qemu-user, qemu-user-static, binfmt-support, patchelf)."
        )


@dataclass(frozen=True)
class CrossToolchain:
    """Absolute paths of one target's GNU cross tools."""

    arch: str
    triplet: str
    cc: Path
    cxx: Path
    strip: Path
    # Target C library and libstdc++ as the cross toolchain ships them: the --ldpaths that let
    # auditwheel resolve (and check against the manylinux policy) an aarch64 module's deps.
    lib_dirs: tuple[Path, ...]

    def version(self) -> str:
        out = subprocess.run([str(self.cxx), "-dumpfullversion"], capture_output=True, text=True)
        return out.stdout.strip()


def _which(name: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise CrossToolchainMissing(f"`{name}`")
    return Path(found)


def find_toolchain(arch: str = "aarch64") -> CrossToolchain:
    """Locate the cross compiler for ``arch`` or raise :class:`CrossToolchainMissing`."""
    if arch not in TRIPLETS:
        raise StepFailed(
            f"cross compilation: unsupported target architecture {arch!r}; "
            f"expected one of {sorted(TRIPLETS)}"
        )
    triplet = TRIPLETS[arch]
    cxx = _which(f"{triplet}-g++")
    cc = _which(f"{triplet}-gcc")
    strip = _which(f"{triplet}-strip")
    # Ask the compiler where its target libraries are instead of assuming Debian's layout.
    libc = subprocess.run([str(cxx), "-print-file-name=libc.so.6"], capture_output=True, text=True)
    libstdcxx = subprocess.run(
        [str(cxx), "-print-file-name=libstdc++.so.6"], capture_output=True, text=True
    )
    dirs: list[Path] = []
    for out in (libc.stdout.strip(), libstdcxx.stdout.strip()):
        path = Path(out)
        if path.is_absolute() and path.exists() and path.resolve().parent not in dirs:
            dirs.append(path.resolve().parent)
    if not dirs:
        raise CrossToolchainMissing(f"the {arch} C library (libc.so.6 for {triplet}-g++)")
    return CrossToolchain(arch, triplet, cc, cxx, strip, tuple(dirs))


def find_qemu(arch: str = "aarch64") -> Path:
    """Path of the QEMU user-mode emulator for ``arch`` (``qemu-aarch64``)."""
    for name in (f"qemu-{arch}", f"qemu-{arch}-static"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise CrossToolchainMissing(f"`qemu-{arch}` (QEMU user emulation)")
