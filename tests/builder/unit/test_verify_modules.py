"""Verification sees every compiled file a wheel ships (issue 28): extension modules are told from
other shared objects by the ``PyInit_<name>`` they export, top-level ones included (apex's
``apex_C.cpython-311-…so`` was skipped: "imported []").

A real host build of a top-level module, imported by verification and listed in the manifest, is
test_build_options.py's (which also proves ``build.extra_cflags`` reaches the compiler); the
failing import of a top-level module (exit 1, dist/ untouched) is in test_pipeline_failures.py.
"""

from __future__ import annotations

import subprocess
import sysconfig
import zipfile
from pathlib import Path

from builder.wheel.modules import compiled_files, installed_path


def _compile(tmp: Path, name: str, source: str) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(src),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out.read_bytes()


def test_modules_are_told_from_libraries_by_their_init_symbol(tmp_path: Path) -> None:
    module = _compile(
        tmp_path, "m", "#include <Python.h>\nPyMODINIT_FUNC PyInit_apex_C(void) { return NULL; }\n"
    )
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
