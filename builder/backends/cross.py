"""The ``cross`` backend: aarch64 cells on an x86_64 host, cross-compiled with
``aarch64-linux-gnu-g++`` against the aarch64 torch, repaired with auditwheel, verified by running
the wheel under ``qemu-aarch64`` (:mod:`builder.cross` has the building blocks). This module is the
only place that orchestrates them into a cell."""

from __future__ import annotations

import platform
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from builder.backend_kinds import CROSS
from builder.backends.base import Availability, Built, CellJob, Host
from builder.backends.pipenv import pip_env
from builder.backends.session import repair_with_command
from builder.backends.torchenv import host_torch_env
from builder.config import BuildConfig
from builder.config.support import SupportTable
from builder.cross.build import cross_build_wheel
from builder.cross.qemu import extension_modules, verify_wheel
from builder.cross.repair import CROSS_EXCLUDES, repair_cross_wheel
from builder.cross.sysroot import DEBIAN_PYTHONS, TargetPython, ensure_target_python
from builder.cross.target_torch import (
    TargetTorch,
    ensure_target_torch,
    require_cpu_torch,
    wheel_cxx11_abi,
)
from builder.cross.toolchain import (
    CrossToolchain,
    CrossToolchainMissing,
    find_qemu,
    find_toolchain,
)
from builder.engines.host import HostEngine, find_python
from builder.errors import StepFailed
from builder.incell.steps import add_compile_flags
from builder.inputkey import BUILDER_DIR, tree_digest
from builder.plan.cells import Cell
from builder.plan.resolved import BuildHost, ImageChoice
from builder.projecttree import copy_project_tree
from builder.release.manifest import sha256_file
from builder.wheel.repair import oldest_tag, split_wheel_name
from builder.wheel.verify import check_no_bundled_torch
from builder.wheel.wheelcheck import (
    check_needs_within,
    check_tag_covers_own_code,
    platform_record,
    version_needs,
)


def cross_available(machine: str, python: str) -> tuple[bool, str]:
    """Whether the cross path can build (*machine*, *python*) here, and why (or why not)."""
    if platform.machine() != "x86_64":
        return False, f"host is {platform.machine()}, the cross path runs on x86_64 hosts"
    if machine != "aarch64":
        return False, f"cross compilation targets aarch64 only, not {machine}"
    if python not in DEBIAN_PYTHONS:
        return False, (
            f"no aarch64 Python {python} sysroot: no Debian release ships an arm64 "
            f"Python {python} to verify the wheel against (cross Pythons: "
            f"{', '.join(DEBIAN_PYTHONS)})"
        )
    try:
        find_toolchain(machine)
        find_qemu(machine)
    except CrossToolchainMissing as exc:
        return False, exc.message
    return True, "x86_64 host, aarch64 cell: aarch64-linux-gnu-g++ and qemu-aarch64 present"


#: The host interpreter's X.Y: the builder's own (its pinned dependencies are for it), which need
#: not be the target's -- the target's sysconfig and headers make the module and the tags.
HOST_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def build_host(support: SupportTable) -> BuildHost:
    """What runs a cross cell's project build on this host (the resolved record's
    ``build_host``): the host's Python with the support table's ``cross_host_torch``."""
    torch = support.cross_host_torch
    return BuildHost(
        python=HOST_PYTHON,
        torch=torch,
        reason=(
            f"the project's build runs on this host with torch.utils.cpp_extension, pointed "
            f"at the target torch's headers and libraries: torch {torch} (cross_host_torch "
            f"in {support.file}) in a cached environment of this host's Python "
            f"{HOST_PYTHON}"
        ),
    )


def download_env(job: CellJob) -> dict[str, str]:
    """pip's environment for the cross path's downloads (the target torch and its dependencies):
    the build's proxies, indexes and CA bundle (builder.backends.pipenv); offline, the
    wheelhouse alone."""
    env = pip_env(job.config, job.proxy_env, job.opts.work / "ca")
    if job.opts.offline and job.opts.wheelhouse is not None:
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(job.opts.wheelhouse.resolve()))
    return env


def host_build_python(job: CellJob) -> str:
    """The cell's host torch environment (made once per key, cached like the host backend's);
    its interpreter runs the project's build. One line naming what is missing when it cannot be
    made."""
    host = job.resolved.image.build_host or build_host(job.config.support)
    need = (
        f"the cross backend needs a host torch to run the project's build (torch "
        f"{host.torch} for this host's Python {host.python}: cross_host_torch in "
        f"{job.config.support.file})"
    )
    try:
        python = str(find_python(host.python))
        return host_torch_env(job, python, download_env(job), torch=host.torch)
    except StepFailed as exc:  # the first line says what and how; the details follow
        raise StepFailed(f"{need}, which could not be set up:\n{exc.message}") from None


def target_extras(job: CellJob) -> tuple[str, ...]:
    """What the target site gets beside torch: the cell's bounded setuptools where the table
    bounds one. torch 2.1 imports pkg_resources at run time too (torch/torch_version.py, when
    torch._dynamo compares versions: amp's self-test gets there), which a venv of its Pythons
    provides (ensurepip's setuptools) and a bare --target site does not."""
    bounded = job.resolved.setuptools
    return (bounded,) if bounded != "setuptools" else ()


def check_target_abi(job: CellJob, torch: TargetTorch) -> TargetTorch:
    """The target torch's own TorchConfig.cmake must say the string ABI the cell's record says
    (the support table's torch_cxx11_abi): the hook compiles with the record's value."""
    found = wheel_cxx11_abi(torch.torch_dir)
    if found is not None and found != job.resolved.cxx11_abi:
        raise StepFailed(
            f"torch {torch.version} for {job.cell.machine} ({torch.wheel.name}) was built with "
            f"_GLIBCXX_USE_CXX11_ABI={int(found)}, but {job.resolved.cxx11_abi_reason}: correct "
            "the table"
        )
    return torch


@dataclass(frozen=True)
class CrossTarget:
    """What a cross cell is built against (all cached under ~/.cache/ampforge)."""

    toolchain: CrossToolchain
    python: TargetPython
    torch_wheel: Path  # a CPU build (checked), so the result can be verified under QEMU

    @property
    def sysroot_id(self) -> str:
        """The sysroot's cache entry (named by the hash of its .debs), e.g.
        ``python3.11-aarch64-b8578677f7daa3d2``."""
        return self.python.sysroot.parent.name  # builder.cross.sysroot: <entry>/root

    def key(self) -> dict[str, Any]:
        return {
            "cross_sources": tree_digest(BUILDER_DIR / "cross"),
            "toolchain": self.toolchain.version(),
            "target_python": self.sysroot_id,
            "target_torch": self.torch_wheel.name + ":" + sha256_file(self.torch_wheel),
        }


def project_copy(job: CellJob) -> Path:
    """The project's copy in the cell's stage (builder.projecttree), made once: what a
    test-command and a repair-wheel-command name as ``{project}`` -- never the caller's tree,
    which a command writing into ``{project}`` would change (the build itself works in a copy
    of its own, builder.cross.build)."""
    dest = job.stage / "project"
    if not dest.exists():
        copy_project_tree(job.opts.project, dest)
    return dest


def qemu_verify(
    job: CellJob, wheel: Path, target: CrossTarget, torch: TargetTorch
) -> dict[str, Any]:
    """The wheel's modules and the project's test-command on the target, under QEMU; the
    test's whole output goes to the cell's log."""

    def log(lines: Sequence[str]) -> None:
        job.log.open()
        try:
            for line in lines:
                job.log.write_line(line)
        finally:
            job.log.close()

    opts = job.opts
    project = project_copy(job) if opts.test.enabled else opts.project
    return verify_wheel(
        wheel,
        target.python,
        torch,
        test=opts.test,
        project=project,
        pip_env=download_env(job),
        wheelhouse=opts.wheelhouse,
        log=log,
        environment=job.config.build_options.environment,
    )


class CrossBackend:
    name = CROSS.name

    def __init__(self) -> None:
        self._targets: dict[str, CrossTarget] = {}

    def availability(self, cell: Cell, host: Host, support: SupportTable) -> Availability:
        ok, why = cross_available(cell.machine, cell.python)
        if not ok:
            return Availability(False, why)
        host_torch = support.cross_host_torch
        if not support.supports(host_torch, HOST_PYTHON, host.machine):
            return Availability(
                False,
                f"the cross builds' host torch {host_torch} "
                f"(cross_host_torch in {support.file}) has no wheel for "
                f"this host's Python {HOST_PYTHON}",
            )
        if support.is_cuda_build(cell.torch, cell.machine):
            return Availability(
                False,
                f"torch {cell.torch} for {cell.machine} is a CUDA build "
                f"(per {support.file}): it cannot be imported under "
                f"qemu-{cell.machine}, so the wheel could not be verified",
            )
        return Availability(True, why)

    def base_image(self, cell: Cell, host: Host, config: BuildConfig) -> ImageChoice:
        return ImageChoice(
            ref=f"cross:debian-arm64-python{cell.python}", build_host=build_host(config.support)
        )

    def _target(self, job: CellJob) -> CrossTarget:
        cell = job.cell
        if cell.identifier not in self._targets:
            toolchain = find_toolchain(cell.machine)
            python = ensure_target_python(cell.python, cell.machine)
            wheel = require_cpu_torch(
                cell.torch, python, env=download_env(job), platform=job.resolved.plat
            )
            self._targets[cell.identifier] = CrossTarget(toolchain, python, wheel)
        return self._targets[cell.identifier]

    def input_key(self, job: CellJob) -> dict[str, Any]:
        target = job.steps("cross target", lambda: self._target(job))
        host = job.resolved.image.build_host or build_host(job.config.support)
        # The host interpreter and torch run the project's setup.py.
        return {
            "excludes": list(CROSS_EXCLUDES),
            **target.key(),
            "build_host": {"python": host.python, "torch": host.torch},
        }

    def build(self, job: CellJob) -> Built:
        cell, opts, steps, stage = job.cell, job.opts, job.steps, job.stage
        target = self._target(job)
        torch = steps(
            "target torch",
            lambda: check_target_abi(
                job,
                ensure_target_torch(
                    cell.torch,
                    target.python,
                    env=download_env(job),
                    platform=job.resolved.plat,
                    extra_requirements=target_extras(job),
                ),
            ),
        )
        if job.reuse is not None:
            return self._verify_shared(job, target, torch)
        host_python = steps("host torch", lambda: host_build_python(job))
        env = {"AMP_LOCAL_VERSION": job.resolved.local_version or "", **opts.epoch_env()}
        add_compile_flags(env, list(job.config.build.extra_cflags))  # build.extra_cflags
        if opts.jobs:
            env["MAX_JOBS"] = str(opts.jobs)
        built = steps(
            "compile",
            lambda: cross_build_wheel(
                opts.project,
                stage / "raw",
                target.python,
                torch,
                target.toolchain,
                host_python=host_python,
                log_path=job.log_path,
                extra_env=env,  # the cell's log is the build's log
                ccache=opts.ccache,
                options=job.config.build_options,
                cxx11_abi=job.resolved.cxx11_abi,
                cxx_floor=job.resolved.cxx_floor,
                redact=job.log.redactor,
            ),
        )
        # Any project gets +torchX.Y (a no-op when its build honoured AMP_LOCAL_VERSION).
        (stage / "labelled").mkdir(parents=True, exist_ok=True)
        labelled = steps("version label", lambda: job.label(built.wheel, stage / "labelled"))
        ceiling = job.resolved.plat
        needs = steps(
            "symbol versions",
            lambda: check_needs_within(labelled, ceiling, job.resolved.plat_reason),
        )
        ldpaths = [*target.toolchain.lib_dirs, *target.python.lib_dirs]
        # auditwheel on this x86_64 host takes no explicit *_aarch64 plat (only auto): the
        # achieved tag is checked against the cell's resolved tag in verify instead.
        command = job.config.build_options.repair_wheel_command
        if command is not None:  # the project's own repair (cibuildwheel's), on this host

            def repair() -> Path:
                with HostEngine().session(log=job.log, parent=stage) as session:
                    return repair_with_command(
                        session,
                        str(labelled),
                        stage / "repaired",
                        command,
                        project=str(project_copy(job)),
                        options=job.config.build_options,
                    )

            repaired_wheel = steps("repair", repair)
            repaired_tag = oldest_tag(split_wheel_name(repaired_wheel.name)[4])
        else:
            repaired = steps(
                "repair",
                lambda: repair_cross_wheel(labelled, stage / "repaired", ldpaths, CROSS_EXCLUDES),
            )
            repaired_wheel, repaired_tag = repaired.wheel, repaired.tag
        job.normalize(repaired_wheel)

        def verify() -> dict[str, Any]:
            check_no_bundled_torch(repaired_wheel)
            check_tag_covers_own_code(repaired_wheel, ceiling)
            # The cell's own torch, never a substitute: require_cpu_torch made sure it can run.
            return qemu_verify(job, repaired_wheel, target, torch)

        report = steps("verify (qemu)", verify)
        return Built(
            wheel=repaired_wheel,
            torch=torch.full_version,
            compiler=f"{target.toolchain.cxx.name} {target.toolchain.version()}",
            tag=repaired_tag,
            modules=tuple(extension_modules(repaired_wheel)),
            base_image=f"cross:{target.sysroot_id}",
            extra={
                "verification": report,
                "platform": platform_record(repaired_tag, ceiling, needs),
                **({"ccache": asdict(built.ccache)} if built.ccache is not None else {}),
            },
        )

    def _verify_shared(self, job: CellJob, target: CrossTarget, torch: TargetTorch) -> Built:
        """Another cell's abi3 wheel, run under QEMU on this cell's Python (no compile)."""
        assert job.reuse is not None
        (job.stage / "shared").mkdir(parents=True, exist_ok=True)
        wheel = job.stage / "shared" / job.reuse.name
        shutil.copy2(job.reuse, wheel)
        ceiling = job.resolved.plat

        def verify() -> dict[str, Any]:
            check_no_bundled_torch(wheel)
            check_tag_covers_own_code(wheel, ceiling)
            return qemu_verify(job, wheel, target, torch)

        report = job.steps("verify (qemu)", verify)
        tag = oldest_tag(split_wheel_name(wheel.name)[4])
        return Built(
            wheel=wheel,
            torch=torch.full_version,
            compiler="(not compiled: shared)",
            tag=tag,
            modules=tuple(extension_modules(wheel)),
            base_image=f"cross:{target.sysroot_id}",
            extra={
                "verification": report,
                "platform": platform_record(tag, ceiling, version_needs(wheel)),
            },
        )
