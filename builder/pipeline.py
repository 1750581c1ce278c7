"""One cell, end to end: recipe -> engine -> in-cell build -> label -> repair -> verify -> dist/.

Data flows one way: the cell and its rendered :class:`~builder.images.render.Recipe` come in;
a :class:`~builder.pipeline_types.CellResult` with typed step results goes out. The steps are
the same for both backends; only where they run differs:

* ``docker``: the cell's image is built from the rendered Dockerfile (proxies as build args,
  content-addressed tag, so an unchanged recipe is not rebuilt), then every in-cell step runs in
  one container that is removed on every exit path (D's :class:`DockerEngine.container`);
* ``host``: the same steps in a temporary directory here, with a local interpreter;
* ``cross``: aarch64 cells on an x86_64 host (:mod:`builder.cross`): cross-compiled with
  ``aarch64-linux-gnu-g++`` against the aarch64 torch, repaired with auditwheel, verified by
  running it under ``qemu-aarch64``. ``auto`` uses it for aarch64 cells when
  :func:`~builder.cross.cross_available` says the host can.
* ``emulated``: another arch's cells in that arch's base image (``base-image --arch ARM``),
  run under QEMU user emulation (:mod:`builder.engines.emulation`): exactly the docker steps, only
  slower. ``auto`` falls back to it for aarch64 cells when the cross path cannot build them
  but emulation works and the engine has an arm64 base image.

Before anything runs, the cell's *input key* (project files, recipe, base image, interpreter,
wheelhouse, builder sources) is compared with the manifest: a cell whose wheel in ``dist/`` was
built from the same inputs is reported ``up-to-date`` and not rebuilt (``--force`` rebuilds).

A wheel reaches ``dist/`` only after verification, through an atomic rename; a failure or a
Ctrl-C anywhere leaves ``dist/`` and ``manifest.json`` as they were.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import platform
import posixpath
import shutil
import sys
import time
import traceback
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from builder import __version__
from builder.arch import ARCHES
from builder.config.load import BaseImage, BuildConfig
from builder.cross.build import cross_build_wheel
from builder.cross.cell import cross_available
from builder.cross.qemu import extension_modules, verify_wheel
from builder.cross.repair import CROSS_EXCLUDES, repair_cross_wheel
from builder.cross.sysroot import DEBIAN_PYTHONS, TargetPython, ensure_target_python
from builder.cross.target_torch import ensure_target_torch, require_cpu_torch
from builder.cross.toolchain import PROVISION_SCRIPT, CrossToolchain, find_toolchain
from builder.engines.base import OutputLog, Session
from builder.engines.docker import CONTAINER_LABEL, DockerEngine
from builder.engines.emulation import require_emulation
from builder.engines.host import HostEngine, find_python
from builder.errors import BuilderError, ConfigError, EngineUnavailable, StepFailed
from builder.images.render import Recipe
from builder.incell import PROJECT_IGNORE, build_in_session, smoke_in_session
from builder.pipeline_types import BUILT, FAILED, UP_TO_DATE, CellResult, StepResult
from builder.plan.cells import Cell
from builder.redact import Redactor
from builder.release.manifest import (
    ManifestEntry,
    publish_wheel,
    read_manifest,
    record_wheel,
    sha256_file,
    utc_now,
)
from builder.wheel.localversion import add_local_version
from builder.wheel.repair import (
    CONTAINER_AUDITWHEEL,
    audit_wheel,
    host_auditwheel,
    repair_wheel,
    split_wheel_name,
)
from builder.wheel.reproducible import ENV_VAR as EPOCH_VAR
from builder.wheel.reproducible import SourceDateEpoch, normalize_wheel
from builder.wheel.verify import Verification, check_name_against_audit, check_no_bundled_torch
from builder.wheel.wheelcheck import check_tag_covers_own_code

T = TypeVar("T")

#: Label on every container of one ``build`` run, so an interrupted parallel run can remove them.
RUN_LABEL = f"{CONTAINER_LABEL}.run"
#: Where the wheelhouse is mounted inside containers (the rendered recipe's PIP_FIND_LINKS).
CONTAINER_WHEELHOUSE = "/wheelhouse"
BUILDER_DIR = Path(__file__).resolve().parent
CCACHE_VOLUME = "ampforge-ccache"


class BaseImageMissing(StepFailed):
    """The cell's base image is not in the engine (nothing is ever pulled implicitly)."""


@dataclass(frozen=True)
class PipelineOptions:
    project: Path
    out: Path  # dist/
    work: Path  # logs and staging (never inside dist/)
    wheelhouse: Optional[Path] = None  # find-links for torch and deps (offline: the only source)
    offline: bool = False
    jobs: Optional[int] = None  # compile jobs inside a cell (MAX_JOBS)
    force: bool = False  # rebuild even when the manifest says up to date
    ccache: bool = False
    #: The build's timestamp (builder.wheel.reproducible): in every build environment, the input key
    #: and the manifest; each published wheel is normalised with it. None: wheels as built.
    source_date_epoch: Optional[SourceDateEpoch] = None
    #: Docker network the cell's image build and container join (``--network``; None: the
    #: engine's default bridge). Not an input of the wheel: it only decides the way out.
    network: Optional[str] = None

    def epoch_env(self) -> dict[str, str]:
        epoch = self.source_date_epoch
        return {EPOCH_VAR: str(epoch.value)} if epoch is not None else {}


@dataclass(frozen=True)
class BackendChoice:
    name: str  # docker | host | cross | emulated
    reason: str
    engine: Optional[DockerEngine] = None
    #: ``auto`` with docker/host for this host's cells: the cross path builds the other arch's
    #: cells (the reason it was chosen), or None when it was not.
    cross: Optional[str] = None
    #: ``auto`` with docker for this host's cells: emulated containers build the other arch's
    #: cells (the reason), or None.
    emulated: Optional[str] = None


def uses_cross(cell: Cell, choice: BackendChoice) -> bool:
    """Whether *cell* goes through the cross path under *choice*."""
    return choice.name == "cross" or (choice.cross is not None and cell.machine != host_machine())


def uses_emulation(cell: Cell, choice: BackendChoice) -> bool:
    """Whether *cell* is built in an emulated container (another arch's image under QEMU)."""
    if cell.machine == host_machine():
        return False  # `--backend emulated` builds this host's cells like docker does
    return choice.name == "emulated" or choice.emulated is not None


def choose_cross(cells: Sequence[Cell]) -> tuple[bool, str]:
    """``auto`` for cells of another arch: the cross path when it can build every one of them."""
    reasons = []
    for cell in cells:
        ok, why = cross_available(cell.machine, cell.python)
        if not ok:
            return False, f"{cell.identifier}: {why}"
        reasons.append(why)
    return bool(cells), (reasons[0] if reasons else "no cell of another arch")


# ------------------------------------------------------------------------- backend choice


def host_machine() -> str:
    return platform.machine()


def host_arch() -> str:
    machine = host_machine()
    for name, arch in ARCHES.items():
        if arch.machine == machine:
            return name
    raise ConfigError(f"this host's machine {machine!r} is neither x86_64 nor aarch64")


def choose_backend(
    requested: str, base_refs: Sequence[str], redactor: Redactor,
    engine_factory: Callable[[], DockerEngine] | None = None,
) -> BackendChoice:
    """``docker``/``host`` as asked; ``auto``: docker when an engine answers *and* has the
    cells' base images, else host -- with the reason either way."""
    make = engine_factory or (lambda: DockerEngine(redactor=redactor))
    if requested == "host":
        return BackendChoice("host", "asked for (--backend host)")
    if requested == "docker":
        engine = make()  # EngineUnavailable (exit 1) says where it looked and how to start one
        return BackendChoice("docker", f"asked for (--backend docker); engine {engine.base_url} "
                                       f"(server {engine.server_version})", engine)
    if requested != "auto":
        raise ConfigError(f"unknown backend {requested!r}; expected auto, docker or host",
                          key="--backend")
    try:
        engine = make()
    except EngineUnavailable as exc:
        return BackendChoice("host", "no container engine answers ("
                             + exc.message.splitlines()[0] + ")")
    missing = [ref for ref in base_refs if engine.image_id(ref) is None]
    if missing:
        return BackendChoice(
            "host",
            f"a container engine answers at {engine.base_url}, but it lacks the base image "
            f"{', '.join(missing)} (nothing is pulled implicitly: `docker pull` it, or build a "
            "local one with `python -m builder base-image` and pass --base-image local)")
    return BackendChoice("docker", f"a container engine answers at {engine.base_url} "
                                   f"(server {engine.server_version}) and has the base image",
                         engine)


def with_base_image(config: BuildConfig, arch: str, ref: str,
                    engine: Optional[DockerEngine]) -> BuildConfig:
    """*config* with *arch*'s base image replaced by *ref* (``--base-image``).

    Images made by ``builder base-image`` are Debian inside: their family and glibc tag come
    from their labels, so the recipe uses apt and trusts a CA the Debian way.
    """
    old = config.images[arch]
    family, plat = old.family, old.plat
    if engine is not None and engine.image_id(ref) is not None:
        labels = engine.api.inspect_image(ref).get("Config", {}).get("Labels") or {}
        if "org.ampforge.base.suite" in labels:
            family = "debian"
            plat = labels.get("org.ampforge.base.plat", plat)
    images = dict(config.images)
    images[arch] = BaseImage(ref=ref, family=family, plat=plat, python_path=old.python_path)
    return replace(config, images=images)


# ------------------------------------------------------------------------- input key


def _ignored(rel: Path) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in PROJECT_IGNORE)


def tree_digest(root: Path, ignore: Callable[[Path], bool] = _ignored) -> str:
    """sha256 over the relative paths and contents of the files the build would see."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not ignore(rel_dir / d))
        for name in sorted(filenames):
            rel = rel_dir / name
            if ignore(rel):
                continue
            path = Path(dirpath) / name
            if path.is_symlink():
                data = os.readlink(path).encode()
            else:
                data = path.read_bytes()
            h.update(rel.as_posix().encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _builder_ignored(rel: Path) -> bool:
    return any(part == "__pycache__" or part.endswith(".pyc") for part in rel.parts)


def builder_digest() -> str:
    """sha256 over the whole builder package: any module, template or data file added to it is
    in the key without anyone having to list it (a hand-kept list once silently missed one)."""
    return tree_digest(BUILDER_DIR, ignore=_builder_ignored)


def input_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def find_up_to_date(out: Path, cell_id: str, key: str) -> Optional[Path]:
    """The wheel in *out* recorded for *cell_id* with input key *key*, intact; else None."""
    if not (out / "manifest.json").exists():
        return None
    for w in read_manifest(out)["wheels"]:
        extra = w.get("extra") or {}
        if w.get("cell") != cell_id or extra.get("input_key") != key:
            continue
        path = out / str(w.get("file"))
        if path.is_file() and sha256_file(path) == w.get("sha256"):
            return path
    return None


def rebuild_reason(out: Path, cell_id: str, parts: Mapping[str, Any]) -> str:
    """Why *cell_id* is built although dist/ may hold it: the inputs whose digest differs from
    its newest manifest entry's (``extra.inputs``), or that there is no usable entry."""
    entries = [w for w in read_manifest(out)["wheels"] if w.get("cell") == cell_id] if (
        out / "manifest.json").exists() else []
    if not entries:
        return "not built before (no manifest entry)"
    recorded = (entries[-1].get("extra") or {}).get("inputs") or {}
    changed = sorted(k for k, v in parts.items() if recorded.get(k) != input_key({k: v})[:12])
    if changed:
        return "inputs changed since the last build: " + ", ".join(changed)
    return "its wheel in the manifest is missing or altered"


def _normalize(opts: PipelineOptions, steps: _Steps, wheel: Path) -> None:
    """The repaired wheel in the canonical zip layout (builder.wheel.reproducible)."""
    epoch = opts.source_date_epoch
    if epoch is not None:
        steps("normalize", lambda: normalize_wheel(wheel, epoch.value))


# ------------------------------------------------------------------------- one cell


class _Steps:
    """Runs named steps, timing each and reporting it to the display."""

    def __init__(self, result: CellResult, report: Callable[[str, str], None]) -> None:
        self.result = result
        self.report = report

    def __call__(self, name: str, fn: Callable[[], T]) -> T:
        self.report(self.result.cell, name)
        start = time.monotonic()
        try:
            value = fn()
        except BaseException as exc:
            detail = exc.message if isinstance(exc, BuilderError) else type(exc).__name__
            self.result.steps.append(StepResult(name, False, time.monotonic() - start, detail))
            raise
        self.result.steps.append(StepResult(name, True, time.monotonic() - start))
        return value


@dataclass
class _Built:
    wheel: Path  # verified, on the host (staging)
    torch: str
    compiler: str
    tag: str
    modules: tuple[str, ...]
    base_image: str
    extra: dict[str, Any] = field(default_factory=dict)


def _in_session(
    session: Session, cell: Cell, config: BuildConfig, opts: PipelineOptions, steps: _Steps,
    stage: Path, *, python: str, wheelhouse: Optional[str], auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]],
) -> _Built:
    """The in-cell steps shared by both backends."""
    excludes = tuple(config.build.auditwheel_exclude)
    built = steps("compile", lambda: build_in_session(
        session, python=python, torch=cell.torch, project=opts.project, wheelhouse=wheelhouse,
        index_url=config.pip.index_url, local_version_label="", ccache=opts.ccache))

    def label() -> str:
        # The label is added outside the project's build, so any project gets +torchX.Y.
        raw = session.copy_out(built.wheel, stage / "raw")
        (stage / "labelled").mkdir(parents=True, exist_ok=True)
        labelled = add_local_version(raw, cell.torch_local, stage / "labelled")
        return session.copy_in(labelled, posixpath.join(session.workdir, "labelled"))

    inside = steps("version label", label)
    (stage / "repaired").mkdir(parents=True, exist_ok=True)
    repaired = steps("repair", lambda: repair_wheel(
        session, inside, stage / "repaired", auditwheel=auditwheel, env=auditwheel_env,
        excludes=excludes))
    _normalize(opts, steps, repaired.wheel)
    checked = steps("verify", lambda: verify_cell_wheel(
        session, repaired.wheel, python=python, torch=cell.torch, auditwheel=auditwheel,
        auditwheel_env=auditwheel_env, excludes=excludes, wheelhouse=wheelhouse,
        index_url=config.pip.index_url))
    gxx = session.run(["g++", "--version"], check=False, step="compiler version")
    compiler = next((line for line in gxx.tail if line.strip()), "unknown") if gxx.ok else "?"
    return _Built(wheel=checked.wheel, torch=built.torch, compiler=compiler, tag=checked.tag,
                  modules=checked.modules, base_image="")


def verify_cell_wheel(
    session: Session, wheel: Path, *, python: str, torch: str, auditwheel: Sequence[str],
    auditwheel_env: Optional[Mapping[str, str]], excludes: Sequence[str],
    wheelhouse: Optional[str], index_url: Optional[str],
) -> Verification:
    """D's three checks (builder.wheel.verify), with the tag check made exclusion-aware.

    ``check_name_against_audit`` compares the name with ``auditwheel show``'s symbol tag,
    which counts the excluded libraries' own glibc needs (see builder.wheel.wheelcheck); when only
    that differs, the wheel's own ELF files decide.
    """
    check_no_bundled_torch(wheel)
    inside = session.copy_in(wheel, posixpath.join(session.workdir, "audit"))
    audit = audit_wheel(session, inside, auditwheel=auditwheel, env=auditwheel_env)
    try:
        check_name_against_audit(wheel.name, audit, excludes)
    except StepFailed as exc:
        if audit.sym_tag in split_wheel_name(wheel.name)[4] or audit.unsupported_isa:
            raise
        check_name_against_audit(wheel.name, replace(audit, sym_tag=split_wheel_name(
            wheel.name)[4][0]), excludes)  # everything but the symbol tag still checked
        try:
            check_tag_covers_own_code(wheel)
        except StepFailed:
            raise exc from None
    modules = smoke_in_session(session, python=python, wheel=wheel, torch=torch,
                               wheelhouse=wheelhouse, index_url=index_url)
    return Verification(wheel=wheel, tag=split_wheel_name(wheel.name)[4][0],
                        modules=tuple(modules))


def _docker_cell(cell: Cell, recipe: Recipe, config: BuildConfig, opts: PipelineOptions,
                 engine: DockerEngine, log: OutputLog, steps: _Steps, stage: Path,
                 run_id: str, base_id: str) -> _Built:
    tag = f"ampforge/cell:{cell.identifier}-{input_key({'r': recipe.digest, 'b': base_id})[:16]}"

    def image() -> str:
        found = engine.image_id(tag)
        if found is not None:
            log.open()
            log.write_line(f"ampforge: image {tag} is up to date (same recipe and base image)")
            log.close()
            return found
        folder = recipe.write(stage / "context")
        return engine.build_image(recipe.dockerfile, tag, context=folder,
                                  build_args=recipe.build_args, log=log,
                                  labels={"org.ampforge.cell": cell.identifier},
                                  network=None if opts.offline else opts.network)

    steps("image", image)
    env = {} if opts.offline else dict(recipe.build_args)  # proxies for pip, never in the image
    env.update(opts.epoch_env())
    if opts.jobs:
        env["MAX_JOBS"] = str(opts.jobs)
    binds = {str(opts.wheelhouse.resolve()): CONTAINER_WHEELHOUSE} if opts.wheelhouse else {}
    # The compiler cache outlives the container in a named volume (the base image sets
    # CCACHE_DIR=/ccache): a rebuild after a one-file change recompiles only that file.
    volumes = {CCACHE_VOLUME: "/ccache"} if opts.ccache else {}
    with engine.container(tag, env=env, binds=binds, volumes=volumes, network=not opts.offline,
                          network_name=opts.network,
                          labels={RUN_LABEL: run_id, f"{CONTAINER_LABEL}.cell": cell.identifier,
                                  f"{CONTAINER_LABEL}.project": opts.project.name},
                          log=log) as session:
        built = _in_session(session, cell, config, opts, steps, stage,
                            python=cell.python_path,
                            wheelhouse=CONTAINER_WHEELHOUSE if opts.wheelhouse else None,
                            auditwheel=CONTAINER_AUDITWHEEL, auditwheel_env=None)
    built.base_image = base_id
    built.extra["image"] = tag
    return built


def _host_cell(cell: Cell, config: BuildConfig, opts: PipelineOptions, log: OutputLog,
               steps: _Steps, stage: Path, python: str) -> _Built:
    aw, aw_env = host_auditwheel()
    env = {"MAX_JOBS": str(opts.jobs)} if opts.jobs else {}
    env.update(opts.epoch_env())
    if opts.ccache:
        if shutil.which("ccache") is None:
            raise StepFailed("--ccache: ccache is not installed on this host "
                             "(apt-get install ccache), or build without --ccache")
        env["CCACHE_DIR"] = str(opts.work / "ccache")  # outlives the session's temp dir
    with HostEngine().session(env=env, log=log, parent=stage) as session:
        built = _in_session(session, cell, config, opts, steps, stage, python=python,
                            wheelhouse=str(opts.wheelhouse.resolve()) if opts.wheelhouse else None,
                            auditwheel=aw, auditwheel_env=aw_env)
    built.base_image = f"host:{python}"
    return built


@dataclass(frozen=True)
class _CrossTarget:
    """What a cross cell is built against (all cached under ~/.cache/ampforge)."""

    toolchain: CrossToolchain
    python: TargetPython
    torch_wheel: Path  # a CPU build (checked), so the result can be verified under QEMU

    @property
    def sysroot_id(self) -> str:
        """The sysroot's cache entry (named by the hash of its .debs), e.g.
        ``python3.11-aarch64-b8578677f7daa3d2``."""
        return self.python.sysroot.parent.name  # builder.cross.sysroot: <entry>/root

    def key(self) -> dict[str, Any]:
        return {"cross_sources": tree_digest(BUILDER_DIR / "cross"),
                "toolchain": self.toolchain.version(), "target_python": self.sysroot_id,
                "target_torch": self.torch_wheel.name + ":" + sha256_file(self.torch_wheel),
                # The host interpreter runs the project's setup.py.
                "host_python": sys.version}


def _cross_target(cell: Cell) -> _CrossTarget:
    toolchain = find_toolchain(cell.machine)
    python = ensure_target_python(cell.python, cell.machine)
    return _CrossTarget(toolchain, python, require_cpu_torch(cell.torch, python))


def _cross_cell(cell: Cell, opts: PipelineOptions, target: _CrossTarget, log_path: Path,
                steps: _Steps, stage: Path) -> _Built:
    """The cross path's steps (builder.cross), each reported like the in-cell ones."""
    torch = steps("target torch", lambda: ensure_target_torch(cell.torch, target.python))
    env = {"AMP_LOCAL_VERSION": cell.torch_local, **opts.epoch_env()}
    if opts.jobs:
        env["MAX_JOBS"] = str(opts.jobs)
    built = steps("compile", lambda: cross_build_wheel(
        opts.project, stage / "raw", target.python, torch, target.toolchain,
        log_path=log_path, extra_env=env))  # the cell's log is the build's log
    # Any project gets +torchX.Y (a no-op when its build honoured AMP_LOCAL_VERSION).
    (stage / "labelled").mkdir(parents=True, exist_ok=True)
    labelled = steps("version label", lambda: add_local_version(
        built.wheel, cell.torch_local, stage / "labelled"))
    ldpaths = [*target.toolchain.lib_dirs, *target.python.lib_dirs]
    repaired = steps("repair", lambda: repair_cross_wheel(
        labelled, stage / "repaired", ldpaths, CROSS_EXCLUDES))
    _normalize(opts, steps, repaired.wheel)

    def verify() -> dict[str, Any]:
        check_no_bundled_torch(repaired.wheel)
        # The cell's own torch, never a substitute: require_cpu_torch made sure it can run.
        return verify_wheel(repaired.wheel, target.python, torch)

    report = steps("verify (qemu)", verify)
    return _Built(wheel=repaired.wheel, torch=torch.full_version,
                  compiler=f"{target.toolchain.cxx.name} {target.toolchain.version()}",
                  tag=repaired.tag, modules=tuple(extension_modules(repaired.wheel)),
                  base_image=f"cross:{target.sysroot_id}",
                  extra={"verification": report})


def unsupported_reason(cell: Cell) -> Optional[str]:
    """Why this host cannot build *cell* natively (None when it can), naming what the cross
    path would need."""
    machine = host_machine()
    if cell.machine != machine:
        ok, why = cross_available(cell.machine, cell.python)
        cross = ("--backend cross (BACKEND=cross, or auto) builds it on this host" if ok else
                 f"the cross backend cannot build it here: {why.rstrip('.')}")
        return (f"{cell.arch} ({cell.machine}) cells are not supported yet on this {machine} "
                f"host by the docker and host backends: {cell.identifier} needs an "
                f"{cell.machine} machine, e.g. one CI runner per cell (`python -m builder plan "
                f"--format github`); {cross}. The cross path needs aarch64-linux-gnu-g++, "
                f"qemu-aarch64 (`sudo {PROVISION_SCRIPT}`) and an aarch64 Python sysroot "
                f"(Python {', '.join(DEBIAN_PYTHONS)}: the Debian releases' arm64 CPythons); "
                "--backend emulated builds it in an emulated "
                f"container instead (slow; needs `python -m builder base-image --arch "
                f"{cell.arch}`)")
    return None


def cross_unsupported(cell: Cell) -> Optional[str]:
    """Why the cross path cannot build *cell* on this host (None when it can)."""
    ok, why = cross_available(cell.machine, cell.python)
    if ok:
        return None
    hint = ""
    if cell.machine == "aarch64" and "sysroot" in why:
        hint = (f"; the cross sysroot supports Python {', '.join(DEBIAN_PYTHONS)} (the "
                "Debian arm64 CPythons), or build this cell on an aarch64 machine")
    elif cell.machine != "aarch64":
        hint = "; build it with --backend auto, docker or host"
    return f"the cross backend cannot build {cell.identifier}: {why.rstrip('.')}{hint}"


def build_cell(
    cell: Cell, recipe: Recipe, config: BuildConfig, opts: PipelineOptions,
    choice: BackendChoice, redactor: Redactor, report: Callable[[str, str], None],
    run_id: str,
) -> CellResult:
    """Build one cell. Step failures become a failed CellResult; Ctrl-C propagates (after the
    container and the staging folder are removed)."""
    result = CellResult(cell=cell.identifier)
    start = time.monotonic()
    log_path = opts.work / "logs" / f"{cell.identifier}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    result.log = log_path
    log = OutputLog(redactor=redactor, log_file=log_path)
    steps = _Steps(result, report)
    stage = opts.work / "stage" / f"{cell.identifier}-{uuid.uuid4().hex[:8]}"
    started_at = utc_now()
    try:
        cross = uses_cross(cell, choice)
        emulated = not cross and uses_emulation(cell, choice)
        why = cross_unsupported(cell) if cross else None if emulated else unsupported_reason(cell)
        if why is not None:
            raise StepFailed(why)
        if emulated:
            steps("emulation", lambda: require_emulation(cell.machine))
        key_parts: dict[str, Any] = {
            "builder": __version__, "builder_sources": builder_digest(),
            "cell": cell.to_dict(), "backend": "emulated" if emulated else choice.name,
            "project": tree_digest(opts.project), "excludes": config.build.auditwheel_exclude,
            "index_url": config.pip.index_url, "offline": opts.offline,
            "wheelhouse": sorted(p.name for p in opts.wheelhouse.iterdir())
            if opts.wheelhouse and opts.wheelhouse.is_dir() else None,
            "source_date_epoch": opts.source_date_epoch.value
            if opts.source_date_epoch is not None else None,
        }
        base_id = ""
        python = ""
        target: Optional[_CrossTarget] = None
        if cross:
            target = steps("cross target", lambda: _cross_target(cell))
            key_parts.update(backend="cross", excludes=list(CROSS_EXCLUDES), **target.key())
        elif choice.name in ("docker", "emulated"):
            assert choice.engine is not None
            engine = choice.engine
            make_base = ("python -m builder base-image --arch " + cell.arch
                         if emulated else "python -m builder base-image")

            def base() -> str:
                found = engine.image_id(cell.image.ref)
                if found is None:
                    raise BaseImageMissing(
                        f"base image {cell.image.ref} for {cell.identifier} is not in the engine "
                        f"at {engine.base_url}; nothing is pulled implicitly. Either "
                        f"`docker pull {cell.image.ref}` (offline: `docker load -i FILE.tar`), "
                        f"or build a local manylinux-shaped image with `{make_base}` and "
                        "pass --base-image local (make wheel BASE_IMAGE=local), or use "
                        + ("--backend cross" if emulated else "--backend host"))
                return found

            base_id = steps("base image", base)
            key_parts.update(recipe=recipe.digest, base_image=base_id)
        else:
            python = steps("interpreter", lambda: str(find_python(cell.python)))
            key_parts.update(python=python)
        key = input_key(key_parts)
        if not opts.force:
            existing = steps("up-to-date check", lambda: find_up_to_date(opts.out, cell.identifier,
                                                                          key))
            if existing is not None:
                result.status, result.wheel = UP_TO_DATE, existing
                result.note = (f"same inputs as its manifest entry (input key {key[:12]}); "
                               "--force rebuilds")
                return result
        result.note = ("--force" if opts.force else
                       rebuild_reason(opts.out, cell.identifier, key_parts))
        stage.mkdir(parents=True, exist_ok=True)
        if target is not None:
            built = _cross_cell(cell, opts, target, log_path, steps, stage)
        elif choice.name in ("docker", "emulated"):
            assert choice.engine is not None
            built = _docker_cell(cell, recipe, config, opts, choice.engine, log, steps, stage,
                                 run_id, base_id)
        else:
            built = _host_cell(cell, config, opts, log, steps, stage, python)

        def publish() -> Path:
            final = publish_wheel(built.wheel, opts.out)
            entry = ManifestEntry.for_wheel(
                final, cell=cell.identifier, torch=built.torch, python=cell.python,
                base_image=built.base_image, compiler=built.compiler,
                builder_version=__version__, started_at=started_at, finished_at=utc_now(),
                extra={"input_key": key, "inputs": {k: input_key({k: v})[:12]
                                                    for k, v in key_parts.items()},
                       "backend": "cross" if cross else "emulated" if emulated else
                       choice.name, "tag": built.tag,
                       "modules": list(built.modules), "project": opts.project.name,
                       **({"source_date_epoch": asdict(opts.source_date_epoch)}
                          if opts.source_date_epoch is not None else {}),
                       **built.extra})
            try:
                record_wheel(opts.out, entry)
            except BaseException:
                # The manifest must describe dist/: a wheel it does not list is taken back.
                final.unlink(missing_ok=True)
                raise
            return final

        result.wheel = steps("publish", publish)
        result.status = BUILT
    except BuilderError as exc:
        result.status, result.error = FAILED, redactor(exc.message)
    except Exception as exc:  # noqa: BLE001 - a bug must not stop the other cells
        log.open()
        for line in traceback.format_exc().splitlines():
            log.write_line(line)
        log.close()
        result.status = FAILED
        if type(exc).__module__.split(".")[0] in ("requests", "urllib3", "docker"):
            # The engine went away mid-build (daemon stopped or restarted).
            step = result.steps[-1].name if result.steps else "start"
            result.error = redactor(f"the container engine stopped answering during step "
                                    f"'{step}' ({type(exc).__name__}: {exc}); is it still "
                                    f"running? Details in {log_path}")
        else:
            result.error = redactor(f"unexpected {type(exc).__name__}: {exc} "
                                    f"(traceback in {log_path})")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        result.seconds = time.monotonic() - start
    return result


# ------------------------------------------------------------------------- many cells


def remove_run_containers(engine: DockerEngine, run_id: str) -> None:
    for c in engine.api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            engine.api.remove_container(c["Id"], force=True, v=True)
        except Exception:  # noqa: BLE001 - best effort while interrupted; each cell also cleans
            pass


def build_cells(
    cells: Iterable[tuple[Cell, Recipe]], config: BuildConfig, opts: PipelineOptions,
    choice: BackendChoice, redactor: Redactor, report: Callable[[str, str], None],
    finished: Callable[[CellResult], None], keep_going: bool = False, parallel: int = 1,
) -> list[CellResult]:
    """Build every cell; stop at the first failure unless *keep_going*."""
    run_id = uuid.uuid4().hex
    todo = list(cells)
    results: list[CellResult] = []
    if parallel <= 1:
        for i, (cell, recipe) in enumerate(todo):
            r = build_cell(cell, recipe, config, opts, choice, redactor, report, run_id)
            finished(r)
            results.append(r)
            if not r.ok and not keep_going:
                for skipped, _ in todo[i + 1:]:
                    results.append(CellResult(cell=skipped.identifier, status="not built",
                                              error="an earlier cell failed (--keep-going "
                                                    "builds the others)"))
                break
        return results
    # Parallel cells: one thread each (the work happens in containers).
    from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: PLC0415

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        futures = {pool.submit(build_cell, c, r, config, opts, choice, redactor, report, run_id):
                   c for c, r in todo}
        for fut in as_completed(futures):
            r = fut.result()
            finished(r)
            results.append(r)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        if choice.engine is not None:
            remove_run_containers(choice.engine, run_id)
        raise
    pool.shutdown()
    order = {c.identifier: i for i, (c, _) in enumerate(todo)}
    return sorted(results, key=lambda r: order[r.cell])
