"""What a wheel ships compiled, as verification must exercise it: the Python extension modules
(imported, top-level ones such as ``apex_C.cpython-311-x86_64-linux-gnu.so`` included) and the
other shared objects (loaded), read from the ELF files themselves rather than guessed from names.

A ``.so`` is an extension module when it exports ``PyInit_<name>`` -- what CPython's loader looks
up, so exactly the files ``import`` can load. Others are libraries a package loads itself (the
torch op libraries of torch-scatter & co., loaded with ``torch.ops.load_library``, export none):
verification loads them after ``import torch``, so a missing dependency still fails the cell.
Libraries grafted by auditwheel (``<pkg>.libs/``) are dependencies, loaded by the files above.
"""

from __future__ import annotations

import io
import posixpath
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from builder.deps import require

#: A wheel's ``<dist>-<version>.data/{platlib,purelib}/`` folders install into site-packages.
_DATA_LIB = re.compile(r"^[^/]+\.data/(?:platlib|purelib)/")


@dataclass(frozen=True)
class CompiledFiles:
    #: Dotted names of the extension modules, e.g. ``amp._C``, ``apex_C``.
    modules: tuple[str, ...]
    #: Site-packages-relative paths of the other shared objects (``pkg/_ops_cpu.so``).
    libraries: tuple[str, ...]


def installed_path(member: str) -> str | None:
    """Where wheel member *member* lands relative to site-packages (None: metadata, scripts
    or headers, which never hold an importable file)."""
    top = member.split("/", 1)[0]
    if top.endswith(".dist-info"):
        return None
    if top.endswith(".data"):
        found = _DATA_LIB.match(member)
        return member[found.end() :] if found else None
    return member


def exports_init(data: bytes, name: str) -> bool:
    """Whether the ELF file *data* defines the dynamic symbol ``PyInit_<name>``."""
    elffile = require("elftools.elf.elffile", "pyelftools", "reading a wheel's modules")
    elf = elffile.ELFFile(io.BytesIO(data))
    dynsym = elf.get_section_by_name(".dynsym")
    if dynsym is None:
        return False
    for sym in dynsym.get_symbol_by_name("PyInit_" + name) or ():
        if sym["st_shndx"] != "SHN_UNDEF":
            return True
    return False


def compiled_files(wheel: Path) -> CompiledFiles:
    """The extension modules and other shared objects *wheel* installs (see the module doc)."""
    modules: list[str] = []
    libraries: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            path = installed_path(member)
            if path is None or not path.endswith(".so"):
                continue
            folder, base = posixpath.split(path)
            if folder.split("/", 1)[0].endswith(".libs"):
                continue  # grafted by auditwheel: loaded as the others' dependency
            stem = base.split(".", 1)[0]
            if exports_init(zf.read(member), stem):
                modules.append(".".join([*filter(None, folder.split("/")), stem]))
            else:
                libraries.append(path)
    return CompiledFiles(modules=tuple(sorted(set(modules))), libraries=tuple(sorted(libraries)))
