"""The build front door's fast paths: backend choice, clear failures before any compile,
the +torchX.Y label, the input key. Each runs the real CLI in a subprocess (seconds)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine, write_tiny_extension
from helpers.pipelinelib import CELL, dist_state, run_build, seed_dist

from builder.errors import StepFailed
from builder.pipeline import tree_digest
from builder.wheel.localversion import add_local_version, with_local


def test_dead_engine_socket_is_a_clear_exit_1(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    dead = f"unix://{tmp_path}/no-engine.sock"
    r = run_build(tmp_path, "--backend", "docker", DOCKER_HOST=dead)
    assert r.rc == 1, r.err
    assert f"no container engine answers at {dead}" in r.err
    assert "BACKEND=host" in r.err  # says what to do next
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_auto_falls_back_to_host_and_says_why(tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/no-engine.sock"
    # A project that is not a project stops the build right after the backend is chosen.
    r = run_build(tmp_path, "--project", str(tmp_path), "--backend", "auto", DOCKER_HOST=dead)
    assert r.rc == 2 and "is not a Python project" in r.err
    (tmp_path / "p").mkdir()
    write_tiny_extension(tmp_path / "p" / "x")
    # The decision alone (--dry-run): this host's cell goes to the host backend, saying why.
    r = run_build(
        tmp_path,
        "--project",
        str(tmp_path / "p" / "x"),
        "--python",
        "3.11",
        "--arch",
        "X86",
        "--dry-run",
        DOCKER_HOST=dead,
    )
    assert r.rc == 0, r.err
    (record,) = json.loads(r.out)["cells"]
    assert record["backend"] == "host" and record["buildable_here"] is True
    assert record["backend_reason"].startswith("auto: local Python 3.11 at ")
    assert f"not docker: no container engine answers at {dead}" in record["backend_reason"]


def test_arm_cell_is_not_supported_yet_with_a_clear_message(tmp_path: Path) -> None:
    before = seed_dist(tmp_path / "dist")
    r = run_build(tmp_path, "--backend", "host", "--arch", "ARM", "--python", "3.9")
    assert r.rc == 1, r.err
    assert (
        "error: cp39-manylinux_aarch64-torch2.8.0 cannot be built on this x86_64 host: host "
        "asked for (command line --backend): the host backend builds x86_64 cells only"
    ) in r.err  # the selection resolved to a real cell
    assert "a native aarch64 runner, label ubuntu-24.04-arm" in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


@pytest.mark.docker
def test_missing_base_image_names_it_and_the_ways_out(tmp_path: Path) -> None:
    docker_engine()  # fails under CI when the engine is missing
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path, "--backend", "docker", "--base-image", "ampforge/none:missing", "--python", "3.11"
    )
    assert r.rc == 1, r.err
    assert "base image ampforge/none:missing" in r.err
    assert "python -m builder base-image" in r.err and "--backend host" in r.err
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    r = run_build(tmp_path, "--backend", "host", "--wheelhouse", str(tmp_path / "nope"))
    assert r.rc == 2 and "command line --find-links:" in r.err and "does not exist" in r.err
    r = run_build(tmp_path, BUILDER_BACKEND="podman")
    assert r.rc == 2 and "environment BUILDER_BACKEND: unknown backend 'podman'" in r.err


def test_default_selection_is_one_cell_for_this_host(tmp_path: Path) -> None:
    """`make wheel` with nothing named: this host's arch, the builder's Python, newest torch."""
    r = run_build(tmp_path, "--backend", "host", "--project", str(tmp_path))
    assert r.rc == 2 and "is not a Python project" in r.err  # stops before any build
    project = write_tiny_extension(tmp_path / "tinyext")
    r = run_build(tmp_path, "--backend", "host", "--project", str(project), "--dry-run")
    assert r.rc == 0, r.err
    notes = [line for line in r.err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].endswith(f"-> {CELL}"), r.err
    assert [c["id"] for c in json.loads(r.out)["cells"]] == [CELL]
    r = run_build(tmp_path, "--backend", "host", "--project", str(project), "--all", "--dry-run")
    assert r.rc == 0 and not [line for line in r.err.splitlines() if line.startswith("note:")]
    assert len(json.loads(r.out)["cells"]) > 1


# -- the +torchX.Y label ----------------------------------------------------------------------


def _wheel(path: Path, version: str, requires: str = "") -> Path:
    info = f"demo-{version}.dist-info"
    w = path / f"demo-{version}-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("demo/__init__.py", "x = 1\n")
        zf.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n"
            f"{requires}\nA description that mentions Requires-Dist: torch>=1\n",
        )
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")
    return w


def test_local_version_label_rewrites_name_metadata_and_record(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    labelled = add_local_version(_wheel(tmp_path, "1.2"), "torch2.13", out)
    assert labelled.name == "demo-1.2+torch2.13-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(labelled) as zf:
        names = zf.namelist()
        meta = zf.read("demo-1.2+torch2.13.dist-info/METADATA").decode()
        record = zf.read("demo-1.2+torch2.13.dist-info/RECORD").decode()
    assert "Version: 1.2+torch2.13" in meta
    assert "Requires-Dist: torch==2.13.*\n" in meta  # none declared: the pin is added
    assert not [n for n in names if n.startswith("demo-1.2.dist-info")]
    assert "demo/__init__.py,sha256=" in record and "METADATA,sha256=" in record
    # Already labelled: untouched; an existing local label gets ours appended.
    assert add_local_version(labelled, "torch2.13", out) == labelled
    assert with_local("1.0+abc", "torch2.13") == "1.0+abc.torch2.13"
    with pytest.raises(StepFailed, match="not valid"):
        with_local("1.0", "torch 2.13")


def test_input_key_ignores_build_outputs_but_sees_sources(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "p")
    first = tree_digest(project)
    (project / "build").mkdir()
    (project / "build" / "junk.o").write_bytes(b"x")
    (project / "tinyext" / "__pycache__").mkdir()
    assert tree_digest(project) == first
    (project / "tinyext" / "ext.cpp").write_text("// changed\n")
    assert tree_digest(project) != first


def test_torch_label_pins_the_torch_requirement(tmp_path: Path) -> None:
    """A binary built against torch X.Y needs torch X.Y.*: a declared torch requirement is
    replaced (marker kept, others untouched, the description left alone), also when the
    project's own build already put the label in the version (the cross path does)."""
    out = tmp_path / "out"
    out.mkdir()
    requires = 'Requires-Dist: numpy>=1\nRequires-Dist: torch>=2.1; platform_system == "Linux"'
    labelled = add_local_version(_wheel(tmp_path, "1.2+torch2.9", requires), "torch2.9", out)
    assert labelled.parent == out  # rewritten although the version was already labelled
    with zipfile.ZipFile(labelled) as zf:
        meta = zf.read("demo-1.2+torch2.9.dist-info/METADATA").decode()
        record = zf.read("demo-1.2+torch2.9.dist-info/RECORD").decode()
    assert 'Requires-Dist: torch==2.9.*; platform_system == "Linux"' in meta
    assert "Requires-Dist: numpy>=1" in meta and "torch>=2.1" not in meta
    assert "mentions Requires-Dist: torch>=1" in meta
    assert "METADATA,sha256=" in record
    assert add_local_version(labelled, "torch2.9", tmp_path) == labelled  # pinned: as is
    # A label that names no torch series pins nothing.
    plain = add_local_version(_wheel(tmp_path, "2.0", "Requires-Dist: torch>=2"), "cpu", out)
    with zipfile.ZipFile(plain) as zf:
        assert "Requires-Dist: torch>=2\n" in zf.read("demo-2.0+cpu.dist-info/METADATA").decode()
