"""The two architectures of the matrix and their names in other tools."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str  # matrix / Makefile name: X86, ARM
    machine: str  # uname -m, wheel platform suffix: x86_64, aarch64
    docker_platform: str  # OCI platform: linux/amd64, linux/arm64


ARCHES: dict[str, Arch] = {
    "X86": Arch("X86", "x86_64", "linux/amd64"),
    "ARM": Arch("ARM", "aarch64", "linux/arm64"),
}

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
