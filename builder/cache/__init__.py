"""Content-keyed cache folders for the builder's heavy inputs: the cross toolchain's sysroots and
target torch wheels, the host backend's torch environments, the compiler cache.

Everything lives under ``$AMPFORGE_CACHE`` (default ``~/.cache/ampforge``), never in the
repository. A cache entry is a folder named after a hash of what went into it; it is filled in a
temporary sibling and renamed into place, so a crash never leaves a half-filled entry that a later
run would trust.

An entry in use is *held*: the builder takes a shared ``flock`` on the entry's ``<entry>.lock``
sibling before it looks at the entry and keeps it until the build ends (or the process exits),
and touches the entry's ``last-used`` stamp. ``python -m builder cache prune`` takes the same
lock exclusively (without waiting), so it never removes an entry a running build holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Callable, Optional

from builder.atomicfile import atomic_write
from builder.release.manifest import sha256_file


def cache_root(override: Path | None = None) -> Path:
    """The cache folder: ``override``, else ``$AMPFORGE_CACHE``, else ``~/.cache/ampforge``."""
    if override is not None:
        root = Path(override)
    elif os.environ.get("AMPFORGE_CACHE"):
        root = Path(os.environ["AMPFORGE_CACHE"])
    else:
        root = Path.home() / ".cache" / "ampforge"
    root.mkdir(parents=True, exist_ok=True)
    return root


def content_key(parts: Iterable[str], length: int = 16) -> str:
    """A short stable hash of ``parts`` (order matters; callers sort when it must not)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:length]


# -- entries in use: a lock per entry, and a stamp of its last use -------------------------------

#: Touched in an entry (or, for a file entry, the file's own mtime) each time a build uses it.
LAST_USED = "last-used"


def lock_path(entry: Path) -> Path:
    """The lock file of *entry*: its ``<name>.lock`` sibling."""
    return entry.with_name(entry.name + ".lock")


def lock_entry(entry: Path, *, shared: bool, wait: bool = True) -> Optional[IO[str]]:
    """*entry*'s lock, taken (shared: a user; exclusive: prune), or None when *wait* is False and
    another process holds it. The open file is the lock: closing it releases it.

    Prune unlinks an entry's lock file with the entry; a process that was waiting on that file
    then holds a lock on a name nobody else can open any more, so the inode is compared with the
    name's after locking, and a stale one is given up and opened again."""
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
    path = lock_path(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = open(path, "a+", encoding="utf-8")  # the open file is the lock
        try:
            fcntl.flock(fh, mode)
        except BlockingIOError:
            fh.close()
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            return fh
        fh.close()


def mark_used(entry: Path) -> None:
    """Record that a build uses *entry* now (the stamp's mtime; a file entry's own mtime)."""
    try:
        if entry.is_dir():
            stamp = entry / LAST_USED
            stamp.touch()
            os.utime(stamp)
        elif entry.exists():
            os.utime(entry)
    except OSError:
        pass  # a read-only cache is still usable; it only ages sooner


_HELD: dict[Path, IO[str]] = {}
_HELD_GUARD = threading.Lock()


def hold_entry(entry: Path) -> None:
    """Mark *entry* in use by this process until :func:`release_entries` (a build's end) or the
    process exits: a shared lock that prune respects, and its last-used stamp (again on every
    call). Waits only while a prune is removing the entry (a rename)."""
    with _HELD_GUARD:
        if entry not in _HELD:
            try:
                lock = lock_entry(entry, shared=True)
            except OSError:
                lock = None  # a read-only cache: usable, and no prune of ours can touch it
            if lock is not None:
                _HELD[entry] = lock
    mark_used(entry)


def release_entries() -> None:
    """Give up every entry this process holds (the end of a build)."""
    with _HELD_GUARD:
        for lock in _HELD.values():
            lock.close()
        _HELD.clear()


def ensure_entry(final: Path, fill: Callable[[Path], object]) -> Path:
    """Return ``final``, creating it first with ``fill(tmpdir)`` if it does not exist yet, and
    hold it (:func:`hold_entry`).

    ``fill`` writes into a fresh temporary folder next to ``final``; only a ``fill`` that returns
    normally (what it returns is ignored) is renamed into place. Two processes racing both fill;
    the loser's copy is discarded.
    """
    hold_entry(final)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    mark_used(final)
    return final


def discard_entry(final: Path) -> None:
    """Remove the entry *final*: renamed aside first (atomic), so that no process finds it
    half-deleted, then deleted."""
    if not final.exists():
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.discarded.", dir=final.parent))
    try:
        os.rename(final, aside / final.name)
    except OSError:
        if final.exists():
            raise
    shutil.rmtree(aside, ignore_errors=True)


def file_digest(path: Path) -> str:
    """sha256 of *path*'s bytes, remembered per (path, size, mtime) under the cache root: a
    wheelhouse of multi-GB torch wheels is hashed once, not on every build."""
    st = path.stat()
    memo = (
        cache_root()
        / "digests"
        / content_key([str(path.resolve()), str(st.st_size), str(st.st_mtime_ns)], length=32)
    )
    try:
        value = memo.read_text().strip()
    except FileNotFoundError:  # not yet, or pruned a moment ago: hash it (again)
        pass
    else:
        mark_used(memo)  # prune ages memos by their mtime
        return value
    value = sha256_file(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(memo, (value + "\n").encode())
    return value


def folder_digest(folder: Path) -> str:
    """A content hash of every file in *folder* (names and bytes, order-independent)."""
    parts = [
        f"{p.relative_to(folder).as_posix()}:{file_digest(p)}"
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    return content_key(parts, length=64)


# -- what an entry holds: sizes, times and sha256s, checked before the entry is trusted ------

#: The content manifest of a cache entry's tree (written when the entry is filled).
TREE_MANIFEST = "files.json"


def _tree(root: Path) -> Iterator[tuple[str, os.stat_result, Path]]:
    # Byte-code caches are left out: Python writes them on import (a new file is no damage),
    # and rewrites one that is stale.
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = Path(folder, name)
            yield path.relative_to(root).as_posix(), path.lstat(), path


def write_tree_manifest(root: Path, out: Path) -> None:
    """Every file under *root*: size, mtime and sha256 (a symlink: its target), into *out*."""
    files: dict[str, list[Any]] = {}
    for rel, st, path in _tree(root):
        if stat.S_ISLNK(st.st_mode):
            files[rel] = ["link", os.readlink(path)]
        else:
            files[rel] = [st.st_size, st.st_mtime_ns, sha256_file(path)]
    atomic_write(out, json.dumps({"format": 1, "files": files}, sort_keys=True).encode())


def tree_problems(root: Path, manifest: Path, limit: int = 5) -> list[str]:
    """What differs between *root* and its manifest: missing files, other sizes, other bytes
    (a file whose size and mtime both match is trusted -- the fast path, a stat per file; one
    whose mtime moved is hashed). At most *limit* problems; [] when the tree is intact."""
    try:
        doc = json.loads(manifest.read_text())
        files: dict[str, list[Any]] = doc["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{manifest} is missing or unreadable (no record of what the entry holds)"]
    problems: list[str] = []
    for rel, want in sorted(files.items()):
        if len(problems) >= limit:
            break
        path = root / rel
        try:
            st = path.lstat()
        except OSError:
            problems.append(f"{path} is missing")
            continue
        if want[0] == "link":
            if not stat.S_ISLNK(st.st_mode) or os.readlink(path) != want[1]:
                problems.append(f"{path} is no longer a link to {want[1]}")
        elif st.st_size != want[0]:
            problems.append(f"{path} has {st.st_size} bytes, {want[0]} when the entry was made")
        elif st.st_mtime_ns != want[1] and sha256_file(path) != want[2]:
            problems.append(f"{path} does not match its sha256 (changed after the entry was made)")
    return problems
