"""No silent multi-GB downloads: before torch is installed from an index, say how much that is.

Without a wheelhouse, ``pip install torch==X`` takes whatever the index serves; for x86_64 (and
aarch64 since torch 2.11) the default index serves the CUDA build, which pulls its ``nvidia-*``
packages: gigabytes, for a CPU-only build and verification. So before installing, the cell asks
pip what it would install (``steps.py download-size``: a dry-run resolution by the builder's
own pip, which reads the wheels' metadata from the index -- PEP 658 files, else range requests --
instead of downloading them; then each file's size from the index) and, above
:data:`LARGE_DOWNLOAD`, says so, on the terminal and in the cell's log, with how to give a folder
of CPU wheels instead. When the size cannot be known (pip could not resolve, an index that gives
no ``Content-Length``), the support table's record of which releases the default index serves as
CUDA builds decides whether to warn.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

from builder.atomicfile import atomic_replace
from builder.backends.base import CellJob
from builder.cache import cache_root, mark_used
from builder.engines.base import Session
from builder.errors import DiskFull, StepFailed
from builder.incell import parse_result

#: Above this many bytes a download is announced before it starts.
LARGE_DOWNLOAD = 1_000_000_000
#: Installed bytes per downloaded byte of torch and its requirements (zip files unpacked):
#: the CUDA torch 2.14.1's 3.0 GB download became a 6.3 GB torch layer (docs/cuda-wheels.md).
INSTALLED_PER_DOWNLOADED = 2.2


@dataclass(frozen=True)
class Planned:
    """What pip would download: (name, version, bytes or None) per file."""

    items: tuple[tuple[str, str, Optional[int]], ...] = ()
    #: Why the download could not be sized ("" when it was).
    unknown: str = ""

    @property
    def total(self) -> int:
        return sum(size or 0 for _, _, size in self.items)

    @property
    def unsized(self) -> list[str]:
        return [name for name, _, size in self.items if size is None]


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def pip_zip() -> Path:
    """The builder's own pip as a zip that any Python >= 3.9 runs as ``python ZIP/pip``
    (cached per pip version). The resolution uses it, not the environment's pip: before pip
    23.3 a ``--dry-run`` downloads every wheel it resolves (gigabytes, the very thing to avoid)
    even when the index serves their metadata (PEP 658), and ensurepip venvs have such pips."""
    import pip  # noqa: PLC0415 - the builder's own, declared with its environment

    root = Path(pip.__file__).parent
    out = cache_root() / "pip" / f"pip-{pip.__version__}.zip"
    if out.is_file():
        mark_used(out)  # `cache prune` ages it by its mtime
        return out

    def write(fh: BinaryIO) -> None:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    zf.write(path, "pip/" + path.relative_to(root).as_posix())

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_replace(out, write)
    return out


def planned_download(
    session: Session,
    python: str,
    steps: str,
    *,
    torch: str,
    requirements: Sequence[str],
    index_url: Optional[str],
    env: Optional[Mapping[str, str]] = None,
) -> Planned:
    """Ask pip inside *session* (with *python*, the interpreter torch goes into, and the
    builder's own pip: :func:`pip_zip`) what installing ``torch==torch`` and *requirements*
    would download."""
    pip = session.copy_in(pip_zip(), session.workdir)
    argv = [
        python,
        steps,
        "download-size",
        "--torch",
        torch,
        "--pip",
        pip,
        "--report",
        f"{session.workdir}/download-report.json",
    ]
    if index_url:
        argv += ["--index-url", index_url]
    for req in requirements:
        argv += ["--extra", req]
    try:
        found: dict[str, Any] = parse_result(
            session.run(argv, env=dict(env or {}), step="size the torch download")
        )
    except StepFailed as exc:
        return Planned(unknown=exc.message.splitlines()[0])
    if not found.get("sized"):
        return Planned(unknown=str(found.get("reason", "pip could not resolve it")))
    items = tuple(
        (str(i["name"]), str(i["version"]), int(i["size"]) if i.get("size") is not None else None)
        for i in found.get("items", [])
    )
    return Planned(items=items)


def large_download_message(
    planned: Planned, *, torch: str, machine: str, cuda_build: bool, cuda_cell: str = ""
) -> Optional[str]:
    """The warning for *planned* (None when it stays under :data:`LARGE_DOWNLOAD`, or when its
    size is unknown and the index's torch for *machine* is not known to be a CUDA build)."""
    hint = (
        f"To build and verify against the CPU build instead, give a folder of CPU wheels: "
        f"--find-links DIR (make wheel WHEELHOUSE=DIR), filled with `pip download "
        f"--only-binary=:all: --dest DIR torch=={torch} setuptools wheel` from an index "
        f"that serves CPU builds (or `python -m builder fetch`; see its --help)"
    )
    if cuda_cell:  # a CUDA cell needs the CUDA build: say so instead of offering the CPU one
        hint = (
            f"The CUDA {cuda_cell} cell needs this CUDA build; a wheelhouse or bundle "
            "(`python -m builder fetch`) downloads it once for every machine"
        )
    if planned.total >= LARGE_DOWNLOAD:
        biggest = sorted(
            ((size or 0, name, version) for name, version, size in planned.items), reverse=True
        )
        large = [b for b in biggest[:4] if b[0] >= 50_000_000]
        shown = ", ".join(f"{name} {version} {gigabytes(size)}" for size, name, version in large)
        more = len(biggest) - len(large)
        unsized = planned.unsized
        return (
            f"installing torch {torch} from the index downloads {gigabytes(planned.total)}"
            f"{' or more' if unsized else ''} ({len(planned.items)} files: {shown}"
            f"{f', {more} smaller' if more > 0 else ''})"
            f"{'; it is a CUDA build with its nvidia packages' if _has_cuda(planned) else ''}"
            f". {hint}"
        )
    if (planned.unknown or planned.unsized) and cuda_build:
        why = planned.unknown or f"the index gave no size for {', '.join(planned.unsized)}"
        return (
            f"installing torch {torch} from the index: the default index's torch {torch} "
            f"for {machine} is a CUDA build, several GB with its nvidia packages (its size "
            f"could not be read: {why}). {hint}"
        )
    return None


def _has_cuda(planned: Planned) -> bool:
    return any(
        name.startswith(("nvidia-", "nvidia_", "cuda-", "triton")) for name, _, _ in planned.items
    )


def announce_large_download(
    job: CellJob,
    session: Session,
    python: str,
    steps: str,
    *,
    requirements: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    torch: Optional[str] = None,
    machine: Optional[str] = None,
    room: Optional[str] = None,
) -> None:
    """Before the cell installs torch from an index (no wheelhouse), say so if it is large.
    *torch*, *machine*: another torch than the cell's, for another machine (the cross backend's
    host torch). *room*: the folder (in *session*) the install writes to; a download whose
    installed size does not fit there fails now (:func:`require_room`), not gigabytes later."""
    opts = job.opts
    torch = torch or job.cell.torch
    machine = machine or job.cell.machine
    if opts.wheelhouse is not None or opts.offline:
        return
    planned = planned_download(
        session,
        python,
        steps,
        torch=torch,
        requirements=requirements,
        index_url=job.config.pip.index_url,
        env=env,
    )
    sized = (
        f"{gigabytes(planned.total)} in {len(planned.items)} files"
        if not planned.unknown
        else f"unknown ({planned.unknown})"
    )
    job.log.note(f"ampforge: torch {torch} from the index: download size {sized}")
    if room is not None:
        require_room(session, planned, room, torch=torch)
    message = large_download_message(
        planned,
        torch=torch,
        machine=machine,
        cuda_build=job.config.support.is_cuda_build(torch, machine),
        cuda_cell=job.cell.cuda if torch == job.cell.torch and job.cell.cuda != "cpu" else "",
    )
    if message is not None:
        job.warn(message)


def free_bytes_in(session: Session, folder: str) -> Optional[int]:
    """Free bytes on *folder*'s file system as *session* sees it (``df``: a container sees its
    engine's storage), None when that cannot be read."""
    r = session.run(["df", "-Pk", folder], check=False, step="free space", tail_lines=4)
    fields = r.tail[-1].split() if r.ok and r.tail else []
    return int(fields[3]) * 1024 if len(fields) >= 4 and fields[3].isdigit() else None


def require_room(session: Session, planned: Planned, folder: str, *, torch: str) -> None:
    """DiskFull (exit 1) before the install when what *planned* unpacks to cannot fit in
    *folder*: a CUDA torch is gigabytes, and a disk that fills halfway through pip leaves the
    reader with pip's traceback instead of the number."""
    if planned.unknown or planned.total <= 0:
        return
    need = int(planned.total * INSTALLED_PER_DOWNLOADED)
    free = free_bytes_in(session, folder)
    if free is None or free >= need:
        return
    raise DiskFull(
        f"no space left on device for torch {torch}: from the index it downloads "
        f"{gigabytes(planned.total)} ({len(planned.items)} files) and takes about "
        f"{gigabytes(need)} installed in {folder}, where {gigabytes(free)} is free. Free space "
        f"there, or point the builder's cache at another disk (AMPFORGE_CACHE), or build from "
        f"a wheelhouse or bundle made elsewhere (--find-links DIR, `python -m builder fetch`)",
        path=folder,
        free=free,
        needed=need,
    )
