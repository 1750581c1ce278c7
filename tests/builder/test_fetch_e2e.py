"""The air-gapped walkthrough for real: ``make fetch`` a bundle for the X86 / 3.11 / 2.13.0 cell
on this (connected) machine, then ``build --offline --bundle`` it with the container's network
disabled, and check the verified wheel and its manifest entry.

The base image is saved under a throwaway tag made for this test, and that tag is removed before
the offline build: the build can only have it back by ``docker load``-ing the bundle (nothing
can be pulled here). The project is the tiny one-file extension (a real compile, minutes less
than this repository's kernels); its setup.py records the network interfaces it saw while
building, so the wheel itself proves the build ran with no network (only ``lo``).

pip's own configuration on this machine (find-links with the CPU torch wheel) decides where
``fetch`` downloads from, as it would for a user. About 3 minutes on 2 free cores.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from enginelib import docker_engine, write_tiny_extension
from pipelinelib import CELL, builder_env, manifest, run_build

from builder.config import REPO_ROOT
from builder.images.base_image import build_base_image
from builder.release.manifest import sha256_file

pytestmark = [pytest.mark.slow, pytest.mark.docker]

NETCHECK = '''
import socket
# Which network interfaces the build saw: an offline build must see only loopback.
with open("tinyext/_build_net.txt", "w") as fh:
    fh.write(" ".join(sorted(name for _, name in socket.if_nameindex())))
'''


def netcheck_project(root: Path) -> Path:
    project = write_tiny_extension(root)
    setup = project / "setup.py"
    text = setup.read_text().replace("from setuptools import setup\n",
                                     "from setuptools import setup\n" + NETCHECK)
    setup.write_text(text.replace('packages=["tinyext"],',
                                  'packages=["tinyext"], package_data={"tinyext": '
                                  '["_build_net.txt"]},'))
    return project


def make_fetch(bundle: Path, base_ref: str, project: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in builder_env().items() if k not in ("MAKEFLAGS", "BUNDLE")}
    # -o builder-env: the builder targets only; this test never (re)installs .venv.
    return subprocess.run(
        ["make", "-s", "-o", "builder-env", "fetch", f"BUNDLE={bundle}", "ARCH=X86", "PY=3.11",
         "TORCH=2.13.0", f"BASE_IMAGE={base_ref}", f"FETCH_ARGS=--project {project}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_fetch_bundle_then_build_offline_from_it(tmp_path: Path) -> None:
    engine = docker_engine()
    base = build_base_image(engine)
    repo, tag = "ampforge/offline-test", uuid.uuid4().hex[:12]
    ref = f"{repo}:{tag}"
    engine.api.tag(base.image_id, repo, tag=tag)
    cell_image = None
    bundle = tmp_path / "bundle"
    project = netcheck_project(tmp_path / "tinyext-src")
    try:
        # 1. Connected machine: fetch.
        r = make_fetch(bundle, ref, project)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads((bundle / "bundle.json").read_text())
        assert [c["id"] for c in doc["cells"]] == [CELL]
        assert doc["images"] == [{"ref": ref, "image_id": base.image_id, "arch": "X86",
                                  "file": doc["images"][0]["file"], "cells": [CELL]}]
        files = {f["path"]: f for f in doc["files"]}
        torch = [p for p in files if p.startswith("wheels/torch-2.13.0")]
        assert len(torch) == 1 and "cp311-cp311-manylinux" in torch[0], sorted(files)
        for name in ("setuptools-", "wheel-", "sympy-", "filelock-"):
            assert any(p.startswith("wheels/" + name) for p in files), (name, sorted(files))
        for rel, f in files.items():
            assert sha256_file(bundle / rel) == f["sha256"], rel
        assert files[doc["images"][0]["file"]]["cells"] == [CELL]

        # Again into the same folder: everything reused, the same description.
        start = time.monotonic()
        again = make_fetch(bundle, ref, project)
        print(f"re-fetch took {time.monotonic() - start:.1f}s")
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"wheels ({len(files) - 1} reused)" in again.stderr, again.stderr
        assert "unchanged, reusing images/" in again.stderr
        assert json.loads((bundle / "bundle.json").read_text())["files"] == doc["files"]

        # 2. The image leaves the engine (the tag the bundle names is gone).
        engine.api.remove_image(ref)
        assert engine.image_id(ref) is None

        # 3. Offline build from the bundle: loaded, verified, no network in the container.
        r = run_build(tmp_path, "--offline", "--bundle", str(bundle), "--backend", "docker",
                      "--arch", "X86", "--python", "3.11", "--torch", "2.13.0",
                      "--project", str(project), "--jobs", "1")
        assert r.rc == 0, r.err[-4000:]
        assert f"bundle: verified {len(files)} files (sha256)" in r.err
        assert f"bundle: base image {ref} loaded from {bundle}/images/" in r.err
        assert f"preflight: offline bundle {bundle} has all" in r.err
        assert engine.image_id(ref) == base.image_id
        (wheel,) = (tmp_path / "dist").glob("*.whl")
        assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_")
        with zipfile.ZipFile(wheel) as zf:
            assert zf.read("tinyext/_build_net.txt").decode() == "lo"
        entry = next(w for w in manifest(tmp_path / "dist")["wheels"] if w["cell"] == CELL)
        assert entry["file"] == wheel.name and entry["sha256"] == sha256_file(wheel)
        assert entry["extra"]["backend"] == "docker" and entry["extra"]["modules"] == [
            "tinyext._C"]
        assert entry["base_image"] == base.image_id
        cell_image = entry["extra"]["image"]  # built FROM the throwaway tag: removed below

        # 4. A bundle altered in transit is refused before anything else, naming the file.
        victim = next((bundle / "wheels").glob("wheel-*.whl"))
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0xFF
        victim.write_bytes(bytes(data))
        r = run_build(tmp_path, "--offline", "--bundle", str(bundle), "--backend", "docker",
                      "--force", "--project", str(project))
        assert r.rc == 2, r.err[-2000:]
        assert f"{victim} does not match its sha256 in bundle.json" in r.err
    finally:
        if cell_image:
            engine.remove_image(cell_image)
        engine.remove_image(ref)
