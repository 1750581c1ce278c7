"""Wheels that arrive from elsewhere -- CI runners' artifacts into ``merge``, a ``dist/`` folder
given to ``index`` or ``publish``, a wheelhouse -- checked for what a broken or malicious one
can hold, before anything is written from them.

:func:`member_problems` is cheap (the zip's central directory only) and runs on every wheel the
builder takes in, torch's included: members named with ``..`` or an absolute path (a writer
that unpacks them lands outside its folder), symlinks, the same name twice (which copy an
installer takes is up to it), declared sizes that unpack to gigabytes (a zip bomb).
:func:`release_problems` adds what a wheel the builder releases must also satisfy, reading every
member once, in chunks: the file name parses, the ``.dist-info`` folder and METADATA name the
same project and version, and RECORD lists every member with its true sha256 and size.
"""

from __future__ import annotations

import base64
import hashlib
import stat
import zipfile
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)

#: Uncompressed bytes a release wheel may declare in all (amp's is a few MB; torch's own is
#: ~2 GB and is never released by the builder).
RELEASE_UNPACKED_LIMIT = 1 << 30
#: For any wheel taken in: a member that declares more than this many times its compressed
#: size and more than MIN_BOMB bytes is a zip bomb, not a library.
BOMB_RATIO = 1000
MIN_BOMB = 64 << 20
_CHUNK = 1 << 20


def _unsafe_name(name: str) -> str | None:
    if "\\" in name:
        return "a backslash in its name"
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in path.parts:
        return "a '..' segment (it would unpack outside its folder)"
    if not name or any(not ch.isprintable() for ch in name):
        return "a control character in its name"
    return None


def member_problems(zf: zipfile.ZipFile) -> list[str]:
    """What the members of *zf* hold that no installer should be handed (see the module)."""
    problems: list[str] = []
    seen: set[str] = set()
    for info in zf.infolist():
        name = info.filename
        why = _unsafe_name(name)
        if why is not None:
            problems.append(f"entry {name!r}: {why}")
        if stat.S_ISLNK(info.external_attr >> 16):
            problems.append(f"entry {name!r}: a symbolic link")
        if name in seen:
            problems.append(f"entry {name!r}: listed twice")
        seen.add(name)
        if info.file_size > MIN_BOMB and info.file_size > BOMB_RATIO * max(info.compress_size, 1):
            problems.append(
                f"entry {name!r}: unpacks to {info.file_size} bytes from "
                f"{info.compress_size} (a zip bomb)"
            )
    return problems


def _record_digest(data_hash: hashlib._Hash) -> str:
    return "sha256=" + base64.urlsafe_b64encode(data_hash.digest()).rstrip(b"=").decode()


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[str, int] | None:
    """(RECORD-style sha256, size) of a member, reading at most its declared size plus one
    chunk (a member whose data is longer than its header says is not read to the end)."""
    digest = hashlib.sha256()
    size = 0
    with zf.open(info) as fh:
        while chunk := fh.read(_CHUNK):
            size += len(chunk)
            if size > info.file_size:
                return None
            digest.update(chunk)
    return _record_digest(digest), size


def release_problems(path: Path) -> list[str]:
    """Every reason *path* must not be released (merged, indexed, published); [] if none."""
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        return [f"its file name does not parse as a wheel's ({exc})"]
    try:
        with zipfile.ZipFile(path) as zf:
            problems = member_problems(zf)
            if problems:
                return problems  # nothing below reads such members
            declared = sum(i.file_size for i in zf.infolist())
            if declared > RELEASE_UNPACKED_LIMIT:
                return [
                    f"it declares {declared} bytes unpacked (more than "
                    f"{RELEASE_UNPACKED_LIMIT}: not a wheel this builder makes)"
                ]
            return _metadata_problems(zf, name, str(version)) + _record_problems(zf)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return [f"not a readable zip ({exc})"]


def _dist_info(zf: zipfile.ZipFile) -> list[str]:
    return sorted(
        {n.split("/", 1)[0] for n in zf.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    )


def _metadata_problems(zf: zipfile.ZipFile, name: str, version: str) -> list[str]:
    folders = _dist_info(zf)
    if len(folders) != 1:
        return [
            f"it holds {len(folders)} .dist-info folders ({', '.join(folders) or 'none'}); "
            "expected one"
        ]
    folder = folders[0]
    stem = folder[: -len(".dist-info")]
    dist_name, _, dist_version = stem.rpartition("-")
    problems = []
    if (canonicalize_name(dist_name), canonicalize_version(dist_version)) != (
        canonicalize_name(name),
        canonicalize_version(version),
    ):
        problems.append(
            f"its {folder}/ names another project or version than its file name ({name} {version})"
        )
    try:
        meta = HeaderParser().parsestr(zf.read(f"{folder}/METADATA").decode("utf-8", "replace"))
    except KeyError:
        return [*problems, f"{folder}/METADATA is missing"]
    if (canonicalize_name(meta.get("Name", "")), canonicalize_version(meta.get("Version", ""))) != (
        canonicalize_name(name),
        canonicalize_version(version),
    ):
        problems.append(
            f"{folder}/METADATA says {meta.get('Name')!r} {meta.get('Version')!r}, "
            f"its file name {name} {version}"
        )
    return problems


def _record_problems(zf: zipfile.ZipFile) -> list[str]:
    (folder,) = _dist_info(zf)
    record_name = f"{folder}/RECORD"
    try:
        lines = zf.read(record_name).decode("utf-8", "replace").splitlines()
    except KeyError:
        return [f"{record_name} is missing"]
    listed: dict[str, tuple[str, str]] = {}
    for line in lines:
        if not line.strip():
            continue
        entry, _, rest = line.rpartition(",")  # path,hash,size: the path may hold commas
        entry, _, digest = entry.rpartition(",")
        listed[entry] = (digest, rest)
    problems = []
    infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}
    for member, info in infos.items():
        signature = member.startswith(folder + "/") and member.endswith((".jws", ".p7s"))
        if member == record_name or signature:  # RECORD cannot list itself or its signatures
            continue
        if member not in listed:
            problems.append(f"entry {member!r} is not in {record_name}")
            continue
        digest, size = listed[member]
        got = _read_member(zf, info)
        if got is None:
            problems.append(f"entry {member!r} holds more data than its header declares")
        elif digest and (got[0] != digest or (size and str(got[1]) != size)):
            problems.append(
                f"entry {member!r}: {record_name} records {digest} ({size} bytes), "
                f"the file is {got[0]} ({got[1]} bytes)"
            )
    for member in sorted(set(listed) - set(infos)):
        problems.append(f"{record_name} lists {member!r}, which the wheel does not hold")
    return problems
