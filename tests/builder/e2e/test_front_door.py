"""The README's first command, run the way its reader runs it: from a fresh clone with nothing set
up (no ``.venv``, no torch anywhere in reach of the builder), and the installed tool from another
project's root. Neither starts from this test suite's own environment (whose interpreter has
torch, which is how the cross backend once passed its tests while the README's command failed).

* ``make wheel ARCH=ARM PY=3.9`` in a ``git clone`` of this repository: the builder's own
  environment is set up from its lock (no torch), the cross backend makes its cached host torch
  environment (``cross_host_torch`` of configs/support.yaml, on this host's Python), and the
  verified cp39 aarch64 wheel the README names lands in the clone's ``dist/``;
* ``ampforge-build build --arch ARM --python 3.9`` run from the root of another torch-extension
  project, with the builder installed from its own wheel (builder-dist/) into a fresh venv.

Shared with the other cross tests through the cache root (``$AMPFORGE_CACHE``): the aarch64
torch 2.8.0 site, the bullseye arm64 sysroot, the host torch environment and ccache. Cost with
warm caches: about two minutes (compile, then ~30 s of emulated verification); cold, the first
run also downloads the aarch64 torch (~100 MB), the sysroot's .debs and the host torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.airgaplib import fresh_clone, in_netns
from helpers.enginelib import write_tiny_extension
from helpers.pipelinelib import builder_env, manifest

from builder.config import REPO_ROOT
from builder.config.support import load_support

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CELL = "cp39-manylinux_aarch64-torch2.8.0"
HOST_TORCH = load_support(REPO_ROOT / "configs" / "support.yaml").cross_host_torch


def user_env(**extra: str) -> dict[str, str]:
    """A person's shell: this machine's pip configuration and caches, but none of the test
    session's interpreter (its venv's bin/ off PATH), make, builder or PYTHONPATH variables."""
    drop = (
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "AMPFORGE_TEST_GROUP",
        "SOURCE_DATE_EPOCH",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("BUILDER_")}
    ours = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if p and os.path.realpath(p) != os.path.realpath(ours)
    )
    env.update(extra)
    return env


def readme_wheel() -> str:
    """The wheel name the README's first command block promises."""
    text = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"make wheel ARCH=ARM PY=3\.9\s+# -> dist/(\S+\.whl)", text)
    assert m, "README.md's first command block must name the wheel it makes"
    return m.group(1)


def _torch_free(python: Path) -> None:
    """The builder's environment stands alone: no torch for a build to lean on."""
    r = subprocess.run(
        [str(python), "-c", "import torch"],
        capture_output=True,
        text=True,
        env=user_env(),
        timeout=120,
    )
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr, r.stderr


def _check_cell(dist: Path, err: str, wheel_name: str | None = None) -> dict:
    """The cell's manifest entry, after checking what every ARM front-door build must show."""
    (wheel,) = dist.glob("*.whl")
    if wheel_name is not None:
        assert wheel.name == wheel_name, (wheel.name, err[-3000:])
    assert f"[{CELL}] host torch" in err, err[-3000:]  # the step that makes its host torch
    entry = next(e for e in manifest(dist)["wheels"] if e["cell"] == CELL)
    extra = entry["extra"]
    assert extra["backend"] == "cross" and entry["torch"] == "2.8.0+cpu"
    # The record names what ran the project's build: the table's host torch on this host's
    # Python (the builder's own X.Y), never the builder's interpreter itself.
    host = extra["resolved"]["build_host"]
    assert (host["torch"], host["python"]) == (HOST_TORCH, "3.11"), host
    assert "build_host" in extra["inputs"]  # a changed host torch is a changed input
    report = extra["verification"]
    assert report["ok"] is True and report["torch"] == "2.8.0+cpu", report
    return entry


@pytest.mark.starts_from("fresh clone")
def test_readme_make_wheel_arm_py39_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path / "ampforge")
    r = subprocess.run(
        ["make", "wheel", "ARCH=ARM", "PY=3.9"],
        cwd=clone,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    _torch_free(clone / ".venv" / "bin" / "python")
    entry = _check_cell(clone / "dist", r.stderr, readme_wheel())
    assert entry["extra"]["modules"] == ["amp._C"]
    tail = entry["extra"]["verification"]["test"]["tail"][-1]
    assert tail.startswith("amp selftest: ok -- amp "), tail  # amp's own test-command, emulated


@pytest.mark.starts_from("installed tool")
def test_installed_tool_builds_an_arm_cell_of_another_project_from_its_root(tmp_path: Path) -> None:
    wheels = tmp_path / "tool"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
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
    venv = tmp_path / "venv"
    base = shutil.which("python3.11", path=user_env()["PATH"])
    assert base, "the tool is installed with the host's python3.11"
    for argv in (
        [base, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(tool)],
    ):
        r = subprocess.run(argv, capture_output=True, text=True, env=user_env(), timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    _torch_free(venv / "bin" / "python")

    project = write_tiny_extension(tmp_path / "tinyext")
    r = subprocess.run(
        [
            str(venv / "bin" / "ampforge-build"),
            "build",
            "--arch",
            "ARM",
            "--python",
            "3.9",
            "--jobs",
            "1",
        ],
        cwd=project,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    entry = _check_cell(project / "dist", r.stderr)
    assert entry["file"].startswith("tinyext-0.0.1+torch2.8-cp39-cp39-manylinux_2_"), entry
    assert entry["extra"]["modules"] == ["tinyext._C"]


@pytest.mark.starts_from("fresh clone + bundle")
def test_a_bundle_carries_the_host_torch_and_builds_the_arm_cell_air_gapped(tmp_path: Path) -> None:
    """``make fetch`` for the README's ARM cell puts the host torch environment's wheels (this
    host's Python, cross_host_torch) in the bundle beside the cell's own; a fresh clone then
    builds the cell from that bundle alone, in a network namespace with only loopback and no pip
    configuration. (The arm64 sysroot is Debian's .debs, which a bundle does not carry: it comes
    from the cache root, as docs/air-gapped.md says.)"""
    bundle = tmp_path / "bundle"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "fetch",
            "--no-images",
            "--bundle",
            str(bundle),
            "--arch",
            "ARM",
            "--python",
            "3.9",
        ],
        cwd=tmp_path,
        env=builder_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads((bundle / "bundle.json").read_text())
    by_name = {Path(f["path"]).name: f for f in doc["files"]}
    host = [
        n
        for n in by_name
        if re.fullmatch(rf"torch-{re.escape(HOST_TORCH)}(\+\w+)?-cp311-cp311-\S*x86_64\.whl", n)
    ]
    target = [n for n in by_name if re.fullmatch(r"torch-2\.8\.0-cp39-cp39-\S*aarch64\.whl", n)]
    assert host and target, sorted(by_name)
    assert CELL in by_name[host[0]]["cells"] and CELL in by_name[target[0]]["cells"]
    assert f"fetch: host torch of {CELL}: pip download torch=={HOST_TORCH}" in r.stderr
    # Nothing of an aarch64 torch's x86_64-only requirements (pip evaluates markers for this
    # host even with --platform): the cell's wheels are the target's.
    assert not [n for n in by_name if n.startswith(("triton-", "nvidia_"))], sorted(by_name)

    clone = fresh_clone(tmp_path / "ampforge")
    r = in_netns(f"make wheel OFFLINE=1 BUNDLE={bundle} ARCH=ARM PY=3.9", cwd=clone)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert f"preflight: offline bundle {bundle} has all" in r.stderr
    assert f"for host torch of {CELL}" in r.stderr
    entry = _check_cell(clone / "dist", r.stderr, readme_wheel())
    assert entry["extra"]["resolved"]["network"] == "none (offline)"
