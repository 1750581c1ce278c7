"""``cache``: what the builder's caches hold (``list``) and removing what it no longer needs
(``prune``)."""

from __future__ import annotations

import argparse

from builder.cli import Context

NAME = "cache"
HELP = "list the builder's caches (size, last use, superseded or not) or prune them"
DESCRIPTION = """\
The builder keeps its heavy inputs under $AMPFORGE_CACHE (default ~/.cache/ampforge): host
torch environments, cross sysroots, target torch sites and wheels, apt lists, its pip zip,
file digests, the compiler cache; and the docker backend's torch layers
(ampforge/torch:<cell>-<key>) in the engine. A changed input makes a new entry and the old one
stays: `cache list` shows each with its size, its last use and whether this builder can still
hit it ("superseded": its key embeds an install step, build requirements or key scheme this
builder no longer produces); `cache prune` removes the superseded entries and those unused for
30 days (--older-than), or everything (--all). An entry a running build holds (its lock), or a
torch layer a container uses, is kept and named. The compiler cache bounds itself (ccache's
max_size) and is removed only with --ccache.

Exit codes: 0 done (no engine answering is a note, not an error); 1 a removal failed; 2 bad
usage (e.g. --older-than 7x)."""


def _duration(text: str) -> float:
    from builder.cache.prune import parse_duration  # noqa: PLC0415

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,prune}")
    ls = sub.add_parser(
        "list",
        help="one row per entry: kind, name, size, last use, state",
        description="One row per cache entry, then the total and what `cache prune` would free.",
    )
    ls.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default) or json: {root, entries: [...], total_bytes, prune_bytes, notes}",
    )
    ls.add_argument(
        "--older-than",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="the age prune would use for its estimate (default 30d)",
    )
    pr = sub.add_parser(
        "prune",
        help="remove superseded entries and those unused for 30 days",
        description="Remove superseded entries and those no build used for "
        "--older-than; each removal is atomic and skips entries "
        "in use.",
    )
    pr.add_argument(
        "--older-than",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="remove entries unused for longer than this: 7d, 12h, 90m, 2w (default 30d)",
    )
    pr.add_argument(
        "--all",
        action="store_true",
        help="remove every entry (still none in use); the compiler cache only with --ccache",
    )
    pr.add_argument(
        "--ccache",
        action="store_true",
        help="remove the compiler cache too (it bounds itself: ccache's max_size)",
    )
    pr.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would be removed and what stays, with why; remove nothing",
    )
    pr.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default) or json, as `cache list`, with each entry's result",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    from builder.cache import cache_root  # noqa: PLC0415
    from builder.cache import prune as cacheprune  # noqa: PLC0415
    from builder.diskspace import human  # noqa: PLC0415
    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - the docker SDK
    from builder.errors import EngineUnavailable  # noqa: PLC0415

    older = cacheprune.DEFAULT_OLDER_THAN if args.older_than is None else args.older_than
    engine, engine_error = None, ""
    try:
        engine = DockerEngine(redactor=ctx.output.redact, timeout=60)
    except EngineUnavailable as exc:
        engine_error = exc.message.splitlines()[0]
    inv = cacheprune.inventory(cache_root(), engine, engine_error)
    pruning = args.action == "prune"
    cacheprune.decide(inv, older, everything=pruning and args.all, ccache=pruning and args.ccache)
    if pruning:
        cacheprune.prune(inv, engine, older, everything=args.all, dry_run=args.dry_run)
    if args.format == "json":
        ctx.output.out(cacheprune.document(inv, older))
    elif pruning:
        done = [e for e in inv.entries if e.result]
        for e in done:
            ctx.output.out(f"{e.result}: {e.kind} {e.name} ({human(e.size)}; {e.prune})")
        gone = [e for e in done if e.result.startswith(("removed", "would remove"))]
        kept = sum(1 for e in done if e.result.startswith("kept"))
        failed = len(done) - len(gone) - kept
        verb = "would free" if args.dry_run else "freed"
        ctx.output.err(
            f"cache prune: {verb} {human(sum(e.size for e in gone))} "
            f"({cacheprune.entries(len(gone))}), {kept} kept in use"
            + (f", {failed} failed" if failed else "")
        )
    else:
        for line in cacheprune.table(inv):
            ctx.output.out(line)
        ctx.output.err(cacheprune.summary(inv, older))
    for note in inv.notes:
        ctx.output.err(note)
    return 1 if any(e.result.startswith("failed") for e in inv.entries) else 0
