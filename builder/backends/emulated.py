"""The ``emulated`` backend's choices: which arm64 base image, and when ``auto`` falls back to it.

An emulated cell is a docker cell whose image is another arch's (an arm64 rootfs from
``python -m builder base-image --arch ARM``), run under QEMU user emulation: the pipeline's
docker steps run unchanged. What differs is only here:

* explicitly (``--backend emulated``): emulation must work for every foreign cell (else an
  :class:`~builder.engines.emulation.EmulationUnavailable` that says how to enable it), and the
  cells'
  base image is ``--base-image REF`` / ``local`` (build or reuse the local arm64 image), or the
  config's image when the engine has it, or else the local arm64 image when it was built;
* ``auto`` keeps the cross path for aarch64 cells whenever it can build them; only when it
  cannot, *and* emulation works *and* the engine has an arm64 base image (nothing is built or
  pulled implicitly), do those cells go to emulated containers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional

from builder.config.load import BuildConfig
from builder.engines.docker import DockerEngine
from builder.engines.emulation import detect_emulation, require_emulation
from builder.pipeline import BackendChoice, with_base_image
from builder.plan.cells import Cell


def local_base_tag(cell: Cell) -> str:
    """The tag ``python -m builder base-image --arch <cell's arch>`` gives its image."""
    from builder.images.base_image import BaseImageSpec  # noqa: PLC0415 - needs auditwheel metadata

    return BaseImageSpec(arch=cell.machine).tag


def _present_base(config: BuildConfig, cell: Cell, engine: DockerEngine) -> Optional[str]:
    """The config's base image for *cell*'s arch when the engine has it, else the local one
    when it was built, else None."""
    for ref in (config.images[cell.arch].ref, local_base_tag(cell)):
        if engine.image_id(ref) is not None:
            return ref
    return None


def choose_emulated(
    config: BuildConfig, foreign: Sequence[Cell], base_ref: Optional[str],
    engine: DockerEngine, say: Callable[[str], None],
) -> tuple[BackendChoice, BuildConfig]:
    """``--backend emulated``: the choice, and *config* with the foreign cells' base image."""
    found = [require_emulation(m) for m in sorted({c.machine for c in foreign})]
    for cell in {c.arch: c for c in foreign}.values():
        ref = base_ref
        if ref == "local":
            from builder.images.base_image import BaseImageSpec, build_base_image  # noqa: PLC0415

            say(f"base image: building or reusing the local {cell.arch} one (python -m builder "
                f"base-image --arch {cell.arch})")
            made = build_base_image(engine, BaseImageSpec(arch=cell.machine),
                                    progress=lambda m: say(f"base image: {m}"))
            ref = made.tag
            say(f"base image: {made.tag} ({'reused' if made.reused else 'built'})")
        elif ref is None:
            ref = _present_base(config, cell, engine)
        if ref is not None:
            config = with_base_image(config, cell.arch, ref, engine)
        # None: the config's image stays; the pipeline's base-image step names what to do.
    why = "; ".join(e.reason for e in found) or "no cell of another arch"
    return BackendChoice("emulated", f"asked for (--backend emulated); engine {engine.base_url}"
                                     f"; {why}", engine), config


def emulated_fallback(
    config: BuildConfig, foreign: Sequence[Cell], engine: DockerEngine,
) -> tuple[Optional[str], BuildConfig]:
    """``auto`` when the cross path cannot build *foreign*: (why emulated containers can, the
    config with their base image), or (None, *config*) when they cannot either."""
    if not foreign:
        return None, config
    reasons = []
    for cell in {c.arch: c for c in foreign}.values():
        emu = detect_emulation(cell.machine)
        if not emu.available:
            return None, config
        ref = _present_base(config, cell, engine)
        if ref is None:
            return None, config
        config = with_base_image(config, cell.arch, ref, engine)
        reasons.append(f"{cell.arch} cells in emulated containers of {ref} ({emu.reason})")
    return "; ".join(reasons), config
