"""One wheel for several cells (abi3), and nothing in dist/ replaced behind a cell's back.

Unit tests: which Pythons a wheel's tags serve; publish refuses to replace another cell's
wheel (or a file the manifest does not list) with other bytes, and the manifest keeps every
cell one file serves. Real: ``tests/builder/abi3ext`` (a ``py_limited_api`` torch extension)
cross-built for aarch64 cp39 in one run and then asked for cp311 in another, the issue's
scenario: the second run verifies the first run's ``cp39-abi3`` wheel under QEMU on Debian's
arm64 Python 3.11 and records it for cp311 too, without compiling; both cells are then up to
date. The cross path is the one with two Pythons for one torch here without a multi-GB
download (the index's x86_64 torch for another Python is a CUDA build): torch 2.8.0, the
last release with cp39, a CPU build for aarch64 (the cp39 sysroot and torch are the ones
test_cross_pythons.py uses).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers.pipelinelib import dist_state, manifest, run_build, seed_dist
from packaging.tags import Tag

from builder.config import BaseImage
from builder.errors import StepFailed
from builder.plan.cells import Cell
from builder.release.manifest import (
    ManifestEntry,
    publish_wheel,
    read_manifest,
    record_wheel,
    sha256_file,
)
from builder.release.shared import python_agnostic, serves, tag_serves

PROJECT = Path(__file__).resolve().parents[1] / "abi3ext"


def test_which_pythons_a_wheels_tags_serve() -> None:
    assert tag_serves(Tag("cp39", "abi3", "x"), "cp39") and tag_serves(
        Tag("cp39", "abi3", "x"), "cp313"
    )
    assert not tag_serves(Tag("cp311", "abi3", "x"), "cp310")
    assert tag_serves(Tag("cp311", "cp311", "x"), "cp311")
    assert not tag_serves(Tag("cp311", "cp311", "x"), "cp312")
    assert tag_serves(Tag("py3", "none", "x"), "cp312")
    assert python_agnostic("a-1-cp39-abi3-manylinux_2_24_x86_64.whl")
    assert not python_agnostic("a-1-cp311-cp311-manylinux_2_24_x86_64.whl")


def test_serves_needs_the_cells_python_and_machine() -> None:
    name = "a-1+torch2.8-cp39-abi3-manylinux_2_24_aarch64.whl"
    cells = {c.identifier: c for c in _cells()}
    assert serves(name, cells["cp311-manylinux_aarch64-torch2.8.0"])
    assert not serves(name, cells["cp311-manylinux_x86_64-torch2.8.0"])


def _cells() -> list[Cell]:
    image = BaseImage(
        ref="x",
        family="manylinux",
        plat="manylinux_2_28",
        python_path="/opt/python/{cp}-{cp}/bin/python",
    )
    return [
        Cell(arch=arch, python=py, torch="2.8.0", image=image)
        for arch in ("X86", "ARM")
        for py in ("3.9", "3.11")
    ]


def _entry(wheel: Path, cell: str) -> ManifestEntry:
    return ManifestEntry.for_wheel(
        wheel,
        cell=cell,
        torch="2.8.0",
        python="3.9",
        base_image="x",
        compiler="g++",
        builder_version="0",
        started_at="t0",
        finished_at="t1",
    )


def test_publish_never_replaces_another_cells_wheel_with_other_bytes(tmp_path: Path) -> None:
    name = "abi3ext-0.0.1+torch2.8-cp39-abi3-manylinux_2_24_aarch64.whl"
    dist = tmp_path / "dist"
    first = tmp_path / "a" / name
    first.parent.mkdir()
    first.write_bytes(b"built for cp39")
    record_wheel(dist, _entry(publish_wheel(first, dist, cells=("cp39-x",)), "cp39-x"))
    before = dist_state(dist)

    other = tmp_path / "b" / name
    other.parent.mkdir()
    other.write_bytes(b"built again for cp311, other bytes")
    with pytest.raises(
        StepFailed,
        match=r"refusing to replace .*: it is the wheel of cp39-x "
        r"\(manifest.json\), with other bytes than the wheel "
        r"built for cp311-x; kept as it is",
    ):
        publish_wheel(other, dist, cells=("cp311-x",))
    assert dist_state(dist) == before
    # Same bytes: one file, one entry per cell it serves.
    same = tmp_path / "c" / name
    same.parent.mkdir()
    same.write_bytes(first.read_bytes())
    record_wheel(dist, _entry(publish_wheel(same, dist, cells=("cp311-x",)), "cp311-x"))
    assert [(w["cell"], w["file"]) for w in read_manifest(dist)["wheels"]] == [
        ("cp311-x", name),
        ("cp39-x", name),
    ]
    # Both cells rebuilt in one run may replace it; the entries with the old bytes go.
    record_wheel(dist, _entry(publish_wheel(other, dist, cells=("cp39-x", "cp311-x")), "cp39-x"))
    entries = read_manifest(dist)["wheels"]
    assert [w["cell"] for w in entries] == ["cp39-x"]
    assert entries[0]["sha256"] == sha256_file(dist / name)
    # A file the manifest does not list is not replaced either.
    stray = dist / "stray-1-cp39-abi3-manylinux_2_24_aarch64.whl"
    stray.write_bytes(b"put here by hand")
    newer = tmp_path / "d" / stray.name
    newer.parent.mkdir()
    newer.write_bytes(b"built")
    with pytest.raises(StepFailed, match=r"a file manifest\.json does not list"):
        publish_wheel(newer, dist, cells=("cp39-y",))
    assert stray.read_bytes() == b"put here by hand"


@pytest.mark.slow
def test_an_abi3_wheel_is_built_once_and_verified_on_every_python_it_serves(tmp_path: Path) -> None:
    seeded = seed_dist(tmp_path / "dist")
    project = tmp_path / "abi3ext"
    shutil.copytree(PROJECT, project)
    cp39, cp311 = "cp39-manylinux_aarch64-torch2.8.0", "cp311-manylinux_aarch64-torch2.8.0"
    common = ("--backend", "cross", "--arch", "ARM", "--torch", "2.8.0", "--project", str(project))
    first = run_build(tmp_path, *common, "--python", "3.9")
    assert first.rc == 0, first.err[-4000:]
    dist = tmp_path / "dist"
    (wheel,) = dist.glob("abi3ext-*.whl")
    assert re.fullmatch(
        r"abi3ext-0\.0\.1\+torch2\.8-cp39-abi3-manylinux_2_\d+_aarch64\.whl", wheel.name
    ), wheel.name
    built = wheel.read_bytes()

    # The scenario: the same out dir, the other Python, in a later run.
    second = run_build(tmp_path, *common, "--python", "3.11")
    assert second.rc == 0, second.err[-4000:]
    assert f"[{cp311}] compile" not in second.err, second.err
    assert f"[{cp311}] verify (qemu)" in second.err
    assert f"{wheel.name} (built by {cp39}) serves it: verified on Python 3.11" in second.err
    assert [p.name for p in dist.glob("abi3ext-*.whl")] == [wheel.name]
    assert wheel.read_bytes() == built
    entries = {w["cell"]: w for w in manifest(dist)["wheels"]}
    assert entries[cp39]["file"] == entries[cp311]["file"] == wheel.name
    assert entries[cp39]["sha256"] == entries[cp311]["sha256"] == sha256_file(wheel)
    assert entries[cp311]["extra"]["served_by"] == cp39
    assert "served_by" not in entries[cp39]["extra"]
    # Each Python really ran it: Debian's arm64 3.9 and 3.11 under QEMU imported the module.
    for cell in (cp39, cp311):
        report = entries[cell]["extra"]["verification"]
        assert report["ok"] is True and report["modules"] == ["abi3ext._C"], report
    assert all((dist / n).read_bytes() == seeded[n] for n in seeded if n.startswith("earlier-"))

    # Both cells, one run: each is up to date (neither "not built before"); nothing changes.
    before = dist_state(dist)
    both = run_build(tmp_path, *common, "--python", "3.9,3.11")
    assert both.rc == 0, both.err[-4000:]
    assert f"[{cp39}] up-to-date" in both.err and f"[{cp311}] up-to-date" in both.err, both.err
    assert dist_state(dist) == before
    print(json.dumps(entries[cp311]["extra"]["platform"]))
