"""ARM (aarch64) wheels from an x86_64 host: cross-compiled build, auditwheel repair, QEMU check.

Building blocks with plain typed parameters (see each module):

* :func:`find_toolchain` / :func:`find_qemu` -- host tools, or a message saying how to provision
  them (``builder/cross/provision.sh``);
* :func:`ensure_target_python` -- Debian arm64 CPython unpacked into a cached sysroot;
* :func:`ensure_target_torch` -- the aarch64 torch wheel + its dependencies, cached by content;
* :func:`cross_build_wheel` -- the project's PEP 517 build as a cross build -> ``linux_aarch64``;
* :func:`repair_cross_wheel` -- auditwheel ``--plat auto`` with ``--ldpaths`` -> manylinux;
* :func:`run_wheel_under_qemu` / :func:`verify_wheel` -- run it (its modules, the project's
  test-command) on the emulated target.

:mod:`builder.backends.cross` is the one place that orchestrates them into a cell.
"""

from builder.cross.build import CrossBuildResult, cross_build_env, cross_build_wheel
from builder.cross.qemu import (
    QemuRun,
    run_target_python,
    run_wheel_under_qemu,
    verify_wheel,
)
from builder.cross.repair import CROSS_EXCLUDES, CrossRepair, repair_cross_wheel, show_wheel
from builder.cross.sysroot import TargetPython, ensure_target_python
from builder.cross.target_torch import TargetTorch, ensure_target_torch
from builder.cross.toolchain import (
    CrossToolchain,
    CrossToolchainMissing,
    find_qemu,
    find_toolchain,
)

__all__ = [
    "CROSS_EXCLUDES",
    "CrossBuildResult",
    "CrossRepair",
    "CrossToolchain",
    "CrossToolchainMissing",
    "QemuRun",
    "TargetPython",
    "TargetTorch",
    "cross_build_env",
    "cross_build_wheel",
    "ensure_target_python",
    "ensure_target_torch",
    "find_qemu",
    "find_toolchain",
    "repair_cross_wheel",
    "run_target_python",
    "run_wheel_under_qemu",
    "show_wheel",
    "verify_wheel",
]
