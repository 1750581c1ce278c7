"""``render``: write each selected cell's Dockerfile (a complete build context folder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.cli import (
    EVERY_CELL,
    Context,
    add_config_options,
    add_selection_options,
    resolve_from_args,
)
from builder.images.render import render_all, write_recipes

NAME = "render"
HELP = "write each selected cell's Dockerfile into OUT/<cell id>/"
DESCRIPTION = """\
Render docker/<ARCH>/Dockerfile.j2 for every selected cell (default: all buildable
cells) and write OUT/<cell id>/Dockerfile, plus the CA bundle when one is configured,
so each folder is a complete build context. Every recipe is rendered before anything
is written: a bad value writes nothing. Output is deterministic (same inputs, same bytes).

Proxies are never written: they are passed to the engine as build arguments."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        metavar="DIR",
        default="build/dockerfiles",
        help="output folder (default: build/dockerfiles)",
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
