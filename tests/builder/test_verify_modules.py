"""Verification sees every compiled file a wheel ships (issue 28): extension modules are told from
other shared objects by the ``PyInit_<name>`` they export, top-level ones included (apex's
``apex_C.cpython-311-…so`` was skipped: "imported []"); and ``build.extra_cflags`` reaches the
compiler. One real host build shows both: a top-level module whose answer is a macro only the
config file's flag defines, listed in the manifest, imported by verification.

The failing import of a top-level module (exit 1, dist/ untouched) is in test_pipeline_failures.py.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

from enginelib import wheelhouse_cp311
from pipelinelib import CELL, manifest, run_build
from stylelib import answer_module_cpp

from builder.wheel.modules import compiled_files, installed_path

TOP_CPP = answer_module_cpp("topext_C", "TOPEXT_ANSWER")

TOP_SETUP = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="topext", version="0.1", py_modules=[],
      ext_modules=[CppExtension("topext_C", ["topext_C.cpp"], extra_compile_args=["-g0"])],
      cmdclass={"build_ext": BuildExtension})
"""


def _compile(tmp: Path, name: str, source: str) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    str(src), "-o", str(out)], check=True)
    return out.read_bytes()


def test_modules_are_told_from_libraries_by_their_init_symbol(tmp_path: Path) -> None:
    module = _compile(tmp_path, "m", "#include <Python.h>\n"
                      "PyMODINIT_FUNC PyInit_apex_C(void) { return NULL; }\n")
    library = _compile(tmp_path, "lib", "int op(void) { return 1; }\n")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    wheel = tmp_path / "x-1-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"apex_C{suffix}", module)  # top level: was skipped before
        zf.writestr(f"pkg/sub/apex_C{suffix}", module)
        zf.writestr("x-1.data/platlib/apex_C.abi3.so", module)  # installs at top level
        zf.writestr("pkg/_ops_cpu.so", library)  # a torch op library: loaded, not imported
        zf.writestr("pkg.libs/libgrafted-1234.so", library)  # auditwheel's: a dependency
        zf.writestr("x-1.data/headers/h.so", library)  # never importable
        zf.writestr("x-1.dist-info/RECORD", "")
    got = compiled_files(wheel)
    assert got.modules == ("apex_C", "pkg.sub.apex_C")
    assert got.libraries == ("pkg/_ops_cpu.so",)
    assert installed_path("x-1.data/purelib/a/b.py") == "a/b.py"
    assert installed_path("x-1.dist-info/METADATA") is None


def test_top_level_module_is_imported_listed_and_built_with_extra_cflags(tmp_path: Path) -> None:
    project = tmp_path / "topext"
    project.mkdir()
    (project / "setup.py").write_text(TOP_SETUP)
    (project / "topext_C.cpp").write_text(TOP_CPP)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "torch"]\n'
        'build-backend = "setuptools.build_meta"\n')
    config = tmp_path / "matrix.yaml"
    config.write_text(textwrap.dedent(f"""\
        support: {Path(__file__).resolve().parents[2] / "configs" / "support.yaml"}
        matrix: {{arch: [X86], python: ["3.11"], torch: ["2.13.0"]}}
        build:
          extra_cflags: ["-DTOPEXT_ANSWER=4711"]
        """))
    check = "import torch, topext_C; assert topext_C.answer() == 4711, topext_C.answer()"
    r = run_build(tmp_path, "--backend", "host", "--project", str(project), "--config",
                  str(config), "--wheelhouse", str(wheelhouse_cp311()),
                  "--test-command", f"python -c {check!r}")
    assert r.rc == 0, r.err
    (entry,) = [e for e in manifest(tmp_path / "dist")["wheels"] if e["cell"] == CELL]
    assert entry["extra"]["modules"] == ["topext_C"]
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "smoke: imported ['topext_C']" in log
    assert "test-command exit 0" in log
    (wheel,) = (tmp_path / "dist").glob("topext-*.whl")
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    out = subprocess.run([sys.executable, "-c", "import torch, topext_C; print(topext_C.answer())"],
                         cwd=unpacked, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "4711"
