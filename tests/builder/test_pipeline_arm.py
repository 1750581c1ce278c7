"""ARM (aarch64) cells through `python -m builder build` on this x86_64 host: the cross backend.

The real CLI in a subprocess, the real toolchain, sysroot, aarch64 torch and QEMU (builder.cross);
nothing is mocked. Warm caches (~/.cache/ampforge): the full build ~1.5-2 min (compile ~55 s,
emulated verification ~35 s); the other tests take seconds. Cold, the first run downloads the
aarch64 torch wheels (2.9.1 ~100 MB, 2.13.0 ~430 MB) and the Debian arm64 Python once.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
import zipfile
from pathlib import Path

import pytest
from pipelinelib import dist_state, manifest, run_build, seed_dist

from builder.config.load import REPO_ROOT

ARM_CELL = "cp311-manylinux_aarch64-torch2.9.1"


def _snapshot(dest: Path) -> Path:
    """This repository's sources, copied: other people's edits to the shared checkout between
    the two builds must not change the project's input key."""
    dest.mkdir()
    for name in ("amp", "kernels", "setup.py", "pyproject.toml", "README.md"):
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _no_hidden_leftovers(dist: Path) -> None:
    assert not [p.name for p in dist.iterdir()
                if p.name.startswith(".") and p.name != ".manifest.lock"]


@pytest.mark.slow
def test_cross_backend_builds_a_verified_arm_wheel_and_auto_reuses_it(tmp_path: Path) -> None:
    seeded = seed_dist(tmp_path / "dist")
    project = _snapshot(tmp_path / "ampforge")
    args = ("--arch", "ARM", "--python", "3.11", "--torch", "2.9.1", "--project", str(project))
    r = run_build(tmp_path, *args, "--backend", "cross")
    assert r.rc == 0, r.err[-4000:]
    assert "backend: cross -- asked for" in r.err
    for step in ("compile", "repair", "verify (qemu)", "publish"):
        assert f"[{ARM_CELL}] {step}" in r.err, r.err  # progress lines, one per step
    dist = tmp_path / "dist"
    (wheel,) = dist.glob("ampforge-*.whl")
    assert re.fullmatch(r"ampforge-[^-]+\+torch2\.9-cp311-cp311-manylinux_2_\d+_aarch64\.whl",
                        wheel.name), wheel.name
    assert str(wheel) in r.out
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "amp/_C.cpython-311-aarch64-linux-gnu.so" in names, names
    assert not [n for n in names if "libtorch" in n or "libc10" in n or "libgomp" in n]

    entry = next(w for w in manifest(dist)["wheels"] if w["cell"] == ARM_CELL)
    assert entry["file"] == wheel.name and entry["size"] == wheel.stat().st_size
    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry["torch"] == "2.9.1+cpu" and entry["python"] == "3.11"
    assert entry["compiler"].startswith("aarch64-linux-gnu-g++ ")
    assert entry["started_at"] <= entry["finished_at"]
    extra = entry["extra"]
    assert extra["backend"] == "cross" and extra["modules"] == ["amp._C"]
    assert extra["tag"] in wheel.name and len(extra["input_key"]) == 64
    # The emulated aarch64 run: the fused kernels trained and matched the reference.
    report = extra["verification"]
    assert report["ok"] is True and report["torch"] == "2.9.1+cpu"
    assert report["max_abs_diff_vs_reference"] < 1e-5
    assert report["losses"][-1] < report["losses"][0]
    # The earlier cell survived; nothing partial left behind.
    assert all((dist / n).read_bytes() == seeded[n] for n in seeded if n.startswith("earlier-"))
    _no_hidden_leftovers(dist)

    # auto on this host picks cross for the ARM cell (and says why), and the unchanged inputs
    # are recognised from the manifest without compiling.
    before = dist_state(dist)
    start = time.monotonic()
    r = run_build(tmp_path, *args, "--backend", "auto",
                  DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert r.rc == 0, r.err[-4000:]
    assert "backend: cross -- auto: x86_64 host, aarch64 cell" in r.err
    assert f"[{ARM_CELL}] compile" not in r.err and "up-to-date" in r.err, r.err
    assert time.monotonic() - start < 60
    assert dist_state(dist) == before


def test_cross_backend_refuses_pythons_without_a_sysroot_quickly(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    start = time.monotonic()
    r = run_build(tmp_path, "--arch", "ARM", "--python", "3.12", "--torch", "2.9.1",
                  BACKEND="cross")  # the environment variable selects it like --backend
    assert r.rc == 1, r.err
    assert "backend: cross -- asked for" in r.err
    assert "the cross backend cannot build cp312-manylinux_aarch64-torch2.9.1" in r.err
    assert "no aarch64 Python 3.12 sysroot" in r.err
    assert "supports Python 3.9, 3.11, 3.13 (the Debian arm64 CPythons)" in r.err
    assert "Traceback" not in r.err
    # auto: this host cannot build it either way, and says what the cross path would need.
    r = run_build(tmp_path, "--arch", "ARM", "--python", "3.12", "--torch", "2.9.1",
                  DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert r.rc == 1, r.err
    assert "backend for ARM cells: not cross -- cp312-manylinux_aarch64-torch2.9.1: no aarch64 " \
           "Python 3.12 sysroot" in r.err
    assert "ARM (aarch64) cells are not supported yet on this x86_64 host" in r.err
    assert "builder/cross/provision.sh" in r.err and "Traceback" not in r.err
    assert time.monotonic() - start < 30
    assert dist_state(tmp_path / "dist") == before


def test_cuda_only_arm_torch_fails_clearly_instead_of_verifying_against_another(
        tmp_path: Path) -> None:
    """The index's aarch64 torch 2.13.0 is a CUDA build: it cannot run under QEMU here, so the
    cell must fail before compiling, naming why and what would work."""
    before = seed_dist(tmp_path / "dist")
    r = run_build(tmp_path, "--arch", "ARM", "--python", "3.11", "--torch", "2.13.0",
                  DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert r.rc == 1, r.err
    assert "backend: cross -- auto:" in r.err
    assert "torch 2.13.0 for aarch64 on the index is a CUDA build" in r.err
    assert "cannot be verified here" in r.err and "--torch 2.9.1" in r.err
    assert "cp311-manylinux_aarch64-torch2.13.0] compile" not in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_no_torch_named_means_the_newest_verifiable_arm_torch_on_the_cross_path() -> None:
    """`make wheel ARCH=ARM PY=3.11`: the selection's newest torch (2.13.0) is a CUDA build for
    aarch64, so the cross path takes the newest CPU one instead, and says why. Reads the real
    wheels' metadata (cached after the first download)."""
    from builder.config.load import CliOverrides, load_settings  # noqa: PLC0415
    from builder.cross.default_torch import newest_verifiable  # noqa: PLC0415
    from builder.plan.cells import expand  # noqa: PLC0415

    matrix = expand(load_settings(CliOverrides(), {}).config).cells
    by_id = {c.identifier: c for c in matrix}
    chosen, note = newest_verifiable(by_id["cp311-manylinux_aarch64-torch2.13.0"], matrix)
    assert chosen.identifier == ARM_CELL
    assert note is not None and "torch 2.13.0 for aarch64 is a CUDA build" in note
    assert "name --torch 2.13.0" in note
    # A cell whose torch already is a CPU build is kept, without a note.
    assert newest_verifiable(by_id[ARM_CELL], matrix) == (by_id[ARM_CELL], None)
