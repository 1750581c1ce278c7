"""``doctor``: check this machine for the selected builds and say what to fix."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.cli import (
    HOST_CELL,
    Context,
    add_config_options,
    add_selection_options,
    resolve_from_args,
)
from builder.doctor.report import document, exit_code, table

NAME = "doctor"
HELP = "check this machine for the selected builds (OK / WARN / FAIL, with the fix)"
DESCRIPTION = """\
Checks what the selected cells need (by default the one cell `make wheel` builds; --all:
the whole matrix), one line each, OK / WARN / FAIL with the fix:

  engine                   a Docker-API engine answers (docker or podman, its version)
  engine proxy             the engine's own proxy (`docker info`) against yours: a pull is
                           made by the engine, which does not see this shell's HTTPS_PROXY
  CA trust in a container  a one-second TLS probe of the configured index (else pip's
                           default) from a container of a local base image, with the build's
                           proxies and --ca-bundle: behind an intercepting proxy it fails
                           without the proxy's CA
  base image ARCH          the config's base image, or the local one, in the engine
  binfmt + qemu            another arch's containers (emulated backend)
  cross toolchain/sysroots aarch64-linux-gnu-g++, qemu-aarch64, the cached arm64 Pythons
  debootstrap              for `python -m builder base-image`
  disk space               free space where the selected cells write (rough per-cell needs)
  auditwheel + patchelf    as the host and cross backends run them
  cells                    which selected cells this host can build, and the others' runner

FAIL: a selected build would fail on it as things stand; WARN: missing or risky, but the
builds can still run (another way, or the selection does not need it). Exit codes: 0 no FAIL,
1 a FAIL, 2 bad configuration or usage."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default) or json: {ok, exit_code, checks: [{name, status, detail, fix}]}",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="check for every cell of the matrix (narrowed by any selection), as `build --all`",
    )
    p.add_argument(
        "--work-dir",
        metavar="DIR",
        default="build/ampforge",
        help="where builds write logs and staging (as `build --work-dir`)",
    )
    p.add_argument(
        "--probe-timeout",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds the TLS probe waits for the index (default 1)",
    )
    add_selection_options(p, default=HOST_CELL)
    add_config_options(p)


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.backends.base import Host  # noqa: PLC0415 - the backends' modules
    from builder.doctor.checks import Scope, run_checks  # noqa: PLC0415
    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - the docker SDK
    from builder.errors import EngineUnavailable  # noqa: PLC0415

    if args.probe_timeout <= 0:
        from builder.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(
            f"--probe-timeout {args.probe_timeout}; expected seconds > 0", key="--probe-timeout"
        )
    # One engine connection for the resolver and the checks; its error, whole, for the fix.
    # Made on first use, after the project's container-engine has chosen the socket.
    connected: list[tuple[DockerEngine | None, str]] = []

    def connect() -> tuple[DockerEngine | None, str]:
        if not connected:
            try:
                connected.append((DockerEngine(redactor=ctx.output.redact), ""))
            except EngineUnavailable as exc:
                connected.append((None, exc.message))
        return connected[0]

    def factory() -> DockerEngine:
        engine, engine_error = connect()
        if engine is None:
            raise EngineUnavailable(engine_error)
        return engine

    host = Host(ctx.output.redact, engine_factory=factory)
    settings, resolution = resolve_from_args(args, ctx, everything=args.all, host=host)
    engine, engine_error = connect()
    checks = run_checks(
        Scope(
            settings=settings,
            resolution=resolution,
            host=host,
            engine=engine,
            engine_error=engine_error,
            named=not args.all,
            work_dir=Path(args.work_dir),
            probe_timeout=args.probe_timeout,
        )
    )
    if args.format == "json":
        ctx.output.out(document(checks))
    else:
        for line in table(checks):
            ctx.output.out(line)
    return exit_code(checks)
