"""The two architectures of the matrix and their names in other tools."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

#: Overrides the CPU model QEMU emulates for every arch ("" = QEMU's own default, ``max``).
QEMU_CPU_ENV = "AMPFORGE_QEMU_CPU"


@dataclass(frozen=True)
class Arch:
    name: str  # matrix / Makefile name: X86, ARM
    machine: str  # uname -m, wheel platform suffix: x86_64, aarch64
    docker_platform: str  # OCI platform: linux/amd64, linux/arm64
    # The CPU model QEMU emulates when this arch's wheels run on another host (cross cells'
    # verification, emulated containers); None = QEMU's default. Why not QEMU's default for ARM:
    # its ``max`` CPU advertises every extension QEMU knows (BF16, SVE2, SME, ...), a CPU no
    # server has, and torch 2.1's aarch64 oneDNN then picks bfloat16 matmul kernels it cannot
    # create ("could not create a primitive descriptor for a matmul primitive"), so a wheel
    # would fail verification for a reason no user's machine has. Neoverse N1 is the Armv8.2
    # class of the aarch64 servers Ascend NPUs sit in (Kunpeng 920: fp16 and dot-product
    # instructions, no SVE, no BF16), so the emulated run is the one those hosts make.
    emulated_cpu: Optional[str] = None


ARCHES: dict[str, Arch] = {
    "X86": Arch("X86", "x86_64", "linux/amd64"),
    "ARM": Arch("ARM", "aarch64", "linux/arm64", emulated_cpu="neoverse-n1"),
}


def emulated_cpu(machine: str) -> Optional[str]:
    """The ``-cpu`` model (``QEMU_CPU``) for emulating ``machine`` (``uname -m`` name): the
    arch's own, unless ``AMPFORGE_QEMU_CPU`` names another (empty: QEMU's default)."""
    if QEMU_CPU_ENV in os.environ:
        return os.environ[QEMU_CPU_ENV].strip() or None
    arch = next((a for a in ARCHES.values() if a.machine == machine), None)
    return arch.emulated_cpu if arch else None


# Accepted spellings on the command line / environment, so ARCH=x86_64 or ARCH=arm64 work.
ALIASES: dict[str, str] = {
    "x86": "X86",
    "x86_64": "X86",
    "amd64": "X86",
    "arm": "ARM",
    "aarch64": "ARM",
    "arm64": "ARM",
}


def arch_name(value: str) -> str:
    """Canonical arch name for *value*; ValueError naming the choices otherwise."""
    if value in ARCHES:
        return value
    canon = ALIASES.get(value.lower())
    if canon is None:
        raise ValueError(f"unknown arch {value!r}; expected one of {', '.join(ARCHES)}")
    return canon
