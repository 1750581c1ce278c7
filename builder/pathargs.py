"""Every path a command takes on its command line, checked before the command runs.

A path argument names what it must be (:data:`PATH_ARGUMENTS`, one table for every command, so
``tests/builder/unit/test_path_arguments.py`` can walk the parser's own options and find any path
option missing from it). A wrong one -- a folder where a file is expected or the reverse, a
missing file or folder to read, a path through a file, a place that cannot be written, a name
with control characters or bytes that are not UTF-8 -- is bad usage: exit 2 with
one line naming the option, what the path is, and what was expected. Without this, each of them
surfaced as a Python traceback from wherever the command first touched the path.

Names with spaces (or any other printable character) are fine; control characters (a newline,
a tab) and undecodable bytes are refused because the builder writes paths into logs, manifests
and rendered files line by line, where they would split or corrupt a record.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional, Union

from builder.errors import ConfigError

#: What a path argument must be:
#: ``file``: an existing file, read;  ``file-update``: an existing file, rewritten in place;
#: ``file-out``: a file to write (its folders made if missing, as for
#: ``.github/workflows/wheels.yml`` in a new project; never a folder itself);
#: ``dir``: an existing folder;  ``dir-out``: a folder to write into (made with its parents
#: if missing; never a file, nor under one);  ``dir-or-new``: a folder that may not exist yet,
#: only read (never a file, nor under one).
Kind = str
KINDS = ("file", "file-update", "file-out", "dir", "dir-out", "dir-or-new")

#: (command, argparse dest) -> its kind, or a function of the parsed arguments giving it (one
#: option whose meaning depends on another: ``render --out`` is a file with ``--ci``).
PATH_ARGUMENTS: dict[tuple[str, str], Union[Kind, Callable[[argparse.Namespace], Kind]]] = {
    **{(cmd, "config"): "file" for cmd in ("plan", "render", "build", "fetch", "doctor")},
    **{(cmd, "ca_bundle"): "file" for cmd in ("plan", "render", "build", "fetch", "doctor")},
    **{(cmd, "project"): "dir" for cmd in ("plan", "render", "build", "fetch")},
    ("plan", "out"): "dir-or-new",
    ("render", "out"): lambda args: "file-out" if getattr(args, "ci", None) else "dir-out",
    ("build", "out"): "dir-out",
    ("build", "work_dir"): "dir-out",
    ("build", "wheelhouse"): "dir",
    ("build", "bundle"): "dir",
    ("base-image", "tools_wheelhouse"): "dir",
    ("fetch", "bundle"): "dir-out",
    ("fetch", "find_links"): "dir",
    ("index", "dist"): "dir",
    ("index", "out"): "dir-out",
    ("publish", "dist"): "dir",
    ("publish", "config"): "file",
    ("publish", "stage"): "dir-out",
    ("merge", "dirs"): "dir",
    ("merge", "out"): "dir-out",
    ("doctor", "work_dir"): "dir-out",
    ("update-images", "config"): "file-update",
}

#: The metavars that mark an option as a path (the test holds every such option to the table).
PATH_METAVARS = frozenset({"DIR", "FILE", "PATH", "PEM", "DIST", "RELEASE"})

_EXPECTED = {
    "file": "an existing file",
    "file-update": "an existing file this user can rewrite",
    "file-out": "a file to write (its folders are made if missing)",
    "dir": "an existing folder",
    "dir-out": "a folder to write into (made if missing)",
    "dir-or-new": "a folder (it need not exist yet)",
}


def shown(path: str) -> str:
    """*path* as an error message can print it: as given when printable, else escaped."""
    if path.isprintable() and not _undecodable(path):
        return path
    return ascii(path)


def _undecodable(path: str) -> bool:
    # argv bytes that are not UTF-8 arrive as lone surrogates (PEP 383).
    return any("\udc80" <= ch <= "\udcff" for ch in path)


def problem(path: str, kind: Kind) -> Optional[str]:
    """What is wrong with *path* as a *kind* argument (``None``: nothing)."""
    if path == "":
        return "is empty"
    if _undecodable(path):
        return "has bytes that are not UTF-8"
    if not path.isprintable():
        return "has a control character (a newline, a tab, ...)"
    p = Path(path)
    through = _file_above(p)
    if through is not None:
        return f"runs through {shown(str(through))}, which is a file, not a folder"
    if kind in ("file", "file-update"):
        if p.is_dir():
            return "is a folder"
        if not p.exists():
            return "does not exist"
        if not os.access(p, os.R_OK):
            return "cannot be read by this user"
        if kind == "file-update" and not os.access(p, os.W_OK):
            return "cannot be written by this user"
        return None
    if kind == "file-out":
        if p.is_dir() or path.endswith("/"):
            return "is a folder"
        existing = _nearest_existing(p.parent)
        if not os.access(existing, os.W_OK | os.X_OK):
            return f"cannot be written by this user ({shown(str(existing))})"
        return None
    if p.exists() and not p.is_dir():
        return "is a file"
    if kind == "dir":
        if not p.exists():
            return "does not exist"
        if not os.access(p, os.R_OK | os.X_OK):
            return "cannot be read by this user"
        return None
    if kind == "dir-out":
        existing = _nearest_existing(p)
        if not os.access(existing, os.W_OK | os.X_OK):
            return f"cannot be written by this user ({shown(str(existing))})"
    return None


def _file_above(p: Path) -> Optional[Path]:
    """The first ancestor of *p* that exists and is not a folder (a path through a file)."""
    for parent in reversed(p.parents):
        if str(parent) in ("", "."):
            continue
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def _nearest_existing(p: Path) -> Path:
    for candidate in (p, *p.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _values(value: object) -> Iterator[str]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _values(item)
    elif isinstance(value, (str, os.PathLike)):
        yield os.fspath(value)


def check_path_arguments(command: str, args: argparse.Namespace, options: dict[str, str]) -> None:
    """Raise :class:`ConfigError` (exit 2) for the first wrong path argument of *command*.
    *options* maps an argparse dest to the option's spelling in messages (``--out``)."""
    for (cmd, dest), kind in PATH_ARGUMENTS.items():
        if cmd != command:
            continue
        value = getattr(args, dest, None)
        if value is None:
            continue
        want = kind(args) if callable(kind) else kind
        for path in _values(value):
            why = problem(path, want)
            if why is not None:
                name = options.get(dest, dest.upper())
                raise ConfigError(
                    f"{shown(path)} {why}; expected {_EXPECTED[want]}", key=f"command line {name}"
                )
