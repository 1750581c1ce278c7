"""Small but real pure-Python wheels for the index and publish tests (no compiler needed).

``make_wheel`` writes a PEP 427 wheel with the zipfile machinery: the package module,
``METADATA`` (Metadata-Version 2.1: Name, Version, Requires-Python, Requires-Dist),
``WHEEL`` and a ``RECORD`` with urlsafe-base64 sha256 hashes -- enough for pip to install it
and for twine to upload it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
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
    # A description and its type: what `twine check --strict` (run by publish) requires.
    meta.append("Description-Content-Type: text/markdown")
    meta += [f"Requires-Dist: {r}" for r in requires_dist]
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": ("\n".join(meta) + f"\n\n# {name}\n\nA test wheel.\n").encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: ampforge-tests\nRoot-Is-Purelib: true\nTag: {tag}\n\n"
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


# ------------------------------------------------------------------ pip in a fresh venv


def clean_pip_env(**extra: str) -> dict[str, str]:
    """This process's environment without pip settings or proxies: pip then sees only the
    index a test names (no machine-wide extra index, find-links or constraints), and
    127.0.0.1 is reached directly."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("PIP_", "TWINE_")) and not k.lower().endswith("_proxy")
    }
    # pip skips every configuration file (global ones too) when this is os.devnull.
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def fresh_venv(path: Path, *, see_outer_packages: bool = False) -> Path:
    """A venv without pip (pip runs from outside with ``--python``: seconds saved per venv).

    ``see_outer_packages`` adds this interpreter's site-packages through a ``.pth`` file, so
    the venv already has the real torch of the test environment, installed once, not copied.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    if see_outer_packages:
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(purelib, "_outer_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def pip_in(python: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``pip --python <venv python> ARGS`` with a clean environment; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        env=clean_pip_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def installed_version(python: Path, dist: str) -> str:
    """The version of *dist* installed in the venv of *python*, as its metadata says."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    return subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
