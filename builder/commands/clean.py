"""``clean``: remove the containers of builders that are gone (killed, or the machine lost
power) -- what every ``build`` also does when it starts."""

from __future__ import annotations

import argparse

from builder.cli import Context

NAME = "clean"
HELP = "remove containers left behind by builders that are gone (--dry-run lists them)"
DESCRIPTION = """\
A builder removes its cell's container on every exit it can handle: success, failure,
Ctrl-C, SIGTERM, SIGHUP. SIGKILL (or a power loss) gives it no chance, and the container,
which runs `sleep infinity`, would stay. Every container the builder creates is labelled
with its builder's process id, that process's start time, the machine's id and boot id;
this command removes the ones whose builder no longer runs on this machine. Containers of
a running builder (a concurrent build in another terminal), of another machine sharing
the engine, or without those labels are listed and never touched. `build` does the same
when it starts.

Exit codes: 0 done (also when there was nothing to remove); 1 no container engine answers
or a removal failed."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would be removed (and what stays, with why); remove nothing",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - the docker SDK
    from builder.engines.owner import leftovers, remove_leftovers  # noqa: PLC0415

    engine = DockerEngine(redactor=ctx.output.redact)
    gone, kept = leftovers(engine.api)
    verb = "would remove" if args.dry_run else "removed"
    done = gone if args.dry_run else remove_leftovers(engine.api, gone)
    for c in done:
        ctx.output.out(f"{verb} {c.id[:12]} ({c.name}, cell {c.cell}): {c.reason}")
    for c in kept:
        ctx.output.out(f"kept {c.id[:12]} ({c.name}, cell {c.cell}): {c.reason}")
    ctx.output.err(
        f"clean: {len(done)} container{'s' if len(done) != 1 else ''} {verb}, "
        f"{len(kept)} kept (engine {engine.base_url})"
    )
    return 0
