"""`make wheel ARCH=X86 PY=3.11` for real: this repository's wheel built, repaired and verified
with both backends, and a second project through ``--project``.

Slow (each cell compiles the kernels and installs torch twice, from a local wheelhouse: the
index's x86_64 torch is a multi-GB CUDA build). The docker test runs against the real dockerd
with the base image built locally by ``builder.images.base_image`` (cached by content); under CI a
missing engine fails the test.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311, write_tiny_extension
from helpers.npulib import assert_npu_extra, expected_torch_npu, wheel_metadata
from helpers.pipelinelib import (
    CELL,
    AmpBuild,
    dist_state,
    hidden_leftovers,
    manifest,
    run_build,
    run_plan,
)

from builder.config import REPO_ROOT
from builder.engines.docker import CONTAINER_LABEL
from builder.wheel.wheelmeta import requires_dist

pytestmark = pytest.mark.slow


def _check_amp_wheel(dist: Path, backend: str, seeded: dict[str, bytes]) -> Path:
    (wheel,) = dist.glob("ampforge-*.whl")
    # torch 2.13 >= the stable ABI's 2.10 (pyproject.toml [tool.ampforge.stable-abi]): one
    # cp310-abi3 wheel with no +torch label, for every torch >= 2.10 and CPython >= 3.10.
    assert wheel.name.startswith("ampforge-") and "-cp310-abi3-manylinux_2_" in wheel.name, (
        wheel.name
    )
    assert "+torch" not in wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert [n for n in names if n.startswith("amp/_C") and n.endswith(".so")] == [
        "amp/_C.abi3.so"
    ], names
    assert "torch>=2.10" in requires_dist(wheel)
    assert not [n for n in names if "libtorch" in n or "libc10" in n or "libgomp" in n]
    _check_npu_extra(wheel, ">=2.10")
    doc = manifest(dist)
    entry = next(w for w in doc["wheels"] if w["cell"] == CELL)
    assert entry["file"] == wheel.name and entry["size"] == wheel.stat().st_size
    assert entry["torch"].startswith("2.13.0") and entry["python"] == "3.11"
    assert entry["extra"]["backend"] == backend and "amp._C" in entry["extra"]["modules"]
    assert entry["compiler"].startswith("g++")
    # Installs wherever its torch does: the achieved tag (the oldest in the name, recorded) is
    # no newer than torch 2.13.0's manylinux_2_28; with exp/log/pow bound to their oldest glibc
    # versions, the C++11 string ABI (GLIBCXX_3.4.21) is what sets it: manylinux_2_24.
    platform = entry["extra"]["platform"]
    assert platform["ceiling"] == "manylinux_2_28_x86_64" == entry["extra"]["resolved"]["plat"]
    assert platform["tag"] == entry["extra"]["tag"] == "manylinux_2_24_x86_64", wheel.name
    assert wheel.name.endswith("-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"), wheel.name
    assert platform["needs"]["GLIBC"] < "2.25" and platform["needs"]["GLIBCXX"] <= "3.4.22"
    assert entry["extra"]["resolved"]["torch_npu"] == expected_torch_npu("2.13.0", "3.11", "x86_64")
    # Audited before dist/: torch-abi-audit (STABLE, its minimum torch) and abi3audit --strict.
    assert entry["extra"]["stable_abi"] == {
        "min_torch": "2.10.0",
        "declared": "2.10",
        "modules": ["_C.abi3.so"],
        "checks": ["torch-abi-audit", "abi3audit --strict"],
    }
    assert entry["extra"]["resolved"]["wheel"] == "stable"
    # The earlier cell's wheel and manifest entry are still there.
    earlier = [n for n in seeded if n.startswith("earlier-")]
    assert all((dist / n).read_bytes() == seeded[n] for n in earlier)
    assert any(w["cell"].startswith("cp310") for w in doc["wheels"])
    # No partial or hidden file left behind.
    assert not hidden_leftovers(dist)
    return wheel


def _check_npu_extra(wheel: Path, spec: str | None = None) -> None:
    """The built wheel's METADATA: `pip install <wheel>[npu]` pins the torch-npu release that
    configs/support.yaml pairs with the cell (cp311, x86_64, torch 2.13.0), or for a stable
    wheel requires the range *spec* (pip pairs a torch-npu with the torch it installs)."""
    release = expected_torch_npu("2.13.0", "3.11", "x86_64")
    assert release, "the table pairs torch 2.13.0 with a torch-npu release: the extra must show"
    assert_npu_extra(wheel_metadata(wheel), release, spec)


@pytest.mark.docker
def test_docker_backend_builds_a_verified_wheel_of_this_repo(docker_amp_build: AmpBuild) -> None:
    engine = docker_engine()
    built, args = docker_amp_build, docker_amp_build.args
    r = built.run
    assert r.rc == 0, r.err[-4000:]
    assert f"backend for {CELL}: docker -- docker asked for (command line --backend)" in r.err
    wheel = _check_amp_wheel(built.dist, "docker", built.seeded)
    # The record the build executed is the one `plan` prints for the same options.
    (entry,) = [w for w in manifest(built.dist)["wheels"] if w["cell"] == CELL]
    drop = {
        "--wheelhouse",
        args[args.index("--wheelhouse") + 1],
        "--project",
        args[args.index("--project") + 1],
    }
    planned = run_plan(built.root, *[a for a in args if a not in drop], "--out", str(built.dist))
    assert entry["extra"]["resolved"] == planned[CELL]
    base = args[args.index("--base-image") + 1]
    assert planned[CELL]["base_image"] == base and planned[CELL]["base_image_id"]
    assert str(wheel) in r.out
    # The build's container is gone (every cell container carries the label and its project).
    mine = {"label": f"{CONTAINER_LABEL}.project=ampforge"}
    assert not engine.api.containers(all=True, filters=mine), "the build left its container"
    log = built.log
    # amp's test-command (pyproject.toml [tool.cibuildwheel]) ran in the verification venv.
    assert "+ test-command: python -m amp.selftest" in log
    assert "amp selftest: ok -- amp " in log
    # torch came from the cell's torch layer (made now or by an earlier build with the same
    # key): the verification venv found it installed instead of installing it again.
    layer = entry["extra"]["torch_image"]
    assert layer.startswith(f"ampforge/torch:{CELL}-") and engine.image_id(layer)
    assert f"torch layer {layer} is up to date" in log or (f"into a new layer {layer} (" in log), (
        log[:3000]
    )
    assert "Requirement already satisfied: torch==2.13.0" in log

    # Nothing changed: recognised as up to date from the manifest, without building.
    before = dist_state(built.dist)
    start = time.monotonic()
    again = run_build(built.root, *args)
    took = time.monotonic() - start
    assert again.rc == 0, again.err
    assert f"[{CELL}] up-to-date (" in again.err, again.err
    assert "] compile (" not in again.err and "] image (" not in again.err
    assert dist_state(built.dist) == before
    print(f"up-to-date check took {took:.1f}s")  # the benchmark reports it; no timed assert


def test_host_backend_builds_a_verified_wheel_of_this_repo(host_amp_build: AmpBuild) -> None:
    built = host_amp_build
    r = built.run
    assert r.rc == 0, r.err[-4000:]
    assert f"backend for {CELL}: host -- host asked for (command line --backend)" in r.err
    _check_amp_wheel(built.dist, "host", built.seeded)
    # amp's test-command (pyproject.toml [tool.cibuildwheel]) ran in the verification venv.
    assert "+ test-command: python -m amp.selftest" in built.log
    assert "amp selftest: ok -- amp " in built.log
    (entry,) = [w for w in manifest(built.dist)["wheels"] if w["cell"] == CELL]
    planned = run_plan(
        built.root,
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--out",
        str(built.dist),
    )
    assert entry["extra"]["resolved"] == planned[CELL]


def test_project_option_builds_another_extension_project(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "tinyext-src")
    # This project knows nothing of AMP_LOCAL_VERSION: the label comes from the pipeline.
    setup = project / "setup.py"
    setup.write_text(
        setup.read_text().replace('"0.0.1" + ("+" + local if local else "")', '"0.0.1"')
    )
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    assert r.rc == 0, r.err[-4000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_")
    # Another project gets no npu extra unless it asks ([tool.ampforge] npu-extra = true):
    # torch-npu is this repository's pairing, not every extension's dependency.
    assert_npu_extra(wheel_metadata(wheel), None)
    assert "torch==2.13.*" in requires_dist(wheel)  # a header field, though it has no body
    entry = manifest(tmp_path / "dist")["wheels"][0]
    assert entry["extra"]["modules"] == ["tinyext._C"] and entry["extra"]["project"] == (
        "tinyext-src"
    )


def test_matrix_builds_what_this_host_can_and_names_the_runner_for_the_rest(tmp_path: Path) -> None:
    """`make matrix` (build --all --keep-going): the cells this host can build are built; the
    others are listed apart from failures with the runner they need, and the exit code is 0;
    --strict makes them an error."""
    project = write_tiny_extension(tmp_path / "tinyext-src")
    cfg = tmp_path / "matrix.yaml"
    cfg.write_text(
        f"support: {REPO_ROOT / 'configs' / 'support.yaml'}\n"
        "matrix:\n  arch: [X86, ARM]\n  python: ['3.11']\n  torch: ['2.13.0']\n"
    )
    args = (
        "--all",
        "--keep-going",
        "--config",
        str(cfg),
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    r = run_build(tmp_path, *args)
    assert r.rc == 0, r.err[-4000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert "-cp311-cp311-manylinux_" in wheel.name and wheel.name.endswith("_x86_64.whl")
    assert "not built here (1 cell, each needs a native runner; not failures):" in r.err
    arm = "cp311-manylinux_aarch64-torch2.13.0"
    assert f"  {arm}  runner ubuntu-24.04-arm: host asked for (command line --backend)" in r.err
    assert f"error: {arm}" not in r.err
    # --strict: the same, but a cell this host cannot build is an error; nothing is rebuilt.
    strict = run_build(tmp_path, *args, "--strict")
    assert strict.rc == 1, strict.err[-4000:]
    assert "up-to-date" in strict.err and ", but --strict" in strict.err
    assert [p.name for p in (tmp_path / "dist").glob("*.whl")] == [wheel.name]
