"""Reproducible wheels: the build's ``SOURCE_DATE_EPOCH`` and a canonical zip layout.

Two builds of one cell from the same inputs must give byte-identical wheels (issue 6). Two
things make that hold:

* **One timestamp for everything.** :func:`resolve_source_date_epoch` picks it, in this order:
  ``--source-date-epoch N``, then the environment's ``SOURCE_DATE_EPOCH``, then the project's
  last commit time (``git log -1 --format=%ct``). A project that is not a git checkout (an
  unpacked sdist, a copied tree) falls back to the newest modification time of the files the
  build sees: that is stable for an unpacked archive or a ``cp -p``/``copytree`` copy and moves
  forward when a file is edited, whereas refusing to build would punish every non-git user
  for a property they can set with one flag. The value goes into the build session's
  environment (setuptools/wheel stamp zip entries with it, gcc's ``__DATE__`` honours it,
  auditwheel uses it when it re-zips), into the input key and into the manifest entry.
* **A canonical archive.** :func:`normalize_wheel` rewrites a finished wheel so that nothing
  but its members' contents and names decides its bytes: member order (package files sorted,
  then ``.dist-info`` sorted with ``RECORD`` last, as the wheel spec asks), every timestamp
  the epoch (clamped to 1980-01-01, the earliest a zip can hold), permissions 0644 / 0755
  (from the executable bit only, never the builder's umask), no directory entries, deflate at
  one fixed level, and ``RECORD`` lines in member order. Contents are never changed, so every
  ``RECORD`` hash stays valid.
"""

from __future__ import annotations

import csv
import fnmatch
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.errors import ConfigError, StepFailed
from builder.projecttree import PROJECT_IGNORE

ENV_VAR = "SOURCE_DATE_EPOCH"
#: The earliest moment a zip (DOS) timestamp can record: 1980-01-01T00:00:00Z.
ZIP_EPOCH_MIN = 315532800
#: The latest one (2107-12-31T23:59:58Z); beyond it zipfile refuses to write.
ZIP_EPOCH_MAX = 4354819198
#: Fixed deflate level: the default of zlib (the same as wheel's and auditwheel's).
COMPRESS_LEVEL = zlib.Z_DEFAULT_COMPRESSION

_DIGITS = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class SourceDateEpoch:
    """The build's timestamp and where it came from (shown to the user and in the manifest)."""

    value: int
    origin: str  # e.g. "--source-date-epoch", "environment SOURCE_DATE_EPOCH", "git: last commit"

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.value))
        return f"{self.value} ({when}, {self.origin})"


def parse_epoch(text: str, source: str) -> int:
    """*text* as whole seconds since 1970; ConfigError (exit 2) naming *source* otherwise."""
    value = text.strip()
    if not _DIGITS.match(value):
        raise ConfigError(
            f"{source}={text!r} is not a valid source date epoch; expected a whole "
            "number of seconds since 1970-01-01 UTC, e.g. the output of "
            "`git log -1 --format=%ct`",
            key=source,
        )
    number = int(value)
    if number > ZIP_EPOCH_MAX:
        raise ConfigError(
            f"{source}={text!r} is after 2107-12-31, the last date a zip archive "
            "can hold; expected seconds since 1970-01-01 UTC",
            key=source,
        )
    return number


def git_commit_time(project: Path) -> Optional[int]:
    """The committer time of the last commit of the git checkout *project* is in; None when it
    is not in one (or has no commits, or git is missing)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        out = subprocess.run(
            [git, "-C", str(project), "log", "-1", "--format=%ct"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return int(value) if out.returncode == 0 and _DIGITS.match(value) else None


def project_ignored(rel: Path) -> bool:
    """The files a build never sees (builder.projecttree.PROJECT_IGNORE): no build output or
    cache moves the epoch."""
    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in PROJECT_IGNORE)


def newest_mtime(project: Path, ignore: Callable[[Path], bool]) -> Optional[int]:
    """The newest modification time (whole seconds) of the files under *project* that *ignore*
    keeps, or None when there is none."""
    newest: Optional[int] = None
    for dirpath, dirnames, filenames in os.walk(project):
        rel_dir = Path(dirpath).relative_to(project)
        dirnames[:] = [d for d in dirnames if not ignore(rel_dir / d)]
        for name in filenames:
            if ignore(rel_dir / name):
                continue
            st = os.lstat(os.path.join(dirpath, name))
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                continue  # a FIFO, socket or device: never copied into a build
            mtime = int(st.st_mtime)
            newest = mtime if newest is None else max(newest, mtime)
    return newest


def resolve_source_date_epoch(
    project: Path,
    *,
    flag: Optional[str],
    env: Mapping[str, str],
    ignore: Optional[Callable[[Path], bool]] = None,
) -> SourceDateEpoch:
    """The build's ``SOURCE_DATE_EPOCH``: the flag, else the environment, else the project's
    last commit, else the newest file in it (see the module docstring for why)."""
    if flag is not None:
        return SourceDateEpoch(parse_epoch(flag, "--source-date-epoch"), "--source-date-epoch")
    if env.get(ENV_VAR, "").strip():
        return SourceDateEpoch(
            parse_epoch(env[ENV_VAR], f"environment {ENV_VAR}"), f"environment {ENV_VAR}"
        )
    committed = git_commit_time(project)
    if committed is not None:
        return SourceDateEpoch(committed, "the project's last git commit")
    newest = newest_mtime(project, ignore or project_ignored)
    if newest is not None:
        return SourceDateEpoch(
            newest, "not a git checkout (or git cannot read it): the newest file in the project"
        )
    raise ConfigError(
        f"cannot choose a source date epoch for {project}: it is not a git "
        "checkout and holds no files; pass --source-date-epoch N or set "
        f"{ENV_VAR}",
        key="--source-date-epoch",
    )


# ------------------------------------------------------------------------- the archive


def zip_date_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    """*epoch* as a zip member's (UTC) date_time, clamped to what a zip can hold."""
    clamped = min(max(epoch, ZIP_EPOCH_MIN), ZIP_EPOCH_MAX)
    return tuple(time.gmtime(clamped)[:6])  # type: ignore[return-value]


def _is_dist_info(name: str) -> bool:
    top = name.split("/", 1)[0]
    return top.endswith(".dist-info") and "/" in name


def member_order(names: list[str]) -> list[str]:
    """Package files sorted, then ``*.dist-info/*`` sorted with ``RECORD`` last."""

    def key(name: str) -> tuple[int, int, str]:
        info = _is_dist_info(name)
        return (int(info), int(info and name.endswith("/RECORD")), name)

    return sorted(names, key=key)


def _mode(external_attr: int) -> int:
    """0755 for a member with any executable bit, 0644 otherwise (regular file type)."""
    perms = (external_attr >> 16) & 0o777
    return 0o100755 if perms & 0o111 else 0o100644


def _record_text(record: bytes, order: list[str], wheel: str) -> bytes:
    """RECORD's lines in member order (its own line last); every hash kept as it was."""
    lines = [line for line in record.decode("utf-8").splitlines() if line.strip()]
    by_path = {next(csv.reader([line]))[0]: line for line in lines}
    if set(by_path) != set(order):
        extra = sorted(set(by_path) - set(order))[:5]
        missing = sorted(set(order) - set(by_path))[:5]
        raise StepFailed(
            f"{wheel}: RECORD does not match the archive (listed but absent: "
            f"{extra}; present but not listed: {missing}); not a valid wheel"
        )
    return ("\n".join(by_path[n] for n in order) + "\n").encode("utf-8")


def normalize_wheel(wheel: Path, epoch: int) -> bool:
    """Rewrite *wheel* in place into the canonical layout (module docstring); True when its
    bytes changed. The rewrite goes to a temporary file next to it and is renamed over it, so
    an interruption never leaves a half-written wheel."""
    date_time = zip_date_time(epoch)
    with zipfile.ZipFile(wheel) as src:
        infos = {i.filename: i for i in src.infolist() if not i.is_dir()}
        order = member_order(list(infos))
        records = [n for n in order if _is_dist_info(n) and n.endswith("/RECORD")]
        if len(records) != 1:
            raise StepFailed(f"{wheel.name}: expected one .dist-info/RECORD, found {records}")
        fd, tmp = tempfile.mkstemp(prefix=".normalize-", suffix=".whl", dir=wheel.parent)
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w") as dst:
                for name in order:
                    data = src.read(infos[name])
                    if name == records[0]:
                        data = _record_text(data, order, wheel.name)
                    member = zipfile.ZipInfo(name, date_time=date_time)
                    member.create_system = 3  # Unix: the permission bits below are read
                    member.external_attr = _mode(infos[name].external_attr) << 16
                    member.compress_type = zipfile.ZIP_DEFLATED
                    dst.writestr(
                        member,
                        data,
                        compress_type=zipfile.ZIP_DEFLATED,
                        compresslevel=COMPRESS_LEVEL,
                    )
            changed = Path(tmp).read_bytes() != wheel.read_bytes()
            if changed:
                os.chmod(tmp, os.stat(wheel).st_mode & 0o777)
                os.replace(tmp, wheel)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return changed
