"""Emulated linux/arm64 containers: the binfmt_misc detector, a real arm64 container under
QEMU, and the ``emulated`` backend's choices and errors.

A whole emulated cell build takes 20+ minutes (every compiler and Python process runs under
QEMU), far too slow for CI: ``make bench-arm`` (benchmarks/build_arm.py) exercises it. These
tests take well under a minute (the arm64 container is Debian's static busybox).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.armlib import busybox_rootfs
from helpers.enginelib import docker_engine, in_ci
from helpers.pipelinelib import dist_state, run_build, seed_dist

from builder.engines.emulation import (
    BINFMT_ROOT,
    EmulationUnavailable,
    detect_emulation,
    require_emulation,
)

ROOT = Path(__file__).resolve().parents[3]
AARCH64_MAGIC = "7f454c460201010000000000000000000200b700"
AARCH64_MASK = "ffffffffffffff00fffffffffffffffffeffffff"


# -- the detector, on fake binfmt_misc folders ------------------------------------------------


def _binfmt(root: Path, entries: dict[str, str], status: str = "enabled") -> Path:
    root.mkdir(parents=True)
    (root / "status").write_text(status + "\n")
    (root / "register").write_text("")
    for name, text in entries.items():
        (root / name).write_text(text)
    return root


def _entry(
    flags: str,
    enabled: bool = True,
    magic: str = AARCH64_MAGIC,
    interpreter: str = "/usr/libexec/qemu-binfmt/aarch64-binfmt-P",
) -> str:
    return (
        ("enabled" if enabled else "disabled") + f"\ninterpreter {interpreter}\n"
        f"flags: {flags}\noffset 0\nmagic {magic}\nmask {AARCH64_MASK}\n"
    )


def test_unmounted_binfmt_misc_says_so_and_how_to_enable_it(tmp_path: Path) -> None:
    with pytest.raises(EmulationUnavailable) as err:
        require_emulation("aarch64", tmp_path / "empty", host="x86_64")
    msg = err.value.message
    assert "aarch64 emulation is unavailable on this x86_64 host" in msg
    assert f"binfmt_misc is not mounted at {tmp_path / 'empty'}" in msg
    assert "builder/cross/provision.sh" in msg
    assert "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc" in msg
    assert "F flag" in msg and "update-binfmts --enable qemu-aarch64" in msg
    assert err.value.return_code == 1


def test_entry_without_the_fix_binary_flag_does_not_count(tmp_path: Path) -> None:
    """Without F the kernel looks the interpreter up in the container's own filesystem,
    where it does not exist: `exec format error` / `no such file` inside every RUN step."""
    root = _binfmt(tmp_path / "b", {"qemu-aarch64": _entry("P")})
    found = detect_emulation("aarch64", root, host="x86_64")
    assert not found.available
    assert "without the F flag" in found.reason and "'P'" in found.reason
    assert found.interpreter == "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"


def test_disabled_or_unrelated_entries_and_disabled_binfmt(tmp_path: Path) -> None:
    root = _binfmt(tmp_path / "a", {"qemu-aarch64": _entry("PF", enabled=False)})
    assert (
        "qemu-aarch64 for aarch64 is disabled"
        in detect_emulation("aarch64", root, host="x86_64").reason
    )
    # A riscv64 registration matches no aarch64 executable.
    riscv = "7f454c460201010000000000000000000200f300"
    root = _binfmt(tmp_path / "b", {"qemu-riscv64": _entry("F", magic=riscv)})
    found = detect_emulation("aarch64", root, host="x86_64")
    assert not found.available and "qemu-aarch64 is not registered" in found.reason
    root = _binfmt(tmp_path / "c", {"qemu-aarch64": _entry("F")}, status="disabled")
    assert "is disabled" in detect_emulation("aarch64", root, host="x86_64").reason


def test_registered_with_fix_binary_flag_is_available(tmp_path: Path) -> None:
    # Any entry name works: what counts is that its magic/mask matches an aarch64 ELF header.
    root = _binfmt(
        tmp_path / "b",
        {
            "python3.11": "enabled\ninterpreter /usr/bin/python3.11\n"
            "flags: \noffset 0\nmagic a70d0d0a\n",
            "arm64-by-hand": _entry("OCF"),
        },
    )
    found = require_emulation("aarch64", root, host="x86_64")
    assert found.available and found.entry == "arm64-by-hand" and found.flags == "OCF"
    # The host's own arch needs nothing, whatever binfmt_misc holds.
    assert detect_emulation("x86_64", tmp_path / "none", host="x86_64").available
    assert "no known ELF header" in detect_emulation("mips", root, host="x86_64").reason


def test_this_hosts_binfmt_misc() -> None:
    """The real /proc/sys/fs/binfmt_misc. CI provisions QEMU (builder/cross/provision.sh), so
    there it must be available; elsewhere an unavailable answer must say why."""
    found = detect_emulation("aarch64", BINFMT_ROOT)
    if in_ci():
        assert found.available, found.reason
    if not found.available:
        assert found.reason
        pytest.skip(f"no aarch64 emulation on this machine (CI would fail): {found.reason}")
    assert "F" in found.flags or found.reason.startswith("native")


# -- a real arm64 container ---------------------------------------------------------------


@pytest.fixture(scope="module")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An arm64 image made of Debian's static busybox (a few MB), removed afterwards."""
    engine = docker_engine()
    if in_ci():
        require_emulation("aarch64")  # CI provisions QEMU: a missing one is a failure
    if not detect_emulation("aarch64").available:
        pytest.skip("no aarch64 emulation on this machine (CI would fail)")
    root = tmp_path_factory.mktemp("busybox") / "rootfs"
    busybox = busybox_rootfs(root)
    for applet in ("sh", "sleep", "uname", "mkdir", "cat"):
        (root / "bin" / applet).symlink_to("busybox")
    assert busybox.read_bytes()[18:20] == b"\xb7\x00"  # e_machine: EM_AARCH64
    tarball = root.parent / "rootfs.tar"
    with tarfile.open(tarball, "w") as tf:
        tf.add(root, arcname=".")
    tag = f"test-{uuid.uuid4().hex[:12]}"
    engine.import_rootfs(tarball, "ampforge/test-busybox-arm64", tag)
    ref = f"ampforge/test-busybox-arm64:{tag}"
    yield ref
    engine.remove_image(ref)


def test_arm64_container_runs_under_qemu(busybox_image: str) -> None:
    """The engine's own container session (what the emulated backend's steps run in) on an
    arm64 image: every process in it is an aarch64 binary run through binfmt_misc."""
    engine = docker_engine()
    with engine.container(busybox_image, network=False) as session:
        result = session.run(["uname", "-m"], step="uname")
        assert result.ok and result.tail[-1].strip() == "aarch64", result.tail
        # The kernel is this host's: only user space is emulated.
        result = session.run(["cat", "/proc/sys/kernel/osrelease"], step="kernel")
        assert result.tail[-1].strip() == os.uname().release
        cid = session.id
    assert cid not in engine.leftover_containers()  # removed on exit


def test_auto_falls_back_to_emulated_only_with_an_arm64_base_image(busybox_image: str) -> None:
    """``auto`` for aarch64 cells the cross path cannot build: emulated when the engine has the
    cells' arm64 base image, not otherwise (nothing is built or pulled implicitly)."""
    from builder.backends import registry  # noqa: PLC0415
    from builder.backends.base import Host  # noqa: PLC0415
    from builder.backends.emulated import local_base_tag  # noqa: PLC0415
    from builder.config import CliOverrides, load_settings  # noqa: PLC0415
    from builder.plan.resolve import resolve  # noqa: PLC0415
    from builder.redact import Redactor  # noqa: PLC0415

    settings = load_settings(CliOverrides(arch="ARM", python="3.12", torch="2.9.1"), {})
    arm = settings.config.images["ARM"]

    def resolved(ref: str):
        config = replace(
            settings.config, images={**settings.config.images, "ARM": replace(arm, ref=ref)}
        )
        (cell,) = resolve(
            replace(settings, config=config), Host(Redactor()), registry(), out=Path("dist")
        ).cells
        return cell

    engine = docker_engine()
    if engine.image_id(local_base_tag(resolved(busybox_image).cell)) is None:
        # (else the local arm64 image would rightly be chosen)
        cell = resolved("ampforge/test-no-such-image:arm64")
        assert not cell.buildable and "emulated:" in cell.backend_reason
        assert "has no aarch64 base image" in cell.backend_reason
    cell = resolved(busybox_image)
    assert cell.buildable and cell.backend == "emulated"
    assert busybox_image in cell.backend_reason and "qemu-aarch64" in cell.backend_reason
    assert cell.cell.image.ref == busybox_image and cell.image.ref == busybox_image
    assert cell.cell.image.family == arm.family  # not a base-image build: no labels


# -- the emulated backend through the CLI (no compile starts) ----------------------------------


def test_emulated_backend_without_emulation_fails_naming_how_to_enable_it(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path,
        "--arch",
        "ARM",
        "--python",
        "3.11",
        "--torch",
        "2.9.1",
        "--backend",
        "emulated",
        AMPFORGE_BINFMT_ROOT=str(tmp_path / "nothing"),
    )
    assert r.rc == 1, r.err
    assert "aarch64 emulation is unavailable" in r.err and "provision.sh" in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_base_image_for_arm_without_emulation_fails_naming_how_to_enable_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("base-image needs root (CI runs as root)")
    docker_engine()
    env = dict(os.environ, AMPFORGE_BINFMT_ROOT=str(tmp_path / "nothing"), PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "builder", "base-image", "--arch", "ARM", "--force"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "aarch64 emulation is unavailable" in r.stderr and "F flag" in r.stderr
    assert "debootstrap" not in r.stderr  # refused before any work started


def test_emulated_backend_with_a_missing_base_image_names_the_command(tmp_path: Path) -> None:
    docker_engine()
    if not detect_emulation("aarch64").available:
        pytest.skip("no aarch64 emulation on this machine (CI would fail)")
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path,
        "--arch",
        "ARM",
        "--python",
        "3.11",
        "--torch",
        "2.9.1",
        "--backend",
        "emulated",
        "--base-image",
        "ampforge/test-no-such-image:arm64",
    )
    assert r.rc == 1, r.err
    assert (
        "backend for cp311-manylinux_aarch64-torch2.9.1: emulated -- emulated asked for "
        "(command line --backend)" in r.err
    )
    assert (
        "base image ampforge/test-no-such-image:arm64 for cp311-manylinux_aarch64-"
        "torch2.9.1 is not in the engine" in r.err
    )
    assert "python -m builder base-image --arch ARM" in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_unknown_backend_and_arch_are_usage_errors(tmp_path: Path) -> None:
    r = run_build(tmp_path, "--arch", "ARM", BUILDER_BACKEND="emulate")
    assert r.rc == 2 and "unknown backend 'emulate'" in r.err and "emulated" in r.err
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r2 = subprocess.run(
        [sys.executable, "-m", "builder", "base-image", "--arch", "sparc"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert (
        r2.returncode == 2 and "--arch: unknown arch 'sparc'; expected one of X86, ARM" in r2.stderr
    )
