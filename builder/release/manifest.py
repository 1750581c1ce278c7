"""``dist/``: verified wheels enter it atomically, and ``dist/manifest.json`` records them.

Nothing half-written is ever visible in ``dist/``: a wheel is copied to a hidden temporary name
in the same directory, flushed, then renamed over its final name (``os.replace`` is atomic within
one file system). The manifest is rewritten the same way under an exclusive lock, so parallel
cells (``make matrix JOBS=n``) never lose each other's entries, and a failure while writing
leaves the previous manifest intact. An unreadable manifest is an error, never overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from builder.atomicfile import atomic_replace, atomic_write
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
    final = dist / wheel.name

    def copy(out: BinaryIO) -> None:
        with wheel.open("rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)

    with _locked(dist):
        if cells and final.exists() and sha256_file(final) != sha256_file(wheel):
            owners = [str(w.get("cell")) for w in read_manifest(dist)["wheels"]
                      if w.get("file") == wheel.name]
            others = sorted(set(owners) - set(cells))
            if not owners or others:
                whose = (f"the wheel of {', '.join(others)} (manifest.json)" if others else
                         "a file manifest.json does not list")
                raise StepFailed(
                    f"refusing to replace {final}: it is {whose}, with other bytes than the "
                    f"wheel built for {', '.join(cells)}; kept as it is. One file name serving "
                    "several cells (an abi3 or py3-none wheel): build those cells in one run "
                    "(e.g. --python 3.11,3.12) -- the wheel is built once and verified on each "
                    "Python -- or use another --out")
        atomic_replace(final, copy)
    return final


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
        return cls(file=wheel.name, sha256=sha256_file(wheel), size=wheel.stat().st_size,
                   **fields)


@contextlib.contextmanager
def _locked(dist: Path) -> Iterator[None]:
    with open(dist / ".manifest.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_manifest(dist: Path) -> dict[str, Any]:
    path = dist / MANIFEST_NAME
    if not path.exists():
        return {"version": MANIFEST_VERSION, "wheels": []}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise StepFailed(f"{path} is not valid JSON ({exc}); refusing to overwrite it: move it "
                         "aside and rebuild") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("wheels"), list):
        raise StepFailed(f"{path}: expected an object with a 'wheels' list; refusing to "
                         "overwrite it")
    return doc


def record_wheel(dist: Path, entry: ManifestEntry) -> Path:
    """Add (or replace, for the same cell) *entry* in ``dist/manifest.json``.

    Other cells' entries for the same file stay when they record the same bytes (one wheel
    serving several cells, e.g. abi3); entries recording other bytes under that name no longer
    describe ``dist/`` and go (:func:`publish_wheel` allowed the replacement)."""
    dist.mkdir(parents=True, exist_ok=True)
    with _locked(dist):
        doc = read_manifest(dist)
        kept = [w for w in doc["wheels"]
                if not (w.get("cell") == entry.cell or (
                    w.get("file") == entry.file and w.get("sha256") != entry.sha256))]
        kept.append(asdict(entry))
        kept.sort(key=lambda w: (str(w.get("cell")), str(w.get("file"))))
        doc["wheels"] = kept
        doc["version"] = MANIFEST_VERSION
        doc["updated_at"] = utc_now()
        path = dist / MANIFEST_NAME
        atomic_write(path, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return path
