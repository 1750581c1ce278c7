"""Cross-compile a PEP 517 torch-extension project into a ``linux_<arch>`` wheel on this host.

The project's own build runs unchanged (``pip wheel --no-build-isolation``) on the host
interpreter, which must have *some* torch importable (for ``torch.utils.cpp_extension``'s build
logic); it need not be the target's Python X.Y. What makes it a cross build is the environment:

* ``_PYTHON_SYSCONFIGDATA_NAME`` + ``PYTHONPATH`` -> the target's sysconfig (EXT_SUFFIX, SOABI,
  VERSION), so the module is ``*.cpython-3X-aarch64-linux-gnu.so`` and setuptools (84.x here,
  whose bdist_wheel reads the Python and ABI tags from the target's sysconfig) tags the wheel
  ``cp3X-cp3X``; the compile sees only the target's Python headers (``CPPFLAGS`` first);
* ``_PYTHON_HOST_PLATFORM=linux-aarch64`` -> ``sysconfig.get_platform()``, so the wheel is
  ``linux_aarch64``;
* ``CC``/``CXX``/``LDSHARED`` -> the GNU cross toolchain;
* ``hook/sitecustomize.py`` + ``AMPFORGE_CROSS_TORCH_DIR`` -> cpp_extension's include and library
  paths point at the target torch, not the host's;
* ``CPPFLAGS`` puts the target's Python headers (its own pyconfig.h) first, plus a shim that keeps
  GCC 12's libstdc++ headers off ``__libc_single_threaded`` (GLIBC_2.32), which would otherwise cap
  the manylinux tag, and a forced-included header binding libm's exp/log/pow & co. to their
  oldest versions (:func:`builder.incell.steps.libm_floor_shim`, shared with the in-cell builds);
* ``LDFLAGS=-L<dir with libgomp.so -> torch's own OpenMP runtime>`` so ``-fopenmp`` links the
  runtime torch ships (a hash-renamed libgomp in aarch64 wheels) instead of a system libgomp.

Contract with the project's build (setup.py), beyond using torch.utils.cpp_extension:

* ``AMP_TORCH_VERSION`` -- the target torch's ``torch.__version__`` (e.g. ``2.9.1+cpu``). A
  project that records the torch it was built against must prefer it over the host's
  ``torch.__version__`` (amp's setup.py: ``-DAMP_TORCH_VERSION=...``).
* ``AMP_LOCAL_VERSION`` (passed by :mod:`builder.backends.cross`) -- the wheel's local
  version label, as in the container build.
* ``AMP_TORCH_INCLUDE`` (``os.pathsep``-separated) / ``AMP_TORCH_LIBDIR`` -- the target torch's
  include and library folders, for projects that do not go through cpp_extension's helpers.
* The project must not hard-code ``-march=native`` or x86 flags without an ``__x86_64__`` guard.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from packaging.tags import Tag

from builder.cache import cache_root
from builder.config.buildoptions import NO_OPTIONS, CibwOptions
from builder.config.projecttest import expand
from builder.cross.sysroot import TargetPython
from builder.cross.target_torch import TargetTorch, wheel_cxx11_abi
from builder.cross.toolchain import CrossToolchain
from builder.errors import StepFailed
from builder.incell import CcacheStats, ccache_stats
from builder.incell.steps import (
    COMPILER_ERROR,
    CXX_FLOOR_HEADER,
    CXX_FLOOR_SHIM,
    LIBM_FLOOR_HEADER,
    CcacheSetupError,
    ccache_masquerade,
    evaluate_environment,
    frontend_argv,
    libm_floor_shim,
)
from builder.projecttree import copy_project_tree
from builder.release.shared import tag_serves

HOOK_DIR = Path(__file__).with_name("hook")

_SINGLE_THREADED_SHIM = """\
/* ampforge cross-build shim (builder/cross/build.py). GCC 12's libstdc++ reads glibc 2.32's
   __libc_single_threaded when this header exists, which raises the wheel's manylinux floor to
   the build host's glibc. "Never single-threaded" keeps every refcount atomic: correct, and the
   behaviour of older glibc. */
#ifndef AMPFORGE_SINGLE_THREADED_SHIM
#define AMPFORGE_SINGLE_THREADED_SHIM
static const char ampforge_libc_single_threaded = 0;
#define __libc_single_threaded ampforge_libc_single_threaded
#endif
"""


@dataclass(frozen=True)
class CrossBuildResult:
    wheel: Path  # the linux_<arch> wheel (unrepaired)
    seconds: float  # wall time of the project's build
    log: Path  # full build log
    ccache: CcacheStats | None = None  # compiler-cache counts, when ccache was used


def _run_logged(
    argv: list[str], cwd: Path, env: dict[str, str], fh: TextIO, redact: Callable[[str], str] | None
) -> subprocess.CompletedProcess:
    """*argv*'s merged output into the open log *fh*, each line through *redact* when given
    (the build's processes see the environment-pass values; a build that prints them must not
    put them in the log)."""
    if redact is None:
        return subprocess.run(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                fh.write(redact(line.rstrip("\n")) + "\n")
            fh.flush()
        except BaseException:
            proc.kill()  # Ctrl-C or a full disk: as subprocess.run does
            raise
    return subprocess.CompletedProcess(argv, proc.returncode)


def _failure_excerpt(log: Path) -> str:
    """The compiler's error lines (pip's own summary buries them), then the log's last lines."""
    lines = log.read_text(errors="replace").splitlines()
    errors = [ln for ln in lines if COMPILER_ERROR.search(ln)]
    parts = []
    if errors:
        parts.append("compiler errors:\n" + "\n".join(errors[:15]))
    parts.append("last lines:\n" + "\n".join(lines[-12:]))
    return "\n".join(parts)


def check_host_python(host_python: str, env: dict[str, str]) -> None:
    """Refuse, in one line, a host interpreter that cannot run a torch extension's build: the
    project's setup.py imports ``torch.utils.cpp_extension`` there (pip would otherwise bury a
    ``No module named 'torch'`` 30 lines deep in metadata-generation-failed)."""
    probe = subprocess.run(
        [host_python, "-c", "import torch.utils.cpp_extension"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        raise StepFailed(
            f"cross build: the host interpreter {host_python} cannot import torch "
            f"({lines[-1] if lines else f'exit {probe.returncode}'}); the cross backend needs a "
            "host torch to run the project's build: build through `python -m builder build` "
            "(which makes a cached host torch environment), or pass an interpreter that has "
            "torch"
        )


def check_wheel_tags(wheel: Path, python: TargetPython, log: Path) -> None:
    """Refuse a cross-built wheel not tagged ``cpXY-cpXY-linux_<arch>`` for the target (or,
    for a ``py_limited_api`` project, ``cpNN-abi3-linux_<arch>`` with NN no newer than it)."""
    tag = python.python_tag
    expected = f"-{tag}-{tag}-linux_{python.arch}.whl"
    abi3 = re.search(r"-(cp\d+)-abi3-linux_(\w+)\.whl$", wheel.name)
    if (
        abi3 is not None
        and abi3.group(2) == python.arch
        and tag_serves(Tag(abi3.group(1), "abi3", f"linux_{python.arch}"), tag)
    ):
        return
    if not wheel.name.endswith(expected):
        raise StepFailed(
            f"cross build: wheel {wheel.name} is not tagged {expected[1:-4]} for the target "
            f"Python {python.version}. The host interpreter named it; its setuptools must take "
            f"the tags from the target's sysconfig (a recent one does); log: {log}"
        )


def cross_build_env(
    python: TargetPython,
    torch: TargetTorch,
    toolchain: CrossToolchain,
    scratch: Path,
    base_env: dict[str, str] | None = None,
    *,
    cxx11_abi: bool | None = None,
    cxx_floor: bool = False,
) -> dict[str, str]:
    """The environment that turns the host build of a torch extension into a cross build.
    *cxx11_abi*: the target torch's string ABI (the cell's record; None: read from the target
    torch); the hook compiles with it, not with the host torch's. *cxx_floor*: force-include the
    C++ floor header (a manylinux2014 ceiling, :data:`builder.incell.steps.CXX_FLOOR_SHIM`)."""
    env = dict(os.environ if base_env is None else base_env)
    shim_dir = scratch / "shim-include"
    (shim_dir / "sys").mkdir(parents=True, exist_ok=True)
    (shim_dir / "sys" / "single_threaded.h").write_text(_SINGLE_THREADED_SHIM)
    cppflags = [f"-I{python.include_dir}", f"-I{shim_dir}"]
    libm_shim = libm_floor_shim(python.arch)
    if libm_shim:
        (shim_dir / LIBM_FLOOR_HEADER).write_text(libm_shim)
        cppflags += ["-include", str(shim_dir / LIBM_FLOOR_HEADER)]
    if cxx_floor:
        (shim_dir / CXX_FLOOR_HEADER).write_text(CXX_FLOOR_SHIM)
        cppflags += ["-include", str(shim_dir / CXX_FLOOR_HEADER)]
    if cxx11_abi is None:
        cxx11_abi = wheel_cxx11_abi(torch.torch_dir)
    ldflags = []
    gomp = torch.openmp_library()
    if gomp is not None:
        link_dir = scratch / "openmp-link"
        link_dir.mkdir(exist_ok=True)
        target = link_dir / "libgomp.so"
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(gomp)
        ldflags.append(f"-L{link_dir}")
    cxx = str(toolchain.cxx)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(
                [str(HOOK_DIR), str(python.sysconfig_dir)]
                + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
            ),
            "AMPFORGE_CROSS_TORCH_DIR": str(torch.torch_dir),
            # The target torch's string ABI (0/1) for the hook's -D_GLIBCXX_USE_CXX11_ABI.
            "AMPFORGE_CROSS_CXX11_ABI": "" if cxx11_abi is None else str(int(cxx11_abi)),
            "_PYTHON_SYSCONFIGDATA_NAME": python.sysconfig_name,
            "_PYTHON_HOST_PLATFORM": python.host_platform,
            "CC": str(toolchain.cc),
            "CXX": cxx,
            "LDSHARED": f"{cxx} -shared",
            "LDCXXSHARED": f"{cxx} -shared",
            "CPPFLAGS": " ".join(cppflags),
            "LDFLAGS": " ".join(ldflags),
            # For projects that read them (documented contract; the hook already covers
            # torch.utils.cpp_extension users).
            "AMP_TORCH_INCLUDE": os.pathsep.join(str(p) for p in torch.include_dirs),
            "AMP_TORCH_LIBDIR": str(torch.lib_dir),
            "AMP_CROSS_ARCH": python.arch,
            # torch.__version__ of the torch the module is compiled against; the host torch that
            # runs setup.py is another one (amp._ext refuses a module whose recorded version
            # differs).
            "AMP_TORCH_VERSION": torch.full_version,
            # The compile of a tiny project must not spread over every core of a shared machine.
            "MAX_JOBS": env.get("MAX_JOBS", "2"),
        }
    )
    env.pop("PYTHONHOME", None)
    return env


def cross_build_wheel(
    project: Path,
    out_dir: Path,
    python: TargetPython,
    torch: TargetTorch,
    toolchain: CrossToolchain,
    *,
    host_python: str,
    isolate: bool = True,
    log_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    ccache: bool | None = None,
    options: CibwOptions = NO_OPTIONS,
    cxx11_abi: bool | None = None,
    cxx_floor: bool = False,
    redact: Callable[[str], str] | None = None,
) -> CrossBuildResult:
    """Build ``project`` into one ``linux_<arch>`` wheel in ``out_dir``.

    *host_python* runs the project's build: an interpreter of this host with *some* torch
    (the cross backend's cached host torch environment). ``isolate`` copies the project
    (builder.projecttree: without .git, .venv, build/, dist/, nothing from outside it) to a
    scratch folder so the checkout's in-tree build folders are never shared with another
    build, and the build never writes into the caller's tree. Raises
    :class:`StepFailed` with the log's tail when the build fails. *ccache*: compile through
    ccache (None: when installed; True: required), its cache under the cache root, shared with
    the host backend's. *options*: cibuildwheel's build options, run on this host as the
    in-cell step runs them in a session (environment evaluated by sh, before-all,
    before-build, config-settings, the frontend). *redact*: every line of the build's output
    goes through it into the log (the cell's redactor: proxy passwords, environment-pass
    values).
    """
    project = Path(project).resolve()
    if not (project / "pyproject.toml").exists() and not (project / "setup.py").exists():
        raise StepFailed(
            f"cross build: {project} is not a Python project (expected pyproject.toml or setup.py)"
        )
    host = host_python
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampforge-cross-") as scratch_name:
        scratch = Path(scratch_name)
        src = project
        copied: list[str] = []
        if isolate:
            # What every backend's build gets of the tree (builder.projecttree): nothing from
            # outside it, no FIFOs or devices, no .git.
            src = scratch / "src"
            copied = copy_project_tree(project, src).lines()
        env = cross_build_env(
            python, torch, toolchain, scratch, cxx11_abi=cxx11_abi, cxx_floor=cxx_floor
        )
        env.update(extra_env or {})
        check_host_python(host, env)
        try:
            env.update(evaluate_environment(list(options.environment), env))
        except ValueError as exc:
            raise StepFailed(f"cross build: {exc}") from None
        stats_log = scratch / "ccache-stats.log"
        use_ccache = ccache is not False and shutil.which("ccache") is not None
        if ccache and not use_ccache:
            raise StepFailed(
                "--ccache: ccache is not installed on this host "
                "(apt-get install ccache), or build without --ccache"
            )
        if ccache is False:  # torch's cpp_extension would put ccache in front by itself
            env.update(CCACHE_DISABLE="1", TORCH_NO_COMPILER_WRAPPER="1")
        if use_ccache:
            # The in-cell builds' mechanism (links named like the cross compilers); the compile
            # only: LDSHARED stays the bare toolchain. The cache is shared with the host
            # backend's.
            try:
                env.update(
                    ccache_masquerade(
                        env,
                        scratch / "ccache-bin",
                        ccache=shutil.which("ccache") or "ccache",
                        basedir=str(scratch),
                        statslog=str(stats_log),
                    )
                )
            except CcacheSetupError as exc:
                raise StepFailed(f"cross build: ccache: {exc}") from None
            env["CCACHE_DIR"] = str(cache_root() / "ccache")
        wheel_dir = scratch / "wheels"
        log = log_path or out_dir / f"cross-build-{python.python_tag}-{python.arch}.log"
        if options.uses_uv:  # the pinned uv is installed by the in-cell step only
            raise StepFailed(
                f"cross build: build-frontend {options.frontend_spec!r} is not "
                "supported by the cross backend; expected pip or build (or "
                "--backend host/docker for build[uv] and uv)"
            )
        cmd = frontend_argv(
            host,
            options.build_frontend,
            str(src),
            str(wheel_dir),
            list(options.config_settings),
            options.build_frontend_args,
        )
        if options.build_frontend == "pip":
            cmd[3:3] = ["--no-cache-dir", "-v"]
        start = time.monotonic()
        with open(log, "w") as fh:
            fh.writelines(f"ampforge: {line}\n" for line in copied)
            # (the before-commands' and the build's, as _run_logged returns them)
            proc: subprocess.CompletedProcess = subprocess.CompletedProcess(cmd, 0)
            for what, command in (
                ("before-all", options.before_all),
                ("before-build", options.before_build),
            ):
                if command and proc.returncode == 0:
                    line = expand(command, project=str(src), package=str(src))
                    fh.write((redact or str)(f"$ {what}: {line}") + "\n")
                    fh.flush()
                    proc = _run_logged(["sh", "-c", line], src, env, fh, redact)
            if proc.returncode == 0:
                fh.write((redact or str)("$ " + " ".join(cmd)) + "\n")
                fh.flush()
                proc = _run_logged(cmd, src, env, fh, redact)
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            raise StepFailed(
                f"cross build of {project} for {python.arch} failed "
                f"(exit {proc.returncode}):\n{_failure_excerpt(log)}\n"
                f"full log: {log}"
            )
        wheels = sorted(wheel_dir.glob("*.whl"))
        if len(wheels) != 1:
            raise StepFailed(
                f"cross build of {project}: expected one wheel, got "
                f"{[w.name for w in wheels]}; log: {log}"
            )
        built = wheels[0]
        check_wheel_tags(built, python, log)
        final = out_dir / built.name
        shutil.move(str(built), final)
        stats = None
        if use_ccache:
            stats = ccache_stats(
                stats_log.read_text(errors="replace") if stats_log.exists() else ""
            )
    return CrossBuildResult(wheel=final, seconds=seconds, log=log, ccache=stats)
