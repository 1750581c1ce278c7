"""A real host build of a third-party extension whose ``pyproject.toml`` carries the
``[tool.cibuildwheel]`` a cibuildwheel user writes: a ``linux`` table, an override with
``select`` and ``inherit``, ``build``/``skip``/``test-skip``, ``before-test``,
``test-sources``, ``test-extras`` and ``test-groups`` -- each shown taking effect in the cell
the builder builds (the tiny extension, cp311, torch from the test wheelhouse)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.indexlib import make_wheel
from helpers.pipelinelib import CELL, manifest, run_build

# Run from the test's working folder: it passes only when test-sources copied checks/ there.
CHECK = """\
import os, sys
from pathlib import Path
import torch
import tinyext._C
import ampforge_extra  # only through test-extras (the wheel's "checks" extra)
import ampforge_group  # only through test-groups (the project's [dependency-groups])
assert Path("checks/run.py").is_file() and Path("checks/data.txt").read_text() == "data\\n"
assert not Path("setup.py").exists(), os.listdir(".")  # a folder of its own, not the project
before = Path(sys.prefix) / "before-test.txt"  # before-test wrote it, in this venv
assert before.read_text().split() == ["before-test-sentinel", "linux"], before.read_text()
# the linux table's environment, then the override's (inherit append) for this cell
assert (os.environ["STAGE"], os.environ["OVERRIDE"]) == ("linux", "cp311-x86"), os.environ
print("cibw-test-sentinel", ampforge_extra.VERSION, ampforge_group.VERSION)
"""

TABLE = """\
[dependency-groups]
checks = [{include-group = "inner"}]
inner = ["ampforge-group"]

[tool.cibuildwheel]
build = ["cp311-*", "cp312-*"]
skip = "*-musllinux* *-manylinux_aarch64"
archs = "x86_64"
environment = { STAGE = "global" }
before-test = 'echo before-test-sentinel "$STAGE" > "$VIRTUAL_ENV/before-test.txt"'
test-sources = ["checks"]
test-extras = "checks"
test-groups = ["checks"]
test-command = "python checks/run.py"
%(test_skip)s

[tool.cibuildwheel.linux]
environment = { STAGE = "linux" }

[[tool.cibuildwheel.overrides]]
select = "cp311-manylinux_x86_64"
inherit.environment = "append"
environment = { OVERRIDE = "cp311-x86" }

[[tool.cibuildwheel.overrides]]
select = "cp312-*"
environment = { OVERRIDE = "never-this-cell" }
"""


def _project(root: Path, wheelhouse: Path, test_skip: str = "") -> Path:
    project = write_tiny_extension(root)
    setup = (project / "setup.py").read_text()
    # The extra test-extras installs: a requirement only the "checks" extra declares.
    (project / "setup.py").write_text(
        setup.replace(
            'packages=["tinyext"],',
            'packages=["tinyext"],\n    extras_require={"checks": ["ampforge-extra"]},',
        )
    )
    with (project / "pyproject.toml").open("a") as fh:
        fh.write("\n" + TABLE % {"test_skip": test_skip})
    (project / "checks").mkdir()
    (project / "checks" / "run.py").write_text(CHECK)
    (project / "checks" / "data.txt").write_text("data\n")
    return project


def _wheelhouse(tmp: Path) -> Path:
    """The cp311 torch wheelhouse plus the two probes (the only source pip has here)."""
    house = tmp / "wheelhouse"
    house.mkdir()
    for wheel in wheelhouse_cp311().iterdir():
        if wheel.suffix == ".whl":
            os.symlink(wheel, house / wheel.name)
    make_wheel(house, "ampforge-extra", "7001")
    make_wheel(house, "ampforge-group", "7002")
    return house


@pytest.mark.slow
@pytest.mark.promise(
    promise="a project's [tool.cibuildwheel] selection, overrides and test keys take effect in "
    "a real build as cibuildwheel gives them: before-test in the test venv, test-sources "
    "copied into the test's folder, test-extras and test-groups installed, the linux "
    "table and a selecting override's inherited environment, test-skip's cell built "
    "and import-checked but not tested",
    fault="a third-party extension with a realistic [tool.cibuildwheel] (host backend)",
    result="the test-command sees each key's effect and prints its sentinel; with test-skip "
    "naming the cell, the same build runs the import check and no test-command",
)
def test_a_cibuildwheel_table_takes_effect_in_a_host_build(tmp_path: Path) -> None:
    house = _wheelhouse(tmp_path)
    project = _project(tmp_path / "proj", house)
    r = run_build(
        tmp_path, "--backend", "host", "--project", str(project), "--wheelhouse", str(house)
    )
    assert r.rc == 0, r.err[-4000:]
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "+ before-test: echo before-test-sentinel" in log, log[-3000:]
    assert "+ test-sources: copied checks" in log
    (line,) = [x for x in log.splitlines() if x.startswith("cibw-test-sentinel ")]
    assert line.split()[1:] == ["7001", "7002"], line
    (entry,) = [w for w in manifest(tmp_path / "dist")["wheels"] if w["cell"] == CELL]
    record = entry["extra"]["resolved"]
    assert record["test"]["run"] is True and record["test"]["extras"] == ["checks"]
    assert record["build_options"]["environment"] == [["STAGE", "linux"], ["OVERRIDE", "cp311-x86"]]
    assert "overrides]] #1" in record["build_options"]["sources"]["environment"]

    # test-skip naming the cell: built, repaired and import-checked, its test not run.
    project = _project(tmp_path / "proj2", house, test_skip='test-skip = "cp311-*"')
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(house),
        "--force",
    )
    assert r.rc == 0, r.err[-4000:]
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "smoke: imported ['tinyext._C']" in log, log[-3000:]
    assert "+ test-command:" not in log and "+ before-test:" not in log, log[-3000:]
    (entry,) = [w for w in manifest(tmp_path / "dist")["wheels"] if w["cell"] == CELL]
    assert entry["extra"]["resolved"]["test"]["skipped"].startswith("test-skip = 'cp311-*'")
    print(textwrap.shorten(line, 200))
