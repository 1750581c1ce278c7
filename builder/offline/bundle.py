"""Offline bundles: a folder that carries everything an air-gapped build needs.

Layout (made by ``python -m builder fetch --bundle DIR``, read by ``build --bundle DIR``)::

    DIR/bundle.json       what is in the bundle: every file with sha256 and size, the cells
                          it serves, the base images' refs and ids
    DIR/wheels/*.whl      torch, its dependencies and the build tools, for every cell
    DIR/images/*.tar      base images (``docker save``)
    DIR/builder-wheels/*.whl  the builder's own pinned environment (builder/requirements.lock)
                          for the builder's Python and platform: the air-gapped machine sets
                          the builder up from them (``python -m builder.lockfile install
                          --bundle DIR``, no index)

``bundle.json`` is written last, atomically, and removed *before* a re-fetch changes anything:
a bundle whose fetch was interrupted has no ``bundle.json`` at all (and is refused), never one
that describes other files than those present. A build verifies every sha256 before it uses
the bundle, and refuses wheels that ``bundle.json`` does not list (pip would use them).
"""

from __future__ import annotations

import contextlib
import json
import re
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Optional

# One atomic-write routine for every file the builder publishes (builder.release.manifest's).
from builder.atomicfile import atomic_replace, atomic_write
from builder.config.pins import parse_ref
from builder.errors import ConfigError, StepFailed
from builder.release.manifest import sha256_file

BUNDLE_FILE = "bundle.json"
WHEELS_DIR = "wheels"
IMAGES_DIR = "images"
BUILDER_WHEELS_DIR = "builder-wheels"
FORMAT = 1


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the bundle, posix: "wheels/torch-....whl", "images/....tar"
    sha256: str
    size: int
    cells: tuple[str, ...] = ()  # the cells that need it (a wheel no cell needs: ())


@dataclass(frozen=True)
class BundleImage:
    ref: str  # the tag `docker load` restores
    image_id: str
    file: str  # relative path of the tarball (also listed in files)
    arch: str  # X86 | ARM
    cells: tuple[str, ...] = ()
    pin: str = ""  # the config's pinned ref (repo:tag@sha256:...) it was saved from, if any


@dataclass(frozen=True)
class BundleCell:
    id: str
    arch: str
    python: str
    machine: str
    plat: str
    torch: str
    image: str


@dataclass
class Bundle:
    root: Path
    files: list[BundleFile] = field(default_factory=list)
    images: list[BundleImage] = field(default_factory=list)
    cells: list[BundleCell] = field(default_factory=list)
    builder_version: str = ""
    created: str = ""
    #: {"python", "platform", "lock_sha256", "wheels": [{"name", "version", "file"}]}: the
    #: builder's own environment (None in a bundle made before it was carried).
    builder: Optional[dict[str, Any]] = None

    @property
    def wheels(self) -> Path:
        return self.root / WHEELS_DIR

    @property
    def builder_wheels(self) -> Path:
        return self.root / BUILDER_WHEELS_DIR

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "builder_version": self.builder_version,
            "created": self.created,
            "cells": [asdict(c) for c in self.cells],
            # "pin" only for a pinned image: an unpinned one's entry reads as it always did
            "images": [
                {k: v for k, v in asdict(i).items() if k != "pin" or v} for i in self.images
            ],
            "files": [asdict(f) for f in self.files],
            **({"builder": self.builder} if self.builder is not None else {}),
        }

    def image_for(self, arch: str) -> Optional[BundleImage]:
        return next((i for i in self.images if i.arch == arch), None)


def safe_name(ref: str) -> str:
    """A file name for an image ref: ``ampforge/base:x`` -> ``ampforge_base_x``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref).strip("_") or "image"


def bundle_json(root: Path) -> Path:
    return root / BUNDLE_FILE


def read_bundle(root: Path) -> Bundle:
    """The bundle at *root*; ConfigError (exit 2) naming what is wrong when it is not one."""
    path = bundle_json(root)
    if not root.is_dir():
        raise ConfigError(
            f"offline bundle {root} is not a directory; expected a folder made by "
            "`python -m builder fetch --bundle DIR`",
            key="--bundle",
        )
    if not path.is_file():
        raise ConfigError(
            f"{path} not found: {root} is not a finished bundle (a fetch that was "
            "interrupted leaves none); run `python -m builder fetch --bundle "
            f"{root}` again on a connected machine",
            key="--bundle",
        )
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
        return Bundle(
            root=root,
            files=[
                BundleFile(f["path"], f["sha256"], int(f["size"]), tuple(f.get("cells", ())))
                for f in doc["files"]
            ],
            images=[
                BundleImage(
                    i["ref"],
                    i["image_id"],
                    i["file"],
                    i["arch"],
                    tuple(i.get("cells", ())),
                    str(i.get("pin", "")),
                )
                for i in doc["images"]
            ],
            cells=[BundleCell(**c) for c in doc["cells"]],
            builder_version=str(doc.get("builder_version", "")),
            created=str(doc.get("created", "")),
            builder=dict(doc["builder"]) if doc.get("builder") is not None else None,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} is not a valid bundle description ({exc}); fetch the bundle again",
            key="--bundle",
        ) from exc


def verify_bundle(bundle: Bundle, say: Callable[[str], None] = lambda _m: None) -> None:
    """Every listed file present with its size and sha256, and no unlisted wheel."""
    bad = []
    for f in bundle.files:
        path = bundle.root / f.path
        outside = _outside_problem(bundle.root, f.path)
        if outside is not None:
            bad.append(f"bundle.json lists {f.path!r}: {outside}")
        elif not path.is_file():
            bad.append(f"{path} is missing")
        elif path.stat().st_size != f.size:
            bad.append(f"{path} has {path.stat().st_size} bytes, bundle.json says {f.size}")
        elif sha256_file(path) != f.sha256:
            bad.append(f"{path} does not match its sha256 in bundle.json (corrupted or altered)")
    listed = {f.path for f in bundle.files}
    bad += [
        f"image {i.ref}: its file {i.file!r} is not a listed file of bundle.json"
        for i in bundle.images
        if i.file not in listed
    ]
    for folder in (bundle.wheels, bundle.builder_wheels):
        for extra in sorted(folder.glob("*.whl")) if folder.is_dir() else ():
            if f"{folder.name}/{extra.name}" not in listed:
                bad.append(
                    f"{extra} is not listed in bundle.json (pip would install it "
                    "unverified); remove it or fetch again"
                )
    if bad:
        raise ConfigError(
            "offline bundle failed verification:\n  " + "\n  ".join(bad), key="--bundle"
        )
    say(f"verified {len(bundle.files)} files (sha256) in {bundle.root}")


#: The folders of a bundle its listed files may be in.
_BUNDLE_FOLDERS = (WHEELS_DIR, BUILDER_WHEELS_DIR, IMAGES_DIR)


def _outside_problem(root: Path, rel: str) -> Optional[str]:
    """Why the listed path *rel* is not a plain file of the bundle at *root* (None: it is).

    A bundle arrives from another machine: a listed path that climbs out of it, a symlink or
    a hard link (whose content another name can change after the sha256 was checked), a device
    or a FIFO would make the builder read, or pip install, something the bundle never held."""
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts or "\\" in rel:
        return "not a path inside the bundle"
    if len(parts) != 2 or parts[0] not in _BUNDLE_FOLDERS:
        return f"expected a file directly in one of {', '.join(_BUNDLE_FOLDERS)}/"
    folder, path = root / parts[0], root / rel
    for link in (folder, path):
        if link.is_symlink():
            return f"{link} is a symbolic link (copy the bundle with its files, not links)"
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None  # reported as missing
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_nlink > 1:
        return (
            f"{path} is a hard link ({st.st_nlink} names): copy the bundle with its files "
            "(cp -r), not links"
        )
    return None


def begin_fetch(root: Path) -> dict[str, str]:
    """Before a (re-)fetch touches anything: remember the old listing (path -> sha256, used to
    skip re-saving unchanged images) and remove ``bundle.json``, so an interrupted fetch cannot
    leave a description that lies."""
    old: dict[str, str] = {}
    path = bundle_json(root)
    if path.is_file():
        with contextlib.suppress(ConfigError):
            prev = read_bundle(root)
            old = {f.path: f.sha256 for f in prev.files}
            old.update({f"image:{i.ref}": i.image_id for i in prev.images})
        path.unlink()
    (root / WHEELS_DIR).mkdir(parents=True, exist_ok=True)
    (root / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    (root / BUILDER_WHEELS_DIR).mkdir(parents=True, exist_ok=True)
    return old


def write_bundle(bundle: Bundle) -> Path:
    path = bundle_json(bundle.root)
    atomic_write(path, (json.dumps(bundle.to_json(), indent=2, sort_keys=True) + "\n").encode())
    return path


def describe_file(root: Path, rel: str, cells: Sequence[str]) -> BundleFile:
    path = root / rel
    return BundleFile(rel, sha256_file(path), path.stat().st_size, tuple(sorted(cells)))


# ------------------------------------------------------------------ images


#: The names pinned images are saved under (:func:`saved_name`).
PINNED_PREFIX = "ampforge/pinned/"


def saved_name(ref: str) -> str:
    """The name a bundle saves *ref*'s image under, the one ``docker load`` restores: *ref*
    itself, except for a pin (``repo:tag@sha256:...``): ``docker save`` of a digest reference
    writes no name at all (Docker 20.10: ``RepoTags: null``), and no engine lets a digest
    reference be made without a registry. So a pin travels as
    ``ampforge/pinned/<name>:<tag>-<16 hex of its digest>``; the image id recorded next to it
    (a digest of the image's config, which names every layer) is checked after the load."""
    pin = parse_ref(ref)
    if pin.digest is None:
        return ref
    name = pin.repository.rsplit("/", 1)[-1]
    return f"{PINNED_PREFIX}{name}:{pin.tag or 'latest'}-{pin.digest[len('sha256:') :][:16]}"


def save_image(engine: Any, ref: str, dest: Path) -> str:
    """``docker save`` *ref* (under :func:`saved_name`) to *dest*, through a temporary file:
    *dest* is whole or absent. Returns the name ``docker load`` restores."""
    name = saved_name(ref)
    if name != ref:
        repository, _, tag = name.rpartition(":")
        engine.api.tag(ref, repository, tag)

    def write(fh: BinaryIO) -> None:
        for chunk in engine.api.get_image(name, chunk_size=1 << 20):
            fh.write(chunk)

    atomic_replace(dest, write)
    return name


def load_images(
    engine: Any, bundle: Bundle, arches: Sequence[str], say: Callable[[str], None]
) -> list[str]:
    """``docker load`` the bundle's base images for *arches* that the engine lacks (or has
    under another id); returns the refs loaded. Nothing is ever pulled."""
    loaded = []
    for image in bundle.images:
        if image.arch not in arches:
            continue
        if engine.image_id(image.ref) == image.image_id:
            say(f"base image {image.ref} already in the engine (same id as the bundle's)")
            continue
        tar = bundle.root / image.file
        with tar.open("rb") as fh:
            for event in engine.api.load_image(fh):
                if isinstance(event, dict) and event.get("error"):
                    raise StepFailed(f"docker load of {tar} failed: {event['error']}")
        got = engine.image_id(image.ref)
        if got != image.image_id:
            raise StepFailed(
                f"docker load of {tar} gave {image.ref} id {got}, but bundle.json "
                f"records {image.image_id}; fetch the bundle again"
            )
        say(f"base image {image.ref} loaded from {tar}")
        loaded.append(image.ref)
    return loaded
