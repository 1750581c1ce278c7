"""Helpers for the air-gapped walkthrough (test_airgapped.py, test_airgapped_host.py): a fresh
clone, ``make fetch`` on this connected machine, and the documented commands run inside a network
namespace that has nothing but loopback (``unshare --net``, root)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from builder.config import REPO_ROOT
from helpers.enginelib import missing
from helpers.pipelinelib import CELL, AmpBuild, builder_env, manifest

SELECT = ("ARCH=X86", "PY=3.11")


def require_unshare() -> str:
    found = shutil.which("unshare")
    problem = (
        "unshare (util-linux) is not installed"
        if found is None
        else "a new network namespace needs root"
        if os.geteuid() != 0
        else None
    )
    if problem is not None:
        missing(problem, ".ci/run runs as root")
    assert found is not None
    return found


def airgapped_env(**extra: str) -> dict[str, str]:
    """The environment of a person at the air-gapped machine: no proxies, no pip configuration
    (this machine's pip.conf points at local wheel folders), no venv or builder variables."""
    drop = (
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "BUNDLE",
        "SOURCE_DATE_EPOCH",
        "AMPFORGE_TEST_GROUP",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop
        and not k.startswith(("BUILDER_", "PIP_"))
        and not k.lower().endswith("_proxy")
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env.update(extra)
    return env


def in_netns(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """*script* (bash) in a fresh network namespace that has only loopback."""
    return subprocess.run(
        [
            require_unshare(),
            "--net",
            "--",
            "bash",
            "-euo",
            "pipefail",
            "-c",
            f"ip link set lo up 2>/dev/null || true\n{script}",
        ],
        cwd=cwd,
        env=airgapped_env(**env),
        capture_output=True,
        text=True,
        timeout=3000,
    )


def fresh_clone(dest: Path) -> Path:
    """``git clone`` of this repository's HEAD: a checkout with no .venv, nothing compiled."""
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(dest)], check=True, timeout=300)
    assert not (dest / ".venv").exists()
    return dest


def make_fetch(bundle: Path, *variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in builder_env().items() if k not in ("MAKEFLAGS", "BUNDLE")}
    # -o builder-env: this connected machine's builder is the test session's own .venv.
    return subprocess.run(
        [
            "make",
            "-s",
            "-o",
            "builder-env",
            "fetch",
            f"BUNDLE={bundle}",
            *SELECT,
            "TORCH=2.13.0",
            *variables,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def online_epoch(online: AmpBuild) -> str:
    """The SOURCE_DATE_EPOCH the online build used (its manifest records it): the offline
    build is given the same, as it is the same input."""
    assert online.run.rc == 0, online.run.err[-4000:]
    entry = next(e for e in manifest(online.dist)["wheels"] if e["cell"] == CELL)
    return str(entry["extra"]["source_date_epoch"]["value"])


def check_airgapped_wheel(
    clone: Path, online: AmpBuild, backend: str, run: subprocess.CompletedProcess, bundle: Path
) -> dict:
    """The offline ``make wheel`` in *clone*: the builder set up from the bundle alone, no torch
    or compiled amp in .venv, and a wheel byte-identical to *online*'s. Returns its manifest
    entry."""
    from builder import lockfile  # noqa: PLC0415
    from builder.inputkey import input_key  # noqa: PLC0415
    from builder.release.manifest import sha256_file  # noqa: PLC0415

    out = run.stdout + run.stderr
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert f"from offline bundle {bundle}" in out  # the builder's own set-up
    site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    # torch itself and amp (the builder's lock has torch_abi_audit, which is neither).
    unwanted = [
        p.name
        for p in site.iterdir()
        if p.name in ("torch", "amp") or re.match(r"(torch|ampforge)-\d", p.name)
    ]
    assert not unwanted, unwanted
    assert not list((clone / "amp").glob("_C*.so"))
    (wheel,) = (clone / "dist").glob("*.whl")
    assert wheel.name == online.wheel.name
    assert wheel.read_bytes() == online.wheel.read_bytes(), (
        f"{wheel} differs from the same cell built online ({online.wheel})"
    )
    import zipfile  # noqa: PLC0415

    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if n.startswith("builder/")]  # amp never ships it
    entry = next(e for e in manifest(clone / "dist")["wheels"] if e["cell"] == CELL)
    assert entry["sha256"] == sha256_file(wheel) and entry["extra"]["backend"] == backend
    inputs = entry["extra"]["inputs"]
    assert inputs["builder_lock"] == input_key({"builder_lock": lockfile.digest()})[:12]
    assert inputs["builder_env"] == input_key({"builder_env": []})[:12]  # exactly the lock
    return entry
