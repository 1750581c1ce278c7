"""The resolver: one record per cell with every decision and its reason
(:class:`~builder.plan.resolved.ResolvedCell`).

One resolver (:func:`resolve`) turns settings + this host's facts into records; ``plan`` prints
them (``--format json`` prints exactly :meth:`ResolvedCell.to_dict`), ``render``/``fetch``/
``build``/``matrix`` execute them, and every wheel's manifest entry stores its record. Nothing
downstream decides again: which torch (and why), which backend (and why), the base image
actually used (ref and id), the platform tag the wheel must meet, the torch-npu release its
``npu`` extra pins (or none, and why), where the cell can be built (this host, or a named native
runner and why not here), the network, and the proxy, CA and index settings with their sources
(passwords masked).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from builder.backend_kinds import backend_kind, requested_kind
from builder.backends.base import Backend, Host
from builder.config import REPO_ROOT, BaseImage, BuildConfig, Selection, Settings, values
from builder.config.cibwproject import identifiers_of
from builder.errors import BuilderError
from builder.incell.steps import needs_cxx_floor
from builder.plan.builds import assign, detected
from builder.plan.cells import Cell, DroppedCell, expand, select, widen
from builder.plan.choose import choose
from builder.plan.cibwselect import narrow, with_archs
from builder.plan.cudacell import resolve_cuda
from builder.plan.project import StableAbi, read_bounds
from builder.plan.resolved import THIS_HOST, ResolvedCell, glibc_of
from builder.release.manifest import read_manifest


@dataclass(frozen=True)
class Resolution:
    cells: tuple[ResolvedCell, ...]
    dropped: tuple[DroppedCell, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def here(self) -> tuple[ResolvedCell, ...]:
        return tuple(c for c in self.cells if c.buildable)

    @property
    def elsewhere(self) -> tuple[ResolvedCell, ...]:
        return tuple(c for c in self.cells if not c.buildable)


def default_selection(selection: Selection, host: Host) -> Selection:
    """``make wheel`` with nothing named: this host's arch and the builder's own Python."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return replace(
        selection,
        arch=(host.arch,),
        python=(py,),
        origins={
            **selection.origins,
            "arch": "default: this host",
            "python": f"default: the builder's Python {py}",
        },
    )


def _with_image(cell: Cell, ref: str) -> Cell:
    return replace(cell, image=replace(cell.image, ref=ref, pinned=True))


def _override(cell: Cell, config: BuildConfig, host: Host, backend: str) -> Cell:
    """``--base-image`` (BUILDER_BASE_IMAGE): this host's arch's image; with ``--backend
    emulated`` also the other arch's. ``local`` is the image ``builder base-image`` makes."""
    ref = config.base_image
    asked = requested_kind(backend)
    if ref is None or (cell.machine != host.machine and (asked is None or not asked.emulated)):
        return cell
    if ref == "local":
        from builder.images.base_image import BaseImageSpec  # noqa: PLC0415 - auditwheel data

        ref = BaseImageSpec(arch=cell.machine).tag
    return _with_image(cell, ref)


def _settings(config: BuildConfig) -> dict[str, Any]:
    """Proxy, CA and index settings with their sources; proxy passwords masked."""
    red = config.proxy.redactor()
    proxy = {
        key.upper(): {"value": red(value), "source": config.proxy.origins.get(key, "?")}
        for key, value in sorted(config.proxy.values.items())
        if value
    }
    ca = (
        {"path": str(config.ca_bundle), "source": config.origins.get("ca_bundle", "?")}
        if config.ca_bundle is not None
        else None
    )
    offline: dict[str, Any] = {
        "enabled": config.offline.enabled,
        "source": config.origins.get("offline", "?"),
    }
    if config.offline.bundle is not None:
        offline["bundle"] = str(config.offline.bundle)
    elif config.offline.enabled:
        offline["wheelhouse"] = str(config.offline.wheelhouse)
    index = {
        "index_url": red(config.pip.index_url) if config.pip.index_url else None,
        "extra_index_urls": [red(u) for u in config.pip.extra_index_urls],
    }
    pull = {"policy": config.pull, "source": config.origins.get("pull", "?")}
    return {
        "proxy": proxy,
        "ca_bundle": ca,
        "index": index,
        "offline": offline,
        "pull": pull,
        # cibuildwheel's options (the passed variables by name only)
        "build_options": config.build_options.record(),
    }


def _network(config: BuildConfig, backend: str) -> str:
    if config.offline.enabled:
        return "none (offline)"
    if backend_kind(backend).in_container:
        return config.network or "the engine's default bridge"
    return "this host's network"


def resolve(
    settings: Settings,
    host: Host,
    backends: Mapping[str, Backend],
    *,
    out: Path,
    everything: bool = False,
    project: Optional[Path] = None,
) -> Resolution:
    """Every selected cell's record. *everything*: no selection means every cell of the matrix
    (``--all``, ``plan``); otherwise it means this host's one default cell (``make wheel``).
    *project*: the project built (default: this repository); cells it cannot be installed on
    (its requires-python, its torch bound) are dropped with the reason."""
    config = settings.config
    selection = settings.selection
    if selection.empty and not everything:
        selection = default_selection(selection, host)
    if config.cibw is not None:  # the project's archs, where no arch was named
        selection = with_archs(selection, config.cibw)
    pick_newest = selection.torch is None and selection.python is not None
    bounds = read_bounds(project or REPO_ROOT)
    config, widened = widen(config, selection)
    plan = select(expand(config, bounds), selection, newest=False, config=config, bounds=bounds)
    if config.cibw is not None:  # the project's build / skip, after the selection
        plan = narrow(plan, config.cibw)
    plan = replace(plan, notes=widened + plan.notes)
    records = [_resolve_cell(cell, config, selection, host, backends, out) for cell in plan.cells]
    notes: list[str] = list(plan.notes)
    if pick_newest:
        records, picked = _newest(records, plan.dropped)
        notes += picked
    if bounds is None or not bounds.npu_extra:  # other people's METADATA is theirs
        why = (
            "the project does not ask for it (npu-extra = true in the [tool.ampforge] of "
            f"its {bounds.file if bounds else 'pyproject.toml'} would)"
        )
        records = [replace(r, torch_npu=None, torch_npu_reason=why) for r in records]
    stable = bounds.stable_abi if bounds is not None else None
    if stable is None:
        stable = _detected(out, (project or REPO_ROOT).name)
    # (assign makes a record stable only when there is a stable ABI)
    records = [
        replace(r, torch_requirement=stable.requirement) if r.stable and stable is not None else r
        for r in assign(records, stable)
    ]
    return Resolution(
        cells=tuple(records), dropped=plan.dropped, notes=tuple(notes), warnings=plan.warnings
    )


def _detected(out: Path, project: str) -> Optional[StableAbi]:
    """A stable ABI an earlier build found in the project's wheel (builder.plan.builds)."""
    try:
        doc = read_manifest(out)
    except BuilderError:
        return None  # a broken manifest is reported by the build that writes it
    return detected(doc, project, out / "manifest.json")


def _resolve_cell(
    cell: Cell,
    config: BuildConfig,
    selection: Selection,
    host: Host,
    backends: Mapping[str, Backend],
    out: Path,
) -> ResolvedCell:
    origin = config.origins.get("backend", "built-in default")
    image_source = f"{config.source_name} images.{cell.arch}.base"
    options, test = config.build_options, None
    if config.cibw is not None:  # the project's own, its overrides for this cell applied
        ids = identifiers_of(cell)
        options, test = config.cibw.options_for(ids), config.cibw.test_for(ids)
        found = config.cibw.image_for(ids, cell.machine, cell.image.ref)
        if found is not None:
            cell, image_source = _with_image(cell, found[0]), found[1]
        config = replace(config, build_options=options)
    named = _override(cell, config, host, config.backend)
    if named is not cell:
        cell, image_source = named, config.origins.get("base_image", "--base-image")
    choice = choose(cell, config.backend, origin, host, backends, config.support)
    image = backends[choice.backend].base_image(cell, host, config)
    if image.family is not None:  # docker, emulated: the image actually used
        cell = replace(
            cell,
            image=BaseImage(
                ref=image.ref,
                family=image.family,
                plat=image.plat or cell.image.plat,
                python_path=cell.image.python_path,
                pinned=cell.image.pinned,
            ),
        )
    runner = THIS_HOST if choice.buildable else config.runners.get(cell.machine, cell.machine)
    runner_reason = (
        f"this {host.machine} host can build it"
        if choice.buildable
        else f"this {host.machine} host cannot (see backend_reason): a native "
        f"{cell.machine} runner, label {runner} (config runners.{cell.machine})"
    )
    torch_origin = selection.origins.get("torch")
    torch_reason = (
        f"named ({torch_origin})"
        if selection.torch is not None
        else f"the matrix's torch axis ({config.source_name})"
    )
    support = config.support
    plat = support.torch_plat(cell.torch, cell.machine)
    npu = support.npu_pin(cell.torch, cell.python, cell.machine)
    abi = support.abi(cell.torch, cell.machine)
    setuptools = support.setuptools_requirement(cell.torch)
    glibc = support.glibc(cell.torch, cell.machine)
    cuda = resolve_cuda(cell, config, selection)
    return ResolvedCell(
        cuda=cuda,
        auditwheel_exclude=tuple(dict.fromkeys((*config.build.auditwheel_exclude, *cuda.excludes))),
        cell=cell,
        torch_reason=torch_reason,
        backend=choice.backend,
        backend_reason=choice.reason,
        buildable=choice.buildable,
        runner=runner,
        runner_reason=runner_reason,
        image=image,
        plat=plat,
        plat_reason=f"torch {cell.torch}'s own wheel is {plat} ({glibc.reason}): "
        "ours must install wherever it does",
        cxx11_abi=bool(abi.value),
        cxx11_abi_reason=(
            f"torch {cell.torch}'s {cell.machine} wheel was built with "
            f"_GLIBCXX_USE_CXX11_ABI={int(bool(abi.value))} ({abi.reason})"
        ),
        setuptools=str(setuptools.value),
        setuptools_reason=setuptools.reason,
        cxx_floor=needs_cxx_floor(glibc_of(plat)),
        network=_network(config, choice.backend),
        torch_npu=npu.release,
        torch_npu_reason=npu.reason,
        settings=_settings(config),
        output=str(out),
        host_machine=host.machine,
        build_options=options if config.cibw is not None else None,
        test=test,
        image_source=image_source if image.family is not None else THIS_HOST,
    )


def _newest(
    records: Sequence[ResolvedCell], dropped: Sequence[DroppedCell]
) -> tuple[list[ResolvedCell], list[str]]:
    """A Python named without a torch: per (arch, Python), the newest torch of the matrix that
    this host can build, else the newest (which then needs a runner) -- with the reason."""
    groups: dict[tuple[str, str, str], list[ResolvedCell]] = {}
    for r in records:
        groups.setdefault((r.cell.arch, r.cell.python, r.cell.cuda), []).append(r)
    chosen: list[ResolvedCell] = []
    notes: list[str] = []
    for (arch, python, cuda), group in groups.items():
        group = sorted(group, key=lambda r: values.torch_key(r.cell.torch), reverse=True)
        newest = group[0]
        pick: Optional[ResolvedCell] = next((r for r in group if r.buildable), None)
        if pick is None:
            pick = newest
            why = (
                f"no torch named: {pick.cell.torch}, the newest in the matrix with a "
                f"{pick.cell.cp} wheel for {pick.cell.machine}; no torch of the matrix can be "
                "built here for it"
            )
        elif pick is newest:
            why = (
                f"no torch named: {pick.cell.torch}, the newest in the matrix with a "
                f"{pick.cell.cp} wheel for {pick.cell.machine}"
            )
        else:
            skipped = ", ".join(r.cell.torch for r in group[: group.index(pick)])
            why = (
                f"no torch named: {pick.cell.torch}, the newest in the matrix this host can "
                f"build for {pick.cell.cp} {pick.cell.machine}; newer {skipped} cannot be "
                f"built here ({newest.backend_reason}); name --torch {newest.cell.torch} to "
                f"build it on a native {pick.cell.machine} runner"
            )
        unpublished = sorted(
            {
                d.torch
                for d in dropped
                if d.arch == arch
                and d.python == python
                and d.cuda == cuda
                and values.torch_key(d.torch) > values.torch_key(pick.cell.torch)
            },
            key=values.torch_key,
        )
        if unpublished:
            why += (
                f"; newer {', '.join(unpublished)} publish no {pick.cell.cp} wheel for "
                f"{pick.cell.machine}"
            )
        notes.append(f"{arch} / Python {python}: {why} -> {pick.identifier}")
        chosen.append(replace(pick, torch_reason=why))
    return chosen, notes  # groups keep the matrix's (arch, Python) order
