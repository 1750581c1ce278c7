"""Issue 27, part 1: the disk fills -- in the work folder, dist/, the cache, during repair and
during `fetch` -- on real file systems that fill (size-limited tmpfs mounts, faultlib), with
the smallest project the host backend builds end to end.

Promised each time: exit 1 (or DiskFull) naming the path and the space, dist/ and its manifest
byte-identical to before, no partial file anywhere, and the next run with space succeeds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311
from helpers.faultlib import C_CELL, grow, leave_free, no_partial_files, small_disk, write_c_project
from helpers.pipelinelib import builder_env, dist_state, manifest, run_build, seed_dist

from builder.engines.base import OutputLog
from builder.engines.host import HostEngine
from builder.errors import DiskFull, StepFailed
from builder.release.manifest import ManifestEntry, publish_recorded, record_wheel
from builder.wheel.repair import host_auditwheel, repair_wheel

pytestmark = pytest.mark.slow


def _host_build(tmp: Path, project: Path, **env: str):
    return run_build(
        tmp,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        **env,
    )


@pytest.mark.promise(
    promise="a full work folder fails the cell with exit 1 naming the step, the path and its "
    "free space; dist/ and manifest.json stay byte-identical; the next run with space "
    "builds",
    fault="the work folder on a 512 kB file system while the compiler writes a 2 MB object",
    result="exit 1 with step 'compile' naming the work folder's file system and quoting the "
    "assembler's no-space line, dist/ unchanged, no staging folder or temporary file "
    "left; after the file system grows the same command builds and records the wheel",
)
def test_a_full_work_folder_fails_the_compile_and_the_run_with_space_builds(tmp_path: Path) -> None:
    # 2 MB of initialised data: the object file cannot fit in the work folder; the zipped
    # wheel (a few kB) fits anywhere.
    project = write_c_project(tmp_path / "src", blob=2_000_000)
    dist = tmp_path / "dist"
    before = seed_dist(dist)
    with small_disk(tmp_path / "work", "512k") as work:
        r = _host_build(tmp_path, project)
        assert r.rc == 1, r.err
        assert "step 'compile': no space left on device" in r.err, r.err
        assert f"(file system {work}:" in r.err and "No space left on device" in r.err, r.err
        assert "Traceback" not in r.err
        assert dist_state(dist) == before
        assert not list((work / "stage").iterdir()), "staging folder left behind"
        assert not no_partial_files(dist, work)

        grow(work, "64m")
        r = _host_build(tmp_path, project)
        assert r.rc == 0, r.err
        (wheel,) = dist.glob("cext-*.whl")
        cells = {w["cell"]: w for w in manifest(dist)["wheels"]}
        assert cells[C_CELL]["file"] == wheel.name and len(cells) == 2
        assert all(
            dist_state(dist)[name] == data
            for name, data in before.items()
            if name != "manifest.json"
        )
        assert not no_partial_files(dist, work)


def _entry(wheel: Path, cell: str) -> ManifestEntry:
    return ManifestEntry.for_wheel(
        wheel,
        cell=cell,
        torch="2.13.0",
        python="3.11",
        base_image="host",
        compiler="cc",
        builder_version="0",
        started_at="t0",
        finished_at="t1",
    )


@pytest.mark.promise(
    promise="a wheel and its manifest entry enter dist/ together or not at all; a rebuild "
    "that cannot be recorded never costs the wheel it was to replace",
    fault="dist/ on a file system with room for the new wheel but not for the new "
    "manifest.json (publish_recorded, the pipeline's publish step), and one with no "
    "room at all (record_wheel)",
    result="DiskFull naming dist/ (or manifest.json) and the bytes needed; the old wheel and "
    "manifest.json byte-identical, no temporary or kept-aside file",
)
def test_a_manifest_that_cannot_be_written_keeps_dist_as_it_was(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    with small_disk(tmp_path / "fs", "256k") as fs:
        dist = fs / "dist"
        old = dist / "cext-0.0.1-cp311-cp311-manylinux_2_17_x86_64.whl"
        dist.mkdir()
        old.write_bytes(b"the wheel built before")
        record_wheel(dist, _entry(old, C_CELL))
        before = dist_state(dist)
        # The rebuild: same file name, other bytes, for the same cell (a --force rebuild).
        new = staged / old.name
        new.write_bytes(b"the rebuilt wheel")
        leave_free(fs, 4096)  # one block: the wheel fits, the wheel and the manifest not
        with pytest.raises(DiskFull) as caught:
            publish_recorded(new, dist, _entry(new, C_CELL), cells=[C_CELL])
        assert f"manifest.json in {dist}" in caught.value.message
        assert "8.2 kB needed" in caught.value.message and caught.value.free == 4096
        assert dist_state(dist) == before and not no_partial_files(dist)

        leave_free(fs, 0)
        with pytest.raises(DiskFull) as caught:
            record_wheel(dist, _entry(new, "cp312-manylinux_x86_64-torch2.13.0"))
        assert str(dist / "manifest.json") in caught.value.message
        assert dist_state(dist) == before and not no_partial_files(dist)


@pytest.mark.promise(
    promise="a repair that runs out of space fails naming it and leaves no wheel behind",
    fault="auditwheel repair with its session on a file system that holds the wheel once "
    "but not the repaired copy",
    result="StepFailed quoting auditwheel's 'No space left on device'; no wheel in the "
    "output folder",
)
def test_repair_on_a_full_disk_leaves_no_wheel(tmp_path: Path) -> None:
    project = write_c_project(tmp_path / "src")
    # Incompressible data: the wheel takes as much room as its contents.
    (project / "cext" / "data.bin").write_bytes(_noise(300_000))
    setup = project / "setup.py"
    setup.write_text(
        setup.read_text().replace(
            'packages=["cext"],', 'packages=["cext"], package_data={"cext": ["data.bin"]},'
        )
    )
    raw_dir = tmp_path / "raw"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(raw_dir),
            str(project),
        ],
        check=True,
        env=builder_env(),
        capture_output=True,
    )
    (raw,) = raw_dir.glob("*.whl")
    aw, aw_env = host_auditwheel()
    with small_disk(tmp_path / "fs", "512k") as fs:
        out = fs / "repaired"
        out.mkdir()
        log = OutputLog(log_file=tmp_path / "repair.log")
        with HostEngine().session(log=log, parent=fs) as session:
            inside = session.copy_in(raw, session.workdir)
            with pytest.raises(StepFailed) as caught:
                repair_wheel(
                    session, inside, out, auditwheel=aw, env=aw_env, plat="manylinux_2_28_x86_64"
                )
        assert "No space left on device" in caught.value.message, caught.value.message
        assert not list(out.iterdir())


def _noise(n: int) -> bytes:
    import random  # noqa: PLC0415

    return random.Random(27).randbytes(n)


@pytest.mark.promise(
    promise="a cache that fills while the torch environment is made fails the cell naming "
    "the cache, and leaves no half-made entry a later run would trust",
    fault="AMPFORGE_CACHE on a 2 MB file system (the torch environment needs hundreds)",
    result="exit 1 naming the cache's file system and step 'torch'; dist/ byte-identical; no "
    "entry, hidden or not, under torch-envs/",
)
def test_a_full_cache_fails_naming_it_and_keeps_no_entry(tmp_path: Path) -> None:
    project = write_c_project(tmp_path / "src")
    before = seed_dist(tmp_path / "dist")
    with small_disk(tmp_path / "cache", "2m") as cache:
        r = _host_build(tmp_path, project, AMPFORGE_CACHE=str(cache))
        assert r.rc == 1, r.err
        assert "step 'torch': no space left on device" in r.err, r.err
        assert f"(file system {cache}:" in r.err, r.err
        envs = cache / "torch-envs"
        assert not (envs.exists() and [p for p in envs.iterdir() if p.is_dir()])
    assert dist_state(tmp_path / "dist") == before
    assert not list((tmp_path / "work" / "stage").iterdir())


@pytest.mark.promise(
    promise="fetch on a disk that fills fails naming the bundle's folder and leaves no cut-"
    "short wheel; the next fetch with space completes the bundle",
    fault="the bundle on a 20 MB file system, fetching the 190 MB torch wheel",
    result="exit 1 naming the bundle's wheels folder and removing the partial torch wheel "
    "(which pip would otherwise take as 'already downloaded'); no bundle.json; after "
    "the file system grows the same fetch exits 0 with every file's sha256 recorded",
)
def test_fetch_on_a_full_disk_keeps_no_partial_wheel_and_the_next_fetch_works(
    tmp_path: Path,
) -> None:
    project = write_c_project(tmp_path / "src")
    argv = [
        sys.executable,
        "-m",
        "builder",
        "fetch",
        "--no-images",
        "--project",
        str(project),
        "--find-links",
        str(wheelhouse_cp311()),
    ]
    with small_disk(tmp_path / "fs", "20m") as fs:
        bundle = fs / "bundle"
        r = subprocess.run(
            [*argv, "--bundle", str(bundle)],
            cwd=tmp_path,
            env=builder_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 1, r.stderr
        assert "no space left on device: pip download for" in r.stderr, r.stderr
        assert f"{bundle / 'wheels'}" in r.stderr and "removed what it had written" in r.stderr
        assert not list((bundle / "wheels").glob("torch-*")), "a cut-short torch wheel is left"
        assert not (bundle / "bundle.json").exists()

        grow(fs, "600m")
        r = subprocess.run(
            [*argv, "--bundle", str(bundle)],
            cwd=tmp_path,
            env=builder_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads((bundle / "bundle.json").read_text())
        torch = [f for f in doc["files"] if f["path"].startswith("wheels/torch-")]
        (source,) = wheelhouse_cp311().glob("torch-*.whl")
        assert torch and torch[0]["size"] == source.stat().st_size
