"""Issue 27, part 3: two builders at once on one dist/ -- real processes, a real reader polling
manifest.json all the while.

* the same cell: the second builder waits for the first (and says for whom), then finds its
  wheel up to date: one wheel, one entry;
* different cells: writers in separate processes publish many wheels each; every wheel and
  every entry is kept, and the reader never sees invalid JSON or an entry vanish.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311
from helpers.faultlib import C_CELL, wait_for_text, write_c_project
from helpers.pipelinelib import build_argv, builder_env, manifest, seed_dist, wait_until_building

pytestmark = pytest.mark.slow


class ManifestReader(threading.Thread):
    """Reads dist/manifest.json in a loop until stopped: every read must parse, and no cell an
    earlier read listed may be missing from a later one."""

    def __init__(self, dist: Path) -> None:
        super().__init__(daemon=True)
        self.path = dist / "manifest.json"
        self.reads = 0
        self.problems: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        seen: set[str] = set()
        while not self.stop.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                continue
            try:
                cells = {w["cell"] for w in json.loads(text)["wheels"]}
            except (ValueError, KeyError, TypeError) as exc:
                self.problems.append(f"read {self.reads}: {exc!r}: {text[:200]!r}")
                continue
            if not seen <= cells:
                self.problems.append(f"read {self.reads}: lost {sorted(seen - cells)}")
            seen |= cells
            self.reads += 1

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=10)


def _popen(argv: list[str], cwd: Path, stderr: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv, cwd=cwd, env=builder_env(), stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True
    )


@pytest.mark.promise(
    promise="two builders of the same cell on one dist/ never race: the second waits, says "
    "for whom, then finds the first one's wheel up to date",
    fault="a second `python -m builder build` of the same cell and dist/ started while the "
    "first is compiling; a reader polls manifest.json throughout",
    result="both exit 0; the second printed 'waiting: the builder with pid <first>' and "
    "reported up-to-date; one wheel, one entry for the cell, the earlier entry kept; "
    "every read of manifest.json parsed",
)
def test_the_same_cell_twice_at_once_waits_then_is_up_to_date(tmp_path: Path) -> None:
    release = tmp_path / "release"
    project = write_c_project(tmp_path / "src")
    setup = project / "setup.py"
    # The first build holds the cell until the test lets it go: the second one starts while
    # the first is certainly mid-build (a condition, not a delay).
    setup.write_text(
        f"import os, time\nwhile not os.path.exists({str(release)!r}):\n"
        f"    time.sleep(0.1)\n" + setup.read_text()
    )
    dist = tmp_path / "dist"
    seed_dist(dist)
    reader = ManifestReader(dist)
    reader.start()
    argv = build_argv(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    first = _popen(argv, tmp_path, tmp_path / "first.err")
    second = None
    try:
        wait_until_building(first, tmp_path / "work" / "logs" / f"{C_CELL}.log")
        second = _popen(argv, tmp_path, tmp_path / "second.err")
        wait_for_text(tmp_path / "second.err", f"waiting: the builder with pid {first.pid}", second)
        release.touch()
        assert first.wait(timeout=600) == 0, (tmp_path / "first.err").read_text()[-3000:]
        assert second.wait(timeout=600) == 0, (tmp_path / "second.err").read_text()[-3000:]
    finally:
        reader.finish()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    err = (tmp_path / "second.err").read_text()
    assert f"{C_CELL}: waiting: the builder with pid {first.pid}" in err, err
    assert "up-to-date" in err, err
    assert len(list(dist.glob("cext-*.whl"))) == 1
    cells = [w["cell"] for w in manifest(dist)["wheels"]]
    assert sorted(cells) == sorted([C_CELL, "cp310-manylinux_x86_64-torch2.9.1"])
    assert reader.reads > 0 and not reader.problems, reader.problems[:5]


WRITER = """\
import sys
from pathlib import Path
from builder.release.manifest import ManifestEntry, publish_recorded

dist, staging, name, count = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
staging.mkdir(parents=True)
for i in range(count):
    cell = f"cp3{i}-{name}-torch2.13.0"
    wheel = staging / f"{name}-{i}-cp311-cp311-manylinux_2_17_x86_64.whl"
    wheel.write_bytes(f"{cell} wheel".encode())
    entry = ManifestEntry.for_wheel(wheel, cell=cell, torch="2.13.0", python="3.11",
                                    base_image="host", compiler="cc", builder_version="0",
                                    started_at="t0", finished_at="t1")
    publish_recorded(wheel, dist, entry, cells=[cell])
"""


@pytest.mark.promise(
    promise="builders of different cells sharing one dist/ keep every wheel and every "
    "manifest entry, and a reader never sees a half-written manifest",
    fault="three processes publishing 40 wheels each into one dist/ at once, a reader "
    "polling manifest.json throughout",
    result="all 120 wheels and entries (and the earlier one) present with matching sha256; "
    "every read parsed and no read lost an entry an earlier read had",
)
def test_different_cells_at_once_keep_every_wheel_and_entry(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    seed_dist(dist)
    reader = ManifestReader(dist)
    reader.start()
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(dist),
                str(tmp_path / f"staging-{n}"),
                f"w{n}",
                "40",
            ],
            env=builder_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    try:
        for w in writers:
            assert w.wait(timeout=300) == 0, w.stderr.read() if w.stderr else ""
    finally:
        reader.finish()
    entries = manifest(dist)["wheels"]
    assert len(entries) == 121
    from builder.release.manifest import sha256_file  # noqa: PLC0415

    for entry in entries:
        assert sha256_file(dist / entry["file"]) == entry["sha256"]
    assert reader.reads > 0 and not reader.problems, reader.problems[:5]
