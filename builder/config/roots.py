"""Where the builder's data lives: a checkout's repository root, or the wheel's copy of configs/
and docker/. A leaf module (it imports nothing of builder's) so that any part of builder.config
can read it without importing model.py, which imports most of them."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: Installed from the ampforge-builder wheel (builder-dist/), the package carries its own copy of
#: the repository's configs/ and docker/ here; a checkout has no such folder.
INSTALLED_DATA = _PACKAGE_DIR / "_data"
INSTALLED = INSTALLED_DATA.is_dir()
#: Where configs/ and docker/ are: the repository (a checkout), or the wheel's copy of them.
REPO_ROOT = INSTALLED_DATA if INSTALLED else _PACKAGE_DIR.parent
