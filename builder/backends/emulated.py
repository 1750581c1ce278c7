"""The ``emulated`` backend: another arch's cells in that arch's base image (an arm64 rootfs from
``python -m builder base-image --arch ARM``), run under QEMU user emulation (binfmt_misc): exactly
the docker backend's steps, only many times slower. This host's own cells, when asked for with
``--backend emulated``, run natively in the engine, as with the docker backend.

``auto`` uses it for a foreign cell only when the cross path cannot build the cell, emulation
works, and the engine already has an arm64 base image (nothing is built or pulled implicitly)."""

from __future__ import annotations

from typing import Any, Optional

from builder.backend_kinds import EMULATED
from builder.backends.base import Availability, Built, CellJob, Host
from builder.backends.docker import (
    DockerBackend,
    base_image_step,
    build_in_container,
    container_key,
    image_above_torch,
    image_choice,
)
from builder.config import BuildConfig
from builder.config.support import SupportTable
from builder.engines.emulation import how_to_enable, require_emulation
from builder.plan.cells import Cell
from builder.plan.resolved import ImageChoice


def local_base_tag(cell: Cell) -> str:
    """The tag ``python -m builder base-image --arch <cell's arch>`` gives its image."""
    from builder.images.base_image import BaseImageSpec  # noqa: PLC0415 - needs auditwheel

    return BaseImageSpec(arch=cell.machine).tag


def present_base(cell: Cell, host: Host) -> Optional[str]:
    """The cell's configured base image when the engine has it, else the local one of that arch
    when it was built, else None."""
    for ref in (cell.image.ref, local_base_tag(cell)):
        if host.image_id(ref) is not None:
            return ref
    return None


class EmulatedBackend:
    name = EMULATED.name

    def availability(self, cell: Cell, host: Host, support: SupportTable) -> Availability:
        if cell.machine == host.machine:
            native = DockerBackend().availability(cell, host, support)
            return Availability(
                native.ok,
                f"this host's cell runs natively in the engine; {native.reason}",
                pull=native.pull,
            )
        above = image_above_torch(cell, support)
        if above is not None:
            return Availability(False, above)
        emulation = host.emulation(cell.machine)
        if not emulation.available:
            return Availability(
                False,
                f"{cell.machine} emulation is unavailable on this "
                f"{host.machine} host: {emulation.reason}; "
                f"{how_to_enable(cell.machine)}",
            )
        if host.engine() is None:
            return Availability(False, host.engine_reason())
        if support.is_cuda_build(cell.torch, cell.machine):
            return Availability(
                False,
                f"torch {cell.torch} for {cell.machine} is a CUDA build "
                f"(per {support.file}): its CUDA libraries would have to "
                "be installed and imported under QEMU",
            )
        if cell.image.pinned:  # --base-image: that image or none (the build step says how)
            return Availability(
                True,
                f"{cell.arch} cells in emulated containers of "
                f"{cell.image.ref} ({emulation.reason})",
            )
        ref = present_base(cell, host)
        if ref is None:
            return Availability(
                False,
                f"{host.engine_reason()} has no {cell.machine} base "
                f"image ({cell.image.ref} or `python -m builder "
                f"base-image --arch {cell.arch}`)",
            )
        return Availability(
            True, f"{cell.arch} cells in emulated containers of {ref} ({emulation.reason})"
        )

    def base_image(self, cell: Cell, host: Host, config: BuildConfig) -> ImageChoice:
        ref = cell.image.ref
        if cell.machine != host.machine and not cell.image.pinned:
            ref = present_base(cell, host) or ref
        return image_choice(ref, cell, host)

    def input_key(self, job: CellJob) -> dict[str, Any]:
        assert job.engine is not None and job.recipe is not None
        if job.cell.machine != job.resolved.host_machine:
            job.steps("emulation", lambda: require_emulation(job.cell.machine))
        base_id = base_image_step(
            job,
            job.engine,
            f"python -m builder base-image --arch {job.cell.arch}",
            "--backend cross",
        )
        return container_key(job.recipe, job.cell.image, base_id)

    def build(self, job: CellJob) -> Built:
        assert job.engine is not None
        return build_in_container(job, job.engine, job.engine.image_id(job.cell.image.ref) or "")
