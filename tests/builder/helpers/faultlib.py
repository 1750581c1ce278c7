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
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.diskspace import free_bytes
from helpers.enginelib import missing

C_CELL = "cp311-manylinux_x86_64-torch2.13.0"


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of *size* (``mount``'s syntax: ``512k``, ``4m``) mounted at *path*, unmounted
    (lazily, so a process still inside cannot keep it) when the block ends."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        missing(
            f"cannot mount a size-limited tmpfs at {path} ({r.stderr.strip()}); the "
            "disk-full tests need root with CAP_SYS_ADMIN",
            ".ci/run runs as root",
        )
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
    (root / "setup.py").write_text(
        textwrap.dedent(f"""\
        from setuptools import Extension, setup
        setup(name="cext", version="{version}", packages=["cext"],
              ext_modules=[Extension("cext._c", ["cext/c.c"],
                                     define_macros=[("BLOB", "{blob}")],
                                     extra_compile_args=["-g0", "-O0"])])
        """)
    )
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "wheel"]
        build-backend = "setuptools.build_meta"
        """)
    )
    (root / "cext" / "__init__.py").write_text("")
    (root / "cext" / "c.c").write_text(C_SOURCE)
    return root


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Return once *path* holds *text* (a condition the test waits on, not a delay); fail the
    test, killing *proc*, if *proc* ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    seen = path.read_text()[-3000:] if path.exists() else "(nothing)"
    pytest.fail(f"never saw {text!r} in {path}: {seen}")


def no_partial_files(*folders: Path) -> list[Path]:
    """Hidden temporary files the builder writes before a rename (``.name.xxxx.tmp``) and
    cache entries being filled (``.name.xxxx`` folders): none may outlive a failed run."""
    left = []
    for folder in folders:
        if folder.exists():
            left += [
                p
                for p in folder.rglob(".*")
                if p.name.endswith(".tmp")
                or ".previous-" in p.name
                or (p.is_dir() and p.name.count(".") >= 2)
            ]
    return left


# ------------------------------------------------------------------ a private container engine

#: One static program standing in for a whole base image: ``sh`` succeeds (every RUN step of a
#: recipe "passes"), ``mkdir`` makes folders (the engine's sessions ask for them), ``sleep``
#: (a container's keep-alive) and any ``python`` wait forever; a python first prints
#: CELL_MARK, so the test knows the cell is running inside its container.
CELL_MARK = "ampforge-fault: the cell's python runs"
FAKE_TOOLS = r"""
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static void mkdirs(char *path) {
  for (char *p = path + 1; *p; p++)
    if (*p == '/') { *p = 0; mkdir(path, 0755); *p = '/'; }
  mkdir(path, 0755);
}
int main(int argc, char **argv) {
  const char *name = strrchr(argv[0], '/');
  name = name ? name + 1 : argv[0];
  if (strcmp(name, "sh") == 0) return 0;
  if (strcmp(name, "mkdir") == 0) {
    for (int i = 1; i < argc; i++) if (argv[i][0] != '-') mkdirs(argv[i]);
    return 0;
  }
  if (strncmp(name, "python", 6) == 0) { printf("%s\n", "MARK"); fflush(stdout); }
  if (strcmp(name, "sleep") == 0 || strncmp(name, "python", 6) == 0) for (;;) pause();
  return 0;
}
""".replace("MARK", CELL_MARK)
FAKE_LINKS = (
    "bin/sh",
    "bin/mkdir",
    "bin/sleep",
    "usr/bin/python3.11",
    "usr/local/bin/python3.11",
    "opt/ampforge/venv/bin/python",
    "opt/python/cp311-cp311/bin/python",
)


def fake_base_image(engine_host: str, workdir: Path, tag: str) -> str:
    """Import a rootfs of :data:`FAKE_TOOLS` (one static binary under every name in
    FAKE_LINKS, a passwd with the build user) into the engine at *engine_host* as *tag*."""
    root = workdir / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\nbuilder:x:1000:1000::/home/builder:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nbuilder:x:1000:\n")
    (workdir / "tools.c").write_text(FAKE_TOOLS)
    subprocess.run(
        ["gcc", "-static", "-O1", "-o", str(workdir / "tools"), str(workdir / "tools.c")],
        check=True,
    )
    for link in FAKE_LINKS:
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(workdir / "tools", root / link)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], check=True, capture_output=True)
    subprocess.run(
        ["docker", "-H", engine_host, "import", "-", tag],
        input=tar.stdout,
        check=True,
        capture_output=True,
    )
    return tag


class PrivateDockerd:
    """A dockerd of the test's own (data root, exec root, pid file and socket under one short
    folder; a bridge of its own and no iptables rules, so it never touches the shared engine's
    network), started and killed at will. Never the engine other tests use.

    Not ``--bridge=none``: a dockerd with its bridge disabled deletes the interface named
    ``docker0`` at start-up -- the shared engine's, whose every later container then fails
    ("could not find bridge docker0"). So the daemon gets a bridge made for it, removed in
    :meth:`stop`, and :meth:`stop` checks that the shared engine's bridge is still there."""

    def __init__(self) -> None:
        # A Unix socket path must stay under 108 bytes: not under pytest's long tmp_path.
        self.root = Path(tempfile.mkdtemp(prefix="afd-", dir="/tmp"))
        self.host = f"unix://{self.root}/sock"
        self.proc: subprocess.Popen | None = None
        # An interface name has at most 15 characters; the address block is one no default
        # Docker pool hands out (those are 172.17-31.x and 192.168.x).
        self.bridge = f"afd{os.getpid() % 100000}{self.root.name[-3:]}"[:15]
        self.shared_bridge_before = _link_exists("docker0")

    def start(self, wait: float = 60) -> None:
        if shutil.which("dockerd") is None:
            missing("dockerd is not installed", ".ci/run installs docker.io")
        log = (self.root / "log").open("a")
        if not _link_exists(self.bridge):
            for argv in (
                ["ip", "link", "add", self.bridge, "type", "bridge"],
                ["ip", "addr", "add", f"10.254.{os.getpid() % 250}.1/24", "dev", self.bridge],
                ["ip", "link", "set", self.bridge, "up"],
            ):
                subprocess.run(argv, check=True, capture_output=True)
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "pid"),
                "-H",
                self.host,
                f"--bridge={self.bridge}",
                "--iptables=false",
                "--ip-masq=false",
                # A container's pid 1 that ignores SIGTERM would hold a stop for 15 s.
                "--shutdown-timeout=1",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if (
                subprocess.run(
                    ["docker", "-H", self.host, "info"], capture_output=True, check=False
                ).returncode
                == 0
            ):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        missing(
            f"a private dockerd did not start: {(self.root / 'log').read_text()[-2000:]}",
            ".ci/run installs docker.io and runs as root",
        )

    def stop_daemon(self) -> None:
        """The engine stops under a running build (SIGTERM, as ``systemctl stop docker``: it
        stops its containers and closes its socket). Not SIGKILL: dockerd then takes its
        containerd down with it but not the containers' shims, and a new dockerd on the same
        folders times out waiting for containerd -- the daemon's own recovery, not the
        builder's, and it would leave processes behind."""
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def containers(self) -> list[str]:
        out = subprocess.run(
            ["docker", "-H", self.host, "ps", "-aq"], capture_output=True, text=True, check=True
        ).stdout
        return out.split()

    def stop(self) -> None:
        """SIGTERM (the daemon removes its mounts), then its containerd; then the folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        pid_file = self.root / "exec" / "containerd" / "containerd.pid"
        if pid_file.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        subprocess.run(
            ["umount", "-R", "-l", str(self.root / "data")], capture_output=True, check=False
        )
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        assert _link_exists("docker0") == self.shared_bridge_before, (
            "the private dockerd removed the shared engine's docker0 bridge"
        )


def _link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode
        == 0
    )
