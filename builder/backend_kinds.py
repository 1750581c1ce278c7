"""What each backend is, as the rest of the builder asks it, and the one list of their names.

The backends themselves (:mod:`builder.backends`) build; this table only says what kind of
build each one makes, so that code holding a backend's name (a config value, a resolved record)
asks :func:`backend_kind` instead of comparing names. It imports nothing of the builder: the config
(its ``backend`` values), the plan and the backends all read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendKind:
    name: str
    #: The cell is built in a container of the engine, from its base image (docker, emulated);
    #: else here, with this machine's compiler and caches (host, cross).
    in_container: bool
    #: It builds another arch's cells (cross, emulated); else this host's own (docker, host).
    foreign: bool
    #: Under QEMU user emulation in the engine (emulated).
    emulated: bool = False
    #: It installs a CUDA cell's toolkit (builder.backends.torchenv: host only so far; the
    #: docker torch layer, the cross sysroot and the emulated image do not yet).
    cuda: bool = False


#: In ``auto``'s order of preference, native and foreign alike (builder.plan.choose).
KINDS: tuple[BackendKind, ...] = (
    BackendKind("docker", in_container=True, foreign=False),
    BackendKind("host", in_container=False, foreign=False, cuda=True),
    BackendKind("cross", in_container=False, foreign=True),
    BackendKind("emulated", in_container=True, foreign=True, emulated=True),
)
#: Every backend's name, in this order (the config's ``backend`` values besides ``auto``).
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
#: What the config's ``backend`` and ``--backend`` take: ``auto`` (builder.plan.choose), then each.
CHOICES: tuple[str, ...] = ("auto", *NAMES)
_BY_NAME = {k.name: k for k in KINDS}


def backend_kind(name: str) -> BackendKind:
    """The backend named *name* (KeyError for a name that is none)."""
    return _BY_NAME[name]
