"""``plan``: print the resolved cells -- every decision a build would take, with its reason."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from builder.cli import (
    EVERY_CELL,
    Context,
    add_build_option_flags,
    add_config_options,
    add_print_identifiers_option,
    add_selection_options,
    resolve_from_args,
)
from builder.commands.build import plan_document
from builder.config import BuildConfig, Settings
from builder.config.pins import unpinned_reason
from builder.plan.resolve import Resolution
from builder.plan.resolved import THIS_HOST, BuildHost, ResolvedCell

NAME = "plan"
HELP = "show the resolved cells (torch, backend, base image, tag, where) and every dropped cell"
DESCRIPTION = """\
Expand the matrix (arch x python x torch, include/exclude rules, the torch<->Python
support table, the project's requires-python and torch bound from its pyproject.toml:
no cell the project cannot be installed on is listed) and resolve every selected cell
exactly as `build` does: which torch (and why), which backend (and why), the base
image actually used, the platform tag the wheel must meet (never above torch's own), the
torch-npu release the wheel's `npu` extra pins ("none": torch-npu publishes no release for
that torch and Python, so the wheel has no `npu` extra; see configs/support.yaml),
whether this host can build it or which native runner it needs, the network, the base
image pull policy, and the proxy/CA/index settings with their sources
(passwords masked). `build` executes these same records and stores each in its manifest
entry.

formats:
  table   human-readable (default)
  json    {"config", "cells": [record, ...], "dropped", "notes", "warnings"}; the records are
          exactly what `build` uses (`build --dry-run` prints the same document)
  github  one line of JSON {"include": [...]} for a CI job matrix, one cell per job, each with
          the runner that can build it ("runs-on") and the resolved fields, e.g.
          echo "matrix=$(python -m builder plan --format github)" >> "$GITHUB_OUTPUT"
          Each job says what it does: "job": "build" (it compiles its wheel) or "verify" (it
          installs the wheel "built_by" another job compiled -- a stable-ABI wheel serving
          many cells -- next to its own torch and Python, and tests it). --github-jobs build gives
          one job per wheel, --github-jobs verify one per cell served by another's wheel: a workflow
          runs the second matrix after the first (needs:), with the first's dist/ as input.

Every cell's build: "stable" (one cpXY-abi3 wheel on torch's stable ABI per arch, for the
cells with torch and Python at least the project's [tool.ampforge.stable-abi]; built by one
cell, verified in every one) or "per-torch" (its own +torchX.Y wheel); the BUILD column and
the records' wheel / build_group / built_by / build_reason say which and why.

Notes (e.g. which torch a selection resolved to) and warnings go to stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json", "github"),
        default="table",
        help="output format (default: table)",
    )
    p.add_argument(
        "--github-jobs",
        choices=("all", "build", "verify"),
        default="all",
        help="with --format github: every cell (default), one job per wheel "
        "(build), or the cells that verify another job's wheel (verify)",
    )
    add_print_identifiers_option(p, "selected (those that need a native runner too)")
    p.add_argument(
        "--out",
        "--output-dir",
        dest="out",
        metavar="DIR",
        default="dist",
        help="the output folder the records name (as `build --out`; default: dist)",
    )
    p.add_argument(
        "--project",
        metavar="PATH",
        default=None,
        help="the project to plan for, as `build --project` (default: this "
        "repository): cells outside its requires-python or torch bound are "
        "dropped",
    )
    add_build_option_flags(
        p.add_argument_group(
            "cibuildwheel's build options (as `build` takes them; shown resolved, with sources)"
        )
    )
    add_selection_options(p, default=EVERY_CELL)
    add_config_options(p)


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


def _table(settings: Settings, resolution: Resolution) -> list[str]:
    cfg = settings.config
    lines = [f"config:  {cfg.source_name} (support table: {cfg.support.file})"]
    for proxy_line in cfg.proxy.describe():
        lines.append(f"proxy:   {proxy_line}")
    if cfg.ca_bundle is not None:
        lines.append(f"CA:      {cfg.ca_bundle} ({cfg.origins.get('ca_bundle')})")
    lines.append(
        f"offline: {'yes' if cfg.offline.enabled else 'no'} ({cfg.origins.get('offline')})"
    )
    lines.append(f"backend: {cfg.backend} ({cfg.origins.get('backend')})")
    lines.append(f"pull:    {cfg.pull} ({cfg.origins.get('pull')})")
    for option in cfg.build_options.describe():
        lines.append(f"option:  {option}")
    lines += _per_cell_lines(cfg, resolution)
    lines += _image_lines(resolution)
    for host, cells in _build_hosts(resolution).items():
        lines.append(
            f"host:    torch {host.torch} on this host's Python {host.python} runs the "
            f"project's build for {cells} cross cell{'s' if cells != 1 else ''} "
            f"(cross_host_torch in {cfg.support.file})"
        )
    lines.append("")
    header = (
        "CELL",
        "TORCH",
        "TORCH-NPU",
        "BUILD",
        "BACKEND",
        "BASE IMAGE",
        "TAG (AT MOST)",
        "ABI",
        "SETUPTOOLS",
        "WHERE",
    )
    rows = [header] + [
        (
            c.identifier,
            c.cell.torch,
            c.torch_npu or "none",
            build_column(c),
            c.backend if c.buildable else "-",
            _short(c.image.ref) if c.buildable else "-",
            c.plat,
            abi_column(c),
            c.setuptools.replace("setuptools", "", 1) or "any",
            THIS_HOST if c.buildable else f"runner {c.runner}",
        )
        for c in resolution.cells
    ]
    lines += _columns(rows)
    wheels = len({c.build_group for c in resolution.cells})
    stable = [c for c in resolution.cells if c.stable]
    if stable:
        groups = sorted({c.build_group for c in stable})
        lines.append(
            f"{wheels} wheel{'s' if wheels != 1 else ''} for {len(resolution.cells)} "
            f"cells: {len(stable)} cells take the stable-ABI wheel"
            f"{'s' if len(groups) != 1 else ''} of {', '.join(groups)} "
            f"({stable[0].torch_requirement}, abi3; built once, verified in each)."
        )
    lines += _cuda_lines(resolution)
    here, elsewhere = len(resolution.here), len(resolution.elsewhere)
    lines.append(
        f"{here} cell{'s' if here != 1 else ''} to build on this host; {elsewhere} "
        f"need{'s' if elsewhere == 1 else ''} a native runner."
    )
    if elsewhere:
        lines.append("")
        lines.append(f"not buildable on this host ({elsewhere}):")
        width = max(len(c.identifier) for c in resolution.elsewhere)
        for c in resolution.elsewhere:
            lines.append(f"  {c.identifier.ljust(width)}  {c.backend_reason}")
    if resolution.dropped:
        lines.append("")
        lines.append(f"dropped ({len(resolution.dropped)}):")
        width = max(len(d.identifier) for d in resolution.dropped)
        for d in resolution.dropped:
            lines.append(f"  {d.identifier.ljust(width)}  {d.reason}")
    return lines


def _cuda_lines(resolution: Resolution) -> list[str]:
    """What each CUDA cell's record decided (nothing for a matrix of cpu cells: today's table)."""
    lines = []
    for c in resolution.cells:
        r = c.cuda
        if not r.enabled or r.arch_list is None:
            continue
        pins = "pinned by version and sha256" if r.toolkit_hashed else "pinned by version"
        lines += [
            f"cuda:    {c.identifier}: CUDA {r.cuda} ({r.reason})",
            f"           torch: {r.torch_source}",
            f"           toolkit ({pins}): " + ", ".join(t.split(" ")[0] for t in r.toolkit),
            f"           TORCH_CUDA_ARCH_LIST={r.arch_list.text} ({r.arch_list_source})",
        ]
    return lines


def _build_hosts(resolution: Resolution) -> dict[BuildHost, int]:
    """Each host torch environment the buildable cells' project builds run in, and how many."""
    found: dict[BuildHost, int] = {}
    for c in resolution.cells:
        if c.buildable and c.image.build_host is not None:
            found[c.image.build_host] = found.get(c.image.build_host, 0) + 1
    return found


def _image_lines(resolution: Resolution) -> list[str]:
    """Each base image the cells are built in, whole (the table shortens the digest), whether
    it is pinned, and where it is set (the config, the project's manylinux-<arch>-image,
    --base-image)."""
    lines = []
    for ref, source in dict.fromkeys(
        (c.image.ref, c.image_source) for c in resolution.cells if c.buildable and c.image.family
    ):  # docker, emulated
        pinned = unpinned_reason(ref) is None
        lines.append(
            f"image:   {ref} ({'pinned by digest' if pinned else 'NOT pinned'}; "
            f"{source or 'the config'})"
        )
    return lines


def _per_cell_lines(cfg: BuildConfig, resolution: Resolution) -> list[str]:
    """What a project's [tool.cibuildwheel] makes differ per cell: an override's options
    (the cells it selects, with its source) and test-skip's cells."""
    lines = []
    base = cfg.build_options.describe()
    for c in resolution.cells:
        if c.build_options is not None:
            lines += [
                f"option:  {c.identifier}: {line}"
                for line in c.build_options.describe()
                if line not in base
            ]
        if c.test is not None and c.test.skipped:
            lines.append(
                f"test:    {c.identifier}: test-command not run ({c.test.skipped}); "
                "the builder's import check of its modules still runs"
            )
        elif c.test is not None and "overrides" in c.test.describe():
            lines.append(f"test:    {c.identifier}: {c.test.describe()}")
    return lines


def _short(ref: str) -> str:
    """*ref* with its digest cut to 12 hex digits, for the table."""
    name, at, digest = ref.partition("@")
    return f"{name}@{digest[:19]}" if at else ref


def abi_column(cell: ResolvedCell) -> str:
    """The ABI column: the C++ string ABI the cell's torch was built with (its compile's
    -D_GLIBCXX_USE_CXX11_ABI)."""
    return "cxx11" if cell.cxx11_abi else "pre-cxx11"


def build_column(cell: ResolvedCell) -> str:
    """The BUILD column: what builds the cell's wheel."""
    if not cell.stable:
        return f"own +{cell.local_version}" if cell.local_version else "own"
    if cell.built_by == cell.identifier:
        return f"{cell.build_group}: builds it"
    return f"{cell.build_group}: verifies {cell.built_by}'s"


def job_kind(cell: ResolvedCell) -> str:
    """ "build" for a cell that compiles its wheel, "verify" for one another cell's serves."""
    return "verify" if cell.built_by and cell.built_by != cell.identifier else "build"


def github_job(cell: ResolvedCell, settings: Settings) -> dict[str, object]:
    """One CI job: the runner that can build the cell and the resolved fields it builds."""
    runners = settings.config.runners
    runs_on = runners.get(cell.host_machine, cell.host_machine) if cell.buildable else cell.runner
    return {
        "cell": cell.identifier,
        "runs-on": runs_on,
        "arch": cell.cell.arch,
        "machine": cell.cell.machine,
        "python": cell.cell.python,
        "torch": cell.cell.torch,
        "backend": cell.backend,
        "plat": cell.plat,
        "torch_npu": cell.torch_npu,
        "job": job_kind(cell),
        "wheel": cell.wheel,
        "build_group": cell.build_group or cell.identifier,
        "built_by": cell.built_by or cell.identifier,
    }


def run(args: argparse.Namespace, ctx: Context) -> int:
    settings, resolution = resolve_from_args(args, ctx, everything=True)
    if args.print_build_identifiers:
        for c in resolution.cells:
            ctx.output.out(c.identifier)
        return 0
    if args.format == "json":
        ctx.output.out(json.dumps(plan_document(settings.config.source_name, resolution), indent=2))
    elif args.format == "github":
        include = [
            github_job(c, settings)
            for c in resolution.cells
            if args.github_jobs == "all" or job_kind(c) == args.github_jobs
        ]
        ctx.output.out(json.dumps({"include": include}, separators=(",", ":")))
    else:
        for line in _table(settings, resolution):
            ctx.output.out(line)
    return 0
