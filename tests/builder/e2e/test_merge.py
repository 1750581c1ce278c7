"""``merge``: the dist/ folders of several CI runners become one verified release.

Each runner's folder is what a build writes (real wheels, a manifest written by the manifest
module, each entry with its resolved record and the runner that built it); the wheels are the
small pure-Python ones of the index tests (no compiler), tagged and labelled as the cells'
wheels are. The release is then indexed per torch series and installed from with real pip, and
published to a real pypiserver.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli
from helpers.indexlib import clean_pip_env, fresh_venv, installed_version, make_wheel, pip_in
from test_publish import PASSWORD, USER, running_server

from builder.release.manifest import ManifestEntry, record_wheel, sha256_file

X86 = "cp311-manylinux_x86_64-torch2.13.0"
ARM = "cp311-manylinux_aarch64-torch2.9.1"
STABLE_BUILDER = "cp311-manylinux_x86_64-torch2.14.0"  # builds the abi3 wheel
STABLE_VERIFIER = "cp312-manylinux_x86_64-torch2.14.0"  # verifies it on its own Python


def _record(cell: str, local: str | None) -> dict[str, object]:
    """The fields of a resolved record merge reads (builder.plan.resolve.ResolvedCell)."""
    py, machine, torch = cell.split("-")
    cp = py
    return {
        "id": cell,
        "cp": cp,
        "python": f"{cp[2]}.{cp[3:]}",
        "torch": torch[5:],
        "machine": machine.split("_", 1)[1],
        "local_version": local,
    }


def _wheel(out: Path, cell: str, *, stable: bool = False, marker: str = "") -> Path:
    """The wheel *cell*'s build would make: +torchX.Y and its own cpXY tag, or (stable) one
    cp310-abi3 wheel requiring torch>=2.10."""
    py, machine, torch = cell.split("-")
    series = ".".join(torch[5:].split(".")[:2])
    plat = "manylinux_2_28_" + machine.split("_", 1)[1]
    if stable:
        return make_wheel(
            out,
            "fleetpkg",
            "1.0",
            tag=f"cp310-abi3-{plat}",
            requires_dist=["torch>=2.10"],
            requires_python=">=3.10" + marker,
        )
    return make_wheel(
        out,
        "fleetpkg",
        f"1.0+torch{series}",
        tag=f"{py}-{py}-{plat}",
        requires_dist=[f"torch=={series}.*"],
        requires_python=">=3.9" + marker,
    )


def _enter(
    dist: Path,
    wheel: Path,
    cell: str,
    runner: str,
    *,
    local: str | None,
    started: str = "2026-12-01T10:00:00Z",
    served_by: str | None = None,
) -> None:
    extra: dict[str, object] = {
        "resolved": _record(cell, local),
        "built_on": {
            "host": f"host-{runner}",
            "machine": "x86_64",
            "ci": "github",
            "runner": runner,
            "job": "42",
        },
    }
    if served_by:
        extra["served_by"] = served_by
    record_wheel(
        dist,
        ManifestEntry.for_wheel(
            wheel,
            cell=cell,
            torch=_record(cell, local)["torch"],
            python=str(_record(cell, local)["python"]),
            base_image="quay.io/pypa/manylinux_2_28",
            compiler="gcc-toolset-12",
            builder_version="0.1.0",
            started_at=started,
            finished_at=started,
            extra=extra,
        ),
    )


def runner_folders(root: Path) -> dict[str, Path]:
    """Four runners' dist/ as their artifacts: two labelled wheels, a stable-ABI wheel and the
    folder of the job that verified it (the same file, both cells' entries)."""
    folders = {
        name: root / f"dist-{cell}"
        for name, cell in (
            ("x86", X86),
            ("arm", ARM),
            ("builder", STABLE_BUILDER),
            ("verifier", STABLE_VERIFIER),
        )
    }
    _enter(folders["x86"], _wheel(folders["x86"], X86), X86, "GitHub Actions 1", local="torch2.13")
    _enter(
        folders["arm"], _wheel(folders["arm"], ARM), ARM, "GitHub Actions 2 (arm)", local="torch2.9"
    )
    stable = _wheel(folders["builder"], STABLE_BUILDER, stable=True)
    _enter(folders["builder"], stable, STABLE_BUILDER, "GitHub Actions 3", local=None)
    shutil.copytree(folders["builder"], folders["verifier"])  # download-artifact, then build
    _enter(
        folders["verifier"],
        folders["verifier"] / stable.name,
        STABLE_VERIFIER,
        "GitHub Actions 4",
        local=None,
        served_by=STABLE_BUILDER,
    )
    return folders


def _merge(*args: str | Path) -> tuple[int, str]:
    res = run_cli("merge", *(str(a) for a in args))
    return res.rc, res.out + res.err


def _state(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_merge_joins_the_runners_folders_and_index_pip_and_publish_take_the_release(
    tmp_path: Path,
) -> None:
    folders = runner_folders(tmp_path / "artifacts")
    release = tmp_path / "release"
    rc, out = _merge(*folders.values(), "--out", release)
    assert rc == 0, out
    wheels = sorted(p.name for p in release.glob("*.whl"))
    assert wheels == sorted({p.name for f in folders.values() for p in f.glob("*.whl")})
    assert len(wheels) == 3  # the stable wheel once, for both of its cells
    doc = json.loads((release / "manifest.json").read_text())
    entries = {w["cell"]: w for w in doc["wheels"]}
    assert sorted(entries) == sorted([X86, ARM, STABLE_BUILDER, STABLE_VERIFIER])
    for w in doc["wheels"]:
        assert w["sha256"] == sha256_file(release / w["file"])
    # Which runner built each wheel, and where merge found its entry.
    assert entries[ARM]["built_by"] == {
        "runner": "github runner GitHub Actions 2 (arm)",
        "sources": [f"dist-{ARM}"],
    }
    assert entries[STABLE_BUILDER]["built_by"] == {
        "runner": "github runner GitHub Actions 3",
        "sources": [f"dist-{STABLE_BUILDER}", f"dist-{STABLE_VERIFIER}"],
    }
    assert entries[STABLE_VERIFIER]["extra"]["served_by"] == STABLE_BUILDER
    # The manifest's own readers still read it: index checks every sha256 against it.
    assert f"{X86}: " in out and "(built by github runner GitHub Actions 1;" in out

    # Idempotent: again, and the release with one of its inputs, change nothing (not a byte,
    # not a timestamp).
    before = _state(release)
    for args in (list(folders.values()), [release, folders["arm"]], [folders["x86"]]):
        rc, out = _merge(*args, "--out", release)
        assert rc == 0 and "already up to date" in out, out
        assert _state(release) == before

    # index --per-torch: each series' page has its labelled wheel, the stable one where its
    # range admits the series; pip installs from it.
    index = tmp_path / "index"
    res = run_cli("index", str(release), "--per-torch", "--out", str(index))
    assert res.rc == 0, res.err
    assert "sha256 checked against manifest.json" in res.err
    pages = {
        p.parents[2].name: sorted(x.name for x in p.parent.glob("*.whl"))
        for p in index.glob("torch*/simple/fleetpkg/index.html")
    }
    assert pages == {
        "torch2.9": ["fleetpkg-1.0+torch2.9-cp311-cp311-manylinux_2_28_aarch64.whl"],
        "torch2.13": sorted(
            [
                "fleetpkg-1.0+torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl",
                "fleetpkg-1.0-cp310-abi3-manylinux_2_28_x86_64.whl",
            ]
        ),
    }
    # Without a torch >= 2.10 series, the stable wheel is on no page: said, not dropped quietly.
    partial = tmp_path / "partial"
    assert _merge(folders["arm"], folders["builder"], "--out", partial)[0] == 0
    res = run_cli("index", str(partial), "--per-torch", "--out", str(tmp_path / "index2"))
    assert res.rc == 0, res.err
    assert (
        "warning: fleetpkg-1.0-cp310-abi3-manylinux_2_28_x86_64.whl: on no per-torch page"
        in res.err
    ), res.err
    python = fresh_venv(tmp_path / "venv")
    r = pip_in(
        python,
        "install",
        "--no-deps",
        "--index-url",
        (index / "torch2.13" / "simple").as_uri(),
        "fleetpkg==1.0+torch2.13",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert installed_version(python, "fleetpkg") == "1.0+torch2.13"

    # publish: the release's wheels, checked against its manifest, reach the repository.
    with running_server(tmp_path / "pypiserver", "update") as server:
        res = run_cli(
            "publish",
            str(release),
            "--repository-url",
            server.url,
            env=clean_pip_env(TWINE_USERNAME=USER, TWINE_PASSWORD=PASSWORD),
        )
        assert res.rc == 0, res.out + res.err
        assert sorted(p.name for p in server.packages.glob("*.whl")) == wheels
        assert PASSWORD not in res.out + res.err


@pytest.mark.promise(
    promise="merge never builds a release from two different builds under one name",
    fault="two runners' folders hold one wheel name with other bytes, or two disagreeing "
    "entries of one cell",
    result="exit 1 naming both folders; the release folder is not created, and an existing "
    "one is left byte for byte",
)
def test_a_conflict_between_folders_is_refused_naming_both_and_writes_nothing(
    tmp_path: Path,
) -> None:
    folders = runner_folders(tmp_path / "artifacts")
    release = tmp_path / "release"
    # The same cell rebuilt on another runner: same file name, other bytes.
    again = tmp_path / "again" / f"dist-{X86}"
    _enter(again, _wheel(again, X86, marker=",!=3.9.0"), X86, "GitHub Actions 9", local="torch2.13")
    rc, out = _merge(folders["x86"], again, "--out", release)
    assert rc == 1, out
    name = "fleetpkg-1.0+torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert f"{name}: sha256 " in out and str(folders["x86"]) in out and str(again) in out
    assert "nothing written" in out
    assert not release.exists()

    # Same bytes, but two entries of one cell that disagree (built twice, at two times).
    twice = tmp_path / "twice" / f"dist-{X86}"
    twice.mkdir(parents=True)
    shutil.copy2(folders["x86"] / name, twice / name)
    _enter(
        twice,
        twice / name,
        X86,
        "GitHub Actions 9",
        local="torch2.13",
        started="2026-12-01T11:00:00Z",
    )
    rc, out = _merge(folders["x86"], twice, "--out", release)
    assert rc == 1, out
    assert f"cell {X86}: the entries in {folders['x86']} and {twice} disagree" in out
    assert "started_at" in out and not release.exists()

    # With a release already there, a refused merge leaves it exactly as it was.
    assert _merge(folders["x86"], "--out", release)[0] == 0
    before = _state(release)
    rc, out = _merge(twice, "--out", release)
    assert rc == 1 and str(release) in out, out
    assert _state(release) == before


@pytest.mark.promise(
    promise="a merged release holds only wheels whose bytes and cell its manifest vouches for",
    fault="a wheel changed after its build; an entry whose resolved record names another "
    "Python; a folder without manifest.json",
    result="exit 1 naming the wheel or entry and what disagrees (exit 2 for the folder), "
    "nothing written",
)
def test_each_wheel_is_checked_against_its_manifest_and_its_resolved_record(tmp_path: Path) -> None:
    folders = runner_folders(tmp_path / "artifacts")
    release = tmp_path / "release"
    wheel = next(folders["arm"].glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    rc, out = _merge(folders["x86"], folders["arm"], "--out", release)
    assert rc == 1 and f"{wheel.name}: sha256 " in out and "manifest.json records" in out, out
    assert not release.exists()

    manifest = folders["x86"] / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["wheels"][0]["extra"]["resolved"]["python"] = "3.12"
    manifest.write_text(json.dumps(doc))
    rc, out = _merge(folders["x86"], "--out", release)
    assert rc == 1, out
    assert f"{manifest}: '{X86}'" in out and "its resolved record's python '3.12'" in out
    assert not release.exists()

    bare = tmp_path / "bare"
    make_wheel(bare, "fleetpkg", "1.0")
    rc, out = _merge(bare, "--out", release)
    assert rc == 2 and f"{bare}: no manifest.json" in out, out
    rc, out = _merge(tmp_path / "missing", "--out", release)
    assert (
        rc == 2 and f"{tmp_path / 'missing'} does not exist; expected an existing folder" in out
    ), out
    assert not release.exists()


def test_merge_is_in_the_cli_help() -> None:
    res = run_cli("merge", "--help")
    assert res.rc == 0 and "built_by" in res.out and "idempotent" in res.out, res.out
