"""A full disk, said plainly: which path, how much was free, how much was needed.

A file system that fills surfaces in three shapes: an ``OSError`` with ``ENOSPC`` (or
``EDQUOT``, a quota) from the builder's own writes, a tool's output line ``No space left on
device`` (the compiler, pip, auditwheel), and a write that has not happened yet but cannot fit
(:func:`require_space`, checked before ``dist/`` is touched). Each becomes one
:class:`~builder.errors.DiskFull` (exit 1) whose message names the path, its file system's
free space and what the write needed, so the person reading it knows what to free or where to
point the build instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from builder.errors import DiskFull

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: What tools print for those errnos (strerror), in their own lines of output.
FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
_PATH_IN_LINE = re.compile(r"(?:^|(?<=[\s'\"]))(/[^\s:'\"]+)")


def human(n: int) -> str:
    """Bytes for a person: 3.4 MB, 812 kB, 17 B (powers of 1000, as df -H and pip say)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def existing(path: Path) -> Path:
    """*path*, or its nearest ancestor that exists (a folder not made yet lives on that one's
    file system)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged write may still use on *path*'s file system (``f_bavail``)."""
    st = os.statvfs(existing(path))
    return st.f_bavail * st.f_frsize


def block_rounded(size: int, path: Path) -> int:
    """*size* as whole blocks of *path*'s file system: what a file of that size occupies."""
    block = os.statvfs(existing(path)).f_frsize or 4096
    return -(-size // block) * block


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding *path* (``df``'s "Mounted on")."""
    path = existing(path).resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def tree_size(folder: Path) -> int:
    """Bytes of the files under *folder* (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def is_disk_full(exc: BaseException) -> bool:
    """Whether *exc*, or an exception it was raised from or during, is a full disk."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFull):
            return True
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return True
        current = current.__cause__ or current.__context__
    return False


def full_line(lines: Iterable[str]) -> Optional[str]:
    """The first line of a tool's output that reports a full disk, or None."""
    return next((line.strip() for line in lines if any(t in line for t in FULL_TEXTS)), None)


def paths_in_line(line: str) -> list[Path]:
    """The absolute paths a tool's no-space line names (``/tmp/cc1.s: Fatal error: can't
    write /x/y.o: No space left``): some are read, one was being written -- the one on the
    fullest file system (:func:`fullest`)."""
    return [Path(m.group(1)) for m in _PATH_IN_LINE.finditer(line)]


def disk_full(
    path: Path, *, needed: Optional[int] = None, what: str = "", detail: str = ""
) -> DiskFull:
    """The error for a write to *path* that does not fit. *needed*: the bytes the write needs
    when known (a wheel's or the manifest's size); else the message says it is more than what
    is free. *what*: the write, for the reader (``the wheel``, ``the cell's log``)."""
    path = Path(path)
    free = free_bytes(path)
    mount = mount_point(path)
    need = f"{human(needed)} needed" if needed is not None else "the write needed more"
    message = (
        f"no space left on device: {what + ' ' if what else ''}{path} (file system "
        f"{mount}: {human(free)} free, {need}). Nothing partial was kept; free space "
        f"on {mount} (or point the build at another disk: --work-dir, --out, "
        f"AMPFORGE_CACHE) and run again"
    )
    if detail:
        message += f"\n{detail}"
    return DiskFull(message, path=path, free=free, needed=needed)


def require_space(path: Path, needed: int, what: str) -> None:
    """Raise :class:`DiskFull` before writing *needed* bytes under *path* when they cannot fit
    (a check, not a reservation: a write that still fails is handled where it happens)."""
    if free_bytes(path) < needed:
        raise disk_full(path, needed=needed, what=what)


def fullest(paths: Iterable[Path]) -> Path:
    """Of the places a step writes to, the one with the least free space: where a write that
    failed without naming its file most likely went."""
    return min((Path(p) for p in paths), key=free_bytes)


def files_state(folder: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of each file directly in *folder*: what :func:`remove_changed` compares."""
    if not folder.is_dir():
        return {}
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()
    }


def remove_changed(folder: Path, before: dict[str, tuple[int, int]]) -> list[str]:
    """Remove the files of *folder* that are new or changed since *before*: after a tool that
    writes in place failed (``pip download`` copies straight to its ``--dest``), any of them
    may be cut short, and a later run would take it as downloaded. Returns their names."""
    gone = sorted(name for name, state in files_state(folder).items() if before.get(name) != state)
    for name in gone:
        (folder / name).unlink(missing_ok=True)
    return gone
