"""Tiny projects, one per way a Python project drives the compiler, for the compiler-cache tests:
torch's ``BuildExtension`` with ninja (torch's default) and without, plain setuptools, CMake.

Each compiles one small C/C++ file that needs no torch header (a compile of seconds, not the
half minute of ``torch/extension.h``): what is under test is how the build runs the compiler,
which is the same for any source. Each module exports ``answer()`` -> 42 and records which build
style made it (``style``), so a test can import it and see it is the right one.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

STYLES: tuple[str, ...] = ("ninja", "no-ninja", "setuptools", "cmake")

_MODULE_C = """\
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define STR2(x) #x
#define STR(x) STR2(x)
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) {
  PyObject *m = PyModule_Create(&module);
  if (m != NULL) PyModule_AddStringConstant(m, "style", STR(STYLE));
  return m;
}
"""

_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
"""

_TORCH_SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, is_ninja_available

USE_NINJA = {use_ninja}
# The style under test, or a failure: torch falls back to setuptools without a ninja.
assert is_ninja_available() or not USE_NINJA, "ninja is not installed"
setup(
    name="{name}", version="0.1", packages=["{name}"],
    ext_modules=[CppExtension("{name}._C", ["{name}/mod.cpp"],
                              extra_compile_args=["-O1", "-g0", "-DSTYLE={style}"])],
    cmdclass={{"build_ext": BuildExtension.with_options(use_ninja=USE_NINJA)}},
)
"""

_SETUPTOOLS_SETUP = """\
from setuptools import Extension, setup

setup(name="{name}", version="0.1", packages=["{name}"],
      ext_modules=[Extension("{name}._C", ["{name}/mod.c"],
                             extra_compile_args=["-O1", "-g0"],
                             define_macros=[("STYLE", "{style}")])])
"""

# A setup.py whose build_ext hands the compile to CMake (as pybind11's cmake_example and many
# C++ projects do): CMake picks the compiler from CC, as it does on any machine.
_CMAKE_SETUP = """\
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        tree = Path(self.build_temp).resolve() / "cmake"
        subprocess.check_call(["cmake", "-S", str(Path(__file__).parent.resolve()), "-B",
                               str(tree), "-DPython_EXECUTABLE=" + sys.executable,
                               "-DCMAKE_BUILD_TYPE=Release",
                               "-DOUT_DIR=" + str(out.parent)])
        subprocess.check_call(["cmake", "--build", str(tree)])


setup(name="{name}", version="0.1", packages=["{name}"],
      ext_modules=[Extension("{name}._C", [])], cmdclass={{"build_ext": CMakeBuild}})
"""

_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.18)
project({name} C)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
Python_add_library(_C MODULE {name}/mod.c WITH_SOABI)
target_compile_definitions(_C PRIVATE STYLE={style})
target_compile_options(_C PRIVATE -O1 -g0)
set_target_properties(_C PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${{OUT_DIR}})
"""


def package_name(style: str) -> str:
    return "style_" + style.replace("-", "_")


def write_style_project(root: Path, style: str) -> Path:
    """A project in *root* whose extension ``<package_name(style)>._C`` is built the *style*
    way (one of STYLES)."""
    name = package_name(style)
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(_PYPROJECT)
    if style in ("ninja", "no-ninja"):
        (root / name / "mod.cpp").write_text(_MODULE_C)
        setup = _TORCH_SETUP.format(name=name, style=style, use_ninja=style == "ninja")
    elif style == "setuptools":
        (root / name / "mod.c").write_text(_MODULE_C)
        setup = _SETUPTOOLS_SETUP.format(name=name, style=style)
    elif style == "cmake":
        (root / name / "mod.c").write_text(_MODULE_C)
        (root / "CMakeLists.txt").write_text(_CMAKELISTS.format(name=name, style=style))
        setup = _CMAKE_SETUP.format(name=name)
    else:
        raise ValueError(f"unknown build style {style!r}; expected one of {STYLES}")
    (root / "setup.py").write_text(textwrap.dedent(setup))
    return root


_ANSWER_CPP = """\
#include <Python.h>
#include <sstream>
#ifndef {macro}
#define {macro} 0
#endif
static PyObject *answer(PyObject *, PyObject *) {{
  std::ostringstream out;
  out << {macro};
  return PyLong_FromString(out.str().c_str(), NULL, 10);
}}
static PyMethodDef methods[] = {{{{"answer", answer, METH_NOARGS, ""}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{module}(void) {{ return PyModule_Create(&module); }}
"""


def answer_module_cpp(module: str, macro: str) -> str:
    """A top-level C++ extension module *module* whose ``answer()`` is the compile-time macro
    *macro* (0 when undefined). It goes through libstdc++, as any real extension does: a module
    with no versioned symbol at all is tagged manylinux1 by auditwheel, which the own-code
    check refuses."""
    return _ANSWER_CPP.format(module=module, macro=macro)
