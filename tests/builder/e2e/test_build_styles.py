"""The compiler cache with every way a project drives the compiler (issue 28): torch's ninja
``BuildExtension`` (its default; ``CC="ccache gcc"`` broke it), ``use_ninja=False``, plain
setuptools and CMake, each built twice by the real in-cell build step (the one the host, docker
and emulated backends run) with a real ccache: it compiles, the second build in another folder
hits for every compile, and the wheels hold the same bytes. The cross backend uses the same
links (builder.incell.steps.ccache_masquerade); its ninja build is in test_cross.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.enginelib import missing
from helpers.stylelib import STYLES, package_name, write_style_project

from builder.incell import STEPS_SCRIPT, ccache_stats
from builder.incell.steps import CcacheSetupError, ccache_masquerade


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    for tool, package in (("ccache", "ccache"), ("ninja", "ninja-build"), ("cmake", "cmake")):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed", f".ci/run installs the {package} package")


def _build(work: Path, style: str, cache: Path) -> tuple[Path, str]:
    """The in-cell step ``build-wheel --ccache on`` in *work*; the wheel and ccache's log."""
    project = write_style_project(work / "project", style)
    env = dict(os.environ, CCACHE_DIR=str(cache), SOURCE_DATE_EPOCH="1700000000")
    for var in ("CC", "CXX", "CCACHE_DISABLE", "TORCH_NO_COMPILER_WRAPPER"):
        env.pop(var, None)
    proc = subprocess.run(
        [
            sys.executable,
            str(STEPS_SCRIPT),
            "build-wheel",
            "--project",
            str(project),
            "--out",
            str(work / "raw"),
            "--ccache",
            "on",
            "--prefix-map",
            f"{work}=/ampforge",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (wheel,) = (work / "raw").glob("*.whl")
    return wheel, (work / "ccache-stats.log").read_text()


def _contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


@pytest.mark.parametrize("style", STYLES)
def test_every_build_style_compiles_through_ccache_and_hits_the_second_time(
    style: str, tmp_path: Path
) -> None:
    cache = tmp_path / "ccache"  # private and empty: the first build must miss
    first, first_log = _build(tmp_path / "one", style, cache)
    second, second_log = _build(tmp_path / "two", style, cache)
    cold, warm = ccache_stats(first_log), ccache_stats(second_log)
    assert cold.misses >= 1 and cold.hits == 0, first_log
    assert (warm.hits, warm.misses) == (cold.misses, 0), second_log
    assert _contents(first) == _contents(second)
    # The module the cache returned is the one this style compiled, and it works.
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(second).extractall(unpacked)
    name = package_name(style)
    code = (
        f"import torch, {name}._C as m; assert m.answer() == 42; "
        f"assert m.style == {style!r}, m.style"
    )
    subprocess.run([sys.executable, "-c", code], cwd=unpacked, check=True, timeout=120)


def test_the_links_stand_for_the_compilers_the_build_names(tmp_path: Path) -> None:
    """CC/CXX become one-word links; an absolute compiler's folder is searched right after
    them; a ``ccache gcc`` already there is not doubled; torch's own wrapping is off."""
    ccache = shutil.which("ccache") or "/usr/bin/ccache"
    gxx = shutil.which("g++")
    assert gxx is not None
    env = {"CC": "ccache gcc", "CXX": gxx, "PATH": "/usr/bin:/bin"}
    got = ccache_masquerade(env, tmp_path / "bin", ccache=ccache, basedir="/b", statslog="/s")
    assert got["CC"] == str(tmp_path / "bin" / "gcc")
    assert got["CXX"] == str(tmp_path / "bin" / "g++")
    assert os.readlink(tmp_path / "bin" / "g++") == ccache
    folders = got["PATH"].split(os.pathsep)
    assert folders[0] == str(tmp_path / "bin")
    assert folders[1] == str(Path(gxx).parent)
    assert got["TORCH_NO_COMPILER_WRAPPER"] == "1" and got["CCACHE_BASEDIR"] == "/b"
    with pytest.raises(CcacheSetupError, match="CXX='no-such-g\\+\\+'"):
        ccache_masquerade(
            {"CXX": "no-such-g++", "PATH": "/usr/bin"},
            tmp_path / "b2",
            ccache=ccache,
            basedir="/b",
            statslog="/s",
        )
