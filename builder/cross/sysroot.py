"""The target Python of a cross build: a Debian arm64 CPython unpacked (``dpkg -x``) into a sysroot.

One sysroot serves two jobs:

* building: its headers (with the *target's* ``pyconfig.h``) and a sysconfigdata module that
  makes the host interpreter name modules ``*.cpython-3X-aarch64-linux-gnu.so`` and wheels
  ``linux_aarch64`` (``_PYTHON_SYSCONFIGDATA_NAME`` + ``_PYTHON_HOST_PLATFORM``);
* verifying: ``qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.X`` runs the real target
  interpreter.

The .debs come from the host's own apt sources (``apt-get download PKG:arm64``, which needs
``dpkg --add-architecture arm64``; see provision.sh). Nothing is installed on the host. The cache
entry is keyed by the SHA-256 of every .deb, read from the apt index before downloading, so a
security update of python3.11 makes a new sysroot and an unchanged one is reused offline.

The sysroot deliberately contains no libgomp: a wheel that only imports because the verification
sysroot happened to provide an OpenMP runtime would break on a bare target.
"""

from __future__ import annotations

import pprint
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.cross.cache import cache_root, content_key, ensure_entry
from builder.errors import StepFailed

# Debian suite -> the CPython it ships for arm64. Only bookworm's is wired to the host's apt.
DEBIAN_PYTHONS = {"3.11": "bookworm"}

# Runtime closure of Debian's python3.X (stdlib extension modules' shared libs) + headers.
# Computed once with `apt-cache depends --recurse python3.11:arm64`, minus tools and -dev
# packages a compiled extension never needs. "{v}" is the Python version.
_PACKAGES = (
    "python{v}-minimal", "libpython{v}-minimal", "libpython{v}-stdlib", "python{v}",
    "libpython{v}", "libpython{v}-dev",
    "libc6", "libgcc-s1", "gcc-12-base", "libstdc++6", "zlib1g", "libexpat1", "libffi8",
    "libssl3", "libbz2-1.0", "liblzma5", "libsqlite3-0", "libncursesw6", "libtinfo6",
    "libreadline8", "libuuid1", "libdb5.3", "libcrypt1", "libnsl2", "libtirpc3",
    "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0", "libkeyutils1",
    "libcom-err2",
)

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


def _apt_index(packages: list[str]) -> dict[str, tuple[str, str]]:
    """name:arch -> (version, sha256) of the candidate .debs, from the local apt index."""
    out = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *packages], capture_output=True, text=True
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
    if missing:
        raise StepFailed(
            "target Python: apt knows no candidate for " + ", ".join(missing) + ". Enable the "
            "foreign architecture and refresh the index (`dpkg --add-architecture arm64 && "
            "apt-get update`, done by builder/cross/provision.sh)."
        )
    return found


def _write_target_sysconfig(debian_vars_file: Path, dest: Path, include_dir: Path,
                            sysroot: Path, name: str) -> str:
    """Write the build-time sysconfig the host interpreter will read while cross-compiling.

    Starts from the target's own ``_sysconfigdata`` (so EXT_SUFFIX/SOABI/MULTIARCH are the
    target's) and points its paths into the sysroot. Debian's flags carry ``-g``; a release wheel
    must not (a one-file torch extension is 10 MB with it), so it is dropped here.
    """
    namespace: dict[str, object] = {}
    exec(compile(debian_vars_file.read_text(), str(debian_vars_file), "exec"), namespace)
    build_vars = dict(namespace["build_time_vars"])  # type: ignore[arg-type]
    for key in ("INCLUDEPY", "CONFINCLUDEPY", "INCLUDEDIR", "CONFINCLUDEDIR"):
        build_vars[key] = str(include_dir)
    for key in ("LIBDIR", "LIBPL", "LIBDEST", "BINLIBDEST"):
        value = str(build_vars.get(key, ""))
        if value.startswith("/"):
            build_vars[key] = str(sysroot) + value
    for key in ("CFLAGS", "LDSHARED", "LDCXXSHARED", "BLDSHARED", "LDFLAGS", "OPT",
                "CONFIGURE_CFLAGS", "PY_CFLAGS"):
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
    lib_dirs = tuple(
        p for p in (sysroot / "lib" / triplet, sysroot / "usr" / "lib" / triplet) if p.is_dir()
    )
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


def precompile(folder: Path, version: str, shown_as: Path) -> None:
    """Byte-compile ``folder`` natively when this interpreter is the target's X.Y.

    Debian's .debs ship no .pyc (postinst writes them); the emulated interpreter would
    otherwise recompile its stdlib on every start. Bytecode is CPU-independent. ``shown_as`` is
    the folder's path as the running program will see it (tracebacks find the source there).
    """
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != version:
        return
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "2", "-s", str(folder),
                    "-p", str(shown_as), str(folder)], capture_output=True)


def unpack_debs(packages: list[str], root: Path) -> None:
    """``apt-get download`` ``packages`` (``name:arch``) and ``dpkg -x`` them into ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampforge-debs-") as name:
        debs = Path(name)
        # apt drops privileges to _apt for downloads; a folder it cannot write only costs a
        # warning, so make it writable rather than silence apt.
        debs.chmod(0o777)
        run = subprocess.run(["apt-get", "download", "-q", *packages], cwd=debs,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise StepFailed("`apt-get download` of the target's .debs failed:\n"
                             + run.stderr[-2000:])
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)


def ensure_debian_root(packages: list[str], name: str, cache: Path | None = None) -> Path:
    """A cached folder with ``packages`` (``name:arch``) unpacked, keyed by their .deb hashes."""
    index = _apt_index(packages)
    key = content_key(sorted(f"{p}={index[p][1]}" for p in packages))
    return ensure_entry(cache_root(cache) / "sysroots" / f"{name}-{key}",
                        lambda tmp: unpack_debs(packages, tmp))


def ensure_target_python(version: str, arch: str = "aarch64",
                         cache: Path | None = None) -> TargetPython:
    """Return a cached target CPython ``version`` for ``arch``, unpacking it on first use.

    Raises :class:`StepFailed` with what to do when this host cannot provide that Python.
    """
    deb_arch = _debian_arch(arch)
    if version not in DEBIAN_PYTHONS:
        suites = ", ".join(sorted(set(DEBIAN_PYTHONS.values())))
        known = ", ".join(sorted(DEBIAN_PYTHONS))
        raise StepFailed(
            f"target Python {version} for {arch}: this host's Debian ({suites}) ships only "
            f"Python {known} for {deb_arch}. Other versions need a manylinux_2_28_aarch64 "
            "image's /opt/python/cp3X (emulated backend) or an arm64 python3.X from another "
            "Debian suite (bullseye has 3.9); not wired up yet."
        )
    if shutil.which("dpkg") is None or shutil.which("apt-get") is None:
        raise StepFailed("target Python: needs a Debian host (dpkg, apt-get) to unpack .debs")
    packages = [p.format(v=version) + f":{deb_arch}" for p in _PACKAGES]
    index = _apt_index(packages)
    key = content_key(sorted(f"{p}={index[p][1]}" for p in packages))
    entry_path = cache_root(cache) / "sysroots" / f"python{version}-{arch}-{key}"
    triplet = f"{arch}-linux-gnu"

    def fill(tmp: Path) -> None:
        root = tmp / "root"
        unpack_debs(packages, root)
        # Debian splits pyconfig.h per architecture behind a wrapper that needs the whole
        # sysroot /usr/include on the path (with the target libc headers shadowing the cross
        # compiler's). Build a self-contained include folder with the real one instead.
        include = tmp / "include" / f"python{version}"
        shutil.copytree(root / "usr" / "include" / f"python{version}", include, symlinks=True)
        (include / "pyconfig.h").unlink()
        shutil.copy2(root / "usr" / "include" / triplet / f"python{version}" / "pyconfig.h",
                     include / "pyconfig.h")
        debian_vars = root / "usr" / "lib" / f"python{version}" / f"_sysconfigdata__{triplet}.py"
        suffix = _write_target_sysconfig(
            debian_vars, tmp / "sysconfig", tmp.parent / entry_path.name / "include" /
            f"python{version}", tmp.parent / entry_path.name / "root",
            SYSCONFIG_NAME.format(arch=arch),
        )
        (tmp / "ext_suffix").write_text(suffix + "\n")
        stdlib = Path("/usr/lib") / f"python{version}"
        precompile(root / stdlib.relative_to("/"), version, shown_as=stdlib)
        (tmp / "packages.txt").write_text(
            "".join(f"{p} {index[p][0]} {index[p][1]}\n" for p in packages)
        )

    ensure_entry(entry_path, fill)
    return _layout(entry_path, version, arch)
