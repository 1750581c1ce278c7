"""Run a cross-built wheel on its target CPU: the target CPython under QEMU user emulation.

``qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.X`` with ``PYTHONPATH`` = the wheel's
install folder + the target torch's site-packages. Nothing is installed into the sysroot or the
cached torch site; each verification installs the wheel into its own scratch folder.

Cost (2 shared cores): the interpreter starts in ~1-2 s, ``import torch`` 2.9.1 takes ~30-45 s
of CPU under emulation (libtorch_cpu relocation + torch's Python), so callers should run all
their checks in one process.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Callable, Optional

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from builder.arch import emulated_cpu
from builder.config.projecttest import NO_TEST, ProjectTest
from builder.cross.sysroot import TargetPython
from builder.cross.target_torch import TargetTorch
from builder.cross.toolchain import find_qemu
from builder.errors import StepFailed
from builder.incell.steps import copy_test_sources, evaluate_environment
from builder.wheel.modules import compiled_files


@dataclass(frozen=True)
class QemuRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def qemu_argv(python: TargetPython) -> list[str]:
    """The command that runs the target interpreter: QEMU, the CPU model it emulates
    (:func:`builder.arch.emulated_cpu`), the sysroot, the interpreter."""
    cpu = emulated_cpu(python.arch)
    return [
        str(find_qemu(python.arch)),
        *(["-cpu", cpu] if cpu else []),
        "-L",
        str(python.sysroot),
        str(python.executable),
    ]


def run_target_python(
    python: TargetPython,
    args: Sequence[str],
    *,
    pythonpath: Sequence[Path] = (),
    cwd: Path | None = None,
    timeout: float = 900,
    env: dict[str, str] | None = None,
) -> QemuRun:
    """Run the target interpreter with ``args`` under QEMU and capture its output."""
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        "PYTHONNOUSERSITE": "1",
        # Two threads, like the CI machine: emulated OpenMP threads are real host threads.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    run_env.update(env or {})
    cmd = [*qemu_argv(python), *args]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=run_env,
            cwd=cwd or tempfile.gettempdir(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(
            f"{python.arch} Python under QEMU did not finish in {timeout:.0f} s: "
            f"{' '.join(args)[:200]}"
        ) from exc
    return QemuRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def install_for_target(wheel: Path, dest: Path, python: TargetPython) -> Path:
    """Install ``wheel`` (no dependencies) into ``dest`` for the target, with the host's pip.

    pip checks the wheel's tags against the target platform, so a misnamed wheel fails here.
    """
    _, _, _, tags = parse_wheel_filename(wheel.name)
    plats = sorted({t.platform for t in tags})
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--target",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        python.version,
        "--implementation",
        "cp",
        "--abi",
        python.python_tag,
    ]
    for plat in plats:
        cmd += ["--platform", plat]
    run = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True)
    if run.returncode != 0:
        raise StepFailed(
            f"installing {wheel.name} for {python.python_tag} {plats} failed:\n{run.stderr[-2000:]}"
        )
    return dest


def run_wheel_under_qemu(
    wheel: Path, python: TargetPython, torch: TargetTorch, script: str, *, timeout: float = 900
) -> QemuRun:
    """Install ``wheel`` into a scratch folder and run ``script`` with it on the target.

    Raises :class:`StepFailed` (with the script's output) when the script exits non-zero.
    """
    with tempfile.TemporaryDirectory(prefix="ampforge-qemu-") as tmp:
        site = install_for_target(wheel, Path(tmp) / "site", python)
        return _run_checked(wheel, python, [site, torch.site], script, Path(tmp), timeout)


def _run_checked(
    wheel: Path,
    python: TargetPython,
    pythonpath: list[Path],
    script: str,
    cwd: Path,
    timeout: float,
) -> QemuRun:
    """*script* on the target with the installed *wheel* on *pythonpath*, run from *cwd* (an
    empty folder, so the wheel, never a source tree, is imported); StepFailed on non-zero."""
    result = run_target_python(
        python, ["-c", script], pythonpath=pythonpath, cwd=cwd, timeout=timeout
    )
    if result.returncode != 0:
        raise StepFailed(
            f"verification of {wheel.name} under qemu-{python.arch} failed (exit "
            f"{result.returncode}):\n{result.stdout[-1500:]}\n{result.stderr[-3000:]}"
        )
    return result


def extension_modules(wheel: Path) -> list[str]:
    """Dotted names of the extension modules in ``wheel`` (builder.wheel.modules)."""
    return list(compiled_files(wheel).modules)


def verify_wheel(
    wheel: Path,
    python: TargetPython,
    torch: TargetTorch,
    *,
    timeout: float = 900,
    test: ProjectTest = NO_TEST,
    project: Optional[Path] = None,
    pip_env: Optional[dict[str, str]] = None,
    wheelhouse: Optional[Path] = None,
    log: Optional[Callable[[Sequence[str]], None]] = None,
    environment: Sequence[tuple[str, str]] = (),
) -> dict:
    """Verify any cross-built torch-extension wheel on the emulated target: torch and every
    compiled module it ships import, then the project's *test* runs (test-requires installed
    for the target by this host's pip, with *pip_env* and only from *wheelhouse* when given;
    test-command through ``sh -c`` with ``python`` the target interpreter under QEMU and
    ``{project}``/``{package}`` naming *project*; cibuildwheel's *environment* evaluated on
    this host for it, as for the build). *log* receives the test's whole output.
    Raises StepFailed with the output's tail when anything fails."""
    compiled = compiled_files(wheel)
    modules, libraries = list(compiled.modules), list(compiled.libraries)
    with tempfile.TemporaryDirectory(prefix="ampforge-qemu-") as tmp:
        site = install_for_target(wheel, Path(tmp) / "site", python)
        # The other shared objects are loaded as their packages do, from the install.
        loads = "".join(f"torch.ops.load_library({str(site / lib)!r})\n" for lib in libraries)
        script = (
            "import json, torch\n"
            + "".join(f"import {m}\n" for m in modules)
            + loads
            + f"print('IMPORT-VERIFY ' + json.dumps({{'modules': {modules!r}, "
            f"'libraries': {libraries!r}, 'ok': True, "
            "'torch': torch.__version__}))\n"
        )
        result = _run_checked(wheel, python, [site, torch.site], script, Path(tmp), timeout)
        report = json.loads(result.stdout.split("IMPORT-VERIFY ", 1)[1].splitlines()[0])
        report["qemu_wall_s"] = result.seconds
        report["qemu_cpu"] = emulated_cpu(python.arch) or "qemu default"
        if test.enabled:
            assert project is not None, "a test-command needs the project's folder"
            report["test"] = run_test_under_qemu(
                test,
                python,
                [site, torch.site],
                Path(tmp),
                project=project,
                pip_env=pip_env,
                wheelhouse=wheelhouse,
                timeout=timeout,
                log=log,
                environment=environment,
                wheel=wheel,
            )
    return report


def _target_python_wrapper(python: TargetPython, bindir: Path) -> None:
    """``python``, ``python3`` and ``python3.X`` in *bindir*: the target interpreter under
    QEMU, so a test-command's ``python -m pytest`` runs on the target CPU."""
    bindir.mkdir(parents=True, exist_ok=True)
    body = f'#!/bin/sh\nexec {shlex.join(qemu_argv(python))} "$@"\n'
    for name in ("python", "python3", f"python{python.version}"):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)


def extra_requirements(wheel: Path, extras: Sequence[str]) -> list[str]:
    """The requirements the wheel's METADATA declares for *extras* (their ``extra``
    markers dropped): what ``pip install wheel[extras]`` would add."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode("utf-8"))
    out = []
    for raw in meta.get_all("Requires-Dist") or []:
        req = Requirement(raw)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            continue  # not an extra's (installed with the wheel already)
        if any(req.marker.evaluate({"extra": e}) for e in extras):
            req.marker = None
            out.append(str(req))
    return out


def install_test_requires(
    reqs: Sequence[str],
    dest: Path,
    python: TargetPython,
    *,
    pip_env: Optional[dict[str, str]] = None,
    wheelhouse: Optional[Path] = None,
) -> Path:
    """*reqs* and their dependencies, as binary wheels for the target, into *dest* (this
    host's pip: the target interpreter may have none)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--no-compile",
        "--target",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        python.version,
        "--implementation",
        "cp",
        "--abi",
        python.python_tag,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for minor in range(17, 40):  # every manylinux tag a Debian arm64 userland may run
        cmd += ["--platform", f"manylinux_2_{minor}_{python.arch}"]
    cmd += ["--platform", f"manylinux2014_{python.arch}"]
    if wheelhouse is not None:
        cmd += ["--no-index", "--find-links", str(wheelhouse)]
    run = subprocess.run(
        [*cmd, *reqs], capture_output=True, text=True, env={**os.environ, **(pip_env or {})}
    )
    if run.returncode != 0:
        raise StepFailed(
            f"installing the test-requires {' '.join(reqs)} for "
            f"{python.python_tag} {python.arch} failed:\n{run.stderr[-2000:]}"
        )
    return dest


def run_test_under_qemu(
    test: ProjectTest,
    python: TargetPython,
    pythonpath: Sequence[Path],
    scratch: Path,
    *,
    project: Path,
    pip_env: Optional[dict[str, str]] = None,
    wheelhouse: Optional[Path] = None,
    timeout: float = 900,
    log: Optional[Callable[[Sequence[str]], None]] = None,
    environment: Sequence[tuple[str, str]] = (),
    wheel: Optional[Path] = None,
) -> dict:
    """The project's test-command on the target (see :func:`verify_wheel`); *wheel*: the
    one tested, whose extras' requirements test-extras adds."""
    try:
        # cibuildwheel's test environment starts from the build's: its environment first,
        # then the target interpreter's folder and the install in front of what it set.
        base = {**os.environ, **evaluate_environment(list(environment), dict(os.environ))}
    except ValueError as exc:
        raise StepFailed(f"test-command under qemu-{python.arch}: {exc}") from None
    path = list(pythonpath)
    # test-requires, the test-groups' requirements and the extras' (cibuildwheel's
    # test-extras: the wheel is installed already, its extras' requirements are added).
    reqs = (
        *test.install,
        *(extra_requirements(wheel, test.extras) if wheel is not None and test.extras else ()),
    )
    if reqs:
        path.insert(
            0,
            install_test_requires(
                reqs, scratch / "test-requires", python, pip_env=pip_env, wheelhouse=wheelhouse
            ),
        )
    bindir = scratch / "bin"
    _target_python_wrapper(python, bindir)
    cwd = scratch / "test-cwd"
    cwd.mkdir(parents=True)
    try:
        copy_test_sources(str(project), list(test.sources), cwd)
    except SystemExit:  # the in-cell step's failure, in this process: a path the copy lacks
        raise StepFailed(
            f"test-sources {' '.join(test.sources)}: not all in the project's copy {project}"
        ) from None
    command = test.command_for(str(project))
    env = {
        **base,
        "PATH": f"{bindir}{os.pathsep}{base.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": os.pathsep.join(str(p) for p in path),
        "PYTHONNOUSERSITE": "1",
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "2"),
    }
    env.pop("VIRTUAL_ENV", None)
    before = test.before_for(str(project))
    if before:  # cibuildwheel's before-test, from the project's folder, the target python
        run = subprocess.run(
            ["sh", "-c", before],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=project,
            timeout=timeout,
        )
        if log is not None:
            log(
                [
                    f"+ before-test (qemu-{python.arch}): {before}",
                    *run.stdout.splitlines(),
                    f"+ before-test exit {run.returncode}",
                ]
            )
        if run.returncode != 0:
            raise StepFailed(
                f"before-test failed under qemu-{python.arch} with exit code "
                f"{run.returncode}: {before}\n{run.stdout[-1500:]}"
            )
    start = time.monotonic()
    try:
        proc = subprocess.run(
            ["sh", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(
            f"test-command under qemu-{python.arch} did not finish in {timeout:.0f} s: {command}"
        ) from exc
    seconds = time.monotonic() - start
    lines = proc.stdout.splitlines()
    if log is not None:
        log(
            [
                f"+ test-command (qemu-{python.arch}): {command}",
                *lines,
                f"+ test-command exit {proc.returncode} after {seconds:.1f}s",
            ]
        )
    if proc.returncode != 0:
        tail = "\n".join("    " + line for line in lines[-25:])
        raise StepFailed(
            f"test-command failed under qemu-{python.arch} with exit code "
            f"{proc.returncode}: {command}\n  last lines:\n{tail}"
        )
    return {"command": command, "exit": 0, "seconds": round(seconds, 1), "tail": lines[-5:]}
