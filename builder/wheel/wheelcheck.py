"""The wheel's name against its own code: the glibc its ELF files need vs. its manylinux tag.

``auditwheel show`` folds in the symbol versions of every external library it can find on the
build machine -- including the ones the repair deliberately excluded. ``libgomp.so.1`` from
Debian bookworm's gcc needs ``GLIBC_2.34``, so ``show`` reports ``manylinux_2_34`` for a wheel
whose own code needs 2.31 and which ``auditwheel repair --exclude libgomp.so.1`` (correctly)
tags ``manylinux_2_31``: at run time the user's torch provides that library, not our wheel.
This module reads the version requirements of the wheel's own ELF files directly, with its own
table of what each manylinux tag allows, so the check does not depend on auditwheel at all.

A manylinux_X_Y tag promises that the wheel runs with glibc >= X.Y and the C++ runtime of the
distributions that define that tag: ``GLIBC_`` versions up to X.Y, ``GLIBCXX_``/``CXXABI_``
versions up to what that libstdc++ exports (:data:`CXX_LIMITS`).
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.deps import require
from builder.errors import StepFailed
from builder.wheel.repair import split_wheel_name

_VERSION = re.compile(r"^(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)$")
_TAG = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}

Version = tuple[int, ...]

#: glibc of a manylinux tag -> the newest (GLIBCXX, CXXABI) versions its C++ runtime has: the
#: libstdc++ of the distribution each policy was defined from (x86 only: CentOS 5's GCC 4.1
#: for 2_5 (manylinux1), CentOS 6's GCC 4.4 for 2_12 (manylinux2010); CentOS 7's GCC 4.8 for 2_17,
#: Debian 9's GCC 6 for 2_24, Ubuntu 18.04 / RHEL 8's for 2_27 / 2_28, Ubuntu 20.04's GCC 9-10
#: for 2_31, RHEL 9's GCC 11 for 2_34, Ubuntu 22.04 / Debian 12's GCC 12 for 2_35 / 2_36, Ubuntu
#: 24.04's GCC 14 for 2_39). A tag between two rows gets the lower row's limits. The table
#: agrees with the manylinux policies (tests/builder/unit/test_glibc_floor.py checks it).
CXX_LIMITS: tuple[tuple[Version, Version, Version], ...] = (
    ((2, 5), (3, 4, 8), (1, 3, 1)),
    ((2, 12), (3, 4, 13), (1, 3, 3)),
    ((2, 17), (3, 4, 19), (1, 3, 7)),
    ((2, 24), (3, 4, 22), (1, 3, 10)),
    ((2, 27), (3, 4, 24), (1, 3, 11)),
    ((2, 31), (3, 4, 28), (1, 3, 12)),
    ((2, 34), (3, 4, 29), (1, 3, 13)),
    ((2, 35), (3, 4, 30), (1, 3, 13)),
    ((2, 39), (3, 4, 33), (1, 3, 15)),
)


def _dotted(v: Version) -> str:
    return ".".join(str(x) for x in v)


@dataclass(frozen=True)
class VersionNeed:
    """One symbol version an ELF file in the wheel requires, and the symbols bound to it."""

    member: str  # the file inside the wheel, e.g. amp/_C.cpython-311-x86_64-linux-gnu.so
    library: str  # the library that must provide it, e.g. libm.so.6
    family: str  # GLIBC | GLIBCXX | CXXABI
    version: Version
    symbols: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.family}_{_dotted(self.version)}"

    def describe(self) -> str:
        shown = ", ".join(f"{s}@{self.name}" for s in self.symbols[:6])
        more = f" and {len(self.symbols) - 6} more" if len(self.symbols) > 6 else ""
        return f"{self.member}: {shown or self.name}{more} ({self.library})"


def _elf_needs(member: str, data: bytes) -> list[VersionNeed]:
    elffile = require("elftools.elf.elffile", "pyelftools", "reading a wheel's symbol versions")
    gnuversions = require(
        "elftools.elf.gnuversions", "pyelftools", "reading a wheel's symbol versions"
    )
    GNUVerNeedSection, GNUVerSymSection = (  # the library's class names
        gnuversions.GNUVerNeedSection,
        gnuversions.GNUVerSymSection,
    )
    elf = elffile.ELFFile(io.BytesIO(data))
    verneed = next((s for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)), None)
    if verneed is None:
        return []
    by_index: dict[int, tuple[str, str]] = {}
    for need, auxes in verneed.iter_versions():
        for aux in auxes:
            by_index[int(aux["vna_other"])] = (str(need.name), str(aux.name))
    symbols: dict[int, list[str]] = {i: [] for i in by_index}
    versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
    dynsym = elf.get_section_by_name(".dynsym")
    if versym is not None and dynsym is not None:
        for i, sym in enumerate(dynsym.iter_symbols()):
            if sym["st_shndx"] != "SHN_UNDEF" or not sym.name:
                continue
            ndx = versym.get_symbol(i)["ndx"]
            if isinstance(ndx, int) and ndx in symbols:
                symbols[ndx].append(sym.name)
    out = []
    for index, (library, name) in sorted(by_index.items()):
        m = _VERSION.match(name)
        if m is None:  # GCC_, GOMP_, OMP_, ...: libgcc's and OpenMP's, not the tag's business
            continue
        out.append(
            VersionNeed(
                member=member,
                library=library,
                family=m.group(1),
                version=tuple(int(x) for x in m.group(2).split(".")),
                symbols=tuple(sorted(symbols[index])),
            )
        )
    return out


def version_needs(wheel: Path) -> list[VersionNeed]:
    """Every GLIBC_/GLIBCXX_/CXXABI_ version the wheel's own ELF files require."""
    needs: list[VersionNeed] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if not (name.endswith(".so") or ".so." in name):
                continue
            data = zf.read(name)
            if data[:4] == b"\x7fELF":
                needs += _elf_needs(name, data)
    return needs


def needs_glibc(need: VersionNeed) -> Version:
    """The oldest manylinux glibc whose runtime provides *need*."""
    if need.family == "GLIBC":
        return need.version[:2]
    column = 1 if need.family == "GLIBCXX" else 2
    for row in CXX_LIMITS:
        if need.version <= row[column]:
            return row[0]
    return (99, 99)  # newer than any C++ runtime in the table: no manylinux tag allows it


#: The machines whose manylinux policies start at manylinux1 (glibc 2.5); every other
#: machine's first policy is manylinux2014 (glibc 2.17).
_SINCE_MANYLINUX1 = ("x86_64", "i686")


def lowest_glibc(machine: str | None = None) -> Version:
    """The glibc of the oldest manylinux policy for *machine* (None: any machine's, 2.17)."""
    return (2, 5) if machine in _SINCE_MANYLINUX1 else (2, 17)


def glibc_floor(needs: Iterable[VersionNeed], machine: str | None = None) -> Version:
    """The oldest manylinux glibc (X, Y) whose tag allows every need: never below the oldest
    policy of *machine* (2.17, manylinux2014, when no machine is named)."""
    return max([lowest_glibc(machine), *(needs_glibc(n) for n in needs)])


def tag_glibc(tag: str) -> tuple[Version, str]:
    """(glibc, machine) of a manylinux tag: ``manylinux_2_28_x86_64`` -> ((2, 28), x86_64)."""
    m = _TAG.match(tag)
    if m is not None:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    legacy, _, machine = tag.partition("_")
    if legacy in _LEGACY and machine:
        return _LEGACY[legacy], machine
    raise StepFailed(f"platform tag {tag} is not manylinux_X_Y_<machine>")


def floor_tag(needs: Iterable[VersionNeed], machine: str) -> str:
    glibc = glibc_floor(needs, machine)
    return f"manylinux_{glibc[0]}_{glibc[1]}_{machine}"


def pushers(needs: Sequence[VersionNeed], ceiling: Version) -> list[VersionNeed]:
    """The needs a tag of glibc *ceiling* does not allow, newest first."""
    return sorted(
        (n for n in needs if needs_glibc(n) > ceiling),
        key=lambda n: (needs_glibc(n), n.family, n.version),
        reverse=True,
    )


def check_needs_within(wheel: Path, ceiling_tag: str, why: str) -> list[VersionNeed]:
    """Refuse *wheel* when its own code needs a newer glibc (or C++ runtime) than
    *ceiling_tag* allows, naming the symbols and versions that push it up; *why* says where
    the ceiling comes from. Returns the needs."""
    needs = version_needs(wheel)
    ceiling, _machine = tag_glibc(ceiling_tag)
    over = pushers(needs, ceiling)
    if over:
        floor = glibc_floor(needs)
        listed = "\n".join("    " + n.describe() for n in over)
        raise StepFailed(
            f"{wheel.name} needs glibc {_dotted(floor)} (manylinux_{floor[0]}_{floor[1]} at "
            f"best), newer than {ceiling_tag}: {why}. The symbol versions that push it up:\n"
            f"{listed}\n  Build against an older glibc/libstdc++ (an older base image, or "
            "C++17 instead of C++20 for libstdc++'s newer string members) or bind those "
            "symbols to older versions (.symver), so it installs wherever its torch does."
        )
    return needs


def need_summary(needs: Iterable[VersionNeed]) -> dict[str, str]:
    """The newest version needed per family, e.g. {"GLIBC": "2.14", "GLIBCXX": "3.4.21"}."""
    newest: dict[str, Version] = {}
    for n in needs:
        newest[n.family] = max(newest.get(n.family, ()), n.version)
    return {family: _dotted(v) for family, v in sorted(newest.items())}


def check_tag_covers_own_code(wheel: Path, ceiling_tag: str | None = None) -> str:
    """Every manylinux tag in the name must allow what the wheel's own code needs (GLIBC_,
    GLIBCXX_, CXXABI_ versions), and none may be above *ceiling_tag* (torch's own tag, when
    given). Returns the oldest tag the code allows.

    A tag is refused only for a need it does not allow, and the refusal names it: a module
    that binds no versioned glibc symbol at all (auditwheel tags it manylinux1 on x86_64)
    meets every tag of its machine."""
    tags = split_wheel_name(wheel.name)[4]
    needs = version_needs(wheel)
    machine = ""
    for tag in tags:
        glibc, machine = tag_glibc(tag)
        over = pushers(needs, glibc)
        if over:
            floor = glibc_floor(needs, machine)
            listed = "\n".join("    " + n.describe() for n in over)
            raise StepFailed(
                f"{wheel.name}: claims {tag}, but its own code needs glibc "
                f"{_dotted(floor)} or newer:\n{listed}"
            )
        if ceiling_tag is not None and glibc > tag_glibc(ceiling_tag)[0]:
            raise StepFailed(
                f"{wheel.name}: tagged {tag}, above {ceiling_tag} (the tag of the "
                "torch it pairs with): it would refuse to install where its torch "
                "installs"
            )
    return floor_tag(needs, machine)


def platform_record(tag: str, ceiling: str, needs: Iterable[VersionNeed]) -> dict[str, object]:
    """What the manifest says about a wheel's platform: the tag it achieved (its most
    compatible), the ceiling it had to meet (its torch's tag), what its own code needs."""
    return {"tag": tag, "ceiling": ceiling, "needs": need_summary(needs)}
