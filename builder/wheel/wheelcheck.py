"""The wheel's name against its own code: the glibc its ELF files need vs. its manylinux tag.

``auditwheel show`` folds in the symbol versions of every external library it can find on the
build machine -- including the ones the repair deliberately excluded. ``libgomp.so.1`` from
Debian bookworm's gcc needs ``GLIBC_2.34``, so ``show`` reports ``manylinux_2_34`` for a wheel
whose own code needs 2.31 and which ``auditwheel repair --exclude libgomp.so.1`` (correctly)
tags ``manylinux_2_31``: at run time the user's torch provides that library, not our wheel.
This check reads the version requirements of the wheel's own ELF files directly.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

from builder.errors import StepFailed
from builder.wheel.repair import split_wheel_name

_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)")
_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_")


def own_glibc_need(wheel: Path) -> tuple[int, int]:
    """The newest ``GLIBC_x.y`` symbol version any ELF file inside *wheel* needs."""
    need = (2, 0)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not (name.endswith(".so") or ".so." in name):
                continue
            elf = ELFFile(io.BytesIO(zf.read(name)))
            for section in elf.iter_sections():
                if not isinstance(section, GNUVerNeedSection):
                    continue
                for _verneed, auxes in section.iter_versions():
                    for aux in auxes:
                        m = _GLIBC.match(aux.name)
                        if m:
                            need = max(need, (int(m.group(1)), int(m.group(2))))
    return need


def check_tag_covers_own_code(wheel: Path) -> tuple[int, int]:
    """Every manylinux tag in the name must allow the glibc the wheel's own code needs."""
    tags = split_wheel_name(wheel.name)[4]
    need = own_glibc_need(wheel)
    for tag in tags:
        m = _TAG.match(tag)
        if m is None:
            raise StepFailed(f"{wheel.name}: platform tag {tag} is not manylinux_X_Y")
        if (int(m.group(1)), int(m.group(2))) < need:
            raise StepFailed(f"{wheel.name}: claims {tag}, but its own code needs "
                             f"GLIBC_{need[0]}.{need[1]}")
    return need
