"""ARM wheels from this x86_64 host: cross build, auditwheel repair, run under QEMU.

A tiny torch C++ extension project (made here, independent of the kernels) goes through the
real pipeline: aarch64-linux-gnu-g++ against the aarch64 torch 2.9.1 wheel, a Debian arm64
CPython sysroot, auditwheel --plat auto, then the aarch64 interpreter under qemu-aarch64 imports
it and checks its output. The real project follows when its kernels exist.

Nothing is skipped: a host without the toolchain fails with the command that provisions it.
Cold (empty ~/.cache/ampforge): ~1 min of downloads/unpacking + builds; warm: the compiles and
two emulated `import torch` (~40 s CPU each) dominate.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from helpers.enginelib import missing
from helpers.indexlib import make_wheel
from helpers.stylelib import package_name, write_style_project

from builder.arch import QEMU_CPU_ENV
from builder.config.projecttest import ProjectTest
from builder.cross import (
    CrossToolchainMissing,
    cross_build_env,
    cross_build_wheel,
    ensure_target_python,
    ensure_target_torch,
    find_qemu,
    find_toolchain,
    repair_cross_wheel,
    run_wheel_under_qemu,
    show_wheel,
)
from builder.cross.qemu import run_target_python, run_test_under_qemu
from builder.errors import StepFailed

REPO = Path(__file__).resolve().parents[3]
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the target Python is the host's X.Y
TORCH = "2.9.1"  # the index's aarch64 torch that is a CPU build
# These tests call the cross path's building blocks directly: the interpreter running them has
# torch (make setup), so it serves as the host torch. The builder itself makes a cached host
# torch environment instead (builder.backends.cross.host_build_python; test_front_door.py).
HOST_PYTHON = sys.executable

pytestmark = pytest.mark.slow


def _require_tools():
    try:
        return find_toolchain("aarch64"), find_qemu("aarch64")
    except CrossToolchainMissing as exc:  # CI provisions these; a bare host must say how
        pytest.fail(exc.message)


@pytest.fixture(scope="module")
def toolchain():
    return _require_tools()[0]


@pytest.fixture(scope="module")
def target_python():
    _require_tools()
    return ensure_target_python(PY, "aarch64")


@pytest.fixture(scope="module")
def target_torch(target_python):
    return ensure_target_torch(TORCH, target_python)


TINY_SETUP = """
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    packages=["tinyext"],
    ext_modules=[CppExtension("tinyext._C", ["tinyext/ext.cpp"],
                              extra_compile_args=["-O2", "-g0", "-fopenmp"],
                              extra_link_args=["-fopenmp", "-s"])],
    cmdclass={"build_ext": BuildExtension},
)
"""

TINY_EXT = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

// out = a*x + y, in parallel chunks: exercises at::parallel_for through OpenMP.
torch::Tensor axpy(double a, torch::Tensor x, torch::Tensor y) {
  auto xc = x.contiguous();
  auto yc = y.contiguous();
  auto out = torch::empty_like(xc);
  const float* px = xc.data_ptr<float>();
  const float* py = yc.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float fa = static_cast<float>(a);
  at::parallel_for(0, xc.numel(), 2048, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = fa * px[i] + py[i];
  });
  return out;
}

int omp_threads() {
  int n = 0;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("axpy", &axpy);
  m.def("omp_threads", &omp_threads);
}
"""

TINY_CHECK = r"""
import json, platform
import torch
import tinyext._C as ext
x = torch.linspace(-3, 3, 100003)
y = torch.cos(x)
out = ext.axpy(-1.5, x, y)
maps = open("/proc/self/maps").read()
gomps = sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line})
print("TINY " + json.dumps({
    "machine": platform.machine(),
    "max_abs_diff": float((out - (-1.5 * x + y)).abs().max()),
    "omp_threads": ext.omp_threads(),
    "torch_threads": torch.get_num_threads(),
    "gomps": gomps,
    "torch": torch.__version__,
}))
"""


def _make_tiny_project(root: Path) -> Path:
    (root / "tinyext").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68", "wheel"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "tinyext"
        version = "0.1.0"
    """)
    )
    (root / "setup.py").write_text(TINY_SETUP)
    (root / "tinyext" / "__init__.py").write_text("import torch  # noqa: F401\n")
    (root / "tinyext" / "ext.cpp").write_text(TINY_EXT)
    return root


def _elf(data: bytes):
    return ELFFile(io.BytesIO(data))


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory, target_python, target_torch, toolchain):
    project = _make_tiny_project(tmp_path_factory.mktemp("tiny") / "proj")
    out = tmp_path_factory.mktemp("tiny-out")
    return cross_build_wheel(
        project, out, target_python, target_torch, toolchain, host_python=HOST_PYTHON
    )


@pytest.fixture(scope="module")
def tiny_repaired(tiny_wheel, tmp_path_factory, target_python, toolchain):
    out = tmp_path_factory.mktemp("tiny-repaired")
    return repair_cross_wheel(tiny_wheel.wheel, out, [*toolchain.lib_dirs, *target_python.lib_dirs])


def test_missing_toolchain_says_how_to_provision(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CrossToolchainMissing) as info:
        find_toolchain("aarch64")
    assert "aarch64-linux-gnu-g++" in info.value.message
    assert "provision.sh" in info.value.message
    with pytest.raises(CrossToolchainMissing, match="qemu-aarch64"):
        find_qemu("aarch64")


def test_unsupported_target_python_is_a_clear_error():
    with pytest.raises(StepFailed, match=r"no Debian release ships an arm64 Python 3\.7"):
        ensure_target_python("3.7", "aarch64")
    with pytest.raises(StepFailed, match="unsupported architecture 'riscv64'"):
        ensure_target_python("3.11", "riscv64")


def test_sysroot_is_an_aarch64_python_with_target_sysconfig(target_python):
    assert target_python.ext_suffix == f".cpython-{PY.replace('.', '')}-aarch64-linux-gnu.so"
    with open(target_python.executable, "rb") as fh:
        assert ELFFile(fh)["e_machine"] == "EM_AARCH64"
    namespace: dict = {}
    module = target_python.sysconfig_dir / f"{target_python.sysconfig_name}.py"
    exec(module.read_text(), namespace)
    build_vars = namespace["build_time_vars"]
    assert build_vars["MULTIARCH"] == "aarch64-linux-gnu"
    assert build_vars["INCLUDEPY"] == str(target_python.include_dir)
    assert "-g" not in build_vars["CFLAGS"].split()
    # The self-contained include folder holds the real (not the multiarch wrapper) pyconfig.h.
    assert "#include <" not in (target_python.include_dir / "pyconfig.h").read_text()
    # No OpenMP runtime in the sysroot: a wheel must work with torch's own.
    assert not list(target_python.sysroot.rglob("libgomp*"))


def test_target_torch_is_aarch64_cpu_with_its_openmp(target_torch):
    assert target_torch.full_version.startswith(TORCH)
    assert "+cpu" in target_torch.full_version
    with open(target_torch.lib_dir / "libtorch_cpu.so", "rb") as fh:
        assert ELFFile(fh)["e_machine"] == "EM_AARCH64"
    gomp = target_torch.openmp_library()
    assert gomp is not None and gomp.exists()
    # pip's host-evaluated markers would have pulled CUDA packages; none may be here.
    assert not list(target_torch.site.glob("nvidia*"))
    assert (target_torch.site / "sympy").is_dir()


def test_cross_build_names_module_and_wheel_for_aarch64(tiny_wheel, target_python, target_torch):
    name = tiny_wheel.wheel.name
    tag = "cp" + PY.replace(".", "")
    assert name == f"tinyext-0.1.0-{tag}-{tag}-linux_aarch64.whl"
    with zipfile.ZipFile(tiny_wheel.wheel) as zf:
        modules = [n for n in zf.namelist() if n.endswith(".so")]
        assert modules == [f"tinyext/_C{target_python.ext_suffix}"]
        elf = _elf(zf.read(modules[0]))
    assert elf["e_machine"] == "EM_AARCH64"
    dynamic = elf.get_section_by_name(".dynamic")
    needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
    assert {"libc10.so", "libtorch_cpu.so"} <= set(needed)
    assert not [n for n in needed if n.startswith("libpython")], needed
    # -fopenmp linked torch's own (hash-renamed) runtime, not the toolchain's libgomp.so.1.
    assert [n for n in needed if n.startswith("libgomp")] == [target_torch.openmp_library().name], (
        needed
    )
    assert not elf.get_section_by_name(".debug_info"), "release module must carry no debug info"


def test_repair_gives_manylinux_aarch64_without_grafting_torch(tiny_repaired):
    tag = tiny_repaired.tag
    assert tag.startswith("manylinux_") and tag.endswith("_aarch64"), tag
    assert tiny_repaired.wheel.name.endswith(f"-{tag}.whl")
    info = show_wheel(tiny_repaired.wheel)
    assert info["sym_tag"] == tag
    # glibc floor: the libstdc++ shim keeps GCC 12 from pulling GLIBC_2.32+.
    assert int(tag.split("_")[2]) <= 28, tag
    with zipfile.ZipFile(tiny_repaired.wheel) as zf:
        assert not [n for n in zf.namelist() if ".libs/" in n]
    assert set(tiny_repaired.external_libs) >= {"libc10.so", "libtorch_cpu.so"}


def test_repair_refuses_a_wheel_needing_an_unprovided_library(
    tiny_wheel, tmp_path, target_python, toolchain
):
    # Without torch excluded, auditwheel must either graft torch or fail: both are refused.
    with pytest.raises(StepFailed, match=r"grafted|failed|needs"):
        repair_cross_wheel(
            tiny_wheel.wheel,
            tmp_path,
            [*toolchain.lib_dirs, *target_python.lib_dirs],
            excludes=("libgomp*.so*",),
        )
    assert not list(tmp_path.glob("*.whl"))


def test_repaired_wheel_runs_on_emulated_aarch64(tiny_repaired, target_python, target_torch):
    result = run_wheel_under_qemu(tiny_repaired.wheel, target_python, target_torch, TINY_CHECK)
    line = next(x for x in result.stdout.splitlines() if x.startswith("TINY "))
    report = json.loads(line[5:])
    assert report["machine"] == "aarch64"
    assert report["torch"] == target_torch.full_version
    assert report["max_abs_diff"] < 1e-5
    assert report["omp_threads"] == report["torch_threads"] == 2
    # One OpenMP runtime in the process, torch's.
    assert len(report["gomps"]) == 1 and "torch.libs/libgomp-" in report["gomps"][0], report


HWCAPS = """
import ctypes
libc = ctypes.CDLL(None)
libc.getauxval.restype = ctypes.c_ulong
hwcap, hwcap2 = libc.getauxval(16), libc.getauxval(26)  # AT_HWCAP, AT_HWCAP2
print("HWCAPS", bool(hwcap & (1 << 22)), bool(hwcap2 & (1 << 14)))  # HWCAP_SVE, HWCAP2_BF16
"""


def test_the_emulated_cpu_is_a_server_class_armv8_2_unless_asked(target_python, monkeypatch):
    """QEMU's default CPU (``max``) has BF16 and SVE, which torch 2.1's oneDNN then fails to use
    ("could not create a primitive descriptor for a matmul primitive"); the cross path emulates
    the arch's model (Neoverse N1: neither), and AMPFORGE_QEMU_CPU= brings QEMU's back."""

    def caps() -> str:
        out = run_target_python(target_python, ["-c", HWCAPS]).stdout
        return next(x for x in out.splitlines() if x.startswith("HWCAPS "))

    monkeypatch.delenv(QEMU_CPU_ENV, raising=False)
    assert caps() == "HWCAPS False False"
    monkeypatch.setenv(QEMU_CPU_ENV, "")
    assert caps() == "HWCAPS True True"
    monkeypatch.setenv(QEMU_CPU_ENV, "a64fx")  # SVE without BF16
    assert caps() == "HWCAPS True False"


def test_test_command_runs_on_the_emulated_target(target_python, tmp_path):
    """The cross cells' test-command: ``python`` is the aarch64 interpreter under QEMU, the
    test-requires are installed for the target, placeholders name the project; a failure
    shows the output's tail. (No torch import here: verify_wheel does that part.)"""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "check.py").write_text(
        "import platform, sys, ampforge_probe\n"
        "print('cross-test', platform.machine(), ampforge_probe.VERSION, sys.argv[1])\n"
    )
    probe = make_wheel(tmp_path / "probe", "ampforge-probe", "4711")
    test = ProjectTest(
        requires=(f"ampforge-probe @ {probe.as_uri()}",),
        command="python {project}/check.py {package}",
    )
    logged: list[str] = []
    report = run_test_under_qemu(
        test, target_python, [], tmp_path / "scratch", project=project, log=logged.extend
    )
    assert report["tail"][-1] == f"cross-test aarch64 4711 {project}", report
    assert logged[0] == (f"+ test-command (qemu-aarch64): python {project}/check.py {project}")
    failing = ProjectTest(command="python -c 'print(\"cross-fail-sentinel\")' && exit 4")
    with pytest.raises(StepFailed) as info:
        run_test_under_qemu(failing, target_python, [], tmp_path / "scratch2", project=project)
    assert "test-command failed under qemu-aarch64 with exit code 4" in info.value.message
    assert "cross-fail-sentinel" in info.value.message


def test_broken_source_reports_compiler_error_and_log(
    tmp_path, target_python, target_torch, toolchain
):
    project = _make_tiny_project(tmp_path / "proj")
    (project / "tinyext" / "ext.cpp").write_text("#error deliberately broken kernel\n")
    with pytest.raises(StepFailed) as info:
        cross_build_wheel(
            project,
            tmp_path / "out",
            target_python,
            target_torch,
            toolchain,
            host_python=HOST_PYTHON,
        )
    assert "deliberately broken kernel" in info.value.message
    assert "full log:" in info.value.message
    assert not list((tmp_path / "out").glob("*.whl"))


def test_a_host_interpreter_without_torch_is_refused_in_one_line(
    tmp_path, target_python, target_torch, toolchain
):
    """The failure the README's `make wheel ARCH=ARM` once met on a fresh clone (the builder's
    own torch-free interpreter ran setup.py): one line saying what is missing and how to get
    it, before pip buries a ModuleNotFoundError in metadata-generation-failed."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
        check=True,
        timeout=120,
    )
    bare = str(tmp_path / "bare" / "bin" / "python")
    project = _make_tiny_project(tmp_path / "proj")
    with pytest.raises(StepFailed) as info:
        cross_build_wheel(
            project, tmp_path / "out", target_python, target_torch, toolchain, host_python=bare
        )
    first = info.value.message.splitlines()[0]
    assert first.startswith(f"cross build: the host interpreter {bare} cannot import torch ("), (
        first
    )
    assert "No module named 'torch'" in first and "needs a host torch" in first, first
    assert not list((tmp_path / "out").glob("*.whl"))


def test_not_a_project_is_refused(tmp_path, target_python, target_torch, toolchain):
    with pytest.raises(StepFailed, match="not a Python project"):
        cross_build_wheel(
            tmp_path,
            tmp_path / "out",
            target_python,
            target_torch,
            toolchain,
            host_python=HOST_PYTHON,
        )


def test_host_build_environment_does_not_leak(target_python, target_torch, toolchain, tmp_path):
    # The build env must point the compiler at the target; the host interpreter still runs.
    env = cross_build_env(target_python, target_torch, toolchain, tmp_path, base_env={})
    code = (
        "import sysconfig, torch.utils.cpp_extension as c; "
        "print(sysconfig.get_config_var('EXT_SUFFIX')); print(sysconfig.get_platform()); "
        "print(c.include_paths()[0]); print(c.library_paths()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == target_python.ext_suffix
    assert out[1] == "linux-aarch64"
    assert out[2] == str(target_torch.torch_dir / "include")
    assert out[3] == str(target_torch.lib_dir)


def test_ninja_build_goes_through_the_same_ccache_links(
    tmp_path, monkeypatch, target_python, target_torch, toolchain
):
    """torch's default ninja BuildExtension, cross-compiled twice through ccache (the in-cell
    builds' masquerade links, builder.incell.steps.ccache_masquerade) into a private cache: the
    first misses, the second hits every compile and gives the same module bytes."""
    if shutil.which("ccache") is None:
        missing("ccache is not installed", ".ci/run installs the ccache package")
    monkeypatch.setenv("AMPFORGE_CACHE", str(tmp_path / "cache"))  # only ccache reads it here
    built = []
    for run in ("one", "two"):
        project = write_style_project(tmp_path / run / "proj", "ninja")
        built.append(
            cross_build_wheel(
                project,
                tmp_path / run / "out",
                target_python,
                target_torch,
                toolchain,
                ccache=True,
                host_python=HOST_PYTHON,
            )
        )
    cold, warm = built[0].ccache, built[1].ccache
    assert cold is not None and warm is not None
    assert cold.misses >= 1 and cold.hits == 0
    assert (warm.hits, warm.misses) == (cold.misses, 0)
    modules = []
    for one in built:
        with zipfile.ZipFile(one.wheel) as zf:
            (so,) = [n for n in zf.namelist() if n.endswith(target_python.ext_suffix)]
            assert so.startswith(package_name("ninja") + "/_C")
            modules.append(zf.read(so))
    assert modules[0] == modules[1]
