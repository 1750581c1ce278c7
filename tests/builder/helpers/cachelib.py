"""A host build of a one-file C extension against a stand-in ``torch==2.13.0`` (a real, tiny
wheel: the builder's torch handling is what is under test, not torch), in a PRIVATE cache
folder (``AMPFORGE_CACHE``) -- never the shared one. pip sees only the lab's wheelhouse (no
machine-wide configuration), so the stand-in is what it installs. Used by the cache tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

from helpers.enginelib import wheelhouse_cp311
from helpers.indexlib import make_wheel
from helpers.pipelinelib import build_argv, builder_env

C_SOURCE = """\
#define _GNU_SOURCE
#include <Python.h>
#include <stdlib.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, NULL};
/* secure_getenv (GLIBC_2.17): without any versioned glibc symbol auditwheel tags the wheel
   manylinux1, below the floor the builder's tag check assumes for x86_64. */
PyMODINIT_FUNC PyInit__c(void) { (void)secure_getenv("CEXT"); return PyModule_Create(&m); }
"""


def write_c_project(root: Path) -> Path:
    (root / "cext").mkdir(parents=True)
    (root / "cext" / "__init__.py").write_text("")
    (root / "cext" / "c.c").write_text(C_SOURCE)
    (root / "setup.py").write_text(
        textwrap.dedent("""\
        from setuptools import Extension, setup
        setup(name="cext", version="0.0.1", packages=["cext"],
              ext_modules=[Extension("cext._c", ["cext/c.c"], extra_compile_args=["-g0"])])
        """)
    )
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "wheel"]
        build-backend = "setuptools.build_meta"
        """)
    )
    return root


@dataclass(frozen=True)
class Lab:
    project: Path
    house: Path  # stand-in torch, setuptools, wheel, packaging


def make_lab(root: Path) -> Lab:
    """A one-file C project and a wheelhouse with a stand-in torch==2.13.0 (a real, tiny wheel)
    and the build requirements."""
    house = root / "house"
    make_wheel(house, "torch", "2.13.0")
    for pattern in ("setuptools-*.whl", "wheel-*.whl", "packaging-*.whl"):
        for wheel in wheelhouse_cp311().glob(pattern):
            shutil.copy(wheel, house / wheel.name)
    return Lab(write_c_project(root / "cext"), house)


def build(
    lab: Lab,
    tmp: Path,
    cache: Path,
    *more: str,
    house: Path | None = None,
    project: Path | None = None,
):
    env = {
        k: v for k, v in builder_env(AMPFORGE_CACHE=str(cache)).items() if not k.startswith("PIP_")
    }
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide find-links with the real torch
    argv = build_argv(
        tmp,
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--project",
        str(project or lab.project),
        "--find-links",
        str(house or lab.house),
        *more,
    )
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp, timeout=900)
