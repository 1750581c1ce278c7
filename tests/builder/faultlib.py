"""Helpers for the fault tests (issue 27 parts 1-3): a file system that really fills, and the
smallest project the host backend builds end to end.

* :func:`small_disk` -- a size-limited tmpfs mounted at a folder (root: ``mount -t tmpfs -o
  size=...``). Chosen over a loop-mounted ext4 image: both work as root here, but tmpfs needs no
  free ``/dev/loop*`` device (containers often have none) and no image file, mounts in
  milliseconds and can be grown in place (:func:`grow`), which is "the next run with space".
  Without the privilege to mount, the test fails under CI and is skipped elsewhere, saying so.
* :func:`leave_free` -- fill a small disk until only so many bytes are free.
* :func:`write_c_project` -- a one-file C extension (no torch headers: it compiles in a
  fraction of a second, so the fault, not the compiler, is what the test waits for); the
  pipeline around it is the full one (torch environment, label, repair, verify, publish).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

from enginelib import missing

from builder.diskspace import free_bytes

C_CELL = "cp311-manylinux_x86_64-torch2.13.0"


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of *size* (``mount``'s syntax: ``512k``, ``4m``) mounted at *path*, unmounted
    (lazily, so a process still inside cannot keep it) when the block ends."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        missing(f"cannot mount a size-limited tmpfs at {path} ({r.stderr.strip()}); the "
                "disk-full tests need root with CAP_SYS_ADMIN", ".ci/run runs as root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def grow(path: Path, size: str) -> None:
    """Give the tmpfs at *path* more room, keeping its files (the user freeing space)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def leave_free(disk: Path, free: int) -> Path:
    """Fill *disk* (a :func:`small_disk`) with one file until at most *free* bytes are left;
    returns the filler (outside any folder the test compares)."""
    filler = disk / "filler"
    with filler.open("ab") as fh:
        while free_bytes(disk) > free:
            chunk = min(1 << 20, free_bytes(disk) - free)
            fh.write(b"\0" * max(chunk, 1))
            fh.flush()
            os.fsync(fh.fileno())
    return filler


C_SOURCE = """\
#define _GNU_SOURCE
#include <Python.h>
#include <stdlib.h>
/* BLOB bytes of initialised data: the object file and the module are that big, which a
   small work folder cannot hold (a zip of them stays small: dist/ gets a few kB). */
static const unsigned char blob[BLOB] = {1};
static PyObject *first(PyObject *self, PyObject *args) {
  /* secure_getenv is GLIBC_2.17: the wheel's tag is manylinux2014, as a real one's. */
  return PyLong_FromLong(blob[0] + (secure_getenv("CEXT_NEVER_SET") != NULL));
}
static PyMethodDef methods[] = {{"first", first, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, methods};
PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&module); }
"""


def write_c_project(root: Path, blob: int = 1, version: str = "0.0.1") -> Path:
    """``cext``: one C module with *blob* bytes of data; its wheel needs no torch to build."""
    (root / "cext").mkdir(parents=True)
    (root / "setup.py").write_text(textwrap.dedent(f"""\
        from setuptools import Extension, setup
        setup(name="cext", version="{version}", packages=["cext"],
              ext_modules=[Extension("cext._c", ["cext/c.c"],
                                     define_macros=[("BLOB", "{blob}")],
                                     extra_compile_args=["-g0", "-O0"])])
        """))
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "wheel"]
        build-backend = "setuptools.build_meta"
        """))
    (root / "cext" / "__init__.py").write_text("")
    (root / "cext" / "c.c").write_text(C_SOURCE)
    return root


def no_partial_files(*folders: Path) -> list[Path]:
    """Hidden temporary files the builder writes before a rename (``.name.xxxx.tmp``) and
    cache entries being filled (``.name.xxxx`` folders): none may outlive a failed run."""
    left = []
    for folder in folders:
        if folder.exists():
            left += [p for p in folder.rglob(".*") if p.name.endswith(".tmp")
                     or ".previous-" in p.name or (p.is_dir() and p.name.count(".") >= 2)]
    return left
