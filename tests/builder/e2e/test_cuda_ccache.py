"""nvcc through the compiler cache (issue 34): a CUDA cell's ``.cu`` files compile through
ccache as its C++ files do. The real in-cell build step (``build-wheel --ccache on
--cuda-home``, what every backend runs) builds a project with one C and one CUDA source and
the index's nvcc, twice in two folders sharing one private cache: the second build hits for
both compiles, the nvcc one included, and gives the same bytes.

The project's setup.py runs ``nvcc`` from PATH itself, as many CUDA projects' do: this suite's
torch is a CPU build, whose cpp_extension refuses CUDA sources (its CUDA_HOME is None without
CUDA compiled in). torch's own ninja rule reaches the same link through PYTORCH_NVCC (the seam
test below); the real torchsort CUDA cell (test_real_clients.py, marker ``cuda_build``) runs
it. Cost: two compiles of one kernel (seconds each with a warm toolkit cache; the toolkit's
first download is the fat binary tests' too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.cudalib import index_nvcc
from helpers.enginelib import missing

from builder.incell import STEPS_SCRIPT, ccache_stats
from builder.incell.steps import CcacheSetupError, ccache_masquerade

SETUP = """\
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class WithCuda(build_ext):
    def build_extension(self, ext):
        os.makedirs(self.build_temp, exist_ok=True)
        obj = os.path.join(self.build_temp, "kernel.o")
        subprocess.check_call(["nvcc", "-c", "-Xcompiler=-fPIC",
                               "-gencode=arch=compute_80,code=sm_80", "kernel.cu", "-o", obj])
        ext.extra_objects = [obj]
        super().build_extension(ext)


setup(name="cudacc", version="0.1", packages=["cudacc"],
      ext_modules=[Extension("cudacc._C", ["ext.c"])], cmdclass={"build_ext": WithCuda})
"""
EXT = """\
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
"""
KERNEL = """\
__global__ void twice(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2.f;
}
void launch(float* x, int n) { twice<<<(n + 255) / 256, 256>>>(x, n); }
"""


@pytest.fixture(scope="module")
def cuda_home() -> Path:
    if shutil.which("ccache") is None:
        missing("ccache is not installed", ".ci/run installs the ccache package")
    return index_nvcc().parent.parent


def _project(root: Path) -> Path:
    (root / "cudacc").mkdir(parents=True)
    (root / "cudacc" / "__init__.py").write_text("")
    (root / "setup.py").write_text(SETUP)
    (root / "ext.c").write_text(EXT)
    (root / "kernel.cu").write_text(KERNEL)
    return root


def _build(work: Path, cuda_home: Path, cache: Path) -> tuple[Path, str]:
    project = _project(work / "project")
    env = dict(os.environ, CCACHE_DIR=str(cache), SOURCE_DATE_EPOCH="1700000000")
    for var in ("CC", "CXX", "CCACHE_DISABLE", "TORCH_NO_COMPILER_WRAPPER", "PYTORCH_NVCC"):
        env.pop(var, None)
    # No nvcc of this machine's on PATH: the build's is the toolkit's, from --cuda-home.
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists()
    )
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
            "--cuda-home",
            str(cuda_home),
            "--cuda-arch-list",
            "8.0",
            "--prefix-map",
            f"{work}=/ampforge",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (wheel,) = (work / "raw").glob("*.whl")
    return wheel, (work / "ccache-stats.log").read_text()


def _by_source(log: str) -> dict[str, list[str]]:
    """ccache's statistics log as {source file name: its statistics}."""
    found: dict[str, list[str]] = {}
    current = ""
    for line in log.splitlines():
        if line.startswith("# "):
            current = Path(line[2:].strip()).name
            found.setdefault(current, [])
        elif line.strip():
            found.setdefault(current, []).append(line.strip())
    return found


def test_a_cuda_cells_nvcc_compiles_hit_the_cache_the_second_time(
    cuda_home: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "ccache"  # private and empty: the first build must miss
    first, first_log = _build(tmp_path / "one", cuda_home, cache)
    second, second_log = _build(tmp_path / "two", cuda_home, cache)
    cold, warm = _by_source(first_log), _by_source(second_log)
    # Both compiles went through the cache. Without the nvcc link the .cu file shows only as
    # nvcc's own preprocessing calls of gcc (called_for_preprocessing), never as a miss.
    assert {"ext.c", "kernel.cu"} <= set(cold), first_log
    assert "cache_miss" in cold["kernel.cu"], first_log
    assert any(s.endswith("cache_hit") for s in warm["kernel.cu"]), second_log
    assert ccache_stats(second_log).misses == 0, second_log
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(second) as b:
        assert {n: a.read(n) for n in a.namelist()} == {n: b.read(n) for n in b.namelist()}


def test_the_nvcc_link_names_the_toolkits_nvcc(cuda_home: Path, tmp_path: Path) -> None:
    """For a CUDA cell nvcc gets a link too, PYTORCH_NVCC names it (torch's ninja rule reads
    it) and the toolkit's bin folder follows the links on PATH; a CUDA cell whose PATH has no
    nvcc is an error naming the PATH."""
    ccache = shutil.which("ccache") or "/usr/bin/ccache"
    env = {"PATH": f"{cuda_home / 'bin'}:/usr/bin:/bin"}
    got = ccache_masquerade(
        env, tmp_path / "bin", ccache=ccache, basedir="/b", statslog="/s", cuda=True
    )
    assert got["PYTORCH_NVCC"] == str(tmp_path / "bin" / "nvcc")
    assert os.readlink(tmp_path / "bin" / "nvcc") == ccache
    folders = got["PATH"].split(os.pathsep)
    assert folders[0] == str(tmp_path / "bin") and str(cuda_home / "bin") in folders[1:3]
    plain = ccache_masquerade(env, tmp_path / "cpu", ccache=ccache, basedir="/b", statslog="/s")
    assert "PYTORCH_NVCC" not in plain and not (tmp_path / "cpu" / "nvcc").exists()
    with pytest.raises(CcacheSetupError, match="no nvcc on PATH \\(/usr/bin:/bin\\)"):
        ccache_masquerade(
            {"PATH": "/usr/bin:/bin"},
            tmp_path / "b2",
            ccache=ccache,
            basedir="/b",
            statslog="/s",
            cuda=True,
        )
