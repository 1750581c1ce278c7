"""ARM (aarch64) cells through `python -m builder build` on this x86_64 host: the cross backend.

The real CLI in a subprocess, the real toolchain, sysroot, aarch64 torch and QEMU (builder.cross);
nothing is mocked. Warm caches (~/.cache/ampforge): the full build ~1.5-2 min (compile ~55 s,
emulated verification ~35 s); the other tests take seconds. Cold, the first run downloads the
aarch64 torch wheels (2.9.1 ~100 MB, 2.13.0 ~430 MB) and the Debian arm64 Python once.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
from helpers.npulib import assert_npu_extra, expected_torch_npu, wheel_metadata
from helpers.pipelinelib import (
    dist_state,
    hidden_leftovers,
    manifest,
    run_build,
    run_plan,
    seed_dist,
    snapshot_of_this_repo,
)

ARM_CELL = "cp311-manylinux_aarch64-torch2.9.1"


def _no_hidden_leftovers(dist: Path) -> None:
    assert not hidden_leftovers(dist)


@pytest.mark.slow
def test_cross_backend_builds_a_verified_arm_wheel_and_auto_reuses_it(tmp_path: Path) -> None:
    seeded = seed_dist(tmp_path / "dist")
    project = snapshot_of_this_repo(tmp_path / "ampforge")
    args = ("--arch", "ARM", "--python", "3.11", "--torch", "2.9.1", "--project", str(project))
    r = run_build(tmp_path, *args, "--backend", "cross")
    assert r.rc == 0, r.err[-4000:]
    assert f"backend for {ARM_CELL}: cross -- cross asked for (command line --backend)" in r.err
    for step in ("compile", "repair", "verify (qemu)", "publish"):
        assert f"[{ARM_CELL}] {step}" in r.err, r.err  # progress lines, one per step
    dist = tmp_path / "dist"
    (wheel,) = dist.glob("ampforge-*.whl")
    assert re.fullmatch(
        r"ampforge-[^-]+\+torch2\.9-cp311-cp311-manylinux_2_\d+_aarch64\.whl", wheel.name
    ), wheel.name
    assert str(wheel) in r.out
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "amp/_C.cpython-311-aarch64-linux-gnu.so" in names, names
    assert not [n for n in names if "libtorch" in n or "libc10" in n or "libgomp" in n]
    # The cross path's project labels its own version: the npu extra is still written.
    release = expected_torch_npu("2.9.1", "3.11", "aarch64")
    assert release, "the table pairs torch 2.9.1 with a torch-npu release: the extra must show"
    assert_npu_extra(wheel_metadata(wheel), release)

    entry = next(w for w in manifest(dist)["wheels"] if w["cell"] == ARM_CELL)
    assert entry["file"] == wheel.name and entry["size"] == wheel.stat().st_size
    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry["torch"] == "2.9.1+cpu" and entry["python"] == "3.11"
    assert entry["compiler"].startswith("aarch64-linux-gnu-g++ ")
    assert entry["started_at"] <= entry["finished_at"]
    extra = entry["extra"]
    assert extra["backend"] == "cross" and extra["modules"] == ["amp._C"]
    # The record the build executed is the one `plan` prints for the same options.
    planned = run_plan(tmp_path, *args[:6], "--backend", "cross", "--out", str(dist))
    assert extra["resolved"] == planned[ARM_CELL]
    assert extra["tag"] in wheel.name and len(extra["input_key"]) == 64
    # No newer than torch's manylinux_2_28_aarch64: the libm floor and the target torch's C++
    # standard (C++17 for 2.9: no GCC 11 string members) leave the C++11 string ABI in charge.
    assert extra["platform"]["ceiling"] == "manylinux_2_28_aarch64"
    assert extra["platform"]["tag"] == extra["tag"] == "manylinux_2_24_aarch64", wheel.name
    # The emulated aarch64 run: the module imported, then amp's own test-command (pyproject's
    # [tool.cibuildwheel]) ran there: the fused kernels trained and matched the reference.
    report = extra["verification"]
    assert report["ok"] is True and report["torch"] == "2.9.1+cpu"
    assert report["test"]["command"] == "python -m amp.selftest", report
    assert report["test"]["tail"][-1].startswith("amp selftest: ok -- amp "), report
    assert "with torch 2.9.1+cpu, amp._C" in report["test"]["tail"][-1], report
    # The earlier cell survived; nothing partial left behind.
    assert all((dist / n).read_bytes() == seeded[n] for n in seeded if n.startswith("earlier-"))
    _no_hidden_leftovers(dist)

    # auto on this host picks cross for the ARM cell (and says why), and the unchanged inputs
    # are recognised from the manifest without compiling.
    before = dist_state(dist)
    r = run_build(
        tmp_path, *args, "--backend", "auto", DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock"
    )
    assert r.rc == 0, r.err[-4000:]
    assert f"backend for {ARM_CELL}: cross -- auto: x86_64 host, aarch64 cell" in r.err
    assert f"[{ARM_CELL}] compile" not in r.err and "up-to-date" in r.err, r.err
    assert dist_state(dist) == before


def test_cross_backend_refuses_pythons_without_a_sysroot_quickly(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    cell = "cp312-manylinux_aarch64-torch2.9.1"
    r = run_build(
        tmp_path, "--arch", "ARM", "--python", "3.12", "--torch", "2.9.1", BUILDER_BACKEND="cross"
    )  # the environment variable selects it like --backend
    assert r.rc == 1, r.err
    assert (
        f"error: {cell} cannot be built on this x86_64 host: cross asked for "
        "(environment BUILDER_BACKEND): no aarch64 Python 3.12 sysroot" in r.err
    )
    assert "(cross Pythons: 3.9, 3.11, 3.13)" in r.err
    assert "a native aarch64 runner, label ubuntu-24.04-arm" in r.err
    assert "Traceback" not in r.err
    # auto: this host cannot build it either way, and says why each way cannot.
    r = run_build(
        tmp_path,
        "--arch",
        "ARM",
        "--python",
        "3.12",
        "--torch",
        "2.9.1",
        DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock",
    )
    assert r.rc == 1, r.err
    assert f"error: {cell} cannot be built on this x86_64 host: auto: not buildable" in r.err
    assert "cross: no aarch64 Python 3.12 sysroot" in r.err
    assert "emulated: no container engine answers" in r.err or "emulated: no aarch64" in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_cuda_only_arm_torch_fails_clearly_instead_of_verifying_against_another(
    tmp_path: Path,
) -> None:
    """The index's aarch64 torch 2.13.0 is a CUDA build: it cannot run under QEMU here, so the
    cell must fail before compiling, naming why and what would work."""
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path,
        "--arch",
        "ARM",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock",
    )
    assert r.rc == 1, r.err
    assert "cross: torch 2.13.0 for aarch64 is a CUDA build (per configs/support.yaml)" in r.err
    assert "cannot be imported under qemu-aarch64" in r.err
    assert "a native aarch64 runner" in r.err
    assert "cp311-manylinux_aarch64-torch2.13.0] compile" not in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_no_torch_named_means_the_newest_arm_torch_this_host_can_build(tmp_path: Path) -> None:
    """`make wheel ARCH=ARM PY=3.11`: the matrix's newest torch (2.13.0) is a CUDA build for
    aarch64 (configs/support.yaml), so no way on this host can verify it; the resolver takes the
    newest this host can build, says why -- and `plan` and `build` say the same."""
    args = ("--arch", "ARM", "--python", "3.11")
    planned = run_plan(tmp_path, *args, "--out", str(tmp_path / "dist"))  # as run_build's
    assert list(planned) == [ARM_CELL]
    record = planned[ARM_CELL]
    assert record["torch"] == "2.9.1" and record["backend"] == "cross"
    assert record["buildable_here"] is True and record["runner"] == "this host"
    assert "newer 2.13.0 cannot be built here" in record["torch_reason"]
    assert "name --torch 2.13.0" in record["torch_reason"]
    dry = run_build(tmp_path, *args, "--dry-run")
    assert dry.rc == 0, dry.err
    assert {c["id"]: c for c in json.loads(dry.out)["cells"]} == planned
