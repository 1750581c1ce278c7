"""`python -m builder cache list|prune`: the caches stay bounded.

Real folders under a PRIVATE cache (``AMPFORGE_CACHE``), real flock between processes, a real
host build (the stand-in torch of cachelib: the torch environment's handling is under test, not
torch) and, for the torch layers, the real engine with tiny imported images. The CLI runs see
no engine (``DOCKER_HOST`` points at nothing), so they never touch the shared engine's layers --
and show that a missing engine is a note, not an error.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli
from helpers.cachelib import Lab, build, make_lab
from helpers.enginelib import docker_engine
from helpers.pipelinelib import CELL

from builder.backends.torchenv import BUILD_REQUIREMENTS, CELL_LABEL, PARTS_LABEL, layer_lock
from builder.cache import LAST_USED, content_key, file_digest, lock_entry, lock_path
from builder.cache import prune as cacheprune
from builder.doctor.checks import CACHE_WARN_BYTES, PRUNABLE_WARN_BYTES, cache_check
from builder.doctor.report import OK, WARN
from builder.incell import STEPS_SCRIPT

NO_ENGINE = "unix:///nonexistent/ampforge-test-docker.sock"
DAY = 86400


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return make_lab(tmp_path_factory.mktemp("cache-prune"))


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AMPFORGE_CACHE", str(cache))
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    return cache


def older_env(current: Path, steps: str) -> Path:
    """A copy of *current* named and recorded as a builder with another install step (its
    steps.py digest *steps*) would have made it: the key is computed as torchenv computes it."""
    parts = json.loads((current / "key.json").read_text())
    parts["steps"] = steps
    key = content_key([json.dumps(parts, sort_keys=True)])
    old = current.with_name(current.name.rsplit("-", 1)[0] + f"-{key}")
    shutil.copytree(current, old, symlinks=True)
    (old / "key.json").write_text(json.dumps(parts, sort_keys=True, indent=1) + "\n")
    return old


def start_holder(entry: Path) -> subprocess.Popen[str]:
    """Another process that holds *entry* as a build does (the shared lock), says "held", and
    lets go when its stdin closes."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from builder.cache import hold_entry; hold_entry(Path(sys.argv[1])); "
            "print('held', flush=True); sys.stdin.read()",
            str(entry),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def holds(holder: subprocess.Popen[str]) -> bool:
    return holder.stdout is not None and holder.stdout.readline() == "held\n"


def hold(entry: Path) -> subprocess.Popen[str]:
    holder = start_holder(entry)
    assert holds(holder)
    return holder


@pytest.mark.promise(
    promise="the caches stay bounded: a superseded torch environment is removed by prune, an "
    "entry in use never is",
    fault="two torch environments for one interpreter and torch recorded as made by older "
    "install steps beside the current one, one of them held by another process's lock; "
    "no container engine answering",
    result="--dry-run lists both and removes nothing; prune removes the unheld superseded one "
    "whole (no half-entry, no lock file left), keeps the held one naming its lock and "
    "keeps the current one, which the next build hits",
)
def test_prune_removes_superseded_torch_envs_and_never_one_in_use(
    lab: Lab, tmp_path: Path, private_cache: Path
) -> None:
    # The first build makes the torch environment and stops at a compile error (cheaply: only
    # the environment matters until the last build).
    broken = tmp_path / "broken"
    shutil.copytree(lab.project, broken)
    source = broken / "cext" / "c.c"
    source.write_text("#error stop here\n" + source.read_text())
    first = build(lab, tmp_path, private_cache, project=broken)
    assert first.returncode == 1 and "stop here" in first.stderr, first.stderr[-3000:]
    envs = private_cache / "torch-envs"
    (current,) = [p for p in envs.iterdir() if p.is_dir()]
    assert (current / LAST_USED).is_file()  # the build stamped its use
    old = older_env(current, "0" * 64)
    busy = older_env(current, "1" * 64)
    holder = hold(busy)
    try:
        dry = run_cli("cache", "prune", "--dry-run")
        assert dry.rc == 0, dry.err
        assert f"would remove: torch-env {old.name}" in dry.out
        assert (
            f"kept: in use by a running build (its lock {lock_path(busy)} is held): "
            f"torch-env {busy.name}"
        ) in dry.out
        assert current.name not in dry.out
        assert old.is_dir() and busy.is_dir()
        assert f"torch layers: not listed (no container engine answers at {NO_ENGINE}" in dry.err

        done = run_cli("cache", "prune")
        assert done.rc == 0, done.err
        assert f"removed: torch-env {old.name}" in done.out
        assert f"kept: in use by a running build (its lock {lock_path(busy)} is held)" in done.out
        assert not old.exists() and not lock_path(old).exists()
        assert busy.is_dir() and current.is_dir()
        assert not [p.name for p in envs.iterdir() if p.name.startswith(".")]  # nothing aside
    finally:
        holder.communicate("")
    assert f"removed: torch-env {busy.name}" in run_cli("cache", "prune").out  # let go: it goes

    again = build(lab, tmp_path, private_cache)
    assert again.returncode == 0, again.stderr[-3000:]
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert f"ampforge: torch 2.13.0 environment {current} is cached" in log
    assert [p for p in envs.iterdir() if p.is_dir()] == [current]


def _aged(path: Path, days: float) -> Path:
    stamp = path / LAST_USED if path.is_dir() else path
    stamp.touch()
    when = time.time() - days * DAY
    os.utime(stamp, (when, when))
    return path


def _folder(path: Path, days: float, size: int = 1000) -> Path:
    path.mkdir(parents=True)
    (path / "data").write_bytes(b"x" * size)
    return _aged(path, days)


def test_prune_by_age_list_json_and_a_bad_duration(private_cache: Path) -> None:
    stale = _folder(private_cache / "sysroots" / "python3.11-aarch64-aaaa", days=10)
    fresh = _folder(private_cache / "sysroots" / "python3.11-aarch64-bbbb", days=1)
    other_pip = private_cache / "pip" / "pip-1.0.zip"
    other_pip.parent.mkdir(parents=True)
    other_pip.write_bytes(b"zip")
    leftover = _folder(private_cache / "sites" / ".torch-2.9.1-cp311-cccc.x1y2z3", days=2)
    mine = _folder(private_cache / "wheelhouse-of-a-test-suite", days=400)
    aside = private_cache / "sites" / ".torch-2.9.1-cp311-dddd.discarded.k2j3l4"
    _folder(aside / "torch-2.9.1-cp311-dddd", days=2)
    _aged(aside, days=2)
    house = private_cache.parent / "house.whl"
    house.write_bytes(b"w")
    file_digest(house)  # a memo used now
    old_memo = private_cache / "digests" / ("0" * 32)
    old_memo.write_text("f" * 64 + "\n")
    _aged(old_memo, days=40)

    listed = run_cli("cache", "list", "--format", "json", "--older-than", "7d")
    assert listed.rc == 0, listed.err
    doc = json.loads(listed.out)
    by_name = {e["name"]: e for e in doc["entries"]}
    assert doc["total_bytes"] == sum(e["size"] for e in doc["entries"]) > 0
    assert doc["prune_bytes"] == sum(e["size"] for e in doc["entries"] if e["prune"]) > 0
    assert by_name["pip-1.0.zip"]["state"] == "superseded"
    assert by_name[leftover.name]["state"] == by_name[aside.name]["state"] == "superseded"
    assert by_name[stale.name]["prune"] == "unused for 10 days"
    assert by_name[fresh.name]["prune"] == "" and by_name[mine.name]["prune"] == ""
    assert by_name["2 file digests"]["prune"]

    assert run_cli("cache", "prune").rc == 0  # 30 days: only the superseded and the old memo
    assert stale.is_dir() and not other_pip.exists() and not leftover.exists()
    assert not aside.exists() and not list((private_cache / "sites").iterdir())  # no lock left
    assert not old_memo.exists() and len(list((private_cache / "digests").iterdir())) == 1
    assert run_cli("cache", "prune", "--older-than", "7d").rc == 0
    assert not stale.exists() and fresh.is_dir() and mine.is_dir()

    bad = run_cli("cache", "prune", "--older-than", "7x")
    assert bad.rc == 2
    assert "--older-than: '7x' is not a duration" in bad.err

    assert run_cli("cache", "prune", "--all").rc == 0
    assert not fresh.exists() and not mine.exists()


def _tiny_rootfs(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return path


@pytest.mark.promise(
    promise="the caches stay bounded: a superseded torch layer is removed from the engine, "
    "one a container uses never is",
    fault="torch layer images (ampforge/torch:<cell>-<key>, labelled as the builder labels "
    "them) recorded as made by an older install step, one used by a container, one "
    "held by a build's lock in another process",
    result="prune untags the unused superseded layer through the engine API, keeps the one "
    "the container uses naming the container and the held one naming its lock, and "
    "keeps the current one",
)
@pytest.mark.docker
def test_prune_torch_layers_through_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPFORGE_CACHE", str(tmp_path / "cache"))  # the layers' locks
    engine = docker_engine()
    cell = f"c31test{os.getpid()}"
    base = engine.import_rootfs(
        _tiny_rootfs(tmp_path / "root.tar"), "ampforge-test/cachebase", cell
    )
    current_steps = file_digest(STEPS_SCRIPT)
    tags: dict[str, str] = {}
    container = holder = None
    try:
        for what, steps in (
            ("current", current_steps),
            ("old", "0" * 64),
            ("used", "1" * 64),
            ("held", "2" * 64),
        ):
            parts = {
                "cell_image": base,
                "torch": "2.13.0",
                "offline": True,
                "steps": steps,
                "requirements": list(BUILD_REQUIREMENTS),
                "source": {"wheelhouse": what},
            }
            text = json.dumps(parts, sort_keys=True)
            name = f"{cell}-{content_key([text])}"
            engine.import_rootfs(
                tmp_path / "root.tar",
                "ampforge/torch",
                name,
                changes=[f"LABEL {CELL_LABEL}={cell} {PARTS_LABEL}={json.dumps(text)}"],
            )
            tags[what] = f"ampforge/torch:{name}"
        container = engine.api.create_container(
            tags["used"], command=["/hello"], name=f"{cell}-user"
        )["Id"]
        held_lock = layer_lock(tags["held"].split(":", 1)[1])
        holder = hold(held_lock)  # a build on this machine between its two containers

        inv = cacheprune.Inventory(
            tmp_path,
            [
                e
                for e in cacheprune.inventory(tmp_path / "empty", engine).entries
                if e.name in tags.values()
            ],
        )
        states = {e.name: e.state for e in inv.entries}
        assert states == {
            tags["current"]: "current",
            tags["old"]: "superseded",
            tags["used"]: "superseded",
            tags["held"]: "superseded",
        }
        cacheprune.decide(inv, cacheprune.DEFAULT_OLDER_THAN, everything=False, ccache=False)
        cacheprune.prune(
            inv, engine, cacheprune.DEFAULT_OLDER_THAN, everything=False, dry_run=False
        )
        results = {e.name: e.result for e in inv.entries}
        assert results[tags["old"]] == "removed"
        assert results[tags["used"]] == f"kept: used by container {cell}-user"
        assert results[tags["held"]] == (
            f"kept: in use by a running build (its lock {lock_path(held_lock)} is held)"
        )
        assert results[tags["current"]] == ""
        assert engine.image_id(tags["old"]) is None
        assert all(engine.image_id(tags[k]) for k in ("used", "held", "current"))
    finally:
        if holder is not None:
            holder.communicate("")
        if container is not None:
            engine.api.remove_container(container, force=True)
        for tag in [*tags.values(), f"ampforge-test/cachebase:{cell}"]:
            if engine.image_id(tag) is not None:
                engine.api.remove_image(tag)


def test_doctor_warns_past_the_cache_limits(tmp_path: Path) -> None:
    def inventory(size: int, state: str) -> cacheprune.Inventory:
        inv = cacheprune.Inventory(
            tmp_path, [cacheprune.Entry("torch-env", "e", size, time.time(), state, path=tmp_path)]
        )
        cacheprune.decide(inv, cacheprune.DEFAULT_OLDER_THAN, everything=False, ccache=False)
        return inv

    assert cache_check(inventory(CACHE_WARN_BYTES // 2, "current")).status == OK
    big = cache_check(inventory(CACHE_WARN_BYTES + 1, "current"))
    assert big.status == WARN and "cache prune" in big.fix
    dead = cache_check(inventory(PRUNABLE_WARN_BYTES + 1, "superseded"))
    assert dead.status == WARN and "would free 5.0 GB (1 entry)" in dead.detail


def _blocked_on_flock(pid: int) -> bool:
    """/proc/locks lists a waiter as ``N: -> FLOCK ADVISORY READ <pid> ...``."""
    return any(
        line.split()[1:2] == ["->"] and str(pid) in line.split()
        for line in Path("/proc/locks").read_text().splitlines()
    )


def test_a_build_waiting_while_prune_removes_the_entry_holds_the_new_lock(tmp_path: Path) -> None:
    """Prune unlinks an entry's lock file; a build that was waiting on that very file must not
    end up holding a lock nobody else can see (the next prune would remove its entry)."""
    entry = tmp_path / "sysroots" / "python3.11-aarch64-eeee"
    entry.mkdir(parents=True)
    pruner = lock_entry(entry, shared=False, wait=False)
    assert pruner is not None
    holder = start_holder(entry)
    try:
        deadline = time.monotonic() + 60
        while not _blocked_on_flock(holder.pid):
            assert holder.poll() is None and time.monotonic() < deadline, "never waited"
            time.sleep(0.05)
        shutil.rmtree(entry)  # what prune does under its lock, then:
        lock_path(entry).unlink()
        pruner.close()
        assert holds(holder)
        assert lock_path(entry).exists()  # the waiter opened the name again
        assert lock_entry(entry, shared=False, wait=False) is None  # and holds that one
    finally:
        holder.communicate("")
    again = lock_entry(entry, shared=False, wait=False)
    assert again is not None
    again.close()


def test_a_layer_removed_between_listing_and_inspecting_is_left_out() -> None:
    """`cache list` beside a `cache prune`: an image the engine listed and then no longer
    has (404 on inspect) is gone, not an error (seen: `cache list` exited 1 in the soak)."""
    from docker.errors import NotFound  # noqa: PLC0415 - the docker SDK, with the engine

    from builder.backends.torchenv import CELL_LABEL, TORCH_REPOSITORY  # noqa: PLC0415
    from builder.cache.layers import torch_layers  # noqa: PLC0415 (beside its one test)

    class Api:
        def containers(self, all: bool) -> list:
            return []

        def images(self, filters: dict) -> list:
            assert filters == {"label": CELL_LABEL}
            return [
                {
                    "Id": "sha256:gone",
                    "RepoTags": [f"{TORCH_REPOSITORY}:cell-k"],
                    "Labels": {},
                    "Size": 1,
                    "Created": 0,
                }
            ]

        def inspect_image(self, image: str) -> dict:
            raise NotFound("no such image")

    class Engine:
        api = Api()

    assert torch_layers(Engine()) == []
