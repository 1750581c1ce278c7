"""``build --offline [--bundle DIR]``: the checks and loads that come before any image build.

* :func:`use_bundle` -- the bundle's sha256s verified (a corrupted or missing file is named),
  offline turned on, its ``wheels/`` the wheelhouse;
* :func:`bundle_base_image` -- the bundle's base image for this host's arch, ``docker load``-ed
  when the engine lacks it (nothing is pulled);
* :func:`preflight` -- every cell's requirements met by the wheelhouse for the cell's Python
  and platform (:mod:`builder.offline.preflight`), before anything compiles.

Bundle problems and unmet requirements are bad input, not failed steps: they exit 2, naming the
file or the package, version, Python and platform.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, cast

from builder.backend_kinds import requested_kind
from builder.config import BuildConfig
from builder.errors import ConfigError, EngineUnavailable
from builder.offline.bundle import Bundle, load_images, read_bundle, verify_bundle
from builder.offline.preflight import (
    HostTorch,
    Target,
    cell_requirements,
    describe_missing,
    index_wheelhouse,
    resolve,
)
from builder.plan.cells import Cell
from builder.redact import Redactor


def use_bundle(config: BuildConfig, say: Callable[[str], None]) -> tuple[Bundle, BuildConfig]:
    """Read and verify the configured bundle; return it and *config* with offline on."""
    assert config.offline.bundle is not None
    bundle = read_bundle(config.offline.bundle)
    verify_bundle(bundle, lambda m: say(f"bundle: {m}"))
    if not config.offline.enabled:
        say("note: a bundle is for offline builds: building offline (--offline)")
        config = replace(
            config,
            offline=replace(config.offline, enabled=True),
            origins={**config.origins, "offline": "implied by the bundle"},
        )
    return bundle, config


def bundle_base_image(
    bundle: Bundle,
    arch: str,
    base_ref: Optional[str],
    backend: str,
    redactor: Redactor,
    say: Callable[[str], None],
) -> Optional[str]:
    """The base image ref for *arch*: ``--base-image`` if given, else the bundle's. The bundle's
    images for *arch* are loaded into the engine first (docker backends only)."""
    image = bundle.image_for(arch)
    asked = requested_kind(backend)
    if asked is not None and not asked.in_container:
        return base_ref
    if image is None:
        if base_ref is None:
            say(
                f"note: bundle {bundle.root} holds no base image for {arch}; the engine must "
                "have the config's"
            )
        return base_ref
    from builder.engines.docker import DockerEngine  # noqa: PLC0415

    try:
        engine = DockerEngine(redactor=redactor)
    except EngineUnavailable:
        if asked is not None:
            raise
        return base_ref  # auto will choose the host backend and say why
    load_images(engine, bundle, [arch], lambda m: say(f"bundle: {m}"))
    if base_ref is None:
        pinned = f", the pin {image.pin} (its image id checked after the load)" if image.pin else ""
        say(f"base image: {image.ref} (from the bundle{pinned})")
        return image.ref
    return base_ref


def _host_plat(machine: str) -> str:
    """The glibc policy of this host (the host backend's wheels install here)."""
    # None only from a C library other than glibc, which the host backend does not run on.
    libc = cast(str, os.confstr("CS_GNU_LIBC_VERSION"))
    _, _, version = libc.partition(" ")  # "glibc 2.36"
    major, minor = version.split(".")[:2]
    return f"manylinux_{major}_{minor}_{machine}"


def preflight(
    cells: Sequence[tuple[Cell, bool]],
    wheelhouse: Path,
    where: str,
    project: Optional[Path],
    say: Callable[[str], None],
    hosts: Sequence[HostTorch] = (),
    toolkits: Optional[Mapping[str, Sequence[str]]] = None,
    frontends: Optional[Mapping[str, Sequence[str]]] = None,
) -> None:
    """Each ``(cell, on_host)`` checked against *wheelhouse*, and each host torch environment
    (*hosts*: the cross cells'); ConfigError naming every gap. *toolkits*, *frontends*: a
    cell's CUDA toolkit pins and what its build frontend installs, by cell id."""
    wheels = index_wheelhouse(wheelhouse)
    machine = platform.machine()
    checks = [
        (
            Target(
                cell.python,
                cell.machine,
                _host_plat(cell.machine) if on_host else cell.plat,
                cell.identifier,
            ),
            cell_requirements(
                cell.torch,
                project,
                (toolkits or {}).get(cell.identifier, ()),
                (frontends or {}).get(cell.identifier, ()),
            ),
        )
        for cell, on_host in cells
    ]
    checks += [
        (host.target(machine, _host_plat(machine)), cell_requirements(host.torch)) for host in hosts
    ]
    gaps = []
    for target, requirements in checks:
        result = resolve(wheels, target, requirements)
        if result.ok:
            say(
                f"preflight: {where} has all {len(result.chosen)} wheels for {target.cell} "
                f"({target.describe()})"
            )
        else:
            gaps.append(describe_missing(result, where))
    if gaps:
        raise ConfigError(
            "\n".join(gaps) + "\n(nothing was built: fetch the missing wheels, "
            "e.g. `python -m builder fetch --bundle DIR` for these cells, on a "
            "connected machine)"
        )
