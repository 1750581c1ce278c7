"""``dist/``: verified wheels enter it atomically, and ``dist/manifest.json`` records them.

Nothing half-written is ever visible in ``dist/``: a wheel is copied to a hidden temporary name
in the same directory, flushed, then renamed over its final name (``os.replace`` is atomic within
one file system). The manifest is rewritten the same way under an exclusive lock, so parallel
cells (``make matrix JOBS=n``) and builders in other processes never lose each other's entries,
a reader never sees a half-written manifest, and a failure while writing (a full disk included)
leaves the previous manifest intact. An unreadable manifest is an error, never overwritten.
Two builders of the same cell into one ``dist/`` do not race: the second waits for the first
(:func:`building`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Optional

from builder.atomicfile import atomic_replace, atomic_write
from builder.diskspace import block_rounded, require_space
from builder.errors import StepFailed

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def publish_wheel(wheel: Path, dist: Path, cells: Sequence[str] = ()) -> Path:
    """Copy *wheel* into *dist* atomically; return its final path (same file name).

    With *cells* (the cells this wheel is built for in this run), a file of the same name with
    other bytes may only be replaced when every manifest entry for it belongs to one of them:
    one wheel file name can serve several cells (an abi3 wheel serves every Python), and a build
    for one must never silently replace what another's entry describes, nor a file the manifest
    does not list. Raises StepFailed and leaves *dist* as it was."""
    dist.mkdir(parents=True, exist_ok=True)
    with _locked(dist):
        final = _check_replaceable(wheel, dist, cells)
        _copy_in(wheel, final)
    return final


def publish_recorded(
    wheel: Path, dist: Path, entry: ManifestEntry, cells: Sequence[str] = ()
) -> Path:
    """:func:`publish_wheel` and :func:`record_wheel` as one step under one lock, all or
    nothing: the wheel enters *dist* and *entry* (made from the staged *wheel*: same name and
    bytes) enters the manifest, or *dist* stays byte-identical to before.

    The space both need is checked first (DiskFull names *dist*, the bytes free and needed);
    a write that still fails (another writer filled the disk meanwhile) takes the new wheel
    back and puts back the file it replaced, which a hard link kept."""
    dist.mkdir(parents=True, exist_ok=True)
    with _locked(dist):
        final = _check_replaceable(wheel, dist, cells)
        doc = _manifest_bytes(_with_entry(read_manifest(dist), entry))
        require_space(
            dist,
            block_rounded(wheel.stat().st_size, dist) + block_rounded(len(doc), dist),
            what=f"the wheel {wheel.name} and {MANIFEST_NAME} in",
        )
        kept = _keep_previous(final)
        try:
            _copy_in(wheel, final)
            atomic_write(dist / MANIFEST_NAME, doc)
        except BaseException:
            if kept is not None:
                os.replace(kept, final)
            else:
                final.unlink(missing_ok=True)
            raise
        finally:
            if kept is not None:
                kept.unlink(missing_ok=True)
    return final


def _check_replaceable(wheel: Path, dist: Path, cells: Sequence[str]) -> Path:
    """*dist*'s path for *wheel*; StepFailed when *cells* may not replace what is there."""
    final = dist / wheel.name
    if cells and final.exists() and sha256_file(final) != sha256_file(wheel):
        owners = [
            str(w.get("cell")) for w in read_manifest(dist)["wheels"] if w.get("file") == wheel.name
        ]
        others = sorted(set(owners) - set(cells))
        if not owners or others:
            whose = (
                f"the wheel of {', '.join(others)} (manifest.json)"
                if others
                else "a file manifest.json does not list"
            )
            raise StepFailed(
                f"refusing to replace {final}: it is {whose}, with other bytes than the "
                f"wheel built for {', '.join(cells)}; kept as it is. One file name serving "
                "several cells (an abi3 or py3-none wheel): build those cells in one run "
                "(e.g. --python 3.11,3.12) -- the wheel is built once and verified on each "
                "Python -- or use another --out"
            )
    return final


def _copy_in(wheel: Path, final: Path) -> None:
    def copy(out: BinaryIO) -> None:
        with wheel.open("rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)

    atomic_replace(final, copy, size=wheel.stat().st_size)


def _keep_previous(final: Path) -> Optional[Path]:
    """A hard link to the wheel *final* names (no space used), to put it back if the manifest
    cannot be written; None when there is none (or the file system has no hard links)."""
    if not final.exists():
        return None
    kept = final.with_name(f".{final.name}.previous-{os.getpid()}")
    kept.unlink(missing_ok=True)
    try:
        os.link(final, kept)
    except OSError:
        return None
    return kept


@dataclass(frozen=True)
class ManifestEntry:
    """One wheel in ``dist/manifest.json``; ``cell`` is the cell's identifier."""

    cell: str
    file: str
    sha256: str
    size: int
    torch: str
    python: str
    base_image: str
    compiler: str
    builder_version: str
    started_at: str
    finished_at: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def for_wheel(cls, wheel: Path, **fields: Any) -> ManifestEntry:
        return cls(file=wheel.name, sha256=sha256_file(wheel), size=wheel.stat().st_size, **fields)


@contextlib.contextmanager
def _locked(dist: Path) -> Iterator[None]:
    with open(dist / ".manifest.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: Per-cell locks (``dist/.locks/<cell>.lock``): held while a builder builds that cell into
#: this dist/; their text names the holder, for the builder that waits.
LOCKS_DIR = ".locks"


@contextlib.contextmanager
def building(dist: Path, cell: str, waiting: Callable[[str], None]) -> Iterator[None]:
    """Held while this process builds *cell* into *dist*. A second builder of the same cell
    into the same *dist* (another terminal, a CI job sharing the folder) waits here, after
    *waiting* says for whom, and then finds the first one's wheel up to date instead of
    building it again beside it. The kernel drops the lock when its holder dies (``flock``),
    so a killed builder never leaves a stale one."""
    locks = dist / LOCKS_DIR
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{cell}.lock", "a+", encoding="utf-8") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another builder"
            waiting(
                f"waiting: {holder} is building {cell} into {dist}; this build goes on "
                "when that one ends"
            )
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(OSError):  # the holder's name is a courtesy
                fh.truncate(0)
                fh.write(
                    f"the builder with pid {os.getpid()} on {socket.gethostname()} "
                    f"(since {utc_now()})\n"
                )
                fh.flush()
            yield
        finally:
            with contextlib.suppress(OSError):
                fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_manifest(dist: Path) -> dict[str, Any]:
    path = dist / MANIFEST_NAME
    if not path.exists():
        return {"version": MANIFEST_VERSION, "wheels": []}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise StepFailed(
            f"{path} is not valid JSON ({exc}); refusing to overwrite it: move it aside and rebuild"
        ) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("wheels"), list):
        raise StepFailed(
            f"{path}: expected an object with a 'wheels' list; refusing to overwrite it"
        )
    return doc


def record_wheel(dist: Path, entry: ManifestEntry) -> Path:
    """Add (or replace, for the same cell) *entry* in ``dist/manifest.json``.

    Other cells' entries for the same file stay when they record the same bytes (one wheel
    serving several cells, e.g. abi3); entries recording other bytes under that name no longer
    describe ``dist/`` and go (:func:`publish_wheel` allowed the replacement)."""
    dist.mkdir(parents=True, exist_ok=True)
    with _locked(dist):
        path = dist / MANIFEST_NAME
        atomic_write(path, _manifest_bytes(_with_entry(read_manifest(dist), entry)))
    return path


def _with_entry(doc: dict[str, Any], entry: ManifestEntry) -> dict[str, Any]:
    # An entry describes one file of dist/: the file's earlier entry for this cell goes, and
    # any entry for other bytes under its name (publish_wheel allowed that replacement). The
    # cell's entries for its other files stay, as the files do: a new version of the project
    # built into the same dist/ adds its wheel beside the older one, whose entry is kept.
    kept = [
        w
        for w in doc["wheels"]
        if not (
            w.get("file") == entry.file
            and (w.get("cell") == entry.cell or w.get("sha256") != entry.sha256)
        )
    ]
    kept.append(asdict(entry))
    kept.sort(key=lambda w: (str(w.get("cell")), str(w.get("file"))))
    return {**doc, "wheels": kept, "version": MANIFEST_VERSION, "updated_at": utc_now()}


def _manifest_bytes(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
