"""A private apt configuration for another Debian suite's arm64 packages (read-only for the host).

Each Debian release ships one CPython 3.X (bullseye 3.9, bookworm 3.11, trixie 3.13). The host's
own suite is reached through the host's apt as it is; any other suite gets an apt configuration
of its own under the cache folder -- sources, index, lists -- passed to ``apt-get``/``apt-cache``
with ``-o Dir::...`` options. The machine's global apt sources, state and dpkg database are never
changed.

Its sources are *derived* from the host's: every ``deb`` entry whose suite is the host's codename
(``bookworm``, ``bookworm-updates``, ``bookworm-security``) is repeated with the target suite in
its place, same mirror, components and keyring. So a machine behind its own mirror keeps using it,
and no mirror name is written anywhere in this project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from builder.cache import cache_root, hold_entry
from builder.errors import StepFailed
from builder.images.aptsources import SourceEntry, read_sources

#: An index younger than this is used as it is; older ones are refreshed (a failed refresh keeps
#: the old index, so offline builds still work from a warm cache).
INDEX_MAX_AGE_S = 24 * 3600


def host_codename(os_release: Path = Path("/etc/os-release")) -> tuple[str, str]:
    """``(ID, VERSION_CODENAME)`` of this host, e.g. ``("debian", "bookworm")``."""
    fields: dict[str, str] = {}
    if os_release.exists():
        for line in os_release.read_text().splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                fields[key.strip()] = value.strip().strip('"')
    return fields.get("ID", ""), fields.get("VERSION_CODENAME", "")


def host_sources() -> list[SourceEntry]:
    """Every ``deb`` entry of the host's apt sources (where ``apt-config`` says they are)."""
    run = subprocess.run(
        [
            "apt-config",
            "shell",
            "LIST",
            "Dir::Etc::sourcelist/f",
            "PARTS",
            "Dir::Etc::sourceparts/d",
        ],
        capture_output=True,
        text=True,
    )
    paths = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    sourcelist = Path(paths.get("LIST", "'/etc/apt/sources.list'").strip("'"))
    parts = Path(paths.get("PARTS", "'/etc/apt/sources.list.d/'").strip("'"))
    return read_sources(sourcelist, parts)


def derive_sources(
    entries: list[SourceEntry], host_suite: str, suite: str, arch: str, kind: str = "deb"
) -> str:
    """A deb822 sources text for ``suite`` built from the host's ``host_suite`` entries.

    ``bookworm`` -> ``suite``, ``bookworm-updates`` -> ``suite-updates`` and so on; entries of
    other suites (third-party repositories) are left out. ``kind="deb-src"`` makes source
    entries (``apt-get source``; no architecture). Raises :class:`StepFailed` when the host
    has no entry for its own suite to derive from.
    """
    stanzas = []
    for entry in entries:
        suites = [
            suite + s[len(host_suite) :]
            for s in entry.suites
            if s == host_suite or s.startswith(host_suite + "-")
        ]
        if not suites:
            continue
        lines = [
            f"Types: {kind}",
            "URIs: " + " ".join(entry.uris),
            "Suites: " + " ".join(suites),
            "Components: " + " ".join(entry.components or ("main",)),
        ]
        if kind == "deb":
            lines.append(f"Architectures: {arch}")
        if entry.signed_by:
            lines.append("Signed-By: " + entry.signed_by)
        stanzas.append("\n".join(lines) + "\n")
    if not stanzas:
        raise StepFailed(
            f"target Python: cannot reach Debian {suite}: the host's apt sources have no entry "
            f"for its own suite {host_suite!r} to derive a {suite} source from"
        )
    return "\n".join(stanzas)


@dataclass(frozen=True)
class SuiteApt:
    """The ``-o`` options that point apt at one suite's private configuration (empty: host)."""

    suite: str
    options: tuple[str, ...] = ()


def _apt_options(root: Path) -> tuple[str, ...]:
    etc, state, cache = root / "etc", root / "state", root / "cache"
    return (
        "-o",
        f"Dir::Etc::sourcelist={etc / 'sources.list'}",
        "-o",
        f"Dir::Etc::sourceparts={etc / 'sources.list.d'}",
        "-o",
        f"Dir::Etc::preferences={etc / 'preferences'}",
        "-o",
        f"Dir::Etc::preferencesparts={etc / 'preferences.d'}",
        "-o",
        f"Dir::State={state}",
        "-o",
        f"Dir::State::status={state / 'status'}",
        "-o",
        f"Dir::Cache={cache}",
        # arm64 indices even where the host never ran `dpkg --add-architecture arm64`.
        "-o",
        "APT::Architectures::=arm64",
    )


def suite_apt(suite: str, arch: str = "arm64", cache: Path | None = None) -> SuiteApt:
    """apt access to ``suite``'s ``arch`` packages: the host's apt for its own suite, else a
    private configuration under the cache folder whose index is refreshed when missing or older
    than :data:`INDEX_MAX_AGE_S`."""
    distro, codename = host_codename()
    if suite == codename:
        return SuiteApt(suite)
    _require_debian(distro, codename, f"target Python: Debian {suite}'s {arch} packages")
    root = cache_root(cache) / "apt" / f"{suite}-{arch}"
    hold_entry(root)  # apt reads and refreshes it in place: never pruned meanwhile
    sources = derive_sources(host_sources(), codename, suite, arch)
    return SuiteApt(
        suite, _private_apt(root, sources, "*_Packages*", f"target Python: Debian {suite} ({arch})")
    )


def source_apt(suite: str | None = None, cache: Path | None = None) -> SuiteApt:
    """apt access to ``suite``'s *source* packages (``apt-get source``; default: the host's own
    suite) through a private configuration whose ``deb-src`` entries are derived from the host's
    ``deb`` entries: the host's sources are never edited, and its mirror is the one used."""
    distro, codename = host_codename()
    _require_debian(distro, codename, "Debian source packages")
    suite = suite or codename
    root = cache_root(cache) / "apt" / f"{suite}-source"
    hold_entry(root)  # apt reads and refreshes it in place: never pruned meanwhile
    sources = derive_sources(host_sources(), codename, suite, "", kind="deb-src")
    return SuiteApt(suite, _private_apt(root, sources, "*_Sources*", f"Debian {suite} sources"))


def _require_debian(distro: str, codename: str, what: str) -> None:
    if distro != "debian" or not codename:
        raise StepFailed(
            f"{what} are derived from the host's Debian apt sources, but this host is "
            f"{distro or 'unknown'} {codename or '(no VERSION_CODENAME in /etc/os-release)'}"
        )


def _private_apt(root: Path, sources: str, lists_glob: str, what: str) -> tuple[str, ...]:
    """The ``-o`` options of the private apt configuration in *root* listing *sources*; its
    index is refreshed when missing, changed or older than :data:`INDEX_MAX_AGE_S` (a failed
    refresh keeps an older index)."""
    for folder in (
        "etc/sources.list.d",
        "etc/preferences.d",
        "state/lists/partial",
        "cache/archives/partial",
    ):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "etc" / "sources.list").touch()
    (root / "state" / "status").touch()  # no packages "installed": the host's dpkg stays out
    listing = root / "etc" / "sources.list.d" / "ampforge.sources"
    changed = not listing.exists() or listing.read_text() != sources
    if changed:
        listing.write_text(sources)
    options = _apt_options(root)
    lists = [p for p in (root / "state" / "lists").glob(lists_glob)]
    stamp = root / "state" / "updated"
    stale = (
        not lists
        or changed
        or not stamp.exists()
        or time.time() - stamp.stat().st_mtime > INDEX_MAX_AGE_S
    )
    if stale:
        # apt drops to _apt for downloads; let it write its partial folder.
        if shutil.which("apt-get") is None:
            raise StepFailed(f"{what}: needs a Debian host (apt-get)")
        if os.geteuid() == 0:
            (root / "state" / "lists" / "partial").chmod(0o777)
            (root / "cache" / "archives" / "partial").chmod(0o777)
        run = subprocess.run(["apt-get", *options, "-q", "update"], capture_output=True, text=True)
        failed = run.returncode != 0 or "\nE: " in "\n" + run.stderr
        lists = [p for p in (root / "state" / "lists").glob(lists_glob)]
        if failed and not lists:
            raise StepFailed(
                f"{what}: `apt-get update` failed and no earlier index is "
                f"cached:\n{run.stderr[-1500:]}"
            )
        if not failed:
            stamp.touch()
    return options
