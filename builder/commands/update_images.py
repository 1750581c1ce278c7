"""``update-images``: pin each base image to the digest its tag names now (rewrites the config)."""

from __future__ import annotations

import argparse

from builder.cli import Context

NAME = "update-images"
HELP = "pull each base image's tag and rewrite its pin (tag@sha256:digest) in the config"
DESCRIPTION = """\
A base image is pinned by tag and digest in the config (images.<ARCH>.base:
repository:tag@sha256:...): the digest decides which image a build uses, the tag is what
this command follows. For each arch it pulls repository:tag through the container engine,
reads the digest the registry served, prints `old -> new`, and rewrites the value in place:
comments, quoting and every other line of the file stay as they were. An image without a
digest gets one; without a tag, `latest` is written out. Every pull happens before any file
is written; a failed pull changes nothing.

An image of this host's arch is left in the engine under its new pin, so the next build
needs no network for it; another arch's image (aarch64 on an x86_64 host) is not pulled: the
engine only asks the registry for its manifest digest.
The engine's daemon makes the pull with its own proxy settings (`python -m builder doctor`
checks them); an air-gapped machine cannot update pins: update them on a connected one and
carry the images over (`python -m builder fetch --bundle DIR`).

Exit codes: 0 done (also when nothing changed; --check: everything is current); 1 a pull
failed, or --check found a pin to move; 2 a bad config file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the build configuration YAML to rewrite (default: configs/matrix.yaml)",
    )
    p.add_argument(
        "--arch",
        metavar="A",
        help="X86 or ARM (comma-separated for both; default: every image the config file names)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="pull and compare, write nothing; exit 1 when a pin would move (for CI)",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from pathlib import Path  # noqa: PLC0415

    from builder.arch import arch_name  # noqa: PLC0415
    from builder.config import DEFAULT_CONFIG, CliOverrides, display_path, load_settings  # noqa: PLC0415
    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - the docker SDK
    from builder.errors import ConfigError  # noqa: PLC0415
    from builder.images.update import plan_changes, sites, write_changes  # noqa: PLC0415

    config = Path(args.config) if args.config else DEFAULT_CONFIG
    settings = load_settings(CliOverrides(config=str(config)), ctx.env)  # all checks, exit 2
    arches = None
    if args.arch:
        try:
            arches = [arch_name(a.strip()) for a in args.arch.split(",") if a.strip()]
        except ValueError as exc:
            raise ConfigError(str(exc), key="--arch") from None
    found = sites(config, arches, ctx.output.err)
    engine = DockerEngine(redactor=ctx.output.redact)
    changes = plan_changes(engine, found, settings.config.proxy, ctx.output.err)
    for c in changes:
        where = ", ".join(s.where for s in c.sites)
        ctx.output.out(
            f"images.{c.arch}.base ({where}): "
            + (f"{c.old} -> {c.new}" if c.changed else f"{c.new} (unchanged)")
        )
    moved = [c for c in changes if c.changed]
    if args.check:
        return 1 if moved else 0
    written = write_changes(moved)
    ctx.output.err(
        f"update-images: {len(moved)} pin{'s' if len(moved) != 1 else ''} moved"
        + (f"; rewrote {', '.join(display_path(p) for p in written)}" if written else "")
    )
    return 0
