"""Caches that lie (issue 27, part 4): a torch environment with a file removed, a corrupted
compiler cache, a truncated wheel in the wheelhouse, a truncated or altered bundle file.

Real host builds of a one-file C extension against a stand-in ``torch==2.13.0`` (a real, tiny
wheel: the builder's torch handling is what is under test, not torch), each in a PRIVATE cache
folder (``AMPFORGE_CACHE``) that the test damages -- never the shared one. pip sees only the
test's wheelhouse (no machine-wide configuration), so the stand-in is what it installs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli
from helpers.cachelib import Lab, build, make_lab
from helpers.pipelinelib import CELL, dist_state, manifest, seed_dist

from builder.cache import TREE_MANIFEST, tree_problems
from builder.incell import ccache_stats
from builder.offline.bundle import WHEELS_DIR, Bundle, describe_file, write_bundle
from builder.wheel.integrity import damaged_wheels


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return make_lab(tmp_path_factory.mktemp("cache-faults"))


def ccache_compile(tmp: Path, source: Path, out: Path) -> str:
    """One compile through the real ccache (as the builder runs gcc); its per-build log."""
    stats = tmp / f"{out.name}.stats"
    env = dict(os.environ, CCACHE_DIR=str(tmp / "ccache"), CCACHE_STATSLOG=str(stats))
    subprocess.run(
        ["ccache", "gcc", "-c", str(source), "-o", str(out)], env=env, check=True, cwd=tmp
    )
    return stats.read_text()


def corrupt_ccache(ccache: Path) -> int:
    """Overwrite the middle of every cached object with other bytes (same size and name)."""
    count = 0
    for path in ccache.rglob("*"):
        if path.is_file() and path.name not in ("ccache.conf", "stats") and path.stat().st_size:
            data = bytearray(path.read_bytes())
            mid = len(data) // 2
            data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
            path.write_bytes(bytes(data))
            count += 1
    return count


@pytest.mark.promise(
    promise="a corrupted compiler cache never puts wrong objects into a wheel",
    fault="every entry of the compiler cache (ccache, as the builder runs it) overwritten in "
    "the middle, names and sizes kept",
    result="the next compile misses the cache and makes the same object bytes as the compiler; "
    "the cache then serves hits again",
)
@pytest.mark.skipif(
    shutil.which("ccache") is None, reason="ccache is not installed (.ci/run installs it)"
)
def test_corrupted_compiler_cache_is_a_miss(tmp_path: Path) -> None:
    source = tmp_path / "c.c"
    source.write_text("int answer(void) { return 42; }\n")
    ccache_compile(tmp_path, source, tmp_path / "a.o")
    assert ccache_stats(ccache_compile(tmp_path, source, tmp_path / "b.o")).hits == 1  # control
    assert corrupt_ccache(tmp_path / "ccache") >= 1
    after = ccache_stats(ccache_compile(tmp_path, source, tmp_path / "c.o"))
    assert (after.hits, after.misses) == (0, 1)
    assert (tmp_path / "c.o").read_bytes() == (tmp_path / "a.o").read_bytes()
    assert ccache_stats(ccache_compile(tmp_path, source, tmp_path / "d.o")).hits == 1


@pytest.mark.promise(
    promise="no wheel is ever built against a broken torch: a damaged cached torch "
    "environment is detected by its content record and made again",
    fault="a file of torch removed from the cached torch environment (private cache)",
    result="the next build warns naming the missing file, makes the environment again and "
    "builds; a truncated or altered file is named the same way",
)
def test_damaged_torch_environment_is_made_again(lab: Lab, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # The first build makes the torch environment, then stops at a compile error (cheaply:
    # only the environment matters here).
    source = lab.project / "cext" / "c.c"
    broken = tmp_path / "broken"
    shutil.copytree(lab.project, broken)
    (broken / "cext" / "c.c").write_text("#error stop here\n" + source.read_text())
    first = build(lab, tmp_path, cache, project=broken)
    assert first.returncode == 1 and "stop here" in first.stderr, first.stderr[-3000:]
    (env,) = [p for p in (cache / "torch-envs").iterdir() if p.is_dir()]
    assert tree_problems(env / "venv", env / TREE_MANIFEST) == []

    site = env / "venv" / "lib" / "python3.11" / "site-packages"
    victim = site / "torch" / "__init__.py"
    victim.unlink()
    second = build(lab, tmp_path, cache)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (
        f"the cached torch 2.13.0 environment {env} is damaged ({victim} is missing): "
        "removing it and making it again"
    ) in second.stderr
    assert victim.is_file() and tree_problems(env / "venv", env / TREE_MANIFEST) == []
    assert manifest(tmp_path / "dist")["wheels"][0]["cell"] == CELL

    # Truncated, or altered with its size kept: named as well (the record is read, no build).
    data = victim.read_bytes() or b"\n"
    victim.write_bytes(data + b"#")
    assert tree_problems(env / "venv", env / TREE_MANIFEST) == [
        f"{victim} has {len(data) + 1} bytes, {len(data)} when the entry was made"
    ]
    victim.write_bytes(bytes(b ^ 1 for b in data))
    assert tree_problems(env / "venv", env / TREE_MANIFEST) == [
        f"{victim} does not match its sha256 (changed after the entry was made)"
    ]


@pytest.mark.promise(
    promise="a truncated wheel in the wheelhouse stops the build before anything is made from it",
    fault="the torch wheel in the --find-links wheelhouse cut to half its size",
    result="exit 2 naming the file, its size and what is wrong; no torch environment made, "
    "dist/ and its manifest byte-identical",
)
def test_truncated_wheel_in_the_wheelhouse_is_refused(lab: Lab, tmp_path: Path) -> None:
    house = tmp_path / "house"
    shutil.copytree(lab.house, house)
    torch = next(house.glob("torch-*.whl"))
    torch.write_bytes(torch.read_bytes()[: torch.stat().st_size // 2])
    before = seed_dist(tmp_path / "dist")
    r = build(lab, tmp_path, tmp_path / "cache", house=house)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"wheelhouse {house} holds damaged wheels (nothing was built)" in r.stderr
    assert f"{torch} ({torch.stat().st_size} bytes): not a readable zip" in r.stderr
    assert not (tmp_path / "cache" / "torch-envs").exists()
    assert dist_state(tmp_path / "dist") == before
    # The same check on a wheel spliced in the middle (its end record intact).
    spliced = tmp_path / "spliced.whl"
    data = (lab.house / torch.name).read_bytes()
    spliced.write_bytes(data[:40] + b"\0" * 200 + data[240:])
    assert "is cut off or overwritten" in damaged_wheels([spliced])[0]


def tiny_bundle(root: Path, lab: Lab) -> Bundle:
    (root / WHEELS_DIR).mkdir(parents=True)
    files = []
    for wheel in sorted(lab.house.glob("*.whl")):
        shutil.copy(wheel, root / WHEELS_DIR / wheel.name)
        files.append(describe_file(root, f"{WHEELS_DIR}/{wheel.name}", (CELL,)))
    bundle = Bundle(root=root, files=files)
    write_bundle(bundle)
    return bundle


@pytest.mark.promise(
    promise="a bundle file that is not what bundle.json recorded is refused before use",
    fault="a wheel in an offline bundle truncated by one byte, then altered with its size kept",
    result="exit 2 naming the file and how it differs (size, then sha256); nothing built",
)
def test_truncated_or_altered_bundle_file_is_refused(lab: Lab, tmp_path: Path) -> None:
    bundle = tiny_bundle(tmp_path / "bundle", lab)
    victim = bundle.root / bundle.files[0].path
    data = victim.read_bytes()
    victim.write_bytes(data[:-1])
    out = tmp_path / "dist"
    r = run_cli("build", "--bundle", str(bundle.root), "--backend", "host", "--out", str(out))
    assert r.rc == 2, r.err
    assert f"{victim} has {len(data) - 1} bytes, bundle.json says {len(data)}" in r.err
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    r = run_cli("build", "--bundle", str(bundle.root), "--backend", "host", "--out", str(out))
    assert r.rc == 2, r.err
    assert f"{victim} does not match its sha256 in bundle.json (corrupted or altered)" in r.err
    assert not out.exists()
    assert json.loads((bundle.root / "bundle.json").read_text())["files"]  # left as it was
