"""A project's ``build`` / ``skip`` and ``archs`` applied to the cells (builder.config.cibwproject).

``archs`` is a default for the arch axis: it counts only when neither ``--arch`` nor
``BUILDER_ARCH`` names one (the command line wins, as cibuildwheel's ``--archs`` does), and then
replaces "this host's arch" too. ``build`` and ``skip`` narrow what the matrix and the
selection left: a cell is kept when ``build`` matches it (no ``build``: every cell) and
``skip`` does not; each other cell is listed as dropped with the key and where it is set. A
project whose keys leave no cell is a configuration error (exit 2) naming the key.
"""

from __future__ import annotations

from dataclasses import replace

from builder.config import Selection
from builder.config.cibwproject import CibwProject, identifiers_of
from builder.errors import ConfigError
from builder.plan.cells import DroppedCell, Plan

#: Where an arch came from when nobody named it (builder.plan.resolve.default_selection).
_DEFAULT_ARCH = "default: this host"


def with_archs(selection: Selection, project: CibwProject) -> Selection:
    """*selection* with the project's ``archs`` on the arch axis, unless the arch was named
    (command line, environment)."""
    if project.archs is None:
        return selection
    origin = selection.origins.get("arch")
    if selection.arch is not None and origin != _DEFAULT_ARCH:
        return selection
    return replace(
        selection, arch=project.archs, origins={**selection.origins, "arch": project.archs_origin}
    )


def narrow(plan: Plan, project: CibwProject) -> Plan:
    """*plan*'s cells that the project's ``build`` and ``skip`` keep; the others dropped, each
    with the key that dropped it and its source."""
    if project.build is None and project.skip is None:
        return plan
    kept, dropped = [], []
    for cell in plan.cells:
        ids = identifiers_of(cell)
        if project.build is not None and not project.build.matches(ids):
            why = f"not selected by the project's {project.build.describe()}"
        elif project.skip is not None and project.skip.matches(ids):
            why = f"skipped by the project's {project.skip.describe()}"
        else:
            kept.append(cell)
            continue
        dropped.append(DroppedCell(cell.arch, cell.python, cell.torch, why, cell.cuda))
    if not kept:
        globs = (
            project.build
            if project.build is not None
            and not any(project.build.matches(identifiers_of(c)) for c in plan.cells)
            else project.skip
        )
        assert globs is not None
        shown = ", ".join(c.identifier for c in plan.cells[:4])
        raise ConfigError(
            f"the project's {globs.describe()} leaves no cell of the {len(plan.cells)} "
            f"selected ({shown}{', ...' if len(plan.cells) > 4 else ''}); expected globs on "
            "cibuildwheel identifiers such as cp311-manylinux_x86_64 that keep at least one",
            key=f"{globs.key} ({globs.origin})",
        )
    return replace(plan, cells=tuple(kept), dropped=tuple(dropped) + plan.dropped)
