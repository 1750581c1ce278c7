"""PEP 517 backend of ampforge-builder (see pyproject.toml beside this file).

It zips the repository's ``builder/`` package (no caches), the repository's ``configs/`` and
``docker/`` as ``builder/_data/`` (``builder.config.roots`` finds them there when installed), and
the metadata: name, the builder's version, Requires-Dist from pyproject.toml's ``builder``
extra, and the ``ampforge-build`` console script. Member order and times are fixed, so the
same tree gives the same wheel bytes (``SOURCE_DATE_EPOCH`` sets the time; default 1980-01-01).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAME = "ampforge_builder"
DATA_DIRS = ("configs", "docker")
SUMMARY = "Containerized manylinux wheel builder for PyTorch C++ extensions (ampforge)"
SCRIPT = "ampforge-build = builder.cli:main"


def _version() -> str:
    text = (REPO / "builder" / "__init__.py").read_text()
    m = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    if m is None:
        raise RuntimeError(f"no __version__ in {REPO / 'builder' / '__init__.py'}")
    return m.group(1)


def _requirements() -> list[str]:
    sys.path.insert(0, str(REPO))
    try:
        from builder.lockfile import project_requirements  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    return project_requirements(REPO / "pyproject.toml")


def _files() -> list[tuple[str, Path]]:
    """(archive name, source) of every packaged file, sorted."""
    out = []
    for path in sorted((REPO / "builder").rglob("*")):
        rel = path.relative_to(REPO)
        if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
            out.append((rel.as_posix(), path))
    for folder in DATA_DIRS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file():
                out.append((f"builder/_data/{path.relative_to(REPO).as_posix()}", path))
    return sorted(out)


def _metadata(version: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        "Name: ampforge-builder",
        f"Version: {version}",
        f"Summary: {SUMMARY}",
        "License: BSD-3-Clause",
        "Requires-Python: >=3.9",
    ]
    lines += [f"Requires-Dist: {r}" for r in _requirements()]
    return "\n".join(lines) + "\n"


def _dist_info(version: str) -> dict[str, str]:
    return {
        "METADATA": _metadata(version),
        "WHEEL": "Wheel-Version: 1.0\nGenerator: ampforge-builder wheelbackend\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
        "entry_points.txt": f"[console_scripts]\n{SCRIPT}\n",
    }


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _date_time() -> tuple[int, int, int, int, int, int]:
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    return tuple(time.gmtime(max(epoch, 315532800))[:6])  # type: ignore[return-value]


def build_wheel(
    wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None
) -> str:
    version = _version()
    name = f"{NAME}-{version}-py3-none-any.whl"
    info = f"{NAME}-{version}.dist-info"
    when = _date_time()
    members = [
        (arc, src.read_bytes(), 0o755 if os.access(src, os.X_OK) else 0o644)
        for arc, src in _files()
    ]
    members += [(f"{info}/{k}", v.encode(), 0o644) for k, v in sorted(_dist_info(version).items())]
    record = [_record_line(arc, data) for arc, data, _ in members] + [f"{info}/RECORD,,"]
    members.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    target = Path(wheel_directory) / name
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arc, data, mode in members:
            entry = zipfile.ZipInfo(arc, date_time=when)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
    os.replace(tmp, target)
    return name


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


def build_sdist(sdist_directory: str, config_settings: dict | None = None) -> str:
    # The package is a folder outside this one (the repository's builder/): an sdist of this
    # folder alone could not rebuild it. The wheel is the distribution.
    raise RuntimeError(
        "ampforge-builder is built as a wheel from the repository "
        "(pip wheel ./builder-dist); it has no sdist"
    )
