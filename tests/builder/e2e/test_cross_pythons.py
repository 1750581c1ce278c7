"""ARM cross builds for more than the host's Python: Debian's arm64 3.9 (bullseye), 3.11
(bookworm) and 3.13 (trixie), each in its own suite's sysroot.

Unit tests: suite selection, the clear failure for Pythons no Debian release ships (3.10, 3.12),
deriving another suite's apt sources from the host's, the wheel-tag check. Real ones: every
suite's package list resolves in its (private) apt index, and ONE tiny-extension cell --
cp39 / torch 2.8.0 -- is cross-built by the host's 3.11 interpreter, repaired and run under
qemu-aarch64 on bullseye's own glibc 2.31.

Cost: the unit tests < 1 s; the apt checks ~1 s each with a fresh index (a day old or more:
one `apt-get update`, ~3 s); the cp39 cell ~1.5 min warm on 2 quiet cores (compile ~30 s,
emulated `import torch` + check ~40 s), plus ~3 min of downloads and unpacking cold.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from test_cross import TINY_CHECK, _make_tiny_project

from builder.backends.cross import cross_available
from builder.cross import (
    cross_build_wheel,
    ensure_target_python,
    ensure_target_torch,
    find_qemu,
    find_toolchain,
    repair_cross_wheel,
    run_wheel_under_qemu,
    show_wheel,
)
from builder.cross.apt_suite import derive_sources, host_codename, host_sources, suite_apt
from builder.cross.build import check_wheel_tags, libm_floor_shim
from builder.cross.sysroot import (
    DEBIAN_PYTHONS,
    TargetPython,
    _apt_index,
    suite_for,
    target_packages,
)
from builder.cross.toolchain import CrossToolchainMissing
from builder.errors import StepFailed
from builder.images.aptsources import SourceEntry, parse_deb822, parse_one_line

HOST_SOURCES = """\
Types: deb
# a comment line inside the stanza
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://mirror.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://vendor.example/node
Suites: nodistro
Components: main
"""


def test_each_debian_arm64_python_maps_to_its_suite():
    assert DEBIAN_PYTHONS == {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
    assert [suite_for(v) for v in ("3.9", "3.11", "3.13")] == ["bullseye", "bookworm", "trixie"]
    # Each sysroot carries its own suite's C library and the libraries its stdlib links.
    bullseye = target_packages("3.9")
    assert {
        "python3.9-minimal:arm64",
        "libpython3.9-dev:arm64",
        "libc6:arm64",
        "libffi7:arm64",
        "libssl1.1:arm64",
        "libmpdec3:arm64",
    } <= set(bullseye)
    trixie = target_packages("3.13")
    assert {"python3.13:arm64", "libssl3t64:arm64", "libffi8:arm64"} <= set(trixie)
    assert "libssl1.1:arm64" not in trixie and "libssl3t64:arm64" not in bullseye
    assert all(p.endswith(":arm64") for p in bullseye + trixie)


@pytest.mark.parametrize("version", ["3.10", "3.12"])
def test_pythons_no_debian_release_ships_fail_naming_why_and_what_works(version):
    with pytest.raises(StepFailed) as info:
        ensure_target_python(version, "aarch64")
    message = info.value.message
    assert f"no Debian release ships an arm64 Python {version}" in message
    assert "no target interpreter to verify" in message
    assert "aarch64 machine" in message and "3.9, 3.11, 3.13" in message
    ok, why = cross_available("aarch64", version)
    assert not ok and f"no aarch64 Python {version} sysroot" in why


def test_other_suites_sources_are_derived_from_the_hosts():
    entries = parse_deb822(HOST_SOURCES)
    assert [e.suites for e in entries] == [
        ("bookworm", "bookworm-updates"),
        ("bookworm-security",),
        ("nodistro",),
    ]
    text = derive_sources(entries, "bookworm", "bullseye", "arm64")
    stanzas = [
        dict(line.split(": ", 1) for line in s.splitlines()) for s in text.strip().split("\n\n")
    ]
    assert stanzas == [
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian",
            "Suites": "bullseye bullseye-updates",
            "Components": "main contrib",
            "Architectures": "arm64",
            "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
        },
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian-security",
            "Suites": "bullseye-security",
            "Components": "main",
            "Architectures": "arm64",
            "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
        },
    ]  # the third-party entry is not Debian's: left out
    with pytest.raises(StepFailed, match="no entry for its own suite 'bookworm'"):
        derive_sources(
            [SourceEntry(("http://vendor.example",), ("nodistro",), ("main",))],
            "bookworm",
            "trixie",
            "arm64",
        )


def test_one_line_sources_and_os_release_are_read(tmp_path):
    entries = parse_one_line(
        "# deb http://old.example/debian buster main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main # x\n"
        "deb-src http://mirror.example/debian bookworm main\n"
        "deb https://vendor.example/apt cloud-sdk-bookworm main\n"
    )
    assert entries == [
        SourceEntry(("http://mirror.example/debian",), ("bookworm",), ("main",), "/k.gpg"),
        SourceEntry(("https://vendor.example/apt",), ("cloud-sdk-bookworm",), ("main",)),
    ]
    # "cloud-sdk-bookworm" is another repository's suite name, not a bookworm pocket.
    assert "vendor.example" not in derive_sources(entries, "bookworm", "trixie", "arm64")
    release = tmp_path / "os-release"
    release.write_text(
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_CODENAME=bookworm\n'
    )
    assert host_codename(release) == ("debian", "bookworm")


def test_a_wheel_tagged_for_the_host_python_is_refused(tmp_path):
    target = TargetPython(
        version="3.9",
        arch="aarch64",
        sysroot=tmp_path,
        executable=tmp_path,
        include_dir=tmp_path,
        sysconfig_dir=tmp_path,
        sysconfig_name="x",
        ext_suffix=".cpython-39-aarch64-linux-gnu.so",
        lib_dirs=(),
    )
    check_wheel_tags(tmp_path / "tiny-0.1-cp39-cp39-linux_aarch64.whl", target, tmp_path)
    with pytest.raises(
        StepFailed,
        match=r"not tagged cp39-cp39-linux_aarch64 for the target "
        r"Python 3\.9",
    ):
        check_wheel_tags(tmp_path / "tiny-0.1-cp311-cp311-linux_aarch64.whl", target, tmp_path)


def test_libm_shim_binds_the_glibc_2_29_functions_to_the_aarch64_base_version():
    shim = libm_floor_shim("aarch64")
    for name in ("exp", "exp2", "log", "log2", "pow"):
        assert f'__asm__(".symver {name},{name}@GLIBC_2.17");' in shim
    assert libm_floor_shim("riscv64") == ""  # unknown base version: no shim, honest tag


def _host_apt_files() -> dict[str, bytes]:
    folder = Path("/etc/apt")
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("version", sorted(DEBIAN_PYTHONS))
def test_every_suites_package_list_resolves_in_its_apt_index(version):
    """The per-suite package tables are right for the archive this host reaches (names change
    between releases: libssl1.1 -> libssl3 -> libssl3t64)."""
    if not host_sources():
        pytest.fail("this host has no apt sources: the cross sysroots need a Debian host")
    before = _host_apt_files()
    apt = suite_apt(DEBIAN_PYTHONS[version])
    index = _apt_index(target_packages(version), apt)
    assert set(index) == set(target_packages(version))
    assert all(len(sha) == 64 for _, sha in index.values())
    if DEBIAN_PYTHONS[version] != host_codename()[1]:
        assert apt.options, "another suite must use the private apt configuration"
    assert _host_apt_files() == before, "the machine's apt configuration must not change"


@pytest.mark.slow
def test_cp39_cell_cross_builds_on_a_311_host_and_runs_on_bullseye(tmp_path):
    """One non-host-Python cell end to end: Python 3.9 + torch 2.8.0 (its only torch, a CPU
    build for aarch64), built by this 3.11 interpreter, verified by Debian's arm64 3.9."""
    try:
        toolchain = find_toolchain("aarch64")
        find_qemu("aarch64")
    except CrossToolchainMissing as exc:  # CI provisions these; a bare host must say how
        pytest.fail(exc.message)
    assert sys.version_info[:2] != (3, 9), "the point is a host Python other than the target"
    python = ensure_target_python("3.9", "aarch64")
    unpacked = (python.sysroot.parent / "unpacked.txt").read_text().split()
    assert sorted(u.split("=")[0] for u in unpacked) == sorted(target_packages("3.9"))
    torch = ensure_target_torch("2.8.0", python)
    assert torch.full_version == "2.8.0+cpu"
    assert not list(torch.site.glob("nvidia*"))

    project = _make_tiny_project(tmp_path / "proj")
    # One libm call with a GLIBC_2.29 default version (the kernels' pow): the build's shim must
    # bind it to the aarch64 base version, or the wheel would need glibc 2.29+.
    source = project / "tinyext" / "ext.cpp"
    source.write_text(
        source.read_text().replace(
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            "double power(double a, double b) { return std::pow(a, b); }\n\n"
            'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n  m.def("power", &power);',
        )
    )
    # This interpreter has torch (make setup) and is the host torch here; the builder makes a
    # cached host torch environment instead (tests/builder/e2e/test_front_door.py).
    built = cross_build_wheel(
        project, tmp_path / "raw", python, torch, toolchain, host_python=sys.executable
    )
    assert built.wheel.name == "tinyext-0.1.0-cp39-cp39-linux_aarch64.whl"
    assert _symbol_versions(built.wheel)["pow"] == "GLIBC_2.17"
    repaired = repair_cross_wheel(
        built.wheel, tmp_path / "repaired", [*toolchain.lib_dirs, *python.lib_dirs]
    )
    glibc_floor = int(repaired.tag.split("_")[2])
    # Honest tag: what the symbols need (auditwheel show agrees), and no newer than the
    # bullseye glibc (2.31) it is about to run on.
    assert show_wheel(repaired.wheel)["sym_tag"] == repaired.tag
    assert repaired.wheel.name.startswith("tinyext-0.1.0-cp39-cp39-manylinux_2_")
    assert repaired.tag.endswith("_aarch64") and glibc_floor <= 28, repaired.tag

    script = TINY_CHECK + (
        "import sys\n"
        "print('TARGET ' + json.dumps({'python': '%d.%d' % sys.version_info[:2],"
        " 'libc': platform.libc_ver()[1], 'power': ext.power(2.0, 10.5)}))\n"
    )
    result = run_wheel_under_qemu(repaired.wheel, python, torch, script)
    lines = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith(("TINY ", "TARGET "))
    }
    target = lines["TARGET"]
    assert (target["python"], target["libc"]) == ("3.9", "2.31")
    assert target["power"] == pytest.approx(2.0**10.5, rel=1e-15)
    tiny = lines["TINY"]
    assert tiny["machine"] == "aarch64" and tiny["torch"] == "2.8.0+cpu"
    assert tiny["max_abs_diff"] < 1e-5
    assert len(tiny["gomps"]) == 1 and "torch.libs/libgomp-" in tiny["gomps"][0], tiny


def _symbol_versions(wheel: Path) -> dict[str, str]:
    """Undefined dynamic symbol -> the version it binds to, for the wheel's one module."""
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".so")]
        elf = ELFFile(io.BytesIO(zf.read(name)))
    versions = elf.get_section_by_name(".gnu.version_r")
    names = {}
    for _, auxiliaries in versions.iter_versions():
        for aux in auxiliaries:
            names[aux["vna_other"]] = aux.name
    symtab = elf.get_section_by_name(".dynsym")
    version_table = elf.get_section_by_name(".gnu.version")
    found = {}
    for index, symbol in enumerate(symtab.iter_symbols()):
        if symbol["st_shndx"] == "SHN_UNDEF" and symbol.name:
            ndx = version_table.get_symbol(index)["ndx"]
            found[symbol.name] = names.get(ndx, str(ndx))
    return found
