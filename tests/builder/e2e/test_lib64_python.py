"""Issue 13, parts 4 and 1: a RHEL-family ``lib64`` interpreter, and an older x86_64 userland.

Both tests use one CPython 3.11 built ``--with-platlibdir=lib64`` from Debian's python3.11
source package inside a bullseye container (glibc 2.31), with torch 2.13.0 (CPU) installed into
the interpreter itself: ``<prefix>/lib64/python3.11/site-packages/torch`` (tests/builder/
cpythonlib.py). Cold, that is the bullseye image (debootstrap) plus the CPython build plus the
torch install; the interpreter and the image are cached by content, so a second run of either
test, or the second test of a run, finds them.

* The host backend builds and verifies a wheel with that interpreter: its torch environment
  borrows the interpreter's torch, the extension links ``libtorch.so`` from torch's own folder
  (``lib64/...``), and verification layers its venv on that folder -- before, the builder
  passed the venv's *purelib* (``lib/...``) on, where no torch is, and torch was installed
  again.
* The x86_64 amp wheel of the docker backend (the session's ``docker_amp_build``: no build of
  its own) passes the builder's verification step on bullseye's glibc 2.31, with torch 2.13.0
  (a ``manylinux_2_28`` wheel) in that userland too.

Measured on 2 cores shared with other builds (load 7-11): cold, the bullseye root filesystem
(debootstrap + import) about 5.5 min, the CPython build 6.5-8 min (configure 100-120 s, make
210-290 s, install 40-70 s), torch into the copy 20 s; warm, the three cache lookups 0.7 s.
On a quiet machine the CPython build alone took 54 s (configure 20, make 27, install 5) with
the unused modules left out and no install-time compileall, against 59 s (install 9) before.
Then the host-backend test about 4 min (its own cache folder: a fresh torch venv, a cold
compile) and the bullseye run about 2 min, plus the session's docker amp build it shares.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cpythonlib import Lib64Python, lib64_python_with_torch
from helpers.enginelib import TORCH, docker_engine, wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import CELL, AmpBuild, manifest, run_build

from builder.config import REPO_ROOT
from builder.config.projecttest import from_pyproject
from builder.cross.apt_suite import derive_sources, host_sources, source_apt
from builder.images.aptsources import parse_deb822
from builder.incell import STEPS_SCRIPT
from builder.wheel.modules import compiled_files
from builder.wheel.wheelcheck import glibc_floor, version_needs

#: The first test to run builds the bullseye image and the interpreter when they are not
#: cached (see above): more than the default per-test timeout on a loaded machine.
COLD_TIMEOUT = 3600

#: torch and the requirements of torch 2.13.0 that are pure Python: in a lib64 layout torch is
#: in lib64/, these in lib/. (setuptools is left out: every fresh 3.11 venv has ensurepip's
#: 65.5, which shadows the interpreter's and is below torch's setuptools>=77, so pip upgrades
#: it in any venv, whatever the layout.)
TORCH_AND_LIB_REQUIREMENTS = {
    "torch",
    "filelock",
    "typing-extensions",
    "typing_extensions",
    "sympy",
    "mpmath",
    "networkx",
    "jinja2",
    "fsspec",
}

LAYOUT = r"""
import json, sys, sysconfig
import torch
from torch.utils import cpp_extension
print("LAYOUT " + json.dumps({
    "platlibdir": sys.platlibdir,
    "platlib": sysconfig.get_paths()["platlib"],
    "purelib": sysconfig.get_paths()["purelib"],
    "torch": torch.__version__,
    "torch_file": torch.__file__,
    "library_paths": cpp_extension.library_paths(),
    "sum": float(torch.ones(3).sum()),
}))
"""

CHECK = r"""
import json, os, platform
import torch
import amp
import amp._C
from amp import _ext
print("CHECK " + json.dumps({
    "libc": platform.libc_ver()[1],
    "confstr": os.confstr("CS_GNU_LIBC_VERSION"),
    "torch": torch.__version__,
    "torch_file": torch.__file__,
    "ext_file": amp._C.__file__,
    "ext_available": _ext.available(),
}))
"""


def _interpreter() -> Lib64Python:
    return lib64_python_with_torch(docker_engine(), wheelhouse_cp311(), TORCH)


def _json_line(out: str, tag: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith(tag + " "))
    return json.loads(line[len(tag) + 1 :])


def test_source_entries_are_derived_from_the_hosts_binary_ones() -> None:
    entries = parse_deb822(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /k.gpg\n\n"
        "Types: deb\nURIs: http://vendor.example/apt\nSuites: nodistro\nComponents: main\n"
    )
    assert derive_sources(entries, "bookworm", "bookworm", "", kind="deb-src") == (
        "Types: deb-src\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\nSigned-By: /k.gpg\n"
    )


def test_the_python_source_package_is_found_without_touching_the_hosts_apt() -> None:
    """The real archive: Debian's python3.11 source package has an upstream .orig tarball,
    reached through a private apt configuration (the host's sources stay as they are)."""
    if not host_sources():
        pytest.fail("this host has no apt sources: the lib64 interpreter needs a Debian host")
    before = {str(p): p.read_bytes() for p in sorted(Path("/etc/apt").rglob("*")) if p.is_file()}
    apt = source_apt()
    uris = subprocess.run(
        ["apt-get", *apt.options, "-qq", "source", "--print-uris", "python3.11"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (orig,) = [line.split() for line in uris.splitlines() if ".orig.tar." in line]
    assert orig[1].startswith("python3.11_3.11.") and orig[3].startswith("SHA256:")
    after = {str(p): p.read_bytes() for p in sorted(Path("/etc/apt").rglob("*")) if p.is_file()}
    assert after == before


def _dist(folder: Path, name: str, version: str, *requires: str) -> None:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )


def test_the_site_step_reports_torchs_folders_as_its_metadata_locates_them(tmp_path: Path):
    """torch in one folder (lib64/...), its pure requirements in another (lib/...): the step
    that tells verification where the prepared torch is names both, torch's first, and none of
    an extra's or another platform's requirements."""
    lib64 = tmp_path / "lib64" / "python3.11" / "site-packages"
    lib = tmp_path / "lib" / "python3.11" / "site-packages"
    other = tmp_path / "other"
    _dist(
        lib64,
        "torch",
        "2.13.0+cpu",
        "filelock",
        "sympy>=1.13.3",
        'opt-einsum>=3.3; extra == "opt-einsum"',
        "Triton==3.5; platform_system == 'Windows'",
    )
    _dist(lib, "filelock", "3.20.0")
    _dist(lib, "sympy", "1.14.0", "mpmath<1.4,>=1.1.0")
    _dist(lib64, "mpmath", "1.3.0")
    _dist(other, "opt_einsum", "3.4.0")  # installed, but only the extra wants it
    # -S: no site-packages of this interpreter, only the folders above.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (lib64, lib, other)))}
    run = subprocess.run(
        [sys.executable, "-S", str(STEPS_SCRIPT), "site"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(run.stdout.splitlines()[-1].split(" ", 1)[1])
    assert result["torch"] == "2.13.0+cpu"
    assert result["site"] == str(lib64.resolve())
    assert result["sites"] == [str(lib64.resolve()), str(lib.resolve())]

    empty = subprocess.run(
        [sys.executable, "-S", str(STEPS_SCRIPT), "site", "--optional"],
        env={**os.environ, "PYTHONPATH": str(other)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(empty.stdout.splitlines()[-1].split(" ", 1)[1])["torch"] == ""
    missing = subprocess.run(
        [sys.executable, "-S", str(STEPS_SCRIPT), "site"],
        env={**os.environ, "PYTHONPATH": str(other)},
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "has no torch installed" in missing.stderr


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(COLD_TIMEOUT)
def test_host_backend_builds_and_verifies_with_a_lib64_interpreter(tmp_path: Path) -> None:
    py = _interpreter()
    # The layout is real: binary wheels go to lib64, pure ones to lib, torch is in lib64 and
    # cpp_extension links from there.
    run = subprocess.run(
        [str(py.python), "-c", LAYOUT], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    layout = _json_line(run.stdout, "LAYOUT")
    assert layout["platlibdir"] == "lib64"
    assert Path(layout["platlib"]) == py.site
    assert Path(layout["purelib"]) == py.prefix / "lib" / "python3.11" / "site-packages"
    assert layout["torch"] == f"{TORCH}+cpu" and layout["sum"] == 3.0
    assert Path(layout["torch_file"]).parent == py.site / "torch"
    assert [Path(p) for p in layout["library_paths"]] == [py.site / "torch" / "lib"]
    assert not (Path(layout["purelib"]) / "torch").exists()

    project = write_tiny_extension(tmp_path / "tinyext")
    path = f"{py.prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        PATH=path,
        AMPFORGE_CACHE=str(tmp_path / "cache"),
    )
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert r.rc == 0, r.err[-4000:] + log[-4000:]
    site = str(py.site)
    # The torch environment borrows the interpreter's torch...
    assert (
        f"{py.python} has torch {TORCH}+cpu in {site} (platlibdir lib64): the torch "
        "environment uses it"
    ) in log
    assert f"Requirement already satisfied: torch=={TORCH} in {site}" in log
    # ...the extension linked libtorch from torch's own folder (the only one: see the layout
    # above), and verification finds torch there and its pure-Python requirements in lib/: the
    # smoke venv installs the wheel, and neither torch nor any of those (with the torch venv's
    # purelib passed on, pip installed them all a second time).
    installed = [
        line.split(": ", 1)[1].split(", ")
        for line in log.splitlines()
        if line.startswith("Installing collected packages: ")
    ]
    assert installed and "tinyext" in installed[-1], installed
    assert not {name for line in installed for name in line} & TORCH_AND_LIB_REQUIREMENTS, installed
    assert log.count(f"Requirement already satisfied: torch=={TORCH} in {site}") >= 2
    assert "smoke: imported ['tinyext._C']" in log
    (entry,) = manifest(tmp_path / "dist")["wheels"]
    assert entry["cell"] == CELL and entry["file"].startswith("tinyext-0.0.1+torch2.13-cp311-")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(COLD_TIMEOUT)
def test_the_docker_amp_wheel_runs_on_bullseye_glibc_2_31(
    tmp_path: Path, docker_amp_build: AmpBuild
) -> None:
    """The x86_64 amp wheel of the docker backend (built on bookworm, glibc 2.36) passes the
    builder's own verification step in a userland older than its build's: bullseye, glibc
    2.31, with the lib64 CPython above and torch 2.13.0 in it -- torch's own wheel,
    manylinux_2_28, allows glibc 2.31 too."""
    assert docker_amp_build.run.rc == 0, docker_amp_build.run.err[-4000:]
    engine = docker_engine()
    py = _interpreter()
    house = wheelhouse_cp311()
    wheel = docker_amp_build.wheel
    tag = wheel.name.rsplit("-", 1)[1].removesuffix(".whl")
    floor = tuple(int(x) for x in tag.split("_")[1:3])
    # No higher than torch's own manylinux_2_28, so below the glibc about to run it; its own
    # ELF needs (GLIBC_/GLIBCXX_/CXXABI_, read independently of auditwheel) agree.
    assert tag.startswith("manylinux_") and floor <= (2, 28), tag
    assert glibc_floor(version_needs(wheel)) <= floor, version_needs(wheel)

    entry = str(py.prefix.parent)
    lib = py.prefix / "lib" / "python3.11" / "site-packages"
    (tmp_path / "check.py").write_text(CHECK)
    # The builder's verification step as every backend runs it, layered on the interpreter's
    # torch (lib64/) and its requirements (lib/); then every symbol bound at load time, not
    # when first called, so a missing one fails here.
    # amp's own test command, read as the build reads it (pyproject.toml defines it).
    test_command = from_pyproject(REPO_ROOT).command
    assert test_command, "amp's pyproject.toml has no [tool.cibuildwheel] test-command"
    # The compiled modules to import, found in the wheel as every backend finds them.
    compiled = compiled_files(wheel)
    modules = "".join(f" --module {m}" for m in compiled.modules) + "".join(
        f" --library {shlex.quote(lib)}" for lib in compiled.libraries
    )
    script = (
        f"set -e; {py.python} /steps.py smoke --wheel /dist/{wheel.name} --torch {TORCH}"
        f"{modules} "
        f"--venv /v --wheelhouse /house --torch-site {py.site}{os.pathsep}{lib} "
        f"--test-command {shlex.quote(test_command)}; "
        "cd / && LD_BIND_NOW=1 /v/bin/python /check.py"
    )
    with engine.container(
        py.image,
        network=False,
        binds={
            entry: entry,
            str(house): "/house",
            str(docker_amp_build.dist): "/dist",
            str(STEPS_SCRIPT): "/steps.py",
            str(tmp_path / "check.py"): "/check.py",
        },
        labels={"org.ampforge.test": "bullseye-run"},
    ) as box:
        result = box.run(["bash", "-c", script], step="verify on bullseye", tail_lines=400)
    out = "\n".join(result.tail)
    assert f"Requirement already satisfied: torch=={TORCH} in {py.site}" in out, out
    installed = [
        line.split(": ", 1)[1].split(", ")
        for line in out.splitlines()
        if line.startswith("Installing collected packages: ")
    ]
    assert len(installed) == 1 and "ampforge" in installed[0], out
    assert not set(installed[0]) & TORCH_AND_LIB_REQUIREMENTS, installed
    assert "smoke: imported ['amp._C']" in out and "amp selftest: ok -- amp " in out, out
    check = _json_line(out, "CHECK")
    assert check["libc"] == "2.31" and check["confstr"] == "glibc 2.31", check
    assert check["torch"] == f"{TORCH}+cpu"
    assert check["torch_file"].startswith(str(py.site))
    assert check["ext_file"].startswith("/v/") and check["ext_available"] is True, check
