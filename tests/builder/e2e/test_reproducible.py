"""Reproducible wheels (issue 6): the build's SOURCE_DATE_EPOCH, the canonical zip layout, and
the real thing -- one cell built twice from the same inputs in different temporary folders gives
byte-identical wheels, and a third build is reported up to date, with the reason.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import CELL, dist_state, manifest, run_build

from builder.errors import ConfigError, StepFailed
from builder.pipeline import input_key, rebuild_reason, tree_digest
from builder.wheel.reproducible import (
    ZIP_EPOCH_MIN,
    member_order,
    normalize_wheel,
    resolve_source_date_epoch,
    zip_date_time,
)

COMMIT_TIME = 1_700_000_000  # 2023-11-14T22:13:20Z


def _git(project: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_AUTHOR_DATE": f"@{COMMIT_TIME - 50} +0000",
        "GIT_COMMITTER_DATE": f"@{COMMIT_TIME} +0000",
    }
    subprocess.run(["git", "-C", str(project), *args], check=True, env=env, capture_output=True)


def _git_project(root: Path) -> Path:
    project = write_tiny_extension(root)
    _git(project, "init", "-q")
    _git(project, "add", ".")
    _git(project, "commit", "-q", "-m", "one")
    return project


# ------------------------------------------------------------------------- the epoch


def test_epoch_defaults_to_the_last_commit_and_env_then_flag_override(tmp_path: Path) -> None:
    project = _git_project(tmp_path / "p")
    # The committer time, not the author time and not the files' mtimes (which are "now").
    chosen = resolve_source_date_epoch(project, flag=None, env={})
    assert (chosen.value, chosen.origin) == (COMMIT_TIME, "the project's last git commit")
    assert "2023-11-14T22:13:20Z" in chosen.describe()
    from_env = resolve_source_date_epoch(project, flag=None, env={"SOURCE_DATE_EPOCH": "1234"})
    assert (from_env.value, from_env.origin) == (1234, "environment SOURCE_DATE_EPOCH")
    flagged = resolve_source_date_epoch(project, flag="99", env={"SOURCE_DATE_EPOCH": "1234"})
    assert (flagged.value, flagged.origin) == (99, "--source-date-epoch")
    # An empty variable is "not set" (CI systems export empty ones).
    assert (
        resolve_source_date_epoch(project, flag=None, env={"SOURCE_DATE_EPOCH": ""}).value
        == COMMIT_TIME
    )


def test_epoch_outside_git_is_the_newest_file_the_build_sees(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "p")
    for i, path in enumerate(sorted(p for p in project.rglob("*") if p.is_file())):
        os.utime(path, (1_600_000_000 + i, 1_600_000_000 + i))
    newest = 1_600_000_000 + len([p for p in project.rglob("*") if p.is_file()]) - 1
    # Build outputs and caches do not count: they change without the sources changing.
    (project / "build").mkdir()
    (project / "build" / "x.o").write_bytes(b"o")
    (project / "tinyext" / "__pycache__").mkdir()
    (project / "tinyext" / "__pycache__" / "a.pyc").write_bytes(b"c")
    chosen = resolve_source_date_epoch(project, flag=None, env={})
    assert chosen.value == newest and "not a git checkout" in chosen.origin
    os.utime(project / "setup.py", (1_650_000_000, 1_650_000_000))  # an edit moves it forward
    assert resolve_source_date_epoch(project, flag=None, env={}).value == 1_650_000_000


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "99999999999"])
def test_invalid_epoch_is_a_config_error_naming_its_source(tmp_path: Path, value: str) -> None:
    project = write_tiny_extension(tmp_path / "p")
    with pytest.raises(ConfigError, match=f"--source-date-epoch={value!r}"):
        resolve_source_date_epoch(project, flag=value, env={})
    with pytest.raises(ConfigError, match="environment SOURCE_DATE_EPOCH"):
        resolve_source_date_epoch(project, flag=None, env={"SOURCE_DATE_EPOCH": value})


def test_invalid_epoch_exits_2_from_the_command_line(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "p")
    r = run_build(
        tmp_path, "--backend", "host", "--project", str(project), "--source-date-epoch", "yesterday"
    )
    assert r.rc == 2, r.err
    assert "--source-date-epoch='yesterday'" in r.err and "seconds since 1970" in r.err
    r = run_build(
        tmp_path, "--backend", "host", "--project", str(project), SOURCE_DATE_EPOCH="soon"
    )
    assert r.rc == 2, r.err
    assert "SOURCE_DATE_EPOCH='soon'" in r.err
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


# ------------------------------------------------------------------------- the archive


def _record(files: dict[str, bytes], info: str, order: list[str]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name in order:
        data = files[name]
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    return out.getvalue().encode()


def _messy_wheel(path: Path, *, reverse: bool, stamp: tuple[int, ...], umask_mode: int) -> Path:
    """The same files in a different order, with other timestamps, modes, a directory entry,
    another compression and RECORD order: what two builders (or umasks) may produce."""
    info = "demo-1.0.dist-info"
    files = {
        "demo/__init__.py": b"x = 1\n",
        "demo/_C.so": b"\x7fELF fake" * 100,
        "demo/a,b.py": b"# a comma in the name: RECORD quotes it\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n",
    }
    names = sorted(files, reverse=reverse)
    files[f"{info}/RECORD"] = _record(files, info, names)
    with zipfile.ZipFile(path, "w") as zf:
        if reverse:
            zf.writestr(zipfile.ZipInfo("demo/", date_time=stamp), b"")
        for name in [*names, f"{info}/RECORD"]:
            member = zipfile.ZipInfo(name, date_time=stamp)
            exe = name.endswith(".so")
            member.external_attr = (0o100000 | (0o775 if exe else umask_mode)) << 16
            member.compress_type = zipfile.ZIP_STORED if reverse else zipfile.ZIP_DEFLATED
            zf.writestr(member, files[name])
    return path


def test_normalize_makes_differently_written_wheels_identical(tmp_path: Path) -> None:
    name = "demo-1.0-cp311-cp311-linux_x86_64.whl"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _messy_wheel(
        tmp_path / "a" / name, reverse=False, stamp=(2024, 5, 1, 12, 0, 0), umask_mode=0o644
    )
    b = _messy_wheel(
        tmp_path / "b" / name, reverse=True, stamp=(2025, 1, 2, 3, 4, 6), umask_mode=0o600
    )
    assert a.read_bytes() != b.read_bytes()
    assert normalize_wheel(a, COMMIT_TIME) and normalize_wheel(b, COMMIT_TIME)
    assert a.read_bytes() == b.read_bytes()
    assert not normalize_wheel(a, COMMIT_TIME)  # already canonical: left alone
    with zipfile.ZipFile(a) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert names == member_order(names) and names[-1] == "demo-1.0.dist-info/RECORD"
        assert not [n for n in names if n.endswith("/")]  # no directory entries
        assert {i.date_time for i in infos} == {(2023, 11, 14, 22, 13, 20)}
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in infos}
        assert modes["demo/_C.so"] == 0o755 and modes["demo/__init__.py"] == 0o644
        record = zf.read("demo-1.0.dist-info/RECORD").decode()
    assert [row[0] for row in csv.reader(record.splitlines())] == names  # same order
    # Still a valid wheel: wheel's own reader checks every RECORD hash while unpacking.
    out = tmp_path / "unpacked"
    subprocess.run(
        [sys.executable, "-m", "wheel", "unpack", "-d", str(out), str(a)],
        check=True,
        capture_output=True,
    )
    assert (out / "demo-1.0" / "demo" / "a,b.py").read_bytes().startswith(b"# a comma")


def test_zip_timestamps_are_clamped_to_what_a_zip_can_hold(tmp_path: Path) -> None:
    assert zip_date_time(0) == zip_date_time(ZIP_EPOCH_MIN) == (1980, 1, 1, 0, 0, 0)
    w = _messy_wheel(
        tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl",
        reverse=False,
        stamp=(2024, 1, 1, 0, 0, 0),
        umask_mode=0o644,
    )
    normalize_wheel(w, 0)
    with zipfile.ZipFile(w) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_normalize_refuses_a_wheel_whose_record_does_not_match(tmp_path: Path) -> None:
    w = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("demo/__init__.py", b"")
        zf.writestr("demo/extra.py", b"")
        zf.writestr(
            "demo-1.0.dist-info/RECORD", b"demo/__init__.py,,\ndemo-1.0.dist-info/RECORD,,\n"
        )
    before = w.read_bytes()
    with pytest.raises(StepFailed, match=r"present but not listed: \['demo/extra.py'\]"):
        normalize_wheel(w, COMMIT_TIME)
    assert w.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [w.name]


# ------------------------------------------------------------------------- for real


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_host_builds_twice_byte_identical_then_up_to_date(tmp_path: Path) -> None:
    """Host backend: each build compiles in its own random temporary folder (a stronger test
    than the docker backend, whose paths are fixed), with the torch headers' __FILE__ paths in
    the binary. The epoch is the project's last commit (the default)."""
    project = _git_project(tmp_path / "src")
    wheelhouse = str(wheelhouse_cp311())
    args = (
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        wheelhouse,
        "--arch",
        "X86",
        "--python",
        "3.11",
    )
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = run_build(tmp_path / "one", *args)
    assert first.rc == 0, first.err[-4000:]
    assert (
        f"source date epoch: {COMMIT_TIME} (2023-11-14T22:13:20Z, the project's last git "
        "commit)" in first.err
    )
    # The second compiles for real (no compiler cache): the same bytes must come out of the
    # compiler, not out of ccache's copy of the first build's objects.
    second = run_build(tmp_path / "two", *args, "--no-ccache")
    assert second.rc == 0, second.err[-4000:]
    assert (
        "ampforge: ccache for"
        not in (tmp_path / "two" / "work" / "logs" / f"{CELL}.log").read_text()
    )
    (w1,) = (tmp_path / "one" / "dist").glob("*.whl")
    (w2,) = (tmp_path / "two" / "dist").glob("*.whl")
    assert w1.name == w2.name and w1.name.startswith("tinyext-0.0.1+torch2.13-cp311"), w1.name
    assert _sha256(w1) == _sha256(w2), "two builds from the same inputs differ"
    entry = manifest(tmp_path / "one" / "dist")["wheels"][0]
    assert entry["sha256"] == _sha256(w1)
    assert entry["extra"]["source_date_epoch"] == {
        "value": COMMIT_TIME,
        "origin": "the project's last git commit",
    }
    with zipfile.ZipFile(w1) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        binary = zf.read(so)
    # No trace of where it was built (the session's temporary folder) in the module.
    assert b"ampforge-host-" not in binary and str(tmp_path).encode() not in binary

    # Nothing changed: up to date, with the reason, and dist/ untouched.
    before = dist_state(tmp_path / "one" / "dist")
    again = run_build(tmp_path / "one", *args)
    assert again.rc == 0, again.err[-4000:]
    assert f"[{CELL}] up-to-date (" in again.err and "same inputs as its manifest entry" in (
        again.err
    ), again.err
    assert "] compile (" not in again.err
    assert dist_state(tmp_path / "one" / "dist") == before

    # Changing an input names it as the reason to rebuild: the epoch, a kernel's content.
    dist = tmp_path / "one" / "dist"
    assert rebuild_reason(dist, CELL, {"source_date_epoch": COMMIT_TIME}).startswith(
        "its wheel in the manifest"
    )  # same value: nothing to blame
    assert rebuild_reason(dist, CELL, {"source_date_epoch": COMMIT_TIME + 1}) == (
        "inputs changed since the last build: source_date_epoch"
    )
    (project / "tinyext" / "ext.cpp").write_text(
        "// changed\n" + (project / "tinyext" / "ext.cpp").read_text()
    )
    assert rebuild_reason(dist, CELL, {"project": tree_digest(project)}) == (
        "inputs changed since the last build: project"
    )
    assert entry["extra"]["input_key"] != input_key({"project": tree_digest(project)})


def test_rebuild_reason_without_an_earlier_build(tmp_path: Path) -> None:
    assert rebuild_reason(tmp_path, CELL, {"project": "x"}) == (
        "not built before (no manifest entry)"
    )
