"""Content-keyed cache folders for the builder's heavy inputs: the cross toolchain's sysroots and
target torch wheels, the host backend's torch environments, the compiler cache.

Everything lives under ``$AMPFORGE_CACHE`` (default ``~/.cache/ampforge``), never in the
repository. A cache entry is a folder named after a hash of what went into it; it is filled in a
temporary sibling and renamed into place, so a crash never leaves a half-filled entry that a later
run would trust.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Callable

from builder.atomicfile import atomic_write


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


def ensure_entry(final: Path, fill: Callable[[Path], None]) -> Path:
    """Return ``final``, creating it first with ``fill(tmpdir)`` if it does not exist yet.

    ``fill`` writes into a fresh temporary folder next to ``final``; only a ``fill`` that returns
    normally is renamed into place. Two processes racing both fill; the loser's copy is discarded.
    """
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
    return final


def file_digest(path: Path) -> str:
    """sha256 of *path*'s bytes, remembered per (path, size, mtime) under the cache root: a
    wheelhouse of multi-GB torch wheels is hashed once, not on every build."""
    st = path.stat()
    memo = cache_root() / "digests" / content_key(
        [str(path.resolve()), str(st.st_size), str(st.st_mtime_ns)], length=32)
    if memo.is_file():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    value = digest.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(memo, (value + "\n").encode())
    return value


def folder_digest(folder: Path) -> str:
    """A content hash of every file in *folder* (names and bytes, order-independent)."""
    parts = [f"{p.relative_to(folder).as_posix()}:{file_digest(p)}"
             for p in sorted(folder.rglob("*")) if p.is_file()]
    return content_key(parts, length=64)
