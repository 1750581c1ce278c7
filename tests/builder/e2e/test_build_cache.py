"""The build caches (issue 15): torch installed once per cell key and reused by the build and the
verification venv, a compiler cache that hits across work folders, content-hashed keys.

The end-to-end test uses a private cache folder (``AMPFORGE_CACHE``), so it starts cold whatever
this machine built before, and asserts on what the second and third builds did, not on time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import CELL, manifest, run_build

from builder.cache import file_digest, folder_digest
from builder.incell import ccache_stats


def _ccache_compile(tmp: Path, stats: Path) -> None:
    src = tmp / "hello.c"
    src.write_text("int answer(void) { return 42; }\n")
    env = dict(os.environ, CCACHE_DIR=str(tmp / "ccache"), CCACHE_STATSLOG=str(stats))
    subprocess.run(
        ["ccache", "gcc", "-c", str(src), "-o", str(tmp / "hello.o")], env=env, check=True, cwd=tmp
    )


@pytest.mark.skipif(
    shutil.which("ccache") is None, reason="ccache is not installed (.ci/run installs it)"
)
def test_ccache_statslog_is_counted_per_build(tmp_path: Path) -> None:
    """The real ccache's per-compilation log, as the in-cell build step collects it."""
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    _ccache_compile(tmp_path, first)
    _ccache_compile(tmp_path, second)
    assert (ccache_stats(first.read_text()).hits, ccache_stats(first.read_text()).misses) == (0, 1)
    assert (ccache_stats(second.read_text()).hits, ccache_stats(second.read_text()).misses) == (
        1,
        0,
    )


def test_digests_follow_content_not_names_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AMPFORGE_CACHE", str(tmp_path / "cache"))
    house = tmp_path / "house"
    house.mkdir()
    (house / "a-1.whl").write_bytes(b"one")
    (house / "b-1.whl").write_bytes(b"two")
    before = folder_digest(house)
    assert folder_digest(house) == before  # memoised, same answer
    assert file_digest(house / "a-1.whl") != file_digest(house / "b-1.whl")
    (house / "a-1.whl").write_bytes(b"ONE")  # same name and size, other bytes
    os.utime(house / "a-1.whl", ns=(1, 1))
    assert folder_digest(house) != before
    (house / "a-1.whl").write_bytes(b"one")
    os.utime(house / "a-1.whl", ns=(2, 2))
    assert folder_digest(house) == before
    (house / "a-1.whl").rename(house / "c-1.whl")
    assert folder_digest(house) != before


def _log(tmp: Path) -> str:
    return (tmp / "work" / "logs" / f"{CELL}.log").read_text()


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("ccache") is None, reason="ccache is not installed (.ci/run installs it)"
)
def test_host_builds_install_torch_once_and_hit_the_compiler_cache(tmp_path: Path) -> None:
    """Three host builds of one project in three work folders sharing one (initially empty)
    cache: the first makes the torch environment, the second reuses it for the build and the
    verification venv and compiles nothing (all ccache hits), the third has another wheelhouse
    and says that is why it makes a new environment."""
    cache = tmp_path / "cache"
    project = write_tiny_extension(tmp_path / "tinyext")
    house = wheelhouse_cp311()
    runs = []
    for i in (1, 2):
        run_dir = tmp_path / f"run{i}"
        run_dir.mkdir()
        # PYTHONDONTWRITEBYTECODE, as many CI images set it: the environment gets the
        # bytecode of what builds import all the same, once, when it is made.
        r = run_build(
            run_dir,
            "--backend",
            "host",
            "--project",
            str(project),
            "--wheelhouse",
            str(house),
            AMPFORGE_CACHE=str(cache),
            PYTHONDONTWRITEBYTECODE="1",
        )
        assert r.rc == 0, r.err[-4000:]
        runs.append(run_dir)
    first, second = _log(runs[0]), _log(runs[1])
    assert "+ bytecode of `import torch, torch.utils.cpp_extension, torch.optim;" in first
    assert "written: exit 0" in first
    (env,) = (p for p in (cache / "torch-envs").iterdir() if p.is_dir())
    assert list(env.glob("venv/lib/python3.*/site-packages/torch/__pycache__/__init__.*.pyc"))
    assert list(
        env.glob("venv/lib/python3.*/site-packages/torch/utils/__pycache__/cpp_extension.*.pyc")
    )
    # What the first optimizer imports lazily (torch._dynamo), which every test that steps one
    # pays: without its bytecode the verification's self-test compiled 800 modules each time.
    assert list(env.glob("venv/lib/python3.*/site-packages/torch/_dynamo/__pycache__/*.pyc"))
    # The verification venv uses that environment's pip too: no ensurepip per verification.
    assert "+ verification venv: pip from the torch environment" in second
    assert "(first build of this cell here)" in first, first[:2000]
    assert "is cached (key" in second and "making the torch" not in second
    # The build and the verification venv of the second build used that environment: pip was
    # never asked to install torch, and found it installed when installing the wheel.
    assert "install-torch" not in second
    assert "Requirement already satisfied: torch==2.13.0" in second
    installed = [
        line.split(": ", 1)[1].split(", ")
        for line in second.splitlines()
        if line.startswith("Installing collected packages: ")
    ]
    assert len(installed) == 1 and "tinyext" in installed[0] and "torch" not in installed[0]
    stats = [manifest(r / "dist")["wheels"][0]["extra"]["ccache"] for r in runs]
    assert stats[0]["misses"] >= 1
    assert stats[1] == {"hits": stats[0]["misses"] + stats[0]["hits"], "misses": 0}
    assert f"ampforge: ccache for {CELL}: {stats[1]['hits']} hits, 0 misses" in second
    # Same wheel bytes either way (the compiler cache returns what the compiler made).
    (w1,), (w2,) = ((r / "dist").glob("*.whl") for r in runs)
    assert w1.read_bytes() == w2.read_bytes()

    # Another wheelhouse (the same files plus one): a new environment, and the log says why.
    other = tmp_path / "house2"
    other.mkdir()
    for f in house.iterdir():
        os.link(f, other / f.name)
    (other / "README.txt").write_text("one more file\n")
    run3 = tmp_path / "run3"
    run3.mkdir()
    r = run_build(
        run3,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(other),
        "--force",
        AMPFORGE_CACHE=str(cache),
    )
    assert r.rc == 0, r.err[-4000:]
    assert "(changed: source)" in _log(run3)
    envs = sorted(p.name for p in (cache / "torch-envs").iterdir() if p.is_dir())
    assert len(envs) == 2, envs
    key = json.loads((cache / "torch-envs" / envs[0] / "key.json").read_text())
    assert key["torch"] == "2.13.0" and set(key["source"]) == {"wheelhouse"}
