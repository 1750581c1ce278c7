"""The target Python of a cross build: a Debian arm64 CPython unpacked (``dpkg -x``) into a sysroot.

One sysroot serves two jobs:

* building: its headers (with the *target's* ``pyconfig.h``) and a sysconfigdata module that
  makes the host interpreter name modules ``*.cpython-3X-aarch64-linux-gnu.so`` and wheels
  ``linux_aarch64`` (``_PYTHON_SYSCONFIGDATA_NAME`` + ``_PYTHON_HOST_PLATFORM``);
* verifying: ``qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.X`` runs the real target
  interpreter.

Each Debian suite ships one CPython for arm64 (bullseye 3.9, bookworm 3.11, trixie 3.13), and
each sysroot is that suite's: its python3.X with the suite's own libc, libssl, libffi... The
.debs come from the host's apt (``apt-get download PKG:arm64``): the host's own suite through
the host's sources (``dpkg --add-architecture arm64``; see provision.sh), any other suite
through a private apt configuration derived from them (:mod:`builder.cross.apt_suite`). Nothing
is installed on the host. The cache entry is keyed by the SHA-256 of every .deb, read from the
apt index before downloading, so a security update of python3.X makes a new sysroot and an
unchanged one is reused offline.

The sysroot deliberately contains no libgomp: a wheel that only imports because the verification
sysroot happened to provide an OpenMP runtime would break on a bare target.
"""

from __future__ import annotations

import functools
import pprint
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.cache import cache_root, content_key, ensure_entry
from builder.cross.apt_suite import SuiteApt, suite_apt
from builder.engines.host import find_python
from builder.errors import StepFailed

# Python X.Y -> the Debian suite whose arm64 archive ships it (checked on this machine's apt:
# no suite has 3.10 or 3.12; sid/forky have 3.13 and 3.14, which are not stable releases).
DEBIAN_PYTHONS = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}

# Runtime closure of Debian's python3.X (stdlib extension modules' shared libs, libstdc++ for the
# extension under test) + headers. Computed once per suite with `apt-cache depends --recurse
# --no-recommends python3.X:arm64 libpython3.X:arm64 libstdc++6:arm64`, minus tools, -dev
# packages a compiled extension never needs and arch-all data (tzdata, media-types).
# "{v}" is the Python version.
_PYTHON_PACKAGES = (
    "python{v}-minimal",
    "libpython{v}-minimal",
    "libpython{v}-stdlib",
    "python{v}",
    "libpython{v}",
    "libpython{v}-dev",
)
_KERBEROS = (
    "libgssapi-krb5-2",
    "libkrb5-3",
    "libk5crypto3",
    "libkrb5support0",
    "libkeyutils1",
    "libcom-err2",
)
SUITE_LIBRARIES: dict[str, tuple[str, ...]] = {
    "bullseye": (
        "libc6",
        "libgcc-s1",
        "gcc-10-base",
        "libstdc++6",
        "zlib1g",
        "libexpat1",
        "libffi7",
        "libssl1.1",
        "libbz2-1.0",
        "liblzma5",
        "libsqlite3-0",
        "libncursesw6",
        "libtinfo6",
        "libreadline8",
        "libuuid1",
        "libdb5.3",
        "libcrypt1",
        "libnsl2",
        "libtirpc3",
        "libmpdec3",
        *_KERBEROS,
    ),
    "bookworm": (
        "libc6",
        "libgcc-s1",
        "gcc-12-base",
        "libstdc++6",
        "zlib1g",
        "libexpat1",
        "libffi8",
        "libssl3",
        "libbz2-1.0",
        "liblzma5",
        "libsqlite3-0",
        "libncursesw6",
        "libtinfo6",
        "libreadline8",
        "libuuid1",
        "libdb5.3",
        "libcrypt1",
        "libnsl2",
        "libtirpc3",
        *_KERBEROS,
    ),
    # trixie renamed libraries for 64-bit time_t (t64) and dropped crypt/nis from 3.13.
    "trixie": (
        "libc6",
        "libgcc-s1",
        "gcc-14-base",
        "libstdc++6",
        "zlib1g",
        "libexpat1",
        "libffi8",
        "libssl3t64",
        "libbz2-1.0",
        "liblzma5",
        "libzstd1",
        "libsqlite3-0",
        "libncursesw6",
        "libtinfo6",
        "libreadline8t64",
        "libuuid1",
        "libdb5.3t64",
    ),
}


def suite_for(version: str) -> str:
    """The Debian suite that ships an arm64 CPython ``version``; :class:`StepFailed` otherwise.

    The message names the versions that do build and what to do for the others: a cross build
    is verified by running the target interpreter, so without one there is nothing to check
    the wheel against.
    """
    if version in DEBIAN_PYTHONS:
        return DEBIAN_PYTHONS[version]
    known = ", ".join(
        f"{v} ({s})" for v, s in sorted(DEBIAN_PYTHONS.items(), key=lambda kv: _version_key(kv[0]))
    )
    raise StepFailed(
        f"target Python {version}: no Debian release ships an arm64 Python {version} (Debian "
        f"arm64 CPythons: {known}), so there is no target interpreter to verify a cross-built "
        f"wheel against. Build this cell on an aarch64 machine (or --backend emulated in a "
        f"manylinux_2_28_aarch64 image), or pick Python {', '.join(_sorted_versions())}"
    )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _sorted_versions() -> list[str]:
    return sorted(DEBIAN_PYTHONS, key=_version_key)


def target_packages(version: str, arch: str = "aarch64") -> list[str]:
    """``name:arch`` of every .deb in the sysroot of Python ``version`` (its suite's closure)."""
    deb_arch = _debian_arch(arch)
    suite = suite_for(version)
    names = [p.format(v=version) for p in _PYTHON_PACKAGES] + list(SUITE_LIBRARIES[suite])
    return [f"{name}:{deb_arch}" for name in names]


SYSCONFIG_NAME = "_sysconfigdata__ampforge_cross_{arch}"


@dataclass(frozen=True)
class TargetPython:
    """A target CPython for cross builds and emulated runs."""

    version: str  # "3.11"
    arch: str  # "aarch64"
    sysroot: Path  # QEMU -L prefix; the interpreter's /usr lives below it
    executable: Path  # absolute host path of the target interpreter (run it under qemu)
    include_dir: Path  # Python.h + the target's real pyconfig.h
    sysconfig_dir: Path  # holds the module named by sysconfig_name (put it on PYTHONPATH)
    sysconfig_name: str  # value for _PYTHON_SYSCONFIGDATA_NAME
    ext_suffix: str  # ".cpython-311-aarch64-linux-gnu.so"
    lib_dirs: tuple[Path, ...]  # target library folders, for auditwheel --ldpaths

    @property
    def python_tag(self) -> str:
        return "cp" + self.version.replace(".", "")

    @property
    def host_platform(self) -> str:
        """Value for ``_PYTHON_HOST_PLATFORM`` (sysconfig.get_platform of the target)."""
        return f"linux-{self.arch}"


def _debian_arch(arch: str) -> str:
    if arch != "aarch64":
        raise StepFailed(f"target Python: unsupported architecture {arch!r}; expected 'aarch64'")
    return "arm64"


def _apt_index(packages: list[str], apt: SuiteApt | None = None) -> dict[str, tuple[str, str]]:
    """name:arch -> (version, sha256) of the candidate .debs, from the apt index (the host's,
    or ``apt``'s private one)."""
    options = list(apt.options) if apt else []
    out = subprocess.run(
        ["apt-cache", *options, "show", "--no-all-versions", *packages],
        capture_output=True,
        text=True,
    )
    found: dict[str, tuple[str, str]] = {}
    for para in out.stdout.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in para.splitlines() if ": " in line and line[0] != " "
        )
        if "Package" in fields and "SHA256" in fields:
            found[fields["Package"]] = (fields.get("Version", ""), fields["SHA256"])
    # Architecture: all packages (media-types) answer for any :arch; match on the name.
    found = {p: found[p.split(":")[0]] for p in packages if p.split(":")[0] in found}
    missing = [p for p in packages if p not in found]
    if missing and apt is not None and apt.options:
        raise StepFailed(
            f"target Python: Debian {apt.suite}'s apt index has no candidate for "
            + ", ".join(missing)
            + f" (index: {apt.options[apt.options.index('-o') + 1]}...; "
            "a suite's package names change between releases: see SUITE_LIBRARIES in "
            "builder/cross/sysroot.py)"
        )
    if missing:
        raise StepFailed(
            "target Python: apt knows no candidate for " + ", ".join(missing) + ". Enable the "
            "foreign architecture and refresh the index (`dpkg --add-architecture arm64 && "
            "apt-get update`, done by builder/cross/provision.sh)."
        )
    return found


def _write_target_sysconfig(
    debian_vars_file: Path, dest: Path, include_dir: Path, sysroot: Path, name: str
) -> str:
    """Write the build-time sysconfig the host interpreter will read while cross-compiling.

    Starts from the target's own ``_sysconfigdata`` (so EXT_SUFFIX/SOABI/MULTIARCH are the
    target's) and points its paths into the sysroot. Debian's flags carry ``-g``; a release wheel
    must not (a one-file torch extension is 10 MB with it), so it is dropped here.
    """
    namespace: dict[str, Any] = {}  # the target's module globals: build_time_vars is a dict
    exec(compile(debian_vars_file.read_text(), str(debian_vars_file), "exec"), namespace)
    build_vars = dict(namespace["build_time_vars"])
    for key in ("INCLUDEPY", "CONFINCLUDEPY", "INCLUDEDIR", "CONFINCLUDEDIR"):
        build_vars[key] = str(include_dir)
    for key in ("LIBDIR", "LIBPL", "LIBDEST", "BINLIBDEST"):
        value = str(build_vars.get(key, ""))
        if value.startswith("/"):
            build_vars[key] = str(sysroot) + value
    for key in (
        "CFLAGS",
        "LDSHARED",
        "LDCXXSHARED",
        "BLDSHARED",
        "LDFLAGS",
        "OPT",
        "CONFIGURE_CFLAGS",
        "PY_CFLAGS",
    ):
        if isinstance(build_vars.get(key), str):
            build_vars[key] = " ".join(t for t in str(build_vars[key]).split() if t != "-g")
    # distutils links extensions with libpython when cross-compiling unless this is 0; a
    # manylinux extension must never need libpython (the interpreter provides the symbols).
    build_vars["ANDROID_API_LEVEL"] = 0
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}.py").write_text(
        "# Generated by builder.cross.sysroot from the target's sysconfigdata.\n"
        f"build_time_vars = {pprint.pformat(build_vars, width=100)}\n"
    )
    return str(build_vars["EXT_SUFFIX"])


def _layout(entry: Path, version: str, arch: str) -> TargetPython:
    sysroot = entry / "root"
    triplet = f"{arch}-linux-gnu"
    name = SYSCONFIG_NAME.format(arch=arch)
    suffix_file = entry / "ext_suffix"
    lib_dirs: tuple[Path, ...] = ()
    for folder in (sysroot / "lib" / triplet, sysroot / "usr" / "lib" / triplet):
        # In merged-/usr sysroots lib/ is a link to usr/lib: list each folder once.
        if folder.is_dir() and folder.resolve() not in {d.resolve() for d in lib_dirs}:
            lib_dirs += (folder,)
    return TargetPython(
        version=version,
        arch=arch,
        sysroot=sysroot,
        executable=sysroot / "usr" / "bin" / f"python{version}",
        include_dir=entry / "include" / f"python{version}",
        sysconfig_dir=entry / "sysconfig",
        sysconfig_name=name,
        ext_suffix=suffix_file.read_text().strip(),
        lib_dirs=lib_dirs,
    )


def native_interpreter(version: str) -> str | None:
    """A host interpreter of Python ``version`` (X.Y): this one, else the host backend's
    search (``pythonX.Y`` on PATH, pyenv's versions); None when there is none."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    try:
        return str(find_python(version))
    except StepFailed:
        return None


def precompile(folder: Path, version: str, shown_as: Path) -> None:
    """Byte-compile ``folder`` natively with a host Python of the target's X.Y, if there is one.

    Debian's .debs ship no .pyc (postinst writes them); the emulated interpreter would
    otherwise recompile its stdlib on every start. Bytecode is CPU-independent (its format is
    per X.Y only). ``shown_as`` is the folder's path as the running program will see it
    (tracebacks find the source there). Without such a host Python nothing is compiled: slower
    emulated starts, same results.
    """
    python = native_interpreter(version)
    if python is None:
        return
    subprocess.run(
        [
            python,
            "-m",
            "compileall",
            "-q",
            "-j",
            "2",
            "-s",
            str(folder),
            "-p",
            str(shown_as),
            str(folder),
        ],
        capture_output=True,
    )


def _versions(package: str, apt: SuiteApt | None) -> list[str]:
    """Every version of ``package`` (``name:arch``) the apt index knows, newest first."""
    options = list(apt.options) if apt else []
    out = subprocess.run(
        ["apt-cache", *options, "show", package], capture_output=True, text=True
    ).stdout
    versions = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("Version: ")]
    ordered: list[str] = []
    for version in versions:
        if version not in ordered:
            ordered.append(version)
    return sorted(ordered, key=functools.cmp_to_key(_compare_debian_versions))


def _compare_debian_versions(a: str, b: str) -> int:
    """Newest first, by dpkg's own ordering."""
    if a == b:
        return 0
    newer = subprocess.run(["dpkg", "--compare-versions", a, "gt", b]).returncode == 0
    return -1 if newer else 1


def _downloaded(folder: Path) -> dict[str, Path]:
    """``name:arch`` -> .deb for the files ``apt-get download`` left in ``folder``."""
    found = {}
    for deb in folder.glob("*.deb"):
        name, _, rest = deb.name.partition("_")
        arch = rest.rsplit("_", 1)[-1][: -len(".deb")]
        found[f"{name}:{arch}"] = deb
    return found


def unpack_debs(packages: list[str], root: Path, apt: SuiteApt | None = None) -> list[str]:
    """``apt-get download`` ``packages`` (``name:arch``) and ``dpkg -x`` them into ``root``.

    A candidate the mirror does not serve (seen here: bullseye-security's pool answers 404 while
    its index is served) is replaced by the newest older version of the same package that it
    does serve, e.g. the suite's own point-release build. The sysroot only runs the
    verification, so that costs security fixes in a test interpreter, never in a wheel.
    Returns ``name:arch=version`` of every .deb unpacked.
    """
    root.mkdir(parents=True, exist_ok=True)
    options = list(apt.options) if apt else []
    with tempfile.TemporaryDirectory(prefix="ampforge-debs-") as name:
        debs = Path(name)
        # apt drops privileges to _apt for downloads; a folder it cannot write only costs a
        # warning, so make it writable rather than silence apt.
        debs.chmod(0o777)
        run = subprocess.run(
            ["apt-get", *options, "download", "-q", *packages],
            cwd=debs,
            capture_output=True,
            text=True,
        )
        errors = run.stderr
        older = {p: _versions(p, apt)[1:] for p in packages if p not in _downloaded(debs)}
        # One apt-get per round, each still-missing package at its next older version.
        for attempt in range(max((len(v) for v in older.values()), default=0)):
            wanted = [
                f"{p}={v[attempt]}"
                for p, v in older.items()
                if p not in _downloaded(debs) and attempt < len(v)
            ]
            if not wanted:
                break
            retry = subprocess.run(
                ["apt-get", *options, "download", "-q", *wanted],
                cwd=debs,
                capture_output=True,
                text=True,
            )
            errors += retry.stderr
        still = [p for p in packages if p not in _downloaded(debs)]
        if still:
            raise StepFailed(
                "`apt-get download` of the target's .debs failed for "
                + ", ".join(still)
                + ":\n"
                + errors[-2000:]
            )
        used = []
        for package, deb in sorted(_downloaded(debs).items()):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
            version = subprocess.run(
                ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True
            ).stdout.strip()
            used.append(f"{package}={version}")
    # Merged-/usr suites (trixie) ship the loader as /usr/lib/ld-linux-*.so.1 and leave the
    # /lib -> usr/lib link to base-files; QEMU's -L and the loader's own paths need it.
    for top in ("lib", "bin", "sbin"):
        if not (root / top).exists() and (root / "usr" / top).is_dir():
            (root / top).symlink_to(f"usr/{top}")
    return used


def ensure_debian_root(
    packages: list[str], name: str, cache: Path | None = None, apt: SuiteApt | None = None
) -> Path:
    """A cached folder with ``packages`` (``name:arch``) unpacked, keyed by their .deb hashes
    (from the host's apt, or ``apt``'s suite)."""
    index = _apt_index(packages, apt)
    key = content_key(sorted(f"{p}={index[p][1]}" for p in packages))
    return ensure_entry(
        cache_root(cache) / "sysroots" / f"{name}-{key}",
        lambda tmp: unpack_debs(packages, tmp, apt),
    )


def _debian_sysconfigdata(stdlib: Path, triplet: str) -> Path:
    """The target's build-time sysconfig module: ``_sysconfigdata__<triplet>.py`` (Debian's
    name; in trixie's 3.13 a link to upstream's ``_sysconfigdata__linux_<triplet>.py``)."""
    for name in (f"_sysconfigdata__{triplet}.py", f"_sysconfigdata__linux_{triplet}.py"):
        if (stdlib / name).is_file():
            return (stdlib / name).resolve()
    raise StepFailed(
        f"target Python: no _sysconfigdata__{triplet}.py in {stdlib} (found "
        f"{sorted(p.name for p in stdlib.glob('_sysconfigdata*'))})"
    )


def ensure_target_python(
    version: str, arch: str = "aarch64", cache: Path | None = None
) -> TargetPython:
    """Return a cached target CPython ``version`` for ``arch``, unpacking it on first use.

    Raises :class:`StepFailed` with what to do when this host cannot provide that Python.
    """
    deb_arch = _debian_arch(arch)
    packages = target_packages(version, arch)  # fails clearly for 3.10, 3.12, ...
    if shutil.which("dpkg") is None or shutil.which("apt-get") is None:
        raise StepFailed("target Python: needs a Debian host (dpkg, apt-get) to unpack .debs")
    apt = suite_apt(suite_for(version), deb_arch, cache)
    index = _apt_index(packages, apt)
    # The key is the .debs' content only (the suite is implied by them), so the bookworm
    # sysroot made before other suites existed is still found.
    key = content_key(sorted(f"{p}={index[p][1]}" for p in packages))
    entry_path = cache_root(cache) / "sysroots" / f"python{version}-{arch}-{key}"
    triplet = f"{arch}-linux-gnu"

    def fill(tmp: Path) -> None:
        root = tmp / "root"
        used = unpack_debs(packages, root, apt)
        # Debian splits pyconfig.h per architecture behind a wrapper that needs the whole
        # sysroot /usr/include on the path (with the target libc headers shadowing the cross
        # compiler's). Build a self-contained include folder with the real one instead.
        include = tmp / "include" / f"python{version}"
        shutil.copytree(root / "usr" / "include" / f"python{version}", include, symlinks=True)
        (include / "pyconfig.h").unlink()
        shutil.copy2(
            root / "usr" / "include" / triplet / f"python{version}" / "pyconfig.h",
            include / "pyconfig.h",
        )
        debian_vars = _debian_sysconfigdata(root / "usr" / "lib" / f"python{version}", triplet)
        suffix = _write_target_sysconfig(
            debian_vars,
            tmp / "sysconfig",
            tmp.parent / entry_path.name / "include" / f"python{version}",
            tmp.parent / entry_path.name / "root",
            SYSCONFIG_NAME.format(arch=arch),
        )
        (tmp / "ext_suffix").write_text(suffix + "\n")
        stdlib = Path("/usr/lib") / f"python{version}"
        precompile(root / stdlib.relative_to("/"), version, shown_as=stdlib)
        # What the index offered (the cache key) and what was unpacked (they differ where a
        # candidate was not served; see unpack_debs).
        (tmp / "packages.txt").write_text(
            "".join(f"{p} {index[p][0]} {index[p][1]}\n" for p in packages)
        )
        (tmp / "unpacked.txt").write_text("".join(f"{u}\n" for u in used))

    ensure_entry(entry_path, fill)
    return _layout(entry_path, version, arch)
