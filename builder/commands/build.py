"""``build``: repaired, verified wheels for the selected cells, into ``dist/`` + manifest."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Callable

from builder.cli import (
    Context,
    add_base_image_option,
    add_config_options,
    add_selection_options,
    load_from_args,
)
from builder.config.load import REPO_ROOT, Selection
from builder.errors import ConfigError
from builder.pipeline import (
    BackendChoice,
    PipelineOptions,
    build_cells,
    choose_backend,
    choose_cross,
    host_arch,
    host_machine,
    uses_cross,
    uses_emulation,
    with_base_image,
)
from builder.plan.cells import Cell
from builder.wheel.reproducible import resolve_source_date_epoch

NAME = "build"
BACKENDS = ("auto", "docker", "host", "cross", "emulated")
HELP = "build, repair and verify wheels of the selected cells into dist/"
DESCRIPTION = """\
For each selected cell: build the cell's image from its rendered Dockerfile (docker
backend) or use a local interpreter (host backend), install torch==<cell torch>, build
the project's wheel without build isolation, give it the local version +torch<X.Y>,
auditwheel-repair it (torch's libraries and libgomp excluded), verify it (tag agrees
with `auditwheel show`, no torch inside, installs into a fresh venv with the cell's torch
and passes a smoke test), then move it atomically into --out and record it in
<out>/manifest.json. A cell whose wheel was already built from the same inputs is
reported up-to-date and skipped (--force rebuilds).

Default selection (no --arch/--python/--torch/ARCH/PY/TORCH/selector, no --all): one cell,
this host's arch and the builder's own Python, with the newest torch that has a wheel for
it (`make wheel`). --all builds every cell of the matrix (`make matrix`).

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
130 interrupted (no partial file is left in --out).

Reproducible: the same inputs give byte-identical wheels. Every file in a wheel carries
SOURCE_DATE_EPOCH (--source-date-epoch N, else the environment's SOURCE_DATE_EPOCH, else the
project's last git commit time, else its newest file's time), compiler paths are mapped to
fixed ones, and the archive is written in one canonical order."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("build")
    g.add_argument("--backend", choices=BACKENDS, default=None,
                   help="where the cells are built (env BACKEND; default: auto)")
    g.add_argument("--project", metavar="PATH", default=None,
                   help="the PEP 517 project with torch C++ extensions to build "
                        "(default: this repository)")
    g.add_argument("--out", metavar="DIR", default="dist",
                   help="where verified wheels and manifest.json go (default: dist)")
    g.add_argument("--work-dir", metavar="DIR", default="build/ampforge",
                   help="per-cell logs (DIR/logs/<cell>.log) and staging "
                        "(default: build/ampforge)")
    g.add_argument("--wheelhouse", metavar="DIR", default=None,
                   help="a folder of wheels (torch and its dependencies, setuptools, wheel): "
                        "pip installs only from it (--no-index); default: the index, or the "
                        "config's offline wheelhouse when offline")
    add_base_image_option(g)
    g.add_argument("--bundle", metavar="DIR", default=None,
                   help="an offline bundle from `python -m builder fetch`: verified (sha256), "
                        "its base image loaded, its wheels the only package source; implies "
                        "--offline (env BUNDLE; config offline.bundle). A damaged bundle, or "
                        "one that lacks a wheel a cell needs, exits 2 before anything is built")
    g.add_argument("--all", action="store_true",
                   help="every cell of the matrix (narrowed by any selection given); without "
                        "it and without a selection: one cell for this host")
    g.add_argument("--keep-going", action="store_true",
                   help="build the other cells when one fails (exit code still 1)")
    g.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="cells built at once (docker backend only; default 1)")
    g.add_argument("--force", action="store_true",
                   help="rebuild cells even when dist/ has their wheel from the same inputs")
    g.add_argument("--ccache", action="store_true",
                   help="compile through ccache (the image or host must have it)")
    g.add_argument("--source-date-epoch", metavar="N", default=None,
                   help="timestamp (seconds since 1970) for every file in the wheels, for "
                        "reproducible builds (default: env SOURCE_DATE_EPOCH, else the "
                        "project's last git commit, else its newest file)")
    g.add_argument("--network", metavar="NAME", default=None,
                   help="Docker network the cell's image build and container join, e.g. an "
                        "--internal network whose only way out is the proxy (docker backend; "
                        "env BUILDER_NETWORK; default: the engine's bridge)")
    add_selection_options(p)
    add_config_options(p)


def _default_selection(selection: Selection) -> Selection:
    """`make wheel` with nothing named: this host's arch and the builder's own Python."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return replace(selection, arch=(host_arch(),), python=(py,), origins={
        **selection.origins, "arch": "default: this host", "python": "default: the builder's "
                                                                    f"Python {py}"})


def _verifiable_defaults(cells: Sequence[Cell], matrix: Sequence[Cell], choice: BackendChoice,
                         err: Callable[[str], None]) -> tuple[Cell, ...]:
    """No torch named: cross cells get the newest torch they can be verified with (see
    builder.cross.default_torch), with a note."""
    from builder.cross.default_torch import newest_verifiable  # noqa: PLC0415

    chosen: list[Cell] = []
    for cell in cells:
        if uses_cross(cell, choice) or uses_emulation(cell, choice):
            cell, note = newest_verifiable(cell, matrix)
            if note:
                err(f"note: {note}")
        if cell not in chosen:
            chosen.append(cell)
    return tuple(chosen)


def _network(name: str | None, choice: BackendChoice, offline: bool) -> str | None:
    """``--network NAME``: only for docker builds with a network, and only a network the
    engine has (nothing is created implicitly: the user decides what it may reach)."""
    if name is None:
        return None
    if offline:
        raise ConfigError(f"--network {name}: offline builds run with no network at all; "
                          "drop --network or --offline", key="--network")
    if choice.engine is None or choice.name not in ("docker", "emulated") or choice.cross:
        raise ConfigError(f"--network {name} is for the docker backend; this build uses "
                          f"{choice.name}", key="--network")
    if not choice.engine.has_network(name):
        raise ConfigError(f"--network {name}: the engine at {choice.engine.base_url} has no "
                          f"network {name!r}; expected one from `docker network ls` (create "
                          f"one: `docker network create --internal {name}`)", key="--network")
    return name


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.images.render import render_all  # noqa: PLC0415
    from builder.plan.cells import expand, select  # noqa: PLC0415
    from builder.progress import Progress, summary_table  # noqa: PLC0415

    err = ctx.output.err
    settings = load_from_args(args, ctx)
    config = settings.config
    selection = settings.selection
    if selection.empty and not args.all:
        selection = _default_selection(selection)
    backend = args.backend or ctx.env.get("BACKEND") or "auto"
    if backend not in BACKENDS:
        raise ConfigError(f"BACKEND={backend!r}; expected one of {', '.join(BACKENDS)}",
                          key="environment BACKEND")
    if args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}; expected 1 or more", key="--parallel")
    wheelhouse = Path(args.wheelhouse) if args.wheelhouse else None
    bundle = None
    if config.offline.bundle is not None:
        from builder.offline.use import use_bundle  # noqa: PLC0415

        if wheelhouse is not None:
            raise ConfigError("--wheelhouse and a bundle both given; the bundle's wheels/ is "
                              "the wheelhouse: drop one", key="--wheelhouse")
        bundle, config = use_bundle(config, err)
        wheelhouse = bundle.wheels
    if wheelhouse is None and config.offline.enabled:
        wheelhouse = config.offline.wheelhouse
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ConfigError(f"wheelhouse {wheelhouse} is not a directory; expected a folder of "
                          "wheels (torch and its dependencies)", key="--wheelhouse")

    plan = select(expand(config), selection)
    for w in plan.warnings:
        err(f"warning: {w}")
    for n in plan.notes:
        err(f"note: {n}")
    project = Path(args.project).resolve() if args.project else REPO_ROOT
    if not ((project / "pyproject.toml").is_file() or (project / "setup.py").is_file()):
        raise ConfigError(f"{project} is not a Python project; expected a folder with "
                          "pyproject.toml or setup.py", key="--project")
    epoch = resolve_source_date_epoch(project, flag=args.source_date_epoch, env=ctx.env)
    native = [c for c in plan.cells if c.machine == host_machine()]
    foreign = [c for c in plan.cells if c.machine != host_machine()]
    cross_ok, cross_why = choose_cross(foreign) if backend == "auto" else (False, "")
    base_ref = args.base_image or ctx.env.get("BASE_IMAGE") or None
    arch = host_arch()
    if bundle is not None:
        from builder.offline.use import bundle_base_image  # noqa: PLC0415

        base_ref = bundle_base_image(bundle, arch, base_ref, backend, ctx.output.redact, err)

    # The engine is needed to resolve --base-image local before choosing the backend.
    choice: BackendChoice
    if backend == "cross" or (cross_ok and not native):
        if base_ref and backend == "cross":
            raise ConfigError("--base-image/BASE_IMAGE is for the docker backend; the cross "
                              "backend builds on this host", key="--base-image")
        if base_ref:
            err(f"note: base image {base_ref} is not used: the cross backend builds on this host")
        choice = BackendChoice("cross", "asked for (--backend cross or BACKEND=cross)"
                               if backend == "cross" else
                               f"auto: {cross_why}")
    elif backend == "emulated":
        from builder.backends.emulated import choose_emulated  # noqa: PLC0415
        from builder.engines.docker import DockerEngine  # noqa: PLC0415

        engine = DockerEngine(redactor=ctx.output.redact)
        if foreign:
            choice, config = choose_emulated(config, foreign, base_ref, engine, err)
        else:  # this host's cells need no emulation: the docker backend's way
            choice = BackendChoice("emulated", "asked for (--backend emulated); this host's "
                                   "cells run natively in the engine", engine)
            if base_ref:
                config = with_base_image(config, arch, base_ref, engine)
    elif base_ref == "local" and backend != "host":
        from builder.engines.docker import DockerEngine  # noqa: PLC0415
        from builder.images.base_image import build_base_image  # noqa: PLC0415

        engine = DockerEngine(redactor=ctx.output.redact)
        err("base image: building or reusing the local one (python -m builder base-image)")
        made = build_base_image(engine, progress=lambda m: err(f"base image: {m}"))
        base_ref = made.tag
        err(f"base image: {made.tag} ({'reused' if made.reused else 'built'})")
        choice = BackendChoice("docker", f"--base-image local: engine {engine.base_url}", engine)
        config = with_base_image(config, arch, base_ref, engine)
    else:
        if base_ref and backend != "host":
            config = with_base_image(config, arch, base_ref, None)
        refs = sorted({config.images[c.arch].ref for c in native})
        choice = choose_backend(backend, refs, ctx.output.redact)
        if base_ref and choice.engine is not None:
            config = with_base_image(config, arch, base_ref, choice.engine)
    if cross_ok and choice.name != "cross":
        choice = replace(choice, cross=f"auto: {cross_why}")
    elif backend == "auto" and foreign and choice.engine is not None:
        from builder.backends.emulated import emulated_fallback  # noqa: PLC0415

        emulated_why, config = emulated_fallback(config, foreign, choice.engine)
        if emulated_why and not native:
            choice = BackendChoice("emulated", f"auto: the cross path cannot ({cross_why}); "
                                   f"{emulated_why}", choice.engine)
        elif emulated_why:
            choice = replace(choice, emulated=f"auto: the cross path cannot; {emulated_why}")
    if (choice.name in ("host", "cross") or choice.cross) and args.parallel > 1:
        raise ConfigError("--parallel > 1 needs the docker backend (host and cross builds "
                          "share this machine's compiler and caches)", key="--parallel")
    err(f"backend: {choice.name} -- {choice.reason}")
    network = _network(args.network or ctx.env.get("BUILDER_NETWORK") or None, choice,
                       config.offline.enabled)
    others = ", ".join(sorted({c.arch for c in foreign}))
    if choice.cross:
        err(f"backend for {others} cells: cross -- {choice.cross}")
    elif choice.emulated:
        err(f"backend for {others} cells: emulated -- {choice.emulated}")
    elif foreign and backend == "auto" and choice.name not in ("cross", "emulated"):
        err(f"backend for {others} cells: not cross -- {cross_why}")

    cells = select(expand(config), selection).cells
    if selection.torch is None and selection.python is not None:
        cells = _verifiable_defaults(cells, expand(config).cells, choice, err)
    recipes = render_all(cells, config)
    opts = PipelineOptions(project=project, out=Path(args.out).resolve(),
                           work=Path(args.work_dir).resolve(),
                           wheelhouse=wheelhouse.resolve() if wheelhouse else None,
                           offline=config.offline.enabled,
                           jobs=config.build.jobs, force=args.force, ccache=args.ccache,
                           network=network)
    if opts.offline and opts.wheelhouse is not None:
        from builder.offline.use import preflight  # noqa: PLC0415

        # Before any image build or compile: name what the wheelhouse lacks, per cell.
        preflight([(c, choice.name == "host") for c in cells if not uses_cross(c, choice)],
                  opts.wheelhouse, f"offline bundle {bundle.root}" if bundle else
                  f"wheelhouse {opts.wheelhouse}", project, err)
    opts = replace(opts, source_date_epoch=epoch)
    err(f"project: {project}; out: {opts.out}; logs: {opts.work / 'logs'}")
    err(f"source date epoch: {epoch.describe()}")
    with Progress(sys.stderr, redact=ctx.output.redact) as progress:
        try:
            results = build_cells(zip(cells, recipes), config, opts, choice, ctx.output.redact,
                                  progress.step, progress.finish, keep_going=args.keep_going,
                                  parallel=args.parallel)
        except KeyboardInterrupt:
            progress.note("interrupted: containers removed, nothing partial left in "
                          f"{opts.out}")
            raise
    for r in results:
        if r.error:
            err(f"error: {r.cell}: {r.error}")
            if r.log is not None and str(r.log) not in r.error:
                err(f"  full log: {r.log}")
    summary_table(results, progress.console, ctx.output.redact)
    for r in results:
        if r.wheel is not None:
            ctx.output.out(str(r.wheel))
    return 0 if all(r.ok for r in results) else 1
