"""The wheels of a ``dist/`` folder, checked against ``dist/manifest.json`` before release.

``index`` and ``publish`` hand out what ``build`` made; a file that changed after it was
recorded (or was dropped in by hand) must not be released under the manifest's name. When a
manifest is present, every wheel in the folder must be listed in it with the same sha256;
a folder without a manifest (wheels gathered by hand) is taken as it is, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.errors import ConfigError, StepFailed
from builder.release.manifest import MANIFEST_NAME, read_manifest, sha256_file
from builder.wheel.untrusted import release_problems


@dataclass(frozen=True)
class DistWheels:
    dist: Path
    wheels: tuple[Path, ...]  # sorted by name
    sha256: dict[str, str]  # file name -> hex digest, as computed now
    checked: bool  # True when a manifest was present and every wheel matched it
    notes: tuple[str, ...]


def dist_wheels(dist: Path) -> DistWheels:
    """The ``*.whl`` files directly in *dist*, verified against its manifest if it has one.

    Raises ConfigError (exit 2) when *dist* is not a folder or holds no wheel, and StepFailed
    (exit 1) naming every wheel whose sha256 differs from the manifest or that the manifest
    does not list.
    """
    dist = Path(dist)
    if not dist.is_dir():
        raise ConfigError(
            f"{dist}: no such directory; expected a folder of wheels such as "
            "dist/ (make wheel writes one)"
        )
    # Hidden names are dist/'s own in-flight temporary files (manifest.publish_wheel).
    wheels = tuple(
        sorted(
            p
            for p in dist.iterdir()
            if p.suffix == ".whl" and p.is_file() and not p.name.startswith(".")
        )
    )
    if not wheels:
        raise ConfigError(
            f"{dist}: no *.whl files in it; nothing to release "
            f"(build some with `make wheel OUT={dist}`)"
        )
    # Wheels from elsewhere (CI runners' artifacts, a folder copied in): refused before
    # anything is written from them, naming the file and the entry.
    hostile = {w.name: release_problems(w) for w in wheels}
    hostile = {name: why for name, why in hostile.items() if why}
    if hostile:
        raise StepFailed(
            f"{dist}: {len(hostile)} wheel(s) refused before anything was written:\n  "
            + "\n  ".join(
                f"{name}: {line}" for name, why in sorted(hostile.items()) for line in why[:5]
            )
        )
    sha = {w.name: sha256_file(w) for w in wheels}
    if not (dist / MANIFEST_NAME).exists():
        return DistWheels(
            dist,
            wheels,
            sha,
            checked=False,
            notes=(f"{dist / MANIFEST_NAME} not found: sha256 sums not cross-checked",),
        )
    recorded: dict[str, str] = {}
    for entry in read_manifest(dist)["wheels"]:
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            recorded[entry["file"]] = str(entry.get("sha256"))
    problems = []
    for name, digest in sha.items():
        want = recorded.get(name)
        if want is None:
            problems.append(f"{name}: not listed in {MANIFEST_NAME}")
        elif want != digest:
            problems.append(f"{name}: sha256 {digest} but {MANIFEST_NAME} records {want}")
    if problems:
        raise StepFailed(
            f"{dist}: {len(problems)} wheel(s) do not match {dist / MANIFEST_NAME}; refusing to "
            "release them (rebuild them, or remove files that were not built here):\n  "
            + "\n  ".join(problems)
        )
    missing = sorted(set(recorded) - set(sha))
    notes = tuple(f"{name}: listed in {MANIFEST_NAME} but not in {dist}" for name in missing)
    return DistWheels(dist, wheels, sha, checked=True, notes=notes)
