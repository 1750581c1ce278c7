"""What each backend is, as the rest of the builder asks it, and the one list of their names.

The backends themselves (:mod:`builder.backends`) build; this table only says what kind of
build each one makes, so that code holding a backend's name (a config value, a resolved record)
asks :func:`backend_kind` instead of comparing names. It imports nothing of the builder: the config
(its ``backend`` values), the plan, the doctor and the backends all read it. A new backend is one
entry of :data:`KINDS` (and its class in builder.backends, which takes its name from here).

``auto`` is no backend: :func:`requested_kind` is the one place it is told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

#: The facilities a backend needs on this machine, as the doctor names its checks
#: (builder.doctor.checks): FAIL when the backend asked for needs a missing one.
ENGINE = "engine"
EMULATION = "binfmt + qemu"
CROSS_TOOLCHAIN = "cross toolchain"
CROSS_SYSROOTS = "cross sysroots"
REPAIR_TOOLS = "auditwheel + patchelf"
#: What the config's ``backend`` says to let :mod:`builder.plan.choose` pick per cell.
AUTO = "auto"


@dataclass(frozen=True)
class BackendKind:
    name: str
    #: The cell is built in a container of the engine, from its base image (docker, emulated);
    #: else here, with this machine's compiler and caches (host, cross).
    in_container: bool
    #: It builds another arch's cells (cross, emulated); else this host's own (docker, host).
    foreign: bool
    #: Rough disk use of one cell, in GiB (builder.doctor.checks.disk_space): torch's CPU wheel
    #: installs to about 1 GiB and a cell installs it twice (the build, then the fresh venv of
    #: the smoke test); a container cell adds its image layers and container, a cross cell
    #: holds only the aarch64 wheel and sysroot.
    disk_per_cell_gib: int
    #: Where that disk is used: the engine's data folder (else the work folder when the engine
    #: is not local), the work folder, or the builder's cache.
    disk_in: Literal["engine", "work", "cache"]
    #: What an offline build checks the wheelhouse for, per cell (builder.offline.use.preflight):
    #: the cell's own platform's wheels (in a container), wheels that install in this
    #: machine's Python (host), or only the torch of the build host's environment, which the
    #: preflight checks apart (cross: builder.offline.preflight.host_torches).
    offline_wheels: Literal["cell", "here", "build host"]
    #: The facilities it needs on this machine (the names above).
    needs: frozenset[str]
    #: Under QEMU user emulation in the engine (emulated).
    emulated: bool = False
    #: It installs a CUDA cell's toolkit (builder.backends.torchenv: the host's torch venv and
    #: the docker torch layer; the cross sysroot and the emulated image do not yet).
    cuda: bool = False


DOCKER = BackendKind(
    "docker",
    in_container=True,
    foreign=False,
    disk_per_cell_gib=4,
    disk_in="engine",
    offline_wheels="cell",
    needs=frozenset({ENGINE}),
    cuda=True,
)
HOST = BackendKind(
    "host",
    in_container=False,
    foreign=False,
    disk_per_cell_gib=3,
    disk_in="work",
    offline_wheels="here",
    needs=frozenset({REPAIR_TOOLS}),
    cuda=True,
)
CROSS = BackendKind(
    "cross",
    in_container=False,
    foreign=True,
    disk_per_cell_gib=2,
    disk_in="cache",
    offline_wheels="build host",
    needs=frozenset({CROSS_TOOLCHAIN, CROSS_SYSROOTS, REPAIR_TOOLS}),
)
EMULATED = BackendKind(
    "emulated",
    in_container=True,
    foreign=True,
    disk_per_cell_gib=4,
    disk_in="engine",
    offline_wheels="cell",
    needs=frozenset({ENGINE, EMULATION}),
    emulated=True,
)
#: What a CUDA cell adds to its backend's ``disk_per_cell_gib``: its torch is a CUDA build with
#: the nvidia-* packages and the pinned toolkit (measured: the docker torch layer of a CUDA 13.0
#: cell of torch 2.14.1, 6.3 GB; a CPU cell's is 1.3 GB), installed once for the build; the
#: smoke venv layers on it.
CUDA_CELL_EXTRA_GIB = 6


def cell_disk_gib(kind: BackendKind, cuda: str) -> int:
    """Rough disk use of one cell of *kind* (``cuda``: "cpu" or a CUDA version)."""
    return kind.disk_per_cell_gib + (CUDA_CELL_EXTRA_GIB if cuda != "cpu" else 0)


#: In ``auto``'s order of preference, native and foreign alike (builder.plan.choose).
KINDS: tuple[BackendKind, ...] = (DOCKER, HOST, CROSS, EMULATED)
#: Every backend's name, in this order (the config's ``backend`` values besides ``auto``).
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
#: What the config's ``backend`` and ``--backend`` take: ``auto`` (builder.plan.choose), then each.
CHOICES: tuple[str, ...] = (AUTO, *NAMES)
_BY_NAME = {k.name: k for k in KINDS}


def backend_kind(name: str) -> BackendKind:
    """The backend named *name* (KeyError for a name that is none)."""
    return _BY_NAME[name]


def requested_kind(backend: str) -> Optional[BackendKind]:
    """The backend a config's ``backend`` (one of :data:`CHOICES`) asks for; None for ``auto``,
    where each cell's is chosen (builder.plan.choose)."""
    return None if backend == AUTO else backend_kind(backend)


def may_need(backend: str, facility: str) -> bool:
    """Whether a build with the config's *backend* may need *facility*: the backend asked for
    needs it, or ``auto`` may choose one that does."""
    kind = requested_kind(backend)
    return any(facility in k.needs for k in (KINDS if kind is None else (kind,)))


def must_need(backend: str, facility: str) -> bool:
    """Whether the backend asked for (not ``auto``, which can choose another) needs *facility*."""
    kind = requested_kind(backend)
    return kind is not None and facility in kind.needs
