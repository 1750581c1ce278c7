"""Repair, verification and dist/ of real wheels: a tiny torch extension compiled for real.

The host tests compile ``tinyext`` once with this venv's torch and repair it with the builder's
auditwheel; the docker test runs the whole cell (venv, torch from the wheelhouse, compile,
repair, verify with a smoke test in a fresh venv) inside the locally built base image.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers.enginelib import TORCH, docker_engine, wheelhouse_cp311, write_tiny_extension

from builder.engines.base import OutputLog
from builder.engines.host import HostEngine, HostSession
from builder.errors import StepFailed
from builder.images.base_image import build_base_image
from builder.incell import STEPS_SCRIPT, build_in_session, local_version
from builder.release.manifest import (
    ManifestEntry,
    publish_wheel,
    read_manifest,
    record_wheel,
    sha256_file,
)
from builder.wheel.repair import DEFAULT_EXCLUDES, host_auditwheel, repair_wheel, split_wheel_name
from builder.wheel.verify import check_name_against_audit, check_no_bundled_torch, verify_wheel
from builder.wheel.wheelcheck import (
    check_needs_within,
    check_tag_covers_own_code,
    glibc_floor,
    need_summary,
    tag_glibc,
    version_needs,
)

TORCH_LIB = str(Path(torch.__file__).parent / "lib")


@pytest.fixture(scope="module")
def raw_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tinyext compiled here against this venv's torch (the in-cell build step, for real)."""
    root = tmp_path_factory.mktemp("tiny")
    project = write_tiny_extension(root / "src")
    out = root / "raw"
    with HostEngine().session(parent=root) as session:
        session.run(
            [
                sys.executable,
                str(STEPS_SCRIPT),
                "build-wheel",
                "--project",
                str(project),
                "--out",
                str(out),
                "--local-version",
                local_version(TORCH),
            ],
            step="build tinyext",
        )
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture()
def session(tmp_path: Path):
    with HostEngine().session(parent=tmp_path, log=OutputLog()) as s:
        yield s


def _repair(session: HostSession, wheel: Path, out: Path, **kwargs):
    aw, env = host_auditwheel()
    env.update(kwargs.pop("env", {}))
    inside = session.copy_in(wheel, session.workdir + "/raw")
    return repair_wheel(session, inside, out, auditwheel=aw, env=env, **kwargs)


def test_raw_wheel_carries_the_torch_local_version(raw_wheel: Path) -> None:
    dist, ver, py, _abi, plats = split_wheel_name(raw_wheel.name)
    assert (dist, ver, py, plats) == ("tinyext", "0.0.1+torch2.13", "cp311", ("linux_x86_64",))


def test_repair_excludes_torch_and_gives_manylinux(
    raw_wheel: Path, session: HostSession, tmp_path: Path
) -> None:
    out = tmp_path / "repaired"
    out.mkdir()
    result = repair_wheel_ok = _repair(session, raw_wheel, out)
    assert result.wheel.parent == out and result.wheel.exists()
    assert result.tag.startswith("manylinux_2_") and result.tag.endswith("_x86_64")
    # The glibc shim keeps __libc_single_threaded (GLIBC_2.32) out: older than this host's glibc.
    assert int(result.tag.split("_")[2]) < 32
    assert set(result.audit.external_libs) == {"libc10.so", "libtorch_cpu.so", "libtorch_python.so"}
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if ".libs/" in n]
    check_no_bundled_torch(result.wheel)
    check_name_against_audit(result.wheel.name, repair_wheel_ok.audit, DEFAULT_EXCLUDES)
    assert [p.name for p in out.iterdir()] == [result.wheel.name]  # no staging left


def test_refuses_when_something_else_would_be_grafted(
    raw_wheel: Path, session: HostSession, tmp_path: Path
) -> None:
    """Only libtorch* excluded and torch's lib dir visible: libc10.so would be grafted."""
    out = tmp_path / "repaired"
    out.mkdir()
    with pytest.raises(StepFailed) as err:
        _repair(
            session,
            raw_wheel,
            out,
            excludes=("libtorch*.so",),
            env={"AUDITWHEEL_LD_LIBRARY_PATH": TORCH_LIB},
        )
    assert "would graft libc10.so" in str(err.value)
    assert list(out.iterdir()) == []


def test_refuses_a_non_manylinux_result(
    raw_wheel: Path, session: HostSession, tmp_path: Path
) -> None:
    out = tmp_path / "repaired"
    out.mkdir()
    # auditwheel itself refuses --plat linux_x86_64; --no-update-tags is how a linux_* name
    # comes out of a "successful" repair.
    with pytest.raises(StepFailed, match="not a manylinux wheel"):
        _repair(session, raw_wheel, out, extra_args=["--no-update-tags"])
    assert list(out.iterdir()) == []


def test_verification_rejects_lies_and_bundled_torch(
    raw_wheel: Path, session: HostSession, tmp_path: Path
) -> None:
    out = tmp_path / "repaired"
    out.mkdir()
    good = _repair(session, raw_wheel, out)
    # A name claiming an older glibc than the symbols need.
    lying = good.wheel.name.replace(good.tag, "manylinux_2_5_x86_64")
    with pytest.raises(StepFailed, match="auditwheel show says its symbols need"):
        check_name_against_audit(lying, good.audit)
    with pytest.raises(StepFailed, match="not manylinux"):
        check_name_against_audit(good.wheel.name.replace(good.tag, "linux_x86_64"), good.audit)
    # A wheel with a copy of torch's library inside.
    fat = tmp_path / good.wheel.name
    with zipfile.ZipFile(good.wheel) as src, zipfile.ZipFile(fat, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr("tinyext.libs/libc10-0123abcd.so", b"\x7fELF")
    with pytest.raises(StepFailed, match=r"libc10-0123abcd\.so"):
        check_no_bundled_torch(fat)


# -- tags no higher than torch's ---------------------------------------------------------------

TORCH_TAG = "manylinux_2_28_x86_64"  # torch 2.13.0's own wheel (configs/support.yaml)


def test_libm_calls_bind_to_their_oldest_glibc_versions(raw_wheel: Path) -> None:
    """tinyext calls pow (GLIBC_2.29 by default here) and expf (GLIBC_2.27): the build's libm
    floor binds both to x86_64's first version, so neither decides the wheel's tag."""
    needs = version_needs(raw_wheel)
    bound = {sym: n.name for n in needs for sym in n.symbols}
    assert bound["pow"] == bound["expf"] == "GLIBC_2.2.5", bound
    assert glibc_floor(needs) <= (2, 24), need_summary(needs)


def test_repair_targets_torchs_tag_and_names_every_older_one_the_symbols_allow(
    raw_wheel: Path, session: HostSession, tmp_path: Path
) -> None:
    out = tmp_path / "repaired"
    out.mkdir()
    result = _repair(session, raw_wheel, out, plat=TORCH_TAG)
    tags = split_wheel_name(result.wheel.name)[4]
    assert TORCH_TAG in tags and result.tag in tags
    # The achieved tag is the oldest one; the independent check of the wheel's own ELF files
    # arrives at the same tag as auditwheel, and nothing is above torch's.
    assert result.tag == check_tag_covers_own_code(result.wheel, TORCH_TAG)
    assert tag_glibc(result.tag)[0] <= (2, 24), result.wheel.name
    # A name above torch's tag is refused, as is one below what the code needs.
    above = tmp_path / result.wheel.name.replace(".".join(tags), "manylinux_2_31_x86_64")
    above.write_bytes(result.wheel.read_bytes())
    with pytest.raises(StepFailed, match=r"above manylinux_2_28_x86_64 .the tag of the torch"):
        check_tag_covers_own_code(above, TORCH_TAG)
    below = tmp_path / result.wheel.name.replace(".".join(tags), "manylinux_2_17_x86_64")
    below.write_bytes(result.wheel.read_bytes())
    with pytest.raises(
        StepFailed,
        match=r"claims manylinux_2_17_x86_64, but its own code needs "
        r"glibc 2\.24 or newer:\n.*@GLIBCXX_3\.4\.2",
    ):
        check_tag_covers_own_code(below, TORCH_TAG)


def test_a_wheel_above_its_ceiling_is_refused_naming_the_symbols(raw_wheel: Path) -> None:
    """The message a cell fails with when its wheel would need more than its torch's tag
    (here a ceiling of manylinux_2_17, which the C++11 string ABI the wheel uses exceeds)."""
    with pytest.raises(StepFailed) as err:
        check_needs_within(raw_wheel, "manylinux_2_17_x86_64", "the test's ceiling")
    message = str(err.value)
    assert (
        "needs glibc 2.24 (manylinux_2_24 at best), newer than manylinux_2_17_x86_64: "
        "the test's ceiling" in message
    )
    assert re.search(
        r"tinyext/_C\.[^:]+\.so: \S+@GLIBCXX_3\.4\.2\d.* \(libstdc\+\+\.so\.6\)", message
    ), message
    assert "GLIBC_2.2.5" not in message  # only what pushes it up is named
    assert check_needs_within(raw_wheel, TORCH_TAG, "torch's tag")  # within torch's: fine


# -- dist/ and the manifest -----------------------------------------------------------------


def _entry(wheel: Path, cell: str, **extra: object) -> ManifestEntry:
    return ManifestEntry.for_wheel(
        wheel,
        cell=cell,
        torch="2.13.0",
        python="3.11",
        base_image="sha256:x",
        compiler="g++ 12",
        builder_version="0.1.0",
        started_at="t0",
        finished_at="t1",
        extra=extra,
    )


def test_publish_and_manifest_keep_earlier_entries(raw_wheel: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    first = publish_wheel(raw_wheel, dist)
    assert first.read_bytes() == raw_wheel.read_bytes()
    record_wheel(dist, _entry(first, "cp311-manylinux_x86_64-torch2.13"))
    before = (dist / "manifest.json").read_text()

    # A failure while writing (an entry that cannot be serialised) changes nothing.
    with pytest.raises(TypeError):
        record_wheel(dist, _entry(first, "cp39-other", bad=object()))
    assert (dist / "manifest.json").read_text() == before
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [first.name, "manifest.json", ".manifest.lock"]
    )

    # A second cell adds to, and does not replace, the first.
    other = tmp_path / "tinyext-0.0.1+torch2.8-cp39-cp39-manylinux_2_24_x86_64.whl"
    other.write_bytes(b"not really a wheel")
    record_wheel(dist, _entry(publish_wheel(other, dist), "cp39-manylinux_x86_64-torch2.8"))
    doc = read_manifest(dist)
    assert [w["cell"] for w in doc["wheels"]] == [
        "cp311-manylinux_x86_64-torch2.13",
        "cp39-manylinux_x86_64-torch2.8",
    ]
    assert doc["wheels"][0]["sha256"] == sha256_file(raw_wheel)
    assert doc["wheels"][0]["size"] == raw_wheel.stat().st_size


@pytest.mark.promise(
    promise="a new version of a project built into the same dist/ adds its wheel and entry "
    "beside the older ones; a rebuild of the same file replaces only that file's entry",
    fault="a cell's wheel recorded for version 0.0.1, then 0.0.2 of the same cell, then 0.0.2 "
    "rebuilt",
    result="both wheels stay listed with their sha256 (dist/ can still be indexed and "
    "published); the rebuild leaves one entry for its file",
)
def test_a_new_version_of_a_cell_keeps_the_older_wheels_entry(tmp_path: Path) -> None:
    from helpers.indexlib import make_wheel  # noqa: PLC0415

    from builder.release.distfiles import dist_wheels  # noqa: PLC0415

    dist = tmp_path / "dist"
    cell = "cp311-manylinux_x86_64-torch2.13.0"
    old = publish_wheel(make_wheel(tmp_path / "v1", "cellpkg", "0.0.1"), dist)
    record_wheel(dist, _entry(old, cell))
    newer = make_wheel(tmp_path / "v2", "cellpkg", "0.0.2")
    for _ in range(2):  # the second time: the same file rebuilt
        record_wheel(dist, _entry(publish_wheel(newer, dist, [cell]), cell))
    doc = read_manifest(dist)
    assert sorted(w["file"] for w in doc["wheels"]) == sorted([old.name, newer.name])
    assert {w["cell"] for w in doc["wheels"]} == {cell}
    assert dist_wheels(dist).checked  # index and publish take this dist/ as it is


def test_corrupt_manifest_is_never_overwritten(raw_wheel: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "manifest.json").write_text("{ truncated")
    with pytest.raises(StepFailed, match="refusing to overwrite"):
        record_wheel(dist, _entry(raw_wheel, "cell"))
    assert (dist / "manifest.json").read_text() == "{ truncated"


def _record_in_child(args: tuple[str, str, int]) -> None:
    dist, wheel, i = args
    record_wheel(Path(dist), _entry(Path(wheel), f"cell-{i:02d}"))


def test_parallel_cells_do_not_lose_entries(raw_wheel: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    copies = []
    for i in range(8):
        w = tmp_path / f"w{i}" / raw_wheel.name.replace("tinyext", f"tiny{i}")
        w.parent.mkdir()
        w.write_bytes(raw_wheel.read_bytes())
        copies.append((str(dist), str(w), i))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_record_in_child, copies)
    doc = json.loads((dist / "manifest.json").read_text())
    assert [w["cell"] for w in doc["wheels"]] == [f"cell-{i:02d}" for i in range(8)]


# -- the whole cell in a container -----------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_cell_in_container_builds_repairs_and_verifies(tmp_path: Path) -> None:
    engine = docker_engine()
    base = build_base_image(engine)
    wheelhouse = wheelhouse_cp311()
    project = write_tiny_extension(tmp_path / "tinyext")
    python = f"/opt/python/{base.python_tag}-{base.python_tag}/bin/python"
    out = tmp_path / "out"
    out.mkdir()
    log = OutputLog(log_file=tmp_path / "cell.log")
    seen: dict[str, str] = {}
    with engine.container(
        base.tag, binds={str(wheelhouse): "/wheelhouse"}, log=log, network=False
    ) as session:
        seen["id"] = session.id
        built = build_in_session(
            session, python=python, torch=TORCH, project=project, wheelhouse="/wheelhouse"
        )
        assert built.shim  # bookworm's glibc has sys/single_threaded.h
        assert built.torch.startswith(TORCH)
        repaired = repair_wheel(session, built.wheel, out)
        checked = verify_wheel(
            session, repaired.wheel, python=python, torch=TORCH, wheelhouse="/wheelhouse"
        )
    assert not [c for c in engine.leftover_containers() if c == seen["id"]]
    assert checked.modules == ("tinyext._C",)
    assert checked.tag == repaired.tag and int(repaired.tag.split("_")[2]) < 32
    assert repaired.wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_")
    assert "smoke: imported ['tinyext._C']" in (tmp_path / "cell.log").read_text()


# -- a module that binds no versioned glibc symbol ------------------------------------------

#: A CPython extension that calls no C library function: its only versioned symbol, if any,
#: is the compiler's weak __cxa_finalize@GLIBC_2.2.5, so auditwheel tags it manylinux1.
BARE_C = """\
#include <Python.h>
static struct PyModuleDef bare = {PyModuleDef_HEAD_INIT, "bare_c", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_bare_c(void) { return PyModule_Create(&bare); }
"""


@pytest.mark.promise(
    promise="a wheel whose compiled code needs no particular glibc passes the tag check",
    fault="a C module binding no versioned glibc symbol, which auditwheel tags manylinux1",
    result="the repaired wheel's every tag is accepted and the oldest, manylinux_2_5, reported",
)
def test_a_module_without_versioned_glibc_symbols_meets_every_tag(
    session: HostSession, tmp_path: Path
) -> None:
    project = tmp_path / "bare"
    project.mkdir()
    (project / "bare_c.c").write_text(BARE_C)
    (project / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='bare-c', version='1.0', ext_modules=[Extension('bare_c', ['bare_c.c'])])\n"
    )
    raw = tmp_path / "raw"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--quiet",
            "-w",
            str(raw),
            str(project),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = raw.glob("*.whl")
    assert glibc_floor(version_needs(wheel)) == (2, 17)  # none of its own: the policy's floor
    out = tmp_path / "repaired"
    out.mkdir()
    result = _repair(session, wheel, out, plat=TORCH_TAG)
    tags = split_wheel_name(result.wheel.name)[4]
    assert "manylinux1_x86_64" in tags and TORCH_TAG in tags, result.wheel.name
    # Before the fix: "claims manylinux1_x86_64, but its own code needs glibc 2.17 or newer:"
    # with nothing after the colon.
    assert check_tag_covers_own_code(result.wheel, TORCH_TAG) == "manylinux_2_5_x86_64"
    assert result.tag in ("manylinux1_x86_64", "manylinux_2_5_x86_64"), result.tag
