"""``fetch``: gather what the selected cells need into an offline bundle (wheels + images)."""

from __future__ import annotations

import argparse
import platform
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from builder.backend_kinds import backend_kind
from builder.cli import (
    HOST_CELL,
    Context,
    add_config_options,
    add_selection_options,
    resolve_from_args,
)
from builder.diskspace import files_state
from builder.lockfile import LOCK_FILE

if TYPE_CHECKING:
    from builder.offline.preflight import Target

BUILDER_LOCK_NAME = f"builder/{LOCK_FILE.name}"

NAME = "fetch"
HELP = "gather every wheel and base image the selected cells need into an offline bundle"
DESCRIPTION = """\
On a connected machine: for every selected cell, `pip download --only-binary=:all:` for the
cell's Python and platform everything its build and smoke test install -- torch==<cell
torch> and its dependencies, setuptools and wheel, the project's build-system requires and
dependencies -- into DIR/wheels; `docker save` the cells' base images into DIR/images; and
write DIR/bundle.json (every file's sha256 and size, the cells it serves, image refs and
ids); and `pip download` the builder's own pinned environment (builder/requirements.lock)
for the Python running fetch into DIR/builder-wheels, so that the other machine sets the
builder up from the bundle too (`make` does, with OFFLINE=1 BUNDLE=DIR). Copy DIR to the
air-gapped machine and build there with
`python -m builder build --offline --bundle DIR` (make wheel OFFLINE=1 BUNDLE=DIR).

pip's own configuration applies (index, find-links, proxy and CA from pip.conf and the
environment); --find-links and --pip-arg add to it, e.g. a folder holding the CPU torch
wheel (the package index's x86_64 torch is a multi-GB CUDA build). Running fetch again
into the same DIR reuses what is already there. bundle.json is removed first and written
last: an interrupted fetch leaves no bundle.json, and a build refuses such a folder.

Default selection as for `build`: this host's arch and the builder's Python (--all: every
cell). Exit codes: 0 bundle complete, 1 a download or image save failed, 2 bad usage."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fetch")
    g.add_argument(
        "--bundle",
        metavar="DIR",
        default=None,
        help="the bundle folder to create or update (env BUILDER_BUNDLE; config offline.bundle)",
    )
    g.add_argument(
        "--project",
        metavar="PATH",
        default=None,
        help="the project to be built (its pyproject.toml requirements are "
        "fetched too; default: this repository, or the current directory "
        "for an installed builder)",
    )
    g.add_argument(
        "--find-links",
        metavar="DIR",
        action="append",
        default=[],
        help="extra folder or URL for pip to look in (repeatable)",
    )
    g.add_argument(
        "--pip-arg",
        metavar="ARG",
        action="append",
        default=[],
        help="extra argument for `pip download` (repeatable), e.g. --pip-arg=--index-url=URL",
    )
    g.add_argument(
        "--no-images",
        action="store_true",
        help="wheels only (no container engine needed; for --backend host builds)",
    )
    g.add_argument("--all", action="store_true", help="every cell of the matrix")
    add_selection_options(p, default=HOST_CELL)
    add_config_options(p)


def pip_download_argv(
    python: str,
    machine: str,
    platforms: Sequence[str],
    dest: Path,
    requirements: Sequence[str],
    find_links: Sequence[str] = (),
    pip_args: Sequence[str] = (),
) -> list[str]:
    """``pip download`` of binary wheels for another interpreter and platform."""
    cp = "cp" + python.replace(".", "")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "--only-binary=:all:",
        "--dest",
        str(dest),
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        cp,
    ]
    for plat in platforms:
        argv += ["--platform", plat]
    for link in find_links:
        argv += ["--find-links", link]
    return [*argv, *pip_args, *requirements]


def names_torch(requirement: str) -> bool:
    from packaging.requirements import Requirement  # noqa: PLC0415
    from packaging.utils import canonicalize_name  # noqa: PLC0415

    return canonicalize_name(Requirement(requirement).name) == "torch"


def target_torch_requirements(wheels: Path, target: Target, requirement: str) -> list[str]:
    """The requirements of the torch wheel in *wheels* that *requirement* (``torch==X``) chose
    for *target*, with their markers evaluated for the target's machine and Python."""
    from builder.errors import StepFailed  # noqa: PLC0415
    from builder.offline.preflight import index_wheelhouse, resolve  # noqa: PLC0415
    from builder.wheel.wheelmeta import target_requirements  # noqa: PLC0415

    chosen = resolve(index_wheelhouse(wheels), target, [requirement]).chosen
    torch = next((w for w in chosen.values() if w.name == "torch"), None)
    if torch is None:
        raise StepFailed(f"pip download left no {requirement} for {target.describe()} in {wheels}")
    return target_requirements(torch.path, target.machine, target.python)


def pip_env(base: Mapping[str, str], proxy_args: Mapping[str, str]) -> dict[str, str]:
    """The environment for pip: the caller's (pip.conf, PIP_*, proxies, CA) plus proxies
    that came from the config file or the command line."""
    env = dict(base)
    env.update(proxy_args)
    return env


def _download_failed(
    what: str, message: str, log_file: Path, dest: Path, before: dict[str, tuple[int, int]]
) -> Exception:
    """The error for a failed ``pip download`` into *dest* (*message*: the failure as pip's
    runner worded it, with pip's last lines). pip copies each file straight to its final name
    there, so whatever it wrote in this run may be cut short (a full disk, a kill) and a later
    fetch would take it as "already downloaded": those files go first."""
    from builder.diskspace import (  # noqa: PLC0415
        disk_full,
        full_line,
        fullest,
        paths_in_line,
        remove_changed,
    )
    from builder.errors import StepFailed  # noqa: PLC0415

    removed = remove_changed(dest, before)
    dropped = (
        f"\n(removed what it had written in this run, which may be cut short: {', '.join(removed)})"
        if removed
        else ""
    )
    line = full_line(message.splitlines())
    if line is not None:
        return disk_full(
            fullest([*paths_in_line(line), dest]),
            what=f"{what} into",
            detail=f"  {line[-300:]}{dropped}\n  full output in {log_file}",
        )
    return StepFailed(message + dropped)


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder import __version__  # noqa: PLC0415
    from builder.config import default_project  # noqa: PLC0415
    from builder.errors import ConfigError, EngineUnavailable, StepFailed  # noqa: PLC0415
    from builder.netpip import run_pip  # noqa: PLC0415
    from builder.offline.builderwheels import fetch_builder_wheels  # noqa: PLC0415
    from builder.offline.bundle import (  # noqa: PLC0415
        BUILDER_WHEELS_DIR,
        IMAGES_DIR,
        WHEELS_DIR,
        Bundle,
        BundleCell,
        BundleImage,
        begin_fetch,
        describe_file,
        safe_name,
        save_image,
        saved_name,
        write_bundle,
    )
    from builder.offline.preflight import (  # noqa: PLC0415
        Target,
        cell_requirements,
        describe_missing,
        host_torches,
        index_wheelhouse,
        resolve,
    )
    from builder.release.manifest import utc_now  # noqa: PLC0415
    from builder.wheel.integrity import damaged_wheels  # noqa: PLC0415

    err = ctx.output.err
    start = time.monotonic()
    settings, resolution = resolve_from_args(args, ctx, everything=args.all)
    config = settings.config
    root = config.offline.bundle
    if root is None:
        raise ConfigError(
            "no bundle folder given; expected --bundle DIR (env BUILDER_BUNDLE, "
            "config offline.bundle)",
            key="--bundle",
        )
    project = Path(args.project).resolve() if args.project else default_project()
    if not ((project / "pyproject.toml").is_file() or (project / "setup.py").is_file()):
        raise ConfigError(
            f"{project} is not a Python project; expected a folder with pyproject.toml or setup.py",
            key="--project",
        )
    engine = None
    if not args.no_images:
        from builder.engines.docker import DockerEngine  # noqa: PLC0415

        try:
            engine = DockerEngine(redactor=ctx.output.redact)
        except EngineUnavailable as exc:
            raise EngineUnavailable(
                exc.message + "\nfetch saves the base images with the "
                "container engine; --no-images fetches wheels only "
                "(for --backend host builds)"
            ) from exc
        if config.base_image == "local":
            from builder.images.base_image import build_base_image  # noqa: PLC0415

            made = build_base_image(engine, progress=lambda m: err(f"base image: {m}"))
            err(f"base image: {made.tag} ({'reused' if made.reused else 'built'})")
            # The image exists now: resolve again so the records carry its id and labels.
            settings, resolution = resolve_from_args(args, ctx, everything=args.all)
    elif config.base_image == "local":
        raise ConfigError(
            "--base-image local needs the container engine; drop --no-images", key="--base-image"
        )
    cells = [c.cell for c in resolution.cells]
    # Base images are saved for the cells built in one (docker, emulated); host and cross
    # cells build without an image.
    imaged = {c.identifier for c in resolution.cells if backend_kind(c.backend).in_container}

    old = begin_fetch(root)
    wheels_dir = root / WHEELS_DIR
    log_file = Path("build/ampforge/logs/fetch.log").resolve()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = pip_env(ctx.env, config.proxy.build_args())
    net = config.pip.network
    err(f"fetch: network: {net.describe()}")
    needed: dict[str, set[str]] = {}
    # Each cell's wheels for its Python and platform; then the cross cells' host torch (the
    # interpreter that runs the project's build on the build host), which the air-gapped
    # machine makes from the bundle too.
    machine = platform.machine()
    # A CUDA cell's toolkit pins travel with its torch (builder.plan.cudacell).
    toolkits = {r.identifier: r.cuda.toolkit for r in resolution.cells}
    # What each cell's build frontend installs (pypa/build, the pinned uv) travels too.
    frontends = {
        r.identifier: (r.build_options or config.build_options).frontend_requirements()
        for r in resolution.cells
    }
    downloads: list[tuple[Target, list[str], tuple[str, ...]]] = [
        (
            Target(c.python, c.machine, c.plat, c.identifier),
            cell_requirements(c.torch, project, toolkits[c.identifier], frontends[c.identifier]),
            (c.identifier,),
        )
        for c in cells
    ]
    downloads += [
        (
            host.target(machine, config.support.torch_plat(host.torch, machine)),
            cell_requirements(host.torch),
            host.cells,
        )
        for host in host_torches(
            [
                (c.identifier, c.image.build_host.key() if c.image.build_host is not None else None)
                for c in resolution.cells
            ]
        )
    ]
    with log_file.open("w") as log:
        for target, reqs, ids in downloads:
            err(f"fetch: {target.cell}: pip download {' '.join(reqs)} for {target.describe()}")
            before = files_state(wheels_dir)

            def download(
                requirements: Sequence[str], deps: bool = True, target: Target = target
            ) -> None:
                argv = pip_download_argv(
                    target.python,
                    target.machine,
                    target.platforms(),
                    wheels_dir,
                    requirements,
                    args.find_links,
                    [*args.pip_arg, *([] if deps else ["--no-deps"])],
                )
                run_pip(argv, env, net, log, ctx.output.redact, f"pip download for {target.cell}")

            try:
                if target.machine == machine:
                    download(reqs)
                else:
                    # pip evaluates environment markers against *this* host even with
                    # --platform, so an aarch64 torch would pull x86_64-only CUDA packages:
                    # torch alone first, then its requirements evaluated for the target.
                    # (The other requirements naming torch -- the project's own torch bound --
                    # are met by that pin.)
                    download(reqs[:1], deps=False)
                    download(
                        [
                            *target_torch_requirements(wheels_dir, target, reqs[0]),
                            *(r for r in reqs[1:] if not names_torch(r)),
                        ]
                    )
            except StepFailed as exc:
                raise _download_failed(
                    f"pip download for {target.cell}", exc.message, log_file, wheels_dir, before
                ) from exc
            # What pip fetched must be exactly enough for the offline build's pre-flight.
            res = resolve(index_wheelhouse(wheels_dir), target, reqs)
            if not res.ok:
                raise StepFailed(
                    describe_missing(res, f"bundle {root}") + "\n(pip download "
                    f"did not provide it; see {log_file})"
                )
            for w in res.chosen.values():
                needed.setdefault(f"{WHEELS_DIR}/{w.path.name}", set()).update(ids)
        # The builder's own pinned environment, for the machine that has only the bundle.
        err(
            f"fetch: the builder's environment: pip download -r {BUILDER_LOCK_NAME} for "
            f"Python {platform.python_version()} ({sysconfig.get_platform()})"
        )
        before = files_state(root / BUILDER_WHEELS_DIR)
        try:
            builder_env = fetch_builder_wheels(
                root, env, net, args.find_links, args.pip_arg, log, ctx.output.redact
            )
        except StepFailed as exc:
            raise _download_failed(
                "pip download of the builder's environment",
                exc.message,
                log_file,
                root / BUILDER_WHEELS_DIR,
                before,
            ) from exc

    images: list[BundleImage] = []
    image_files: dict[str, set[str]] = {}
    if engine is not None:
        by_ref: dict[str, list] = {}
        for cell in cells:
            if cell.identifier in imaged:
                by_ref.setdefault(cell.image.ref, []).append(cell)
        for ref, ref_cells in sorted(by_ref.items()):
            image_id = engine.image_id(ref)
            if image_id is None:
                names = ", ".join(c.identifier for c in ref_cells)
                raise StepFailed(
                    f"base image {ref} (cells {names}) is not in the engine "
                    f"at {engine.base_url}; nothing is pulled implicitly: "
                    "`docker pull` it first, or pass --base-image local"
                )
            name = saved_name(ref)  # a pin travels under a tag (docker save keeps no digest)
            rel = f"{IMAGES_DIR}/{safe_name(name)}.tar"
            tar = root / rel
            ref_ids = [c.identifier for c in ref_cells]
            if (
                old.get(f"image:{name}") == image_id
                and tar.is_file()
                and describe_file(root, rel, ref_ids).sha256 == old.get(rel)
            ):
                err(f"fetch: image {ref}: unchanged, reusing {rel}")
            else:
                err(
                    f"fetch: image {ref}: docker save -> {rel}"
                    + (f" (as {name})" if name != ref else "")
                )
                save_image(engine, ref, tar)
            images.append(
                BundleImage(
                    name,
                    image_id,
                    rel,
                    ref_cells[0].arch,
                    tuple(ref_ids),
                    pin=ref if name != ref else "",
                )
            )
            image_files[rel] = set(ref_ids)

    # Whatever pip left in the folders -- a file from an interrupted earlier fetch that pip
    # took as "already downloaded" included -- must be a whole wheel before bundle.json vouches
    # for it with its sha256.
    damaged = damaged_wheels(
        [*sorted(wheels_dir.glob("*.whl")), *(root / w["file"] for w in builder_env["wheels"])]
    )
    if damaged:
        raise StepFailed(
            f"damaged wheels in bundle {root} (no bundle.json written):\n  "
            + "\n  ".join(damaged)
            + "\ndelete them and run fetch again"
        )
    files = []
    reused = 0
    for whl in sorted(wheels_dir.glob("*.whl")):
        rel = f"{WHEELS_DIR}/{whl.name}"
        f = describe_file(root, rel, sorted(needed.get(rel, ())))
        reused += old.get(rel) == f.sha256
        files.append(f)
    for w in builder_env["wheels"]:
        f = describe_file(root, w["file"], ())
        reused += old.get(w["file"]) == f.sha256
        files.append(f)
    for rel, image_ids in sorted(image_files.items()):
        files.append(describe_file(root, rel, sorted(image_ids)))
    bundle = Bundle(
        root=root,
        files=files,
        images=images,
        cells=[
            BundleCell(c.identifier, c.arch, c.python, c.machine, c.plat, c.torch, c.image.ref)
            for c in cells
        ],
        builder_version=__version__,
        created=utc_now(),
        builder=builder_env,
    )
    path = write_bundle(bundle)
    size = sum(f.size for f in files) / 1e6
    err(
        f"fetch: {len(cells)} cell(s), {len(files) - len(images)} wheels ({reused} reused; "
        f"{len(builder_env['wheels'])} in {BUILDER_WHEELS_DIR}/ for the builder), "
        f"{len(images)} image(s); {size:.0f} MB in {root}; {time.monotonic() - start:.1f}s"
    )
    ctx.output.out(str(path))
    return 0
