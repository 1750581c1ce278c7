"""The air-gapped walkthrough, proven: a machine with a fresh checkout and the bundle, and no
network at all, builds the same wheel as a connected machine.

1. Connected (this machine): ``make fetch BUNDLE=b ARCH=X86 PY=3.11 TORCH=2.13.0`` -- the cell's
   wheels, the base image (under a throwaway tag made for this test) and the builder's own
   pinned wheels. The reference wheels are built online from the same commit, once per backend.
2. The tag leaves the engine: the offline build can only have the image back by ``docker
   load``-ing the bundle.
3. Air-gapped: ``unshare --net`` (a new network namespace with nothing but loopback) around
   the README's commands on a fresh ``git clone`` with no ``.venv``: ``make wheel OFFLINE=1
   BUNDLE=b ARCH=X86 PY=3.11`` (docker backend: the engine through its Unix socket, containers
   without network) and again with ``BACKEND=host``. pip's own configuration is switched off
   (``PIP_CONFIG_FILE=/dev/null``): the bundle is the only source. Each gives a repaired,
   verified wheel byte-identical to the online one.
4. A bundle without the builder's wheels fails at set-up, exit 2, naming what is missing.
5. The ampforge-builder wheel, installed into a fresh venv from the bundle (``--no-index``),
   builds the tiny extension with ``ampforge-build ... --project`` inside the namespace.

This replaces test_fetch_e2e.py's fetch-then-build-offline test (same bundle checks: the cells,
torch and its dependencies listed with their sha256, a re-fetch reusing every file, the image
loaded from the bundle, a tampered file refused with exit 2). That test proved "no network in
the container" with a tiny project that recorded its interfaces; here the build runs from an
unmodified checkout, and the namespace proves the builder itself had none, while the docker
backend's offline containers run with ``network_mode=none`` (builder/engines/docker.py).

Cost: fetch (~1 min), two online and two offline amp builds (ccache and the cached torch
environment keep the second of each kind shorter), two builder set-ups from the bundle. The
online reference builds are this module's own until tests/builder/conftest.py provides
session-scoped online amp builds to share.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from enginelib import docker_engine, in_ci, wheelhouse_cp311, write_tiny_extension
from pipelinelib import CELL, builder_env, manifest, run_build

from builder import lockfile
from builder.config import REPO_ROOT
from builder.images.base_image import build_base_image
from builder.inputkey import input_key
from builder.release.manifest import sha256_file

# The module fixture (fetch + the two online builds) runs inside the first test's time limit.
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(3600)]

SELECT = ["ARCH=X86", "PY=3.11"]


def require_unshare() -> str:
    found = shutil.which("unshare")
    problem = ("unshare (util-linux) is not installed" if found is None else
               "a new network namespace needs root" if os.geteuid() != 0 else None)
    if problem is not None:
        if in_ci():
            pytest.fail(f"CI=true but {problem} (.ci/run runs as root)")
        pytest.skip(f"{problem}; CI would fail")
    assert found is not None
    return found


def airgapped_env(**extra: str) -> dict[str, str]:
    """The environment of a person at the air-gapped machine: no proxies, no pip configuration
    (this machine's pip.conf points at local wheel folders), no venv or builder variables."""
    drop = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "VIRTUAL_ENV", "PYTHONPATH", "BUNDLE")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("BUILDER_", "PIP_"))
           and not k.lower().endswith("_proxy")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env.update(extra)
    return env


def in_netns(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """*script* (bash) in a fresh network namespace that has only loopback."""
    return subprocess.run(
        [require_unshare(), "--net", "--", "bash", "-euo", "pipefail", "-c",
         f"ip link set lo up 2>/dev/null || true\n{script}"],
        cwd=cwd, env=airgapped_env(**env), capture_output=True, text=True, timeout=3000)


def fresh_clone(dest: Path, commit: str = "HEAD") -> Path:
    """``git clone`` of this repository at *commit*: every side of the walkthrough builds the
    same commit (its time is the wheels' SOURCE_DATE_EPOCH), whatever is committed meanwhile."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO_ROOT), str(dest)],
                   check=True, timeout=300)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", commit], check=True,
                   timeout=300)
    assert not (dest / ".venv").exists()
    return dest


class Walkthrough:
    def __init__(self, root: Path, ref: str, image_id: str) -> None:
        self.root, self.ref, self.image_id = root, ref, image_id
        self.bundle = root / "bundle"
        self.source = fresh_clone(root / "source")  # the commit both sides build
        self.commit = subprocess.run(["git", "-C", str(self.source), "rev-parse", "HEAD"],
                                     capture_output=True, text=True, check=True).stdout.strip()
        self.online: dict[str, Path] = {}
        self.cell_images: list[str] = []

    def make_fetch(self) -> subprocess.CompletedProcess:
        env = {k: v for k, v in builder_env().items() if k not in ("MAKEFLAGS", "BUNDLE")}
        # -o builder-env: this connected machine's environment is the test's own .venv.
        return subprocess.run(
            ["make", "-s", "-o", "builder-env", "fetch", f"BUNDLE={self.bundle}", *SELECT,
             "TORCH=2.13.0", f"BASE_IMAGE={self.ref}"],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)

    def online_wheel(self, backend: str) -> Path:
        out = self.root / f"online-{backend}"
        out.mkdir()
        # The containers reach no index here without a CA for the intercepting proxy: the
        # docker build installs torch from the test wheelhouse (pip with --find-links, online
        # mode); the host build uses pip's own configuration, as a user's would.
        source = ["--wheelhouse", str(wheelhouse_cp311())] if backend == "docker" else []
        # The builder of the same commit, run from the clone (cwd, not PYTHONPATH: the host
        # backend's smoke test must import amp from the wheel, never from a source tree).
        env = {k: v for k, v in builder_env().items() if k != "PYTHONPATH"}
        proc = subprocess.run(
            [sys.executable, "-m", "builder", "build", "--out", str(out / "dist"),
             "--work-dir", str(out / "work"), "--backend", backend, "--arch", "X86",
             "--python", "3.11", "--torch", "2.13.0", "--base-image", self.ref, *source],
            cwd=self.source, env=env, capture_output=True, text=True, timeout=3000)
        assert proc.returncode == 0, proc.stderr[-4000:]
        (wheel,) = (out / "dist").glob("*.whl")
        self.remember_image(out / "dist")
        return wheel

    def remember_image(self, dist: Path) -> None:
        for w in manifest(dist)["wheels"]:
            image = (w.get("extra") or {}).get("image")
            if image:
                self.cell_images.append(image)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walkthrough]:
    require_unshare()
    engine = docker_engine()
    base = build_base_image(engine)
    repo, tag = "ampforge/airgap-test", uuid.uuid4().hex[:12]
    engine.api.tag(base.image_id, repo, tag=tag)
    w = Walkthrough(tmp_path_factory.mktemp("airgap"), f"{repo}:{tag}", base.image_id)
    try:
        r = w.make_fetch()
        assert r.returncode == 0, r.stderr[-3000:]
        for backend in ("docker", "host"):
            w.online[backend] = w.online_wheel(backend)
        engine.api.remove_image(w.ref)  # from now on only the bundle has it
        assert engine.image_id(w.ref) is None
        yield w
    finally:
        for image in w.cell_images:
            engine.remove_image(image)
        engine.remove_image(w.ref)


def test_fetch_lists_cells_torch_image_and_the_builders_wheels(walk: Walkthrough) -> None:
    doc = json.loads((walk.bundle / "bundle.json").read_text())
    assert [c["id"] for c in doc["cells"]] == [CELL]
    assert doc["images"] == [{"ref": walk.ref, "image_id": walk.image_id, "arch": "X86",
                              "file": doc["images"][0]["file"], "cells": [CELL]}]
    files = {f["path"]: f for f in doc["files"]}
    torch = [p for p in files if p.startswith("wheels/torch-2.13.0")]
    assert len(torch) == 1 and "cp311-cp311-manylinux" in torch[0], sorted(files)
    for name in ("setuptools-", "wheel-", "sympy-", "filelock-"):
        assert any(p.startswith("wheels/" + name) for p in files), (name, sorted(files))
    for rel, f in files.items():
        assert sha256_file(walk.bundle / rel) == f["sha256"], rel
    assert files[doc["images"][0]["file"]]["cells"] == [CELL]
    # The builder's own environment: every pin of the lock, for this Python, each file listed.
    builder = doc["builder"]
    assert builder["lock_sha256"] == lockfile.digest()
    assert builder["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {w["name"]: w["version"] for w in builder["wheels"]} == lockfile.read_pins()
    for w in builder["wheels"]:
        assert w["file"].startswith("builder-wheels/") and w["file"] in files, w

    # Again into the same folder: everything reused, the same description.
    again = walk.make_fetch()
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"wheels ({len(files) - 1} reused;" in again.stderr, again.stderr
    assert "unchanged, reusing images/" in again.stderr
    assert json.loads((walk.bundle / "bundle.json").read_text())["files"] == doc["files"]


def test_bundle_without_the_builders_wheels_fails_at_set_up(walk: Walkthrough) -> None:
    bad = walk.root / "bundle-no-builder"
    bad.mkdir()
    doc = json.loads((walk.bundle / "bundle.json").read_text())
    doc.pop("builder")
    doc["files"] = [f for f in doc["files"] if not f["path"].startswith("builder-wheels/")]
    for sub in ("wheels", "images"):
        (bad / sub).symlink_to(walk.bundle / sub)
    (bad / "bundle.json").write_text(json.dumps(doc))
    clone = fresh_clone(walk.root / "clone-bad", walk.commit)
    r = in_netns(f"make wheel OFFLINE=1 BUNDLE={bad} {' '.join(SELECT)}", cwd=clone)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"offline bundle {bad} holds no wheels for the builder's own environment" in r.stderr
    pins = lockfile.read_pins()
    assert f"auditwheel=={pins['auditwheel']}" in r.stderr and f"pip=={pins['pip']}" in r.stderr
    # The set-up step itself said 2 (make reports the recipe's status), nothing half-made.
    assert "] Error 2" in r.stderr
    assert not list((clone / ".venv").glob(".builder-*"))
    assert not (clone / "dist").exists()


@pytest.mark.parametrize("backend", ["docker", "host"])
def test_fresh_clone_builds_offline_from_the_bundle(walk: Walkthrough, backend: str) -> None:
    clone = fresh_clone(walk.root / f"clone-{backend}", walk.commit)
    steps = f"make wheel OFFLINE=1 BUNDLE={walk.bundle} {' '.join(SELECT)}"
    if backend == "host":
        steps += " BACKEND=host"
    r = in_netns(steps, cwd=clone)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = r.stdout + r.stderr
    assert f"from offline bundle {walk.bundle}" in out  # the builder set up from the bundle
    listed = json.loads((walk.bundle / "bundle.json").read_text())["files"]
    assert f"bundle: verified {len(listed)} files (sha256)" in out
    if backend == "docker":
        assert f"bundle: base image {walk.ref} loaded from {walk.bundle}/images/" in out
    # A builder-only environment: nothing of torch, amp not compiled or installed.
    site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("torch*")) and not list(site.glob("*ampforge*"))
    assert not list((clone / "amp").glob("_C*.so"))
    (wheel,) = (clone / "dist").glob("*.whl")
    online = walk.online[backend]
    assert wheel.name == online.name
    assert wheel.read_bytes() == online.read_bytes(), (
        f"{wheel} differs from the same cell built online ({online})")
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.startswith("builder/")]  # amp never ships it
    entry = next(e for e in manifest(clone / "dist")["wheels"] if e["cell"] == CELL)
    assert entry["sha256"] == sha256_file(wheel) and entry["extra"]["backend"] == backend
    inputs = entry["extra"]["inputs"]
    assert inputs["builder_lock"] == input_key({"builder_lock": lockfile.digest()})[:12]
    assert inputs["builder_env"] == input_key({"builder_env": []})[:12]  # exactly the lock
    walk.remember_image(clone / "dist")


def test_tampered_bundle_is_refused_before_anything_else(walk: Walkthrough,
                                                         tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(walk.bundle, bundle, symlinks=True,
                    ignore=shutil.ignore_patterns("images"))
    (bundle / "images").symlink_to(walk.bundle / "images")
    victim = next((bundle / "wheels").glob("wheel-*.whl"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = run_build(tmp_path, "--offline", "--bundle", str(bundle), "--backend", "docker",
                  "--force", "--project", str(walk.source))
    assert r.rc == 2, r.err[-2000:]
    assert f"{victim} does not match its sha256 in bundle.json" in r.err


def test_builder_wheel_from_a_fresh_venv_builds_another_project(walk: Walkthrough,
                                                                 tmp_path: Path) -> None:
    """The builder as a tool: its wheel (builder-dist/) installed into a fresh venv from the
    bundle's builder wheels only, ``ampforge-build`` builds the tiny extension -- inside the
    namespace, from the same bundle, on the host backend."""
    wheels = tmp_path / "tool"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-w", str(wheels), str(REPO_ROOT / "builder-dist")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (tool,) = wheels.glob("ampforge_builder-*-py3-none-any.whl")
    with zipfile.ZipFile(tool) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "builder/cli.py" in names and "builder/requirements.lock" in names
    assert "builder/_data/configs/matrix.yaml" in names
    assert "builder/_data/docker/X86/Dockerfile.j2" in names
    assert not [n for n in names if n.startswith("amp/") or "__pycache__" in n]
    assert "ampforge-build = builder.cli:main" in entry_points

    project = write_tiny_extension(tmp_path / "tinyext")
    venv = tmp_path / "venv"
    r = in_netns(
        f"{shutil.which('python3.11') or sys.executable} -m venv {venv}\n"
        f"{venv}/bin/python -m pip install --quiet --no-index --find-links "
        f"{walk.bundle}/builder-wheels {tool}\n"
        f"{venv}/bin/ampforge-build --help\n"
        f"cd {tmp_path} && {venv}/bin/ampforge-build build --offline --bundle {walk.bundle} "
        f"--backend host --arch X86 --python 3.11 --project {project} --jobs 1",
        cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "usage: ampforge-build" in r.stdout
    for command in ("plan", "render", "build", "fetch", "index", "publish", "doctor"):
        assert command in r.stdout
    (built,) = (tmp_path / "dist").glob("*.whl")
    assert built.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_")
    entry = next(e for e in manifest(tmp_path / "dist")["wheels"] if e["cell"] == CELL)
    assert entry["extra"]["backend"] == "host" and entry["extra"]["modules"] == ["tinyext._C"]
