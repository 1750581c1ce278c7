"""Offline builds without an engine: the pre-flight (``builder.offline.preflight``) on real wheel
files,
bundle verification (``builder.offline.bundle``), and the ``build``/``fetch``/``make`` front doors
failing early and by name. Fast (seconds): the wheels here are small but real zip files with
METADATA; the end-to-end fetch + offline builds (docker and host, in a network namespace) are
in test_airgapped.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from helpers.pipelinelib import builder_env

from builder.config import REPO_ROOT
from builder.errors import ConfigError
from builder.offline.bundle import (
    WHEELS_DIR,
    Bundle,
    BundleCell,
    begin_fetch,
    describe_file,
    read_bundle,
    verify_bundle,
    write_bundle,
)
from builder.offline.preflight import (
    Target,
    cell_requirements,
    describe_missing,
    index_wheelhouse,
    resolve,
)

X86_311 = Target("3.11", "x86_64", "manylinux_2_28_x86_64", "cp311-manylinux_x86_64-torch2.13.0")
TORCH_DEPS = [
    "filelock",
    "sympy>=1.13.3",
    'typing-extensions>=4.10.0; python_version >= "3.9"',
    'legacy-shim; python_version < "3.10"',  # only for old Pythons: must not be needed here
    "fsspec[http]",
    'nvidia-only; platform_machine == "aarch64"',
]


def make_wheel(folder: Path, filename: str, requires: list[str] = ()) -> Path:
    """A real (tiny) wheel: a zip whose .dist-info/METADATA carries *requires*."""
    name, version = filename.split("-")[:2]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        zf.writestr(f"{name}/__init__.py", "")
    return path


def full_wheelhouse(
    folder: Path, torch_name: str = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
) -> Path:
    make_wheel(folder, torch_name, TORCH_DEPS)
    make_wheel(folder, "filelock-3.20.0-py3-none-any.whl")
    make_wheel(folder, "sympy-1.14.0-py3-none-any.whl", ["mpmath>=1.1.0,<1.4"])
    make_wheel(folder, "mpmath-1.3.0-py3-none-any.whl")
    make_wheel(folder, "typing_extensions-4.16.0-py3-none-any.whl")
    make_wheel(folder, "fsspec-2026.9.0-py3-none-any.whl", ['aiohttp; extra == "http"'])
    make_wheel(folder, "aiohttp-3.13.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    make_wheel(folder, "setuptools-80.0.0-py3-none-any.whl")
    make_wheel(folder, "wheel-0.45.0-py3-none-any.whl")
    return folder


def check(folder: Path, target: Target = X86_311, torch: str = "2.13.0"):
    return resolve(index_wheelhouse(folder), target, cell_requirements(torch))


# ------------------------------------------------------------------ pre-flight


def test_complete_wheelhouse_passes_with_markers_and_extras_for_the_target(tmp_path: Path):
    result = check(full_wheelhouse(tmp_path))
    assert result.ok, describe_missing(result, "x")
    assert sorted(result.chosen) == [
        "aiohttp",
        "filelock",
        "fsspec",
        "mpmath",
        "setuptools",
        "sympy",
        "torch",
        "typing-extensions",
        "wheel",
    ]
    assert str(result.chosen["torch"].version) == "2.13.0+cpu"


def test_missing_torch_is_named_with_version_python_and_platform(tmp_path: Path):
    folder = full_wheelhouse(tmp_path)
    next(folder.glob("torch-*.whl")).unlink()
    msg = describe_missing(check(folder), f"offline bundle {folder}")
    assert msg == (
        f"offline bundle {folder} lacks torch==2.13.0 for cp311 "
        "manylinux_2_28_x86_64 (cell cp311-manylinux_x86_64-torch2.13.0)"
    )


def test_torch_for_another_platform_is_named_as_unusable(tmp_path: Path):
    folder = full_wheelhouse(
        tmp_path, torch_name="torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    )
    msg = describe_missing(check(folder), "offline bundle B")
    assert msg.startswith("offline bundle B lacks torch==2.13.0 for cp311 manylinux_2_28_x86_64")
    assert (
        "present but not usable there: torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    ) in msg


def test_torch_for_another_python_is_named(tmp_path: Path):
    folder = full_wheelhouse(tmp_path)
    cp312 = Target("3.12", "x86_64", "manylinux_2_28_x86_64", "cp312-manylinux_x86_64-torch2.13.0")
    result = check(folder, cp312)
    assert [m.requirement for m in result.missing] == ["torch==2.13.0"]
    assert "lacks torch==2.13.0 for cp312 manylinux_2_28_x86_64 (cell cp312-" in (
        describe_missing(result, "B")
    )


def test_wrong_torch_version_and_newer_glibc_are_both_refused(tmp_path: Path):
    folder = full_wheelhouse(tmp_path)
    assert [m.requirement for m in check(folder, torch="2.9.1").missing] == ["torch==2.9.1"]
    # The base image's glibc (2.17) is older than the torch wheel's policy (2.28).
    old_glibc = Target("3.11", "x86_64", "manylinux_2_17_x86_64", "c")
    assert [m.requirement for m in check(folder, old_glibc).missing] == ["torch==2.13.0"]
    # A newer glibc takes older policies (2_28 wheel on a 2_36 base).
    assert check(folder, Target("3.11", "x86_64", "manylinux_2_36_x86_64", "c")).ok


def test_missing_dependency_from_torch_metadata_names_who_needs_it(tmp_path: Path):
    folder = full_wheelhouse(tmp_path)
    (folder / "sympy-1.14.0-py3-none-any.whl").unlink()
    make_wheel(folder, "sympy-1.12-py3-none-any.whl")
    msg = describe_missing(check(folder), "B")
    assert msg == (
        "B lacks sympy>=1.13.3 for cp311 manylinux_2_28_x86_64 (cell "
        "cp311-manylinux_x86_64-torch2.13.0), required by torch 2.13.0+cpu; present "
        "but not usable there: sympy-1.12-py3-none-any.whl"
    )


def test_markers_are_evaluated_for_the_target_python_not_this_host(tmp_path: Path):
    folder = full_wheelhouse(
        tmp_path, torch_name="torch-2.13.0-cp39-cp39-manylinux_2_28_x86_64.whl"
    )
    make_wheel(folder, "aiohttp-3.13.0-cp39-cp39-manylinux_2_17_x86_64.whl")
    cp39 = Target("3.9", "x86_64", "manylinux_2_28_x86_64", "cp39-manylinux_x86_64-torch2.13.0")
    result = check(folder, cp39)
    assert [m.requirement for m in result.missing] == ["legacy-shim"]
    make_wheel(folder, "legacy_shim-1.0-py3-none-any.whl")
    assert check(folder, cp39).ok


def test_project_requirements_join_the_cells(tmp_path: Path):
    assert cell_requirements("2.13.0") == ["torch==2.13.0", "setuptools", "wheel"]
    reqs = cell_requirements("2.13.0", REPO_ROOT)
    assert reqs[:3] == ["torch==2.13.0", "setuptools", "wheel"]
    # The project's own build requirements and dependencies follow (pyproject.toml, the one
    # place they live), torch's bound among them.
    doc = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    declared = [*doc["build-system"]["requires"], *doc["project"]["dependencies"]]
    assert [r for r in declared if r.startswith("torch>=")], declared
    assert set(declared) <= set(reqs), (declared, reqs)


# ------------------------------------------------------------------ bundle verification


def small_bundle(root: Path) -> Bundle:
    full_wheelhouse(root / WHEELS_DIR)
    files = [
        describe_file(root, f"{WHEELS_DIR}/{p.name}", ["c1"])
        for p in sorted((root / WHEELS_DIR).glob("*.whl"))
    ]
    bundle = Bundle(
        root=root,
        files=files,
        cells=[BundleCell("c1", "X86", "3.11", "x86_64", "manylinux_2_28_x86_64", "2.13.0", "img")],
    )
    write_bundle(bundle)
    return bundle


def test_bundle_round_trips_and_verifies(tmp_path: Path):
    small_bundle(tmp_path)
    again = read_bundle(tmp_path)
    verify_bundle(again)
    assert len(again.files) == 9 and again.cells[0].plat == "manylinux_2_28_x86_64"
    doc = json.loads((tmp_path / "bundle.json").read_text())
    torch = next(f for f in doc["files"] if f["path"].startswith("wheels/torch-"))
    assert torch["size"] == (tmp_path / torch["path"]).stat().st_size and len(torch["sha256"]) == 64


@pytest.mark.parametrize("damage", ["tamper", "missing", "unlisted"])
def test_damaged_bundle_names_the_file(tmp_path: Path, damage: str):
    small_bundle(tmp_path)
    target = tmp_path / WHEELS_DIR / "sympy-1.14.0-py3-none-any.whl"
    if damage == "tamper":
        data = bytearray(target.read_bytes())
        data[10] ^= 0xFF  # same size, other bytes
        target.write_bytes(bytes(data))
        expect = f"{target} does not match its sha256 in bundle.json"
    elif damage == "missing":
        target.unlink()
        expect = f"{target} is missing"
    else:
        target = make_wheel(tmp_path / WHEELS_DIR, "evil-1.0-py3-none-any.whl")
        expect = f"{target} is not listed in bundle.json"
    with pytest.raises(ConfigError) as info:
        verify_bundle(read_bundle(tmp_path))
    assert expect in info.value.message and info.value.return_code == 2


@pytest.mark.promise(
    promise="a bundle from another machine is read only inside itself",
    fault="bundle.json listing a path that climbs out of the bundle (with that file's true "
    "sha256), a wheel that is a symlink or a hard link to a file outside, a FIFO, an "
    "image whose tarball is not a listed file",
    result="exit 2 naming the entry; nothing read from outside the bundle, nothing built",
)
@pytest.mark.parametrize(
    "hostile", ["traversal", "absolute", "symlink", "hardlink", "fifo", "image"]
)
def test_a_bundle_that_points_outside_itself_is_refused(tmp_path: Path, hostile: str):
    root = tmp_path / "B"
    small_bundle(root)
    doc = json.loads((root / "bundle.json").read_text())
    outside = make_wheel(tmp_path / "elsewhere", "evil-1.0-py3-none-any.whl")
    sha = hashlib.sha256(outside.read_bytes()).hexdigest()
    entry = {"path": "", "sha256": sha, "size": outside.stat().st_size, "cells": ["c1"]}
    target = root / WHEELS_DIR / "sympy-1.14.0-py3-none-any.whl"
    if hostile in ("traversal", "absolute"):
        entry["path"] = (
            "wheels/../../elsewhere/" + outside.name if hostile == "traversal" else str(outside)
        )
        doc["files"].append(entry)
        expect = f"bundle.json lists {entry['path']!r}: not a path inside the bundle"
    elif hostile in ("symlink", "hardlink", "fifo"):
        shutil.copy2(target, outside)  # the same bytes: its sha256 still matches
        target.unlink()
        if hostile == "symlink":
            target.symlink_to(outside)
            expect = f"{target} is a symbolic link"
        elif hostile == "hardlink":
            os.link(outside, target)
            expect = f"{target} is a hard link (2 names)"
        else:
            os.mkfifo(target)
            expect = f"{target} is not a regular file"
    else:
        doc["images"].append(
            {
                "ref": "evil:1",
                "image_id": "sha256:0",
                "file": "../evil.tar",
                "arch": "X86",
                "cells": ["c1"],
            }
        )
        expect = "image evil:1: its file '../evil.tar' is not a listed file of bundle.json"
    (root / "bundle.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        verify_bundle(read_bundle(root))
    assert expect in info.value.message and info.value.return_code == 2, info.value.message


def test_refetch_removes_bundle_json_first(tmp_path: Path):
    """An interrupted fetch leaves no bundle.json that could describe other files."""
    small_bundle(tmp_path)
    old = begin_fetch(tmp_path)
    assert not (tmp_path / "bundle.json").exists()
    assert old[f"{WHEELS_DIR}/filelock-3.20.0-py3-none-any.whl"]
    with pytest.raises(ConfigError, match=r"bundle\.json not found.*interrupted"):
        read_bundle(tmp_path)


# ------------------------------------------------------------------ front doors


def run_builder(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "builder", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=builder_env(**env),
        timeout=300,
    )


def test_build_with_tampered_bundle_exits_2_before_building(tmp_path: Path):
    small_bundle(tmp_path / "B")
    victim = tmp_path / "B" / WHEELS_DIR / "wheel-0.45.0-py3-none-any.whl"
    victim.write_bytes(victim.read_bytes() + b"x")
    r = run_builder(
        tmp_path,
        "build",
        "--offline",
        "--bundle",
        "B",
        "--backend",
        "host",
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert r.returncode == 2, r.stderr
    assert f"{victim} has {victim.stat().st_size} bytes, bundle.json says" in r.stderr
    assert not (tmp_path / "dist").exists()


def test_build_preflight_names_missing_torch_before_compiling(tmp_path: Path):
    bundle = small_bundle(tmp_path / "B")
    # A bundle made for another Python: valid, verified, but no cp312 torch.
    r = run_builder(
        tmp_path,
        "build",
        "--bundle",
        "B",
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.12",
        "--torch",
        "2.13.0",
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert r.returncode == 2, r.stderr
    assert "note: a bundle is for offline builds" in r.stderr
    assert f"offline bundle {bundle.root} lacks torch==2.13.0 for cp312 manylinux_2_" in r.stderr, (
        r.stderr
    )
    assert "(cell cp312-manylinux_x86_64-torch2.13.0)" in r.stderr
    assert "] compile" not in r.stderr and not (tmp_path / "dist").exists()


def test_make_wheel_offline_passes_the_bundle(tmp_path: Path):
    small_bundle(tmp_path / "B")
    (tmp_path / "B" / WHEELS_DIR / "mpmath-1.3.0-py3-none-any.whl").unlink()
    env = {k: v for k, v in builder_env().items() if k not in ("MAKEFLAGS", "BUNDLE")}
    # -o builder-env: this test checks the wheel target only, never (re)installs .venv.
    r = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            "builder-env",
            "wheel",
            "OFFLINE=1",
            f"BUNDLE={tmp_path / 'B'}",
            "BACKEND=host",
            f"OUT={tmp_path / 'dist'}",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert "mpmath-1.3.0-py3-none-any.whl is missing" in r.stderr


def test_fetch_that_fails_leaves_no_bundle_json(tmp_path: Path):
    small_bundle(tmp_path / "B")
    # pip with no index and no configuration at all cannot find torch: the fetch fails.
    r = run_builder(
        tmp_path,
        "fetch",
        "--bundle",
        "B",
        "--no-images",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--pip-arg=--isolated",
        "--pip-arg=--no-index",
    )
    assert r.returncode == 1, r.stderr
    assert "pip download for cp311-manylinux_x86_64-torch2.13.0 failed" in r.stderr
    assert not (tmp_path / "B" / "bundle.json").exists()
    r = run_builder(tmp_path, "build", "--bundle", "B", "--backend", "host", "--out", "dist")
    assert r.returncode == 2 and "bundle.json not found" in r.stderr, r.stderr


def test_fetch_needs_a_bundle_folder(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "BUNDLE"}
    r = subprocess.run(
        [sys.executable, "-m", "builder", "fetch", "--no-images"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert r.returncode == 2 and "expected --bundle DIR" in r.stderr, r.stderr


def test_offline_wheelhouse_without_bundle_is_preflighted_too(tmp_path: Path):
    full_wheelhouse(tmp_path / "wh")
    r = run_builder(
        tmp_path,
        "build",
        "--offline",
        "--wheelhouse",
        "wh",
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.9.1",
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert r.returncode == 2, r.stderr
    # The host backend's wheels install on this host: its glibc is the platform checked.
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1].replace(".", "_")
    assert (
        f"wheelhouse {tmp_path / 'wh'} lacks torch==2.9.1 for cp311 manylinux_{glibc}_x86_64 "
        "(cell cp311-manylinux_x86_64-torch2.9.1)"
    ) in r.stderr, r.stderr
    assert "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl" in r.stderr


def test_config_offline_bundle_is_relative_to_the_config_file(tmp_path: Path):
    small_bundle(tmp_path / "conf" / "B")
    (tmp_path / "conf" / "B" / "bundle.json").unlink()
    (tmp_path / "conf" / "matrix.yaml").write_text(
        f"support: {REPO_ROOT / 'configs' / 'support.yaml'}\n"
        "matrix:\n  arch: [X86]\n  python: ['3.11']\n  torch: ['2.13.0']\n"
        "offline:\n  bundle: B\n"
    )
    r = run_builder(
        tmp_path, "build", "--config", "conf/matrix.yaml", "--backend", "host", "--out", "dist"
    )
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'conf' / 'B' / 'bundle.json'} not found" in r.stderr, r.stderr


def test_offline_cross_cell_needs_its_host_torch_in_the_wheelhouse(tmp_path: Path):
    """A cross cell's project build runs on this host in a torch environment of its own
    (cross_host_torch): offline, the wheelhouse must hold that torch for this host's Python,
    and pre-flight names it before anything is downloaded or compiled."""
    full_wheelhouse(tmp_path / "wh", "torch-2.8.0-cp39-cp39-manylinux_2_28_aarch64.whl")
    r = run_builder(
        tmp_path,
        "build",
        "--offline",
        "--wheelhouse",
        "wh",
        "--backend",
        "cross",
        "--arch",
        "ARM",
        "--python",
        "3.9",
        "--torch",
        "2.8.0",
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert r.returncode == 2, r.stderr
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1].replace(".", "_")
    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    assert (
        f"wheelhouse {tmp_path / 'wh'} lacks torch==2.13.0 for cp{py} manylinux_{glibc}_"
        "x86_64 (cell host torch of cp39-manylinux_aarch64-torch2.8.0)"
    ) in r.stderr, r.stderr
    assert "] compile" not in r.stderr and not (tmp_path / "dist").exists()
