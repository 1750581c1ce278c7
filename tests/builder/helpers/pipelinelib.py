"""Helpers for the build-pipeline tests: run ``python -m builder build`` as a user would, and
tiny extension projects that are broken in one specific way each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.config import REPO_ROOT
from builder.engines.docker import CONTAINER_LABEL, DockerEngine
from builder.release.manifest import LOCKS_DIR
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension

CELL = "cp311-manylinux_x86_64-torch2.13.0"


@dataclass
class Run:
    rc: int
    out: str
    err: str


@dataclass(frozen=True)
class AmpBuild:
    """One finished `build` of this repository's wheel (cell CELL)."""

    root: Path  # the folder the builder ran in: dist/ and work/ are under it
    args: tuple[str, ...]  # the build's command line after `build`
    run: Run
    seeded: dict[str, bytes]  # what dist/ held before (earlier cells' wheels and manifest)

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def wheel(self) -> Path:
        (wheel,) = self.dist.glob("ampforge-*.whl")
        return wheel

    @property
    def log(self) -> str:
        return (self.root / "work" / "logs" / f"{CELL}.log").read_text()


def snapshot_of_this_repo(dest: Path) -> Path:
    """A copy of the sources the wheel is built from: an up-to-date check against it must not
    see edits made to the checkout while the session runs."""
    dest.mkdir(parents=True)
    for name in ("amp", "kernels", "setup.py", "pyproject.toml", "README.md", "LICENSE"):
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def one_cell_config(tmp: Path, text: str = "") -> Path:
    """A build config of the one x86_64 cp311 torch 2.13.0 cell, on the repository's support
    table, with *text* (YAML keys, dedented) after the matrix."""
    path = tmp / "matrix.yaml"
    path.write_text(
        f"support: {REPO_ROOT / 'configs' / 'support.yaml'}\n"
        "matrix: {arch: [X86], python: ['3.11'], torch: ['2.13.0']}\n" + textwrap.dedent(text)
    )
    return path


def builder_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def build_argv(tmp: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "builder",
        "build",
        "--out",
        str(tmp / "dist"),
        "--work-dir",
        str(tmp / "work"),
        *args,
    ]


def run_build(tmp: Path, *args: str, timeout: int = 1800, **env: str) -> Run:
    proc = subprocess.run(
        build_argv(tmp, *args),
        capture_output=True,
        text=True,
        env=builder_env(**env),
        cwd=tmp,
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def run_plan(tmp: Path, *args: str, **env: str) -> dict[str, dict]:
    """``plan --format json`` for *args*: the resolved records by cell id."""
    proc = subprocess.run(
        [sys.executable, "-m", "builder", "plan", "--format", "json", *args],
        capture_output=True,
        text=True,
        env=builder_env(**env),
        cwd=tmp,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return {c["id"]: c for c in json.loads(proc.stdout)["cells"]}


def dist_state(dist: Path) -> dict[str, bytes]:
    """Every file in dist/ (names and bytes): must not change when a build fails."""
    return {p.name: p.read_bytes() for p in sorted(dist.iterdir()) if p.is_file()}


def seed_dist(dist: Path) -> dict[str, bytes]:
    """An earlier build's wheel and manifest (a different cell), to prove they survive."""
    from builder.release.manifest import ManifestEntry, record_wheel  # noqa: PLC0415

    dist.mkdir(parents=True, exist_ok=True)
    wheel = dist / "earlier-1.0+torch2.9-cp310-cp310-manylinux_2_24_x86_64.whl"
    wheel.write_bytes(b"an earlier wheel")
    record_wheel(
        dist,
        ManifestEntry.for_wheel(
            wheel,
            cell="cp310-manylinux_x86_64-torch2.9.1",
            torch="2.9.1",
            python="3.10",
            base_image="x",
            compiler="g++",
            builder_version="0",
            started_at="t0",
            finished_at="t1",
        ),
    )
    return dist_state(dist)


def hidden_leftovers(dist: Path) -> list[str]:
    """Hidden entries of *dist* other than the builder's own locks: the manifest's lock file
    and the per-cell lock folder, whose lock files are empty once no build holds them (the
    holder's name is written only while it builds). Anything else is a partial file."""
    locks = dist / LOCKS_DIR
    held = (
        [
            f"{LOCKS_DIR}/{p.name}"
            for p in locks.iterdir()
            if not p.name.endswith(".lock") or p.stat().st_size
        ]
        if locks.is_dir()
        else []
    )
    return held + [
        p.name
        for p in dist.iterdir()
        if p.name.startswith(".") and p.name not in (".manifest.lock", LOCKS_DIR)
    ]


def manifest(dist: Path) -> dict:
    return json.loads((dist / "manifest.json").read_text())


SMOKE_BROKEN_TOP = """\
#include <Python.h>
extern "C" int smoke_sentinel_undefined(void);
static PyObject *f(PyObject *, PyObject *) { return PyLong_FromLong(smoke_sentinel_undefined()); }
static PyMethodDef methods[] = {{"f", f, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tinyext_top", NULL, -1, methods};
PyMODINIT_FUNC PyInit_tinyext_top(void) { return PyModule_Create(&module); }
"""


def broken_project(root: Path, kind: str) -> Path:
    """tinyext with one defect: ``compile`` (a C++ error), ``repair`` (links a library outside
    the manylinux policy), ``glibc`` (needs a newer glibc than its torch's tag allows),
    ``smoke`` (a top-level compiled module fails at import)."""
    project = write_tiny_extension(root)
    if kind == "compile":
        (project / "tinyext" / "ext.cpp").write_text(
            "#include <torch/extension.h>\nint broken( { return sentinel_undeclared_xyz; }\n"
        )
    elif kind == "repair":
        # libexpat is on every Debian system (python3 needs it) but outside the manylinux
        # policy: auditwheel would have to graft it, and the builder refuses.
        setup = (
            (project / "setup.py")
            .read_text()
            .replace(
                'extra_link_args=["-fopenmp", "-s"]',
                'extra_link_args=["-fopenmp", "-s", "-Wl,--no-as-needed", '
                '"/usr/lib/x86_64-linux-gnu/libexpat.so.1"]',
            )
        )
        (project / "setup.py").write_text(setup)
    elif kind == "glibc":
        # close_range is GLIBC_2.34 (no older version exists): the wheel would need glibc 2.34,
        # above the manylinux_2_28 of torch 2.13's own wheel.
        source = project / "tinyext" / "ext.cpp"
        source.write_text(
            source.read_text().replace(
                "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
                "#include <unistd.h>\nint closer() { return close_range(1u << 30, 1u << 30, 0); }\n"
                'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n  m.def("closer", &closer);',
            )
        )
    elif kind == "smoke":
        # A second, top-level module (as apex's apex_C) whose import fails: it calls a function
        # nothing defines, which the loader (RTLD_NOW) refuses. The package itself imports.
        (project / "tinyext_top.cpp").write_text(SMOKE_BROKEN_TOP)
        setup = (
            (project / "setup.py")
            .read_text()
            .replace(
                "ext_modules=[", 'ext_modules=[CppExtension("tinyext_top", ["tinyext_top.cpp"]), '
            )
        )
        (project / "setup.py").write_text(setup)
    else:
        raise ValueError(kind)
    return project


#: What a cell's log shows once pip runs the project's build (builder/incell/steps.py).
BUILD_STARTED = "-m pip wheel --no-build-isolation"


def blocking_project(root: Path) -> Path:
    """The tiny extension, whose build sleeps as soon as pip runs its setup.py: a signal sent
    then lands mid-build whatever the caches made quick (with a cached torch environment and
    compiler cache, the other steps take a second or two -- too short a window to aim at)."""
    project = write_tiny_extension(root)
    setup_py = project / "setup.py"
    setup_py.write_text("import time\ntime.sleep(900)\n" + setup_py.read_text())
    return project


def wait_until_building(
    proc: subprocess.Popen, log: Path, also: Callable[[], bool] = lambda: True, timeout: float = 900
) -> None:
    """Return once *log* shows the project's build running (and *also* holds): the moment the
    interruption tests signal. Fails the test (killing *proc*) if the build ends or never gets
    there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and BUILD_STARTED in log.read_text() and also():
            return
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    pytest.fail(f"the build never reached its project's build: {proc.communicate()[1][-3000:]}")


def _as_terminal_foreground() -> None:
    # A runner that started the suite in the background (``cmd &`` without job control, as
    # some CI launchers do) passes SIGINT down as *ignored*, and Python then never raises
    # KeyboardInterrupt; ``nohup`` passes SIGHUP ignored. The child gets the default
    # dispositions a terminal's foreground process has, which is what the signal tests mean
    # to exercise.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_subprocess(argv: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=builder_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_terminal_foreground,
    )


def start_blocked_docker_build(
    engine: DockerEngine, tmp_path: Path, name: str, base: str
) -> tuple[subprocess.Popen, set[str]]:
    """A docker build of a tiny project, returned once the project's build blocks in its
    container."""
    project = blocking_project(tmp_path / name)
    argv = build_argv(
        tmp_path,
        "--backend",
        "docker",
        "--base-image",
        base,
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    proc = run_subprocess(argv, tmp_path)
    seen: set[str] = set()

    def in_container() -> bool:
        mine = {"label": f"{CONTAINER_LABEL}.project={name}"}
        seen.update(c["Id"] for c in engine.api.containers(all=True, filters=mine))
        return bool(seen)

    wait_until_building(proc, tmp_path / "work" / "logs" / f"{CELL}.log", in_container)
    return proc, seen
