"""One release from many runners' ``dist/`` folders (``python -m builder merge``).

A CI fleet builds each wheel on the runner its record names; every runner uploads its
``dist/`` (wheels + ``manifest.json``). Merging them must keep the manifest's guarantees:

* every wheel is checked against its folder's manifest (sha256, as ``index`` does) and against
  its entry's resolved record (the cell, its Python and torch, and the file name's tags and
  ``+torch`` label agree with them);
* a conflict -- one file name with other bytes in two folders, or two entries of one cell
  that disagree -- is refused naming both folders, and nothing is written;
* the result is a folder ``index``/``publish`` take as they take ``dist/``, and each entry
  gains ``built_by``: the runner that built it (its ``extra.built_on``) and the folders it
  came from;
* merging is idempotent: the same inputs give the same bytes (no clock is read), merging the
  result with one of its inputs gives the result, and an unchanged release is not rewritten.
  A release folder that exists already is one of the inputs: a merge only adds to it.

The release is assembled in a hidden sibling folder and swapped in with two renames, so a
reader sees the old release or the new one, never a manifest whose wheel is missing.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.atomicfile import atomic_write
from builder.errors import ConfigError, StepFailed
from builder.release.distfiles import dist_wheels
from builder.release.manifest import MANIFEST_NAME, MANIFEST_VERSION, read_manifest
from builder.release.provenance import runner_of
from builder.release.shared import tag_serves
from builder.release.simple_index import _place, _swap_in

#: The field merge adds to each entry; ignored when two entries of one cell are compared.
BUILT_BY = "built_by"


@dataclass(frozen=True)
class Source:
    """One input folder: its wheels (checked against its manifest) and its entries."""

    path: Path
    name: str  # how the release names it: the folder's name (a CI artifact's)
    wheels: Mapping[str, Path]  # file name -> path
    sha256: Mapping[str, str]
    entries: tuple[dict[str, Any], ...]
    updated_at: str


@dataclass(frozen=True)
class Merged:
    out: Path
    wheels: tuple[str, ...]  # file names, sorted
    entries: tuple[dict[str, Any], ...]
    changed: bool  # False: the release already held exactly this


def _problem(path: Path, entry: Mapping[str, Any], what: str) -> str:
    return f"{path / MANIFEST_NAME}: {entry.get('cell')!r} ({entry.get('file')}): {what}"


def check_record(path: Path, entry: Mapping[str, Any]) -> list[str]:
    """What is wrong between a manifest entry, its wheel's file name and its resolved
    record (empty: nothing)."""
    resolved = (entry.get("extra") or {}).get("resolved")
    if not isinstance(resolved, Mapping):
        return [
            _problem(
                path,
                entry,
                "no resolved record (extra.resolved): not written by "
                "`build`, so nothing says which cell it serves",
            )
        ]
    name = str(entry.get("file", ""))
    try:
        _, version, _, tags = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        return [_problem(path, entry, f"not a wheel file name ({exc})")]
    problems = []
    for key, have, want in (
        ("id", entry.get("cell"), resolved.get("id")),
        ("python", entry.get("python"), resolved.get("python")),
    ):
        if have != want:
            problems.append(
                _problem(
                    path, entry, f"the entry says {have!r}, its resolved record's {key} {want!r}"
                )
            )
    torch = str(entry.get("torch", ""))
    if torch.split("+")[0] != resolved.get("torch"):
        problems.append(
            _problem(
                path,
                entry,
                f"built with torch {torch}, its resolved record "
                f"names torch {resolved.get('torch')}",
            )
        )
    cp, machine = str(resolved.get("cp")), str(resolved.get("machine"))
    if not any(tag_serves(t, cp) and t.platform.endswith("_" + machine) for t in tags):
        problems.append(
            _problem(
                path,
                entry,
                f"the file's tags do not install on {cp} {machine}, the resolved record's cell",
            )
        )
    if version.local != resolved.get("local_version"):
        problems.append(
            _problem(
                path,
                entry,
                f"local version {version.local!r}, the resolved "
                f"record's {resolved.get('local_version')!r}",
            )
        )
    return problems


def read_source(path: Path) -> Source:
    """*path* as a merge input: ConfigError (exit 2) when it is no build output folder,
    StepFailed (exit 1) naming every wheel that does not match its manifest or record."""
    if path.is_dir() and not (path / MANIFEST_NAME).exists():
        raise ConfigError(
            f"{path}: no {MANIFEST_NAME}; merge takes the dist/ folders `build` "
            "wrote (each runner's dist/, as uploaded)"
        )
    found = dist_wheels(path)  # sha256 against the manifest; no wheel is a usage error
    doc = read_manifest(path)
    entries = tuple(w for w in doc["wheels"] if isinstance(w, dict))
    problems = [p for w in entries for p in check_record(path, w)]
    listed = {str(w.get("file")) for w in entries}
    problems += [
        f"{path / MANIFEST_NAME}: lists {n}, which is not in {path}"
        for n in sorted(listed - set(found.sha256))
    ]
    if problems:
        raise StepFailed(
            f"{path}: {len(problems)} problem(s); nothing merged:\n  " + "\n  ".join(problems)
        )
    return Source(
        path=path,
        name=path.resolve().name,
        wheels={w.name: w for w in found.wheels},
        sha256=found.sha256,
        entries=entries,
        updated_at=str(doc.get("updated_at", "")),
    )


def _comparable(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != BUILT_BY}


def combine(sources: Sequence[Source]) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """(file name -> the path to take it from, the merged entries); StepFailed naming both
    folders on a conflict."""
    files: dict[str, tuple[str, Source]] = {}
    conflicts = []
    for s in sources:
        for name, digest in s.sha256.items():
            seen = files.get(name)
            if seen is None:
                files[name] = (digest, s)
            elif seen[0] != digest:
                conflicts.append(
                    f"{name}: sha256 {seen[0]} in {seen[1].path}, {digest} in {s.path}"
                )
    # One entry per (cell, file): a folder may hold several versions of a cell's wheel.
    by_cell: dict[tuple[str, str], tuple[dict[str, Any], Source, list[str]]] = {}
    for s in sources:
        for entry in s.entries:
            cell = (str(entry.get("cell")), str(entry.get("file")))
            seen_entry = by_cell.get(cell)
            if seen_entry is None:
                by_cell[cell] = (entry, s, [s.name])
            elif _comparable(seen_entry[0]) != _comparable(entry):
                diff = sorted(
                    k
                    for k in {*_comparable(entry), *_comparable(seen_entry[0])}
                    if seen_entry[0].get(k) != entry.get(k)
                )
                conflicts.append(
                    f"cell {cell[0]}: the entries in {seen_entry[1].path} and "
                    f"{s.path} disagree ({', '.join(diff)}); two runners built "
                    "it -- keep one folder's build"
                )
            elif BUILT_BY in entry and BUILT_BY not in seen_entry[0]:
                by_cell[cell] = (entry, s, seen_entry[2])  # an earlier merge's: it stands
            elif s.name not in seen_entry[2]:
                seen_entry[2].append(s.name)
    if conflicts:
        raise StepFailed(
            f"{len(conflicts)} conflict(s) between the folders; nothing "
            "written:\n  " + "\n  ".join(conflicts)
        )
    merged = []
    for cell in sorted(by_cell):
        entry, _, names = by_cell[cell]
        if BUILT_BY not in entry:  # an earlier merge's attribution stands
            entry = {**entry, BUILT_BY: {"runner": runner_of(entry), "sources": sorted(names)}}
        merged.append(entry)
    merged.sort(key=lambda w: (str(w.get("cell")), str(w.get("file"))))
    return {name: s.wheels[name] for name, (_, s) in sorted(files.items())}, merged


def _manifest_bytes(entries: Sequence[Mapping[str, Any]], updated_at: str) -> bytes:
    doc = {"version": MANIFEST_VERSION, "wheels": list(entries)}
    if updated_at:
        doc["updated_at"] = updated_at  # the newest input's: merging reads no clock
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _unchanged(out: Path, manifest: bytes, wheels: Mapping[str, Path]) -> bool:
    try:
        if (out / MANIFEST_NAME).read_bytes() != manifest:
            return False
    except OSError:
        return False
    present = {p.name for p in out.glob("*.whl") if not p.name.startswith(".")}
    return present == set(wheels)  # their bytes: out was an input, so already checked


def merge(dirs: Sequence[Path], out: Path, *, link: bool = False) -> Merged:
    """Merge the build output folders *dirs* into *out* (see the module docstring)."""
    if not dirs:
        raise ConfigError("merge: name at least one folder to merge (each runner's dist/)")
    out = Path(out)
    paths = [Path(d) for d in dirs]
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and all(p.resolve() != out.resolve() for p in paths):
        paths.append(out)  # the release so far: kept, and checked like every input
    sources = [read_source(p) for p in paths]
    wheels, entries = combine(sources)
    manifest = _manifest_bytes(entries, max(s.updated_at for s in sources))
    if _unchanged(out, manifest, wheels):
        return Merged(out, tuple(wheels), tuple(entries), changed=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes 0700; a release is read by others (a web server)
        for name, src in wheels.items():
            _place(src, tmp / name, link)
        atomic_write(tmp / MANIFEST_NAME, manifest)
        _swap_in(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
    return Merged(out, tuple(wheels), tuple(entries), changed=True)
