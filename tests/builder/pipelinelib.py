"""Helpers for the build-pipeline tests: run ``python -m builder build`` as a user would, and
tiny extension projects that are broken in one specific way each."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from enginelib import write_tiny_extension

from builder.config import REPO_ROOT

CELL = "cp311-manylinux_x86_64-torch2.13.0"


@dataclass
class Run:
    rc: int
    out: str
    err: str


def builder_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def build_argv(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "builder", "build", "--out", str(tmp / "dist"),
            "--work-dir", str(tmp / "work"), *args]


def run_build(tmp: Path, *args: str, timeout: int = 1800, **env: str) -> Run:
    proc = subprocess.run(build_argv(tmp, *args), capture_output=True, text=True,
                          env=builder_env(**env), cwd=tmp, timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def run_plan(tmp: Path, *args: str, **env: str) -> dict[str, dict]:
    """``plan --format json`` for *args*: the resolved records by cell id."""
    proc = subprocess.run([sys.executable, "-m", "builder", "plan", "--format", "json", *args],
                          capture_output=True, text=True, env=builder_env(**env), cwd=tmp,
                          timeout=300)
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
    record_wheel(dist, ManifestEntry.for_wheel(
        wheel, cell="cp310-manylinux_x86_64-torch2.9.1", torch="2.9.1", python="3.10",
        base_image="x", compiler="g++", builder_version="0", started_at="t0",
        finished_at="t1"))
    return dist_state(dist)


def manifest(dist: Path) -> dict:
    return json.loads((dist / "manifest.json").read_text())


def broken_project(root: Path, kind: str) -> Path:
    """tinyext with one defect: ``compile`` (a C++ error), ``repair`` (links a library outside
    the manylinux policy), ``glibc`` (needs a newer glibc than its torch's tag allows),
    ``smoke`` (the package fails at import)."""
    project = write_tiny_extension(root)
    if kind == "compile":
        (project / "tinyext" / "ext.cpp").write_text(
            "#include <torch/extension.h>\nint broken( { return sentinel_undeclared_xyz; }\n")
    elif kind == "repair":
        # libexpat is on every Debian system (python3 needs it) but outside the manylinux
        # policy: auditwheel would have to graft it, and the builder refuses.
        setup = (project / "setup.py").read_text().replace(
            'extra_link_args=["-fopenmp", "-s"]',
            'extra_link_args=["-fopenmp", "-s", "-Wl,--no-as-needed", '
            '"/usr/lib/x86_64-linux-gnu/libexpat.so.1"]')
        (project / "setup.py").write_text(setup)
    elif kind == "glibc":
        # close_range is GLIBC_2.34 (no older version exists): the wheel would need glibc 2.34,
        # above the manylinux_2_28 of torch 2.13's own wheel.
        source = project / "tinyext" / "ext.cpp"
        source.write_text(source.read_text().replace(
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            "#include <unistd.h>\nint closer() { return close_range(1u << 30, 1u << 30, 0); }\n"
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n  m.def(\"closer\", &closer);"))
    elif kind == "smoke":
        (project / "tinyext" / "__init__.py").write_text(
            'raise ImportError("smoke-sentinel: this package refuses to import")\n')
    else:
        raise ValueError(kind)
    return project


def busy_in_cell(log: str) -> bool:
    """A cell's log says pip is at work in it: installing torch (no cached torch environment
    yet) or building the wheel. The interruption tests signal then."""
    return "Processing /wheelhouse/torch" in log or "-m pip wheel " in log


def _as_terminal_foreground() -> None:
    # A runner that started the suite in the background (``cmd &`` without job control, as
    # some CI launchers do) passes SIGINT down as *ignored*, and Python then never raises
    # KeyboardInterrupt; ``nohup`` passes SIGHUP ignored. The child gets the default
    # dispositions a terminal's foreground process has, which is what the signal tests mean
    # to exercise.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_subprocess(argv: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env=builder_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_terminal_foreground)


def probe_wheel(folder: Path) -> Path:
    """A pure-Python wheel ``ampforge_probe`` (importable: ``VALUE``), built by hand: a
    test-requires that is in no wheelhouse, reached by a direct file URL."""
    name = "ampforge_probe-1.0-py3-none-any.whl"
    files = {
        "ampforge_probe/__init__.py": b"VALUE = 'probe-4711'\n",
        "ampforge_probe-1.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: ampforge-probe\nVersion: 1.0\n",
        "ampforge_probe-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("ampforge_probe-1.0.dist-info/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr("ampforge_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return folder / name
