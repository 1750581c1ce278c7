"""The air-gapped walkthrough, proven (docker backend): a machine with a fresh checkout and the
bundle, and no network at all, builds the same wheel as a connected machine.

1. Connected (this machine): ``make fetch BUNDLE=b ARCH=X86 PY=3.11 TORCH=2.13.0`` -- the cell's
   wheels, the base image (under a throwaway tag made for this test) and the builder's own
   pinned wheels; then the tag leaves the engine, so the offline build can only have the image
   back by ``docker load``-ing the bundle.
2. Air-gapped: ``unshare --net`` (a new network namespace with nothing but loopback) around the
   documented command on a fresh ``git clone`` with no ``.venv``: ``make wheel OFFLINE=1 BUNDLE=b
   ARCH=X86 PY=3.11`` -- the builder set up from the bundle (pip ``--no-index``; pip's own
   configuration switched off, ``PIP_CONFIG_FILE=/dev/null``), the engine reached through its
   Unix socket, the containers without network. The wheel is byte-identical to the same cell
   built online (the session's ``docker_amp_build``, given its SOURCE_DATE_EPOCH).

The host backend's walkthrough, the failure of a bundle without the builder's wheels and the
ampforge-builder wheel are in test_airgapped_host.py (they need no engine).

This replaces test_fetch_e2e.py's fetch-then-build-offline test and keeps its checks: the cells,
torch and its dependencies listed with their sha256, a re-fetch reusing every file, the image
loaded from the bundle, a tampered file refused with exit 2. That test proved "no network in
the container" with a tiny project that recorded its interfaces; here the build runs from an
unmodified checkout, the namespace proves the builder itself had none, and the docker backend's
offline containers run with ``network_mode=none`` (builder/engines/docker.py). Cost: fetch
(about a minute) and one cold offline amp build; the online one is the shared session fixture.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.airgaplib import (
    SELECT,
    check_airgapped_wheel,
    fresh_clone,
    in_netns,
    make_fetch,
    online_epoch,
    require_unshare,
)
from helpers.enginelib import docker_engine
from helpers.pipelinelib import CELL, AmpBuild, run_build

from builder import lockfile
from builder.images.base_image import build_base_image
from builder.release.manifest import sha256_file

# The module fixture (fetch) runs inside the first test's time limit.
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(3600)]


@dataclass
class Fetched:
    root: Path
    bundle: Path
    ref: str
    image_id: str
    stderr: str


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fetched]:
    require_unshare()
    engine = docker_engine()
    base = build_base_image(engine)
    repo, tag = "ampforge/airgap-test", uuid.uuid4().hex[:12]
    engine.api.tag(base.image_id, repo, tag=tag)
    root = tmp_path_factory.mktemp("airgap")
    f = Fetched(root, root / "bundle", f"{repo}:{tag}", base.image_id, "")
    try:
        r = make_fetch(f.bundle, f"BASE_IMAGE={f.ref}")
        assert r.returncode == 0, r.stderr[-3000:]
        f.stderr = r.stderr
        yield f
    finally:
        engine.remove_image(f.ref)


def test_fetch_lists_cells_torch_image_and_the_builders_wheels(fetched: Fetched) -> None:
    doc = json.loads((fetched.bundle / "bundle.json").read_text())
    assert [c["id"] for c in doc["cells"]] == [CELL]
    assert doc["images"] == [
        {
            "ref": fetched.ref,
            "image_id": fetched.image_id,
            "arch": "X86",
            "file": doc["images"][0]["file"],
            "cells": [CELL],
        }
    ]
    files = {f["path"]: f for f in doc["files"]}
    torch = [p for p in files if p.startswith("wheels/torch-2.13.0")]
    assert len(torch) == 1 and "cp311-cp311-manylinux" in torch[0], sorted(files)
    for name in ("setuptools-", "wheel-", "sympy-", "filelock-"):
        assert any(p.startswith("wheels/" + name) for p in files), (name, sorted(files))
    for rel, f in files.items():
        assert sha256_file(fetched.bundle / rel) == f["sha256"], rel
    assert files[doc["images"][0]["file"]]["cells"] == [CELL]
    # The builder's own environment: every pin of the lock, for this Python, each file listed.
    builder = doc["builder"]
    assert builder["lock_sha256"] == lockfile.digest()
    assert builder["python"] == ".".join(map(str, sys.version_info[:3]))
    assert {w["name"]: w["version"] for w in builder["wheels"]} == lockfile.read_pins()
    for w in builder["wheels"]:
        assert w["file"].startswith("builder-wheels/") and w["file"] in files, w

    # Again into the same folder: everything reused, the same description.
    again = make_fetch(fetched.bundle, f"BASE_IMAGE={fetched.ref}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"wheels ({len(files) - 1} reused;" in again.stderr, again.stderr
    assert "unchanged, reusing images/" in again.stderr
    assert json.loads((fetched.bundle / "bundle.json").read_text())["files"] == doc["files"]


@pytest.mark.starts_from("fresh clone + bundle")
def test_fresh_clone_builds_offline_from_the_bundle_docker(
    fetched: Fetched, docker_amp_build: AmpBuild
) -> None:
    engine = docker_engine()
    engine.api.remove_image(fetched.ref)  # from now on only the bundle has it
    assert engine.image_id(fetched.ref) is None
    clone = fresh_clone(fetched.root / "clone-docker")
    r = in_netns(
        f"make wheel OFFLINE=1 BUNDLE={fetched.bundle} {' '.join(SELECT)}",
        cwd=clone,
        SOURCE_DATE_EPOCH=online_epoch(docker_amp_build),
    )
    entry = check_airgapped_wheel(clone, docker_amp_build, "docker", r, fetched.bundle)
    out = r.stdout + r.stderr
    listed = json.loads((fetched.bundle / "bundle.json").read_text())["files"]
    assert f"bundle: verified {len(listed)} files (sha256)" in out
    assert f"bundle: base image {fetched.ref} loaded from {fetched.bundle}/images/" in out
    assert engine.image_id(fetched.ref) == fetched.image_id
    assert entry["base_image"] == fetched.image_id
    engine.remove_image(entry["extra"]["image"])  # the cell image built FROM the throwaway tag


def test_tampered_bundle_is_refused_before_anything_else(fetched: Fetched, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(fetched.bundle, bundle, ignore=shutil.ignore_patterns("images"))
    (bundle / "images").symlink_to(fetched.bundle / "images")
    victim = next((bundle / "wheels").glob("wheel-*.whl"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = run_build(tmp_path, "--offline", "--bundle", str(bundle), "--backend", "docker", "--force")
    assert r.rc == 2, r.err[-2000:]
    assert f"{victim} does not match its sha256 in bundle.json" in r.err
