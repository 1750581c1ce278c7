"""The ``docker`` backend: the cell's image is built from its rendered Dockerfile (proxies as build
arguments, content-addressed tag, so an unchanged recipe is not rebuilt), then every in-cell step
runs in one container that is removed on every exit path. A Podman socket speaking the Docker API
is an engine of this backend (DOCKER_HOST), not a backend of its own."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from builder.arch import emulated_cpu
from builder.backend_kinds import DOCKER, backend_kind
from builder.backends.base import Availability, Built, CellJob, Host
from builder.backends.session import build_in_cell
from builder.backends.torchenv import IMAGE_VENV_PYTHON, docker_torch_image
from builder.config import BaseImage, BuildConfig
from builder.config.proxy import ProxySettings
from builder.config.support import SupportTable
from builder.engines.docker import CONTAINER_LABEL, DockerEngine
from builder.engines.pull import needs_pull, pull_image
from builder.errors import StepFailed
from builder.inputkey import input_key
from builder.plan.cells import Cell
from builder.plan.resolved import ImageChoice
from builder.wheel.repair import CONTAINER_AUDITWHEEL
from builder.wheel.wheelcheck import tag_glibc

if TYPE_CHECKING:
    from builder.images.render import Recipe
    from builder.plan.resolved import ResolvedCell

#: Label on every container of one ``build`` run, so an interrupted parallel run can remove them.
RUN_LABEL = f"{CONTAINER_LABEL}.run"
#: Where the wheelhouse is mounted inside containers (the rendered recipe's PIP_FIND_LINKS).
CONTAINER_WHEELHOUSE = "/wheelhouse"
CCACHE_VOLUME = "ampforge-ccache"


def ccache_volume() -> str:
    """The engine volume holding the compiler cache: ``$AMPFORGE_CCACHE_VOLUME`` when set (a
    private cache, e.g. per CI job or for a cold benchmark), else ``ampforge-ccache``."""
    return os.environ.get("AMPFORGE_CCACHE_VOLUME") or CCACHE_VOLUME


#: The labels ``python -m builder base-image`` gives its images (Debian inside).
SUITE_LABEL = "org.ampforge.base.suite"
PLAT_LABEL = "org.ampforge.base.plat"


class BaseImageMissing(StepFailed):
    """The cell's base image is not in the engine and the pull policy is ``never``."""


def image_above_torch(cell: Cell, support: SupportTable) -> Optional[str]:
    """Why the cell's base image cannot build it (None: it can): an image whose glibc is newer
    than torch's own wheel makes wheels that need that glibc, so they would not install where
    their torch does (the Ascend lines' manylinux2014 torches in a manylinux_2_28 image)."""
    ceiling = support.torch_plat(cell.torch, cell.machine)
    try:
        image_glibc, _ = tag_glibc(cell.image.plat)
        torch_glibc, _ = tag_glibc(ceiling)
    except StepFailed:
        return None  # an image without a manylinux tag (a local Debian one): the checks decide
    if image_glibc <= torch_glibc:
        return None
    return (
        f"its base image {cell.image.ref} is {cell.image.plat}, newer than torch "
        f"{cell.torch}'s own {ceiling} (per {support.file}): a wheel built there would not "
        f"install wherever torch does; set the config's images.{cell.arch} to a "
        f"{ceiling.rsplit('_', 1)[0].replace('manylinux_2_17', 'manylinux2014')} image"
    )


def image_choice(ref: str, cell: Cell, host: Host) -> ImageChoice:
    """*ref* as the cell's image: images made by ``builder base-image`` are Debian inside, their
    family and glibc tag come from their labels (so the recipe uses apt)."""
    family, plat = cell.image.family, cell.image.plat
    labels = host.image_labels(ref)
    if SUITE_LABEL in labels:
        family, plat = "debian", labels.get(PLAT_LABEL, plat)
    return ImageChoice(ref=ref, image_id=host.image_id(ref), family=family, plat=plat)


def base_image_step(job: CellJob, engine: DockerEngine, make_base: str, other: str) -> str:
    cell = job.cell

    def base() -> str:
        found = engine.image_id(cell.image.ref)
        if found is None:
            raise BaseImageMissing(
                f"base image {cell.image.ref} for {cell.identifier} is not in the engine at "
                f"{engine.base_url} and the pull policy is {cell.image.pull} (--offline means "
                f"never). Either --pull missing, or `docker pull {cell.image.ref}` (offline: "
                f"`docker load -i FILE.tar`), or build a local manylinux-shaped image with "
                f"`{make_base}` and pass --base-image local (make wheel BASE_IMAGE=local), or "
                f"use {other}"
            )
        return found

    return job.steps("base image", base)


def container_key(recipe: Optional[Recipe], image: BaseImage, base_id: str) -> dict[str, Any]:
    """What decides a container-built wheel besides the cell and the project: the recipe, the
    base image's id, and the pinned digest on its own too (the recipe's FROM line has it
    already), so a rebuild after ``update-images`` names it as the input that changed."""
    assert recipe is not None, "docker cells are rendered before they are keyed"
    return {"recipe": recipe.digest, "base_image": base_id, "base_digest": image.digest}


def build_in_container(job: CellJob, engine: DockerEngine, base_id: str) -> Built:
    """The cell's image (reused when recipe and base image are unchanged), then the in-cell steps
    in one container."""
    cell, opts, log, recipe = job.cell, job.opts, job.log, job.recipe
    assert recipe is not None, "docker cells are rendered before they are built"
    tag = f"ampforge/cell:{cell.identifier}-{input_key({'r': recipe.digest, 'b': base_id})[:16]}"

    def image() -> str:
        found = engine.image_id(tag)
        if found is not None:
            log.note(f"ampforge: image {tag} is up to date (same recipe and base image)")
            return found
        folder = recipe.write(job.stage / "context")
        return engine.build_image(
            recipe.dockerfile,
            tag,
            context=folder,
            build_args=recipe.build_args,
            log=log,
            labels={"org.ampforge.cell": cell.identifier},
            network=None if opts.offline else opts.network,
        )

    image_id = job.steps("image", image)
    binds = {str(opts.wheelhouse.resolve()): CONTAINER_WHEELHOUSE} if opts.wheelhouse else {}
    wheelhouse = CONTAINER_WHEELHOUSE if opts.wheelhouse else None
    # torch (and the build requirements) once per key, as a layer on the cell image: the build
    # and the verification venv both use it (builder.backends.torchenv).
    torch_tag = job.steps(
        "torch", lambda: docker_torch_image(job, engine, tag, image_id, binds or None, wheelhouse)
    )
    env = {} if opts.offline else dict(recipe.build_args)  # proxies for pip, never in the image
    env.update(job.config.pip.network.env())  # the exec's, so a changed retry is no new image
    env.update(opts.epoch_env())
    if opts.jobs:
        env["MAX_JOBS"] = str(opts.jobs)
    cpu = emulated_cpu(cell.machine) if cell.machine != job.resolved.host_machine else None
    if cpu:  # binfmt's qemu-user reads it: the container's build and tests see that CPU
        env["QEMU_CPU"] = cpu
    # The compiler cache outlives the container in a named volume: a rebuild after a one-file
    # change recompiles only that file (used when the image has ccache, or --ccache).
    volumes = {}
    if opts.ccache is not False:
        volumes[ccache_volume()] = "/ccache"
        env["CCACHE_DIR"] = "/ccache"
    with engine.container(
        torch_tag,
        env=env,
        binds=binds,
        volumes=volumes,
        network=not opts.offline,
        network_name=opts.network,
        labels={
            RUN_LABEL: job.run_id,
            f"{CONTAINER_LABEL}.cell": cell.identifier,
            f"{CONTAINER_LABEL}.project": opts.project.name,
        },
        log=log,
    ) as session:
        built = build_in_cell(
            job,
            session,
            python=cell.python_path,
            wheelhouse=wheelhouse,
            auditwheel=CONTAINER_AUDITWHEEL,
            auditwheel_env=None,
            prepared=IMAGE_VENV_PYTHON,
        )
    built.base_image = base_id
    built.extra["image"] = tag
    built.extra["torch_image"] = torch_tag
    return built


class DockerBackend:
    name = DOCKER.name

    def availability(self, cell: Cell, host: Host, support: SupportTable) -> Availability:
        if cell.machine != host.machine:
            return Availability(
                False,
                f"docker runs {host.machine} containers here; "
                f"{cell.machine} cells need emulation (backend emulated)",
            )
        above = image_above_torch(cell, support)
        if above is not None:
            return Availability(False, above)
        engine = host.engine()
        if engine is None:
            return Availability(
                False,
                f"{host.engine_reason()}; start one (.ci/dockerd-up, or "
                "point DOCKER_HOST at a Podman socket) or build without "
                "containers: --backend host (make wheel BACKEND=host)",
            )
        ref, pull = cell.image.ref, cell.image.pull
        present = host.image_id(ref) is not None
        if cell.image.pinned:  # --base-image: that image (local: built on first use)
            how = (
                ""
                if present or ref.startswith(LOCAL_PREFIX) or pull == "never"
                else (f", pulled first: --pull {pull}")
            )
            return Availability(
                True, f"{host.engine_reason()}; base image {ref} (--base-image{how})"
            )
        if not present and pull == "never":
            return Availability(
                False,
                f"{host.engine_reason()} lacks the base image {ref} "
                "and nothing is pulled (--pull never, or offline): "
                "`docker pull` or `docker load` it, or build a local one "
                "with `python -m builder base-image` and pass "
                "--base-image local",
            )
        if not present:
            return Availability(
                True,
                f"{host.engine_reason()} lacks the base image {ref}; a "
                f"docker build pulls it first (--pull {pull})",
                pull=True,
            )
        again = " (pulled again first: --pull always)" if pull == "always" else ""
        return Availability(True, f"{host.engine_reason()} has the base image {ref}{again}")

    def base_image(self, cell: Cell, host: Host, config: BuildConfig) -> ImageChoice:
        return image_choice(cell.image.ref, cell, host)

    def input_key(self, job: CellJob) -> dict[str, Any]:
        engine = _engine(job)
        base_id = base_image_step(job, engine, "python -m builder base-image", "--backend host")
        return container_key(job.recipe, job.cell.image, base_id)

    def build(self, job: CellJob) -> Built:
        engine = _engine(job)
        return build_in_container(job, engine, engine.image_id(job.cell.image.ref) or "")


#: Tags of ``python -m builder base-image``'s images: built on demand by ``--base-image local``.
LOCAL_PREFIX = "ampforge/base:"


def pull_base_images(
    cells: Sequence[ResolvedCell],
    engine: DockerEngine,
    proxy: ProxySettings,
    say: Callable[[str], None],
) -> list[str]:
    """Pull the base images the cells' pull policy asks for (each image once), before any
    cell is built; return the refs pulled. :class:`~builder.engines.pull.PullFailed` (exit 1)
    says why one could not be, with the fix. Only images this host runs natively are pulled:
    the emulated backend's foreign-arch images come from ``base-image --arch`` or a bundle."""
    pulled: list[str] = []
    for c in cells:
        ref, policy = c.image.ref, c.cell.image.pull
        if (
            not backend_kind(c.backend).in_container
            or c.cell.machine != c.host_machine
            or ref.startswith(LOCAL_PREFIX)
            or ref in pulled
        ):
            continue
        if needs_pull(policy, engine.image_id(ref) is not None):
            say(f"base image: pulling {ref} (--pull {policy})")
            pull_image(engine, ref, proxy, say)
            pulled.append(ref)
    return pulled


def _engine(job: CellJob) -> DockerEngine:
    engine: Optional[DockerEngine] = job.engine
    if engine is None:
        raise StepFailed(f"{job.cell.identifier}: the docker backend needs a container engine")
    return engine
