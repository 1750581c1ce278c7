"""``build``: repaired, verified wheels for the selected cells, into ``dist/`` + manifest."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from builder import signals
from builder.backend_kinds import backend_kind
from builder.backends import registry
from builder.backends.base import Host
from builder.cli import (
    HOST_CELL,
    Context,
    RenamedOption,
    add_build_option_flags,
    add_config_options,
    add_print_identifiers_option,
    add_selection_options,
    load_from_args,
    resolve_from_args,
)
from builder.config import BuildConfig, Settings, default_project
from builder.config.load import never_pull
from builder.config.projecttest import ProjectTest, resolve_project_test
from builder.errors import ConfigError
from builder.images.render import render_recipe
from builder.offline.bundle import Bundle
from builder.pipeline import PipelineOptions, build_cells
from builder.plan.resolve import Resolution
from builder.plan.resolved import ResolvedCell
from builder.progress import Progress, summary_table
from builder.projecttree import check_project_tree, is_inside
from builder.wheel.reproducible import resolve_source_date_epoch

if TYPE_CHECKING:
    from builder.engines.docker import DockerEngine

NAME = "build"
HELP = "build, repair and verify wheels of the selected cells into dist/"
DESCRIPTION = """\
For each selected cell: build the cell's image from its rendered Dockerfile (docker
backend) or use a local interpreter (host backend), install torch==<cell torch>, build
the project's wheel without build isolation, give it the local version +torch<X.Y>,
auditwheel-repair it (torch's libraries and libgomp excluded), verify it (tag agrees
with `auditwheel show`, no torch inside, installs into a fresh venv with the cell's torch
and passes a smoke test), then move it atomically into --out and record it in
<out>/manifest.json. A cell whose wheel was already built from the same inputs is
reported up-to-date and skipped (--force rebuilds). An abi3 (py_limited_api) wheel is built
once per (arch, torch) and verified on the Python of every other cell it serves, each
recorded in the manifest; a wheel that would replace another cell's file with other bytes
fails the cell and leaves dist/ as it was.

Every cell is resolved first (`python -m builder plan` prints the same records): its torch,
backend, base image, target platform tag, network and proxy/CA/index settings, each with its
reason. Each wheel's manifest entry stores its record.

Default selection (no --arch/--python/--torch/BUILDER_ARCH/.../selector, no --all): one cell,
this host's arch and the builder's own Python, with the newest torch this host can build
(`make wheel`). --all builds every cell of the matrix (`make matrix`): the cells this host
cannot build are listed with the runner they need, apart from failures, and do not change the
exit code (--strict makes them an error). A cell named explicitly that this host cannot build
is an error (exit 1) naming the runner it needs.

Backends: auto (docker when an engine answers and has the base image, else host; says
which and why), docker (DOCKER_HOST is honoured: a Podman socket works too), host, cross
(aarch64 cells on an x86_64 host: aarch64-linux-gnu-g++ against the aarch64 torch, auditwheel,
verified under qemu-aarch64; needs builder/cross/provision.sh's tools, Python 3.9/3.11/3.13, a CPU
aarch64 torch such as 2.9.1), emulated (another arch's cells in that arch's base image,
e.g. `python -m builder base-image --arch ARM`, run under QEMU user emulation: the docker
steps unchanged, many times slower). auto picks cross for aarch64 cells on an x86_64 host
whenever the cross path can build them; when it cannot, emulated if emulation works and the
engine has an arm64 base image; and says so.

Exit codes: 0 all cells built or up to date, 1 a cell failed, 2 bad configuration,
130 interrupted by Ctrl-C, 143 by SIGTERM, 129 by SIGHUP (the cell's container is removed,
host sessions end, no partial file is left in --out; containers a killed builder left behind
are removed by the next build, or by `python -m builder clean`). --dry-run prints the
resolved records (as `plan --format json` does) and builds nothing.

Reproducible: the same inputs give byte-identical wheels. Every file in a wheel carries
SOURCE_DATE_EPOCH (--source-date-epoch N, else the environment's SOURCE_DATE_EPOCH, else the
project's last git commit time, else its newest file's time), compiler paths are mapped to
fixed ones, and the archive is written in one canonical order."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("build")
    g.add_argument(
        "--project",
        metavar="PATH",
        default=None,
        help="the PEP 517 project with torch C++ extensions to build (default: this repository)",
    )
    g.add_argument(
        "--out",
        "--output-dir",
        dest="out",
        metavar="DIR",
        default="dist",
        help="where verified wheels and manifest.json go (default: dist; "
        "--output-dir as in cibuildwheel)",
    )
    g.add_argument(
        "--work-dir",
        metavar="DIR",
        default="build/ampforge",
        help="per-cell logs (DIR/logs/<cell>.log) and staging (default: build/ampforge)",
    )
    g.add_argument(
        "--find-links",
        "--wheelhouse",
        dest="wheelhouse",
        metavar="DIR",
        default=None,
        action=RenamedOption,
        old=("--wheelhouse",),
        help="a folder of input wheels (torch and its dependencies, setuptools, "
        "wheel): pip installs only from it (--no-index); default: the index, "
        "or the config's offline wheelhouse when offline. --wheelhouse is its "
        "old name (kept for this release; in cibuildwheel a wheelhouse is the "
        "output)",
    )
    g.add_argument(
        "--bundle",
        metavar="DIR",
        default=None,
        help="an offline bundle from `python -m builder fetch`: verified (sha256), "
        "its base image loaded, its wheels the only package source; implies "
        "--offline (env BUILDER_BUNDLE; config offline.bundle). A damaged "
        "bundle, or one that lacks a wheel a cell needs, exits 2 before "
        "anything is built",
    )
    g.add_argument(
        "--all",
        action="store_true",
        help="every cell of the matrix (narrowed by any selection given); without "
        "it and without a selection: one cell for this host",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="with --all: a cell this host cannot build is an error (exit 1) "
        "instead of being listed with the runner it needs",
    )
    add_print_identifiers_option(g, "this build would build on this host")
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved records as JSON (what `plan --format json` prints "
        "for the same options) and build nothing",
    )
    g.add_argument(
        "--keep-going",
        action="store_true",
        help="build the other cells when one fails (exit code still 1)",
    )
    g.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="cells built at once (docker backend only; default 1)",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="rebuild cells even when dist/ has their wheel from the same inputs",
    )
    g.add_argument(
        "--ccache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile through ccache: --ccache requires it, --no-ccache never uses "
        "it (default: used where the build environment has it; the cache lives "
        "in the engine's ampforge-ccache volume, or $AMPFORGE_CACHE/ccache "
        "for host builds)",
    )
    add_build_option_flags(g)
    g.add_argument(
        "--test-requires",
        metavar="REQS",
        default=None,
        help="space-separated requirements installed next to the wheel before "
        "--test-command runs, as cibuildwheel's (config test-requires; the "
        "project's pyproject.toml [tool.cibuildwheel] test-requires)",
    )
    g.add_argument(
        "--test-command",
        metavar="CMD",
        default=None,
        help="shell command run in every cell's verification environment after "
        "the wheel is installed (an empty temporary folder; `python` is that "
        "environment's, under QEMU for cross cells); {project} and {package} "
        "name the project's copy there; a non-zero exit fails the cell "
        "(config test-command; the project's pyproject.toml "
        "[tool.cibuildwheel] test-command)",
    )
    g.add_argument(
        "--source-date-epoch",
        metavar="N",
        default=None,
        help="timestamp (seconds since 1970) for every file in the wheels, for "
        "reproducible builds (default: env SOURCE_DATE_EPOCH, else the "
        "project's last git commit, else its newest file)",
    )
    add_selection_options(p, default=HOST_CELL)
    add_config_options(p)


def _check_network(
    config: BuildConfig, cells: list[ResolvedCell], engine: Optional[DockerEngine]
) -> Optional[str]:
    """``--network NAME``: only for docker builds with a network, and only a network the
    engine has (nothing is created implicitly: the user decides what it may reach)."""
    name = config.network
    if name is None:
        return None
    key = config.origins.get("network", "--network")
    if config.offline.enabled:
        raise ConfigError(
            f"--network {name}: offline builds run with no network at all; "
            "drop --network or --offline",
            key=key,
        )
    others = sorted({c.backend for c in cells if not backend_kind(c.backend).in_container})
    if others:
        raise ConfigError(
            f"--network {name} is for the docker backend; this build uses {', '.join(others)}",
            key=key,
        )
    if engine is None:  # first call: the checks above only
        return name
    if not engine.has_network(name):
        raise ConfigError(
            f"--network {name}: the engine at {engine.base_url} has no "
            f"network {name!r}; expected one from `docker network ls` (create "
            f"one: `docker network create --internal {name}`)",
            key=key,
        )
    return name


def _local_base_images(
    cells: list[ResolvedCell], engine: DockerEngine, err: Callable[[str], None]
) -> None:
    """``--base-image local``: build (or reuse, by content) the local image of each arch the
    cells use, before anything else runs."""
    from builder.backends.docker import LOCAL_PREFIX  # noqa: PLC0415
    from builder.images.base_image import BaseImageSpec, build_base_image  # noqa: PLC0415

    machines = sorted(
        {
            c.cell.machine
            for c in cells
            if c.image.ref.startswith(LOCAL_PREFIX) and backend_kind(c.backend).in_container
        }
    )
    for machine in machines:
        err(
            "base image: building or reusing the local one (python -m builder base-image"
            f"{'' if machine == cells[0].host_machine else ' --arch ' + machine})"
        )
        made = build_base_image(
            engine, BaseImageSpec(arch=machine), progress=lambda m: err(f"base image: {m}")
        )
        err(f"base image: {made.tag} ({'reused' if made.reused else 'built'})")


def _remove_leftovers(engine: DockerEngine, err: Callable[[str], None]) -> None:
    """Containers of builders that are gone (SIGKILL, power loss): removed before anything
    else, said one by one (``python -m builder clean`` does only this)."""
    from builder.engines.owner import leftovers, remove_leftovers  # noqa: PLC0415

    for c in remove_leftovers(engine.api, leftovers(engine.api)[0]):
        err(f"removed container {c.id[:12]} (cell {c.cell}) left behind: {c.reason}")


def _bundle(
    config: BuildConfig, wheelhouse: Optional[Path], ctx: Context
) -> tuple[Bundle, BuildConfig, Path]:
    """The configured bundle verified and its base image loaded: (bundle, config, wheelhouse)."""
    from builder.offline.use import bundle_base_image, use_bundle  # noqa: PLC0415

    if wheelhouse is not None:
        raise ConfigError(
            "--find-links and a bundle both given; the bundle's wheels/ is "
            "the folder of input wheels: drop one",
            key="--find-links",
        )
    bundle, config = use_bundle(config, ctx.output.err)
    config = never_pull(config, "the bundle (offline)")
    arch = Host(ctx.output.redact).arch  # this host's, with a clear error on another machine
    ref = bundle_base_image(
        bundle, arch, config.base_image, config.backend, ctx.output.redact, ctx.output.err
    )
    if ref is not None and ref != config.base_image:
        config = replace(
            config,
            base_image=ref,
            origins={**config.origins, "base_image": f"bundle {bundle.root}"},
        )
    return bundle, config, bundle.wheels


def _refuse_damaged_wheels(wheelhouse: Path) -> None:
    """A truncated or spliced wheel in the wheelhouse stops the build before anything is made
    from it (a torch environment with files missing would be built against)."""
    from builder.wheel.integrity import damaged_wheels  # noqa: PLC0415

    damaged = damaged_wheels(sorted(wheelhouse.glob("*.whl")))
    if damaged:
        raise ConfigError(
            f"wheelhouse {wheelhouse} holds damaged wheels (nothing was built):\n  "
            + "\n  ".join(damaged)
            + "\ndownload them again (pip download, or "
            "`python -m builder fetch`) or remove them",
            key="--find-links",
        )


def run(args: argparse.Namespace, ctx: Context) -> int:
    settings = load_from_args(args, ctx)
    config = settings.config
    if args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}; expected 1 or more", key="--parallel")
    wheelhouse = Path(args.wheelhouse) if args.wheelhouse else None
    bundle = None
    if config.offline.bundle is not None:
        bundle, config, wheelhouse = _bundle(config, wheelhouse, ctx)
        settings = replace(settings, config=config)
    if wheelhouse is None and config.offline.enabled:
        wheelhouse = config.offline.wheelhouse
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ConfigError(
            f"wheelhouse {wheelhouse} is not a directory; expected a folder of "
            "wheels (torch and its dependencies)",
            key="--find-links",
        )
    if wheelhouse is not None and bundle is None:  # a bundle's were checked by sha256
        _refuse_damaged_wheels(wheelhouse)
    project = _project(args)
    test = resolve_project_test(project, config.test, args.test_requires, args.test_command)
    settings, resolution = resolve_from_args(args, ctx, everything=args.all, settings=settings)
    if args.print_build_identifiers:
        for c in resolution.here:
            ctx.output.out(c.identifier)
        return 0
    if args.dry_run:
        ctx.output.out(json.dumps(plan_document(config.source_name, resolution), indent=2))
        return 0
    return _execute(args, ctx, settings, resolution, wheelhouse, bundle, project, test)


def _project(args: argparse.Namespace) -> Path:
    project = Path(args.project).resolve() if args.project else default_project()
    if not ((project / "pyproject.toml").is_file() or (project / "setup.py").is_file()):
        raise ConfigError(
            f"{project} is not a Python project; expected a folder with pyproject.toml or setup.py",
            key="--project",
        )
    for name in ("pyproject.toml", "setup.py"):
        # Read here (build options, tests, bounds) but never copied into the build
        # (builder.projecttree): the build would not be what plan showed.
        marker = project / name
        if marker.is_symlink() and not is_inside(project, marker):
            raise ConfigError(
                f"{marker} is a symlink to {os.readlink(marker)}, outside the "
                "project: its build copies nothing from outside it; copy the file "
                "into the project",
                key="--project",
            )
    return project


def plan_document(source: str, resolution: Resolution) -> dict:
    """What `plan --format json` and `build --dry-run` print: the records, nothing else."""
    return {
        "config": source,
        "cells": [c.to_dict() for c in resolution.cells],
        "dropped": [d.to_dict() for d in resolution.dropped],
        "notes": list(resolution.notes),
        "warnings": list(resolution.warnings),
    }


def _pull(
    args: argparse.Namespace,
    ctx: Context,
    settings: Settings,
    resolution: Resolution,
    engine: DockerEngine,
) -> Resolution:
    """Pull the base images the pull policy asks for, before anything is built; then resolve
    again, so the records name the image actually pulled (its id, and its labels: an image of
    ``builder base-image`` pushed to a registry is Debian inside)."""
    from builder.backends.docker import pull_base_images  # noqa: PLC0415 - the docker SDK
    from builder.plan.resolve import resolve  # noqa: PLC0415

    if not pull_base_images(resolution.here, engine, settings.config.proxy, ctx.output.err):
        return resolution
    return resolve(
        settings,
        Host(ctx.output.redact, lambda: engine),
        registry(),
        out=Path(args.out),
        everything=args.all,
        project=Path(args.project) if args.project else None,
    )


def _execute(
    args: argparse.Namespace,
    ctx: Context,
    settings: Settings,
    resolution: Resolution,
    wheelhouse: Optional[Path],
    bundle: Optional[Bundle],
    project: Path,
    test: ProjectTest,
) -> int:
    err = ctx.output.err
    config = settings.config
    backends = registry()
    here = list(resolution.here)
    elsewhere = list(resolution.elsewhere)
    # Usage errors (exit 2) first, whatever this host can build.
    if any(not backend_kind(c.backend).in_container for c in here) and args.parallel > 1:
        raise ConfigError(
            "--parallel > 1 needs the docker backend (host and cross builds "
            "share this machine's compiler and caches)",
            key="--parallel",
        )
    # What every cell's copy of the project leaves out, said once; a file over the copy's
    # limit is refused here (exit 2), before any engine, image or cell is touched.
    for line in check_project_tree(project, ctx.env).lines(vcs=False):
        err(f"note: {line}")
    engine = None
    if config.network is not None or any(backend_kind(c.backend).in_container for c in here):
        _check_network(config, list(resolution.cells), None)  # the checks that need no engine
        from builder.engines.docker import DockerEngine  # noqa: PLC0415 - the docker SDK

        engine = DockerEngine(redactor=ctx.output.redact)
        _remove_leftovers(engine, err)
        # A network the engine lacks is a usage error (exit 2): said before any pull.
        _check_network(config, list(resolution.cells), engine)
        resolution = _pull(args, ctx, settings, resolution, engine)
        here, elsewhere = list(resolution.here), list(resolution.elsewhere)
    network = _check_network(config, list(resolution.cells), engine)
    if elsewhere and not args.all:
        # Named explicitly: not building it is a failure, said with the runner it needs.
        for c in elsewhere:
            err(
                f"error: {c.identifier} cannot be built on this {c.host_machine} host: "
                f"{c.backend_reason}; {c.runner_reason}"
            )
        if not here:
            return 1
    epoch = resolve_source_date_epoch(project, flag=args.source_date_epoch, env=ctx.env)
    if engine is not None:
        _local_base_images(here, engine, err)
    for c in here:
        err(f"backend for {c.identifier}: {c.backend} -- {c.backend_reason}")
    # Render every docker/emulated recipe before anything runs: a bad value stops it all.
    jobs = [
        (c, render_recipe(c.cell, config) if backend_kind(c.backend).in_container else None)
        for c in here
    ]
    opts = PipelineOptions(
        project=project,
        out=Path(args.out).resolve(),
        work=Path(args.work_dir).resolve(),
        wheelhouse=wheelhouse.resolve() if wheelhouse else None,
        offline=config.offline.enabled,
        jobs=config.build.jobs,
        force=args.force,
        ccache=args.ccache,
        network=network,
        source_date_epoch=epoch,
        test=test,
    )
    if opts.offline and opts.wheelhouse is not None:
        from builder.offline.preflight import host_torches  # noqa: PLC0415
        from builder.offline.use import preflight  # noqa: PLC0415

        # Before any image build or compile: name what the wheelhouse lacks, per cell, and for
        # the cross cells' host torch environment.
        hosts = host_torches(
            [
                (c.identifier, c.image.build_host.key() if c.image.build_host is not None else None)
                for c in here
            ]
        )
        wants = [(c.cell, backend_kind(c.backend).offline_wheels) for c in here]
        preflight(
            [(cell, wheels == "here") for cell, wheels in wants if wheels != "build host"],
            opts.wheelhouse,
            f"offline bundle {bundle.root}" if bundle else f"wheelhouse {opts.wheelhouse}",
            project,
            err,
            hosts,
            toolkits={c.identifier: c.cuda.toolkit for c in here},
            frontends={
                c.identifier: (c.build_options or config.build_options).frontend_requirements()
                for c in here
            },
        )
    err(f"project: {project}; out: {opts.out}; logs: {opts.work / 'logs'}")
    err(f"source date epoch: {epoch.describe()}")
    err(f"test-command: {test.describe()}")
    for line in config.build_options.describe():
        err(f"build option {line}")
    if test.requires and not test.enabled:
        err(
            f"note: test-requires ({test.requires_origin}) without a test-command: "
            "nothing would use them, so they are not installed"
        )
    with Progress(sys.stderr, redact=ctx.output.redact) as progress:
        try:
            results = build_cells(
                jobs,
                config,
                opts,
                backends,
                engine,
                ctx.output.redact,
                progress.step,
                progress.finish,
                keep_going=args.keep_going,
                parallel=args.parallel,
                say=progress.note,
            )
        except KeyboardInterrupt as exc:
            progress.note(
                f"{signals.describe(exc)}: containers removed, host sessions ended, "
                f"nothing partial left in {opts.out}"
            )
            raise
    for r in results:
        if r.error:
            err(f"error: {r.cell}: {r.error}")
            if r.log is not None and str(r.log) not in r.error:
                err(f"  full log: {r.log}")
    summary_table(results, progress.console, ctx.output.redact)
    if elsewhere and args.all:
        err(
            f"not built here ({len(elsewhere)} cell{'s' if len(elsewhere) != 1 else ''}, "
            "each needs a native runner; not failures"
            + (", but --strict" if args.strict else "")
            + "):"
        )
        for c in elsewhere:
            err(f"  {c.identifier}  runner {c.runner}: {c.backend_reason}")
    for r in results:
        if r.wheel is not None:
            ctx.output.out(str(r.wheel))
    ok = all(r.ok for r in results)
    if not ok:
        err(
            "check this machine for these cells (engine, proxies, CA trust in a container, base "
            "images, toolchains, disk): python -m builder doctor, with the same selection"
        )
    if elsewhere and (args.strict or not args.all):
        return 1
    return 0 if ok else 1
