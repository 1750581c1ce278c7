"""``render``: write each selected cell's Dockerfile (a complete build context folder)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Optional

from builder import __version__
from builder.atomicfile import atomic_write
from builder.backend_kinds import DOCKER
from builder.ci import PUBLISH_MODES
from builder.cli import (
    EVERY_CELL,
    Context,
    add_config_options,
    add_selection_options,
    load_from_args,
    resolve_from_args,
)
from builder.config.model import INSTALLED, REPO_ROOT
from builder.errors import ConfigError
from builder.images.render import render_all, write_recipes

NAME = "render"
HELP = (
    "write each selected cell's Dockerfile into OUT/<cell id>/, or (--ci) a CI workflow "
    "that builds every wheel on its runner"
)
DESCRIPTION = """\
Render docker/<ARCH>/Dockerfile.j2 for every selected cell (default: all buildable
cells) and write OUT/<cell id>/Dockerfile, plus the CA bundle when one is configured,
so each folder is a complete build context. Every recipe is rendered before anything
is written: a bad value writes nothing. Output is deterministic (same inputs, same bytes).

Proxies are never written: they are passed to the engine as build arguments.

--ci github|gitlab writes a complete CI workflow instead (to --out FILE, or stdout), from the
same resolved records `plan` prints: one build job per wheel (`plan --format github
--github-jobs build`) on the runner its record names, running the README's set-up and the
cell's `make wheel ARCH= PY= TORCH= BACKEND= PULL=` from its record, its dist/ uploaded as the
artifact dist-<cell id>; one verify job per cell served by another job's stable-ABI wheel
(after that job, with its dist/); and one release job that takes every artifact, runs `merge`
and `index --per-torch`, and publishes on tags. Proxy, CA and index come from the CI's secrets
and variables by name (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, BUILDER_INDEX_URL, BUILDER_CA_PEM),
never by value.

--publish trusted (the default): the release job stages the wheels PyPI takes (no +torch
label: `publish --repository pypi --skip-local-versions --stage`), and on tags a publish job
uploads them with PyPI trusted publishing (OIDC; no stored password: configure the publisher
on PyPI). --publish token: the release job runs `publish release` on tags with TWINE_*
(repository URL, user, password) from the CI's settings, every wheel, as before.

With no backend named (--backend, BUILDER_BACKEND, build.backend), the jobs use docker: the
runners build in the manylinux base images.

For a project of its own (--project outside this checkout, or the installed `ampforge-build`
run in the project's folder) the workflow is that project's, with paths relative to its root
(--config must be inside it): each job installs the builder as a tool (--tool; default
ampforge-builder==<this version>) into a venv of its own and runs `ampforge-build build
--arch .. --python .. --torch .. --backend .. --pull ..` from the project's root: no ampforge
checkout, no make. A host-backend cell's torch environments are kept between runs by the CI's
cache, keyed by the cell's resolved record; a CUDA cell's job frees disk first.

  python -m builder render --ci github --out .github/workflows/wheels.yml
  python -m builder render --ci gitlab --out .gitlab-ci.yml
  cd ~/src/myext && ampforge-build render --ci github --out .github/workflows/wheels.yml"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output folder (default: build/dockerfiles); with --ci the workflow file "
        "(default: stdout)",
    )
    p.add_argument(
        "--ci",
        choices=("github", "gitlab"),
        default=None,
        help="write a CI workflow that builds every selected cell's wheel on its "
        "runner, merges and indexes them (see above)",
    )
    p.add_argument(
        "--publish",
        choices=PUBLISH_MODES,
        default=None,
        help="with --ci: how the release is published on tags: trusted (default: PyPI "
        "trusted publishing, the wheels PyPI takes) or token (TWINE_* secrets)",
    )
    p.add_argument(
        "--project",
        metavar="PATH",
        default=None,
        help="the project the jobs build, as `build --project`: a path inside this "
        "checkout (the jobs run `make wheel PROJECT=`), or a project of its own "
        "(the workflow is that project's: the jobs install the builder as a tool "
        "and build from its root; see above); default: this repository, or the "
        "current folder for the installed tool",
    )
    p.add_argument(
        "--tool",
        metavar="REQUIREMENT",
        default=None,
        help="with --ci for a project of its own: what its jobs pip install as the "
        f"builder, a requirement or the path of a wheel in the project (default: "
        f"{TOOL_DIST}==<this builder's version>)",
    )
    p.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the Dockerfiles to stdout instead of writing them",
    )
    add_selection_options(p, default=EVERY_CELL)
    add_config_options(p)


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.ci:
        return _render_ci(args, ctx)
    if args.publish:
        raise ConfigError(
            "--publish says how a CI workflow publishes; it needs --ci github or --ci gitlab",
            key="--publish",
        )
    if args.tool:
        raise ConfigError(
            "--tool says what a CI workflow's jobs install; it needs --ci github or --ci gitlab",
            key="--tool",
        )
    args.out = args.out or "build/dockerfiles"
    settings, resolution = resolve_from_args(args, ctx, everything=True)
    recipes = render_all([c.cell for c in resolution.cells], settings.config)
    if args.print_only:
        for r in recipes:
            ctx.output.out(r.dockerfile)
        return 0
    out = Path(args.out)
    for folder in write_recipes(recipes, out):
        ctx.output.out(f"wrote {folder / 'Dockerfile'}")
    ctx.output.out(f"{len(recipes)} Dockerfile{'s' if len(recipes) != 1 else ''} in {out}")
    return 0


def _render_ci(args: argparse.Namespace, ctx: Context) -> int:
    from builder.ci import github, gitlab  # noqa: PLC0415 -- only this path needs them
    from builder.ci.jobs import TOOL, in_checkout, in_project, workflow  # noqa: PLC0415

    if args.print_only:
        raise ConfigError(
            "--print writes Dockerfiles; --ci writes the workflow to --out FILE "
            "or stdout: use one of them"
        )
    root = _own_project(args.project)
    if root is None:
        if args.tool:
            raise ConfigError(
                "--tool names what the jobs of a project of its own install; "
                "this checkout's jobs use its Makefile (give --project a path "
                "outside this checkout, or leave --tool out)",
                key="--tool",
            )
        config = in_checkout(args.config, "--config")
        project = in_checkout(args.project, "--project")
        tool = None
    else:
        config = in_project(args.config, root, "--config")
        project = None  # the jobs run in the project's root: the tool's default project
        tool = _tool_requirement(args.tool, root)
    settings = load_from_args(args, ctx)
    cfg = settings.config
    if cfg.origins.get("backend") == "built-in default":
        # CI runners are fresh machines with an engine: they build in the base images. What
        # this host would pick (its local Pythons, its cross toolchain) says nothing of them.
        origins = {
            **cfg.origins,
            "backend": "render --ci: the CI runners build in the manylinux base images",
        }
        settings = replace(settings, config=replace(cfg, backend=DOCKER.name, origins=origins))
        ctx.output.err(
            f"note: --ci: BACKEND={DOCKER.name} for every job (the CI runners build in "
            "the manylinux base images); name --backend for another"
        )
    # The records name the jobs' output folder, dist/ (as `plan`'s do), not the workflow file.
    jobs_args = argparse.Namespace(**{**vars(args), "out": "dist"})
    settings, resolution = resolve_from_args(jobs_args, ctx, everything=True, settings=settings)
    # A project's own workflow says how to re-render it from that project's root.
    argv = ["python -m builder render --ci" if tool is None else f"{TOOL} render --ci", args.ci]
    argv += [f"--config {config}"] if config else []
    argv += [f"--project {project}"] if project else []
    argv += [f"--tool {shlex.quote(args.tool)}"] if args.tool and tool else []
    publish = args.publish or "trusted"
    argv += [f"--publish {publish}"] if args.publish else []
    wf = workflow(
        settings,
        resolution,
        config=config,
        project=project,
        source=" ".join(argv),
        publish=publish,
        tool=tool,
    )
    text = (github if args.ci == "github" else gitlab).render(wf)
    builds = sum(j.kind == "build" for j in wf.jobs)
    # GitLab's publish was always a job of its own; GitHub's is one with trusted publishing.
    publish_job = ", 1 publish job" if publish == "trusted" or args.ci == "gitlab" else ""
    summary = (
        f"{builds} build job(s), {len(wf.jobs) - builds} verify job(s), 1 release job"
        f"{publish_job} ({args.ci}, publish: {publish})"
    )
    if args.out is None:
        ctx.output.out(text.rstrip("\n"))
        ctx.output.err(summary)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, text.encode())
    ctx.output.out(f"wrote {out}: {summary}")
    return 0


#: The builder's distribution name (builder-dist/pyproject.toml), as its jobs install it.
TOOL_DIST = "ampforge-builder"


def _own_project(project: Optional[str]) -> Optional[Path]:
    """The root of the project whose own CI the workflow is (None: this checkout's, the jobs
    running its Makefile): the installed tool always renders a project's (it has no
    checkout), and a checkout's builder does for a --project outside the checkout."""
    here = Path.cwd().resolve()
    root = Path(project).resolve() if project else here
    if INSTALLED or here != REPO_ROOT.resolve():
        return root
    return None if root == here or here in root.parents else root


def _tool_requirement(given: Optional[str], root: Path) -> str:
    """What the jobs pip install: *given* (a requirement, or a wheel file, which must be in
    the project: named from its root), else this builder's own version."""
    if not given:
        return f"{TOOL_DIST}=={__version__}"
    if given.endswith(".whl") or Path(given).is_file():
        from builder.ci.jobs import in_project  # noqa: PLC0415

        rel = in_project(given, root, "--tool")
        assert rel is not None
        return rel if "/" in rel else f"./{rel}"
    return given
