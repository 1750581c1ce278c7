"""What every backend shares: the protocol, this host's facts, and one cell's job.

A backend is one module under ``builder.backends`` with one object behind the small
:class:`Backend` protocol, collected in :data:`builder.backends.REGISTRY`:

* ``availability(cell, host, support)`` -- whether this host can build *cell* that way, and why
  (or why not); the resolver (:mod:`builder.plan.resolve`, choosing in :mod:`builder.plan.choose`)
  asks every backend before anything runs,
  so ``plan`` and ``build`` take the same decision from the same facts;
* ``base_image(cell, host, config)`` -- the image (or interpreter, or sysroot) the cell is built
  in, as the resolved record (:mod:`builder.plan.resolved`) names it;
* ``build(job)`` -- the cell's steps into a repaired, verified wheel in the staging folder.

Nothing outside this package switches on a backend's name.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from builder.arch import ARCHES
from builder.config.projecttest import NO_TEST, ProjectTest
from builder.errors import BuilderError, ConfigError, EngineUnavailable, StepFailed
from builder.pipeline_types import CellResult, StepResult
from builder.plan.resolved import ImageChoice, ResolvedCell
from builder.redact import Redactor
from builder.wheel.localversion import add_local_version
from builder.wheel.reproducible import ENV_VAR as EPOCH_VAR
from builder.wheel.reproducible import SourceDateEpoch, normalize_wheel
from builder.wheel.untrusted import release_problems

if TYPE_CHECKING:  # the engines import docker's SDK: only when a backend needs one
    from builder.config import BuildConfig
    from builder.config.support import SupportTable
    from builder.engines.base import OutputLog
    from builder.engines.docker import DockerEngine
    from builder.engines.emulation import Emulation
    from builder.images.render import Recipe
    from builder.plan.cells import Cell

T = TypeVar("T")


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str
    #: ok only once the engine has pulled the base image (``--pull missing``): ``auto`` takes
    #: such a backend only when no other can build the cell as things stand.
    pull: bool = False


class Host:
    """This machine's facts, each probed once and only when a backend asks for it."""

    def __init__(
        self, redactor: Redactor, engine_factory: Optional[Callable[[], DockerEngine]] = None
    ) -> None:
        self.redactor = redactor
        self.machine = platform.machine()
        self._engine_factory = engine_factory
        self._engine: Optional[DockerEngine] = None
        self._engine_reason: Optional[str] = None
        self._emulation: dict[str, Emulation] = {}
        self._pythons: dict[str, Optional[Path]] = {}
        self._labels: dict[str, Mapping[str, str]] = {}

    @property
    def arch(self) -> str:
        for name, arch in ARCHES.items():
            if arch.machine == self.machine:
                return name
        raise ConfigError(f"this host's machine {self.machine!r} is neither x86_64 nor aarch64")

    def engine(self) -> Optional[DockerEngine]:
        """The container engine when one answers (else None; :meth:`engine_reason` says why)."""
        if self._engine is None and self._engine_reason is None:
            try:
                if self._engine_factory is not None:
                    self._engine = self._engine_factory()
                else:
                    from builder.engines.docker import DockerEngine  # noqa: PLC0415 - SDK

                    self._engine = DockerEngine(redactor=self.redactor)
            except EngineUnavailable as exc:
                self._engine_reason = exc.message.splitlines()[0]
        return self._engine

    def engine_reason(self) -> str:
        engine = self.engine()
        if engine is None:
            reason = self._engine_reason or ""
            return (
                reason
                if reason.startswith("no container engine")
                else (f"no container engine answers ({reason})")
            )
        return f"engine {engine.base_url} (server {engine.server_version})"

    def image_id(self, ref: str) -> Optional[str]:
        engine = self.engine()
        return engine.image_id(ref) if engine is not None else None

    def image_labels(self, ref: str) -> Mapping[str, str]:
        if ref not in self._labels:
            engine = self.engine()
            labels: Mapping[str, str] = {}
            if engine is not None and engine.image_id(ref) is not None:
                labels = engine.api.inspect_image(ref).get("Config", {}).get("Labels") or {}
            self._labels[ref] = labels
        return self._labels[ref]

    def emulation(self, machine: str) -> Emulation:
        if machine not in self._emulation:
            from builder.engines.emulation import detect_emulation  # noqa: PLC0415

            self._emulation[machine] = detect_emulation(machine)
        return self._emulation[machine]

    def python(self, version: str) -> Optional[Path]:
        """A local interpreter for *version* (the host backend's), or None."""
        if version not in self._pythons:
            from builder.engines.host import find_python  # noqa: PLC0415
            from builder.errors import StepFailed  # noqa: PLC0415

            try:
                self._pythons[version] = find_python(version)
            except StepFailed:
                self._pythons[version] = None
        return self._pythons[version]


@dataclass(frozen=True)
class PipelineOptions:
    project: Path
    out: Path  # dist/
    work: Path  # logs and staging (never inside dist/)
    wheelhouse: Optional[Path] = None  # find-links for torch and deps (offline: the only source)
    offline: bool = False
    jobs: Optional[int] = None  # compile jobs inside a cell (MAX_JOBS)
    force: bool = False  # rebuild even when the manifest says up to date
    ccache: Optional[bool] = None  # None: where the environment has it; False: never
    #: The build's timestamp (builder.wheel.reproducible): in every build environment, the input
    #: key and the manifest; each published wheel is normalised with it. None: wheels as built.
    source_date_epoch: Optional[SourceDateEpoch] = None
    #: Docker network the cell's image build and container join (``--network``; None: the
    #: engine's default bridge). Not an input of the wheel: it only decides the way out.
    network: Optional[str] = None
    #: The project's own tests, run in every cell's verification environment
    #: (builder.config.projecttest: test-requires, test-command).
    test: ProjectTest = NO_TEST

    def epoch_env(self) -> dict[str, str]:
        epoch = self.source_date_epoch
        return {EPOCH_VAR: str(epoch.value)} if epoch is not None else {}


class Steps:
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
class Built:
    wheel: Path  # verified, on the host (staging)
    torch: str
    compiler: str
    tag: str
    modules: tuple[str, ...]
    base_image: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CellJob:
    """Everything one backend needs to build one resolved cell."""

    resolved: ResolvedCell
    config: BuildConfig
    opts: PipelineOptions
    log: OutputLog
    log_path: Path
    steps: Steps
    stage: Path
    run_id: str
    engine: Optional[DockerEngine]
    #: The proxies (config, environment or command line) for every tool the cell runs: pip on
    #: the host, pip inside containers, the cross path's downloads. Never written to a file.
    proxy_env: Mapping[str, str] = field(default_factory=dict)
    #: The rendered Dockerfile (docker and emulated cells; rendered up front so that a bad value
    #: stops the whole build before anything runs).
    recipe: Optional[Recipe] = None
    #: Another cell's Python-agnostic wheel (abi3) that serves this cell: verify it on this
    #: cell's Python instead of compiling (builder.release.shared).
    reuse: Optional[Path] = None
    #: Where a warning reaches the person running the build (the progress display); None:
    #: the cell's log only.
    say: Optional[Callable[[str], None]] = None

    @property
    def cell(self) -> Cell:
        return self.resolved.cell

    def warn(self, text: str) -> None:
        """A warning for the cell's log and, at once, the terminal (it may precede a long
        step, e.g. a large download)."""
        self.log.note(f"warning: {text}")
        if self.say is not None:
            self.say(f"warning: {self.cell.identifier}: {text}")

    def label(self, wheel: Path, out_dir: Path) -> Path:
        """The built wheel's metadata rewrite, the same for every backend: ``+torchX.Y``, the
        torch pin and, when the resolved cell names a torch-npu release, the ``npu`` extra
        (builder.wheel.localversion, builder.wheel.npuextra). A stable-ABI wheel (serving
        every torch from its minimum on) gets no label, ``torch>=<minimum>`` and the extra as
        a range (builder.plan.builds)."""
        # The project's build is code from elsewhere: what it made is checked as a wheel from
        # another machine is, before the rewrite, auditwheel or the verification unpack it.
        problems = release_problems(wheel)
        if problems:
            shown = "; ".join(problems[:5]) + (
                f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
            )
            raise StepFailed(
                f"the project's build made {wheel.name}, which is not a wheel "
                f"this builder repairs or releases: {shown}"
            )
        r = self.resolved
        if r.stable:
            return add_local_version(
                wheel,
                None,
                out_dir,
                torch_npu=r.torch_npu,
                pin=r.torch_requirement,
                npu_spec=r.torch_requirement[len("torch") :],
            )
        return add_local_version(wheel, self.cell.torch_local, out_dir, torch_npu=r.torch_npu)

    def normalize(self, wheel: Path) -> None:
        """The repaired wheel in the canonical zip layout (builder.wheel.reproducible)."""
        epoch = self.opts.source_date_epoch
        if epoch is not None:
            self.steps("normalize", lambda: normalize_wheel(wheel, epoch.value))


class Backend(Protocol):
    name: str

    def availability(self, cell: Cell, host: Host, support: SupportTable) -> Availability:
        """Whether this host can build *cell* this way, and why (or why not)."""

    def base_image(self, cell: Cell, host: Host, config: BuildConfig) -> ImageChoice:
        """What the cell is built in, as the resolved record names it."""

    def input_key(self, job: CellJob) -> dict[str, Any]:
        """What, besides the cell and the project, decides this backend's wheel (the cache
        key); may run quick steps (e.g. look up the base image id)."""

    def build(self, job: CellJob) -> Built:
        """The cell into a repaired, verified wheel in ``job.stage``; StepFailed on failure."""
