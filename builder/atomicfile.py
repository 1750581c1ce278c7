"""Files that appear whole or not at all: write to a hidden temporary name in the target's
folder, fsync, then ``os.replace`` over the final name (atomic within one file system).

Used for everything the builder publishes (wheels and the manifest in ``dist/``, offline
bundles, rendered build contexts): a failure or a Ctrl-C while writing leaves the previous
file intact and no partial one visible.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Optional

from builder.diskspace import disk_full, is_disk_full


def public_mode() -> int:
    """0o666 less the process umask: what a plainly created file would get.

    mkstemp creates 0600 files; release artefacts are meant to be read by others (a web
    server, an upload job, the machine a bundle is carried to), so they get the ordinary mode.
    """
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_replace(
    target: Path, write: Callable[[BinaryIO], object], size: Optional[int] = None
) -> None:
    """Write *target* through *write* into a temporary file in its folder, fsync it, then
    rename it over the final name: readers see the old file or the whole new one. What *write*
    returns (``fh.write``'s byte count, say) is ignored.

    A full file system raises :class:`~builder.errors.DiskFull` naming *target* and *size*
    (the bytes the write needs, when the caller knows them), with the temporary file gone."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # no inode left is a full disk too
        if is_disk_full(exc):
            raise disk_full(target, needed=size) from exc
        raise
    os.fchmod(fd, public_mode())
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(target, needed=size) from exc
        raise


def atomic_write(target: Path, data: bytes) -> None:
    atomic_replace(target, lambda fh: fh.write(data), size=len(data))
