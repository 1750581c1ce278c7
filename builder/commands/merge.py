"""``merge``: one verified release from the ``dist/`` folders of many runners."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.cli import Context
from builder.release.merge import merge

NAME = "merge"
HELP = "merge the dist/ folders of several runners into one verified release folder"
DESCRIPTION = """\
Combine the output folders of several builds (each CI runner's dist/, as uploaded: wheels
and manifest.json) into one release folder that `index`, `index --per-torch` and `publish`
take as they take dist/.

Checked first, and nothing is written unless everything passes:
  * every wheel against its folder's manifest.json (sha256; a wheel the manifest does not
    list, or an entry whose wheel is missing, is refused);
  * every entry against its resolved record (extra.resolved): the cell, its Python and torch,
    and the file name's tags and +torch label must agree;
  * conflicts between folders: one file name with other bytes, or two entries of one cell
    that disagree (the cell was built twice) -- each named with both folders.

Each entry of the merged manifest gains "built_by": the runner that built the wheel (from the
entry's extra.built_on, which every build records) and the folders it was found in. Merging
is idempotent: the same folders give the same bytes, merging the release with one of its
inputs changes nothing, and an unchanged release is not rewritten. A release folder that
already exists is an input too: a merge adds to it, and never drops what it holds.

  python -m builder merge artifacts/* --out release
  python -m builder index release --per-torch --out build/index

Exit codes: 0 merged (or already up to date); 1 a wheel does not match its manifest or
record, or a conflict (nothing written); 2 a folder is missing, holds no wheel or no
manifest.json."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="build output folders (dist/ of each runner) to merge",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="RELEASE",
        help="the release folder to write (wheels + manifest.json)",
    )
    p.add_argument(
        "--link",
        action="store_true",
        help="hard-link the wheels into the release instead of copying them",
    )


def run(args: argparse.Namespace, ctx: Context) -> int:
    result = merge([Path(d) for d in args.dirs], Path(args.out), link=args.link)
    for entry in result.entries:
        built_by = entry["built_by"]
        ctx.output.err(
            f"{entry['cell']}: {entry['file']} (built by {built_by['runner']}; "
            f"from {', '.join(built_by['sources'])})"
        )
    what = "merged" if result.changed else "already up to date:"
    ctx.output.err(
        f"{what} {len(result.wheels)} wheel(s), {len(result.entries)} cell(s) "
        f"from {len(args.dirs)} folder(s) in {result.out}"
    )
    ctx.output.out(str(result.out))
    return 0
