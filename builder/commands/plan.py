"""``plan``: print the expanded cells of the matrix (and why any were dropped)."""

from __future__ import annotations

import argparse
import json

from builder.cli import Context, add_config_options, add_selection_options, resolve_plan
from builder.config.load import Settings
from builder.plan.cells import Plan

NAME = "plan"
HELP = "show the cells a build would make, and the reason for each dropped cell"
DESCRIPTION = """\
Expand the matrix (arch x python x torch, include/exclude rules, the torch<->Python
support table) and print the buildable cells and the dropped ones with their reasons.

formats:
  table   human-readable (default)
  json    {"cells": [...], "dropped": [...], "notes": [...], "warnings": [...]}
  github  one line of JSON {"include": [...]} for a CI job matrix, one cell per job, e.g.
          echo "matrix=$(python -m builder plan --format github)" >> "$GITHUB_OUTPUT"

Notes (e.g. which torch a selection resolved to) and warnings go to stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json", "github"),
        default="table",
        help="output format (default: table)",
    )
    add_selection_options(p)
    add_config_options(p)


def _table(settings: Settings, plan: Plan) -> list[str]:
    cfg = settings.config
    lines = [f"config:  {cfg.source_name} (support table: {cfg.support.file})"]
    for proxy_line in cfg.proxy.describe():
        lines.append(f"proxy:   {proxy_line}")
    if cfg.ca_bundle is not None:
        lines.append(f"CA:      {cfg.ca_bundle} ({cfg.origins.get('ca_bundle')})")
    lines.append(
        f"offline: {'yes' if cfg.offline.enabled else 'no'} ({cfg.origins.get('offline')})"
    )
    lines.append("")
    header = ("CELL", "ARCH", "PYTHON", "TORCH", "BASE IMAGE")
    rows = [(c.identifier, c.arch, c.python, c.torch, c.image.ref) for c in plan.cells]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    lines.append(f"{len(plan.cells)} cell{'s' if len(plan.cells) != 1 else ''} to build.")
    if plan.dropped:
        lines.append("")
        lines.append(f"dropped ({len(plan.dropped)}):")
        width = max(len(d.identifier) for d in plan.dropped)
        for d in plan.dropped:
            lines.append(f"  {d.identifier.ljust(width)}  {d.reason}")
    return lines


def run(args: argparse.Namespace, ctx: Context) -> int:
    settings, plan = resolve_plan(args, ctx)
    if args.format == "json":
        doc = {
            "config": settings.config.source_name,
            "cells": [c.to_dict() for c in plan.cells],
            "dropped": [d.to_dict() for d in plan.dropped],
            "notes": list(plan.notes),
            "warnings": list(plan.warnings),
        }
        ctx.output.out(json.dumps(doc, indent=2))
    elif args.format == "github":
        include = [
            {
                "cell": c.identifier,
                "arch": c.arch,
                "python": c.python,
                "torch": c.torch,
                "machine": c.machine,
            }
            for c in plan.cells
        ]
        ctx.output.out(json.dumps({"include": include}, separators=(",", ":")))
    else:
        for line in _table(settings, plan):
            ctx.output.out(line)
    return 0
