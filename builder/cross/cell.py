"""One ARM cell through the cross-compiled fast path: build -> repair -> verify under QEMU.

This is the single entry point the pipeline calls for ``BACKEND=cross`` (and for ``auto`` on an
x86_64 host whose cell is aarch64, when :func:`cross_available` says yes). Every step's wall time
is reported so that progress displays and benchmarks can show it.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder.cross.build import cross_build_wheel
from builder.cross.qemu import verify_wheel
from builder.cross.repair import CROSS_EXCLUDES, repair_cross_wheel
from builder.cross.sysroot import DEBIAN_PYTHONS, ensure_target_python
from builder.cross.target_torch import ensure_target_torch
from builder.cross.toolchain import CrossToolchainMissing, find_qemu, find_toolchain


@dataclass
class CrossCellResult:
    wheel: Path  # repaired manylinux_2_NN_<arch> wheel in out_dir
    tag: str
    linux_wheel: Path  # the unrepaired build output (kept in the scratch folder for logs)
    compiler: str  # e.g. "aarch64-linux-gnu-g++ 12.2.0"
    target_torch: str  # torch.__version__ compiled against and verified with
    verification: dict | None  # verify_wheel's report (None when not verified)
    seconds: dict[str, float] = field(default_factory=dict)  # step -> wall time
    log: Path | None = None


def cross_available(arch: str, python: str) -> tuple[bool, str]:
    """Whether the cross path can build (``arch``, ``python``) here, and why (for ``auto``)."""
    if platform.machine() != "x86_64":
        return False, f"host is {platform.machine()}, the cross path runs on x86_64 hosts"
    if arch != "aarch64":
        return False, f"cross compilation targets aarch64 only, not {arch}"
    if python not in DEBIAN_PYTHONS:
        # Callers add what does build (DEBIAN_PYTHONS) to their own message.
        return False, (f"no aarch64 Python {python} sysroot on this host: no Debian release "
                       f"ships an arm64 Python {python} to verify the wheel against")
    try:
        find_toolchain(arch)
        find_qemu(arch)
    except CrossToolchainMissing as exc:
        return False, exc.message
    return True, "x86_64 host, aarch64 cell: aarch64-linux-gnu-g++ and qemu-aarch64 present"


def build_cross_cell(project: Path, out_dir: Path, python: str, torch: str, *,
                     arch: str = "aarch64", verify: bool = True, verify_torch: str | None = None,
                     local_version: str | None = None, cache: Path | None = None,
                     work_dir: Path | None = None) -> CrossCellResult:
    """Cross-build ``project`` for (``arch``, ``python``, ``torch``) into ``out_dir``.

    ``verify_torch`` is the torch used for the QEMU run (default: ``torch``); it must be a CPU
    build for ``arch`` (aarch64 torch 2.13.0 on the index is a CUDA build and cannot import
    without CUDA libraries; 2.9.1 is CPU). ``local_version`` is passed to the project as
    ``AMP_LOCAL_VERSION`` (e.g. ``torch2.9``). ``work_dir`` keeps the unrepaired wheel and the
    build log (default: a new temporary folder, left in place for the log).
    """
    seconds: dict[str, float] = {}
    t = time.monotonic()
    toolchain = find_toolchain(arch)
    target_python = ensure_target_python(python, arch, cache)
    target_torch = ensure_target_torch(torch, target_python, cache)
    seconds["prepare"] = time.monotonic() - t

    # Never inside out_dir: dist/ holds finished wheels and the manifest only.
    work = work_dir or Path(tempfile.mkdtemp(prefix="ampforge-cross-work-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = {"AMP_LOCAL_VERSION": local_version} if local_version else {}
    built = cross_build_wheel(project, work, target_python, target_torch, toolchain,
                              extra_env=extra)
    seconds["build"] = built.seconds

    t = time.monotonic()
    ldpaths = [*toolchain.lib_dirs, *target_python.lib_dirs]
    repaired = repair_cross_wheel(built.wheel, work / "repaired", ldpaths, CROSS_EXCLUDES)
    seconds["repair"] = time.monotonic() - t

    report = None
    if verify:
        t = time.monotonic()
        run_torch = target_torch if verify_torch in (None, torch) else ensure_target_torch(
            verify_torch, target_python, cache)
        report = verify_wheel(repaired.wheel, target_python, run_torch)
        seconds["verify"] = time.monotonic() - t

    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / repaired.wheel.name
    tmp = out_dir / f".{final.name}.part"
    shutil.copyfile(repaired.wheel, tmp)
    tmp.replace(final)  # atomic: dist/ never holds a half-written wheel
    return CrossCellResult(
        wheel=final, tag=repaired.tag, linux_wheel=built.wheel,
        compiler=f"{toolchain.cxx.name} {toolchain.version()}",
        target_torch=target_torch.full_version, verification=report, seconds=seconds,
        log=built.log,
    )
