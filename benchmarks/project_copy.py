"""A private copy of the project for the build benchmarks: they edit a kernel or force
rebuilds without touching the checkout (imported by the scripts next to it)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What a wheel build of this repository reads.
PROJECT_FILES = ("amp", "kernels", "setup.py", "pyproject.toml", "README.md", "LICENSE")


def copy_project(dest: Path, source: Path = ROOT, names: Iterable[str] = PROJECT_FILES) -> Path:
    """Copy *names* from *source* into *dest* (created), leaving caches and built modules out."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def copy_project_at(rev: str, dest: Path, names: Iterable[str] = PROJECT_FILES) -> Path:
    """The project's files as of git revision *rev* of this repository, into *dest* (created):
    the "before" side of a before/after benchmark, built by today's builder."""
    wanted = list(names)
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, *wanted],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        raise SystemExit(f"project_copy: git revision {rev!r}: {listed.stderr.strip()}")
    present = listed.stdout.split()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, *present],
        capture_output=True,
        check=True,
    )
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest
