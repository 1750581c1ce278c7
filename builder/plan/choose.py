"""The one place a cell's backend is chosen: asked for by name, or ``auto`` -- with the reason.

``auto`` tries, in order, for this host's own cells: docker (an engine answers and has the base
image), then host (a local interpreter of the cell's Python); for another arch's cells: cross
(x86_64 host, aarch64 cell, a Debian arm64 CPython to verify against, a CPU torch), then emulated
(binfmt_misc + an arm64 base image in the engine). The first that can build the cell wins; one
that could only after pulling its base image (docker, ``--pull missing``) wins only when no
other can -- a host that reaches no registry keeps building as it did. When none can, the cell
needs a native runner, and the reason lists why each one could not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from builder.backend_kinds import KINDS, requested_kind
from builder.backends.base import Availability, Backend, Host
from builder.config.support import SupportTable
from builder.plan.cells import Cell

NATIVE_ORDER = tuple(k.name for k in KINDS if not k.foreign)
FOREIGN_ORDER = tuple(k.name for k in KINDS if k.foreign)
#: The backends that install a CUDA cell's toolkit (BackendKind.cuda).
CUDA_BACKENDS = tuple(k.name for k in KINDS if k.cuda)


def _availability(
    backends: Mapping[str, Backend], name: str, cell: Cell, host: Host, support: SupportTable
) -> Availability:
    if cell.cuda != "cpu" and name not in CUDA_BACKENDS:
        return Availability(
            False,
            f"the {name} backend does not install a CUDA toolkit yet "
            f"(CUDA cells: {', '.join(CUDA_BACKENDS)}; "
            "docs/cuda-wheels.md)",
        )
    return backends[name].availability(cell, host, support)


@dataclass(frozen=True)
class Choice:
    backend: str  # the backend that builds the cell (or would, on a native runner)
    buildable: bool  # here, on this host
    reason: str


def choose(
    cell: Cell,
    requested: str,
    origin: str,
    host: Host,
    backends: Mapping[str, Backend],
    support: SupportTable,
) -> Choice:
    if requested_kind(requested) is not None:
        got = _availability(backends, requested, cell, host, support)
        return Choice(requested, got.ok, f"{requested} asked for ({origin}): {got.reason}")
    order = NATIVE_ORDER if cell.machine == host.machine else FOREIGN_ORDER
    why_not: list[str] = []
    after_pull: tuple[str, str] | None = None
    for name in order:
        got = _availability(backends, name, cell, host, support)
        if got.ok and not got.pull:
            earlier = f" (not {'; not '.join(why_not)})" if why_not else ""
            return Choice(name, True, f"auto: {got.reason}{earlier}")
        if got.ok and after_pull is None:
            after_pull = (name, got.reason)
        why_not.append(f"{name}: {got.reason}")
    if after_pull is not None:
        name, reason = after_pull
        others = [w for w in why_not if not w.startswith(f"{name}: ")]
        return Choice(
            name, True, f"auto: {reason}" + (f" (not {'; not '.join(others)})" if others else "")
        )
    # On a native runner the cell is built the usual way: docker, else host.
    native = CUDA_BACKENDS[0] if cell.cuda != "cpu" else NATIVE_ORDER[0]
    return Choice(
        native, False, f"auto: not buildable on this {host.machine} host ({'; '.join(why_not)})"
    )
