"""``index``: a PEP 503 simple index of the wheels in ``dist/``, for ``pip --index-url``."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.cli import Context
from builder.release.distfiles import dist_wheels
from builder.release.per_torch import write_per_torch_indexes
from builder.release.simple_index import write_simple_index

NAME = "index"
HELP = "write a PEP 503 simple index of dist/ that pip installs from"
DESCRIPTION = """\
Check the wheels in DIST against DIST/manifest.json (when present: every wheel must be
listed with the same sha256), then write a static PEP 503 index to OUT/simple/: one page
per project (normalized name) with one link per wheel, each carrying #sha256= (pip checks
it) and data-requires-python (and, with --metadata, each wheel's METADATA: PEP 658). The
wheels are copied
(--link: hard-linked) next to their page. The index replaces OUT/simple/ atomically and
is the same, byte for byte, for the same wheels.

Install from it:
  pip install --index-url file://<OUT>/simple/ ampforge
or serve OUT with any static web server (python -m http.server -d OUT) and use
http://HOST:PORT/simple/. pip picks the wheel whose Requires-Dist torch==X.Y.* matches the
installed torch (the +torchX.Y local version of each wheel carries that pin).

Exit codes: 0 written; 1 a wheel is broken or does not match the manifest (each is named);
2 DIST is missing or holds no wheel."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dist",
        nargs="?",
        default="dist",
        metavar="DIST",
        help="folder of wheels, usually with manifest.json (default: dist)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where to write the index (DIR/simple/...); `make index` uses build/index",
    )
    p.add_argument(
        "--link",
        action="store_true",
        help="hard-link the wheels into the index instead of copying them",
    )
    p.add_argument(
        "--per-torch",
        action="store_true",
        help="one index per torch series, OUT/torch2.13/simple/ ... (as PyG does): "
        "safe with --extra-index-url next to the index your torch comes from, "
        "which a single index holding several series is not; prints one URL a line",
    )
    p.add_argument(
        "--metadata",
        action="store_true",
        help="also serve each wheel's METADATA (PEP 658) so new pips resolve without "
        "downloading; pip 23.0 (Python 3.11's ensurepip) mishandles it, so off by "
        "default",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    found = dist_wheels(Path(args.dist))
    for note in found.notes:
        ctx.output.err(f"note: {note}")
    check = "sha256 checked against manifest.json" if found.checked else "no manifest"
    if args.per_torch:
        results = write_per_torch_indexes(
            found.wheels, Path(args.out), link=args.link, metadata=args.metadata
        )
        for series, result in results.items():
            ctx.output.err(f"{series}: {len(result.files)} wheel(s) into {result.simple}")
            ctx.output.out(result.url)
        listed = {w.filename for result in results.values() for w in result.files}
        for wheel in found.wheels:
            if wheel.name not in listed:
                # e.g. a stable-ABI wheel (torch>=2.10) next to labelled wheels of older
                # torches only: no series page admits it. It is still released (publish).
                ctx.output.err(
                    f"warning: {wheel.name}: on no per-torch page (its torch range "
                    f"admits none of {', '.join(results)}); a plain `index` or "
                    "`publish` carries it"
                )
        ctx.output.err(
            f"indexed {len(found.wheels)} wheel(s) from {found.dist} ({check}) "
            f"into {len(results)} per-torch indexes; install with "
            "--extra-index-url <the URL of your torch's series>"
        )
        return 0
    result = write_simple_index(
        found.wheels, Path(args.out), link=args.link, metadata=args.metadata
    )
    for project, files in result.projects.items():
        ctx.output.err(f"{project}: {len(files)} file(s)")
        for w in files:
            ctx.output.err(f"  {w.filename}  sha256={w.sha256[:16]}...")
    ctx.output.err(
        f"indexed {len(result.files)} wheel(s) of {len(result.projects)} "
        f"project(s) from {found.dist} ({check}) into {result.simple}"
    )
    # stdout: just the URL, so `pip install --index-url "$(python -m builder index ...)"` works.
    ctx.output.out(result.url)
    return 0
