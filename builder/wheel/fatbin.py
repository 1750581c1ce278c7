"""A reader of the CUDA fat binary container: which device code a compiled file carries.

nvcc embeds a module's device code in the ELF section ``.nv_fatbin``; a linked ``.so`` holds one
container per CUDA object file, one after another (each 8-byte aligned). Verification reads it
without a GPU or NVIDIA's cuobjdump: a wheel must carry SASS (``sm_XY`` machine code) for exactly
the capabilities of its arch list, and PTX for those asked ``+PTX``.

The layout (little-endian), as nvcc 13.0's output has it (cross-checked against its
``cuobjdump --list-elf/--list-ptx`` in tests/builder/e2e/test_cuda_fatbin.py)::

    container header, 16 bytes:  u32 magic 0xBA55ED50 | u16 version (1) | u16 header size (16)
                                 | u64 size of the entries that follow
    entry header (its size says how long, 64 or more bytes):
                                 u16 kind (1 PTX, 2 ELF/SASS) | u16 version | u32 header size
                                 | u64 payload size | u32 compressed size | u32 options offset
                                 | u16 minor | u16 major | u32 arch (75 = sm_75) | ...
                                 the payload follows the header; the next entry follows it

The payload itself (possibly compressed) is never needed: kind and arch are in the header.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from builder.deps import require

MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
KIND_PTX = 1
KIND_ELF = 2
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHI")


class FatbinError(ValueError):
    """The bytes are not a fat binary container as documented above."""


@dataclass(frozen=True)
class FatbinEntry:
    kind: str  # "sass" | "ptx" | "kind<N>" for another kind
    arch: int  # 75 for sm_75 / compute_75

    def __str__(self) -> str:
        return f"sm_{self.arch}" if self.kind == "sass" else f"{self.kind} compute_{self.arch}"


def parse_containers(data: bytes) -> list[FatbinEntry]:
    """Every entry of the containers in *data* (a ``.nv_fatbin`` section's bytes)."""
    entries: list[FatbinEntry] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < _CONTAINER.size:
            if data[offset:].strip(b"\0"):
                raise FatbinError(f"{len(data) - offset} stray bytes at offset {offset}")
            break
        magic, _version, header, size = _CONTAINER.unpack_from(data, offset)
        if magic == 0 and not data[offset : offset + 8].strip(b"\0"):
            offset += 8  # alignment padding between containers
            continue
        if magic != MAGIC:
            raise FatbinError(f"no fat binary magic at offset {offset} (found {magic:#x})")
        start, end = offset + header, offset + header + size
        if end > len(data):
            raise FatbinError(
                f"the container at {offset} claims {size} bytes; {len(data) - start} are there"
            )
        entries += _entries(data, start, end)
        offset = (end + 7) & ~7
    return entries


def _entries(data: bytes, start: int, end: int) -> Iterable[FatbinEntry]:
    offset = start
    while offset < end:
        if end - offset < _ENTRY.size:
            raise FatbinError(f"a truncated entry header at offset {offset}")
        kind, _version, header, size, _compressed, _options, _minor, _major, arch = (
            _ENTRY.unpack_from(data, offset)
        )
        if header < _ENTRY.size or offset + header + size > end:
            raise FatbinError(f"an entry at offset {offset} does not fit its container")
        name = {KIND_PTX: "ptx", KIND_ELF: "sass"}.get(kind, f"kind{kind}")
        yield FatbinEntry(kind=name, arch=arch)
        offset += header + size


def elf_fatbin(elf_bytes: bytes) -> bytes | None:
    """The ``.nv_fatbin`` section of an ELF file (None: it carries no device code)."""
    elffile = require("elftools.elf.elffile", "pyelftools", "reading a module's device code")
    elf = elffile.ELFFile(io.BytesIO(elf_bytes))
    section = elf.get_section_by_name(SECTION)
    return None if section is None else section.data()


@dataclass(frozen=True)
class DeviceCode:
    sass: tuple[int, ...]  # sorted capabilities with machine code: (80, 90)
    ptx: tuple[int, ...]  # sorted capabilities with PTX

    @classmethod
    def of(cls, entries: Iterable[FatbinEntry]) -> DeviceCode:
        entries = list(entries)
        return cls(
            sass=tuple(sorted({e.arch for e in entries if e.kind == "sass"})),
            ptx=tuple(sorted({e.arch for e in entries if e.kind == "ptx"})),
        )

    def describe(self) -> str:
        parts = [f"sm_{a}" for a in self.sass] + [f"compute_{a} (PTX)" for a in self.ptx]
        return ", ".join(parts) or "nothing"


def device_code(elf_bytes: bytes) -> DeviceCode | None:
    """What device code an ELF file carries (None: no ``.nv_fatbin`` section)."""
    section = elf_fatbin(elf_bytes)
    return None if section is None else DeviceCode.of(parse_containers(section))
