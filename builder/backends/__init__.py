"""Backends: where and how a cell becomes a repaired, verified wheel.

One module per backend behind :class:`~builder.backends.base.Backend`, and one registry; which
backend builds a cell is the plan's decision (:mod:`builder.plan.choose`):

* ``docker`` -- the cell's image from its rendered Dockerfile, steps in a container (a Podman
  socket is an engine of this backend);
* ``host`` -- the same steps here, with a local interpreter;
* ``cross`` -- aarch64 cells from an x86_64 host: cross-compiled, verified under QEMU;
* ``emulated`` -- another arch's containers under QEMU user emulation.
"""

from __future__ import annotations

from builder.backends.base import Backend
from builder.backends.cross import CrossBackend
from builder.backends.docker import DockerBackend
from builder.backends.emulated import EmulatedBackend
from builder.backends.host import HostBackend


def registry() -> dict[str, Backend]:
    """A fresh registry (backends keep per-run caches, e.g. the cross targets they prepared)."""
    return {b.name: b for b in (DockerBackend(), HostBackend(), CrossBackend(), EmulatedBackend())}
