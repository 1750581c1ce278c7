"""Host backend: the in-cell steps run on this machine, in a private temporary directory.

The embedded default when no container engine answers. The cell's interpreter is a local one
(e.g. pyenv's ``python3.11``), found by :func:`find_python`; the steps create their own venvs
inside the session's directory, so nothing on the host is modified. The directory is removed
when the session ends, on every exit path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from builder.engines.base import TAIL_LINES, OutputLog, RunResult, check_result
from builder.errors import StepFailed
from builder.projecttree import copy_sparse


def run_host(
    argv: Sequence[str],
    log: OutputLog,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    step: str = "",
    tail_lines: int = TAIL_LINES,
    unset: Iterable[str] = (),
) -> RunResult:
    """Run *argv* here, streaming its merged stdout/stderr line by line through *log*.

    *env* is added to (not substituted for) this process's environment, less the names in
    *unset* that *env* does not set itself.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in set(unset)}
    full_env.update(env or {})
    log.open()
    try:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd,
                text=True,
                errors="replace",
                bufsize=1,
                # Its own process group: on Ctrl-C or an error the whole tree (pip -> gcc,
                # debootstrap -> chroot dpkg) is killed, not just the direct child.
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise StepFailed(f"step '{step or argv[0]}': program not found: {argv[0]}") from exc
        try:
            assert proc.stdout is not None
            tail = log.capture(proc.stdout, tail_lines)
            code = proc.wait()
        except BaseException:
            # Ctrl-C or an error while streaming: do not leave the children running.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    finally:
        log.close()
    result = RunResult(
        argv=tuple(str(a) for a in argv), exit_code=code, tail=tail, log_path=log.log_file
    )
    if check:
        check_result(result, step, "the host", log.redactor)
    return result


def _runs_as(exe: Path, version: str) -> bool:
    """Whether *exe* starts and is Python *version* (a pyenv shim for a version that is not
    selected exists on PATH but fails)."""
    try:
        out = subprocess.run(
            [str(exe), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_python(version: str) -> Path:
    """A working local interpreter for *version* ("3.11"): ``python3.11`` on PATH (unless it is
    a pyenv shim that does not run), then pyenv's installed versions, newest patch first."""
    candidates: list[Path] = []
    found = shutil.which(f"python{version}")
    if found:
        candidates.append(Path(found))
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():

        def patch(p: Path) -> int:
            tail = p.name.split(".")[2:3]
            return int(tail[0]) if tail and tail[0].isdigit() else -1

        for cand in sorted(root.glob(f"{version}.*"), key=patch, reverse=True):
            candidates.append(cand / "bin" / f"python{version}")
    for exe in candidates:
        if exe.exists() and _runs_as(exe, version):
            return exe
    raise StepFailed(
        f"no working Python {version} interpreter on this host (tried python{version} on PATH "
        f"and {root}/{version}.*); install it (e.g. `pyenv install {version}`) or use "
        "BACKEND=docker"
    )


#: The builder's own environment variables that a cell's steps must not inherit.
CALLER_ONLY = ("PYTHONPATH", "PYTHONHOME")


class HostSession:
    """Same interface as a container session, backed by a temporary directory here."""

    def __init__(self, workdir: Path, log: OutputLog, base_env: Mapping[str, str]) -> None:
        self.root = workdir
        self.workdir = str(workdir)
        self.log = log
        self.base_env = dict(base_env)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
        step: str = "",
        tail_lines: int = TAIL_LINES,
    ) -> RunResult:
        merged = dict(self.base_env)
        merged.update(env or {})
        # The caller's PYTHONPATH/PYTHONHOME would reach the cell's interpreters: verification
        # would import the package from the caller's checkout instead of the installed wheel.
        return run_host(
            argv,
            self.log,
            env=merged,
            cwd=cwd or self.workdir,
            check=check,
            step=step,
            tail_lines=tail_lines,
            unset=CALLER_ONLY,
        )

    def copy_in(self, src: Path, dest_dir: str) -> str:
        if not src.exists():
            raise StepFailed(f"cannot copy {src} into the session: it does not exist")
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / src.name
        if src.is_dir():
            shutil.copytree(
                src, target, symlinks=True, dirs_exist_ok=True, copy_function=copy_sparse
            )
        else:
            shutil.copy2(src, target)
        return str(target)

    def copy_out(self, src: str, dest_dir: Path) -> Path:
        source = Path(src)
        if not source.exists():
            raise StepFailed(f"{src} does not exist in the session")
        return Path(self.copy_in(source, str(dest_dir)))


class HostEngine:
    """Factory of host sessions (mirrors ``DockerEngine.container``)."""

    name = "host"

    @contextlib.contextmanager
    def session(
        self,
        *,
        env: Mapping[str, str] | None = None,
        log: OutputLog | None = None,
        parent: Path | None = None,
    ) -> Iterator[HostSession]:
        workdir = Path(tempfile.mkdtemp(prefix="ampforge-host-", dir=parent))
        try:
            yield HostSession(workdir, log or OutputLog(), env or {})
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
