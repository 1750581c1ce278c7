"""Hostile and odd ``--project`` trees: the copy a build gets takes the project's own files and
nothing from outside it. Every tree here is made of real things -- symlinks out of the project
(absolute, relative, chained, to a folder), FIFOs, a socket, a device node, ``.git`` folders, a
sparse file of tens of gigabytes -- and the real copy (builder.projecttree, what every backend
builds from), the real input-key digest, the real CLI and a real host build of a tiny torch
extension whose ``setup.py`` tries to read everything it can see."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import builder_env, manifest, run_build

from builder.config.buildoptions import CibwOptions
from builder.errors import ConfigError, StepFailed
from builder.incell import copy_project_in
from builder.inputkey import tree_digest
from builder.projecttree import (
    DEFAULT_FILE_LIMIT,
    LARGE_FILE,
    LIMIT_VAR,
    check_project_tree,
    copy_project_tree,
    file_limit,
)
from builder.redact import Redactor

SECRET = "outside-secret-3f9c1e-never-in-a-build"


def _outside(root: Path) -> Path:
    """A folder beside the project holding a secret file (what the links point at)."""
    out = root / "outside"
    out.mkdir(parents=True)
    (out / "secret.txt").write_text(SECRET + "\n")
    (out / "nested").mkdir()
    (out / "nested" / "key.pem").write_text(SECRET + " key\n")
    return out


def _device_allowed(path: Path) -> bool:
    """Make a character device node (/dev/null's numbers) at *path* if this user may."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        return False
    return True


def _hostile_tree(project: Path, outside: Path) -> dict[str, Any]:
    """Links out (absolute, relative, via another link, to a folder), links in (relative,
    absolute, to a folder, dangling), a FIFO, a socket, a device node when allowed, ``.git``
    at the top and in a subfolder (a submodule's ``.git`` file)."""
    (project / "pkg").mkdir(parents=True, exist_ok=True)
    (project / "pkg" / "data.txt").write_text("inside data\n")
    (project / "pkg" / "link-abs-out").symlink_to(outside / "secret.txt")
    (project / "link-rel-out").symlink_to(os.path.relpath(outside / "secret.txt", project))
    (project / "link-dir-out").symlink_to(outside)
    (project / "pkg" / "chain").symlink_to("link-abs-out")  # inside -> a link that leaves
    (project / "in-rel").symlink_to("pkg/data.txt")
    (project / "in-abs").symlink_to(project / "pkg" / "data.txt")  # absolute, into the project
    (project / "in-dir").symlink_to("pkg")
    (project / "dangling").symlink_to("no-such-file")
    os.mkfifo(project / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(project / "pkg" / "sock"))
    device = _device_allowed(project / "null-device")
    (project / ".git").mkdir()
    (project / ".git" / "config").write_text(f"[credential]\n\thelper = {SECRET}\n")
    (project / "vendor").mkdir()
    (project / "vendor" / ".git").write_text("gitdir: ../.git/modules/vendor\n")
    (project / "vendor" / "v.py").write_text("V = 1\n")
    return {"socket": sock, "device": device}


def _finishes(fn: Callable[[], Any], seconds: float = 60) -> Any:
    """*fn*'s result; fails the test if it is still running after *seconds* (a FIFO opened
    for reading blocks forever)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds}s (blocked on a FIFO?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under *root* (not following links, never opening a FIFO): its kind, mode,
    mtime and bytes or link target."""
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                seen[rel] = ("file", st.st_mode, st.st_mtime_ns, Path(path).read_bytes())
            else:
                seen[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns)
    return seen


def _everything_readable(root: Path) -> str:
    """The text of every file reachable under *root*, links followed (what a build could
    read through the copy)."""
    texts = []
    for dirpath, _dirs, filenames in os.walk(root, followlinks=True):
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_file():  # a regular file, through any links
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


@pytest.mark.promise(
    promise="a project's copy for a build holds only the project's own files: nothing from "
    "outside it, no FIFO, socket or device, no .git, and says what it left out",
    fault="a project tree with symlinks out of it (absolute, relative, to a folder, through "
    "another link), links inside it (one absolute), a dangling link, a FIFO, a socket, a "
    "device node, a .git folder and a submodule's .git file",
    result="the copy finishes (nothing blocks); no file reachable in it holds the outside "
    "secret; every link in it resolves inside the copy; one report line per kind names "
    "every skipped path; inside files keep their bytes, mode and mtime",
)
def test_the_copy_takes_nothing_from_outside_and_no_special_files(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    project = tmp_path / "project"
    made = _hostile_tree(project, outside)
    before_outside = _snapshot(outside)
    dest = tmp_path / "copy"
    report = _finishes(lambda: copy_project_tree(project, dest))
    made["socket"].close()

    assert SECRET not in _everything_readable(dest)
    # Every link in the copy resolves inside the copy (the absolute one was rewritten).
    links = {}
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            if path.is_symlink():
                links[path.relative_to(dest).as_posix()] = os.readlink(path)
                real = os.path.realpath(path)
                assert os.path.commonpath([os.path.realpath(dest), real]) == os.path.realpath(
                    dest
                ), f"{path} -> {os.readlink(path)} leaves the copy"
    assert links == {
        "in-rel": "pkg/data.txt",
        "in-abs": "pkg/data.txt",
        "in-dir": "pkg",
        "dangling": "no-such-file",
    }
    assert (dest / "in-abs").read_text() == "inside data\n"
    assert (dest / "in-dir" / "data.txt").read_text() == "inside data\n"
    for gone in (
        "pkg/link-abs-out",
        "link-rel-out",
        "link-dir-out",
        "pkg/chain",
        "pipe",
        "pkg/sock",
        "null-device",
        ".git",
        "vendor/.git",
    ):
        assert not os.path.lexists(dest / gone), gone
    assert (dest / "vendor" / "v.py").read_text() == "V = 1\n"
    src_st, copy_st = (p.stat() for p in (project / "pkg" / "data.txt", dest / "pkg" / "data.txt"))
    assert (copy_st.st_mtime_ns, copy_st.st_mode) == (src_st.st_mtime_ns, src_st.st_mode)

    lines = report.lines()
    assert len(lines) == 3, lines
    outside_line, special_line, vcs_line = lines
    assert outside_line.startswith("project copy: skipped 4 symlink(s) pointing outside")
    for link, target in (
        ("pkg/link-abs-out", str(outside / "secret.txt")),
        ("link-rel-out", "../outside/secret.txt"),
        ("link-dir-out", str(outside)),
        ("pkg/chain", "link-abs-out"),
    ):
        assert f"{link} -> {target}" in outside_line
    specials = ["pipe (FIFO)", "pkg/sock (socket)"]
    if made["device"]:
        specials.append("null-device (character device)")
    assert special_line.startswith(f"project copy: skipped {len(specials)} special file(s)")
    assert all(s in special_line for s in specials), special_line
    assert vcs_line.startswith("project copy: not copied: .git, vendor/.git (version control")
    assert "\n" not in "".join(lines) and "Traceback" not in "".join(lines)
    # The same report without copying (what `build` says once), and the outside untouched.
    assert check_project_tree(project).lines() == lines
    assert _snapshot(outside) == before_outside


def test_the_input_key_neither_follows_links_out_nor_opens_fifos(tmp_path: Path) -> None:
    """The project's digest (the cells' input key) changes with the project's files, not with
    what its links out point at, and a FIFO in the tree does not block it."""
    outside = _outside(tmp_path)
    project = tmp_path / "project"
    made = _hostile_tree(project, outside)
    first = _finishes(lambda: tree_digest(project))
    (outside / "secret.txt").write_text("changed outside\n")
    (outside / "nested" / "new.txt").write_text("new outside\n")
    assert _finishes(lambda: tree_digest(project)) == first
    (project / "pkg" / "data.txt").write_text("changed inside\n")
    assert _finishes(lambda: tree_digest(project)) != first
    made["socket"].close()


def test_a_large_file_is_copied_sparse_and_named(tmp_path: Path) -> None:
    """A file of LARGE_FILE or more is copied whole (its holes stay holes) and named with its
    size; smaller ones are not named."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text("")
    big = project / "disk.img"
    with big.open("wb") as fh:
        fh.write(b"head")
        fh.truncate(LARGE_FILE + 4096)
        fh.seek(LARGE_FILE)
        fh.write(b"tail")
    (project / "small.bin").write_bytes(b"x" * 1000)
    report = copy_project_tree(project, tmp_path / "copy")
    copied = tmp_path / "copy" / "disk.img"
    assert copied.stat().st_size == big.stat().st_size
    assert hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()
    if big.stat().st_blocks * 512 < LARGE_FILE // 2:  # this file system keeps holes
        assert copied.stat().st_blocks * 512 < LARGE_FILE // 2, "the copy filled the holes"
    assert report.lines() == [
        "project copy: copied 1 large file(s) (100.0 MB or more; every "
        "cell copies them): disk.img (100.0 MB)"
    ]


@pytest.mark.promise(
    promise="a project file too big to copy into every cell stops the build before anything "
    "is copied, in one line naming the file, its size and the limit",
    fault="a sparse 64 GB file (truncate: no disk used) in the project tree",
    result="copy and check raise a config error naming the file; `build` exits 2 with that "
    "one line (no traceback, no cell started, no dist/); raising "
    "AMPFORGE_PROJECT_FILE_LIMIT lets the check pass",
)
def test_a_huge_file_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "project")
    huge = project / "data" / "disk.img"
    huge.parent.mkdir()
    subprocess.run(["truncate", "-s", "64G", str(huge)], check=True)
    assert huge.stat().st_size == 64 * 2**30
    with pytest.raises(ConfigError) as err:
        copy_project_tree(project, tmp_path / "copy", env={})
    assert err.value.return_code == 2
    assert (
        "project file data/disk.img in " in err.value.message
        and "is 68.7 GB, over the 2.0 GB" in err.value.message
        and LIMIT_VAR in err.value.message
    ), err.value.message
    with pytest.raises(ConfigError):
        check_project_tree(project, env={})
    assert check_project_tree(project, env={LIMIT_VAR: "100G"}).large == [
        ("data/disk.img", 64 * 2**30)
    ]

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "build",
            "--backend",
            "host",
            "--arch",
            "X86",
            "--python",
            "3.11",
            "--project",
            str(project),
            "--out",
            "dist",
            "--work-dir",
            "work",
        ],
        cwd=tmp_path,
        env=builder_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --project: project file data/disk.img in {project} is 68.7 GB, "
        "over the 2.0 GB one file copied into a build may be (every cell copies "
        f"the project); move it out of the project, or set {LIMIT_VAR} (e.g. "
        f"{LIMIT_VAR}=8G)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr and "[cp311" not in proc.stderr
    assert not (tmp_path / "dist").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("raw", "limit"),
    [
        ("", DEFAULT_FILE_LIMIT),
        ("4000000000", 4 * 10**9),
        ("8G", 8 * 10**9),
        ("512MB", 512 * 10**6),
        ("3GiB", 3 * 2**30),
        ("1.5t", 15 * 10**11),
    ],
)
def test_the_file_limit_reads_sizes(raw: str, limit: int) -> None:
    assert file_limit({LIMIT_VAR: raw}) == limit


@pytest.mark.parametrize("raw", ["lots", "-1G", "0", "8X", "1e9"])
def test_a_bad_file_limit_is_a_config_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as err:
        file_limit({LIMIT_VAR: raw})
    assert err.value.return_code == 2
    assert err.value.message.startswith(f"environment {LIMIT_VAR}: {raw!r} is not a size")


def test_a_marker_file_linked_from_outside_is_refused(tmp_path: Path) -> None:
    """A pyproject.toml that is a link out of the project: the builder would read it, the
    build's copy would not have it; refused (exit 2) naming the link and its target."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").symlink_to(outside / "pyproject.toml")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "build",
            "--backend",
            "host",
            "--arch",
            "X86",
            "--python",
            "3.11",
            "--project",
            str(project),
            "--out",
            "dist",
            "--work-dir",
            "work",
        ],
        cwd=tmp_path,
        env=builder_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --project: {project / 'pyproject.toml'} is a symlink to "
        f"{outside / 'pyproject.toml'}, outside the project: its build copies nothing from "
        "outside it; copy the file into the project"
    )


# ------------------------------------------------------------------------ real builds

#: Prepended to the tiny extension's setup.py: at build time it reads everything it can reach
#: from its folder (links followed) and lists it, into a file the wheel ships; it writes into
#: its own folder as a build does (and as a careless one does: a file next to setup.py).
PROBE = """\
import os as _os
_here = _os.path.dirname(_os.path.abspath(__file__))
_seen = ["dir " + _here]
for _dp, _dn, _fn in _os.walk(_here, followlinks=True):
    for _n in sorted(_dn + _fn):
        _p = _os.path.join(_dp, _n)
        _seen.append("entry " + _os.path.relpath(_p, _here))
        if _os.path.isfile(_p) and not _p.endswith("_seen.txt"):
            with open(_p, "rb") as _f:
                _seen.append(_f.read(4096).decode("utf-8", "replace"))
if _os.path.exists("/proc/self/mountinfo"):
    _seen.append(open("/proc/self/mountinfo").read())
with open(_os.path.join(_here, "tinyext", "_seen.txt"), "w") as _f:
    _f.write("\\n".join(_seen))
with open(_os.path.join(_here, "written-by-the-build.txt"), "w") as _f:
    _f.write("the build wrote here")
"""


def _probing_project(root: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The tiny extension, hostile tree entries added, its setup.py the PROBE."""
    outside = _outside(root)
    project = write_tiny_extension(root / "tinyext")
    setup = project / "setup.py"
    setup.write_text(
        PROBE
        + setup.read_text().replace(
            'packages=["tinyext"],',
            'packages=["tinyext"], package_data={"tinyext": ["_seen.txt"]},',
        )
    )
    made = _hostile_tree(project, outside)
    return project, outside, made


def _seen_in_wheel(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("tinyext/_seen.txt").decode()


def _check_build(
    tmp_path: Path,
    project: Path,
    outside: Path,
    made: dict[str, Any],
    before: dict[str, tuple],
    before_outside: dict[str, tuple],
    stdout: str,
    stderr: str,
) -> str:
    """What both backends promise; returns what the build's setup.py saw."""
    assert _snapshot(project) == before, "the build changed the caller's project tree"
    assert _snapshot(outside) == before_outside
    assert not (project / "written-by-the-build.txt").exists()
    assert not (project / "build").exists() and not (project / "tinyext.egg-info").exists()
    dist = tmp_path / "dist"
    (wheel,) = dist.glob("tinyext-*.whl")
    seen = _seen_in_wheel(wheel)
    build_dir = seen.splitlines()[0].removeprefix("dir ")
    assert not build_dir.startswith(str(project)), build_dir  # it built in a copy
    entries = {
        line.removeprefix("entry ") for line in seen.splitlines() if line.startswith("entry ")
    }
    assert {"setup.py", "in-rel", "in-abs", "in-dir", "vendor/v.py"} <= entries
    assert not entries & {
        "pkg/link-abs-out",
        "link-rel-out",
        "link-dir-out",
        "pkg/chain",
        "pipe",
        "pkg/sock",
        "null-device",
        ".git",
        "vendor/.git",
    }, entries
    log = next((tmp_path / "work" / "logs").glob("*.log")).read_text()
    outputs = [
        stdout,
        stderr,
        log,
        seen,
        *(
            p.read_text(errors="replace")
            for p in dist.rglob("*")
            if p.is_file() and p.suffix != ".whl"
        ),
        *(_seen_in_wheel(w) for w in dist.glob("*.whl")),
    ]
    for text in outputs:
        assert SECRET not in text
    for where in (stderr, log):  # said once up front, and in the cell's log
        assert "project copy: skipped 4 symlink(s) pointing outside the project" in where
        assert "pipe (FIFO)" in where and "pkg/sock (socket)" in where
    # .git: in the log; not on stderr, where every checkout's build would say it.
    assert "project copy: not copied: .git, vendor/.git" in log
    assert ".git" not in stderr
    assert manifest(dist)["wheels"][-1]["extra"]["project"] == project.name
    return seen


@pytest.mark.slow
@pytest.mark.promise(
    promise="a host build of a hostile project tree builds in a copy: it reads nothing "
    "outside the project through the tree, and the caller's tree is exactly as it "
    "was",
    fault="a real torch extension project with links out of it (to a secret file and "
    "folder), a FIFO, a socket, .git folders, whose setup.py reads everything it can "
    "reach and writes next to itself",
    result="the wheel is built; what its setup.py saw (shipped in the wheel) lists no skipped "
    "entry and no outside secret, from a folder that is not the caller's; the caller's "
    "tree (every entry, byte and mtime) and the outside folder are unchanged; stdout, "
    "stderr, log and dist/ never hold the secret; the skips are said on stderr and in "
    "the cell's log",
)
def test_a_host_build_of_a_hostile_tree_builds_in_a_copy(tmp_path: Path) -> None:
    project, outside, made = _probing_project(tmp_path)
    before, before_outside = _snapshot(project), _snapshot(outside)
    run = run_build(
        tmp_path,
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--project",
        str(project),
    )
    made["socket"].close()
    assert run.rc == 0, run.err[-3000:]
    _check_build(tmp_path, project, outside, made, before, before_outside, run.out, run.err)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.promise(
    promise="a docker build never sees the caller's project tree: the container gets a copy, "
    "nothing of the caller's is mounted into it",
    fault="the same hostile tree and probing setup.py, built by the docker backend",
    result="the container's mount table (read by setup.py, shipped in the wheel) names neither "
    "the project nor its parent folder; the caller's tree is unchanged; no output holds "
    "the outside secret",
)
def test_a_docker_build_gets_a_copy_and_no_mount_of_the_tree(tmp_path: Path) -> None:
    from builder.images.base_image import build_base_image  # noqa: PLC0415

    engine = docker_engine()
    base = build_base_image(engine).tag
    project, outside, made = _probing_project(tmp_path)
    before, before_outside = _snapshot(project), _snapshot(outside)
    run = run_build(
        tmp_path,
        "--backend",
        "docker",
        "--base-image",
        base,
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--project",
        str(project),
    )
    made["socket"].close()
    assert run.rc == 0, run.err[-3000:]
    seen = _check_build(tmp_path, project, outside, made, before, before_outside, run.out, run.err)
    mounts = [line for line in seen.splitlines() if " - " in line and line[:1].isdigit()]
    assert mounts, "setup.py saw no mount table"
    assert not [m for m in mounts if str(tmp_path) in m], mounts
    assert seen.splitlines()[0] == "dir /ampforge/project"


@pytest.mark.docker
def test_the_container_session_copy_is_not_a_mount(tmp_path: Path) -> None:
    """The docker backend's copy step itself (copy_project_in on a real container): the
    container's copy has none of the skipped entries, writing into it leaves the caller's tree
    alone, and the container has no mount of it."""
    from builder.images.base_image import build_base_image  # noqa: PLC0415

    engine = docker_engine()
    outside = _outside(tmp_path)
    project = write_tiny_extension(tmp_path / "project")
    made = _hostile_tree(project, outside)
    before = _snapshot(project)
    with engine.container(build_base_image(engine).tag, network=False) as session:
        inside = copy_project_in(session, project)
        found = session.run(
            ["sh", "-c", f"cd {inside} && find . | sort"], step="list", tail_lines=1000
        )
        read = session.run(
            [
                "sh",
                "-c",
                f"cd {inside} && cat $(find -L . -type f) && echo x > setup.py && touch new-file",
            ],
            step="read, write",
            tail_lines=1000,
        )
        mounts = engine.api.inspect_container(session.id)["Mounts"]
    made["socket"].close()
    assert "inside data" in "\n".join(read.tail)
    listed = {line.strip() for line in found.tail}
    assert {"./in-abs", "./in-dir", "./pkg/data.txt", "./vendor/v.py"} <= listed
    assert not listed & {
        "./pkg/link-abs-out",
        "./link-rel-out",
        "./link-dir-out",
        "./pkg/chain",
        "./pipe",
        "./pkg/sock",
        "./null-device",
        "./.git",
        "./vendor/.git",
    }
    assert SECRET not in "\n".join(found.tail + read.tail)
    assert not [m for m in mounts if str(tmp_path) in str(m.get("Source", ""))], mounts
    assert _snapshot(project) == before


@pytest.mark.slow
def test_a_cross_build_copies_the_tree_the_same_way_and_masks_its_output(tmp_path: Path) -> None:
    """The cross backend's build (on this host, into a scratch copy) takes the same copy: its
    before-build, reading everything it can reach, sees no skipped entry and no outside
    secret; the copy's report heads its log; its output goes through the cell's redactor (a
    passed token it echoes is masked in the log and in the error); the caller's tree is
    unchanged."""
    from builder.cross import (  # noqa: PLC0415 - the cross toolchain's modules
        CrossToolchainMissing,
        cross_build_wheel,
        ensure_target_python,
        ensure_target_torch,
        find_toolchain,
    )

    try:
        toolchain = find_toolchain("aarch64")
    except CrossToolchainMissing as exc:  # CI provisions it; a bare host must say how
        pytest.fail(exc.message)
    python = ensure_target_python(f"{sys.version_info[0]}.{sys.version_info[1]}", "aarch64")
    torch = ensure_target_torch("2.9.1", python)
    outside = _outside(tmp_path)
    project = write_tiny_extension(tmp_path / "project")
    made = _hostile_tree(project, outside)
    before = _snapshot(project)
    token = "cross-token-81d3a0-never-logged"
    probe = (
        'find . | sort; cat $(find -L . -type f); echo "before-build has $CROSS_TOKEN"; '
        "echo x > setup.py; exit 3"
    )
    log = tmp_path / "cross.log"
    with pytest.raises(StepFailed) as info:
        cross_build_wheel(
            project,
            tmp_path / "out",
            python,
            torch,
            toolchain,
            host_python=sys.executable,
            log_path=log,
            extra_env={"CROSS_TOKEN": token},
            options=CibwOptions(before_build=probe),
            redact=Redactor([token]),
        )
    made["socket"].close()
    text = log.read_text()
    assert text.startswith("ampforge: project copy: skipped 4 symlink(s) pointing outside")
    assert "ampforge: project copy: not copied: .git, vendor/.git" in text
    assert "inside data" in text and "V = 1" in text  # it read the copy
    listed = {line.strip() for line in text.splitlines()}
    assert {"./in-abs", "./in-dir", "./pkg/data.txt"} <= listed
    assert not listed & {"./pkg/link-abs-out", "./link-dir-out", "./pipe", "./.git"}
    assert SECRET not in text
    assert "before-build has ***" in text and token not in text
    assert token not in info.value.message
    assert _snapshot(project) == before
