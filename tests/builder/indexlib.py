"""Small but real pure-Python wheels for the index and publish tests (no compiler needed).

``make_wheel`` writes a PEP 427 wheel with the zipfile machinery: the package module,
``METADATA`` (Metadata-Version 2.1: Name, Version, Requires-Python, Requires-Dist),
``WHEEL`` and a ``RECORD`` with urlsafe-base64 sha256 hashes -- enough for pip to install it
and for twine to upload it.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.utils import canonicalize_name


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    out: Path,
    name: str,
    version: str,
    *,
    requires_python: str | None = None,
    requires_dist: Iterable[str] = (),
    tag: str = "py3-none-any",
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into *out*; importing ``<name>`` gives
    ``VERSION == version``."""
    out.mkdir(parents=True, exist_ok=True)
    dist = canonicalize_name(name).replace("-", "_")
    module = dist
    info = f"{dist}-{version}.dist-info"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        "Summary: test wheel for the builder's index and publish commands",
    ]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires_dist]
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": ("\n".join(meta) + "\n\n").encode(),
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: ampforge-tests\nRoot-Is-Purelib: true\n"
            f"Tag: {tag}\n\n"
        ).encode(),
    }
    record = [f"{n},{_record_hash(d)},{len(d)}" for n, d in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            # Fixed timestamps: the same arguments give the same bytes (stable sha256).
            zf.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d)
    return path
