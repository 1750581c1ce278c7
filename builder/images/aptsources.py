"""This host's APT sources, read (never changed) so no mirror host name is built into the project.

Two users: ``base-image`` debootstraps from the host's Debian mirror
(:func:`builder.images.base_image.host_debian_mirror`), and the cross path derives another Debian
suite's
sources from the host's entries (:mod:`builder.cross.apt_suite`). Both formats are read: deb822
``*.sources`` stanzas and one-line ``deb [options] URI SUITE COMPONENT...`` lists; ``deb-src``,
disabled and commented entries are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceEntry:
    """One ``deb`` source: where, which suites, which components, signed by what."""

    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str = ""


def parse_deb822(text: str) -> list[SourceEntry]:
    """The ``Types: deb`` stanzas of a deb822 ``.sources`` file (disabled ones skipped)."""
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        last = ""
        for line in stanza.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and last:  # continuation line
                fields[last] += " " + line.strip()
                continue
            if ":" in line:
                last, value = line.split(":", 1)
                last = last.strip().lower()
                fields[last] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        entries.append(
            SourceEntry(
                uris=tuple(fields.get("uris", "").split()),
                suites=tuple(fields.get("suites", "").split()),
                components=tuple(fields.get("components", "").split()),
                signed_by=fields.get("signed-by", ""),
            )
        )
    return [e for e in entries if e.uris and e.suites]


def parse_one_line(text: str) -> list[SourceEntry]:
    """The ``deb`` lines of a one-line-style ``.list`` file (``deb [opts] URI SUITE COMP...``)."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        rest = line[4:].strip()
        signed_by = ""
        if rest.startswith("["):
            options, rest = rest[1:].split("]", 1)
            for option in options.split():
                if option.startswith("signed-by="):
                    signed_by = option.split("=", 1)[1]
        words = rest.split()
        if len(words) >= 2:
            entries.append(SourceEntry((words[0],), (words[1],), tuple(words[2:]), signed_by))
    return entries


def read_sources(sourcelist: Path, parts: Path) -> list[SourceEntry]:
    """Every ``deb`` entry of *sourcelist* (one-line format) and of the ``*.list`` /
    ``*.sources`` files in the folder *parts* (other files there, e.g. ``*.disabled``, are not
    read: apt ignores them too)."""
    entries: list[SourceEntry] = []
    if sourcelist.is_file():
        entries += parse_one_line(sourcelist.read_text(errors="replace"))
    files: Iterable[Path] = sorted(parts.iterdir()) if parts.is_dir() else ()
    for path in files:
        if not path.is_file():
            continue
        if path.suffix == ".sources":
            entries += parse_deb822(path.read_text(errors="replace"))
        elif path.suffix == ".list":
            entries += parse_one_line(path.read_text(errors="replace"))
    return entries
