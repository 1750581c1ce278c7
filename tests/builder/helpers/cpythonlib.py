"""A CPython 3.11 with the RHEL-family layout (``sys.platlibdir == "lib64"``), with torch in it.

openEuler, RHEL and their rebuilds configure CPython ``--with-platlibdir=lib64``: binary wheels
such as torch's go to ``<prefix>/lib64/python3.X/site-packages``, and a build script that guesses
``lib/`` does not find ``libtorch.so``. To reproduce that layout for real, this module builds
CPython from the upstream sources in Debian's ``python3.11`` source package (the ``.orig``
tarball; Debian's own patches are not applied, as they add Debian's ``dist-packages`` layout)
and installs torch into the interpreter itself.

One build serves two tests. It is compiled inside a Debian bullseye container (glibc 2.31, the
oldest userland reachable here), so the same interpreter runs both there -- the older-userland
check of x86_64 wheels -- and on any newer host, where it is the interpreter of a host-backend
build. It links only libraries with the same soname on bullseye and later Debian releases
(zlib, bz2, lzma) plus libffi, linked statically into ``_ctypes`` (bullseye's ``libffi.so.7``
is ``libffi.so.8`` later; the build checks); no OpenSSL (pip reads a local wheelhouse here,
and ``hashlib`` falls back to its built-in digests).

Cache (``builder.cache``, under ``$AMPFORGE_CACHE``), content-keyed:

* ``cpython-src/<sha256>``: the source tarball, named by the digest the archive's index gives;
* ``cpython/<key>/python``: the installed interpreter; key = source digest, configure flags,
  the bullseye image's recipe key and this recipe's version;
* ``cpython-torch/<key>/python``: a copy of it with torch (and setuptools, wheel) installed;
  key = the interpreter's key and the wheelhouse's content.

Costs (2 shared cores): see the test module's docstring.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.cache import cache_root, content_key, ensure_entry, folder_digest
from builder.cross.apt_suite import source_apt
from builder.engines.base import OutputLog
from builder.engines.docker import DockerEngine
from builder.errors import StepFailed
from builder.images.base_image import BaseImageSpec, rootfs_image

VERSION = "3.11"
SOURCE_PACKAGE = f"python{VERSION}"
#: Bump when the build below changes what it installs.
RECIPE = 3
#: Extension modules nothing here imports (pip, venv, ensurepip, torch, the builder's in-cell
#: steps), left out of the build: libmpdec (``decimal`` falls back to ``_pydecimal``) and the
#: CJK codecs' tables are the largest compiles after the core. Not hashlib's ``_sha3`` and
#: ``_blake2``: without OpenSSL, ``import hashlib`` logs an error for each digest it misses.
UNUSED_MODULES: tuple[str, ...] = (
    "_decimal",
    "_multibytecodec",
    "_codecs_cn",
    "_codecs_hk",
    "_codecs_iso2022",
    "_codecs_jp",
    "_codecs_kr",
    "_codecs_tw",
    "audioop",
    "ossaudiodev",
    "nis",
    "spwd",
    "_crypt",
)
#: The layout under test, and a build as cheap as it gets: no PGO/LTO, no debug info, no test
#: suite, none of the modules above. The interpreter only runs pip and imports torch; -O1 is
#: plenty for that.
CONFIGURE_FLAGS: tuple[str, ...] = (
    "--with-platlibdir=lib64",
    "--disable-test-modules",
    "OPT=-DNDEBUG -fwrapv -O1 -g0",
    *(f"py_cv_module_{name}=n/a" for name in UNUSED_MODULES),
)
#: The bullseye userland the interpreter is compiled in (and the wheels are run in): a plain
#: debootstrapped root filesystem (the manylinux-shaped base image needs an auditwheel that
#: runs on bullseye's Python 3.9, and the pinned one no longer does). Only what compiling
#: CPython needs: a C compiler and the headers of the modules it links, and bullseye's
#: python3 (the image's query reads its version); nothing is compiled or run there with
#: bullseye's Python or a C++ compiler.
BULLSEYE = BaseImageSpec(
    suite="bullseye",
    packages=(
        "python3",
        "gcc",
        "make",
        "libc6-dev",
        "zlib1g-dev",
        "libffi-dev",
        "libbz2-dev",
        "liblzma-dev",
    ),
)


@dataclass(frozen=True)
class Lib64Python:
    prefix: Path  # the installation: bin/python3.11, lib/python3.11, lib64/python3.11
    image: str  # the bullseye image it was compiled in and runs in

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / f"python{VERSION}"

    @property
    def site(self) -> Path:
        """Where binary wheels (torch) go in this layout."""
        return self.prefix / "lib64" / f"python{VERSION}" / "site-packages"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder of an entry at a time (parallel test workers would each build it cold)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _lock_for(entry: Path) -> Path:
    # Not the builder's own `<entry>.lock` (builder.cache.lock_path): ensure_entry holds that one
    # shared while this exclusive one is held, and one process holding both on one file would
    # wait on itself.
    return entry.parent / (entry.name + ".fill-lock")


def _source_tarball(log: OutputLog) -> Path:
    """Debian's ``.orig`` tarball of python3.11, downloaded once per digest."""
    apt = source_apt()
    uris = subprocess.run(
        ["apt-get", *apt.options, "-qq", "source", "--print-uris", SOURCE_PACKAGE],
        capture_output=True,
        text=True,
        check=False,
    )
    origs = [line.split() for line in uris.stdout.splitlines() if ".orig.tar." in line]
    if uris.returncode != 0 or not origs:
        raise StepFailed(
            f"apt-get source --print-uris {SOURCE_PACKAGE}: no .orig tarball "
            f"(exit {uris.returncode}):\n{uris.stderr[-1500:]}"
        )
    _, name, _, sha = origs[0][:4]
    digest = sha.removeprefix("SHA256:")
    folder = cache_root() / "cpython-src" / digest[:16]

    def fill(tmp: Path) -> None:
        log.note(f"cpython: apt-get source --download-only {SOURCE_PACKAGE}")
        run = subprocess.run(
            ["apt-get", *apt.options, "-qq", "source", "--download-only", SOURCE_PACKAGE],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        # Only the .orig tarball is used. A mirror may serve the upstream tarball but not a
        # security update's .dsc/.debian.tar (seen: a 404 from the -security pool), and apt
        # then exits non-zero with the tarball downloaded: the digest decides.
        orig = tmp / name
        if not orig.is_file():
            raise StepFailed(
                f"apt-get source {SOURCE_PACKAGE}: no {name} (exit "
                f"{run.returncode}):\n{run.stderr[-1500:]}"
            )
        got = hashlib.sha256(orig.read_bytes()).hexdigest()
        if got != digest:
            raise StepFailed(f"{name}: sha256 {got}, the archive's index says {digest}")
        for other in tmp.iterdir():
            if other.name != name:
                other.unlink()

    with _locked(_lock_for(folder)):
        return ensure_entry(folder, fill) / name


def _build_script(tarball: str, prefix: str) -> str:
    configure = " ".join(f"'{flag}'" for flag in CONFIGURE_FLAGS)
    return f"""set -eu
t0=$(date +%s)
# 3.11's setup.py links _ctypes with the first of -lffi / -lffi_pic it finds: with only
# Debian's PIC archive left (in this throwaway container), libffi is linked statically.
rm -f /usr/lib/x86_64-linux-gnu/libffi.so /usr/lib/x86_64-linux-gnu/libffi.a
mkdir -p /build && cd /build && tar xzf '{tarball}' && cd Python-*
./configure -q --prefix='{prefix}' {configure}
# The install compiles the standard library to .pyc at three optimization levels, most of its
# 40-70 s under load; nothing needs them (the interpreter compiles what it imports), so each
# compileall call is made a no-op.
n=$(grep -c '$(DESTDIR)$(LIBDEST)/compileall.py' Makefile)
if [ "$n" -lt 3 ]; then
    echo "Makefile: expected the install's compileall calls, found $n" >&2
    exit 1
fi
sed -i 's|$(DESTDIR)$(LIBDEST)/compileall.py|-c pass|' Makefile
t1=$(date +%s)
make -s -j"$(nproc)"
t2=$(date +%s)
make -s install DESTDIR=/stage >/dev/null
t3=$(date +%s)
echo "cpython timings: configure $((t1 - t0)) s, make $((t2 - t1)) s, install $((t3 - t2)) s"
cd /stage'{prefix}'
if ldd lib64/python{VERSION}/lib-dynload/_ctypes*.so | grep libffi; then
    echo "_ctypes links a shared libffi: it would not load where that soname differs" >&2
    exit 1
fi
# What the tests use imports, and silently: hashlib logs a digest it cannot find to stderr.
said=$(PYTHONHOME=/stage'{prefix}' bin/python{VERSION} -W error \\
    -c 'import ctypes, zlib, bz2, lzma, venv, ensurepip, hashlib, decimal' 2>&1)
if [ -n "$said" ]; then
    echo "the new interpreter's imports: $said" >&2
    exit 1
fi
"""


def lib64_python(engine: DockerEngine, log: OutputLog | None = None) -> Lib64Python:
    """The interpreter (no torch), built on first use and then found in the cache."""
    log = log or OutputLog()
    image = rootfs_image(engine, BULLSEYE)
    tarball = _source_tarball(log)
    digest = tarball.parent.name
    key = content_key(
        [
            json.dumps(
                {
                    "source": digest,
                    "configure": CONFIGURE_FLAGS,
                    "image": BULLSEYE.key(),
                    "recipe": RECIPE,
                },
                sort_keys=True,
            )
        ]
    )
    final = cache_root() / "cpython" / f"{VERSION}-lib64-{key}"

    def fill(tmp: Path) -> None:
        # Compiled with its final prefix (sysconfig's recorded paths are then true), staged
        # with DESTDIR in the container and copied out into the temporary entry.
        prefix = str(final / "python")
        start = time.monotonic()
        with engine.container(
            image,
            binds={str(tarball.parent): "/src"},
            network=False,
            labels={"org.ampforge.test": "cpython-lib64"},
            log=log,
        ) as box:
            box.run(
                ["bash", "-c", _build_script(f"/src/{tarball.name}", prefix)], step="build CPython"
            )
            box.copy_out("/stage" + prefix, tmp)
        log.note(f"cpython: built in {time.monotonic() - start:.0f} s")

    with _locked(_lock_for(final)):
        entry = ensure_entry(final, fill)
    return Lib64Python(entry / "python", image)


def lib64_python_with_torch(
    engine: DockerEngine, wheelhouse: Path, torch: str, log: OutputLog | None = None
) -> Lib64Python:
    """The interpreter with ``torch==torch`` (and setuptools, wheel) installed into itself --
    ``lib64/python3.11/site-packages`` -- from *wheelhouse*, offline."""
    log = log or OutputLog()
    bare = lib64_python(engine, log)
    key = content_key([bare.prefix.parent.name, torch, folder_digest(wheelhouse)])
    final = cache_root() / "cpython-torch" / f"{VERSION}-lib64-torch{torch}-{key}"

    def fill(tmp: Path) -> None:
        # A copy, so the bare interpreter stays bare: CPython finds its prefix from where its
        # executable is, so the copy runs (and installs) as itself.
        shutil.copytree(bare.prefix, tmp / "python", symlinks=True)
        python = tmp / "python" / "bin" / f"python{VERSION}"
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--no-compile",
                "--no-index",
                "--find-links",
                str(wheelhouse),
                f"torch=={torch}",
                "setuptools",
                "wheel",
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
        )

    with _locked(_lock_for(final)):
        entry = ensure_entry(final, fill)
    return Lib64Python(entry / "python", bare.image)
