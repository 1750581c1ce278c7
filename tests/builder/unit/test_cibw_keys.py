"""A project's ``[tool.cibuildwheel]`` as cibuildwheel users write it: the ``linux`` platform
table is read over the global keys (cibuildwheel's precedence), and every key the builder does
not read is named in a warning with what to do instead -- never dropped without a word."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli

from builder.config import REPO_ROOT
from builder.config.cibwkeys import INSTEAD, READ, project_warnings

REALISTIC = """\
[build-system]
requires = ["setuptools", "wheel", "torch"]
build-backend = "setuptools.build_meta"

[tool.cibuildwheel]
build = "cp311-*"
skip = "*-musllinux*"
test-skip = "*-aarch64"
before-all = "echo global"
before-test = "pip install numpy"
test-sources = ["tests"]
test-requires = "pytest"
test-command = "python -m pytest {project}/tests"
tset-command = "a typo"

[tool.cibuildwheel.linux]
before-all = "echo linux"
repair-wheel-command = "auditwheel repair -w {dest_dir} {wheel}"
test-command = "python -c 'import ext'"
manylinux-x86_64-image = "manylinux_2_28"

[[tool.cibuildwheel.overrides]]
select = "cp312-*"
environment = { FOO = "1" }
"""


def _project(tmp_path: Path, text: str = REALISTIC) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text(textwrap.dedent(text))
    return root


@pytest.mark.promise(
    promise="a project's [tool.cibuildwheel] is read as cibuildwheel reads it for Linux (its "
    "linux table over the global keys, then the overrides that select the cell), and "
    "each key the builder does not read is named with what to do instead",
    fault="a realistic [tool.cibuildwheel]: build, skip, test-skip, before-test, test-sources, "
    "a misspelt key, a linux table, an override",
    result="plan exits 0; the linux table's before-all, repair-wheel-command and test-command "
    "win, with their table named; the override's environment reaches only the cells it "
    "selects; one warning for the misspelt key only",
)
def test_a_realistic_table_is_read_or_named_key_by_key(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "tests").mkdir()
    r = run_cli(
        "plan", "--format", "json", "--project", str(project), "--arch", "X86", "--torch", "2.13.0"
    )
    assert r.rc == 0, r.err
    cells = {c["id"]: c for c in json.loads(r.out)["cells"]}
    assert set(cells) == {"cp311-manylinux_x86_64-torch2.13.0"}, set(cells)  # build = cp311-*
    (cell,) = cells.values()
    opts = cell["build_options"]
    linux = "pyproject.toml [tool.cibuildwheel.linux]"  # not where the project is checked out
    assert opts["before_all"] == "echo linux" and opts["sources"]["before-all"] == linux
    assert opts["repair_wheel_command"] == "auditwheel repair -w {dest_dir} {wheel}"
    assert opts["environment"] == []  # the override selects cp312 only
    assert cell["test"]["command"] == "python -c 'import ext'"
    assert cell["test"]["sources"]["test-command"] == linux
    assert cell["test"]["before_test"] == "pip install numpy"
    assert cell["test"]["test_sources"] == ["tests"]
    assert cell["base_image_source"] == f"{linux} manylinux-x86_64-image"
    warned = [line for line in r.err.splitlines() if line.startswith("warning: ")]
    file = project / "pyproject.toml"
    assert warned == [
        f"warning: {file}: tool.cibuildwheel.tset-command is unknown: not a "
        "cibuildwheel option the builder knows (a typo?); it is ignored"
    ], warned
    from builder.config.projecttest import from_pyproject  # noqa: PLC0415

    test = from_pyproject(project)
    assert test.command == "python -c 'import ext'" and test.command_origin == linux
    assert test.requires == ("pytest",)


def test_this_repository_s_own_table_has_nothing_unread() -> None:
    assert project_warnings(REPO_ROOT) == []


def test_a_linux_value_that_is_not_a_table_exits_2_naming_it(tmp_path: Path) -> None:
    project = _project(tmp_path, '[tool.cibuildwheel]\nlinux = "yes"\n')
    r = run_cli("plan", "--project", str(project))
    assert r.rc == 2, r.err
    assert "tool.cibuildwheel.linux" in r.err and "expected a table" in r.err, r.err


def test_the_table_says_something_for_every_key_it_does_not_read() -> None:
    assert not READ & set(INSTEAD)
    assert all(advice and not advice.endswith(".") for advice in INSTEAD.values())
    # What #35 made read is no longer in the table of what to do instead.
    for key in (
        "build",
        "skip",
        "test-skip",
        "archs",
        "before-test",
        "test-extras",
        "test-sources",
        "test-groups",
        "overrides",
        "manylinux-x86_64-image",
        "manylinux-aarch64-image",
        "container-engine",
    ):
        assert key in READ and key not in INSTEAD, key
