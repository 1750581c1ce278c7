"""A private copy of the project for the build benchmarks: they edit a kernel or force
rebuilds without touching the checkout (imported by the scripts next to it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What a wheel build of this repository reads.
PROJECT_FILES = ("amp", "kernels", "setup.py", "pyproject.toml", "README.md")


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
