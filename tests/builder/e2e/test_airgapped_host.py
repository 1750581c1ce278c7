"""The air-gapped walkthrough without an engine: the host backend, a bundle that cannot set up
the builder, and the ampforge-builder wheel as a tool -- all inside a network namespace with
nothing but loopback (``unshare --net``, root), from a bundle fetched with ``--no-images``.

* ``make wheel OFFLINE=1 BUNDLE=b ARCH=X86 PY=3.11 BACKEND=host`` on a fresh clone with no
  ``.venv`` gives a wheel byte-identical to the same cell built online (the session's
  ``host_amp_build``, given its SOURCE_DATE_EPOCH);
* a bundle without the builder's wheels stops at set-up with exit 2, naming the missing pins;
* the builder's wheel (builder-dist/), installed into a fresh venv from the bundle's builder
  wheels only, builds the tiny extension with ``ampforge-build build --project``.

The docker backend's walkthrough is test_airgapped.py. Cost: a wheels-only fetch (about a
minute), one cold offline amp build on the host (ccache and the compiler are warm from the
online one), one tiny-extension build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
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
from helpers.enginelib import write_tiny_extension
from helpers.pipelinelib import CELL, AmpBuild, manifest

from builder import lockfile
from builder.config import REPO_ROOT

# One xdist stream with the host_amp_build fixture (tests/conftest.py's FIXTURE_GROUPS): the
# module's bundle is then fetched once, by the worker that also has the online host build.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.xdist_group("host-amp-build"),
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_unshare()
    dest = tmp_path_factory.mktemp("airgap-host") / "bundle"
    r = make_fetch(dest, "FETCH_ARGS=--no-images")
    assert r.returncode == 0, r.stderr[-3000:]
    return dest


@pytest.mark.starts_from("fresh clone + bundle")
def test_bundle_without_the_builders_wheels_fails_at_set_up(bundle: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bundle-no-builder"
    bad.mkdir()
    doc = json.loads((bundle / "bundle.json").read_text())
    doc.pop("builder")
    doc["files"] = [f for f in doc["files"] if not f["path"].startswith("builder-wheels/")]
    (bad / "wheels").symlink_to(bundle / "wheels")
    (bad / "bundle.json").write_text(json.dumps(doc))
    clone = fresh_clone(tmp_path / "clone")
    r = in_netns(f"make wheel OFFLINE=1 BUNDLE={bad} {' '.join(SELECT)}", cwd=clone)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"offline bundle {bad} holds no wheels for the builder's own environment" in r.stderr
    pins = lockfile.read_pins()
    assert f"auditwheel=={pins['auditwheel']}" in r.stderr and f"pip=={pins['pip']}" in r.stderr
    # The set-up step itself said 2 (make reports the recipe's status); nothing half-made.
    assert "] Error 2" in r.stderr
    assert not list((clone / ".venv").glob(".builder-*"))
    assert not (clone / "dist").exists()


@pytest.mark.starts_from("fresh clone + bundle")
def test_fresh_clone_builds_offline_from_the_bundle_host(
    bundle: Path, tmp_path: Path, host_amp_build: AmpBuild
) -> None:
    clone = fresh_clone(tmp_path / "clone")
    r = in_netns(
        f"make wheel OFFLINE=1 BUNDLE={bundle} {' '.join(SELECT)} BACKEND=host",
        cwd=clone,
        SOURCE_DATE_EPOCH=online_epoch(host_amp_build),
    )
    check_airgapped_wheel(clone, host_amp_build, "host", r, bundle)
    listed = json.loads((bundle / "bundle.json").read_text())["files"]
    assert f"bundle: verified {len(listed)} files (sha256)" in r.stdout + r.stderr


@pytest.mark.starts_from("installed tool")
def test_builder_wheel_from_a_fresh_venv_builds_another_project(
    bundle: Path, tmp_path: Path
) -> None:
    """The builder as a tool: its wheel installed into a fresh venv from the bundle's builder
    wheels only (``--no-index``), ``ampforge-build`` builds the tiny extension -- inside the
    namespace, from the same bundle, on the host backend."""
    wheels = tmp_path / "tool"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-w",
            str(wheels),
            str(REPO_ROOT / "builder-dist"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    python = shutil.which("python3.11") or sys.executable
    r = in_netns(
        f"{python} -m venv {venv}\n"
        f"{venv}/bin/python -m pip install --quiet --no-index --find-links "
        f"{bundle}/builder-wheels {tool}\n"
        f"{venv}/bin/ampforge-build --help\n"
        f"cd {tmp_path} && {venv}/bin/ampforge-build build --offline --bundle {bundle} "
        f"--backend host --arch X86 --python 3.11 --project {project} --jobs 1",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "usage: ampforge-build" in r.stdout
    for command in ("plan", "render", "build", "fetch", "index", "publish", "doctor"):
        assert command in r.stdout
    (built,) = (tmp_path / "dist").glob("*.whl")
    assert built.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_")
    entry = next(e for e in manifest(tmp_path / "dist")["wheels"] if e["cell"] == CELL)
    assert entry["extra"]["backend"] == "host" and entry["extra"]["modules"] == ["tinyext._C"]
