"""The input key: a content hash of everything that decides a cell's wheel. A cell whose wheel in
``dist/`` was built from the same key is up to date; when a key differs, the per-input digests
recorded in the manifest say which input changed."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from builder.projecttree import PROJECT_IGNORE, open_no_follow
from builder.release.manifest import read_manifest, sha256_file

BUILDER_DIR = Path(__file__).resolve().parent


def _ignored(rel: Path) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in PROJECT_IGNORE)


def tree_digest(root: Path, ignore: Callable[[Path], bool] = _ignored) -> str:
    """sha256 over the relative paths and contents of the files the build would see: a
    symlink by its target's name (never followed: a link out of the project is not read), a
    file read in chunks (a large one is never held in memory whole); FIFOs, sockets and
    devices, which no copy takes (builder.projecttree), are left out -- never opened."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        kept = sorted(d for d in dirnames if not ignore(rel_dir / d))
        # A link to a folder is listed with the folders; os.walk does not enter it.
        links = [d for d in kept if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in kept if d not in links]
        for name in sorted([*filenames, *links]):
            rel = rel_dir / name
            if ignore(rel):
                continue
            path = os.path.join(dirpath, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:  # removed while the walk ran
                continue
            if stat.S_ISLNK(mode):
                digest = hashlib.sha256(os.readlink(path).encode()).digest()
            elif stat.S_ISREG(mode):
                digest = _file_digest(path)
            else:
                continue
            h.update(rel.as_posix().encode() + b"\0" + digest)
    return h.hexdigest()


def _file_digest(path: str) -> bytes:
    h = hashlib.sha256()
    with open_no_follow(path) as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return h.digest()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def _builder_ignored(rel: Path) -> bool:
    return any(part == "__pycache__" or part.endswith(".pyc") for part in rel.parts)


def builder_digest() -> str:
    """sha256 over the whole builder package: any module, template or data file added to it is
    in the key without anyone having to list it (a hand-kept list once silently missed one)."""
    return tree_digest(BUILDER_DIR, ignore=_builder_ignored)


def input_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def find_up_to_date(out: Path, cell_id: str, key: str) -> Optional[Path]:
    """The wheel in *out* recorded for *cell_id* with input key *key*, intact; else None."""
    if not (out / "manifest.json").exists():
        return None
    for w in read_manifest(out)["wheels"]:
        extra = w.get("extra") or {}
        if w.get("cell") != cell_id or extra.get("input_key") != key:
            continue
        path = out / str(w.get("file"))
        if path.is_file() and sha256_file(path) == w.get("sha256"):
            return path
    return None


def rebuild_reason(out: Path, cell_id: str, parts: Mapping[str, Any]) -> str:
    """Why *cell_id* is built although dist/ may hold it: the inputs whose digest differs from
    its newest manifest entry's (``extra.inputs``), or that there is no usable entry."""
    entries = (
        [w for w in read_manifest(out)["wheels"] if w.get("cell") == cell_id]
        if (out / "manifest.json").exists()
        else []
    )
    if not entries:
        return "not built before (no manifest entry)"
    newest = max(entries, key=lambda w: str(w.get("finished_at") or ""))
    recorded = (newest.get("extra") or {}).get("inputs") or {}
    changed = sorted(k for k, v in parts.items() if recorded.get(k) != input_key({k: v})[:12])
    if changed:
        return "inputs changed since the last build: " + ", ".join(changed)
    return "its wheel in the manifest is missing or altered"
