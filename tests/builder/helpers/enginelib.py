"""Helpers for the builder's engine / base-image / repair tests (imported by name: pytest puts
this folder on sys.path).

* :func:`docker_engine` -- the real engine. Under CI (``CI=true``; ``.ci/run`` starts dockerd)
  a missing engine FAILS the test; on a developer machine without one the test is skipped
  with the reason.
* :func:`wheelhouse_cp311` -- the CPU torch wheel and everything a cp311 build and smoke test
  install, gathered once with pip into a cache dir (the index's x86_64 torch is a multi-GB CUDA
  build: the tests must never install it).
* :func:`write_tiny_extension` -- a one-file torch C++ extension project (real compile).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from builder.engines.docker import DockerEngine
from builder.errors import EngineUnavailable

TORCH = "2.13.0"
CACHE = Path(os.environ.get("AMPFORGE_CACHE", Path.home() / ".cache" / "ampforge"))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(problem: str, ci_provides: str) -> NoReturn:
    """A prerequisite is missing: under CI a failure (*ci_provides* says how .ci/run provides
    it), elsewhere a skip that says CI would fail."""
    if in_ci():
        pytest.fail(f"CI=true but {problem} ({ci_provides})")
    pytest.skip(f"{problem}; CI would fail")


def docker_engine() -> DockerEngine:
    group = os.environ.get("AMPFORGE_TEST_GROUP")
    if group is not None and group != "docker":
        # tests/conftest.py runs engine tests in one stream; one outside it would race them.
        pytest.fail(
            "this test uses the container engine but is not in the 'docker' test "
            "group: add its module to DOCKER_MODULES in tests/conftest.py or mark "
            "the test @pytest.mark.docker"
        )
    try:
        return DockerEngine()
    except EngineUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI=true but no container engine answers (did .ci/run start it?):\n{exc}")
        pytest.skip(f"no container engine here (CI would fail): {exc.message.splitlines()[0]}")


def wheelhouse_cp311() -> Path:
    """A directory holding torch==TORCH (CPU) for cp311 and its dependencies, plus the build
    requirements (setuptools, wheel). Filled by pip on first use; pip's own configuration
    (find-links, proxy, CA) decides where the files come from."""
    return filled_once(CACHE / f"wheelhouse-cp311-torch{TORCH}", _download_wheelhouse)


def filled_once(dest: Path, fill: Callable[[Path], None]) -> Path:
    """*dest*, filled by ``fill(dest)`` unless a stamp says an earlier fill completed.
    Parallel test workers: one fills, the others wait on a lock and find the stamp."""
    stamp = dest / ".complete"
    if stamp.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            fill(dest)
            stamp.touch()
    return dest


def _download_wheelhouse(dest: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--dest",
            str(dest),
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            f"torch=={TORCH}",
            "setuptools",
            "wheel",
        ],
        check=True,
    )
    torch_wheels = list(dest.glob("torch-*.whl"))
    big = [w for w in torch_wheels if w.stat().st_size > 1_000_000_000]
    assert torch_wheels and not big, f"expected a CPU torch wheel in {dest}, got {torch_wheels}"


# torch's default BuildExtension (ninja where installed, as CI provisions it): the way most
# published extensions build, so every backend's tiny build goes through it with ccache.
TINY_SETUP = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

local = os.environ.get("AMP_LOCAL_VERSION", "")
setup(
    name="tinyext",
    version="0.0.1" + ("+" + local if local else ""),
    packages=["tinyext"],
    ext_modules=[CppExtension("tinyext._C", ["tinyext/ext.cpp"],
                              extra_compile_args=["-O1", "-g0", "-fopenmp"],
                              extra_link_args=["-fopenmp", "-s"])],
    cmdclass={"build_ext": BuildExtension},
)
"""

# power/expf: libm calls whose default symbol versions on this toolchain are GLIBC_2.29 and
# GLIBC_2.27 (as the kernels' pow is): every tiny build shows the libm floor binding them to
# the oldest versions (builder/incell/steps.py), or its tag check fails.
TINY_CPP = """\
#include <torch/extension.h>
#include <cmath>
torch::Tensor twice(const torch::Tensor& x) { return x * 2; }
double power(double a, double b) { return std::pow(a, b); }
float expf_(float a) { return std::exp(a); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("twice", &twice);
  m.def("power", &power);
  m.def("expf", &expf_);
}
"""


def write_tiny_extension(root: Path) -> Path:
    """A second, small PEP 517 project with a torch C++ extension (``tinyext._C``)."""
    (root / "tinyext").mkdir(parents=True)
    (root / "setup.py").write_text(TINY_SETUP)
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "wheel", "torch"]
        build-backend = "setuptools.build_meta"
        """)
    )
    (root / "tinyext" / "__init__.py").write_text("")
    (root / "tinyext" / "ext.cpp").write_text(TINY_CPP)
    return root
