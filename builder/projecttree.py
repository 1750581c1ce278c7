"""What of a project's folder a build gets: the one copy every backend builds from.

A ``--project`` tree is whatever the person pointed at, checked out by anyone: the copy
(:func:`copy_project_tree`) takes the project's own files and nothing from outside it, and
never blocks or fills the disk on something that is not a file:

* **Symlinks that resolve outside the project** (``secrets -> /etc``, ``up -> ../..``, an
  absolute link to another checkout) are *not copied*: the build would read through them what
  the project does not hold. The check resolves the whole chain (a link to a link that leaves
  the project leaves it too). Links that resolve inside the project are kept, rewritten
  relative to the copy (an absolute link into the project would otherwise point back into the
  caller's tree).
* **FIFOs, sockets, character and block devices** are not copied (opening a FIFO blocks, a
  device reads forever); a file that turns into one while the copy runs is caught too (each
  file is opened without following links and without blocking, and checked again).
* **``.git``** (and the build outputs, environments and caches of :data:`PROJECT_IGNORE`) is
  not copied: the build sees the checkout's files, not its history. The builder reads the last
  commit's time from the caller's checkout itself (builder.wheel.reproducible).
* **Large files**: every regular file is copied whatever its size up to a limit; files of
  :data:`LARGE_FILE` (100 MB) or more are named with their size. One file over the limit
  (:data:`DEFAULT_FILE_LIMIT`, 2 GB; ``AMPFORGE_PROJECT_FILE_LIMIT=SIZE`` moves it, e.g.
  ``8G``) stops the build before anything is copied, naming the file: every cell copies the
  project, and a data set or a disk image in a source tree is a mistake far more often than an
  input.

What was left out is said once per kind, with the paths (:meth:`CopyReport.lines`): in every
cell's log, and by ``build`` before the cells (there without the ``.git`` line, which every
checkout would print). Hard links cannot be told from the file
itself: a hard link to a file elsewhere is that file, and is copied.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Optional, Union

from builder.diskspace import human
from builder.errors import ConfigError, StepFailed

#: Never copied into a build: version control, environments, build outputs, caches, compiled
#: modules.
PROJECT_IGNORE: tuple[str, ...] = (
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.so",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".mypy_cache",
    "out",
)
#: The entries of PROJECT_IGNORE that are a checkout's history (said when skipped).
VCS_NAMES: tuple[str, ...] = (".git",)
#: Files this big or bigger are copied and named in the report.
LARGE_FILE = 100 * 10**6
#: One file bigger than this stops the build (AMPFORGE_PROJECT_FILE_LIMIT overrides it).
DEFAULT_FILE_LIMIT = 2 * 10**9
LIMIT_VAR = "AMPFORGE_PROJECT_FILE_LIMIT"
#: How many paths a report line names before "and N more".
SHOWN = 10

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?", re.IGNORECASE)
_CHUNK = 1 << 20


def file_limit(env: Mapping[str, str]) -> int:
    """The largest project file a build copies, in bytes: ``AMPFORGE_PROJECT_FILE_LIMIT``
    (``4000000000``, ``4G``, ``512MB``, ``3GiB``) or :data:`DEFAULT_FILE_LIMIT`."""
    raw = env.get(LIMIT_VAR, "").strip()
    if not raw:
        return DEFAULT_FILE_LIMIT
    m = _SIZE.fullmatch(raw)
    if m is None or float(m.group(1)) <= 0:
        raise ConfigError(
            f"{raw!r} is not a size; expected bytes or a number with K, M, G or T (e.g. 8G)",
            key=f"environment {LIMIT_VAR}",
        )
    power = "kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


def is_inside(root: Path, path: Path) -> bool:
    """Whether *path*, every symlink on the way resolved, is *root* or under it."""
    real = os.path.realpath(root)
    return os.path.commonpath([real, os.path.realpath(path)]) == real


def ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in PROJECT_IGNORE)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


@dataclass
class CopyReport:
    """What the copy left out or wants said, paths relative to the project."""

    outside: list[tuple[str, str]] = field(default_factory=list)  # (link, target as written)
    special: list[tuple[str, str]] = field(default_factory=list)  # (path, kind)
    vcs: list[str] = field(default_factory=list)  # .git folders (or files) not copied
    large: list[tuple[str, int]] = field(default_factory=list)  # (path, bytes), copied
    links: int = 0  # symlinks inside the project, kept
    files: int = 0
    size: int = 0  # bytes of the regular files

    def lines(self, vcs: bool = True) -> list[str]:
        """One line per kind of thing said, the paths named (the first SHOWN); *vcs*: the
        ``.git`` line too (every checkout has one: the cell's log says it, ``build``'s
        stderr only says the surprises)."""
        out = []
        if self.outside:
            out.append(
                f"project copy: skipped {len(self.outside)} symlink(s) pointing outside "
                "the project (not followed, not copied): "
                + _listed([f"{p} -> {t}" for p, t in self.outside])
            )
        if self.special:
            out.append(
                f"project copy: skipped {len(self.special)} special file(s) (FIFOs, "
                "sockets, devices are not files a build reads): "
                + _listed([f"{p} ({k})" for p, k in self.special])
            )
        if self.vcs and vcs:
            out.append(
                "project copy: not copied: "
                + _listed(self.vcs)
                + " (version control: the build gets the checkout's files, not its "
                "history)"
            )
        if self.large:
            out.append(
                f"project copy: copied {len(self.large)} large file(s) ({human(LARGE_FILE)}"
                " or more; every cell copies them): "
                + _listed([f"{p} ({human(n)})" for p, n in self.large])
            )
        return out


class _Walk:
    """One pass over a project tree; with *dest*, copies what a build gets into it."""

    def __init__(self, src: Path, dest: Optional[Path], limit: int) -> None:
        self.src = src
        self.real = os.path.realpath(src)
        self.dest = dest
        self.limit = limit
        self.report = CopyReport()

    def _too_big(self, rel: str, size: int) -> ConfigError:
        return ConfigError(
            f"project file {rel} in {self.src} is {human(size)}, over the {human(self.limit)} "
            "one file copied into a build may be (every cell copies the project); move it out "
            f"of the project, or set {LIMIT_VAR} (e.g. {LIMIT_VAR}=8G)",
            key="--project",
        )

    def run(self) -> CopyReport:
        if self.dest is not None:
            self.dest.mkdir(parents=True)
        self._dir(self.src, "")
        if self.dest is not None:
            st = os.stat(self.src)
            os.utime(self.dest, ns=(st.st_atime_ns, st.st_mtime_ns))
        return self.report

    def _dir(self, folder: Path, rel: str) -> None:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise StepFailed(
                f"cannot read project folder {rel or '.'} in {self.src}: {exc.strerror or exc}"
            ) from None
        for entry in entries:
            name = entry.name
            path = f"{rel}/{name}" if rel else name
            if ignored(name):
                if name in VCS_NAMES:
                    self.report.vcs.append(path)
                continue
            try:
                st = os.lstat(entry.path)
            except FileNotFoundError:  # removed while the copy ran
                continue
            if stat.S_ISLNK(st.st_mode):
                self._link(Path(entry.path), path)
            elif stat.S_ISDIR(st.st_mode):
                if self.dest is not None:
                    (self.dest / path).mkdir()
                self._dir(Path(entry.path), path)
                if self.dest is not None:
                    os.chmod(self.dest / path, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                    os.utime(self.dest / path, ns=(st.st_atime_ns, st.st_mtime_ns))
            elif stat.S_ISREG(st.st_mode):
                self._file(Path(entry.path), path, st.st_size)
            else:
                self.report.special.append((path, _kind(st.st_mode)))

    def _link(self, link: Path, rel: str) -> None:
        target = os.readlink(link)
        resolved = os.path.realpath(link)
        if not is_inside(self.src, link):
            self.report.outside.append((rel, target))
            return
        self.report.links += 1
        if self.dest is not None:
            # Relative to the link's own folder in the copy, whatever the original spelled.
            new = os.path.relpath(resolved, os.path.dirname(os.path.join(self.real, rel)))
            os.symlink(new, self.dest / rel)

    def _file(self, source: Path, rel: str, size: int) -> None:
        if size > self.limit:
            raise self._too_big(rel, size)
        if size >= LARGE_FILE:
            self.report.large.append((rel, size))
        self.report.files += 1
        self.report.size += size
        if self.dest is None:
            return
        try:
            fsrc = open_no_follow(source)
        except OSError as exc:
            raise StepFailed(
                f"cannot read project file {rel} in {self.src}: {exc.strerror or exc}"
            ) from None
        with fsrc:
            st = os.fstat(fsrc.fileno())
            if not stat.S_ISREG(st.st_mode):
                self.report.special.append((rel, _kind(st.st_mode)))
                return
            if st.st_size > self.limit:
                raise self._too_big(rel, st.st_size)
            target = self.dest / rel
            with open(target, "xb") as fdst:
                _copy_data(fsrc.fileno(), fdst.fileno(), st.st_size)
            os.chmod(target, stat.S_IMODE(st.st_mode))
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def open_no_follow(path: Union[str, Path]) -> BinaryIO:
    """*path* opened for reading without following a link or blocking on a FIFO: the entry may
    have changed since a walk saw a regular file there, so the caller checks what it opened
    (``os.fstat``). OSError as :func:`os.open` raises it."""
    return open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb")


def _copy_data(src: int, dst: int, size: int) -> None:
    """*src*'s bytes into *dst*; the holes of a sparse file stay holes (SEEK_DATA/SEEK_HOLE
    where the file system has them), so a mostly-empty disk image costs no disk in the copy."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
            end = os.lseek(src, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from *pos* to the end
                break
            start, end = pos, size  # no SEEK_DATA here: copy everything
        os.lseek(src, start, os.SEEK_SET)
        os.lseek(dst, start, os.SEEK_SET)
        left = end - start
        while left > 0:
            chunk = os.read(src, min(_CHUNK, left))
            if not chunk:  # the file shrank while copied
                left = 0
                break
            os.write(dst, chunk)
            left -= len(chunk)
        pos = end
    os.ftruncate(dst, size)


def copy_sparse(src: str, dst: str) -> str:
    """:func:`shutil.copy2` for ``copytree(copy_function=...)`` that keeps a sparse file's
    holes (the host session's copy of the staged project)."""
    with open(src, "rb") as fsrc, open(dst, "wb") as fdst:
        _copy_data(fsrc.fileno(), fdst.fileno(), os.fstat(fsrc.fileno()).st_size)
    shutil.copystat(src, dst)
    return dst


def check_project_tree(src: Path, env: Mapping[str, str] = os.environ) -> CopyReport:
    """What :func:`copy_project_tree` would copy and leave out, without copying; ConfigError
    (exit 2) for a file over the limit."""
    return _Walk(Path(src), None, file_limit(env)).run()


def copy_project_tree(src: Path, dest: Path, env: Mapping[str, str] = os.environ) -> CopyReport:
    """Copy what a build gets of the project *src* to *dest* (which must not exist): see the
    module docstring for what is left out. Returns the report of what was."""
    return _Walk(Path(src), Path(dest), file_limit(env)).run()
