"""The ``host`` backend: the in-cell steps on this machine with a local interpreter of the cell's
Python (e.g. pyenv's ``python3.11``), in a private temporary directory removed on every exit
path. The embedded default when no container engine answers."""

from __future__ import annotations

import shutil
from typing import Any

from builder.backend_kinds import HOST
from builder.backends.base import Availability, Built, CellJob, Host
from builder.backends.pipenv import pip_env
from builder.backends.session import build_in_cell
from builder.backends.torchenv import host_torch_env
from builder.cache import cache_root
from builder.config import BuildConfig
from builder.config.support import SupportTable
from builder.engines.host import HostEngine, find_python
from builder.errors import StepFailed
from builder.plan.cells import Cell
from builder.plan.resolved import ImageChoice
from builder.wheel.repair import host_auditwheel


class HostBackend:
    name = HOST.name

    def availability(self, cell: Cell, host: Host, support: SupportTable) -> Availability:
        if cell.machine != host.machine:
            return Availability(False, f"the host backend builds {host.machine} cells only")
        python = host.python(cell.python)
        if python is None:
            return Availability(
                False,
                f"no Python {cell.python} interpreter on this host "
                f"(python{cell.python} on PATH, e.g. from pyenv)",
            )
        return Availability(True, f"local Python {cell.python} at {python}")

    def base_image(self, cell: Cell, host: Host, config: BuildConfig) -> ImageChoice:
        python = host.python(cell.python)
        return ImageChoice(ref=f"host:{python or 'python' + cell.python}")

    def input_key(self, job: CellJob) -> dict[str, Any]:
        python = job.steps("interpreter", lambda: str(find_python(job.cell.python)))
        return {"python": python}

    def build(self, job: CellJob) -> Built:
        opts = job.opts
        python = str(find_python(job.cell.python))
        aw, aw_env = host_auditwheel()
        # The proxies, indexes and CA bundle from every layer reach pip here as they do in
        # containers.
        env = pip_env(job.config, job.proxy_env, job.stage / "ca")
        if opts.jobs:
            env["MAX_JOBS"] = str(opts.jobs)
        env.update(opts.epoch_env())
        if opts.ccache and shutil.which("ccache") is None:
            raise StepFailed(
                "--ccache: ccache is not installed on this host "
                "(apt-get install ccache), or build without --ccache"
            )
        if opts.ccache is not False:
            # Beside the other caches, shared by every work folder: outlives the session.
            env["CCACHE_DIR"] = str(cache_root() / "ccache")
        prepared = job.steps("torch", lambda: host_torch_env(job, python, env))
        with HostEngine().session(env=env, log=job.log, parent=job.stage) as session:
            built = build_in_cell(
                job,
                session,
                python=python,
                wheelhouse=str(opts.wheelhouse.resolve()) if opts.wheelhouse else None,
                auditwheel=aw,
                auditwheel_env=aw_env,
                prepared=prepared,
            )
        built.base_image = f"host:{python}"
        return built
