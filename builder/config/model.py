"""The configuration's types: what a merged, validated configuration holds.

Plain frozen dataclasses, no logic beyond small derived properties; :mod:`builder.config.load`
fills them from the four layers (defaults < config file < environment < command line).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.config.buildoptions import NO_OPTIONS, CibwOptions
from builder.config.cudaconfig import NO_CUDA_OPTIONS, CudaOptions
from builder.config.pins import parse_ref
from builder.config.projecttest import NO_TEST, ProjectTest
from builder.config.proxy import ProxySettings
from builder.config.roots import INSTALLED, REPO_ROOT
from builder.config.support import SupportTable
from builder.netpip import NetworkOptions

DEFAULT_CONFIG = REPO_ROOT / "configs" / "matrix.yaml"
DEFAULTS_FILE = Path(__file__).resolve().with_name("defaults.yaml")


def default_project() -> Path:
    """The project built when ``--project`` is not given: this repository when the builder runs
    from its checkout; the current directory when it is an installed tool (``ampforge-build``)."""
    return Path.cwd().resolve() if INSTALLED else REPO_ROOT


def display_path(path: Path) -> str:
    """A stable name for messages and rendered headers: repository-relative when inside it."""
    path = Path(os.path.abspath(path))
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class MatrixRule:
    """One ``include`` or ``exclude`` entry; ``None`` on an axis matches anything."""

    kind: str  # "include" | "exclude"
    index: int
    arch: tuple[str, ...] | None
    python: tuple[str, ...] | None
    torch: tuple[str, ...] | None
    file: str
    line: int | None
    cuda: tuple[str, ...] | None = None
    #: an include's own TORCH_CUDA_ARCH_LIST (checked on load against its CUDA's toolkit)
    cuda_arch_list: str | None = None

    @property
    def key(self) -> str:
        return f"matrix.{self.kind}[{self.index}]"

    def matches(self, arch: str, python: str, torch: str, cuda: str = "cpu") -> bool:
        return (
            (self.arch is None or arch in self.arch)
            and (self.python is None or python in self.python)
            and (self.torch is None or torch in self.torch)
            and (self.cuda is None or cuda in self.cuda)
        )

    def describe(self) -> str:
        parts = [
            f"{name}={','.join(vals)}"
            for name, vals in (
                ("arch", self.arch),
                ("python", self.python),
                ("torch", self.torch),
                ("cuda", self.cuda),
            )
            if vals is not None
        ]
        return f"{self.key} ({' '.join(parts)})"


@dataclass(frozen=True)
class MatrixSpec:
    arches: tuple[str, ...]
    pythons: tuple[str, ...]
    torches: tuple[str, ...]
    include: tuple[MatrixRule, ...] = ()
    exclude: tuple[MatrixRule, ...] = ()
    #: "cpu" and/or CUDA versions ("13.0"); a file without the axis has ("cpu",)
    cudas: tuple[str, ...] = ("cpu",)


@dataclass(frozen=True)
class BaseImage:
    """The image a cell's recipe starts FROM, and how to drive it."""

    ref: str
    family: str  # "manylinux" (dnf/yum, update-ca-trust) | "debian" (apt, update-ca-certificates)
    plat: str  # manylinux tag the repaired wheel gets, e.g. manylinux_2_28_x86_64
    python_path: str  # with {cp} / {version} placeholders
    #: Named by --base-image (BUILDER_BASE_IMAGE): used as given, never swapped for another.
    pinned: bool = False
    #: When the engine pulls it (config build.pull < BUILDER_PULL < --pull; never when
    #: offline): missing | always | never. Carried by the image so that the backends' answer
    #: (can this cell be built, after a pull?) needs nothing but the cell.
    pull: str = "missing"

    @property
    def digest(self) -> str | None:
        """The pinned digest (``sha256:...``) of :attr:`ref`; None for an unpinned image."""
        return parse_ref(self.ref).digest


@dataclass(frozen=True)
class BuildOptions:
    jobs: int | None
    extra_cflags: tuple[str, ...]
    auditwheel_exclude: tuple[str, ...]


@dataclass(frozen=True)
class PipOptions:
    index_url: str | None
    extra_index_urls: tuple[str, ...]
    #: pip's --retries / --timeout for every download (:mod:`builder.netpip`)
    network: NetworkOptions


@dataclass(frozen=True)
class OfflineOptions:
    enabled: bool
    wheelhouse: Path
    #: ``fetch --bundle`` folder (config offline.bundle < env BUNDLE < --bundle); None: none
    bundle: Path | None = None


@dataclass(frozen=True)
class PublishOptions:
    repository_url: str | None  # where `publish` uploads; credentials never live here


@dataclass(frozen=True)
class BuildConfig:
    """The fully merged, validated configuration (everything but the selection)."""

    source: Path | None
    source_name: str
    matrix: MatrixSpec
    images: Mapping[str, BaseImage]
    build: BuildOptions
    pip: PipOptions
    proxy: ProxySettings
    ca_bundle: Path | None
    offline: OfflineOptions
    support: SupportTable
    origins: Mapping[str, str] = field(default_factory=dict)
    publish: PublishOptions = PublishOptions(repository_url=None)
    #: auto | docker | host | cross | emulated (config build.backend < BUILDER_BACKEND < --backend)
    backend: str = "auto"
    #: Docker network for docker builds (config build.network < BUILDER_NETWORK < --network)
    network: str | None = None
    #: Base image pulls: missing | always | never (config build.pull < BUILDER_PULL < --pull;
    #: offline: never)
    pull: str = "missing"
    #: Replaces this host's arch's base image (BUILDER_BASE_IMAGE < --base-image); "local":
    #: the image of ``python -m builder base-image``. Not a file key: images.<ARCH>.base is.
    base_image: str | None = None
    #: CI runner label per machine, for cells this host cannot build (config runners)
    runners: Mapping[str, str] = field(default_factory=dict)
    #: The config file's test-requires/test-command (the project's pyproject.toml below it and
    #: the command line above it are merged by the build command: builder.config.projecttest)
    test: ProjectTest = NO_TEST
    #: cibuildwheel's build options (builder.config.buildoptions): the config file's layer when
    #: loaded; the build and plan commands replace it with all layers resolved.
    build_options: CibwOptions = NO_OPTIONS
    #: The config's ``cuda`` section: per-CUDA index URLs and arch lists (cudaconfig)
    cuda: CudaOptions = NO_CUDA_OPTIONS
    #: The project's whole [tool.cibuildwheel] (builder.config.cibwproject.CibwProject: build,
    #: skip, test-skip, archs, overrides, images), set by the build and plan commands; None:
    #: not read (every cell gets build_options and the command's test alike).
    cibw: Any = None


@dataclass(frozen=True)
class Selection:
    """Which cells a command acts on; ``None`` on an axis means 'not named'."""

    arch: tuple[str, ...] | None = None
    python: tuple[str, ...] | None = None
    torch: tuple[str, ...] | None = None
    patterns: tuple[str, ...] = ()  # fnmatch patterns on cell identifiers
    origins: Mapping[str, str] = field(default_factory=dict)
    cuda: tuple[str, ...] | None = None  # "cpu", "13.0"

    @property
    def empty(self) -> bool:
        return (
            self.arch is None
            and self.python is None
            and self.torch is None
            and not self.patterns
            and self.cuda is None
        )


@dataclass(frozen=True)
class CliOverrides:
    """The command-line layer; ``None`` means 'option not given'."""

    config: str | None = None
    arch: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None  # --cuda
    patterns: tuple[str, ...] = ()
    jobs: int | None = None
    offline: bool | None = None
    bundle: str | None = None  # --bundle (build, fetch)
    ca_bundle: str | None = None
    http_proxy: str | None = None
    https_proxy: str | None = None
    no_proxy: str | None = None
    all_proxy: str | None = None
    backend: str | None = None
    base_image: str | None = None
    network: str | None = None
    pull: str | None = None


@dataclass(frozen=True)
class Settings:
    config: BuildConfig
    selection: Selection
