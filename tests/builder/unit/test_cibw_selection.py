"""cibuildwheel's selection and per-identifier keys of a project's ``[tool.cibuildwheel]``:
``build``/``skip``/``test-skip`` globs on cibuildwheel identifiers, ``archs``, the overrides
(``select``, ``inherit``) and their precedence, the images and ``container-engine``; each shown
by ``plan`` with its source, each bad value an exit 2 naming the key. The real build that shows
them take effect is test_cibw_build.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli

from builder.arch import ARCHES
from builder.config.buildoptions import from_pyproject as options_from
from builder.config.cibwproject import identifiers_of, parse_archs, read_project
from builder.config.depgroups import resolve_groups
from builder.config.projecttest import from_pyproject as project_test_of
from builder.errors import ConfigError
from builder.plan.cells import Cell, DroppedCell


def _project(tmp_path: Path, table: str, extra: str = "") -> Path:
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(extra) + "\n[tool.cibuildwheel]\n" + textwrap.dedent(table)
    )
    return root


def _plan(project: Path, *args: str) -> tuple[dict, str]:
    r = run_cli("plan", "--format", "json", "--project", str(project), *args)
    assert r.rc == 0, r.err
    return json.loads(r.out), r.err


def _cell(arch: str, python: str, torch: str = "2.13.0", cuda: str = "cpu") -> Cell:
    return Cell(arch, python, torch, image=None, cuda=cuda)  # type: ignore[arg-type]


# -- identifiers and globs ----------------------------------------------------------------------


def test_a_cell_is_matched_by_its_cibuildwheel_identifier_and_its_own() -> None:
    assert identifiers_of(_cell("X86", "3.11")) == (
        "cp311-manylinux_x86_64",
        "cp311-manylinux_x86_64-torch2.13.0",
    )
    assert identifiers_of(_cell("ARM", "3.10", "2.14.1", "13.0")) == (
        "cp310-manylinux_aarch64",
        "cp310-manylinux_aarch64-torch2.14.1-cu130",
    )
    dropped = DroppedCell("ARM", "3.9", "2.8.0", "why")
    assert identifiers_of(dropped)[0] == "cp39-manylinux_aarch64"


@pytest.mark.parametrize(
    ("globs", "matched"),
    [
        ("cp311-manylinux_x86_64", {"cp311-manylinux_x86_64"}),
        (
            "cp3{10,11}-*",
            {"cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp311-manylinux_aarch64"},
        ),
        ("*-manylinux_aarch64", {"cp311-manylinux_aarch64"}),
        ("*-musllinux* pp*", set()),
        (
            "*_x86_64",
            {"cp310-manylinux_x86_64", "cp311-manylinux_x86_64", "cp312-manylinux_x86_64"},
        ),
        (
            "*-torch2.13.0",
            {
                "cp311-manylinux_x86_64",
                "cp311-manylinux_aarch64",
                "cp310-manylinux_x86_64",
                "cp312-manylinux_x86_64",
            },
        ),
    ],
)
def test_identifier_globs_as_cibuildwheel_matches_them(
    tmp_path: Path, globs: str, matched: set[str]
) -> None:
    project = _project(tmp_path, f"skip = {globs!r}\n")
    skip = read_project(project).skip
    assert skip is not None
    cells = [_cell("X86", "3.10"), _cell("X86", "3.11"), _cell("ARM", "3.11"), _cell("X86", "3.12")]
    assert {identifiers_of(c)[0] for c in cells if skip.matches(identifiers_of(c))} == matched


def test_archs_words_map_onto_the_builder_arches() -> None:
    def archs(text: str, host: str = "X86") -> tuple[str, ...]:
        return parse_archs(text, host, file="p", key="archs")

    assert archs("x86_64") == ("X86",) and archs("aarch64") == ("ARM",)
    assert archs("auto") == ("X86",) and archs("native", "ARM") == ("ARM",)
    assert archs("auto64", "ARM") == ("ARM",) and archs("all") == ("X86", "ARM")
    assert archs("x86_64 aarch64 x86_64") == ("X86", "ARM")
    assert set(archs("all")) == set(ARCHES)
    for bad in ("i686", "ppc64le", "s390x", "armv7l", "universal2", "auto32"):
        with pytest.raises(ConfigError) as info:
            archs(f"x86_64 {bad}")
        assert repr(bad) in info.value.message and "x86_64" in info.value.message


# -- precedence: global < linux < overrides in order < config file < BUILDER_* < command line --

PRECEDENCE = """\
before-build = "echo global"
environment = { A = "global" }
test-command = "echo global-test"
test-requires = ["pytest"]

[tool.cibuildwheel.linux]
before-build = "echo linux"

[[tool.cibuildwheel.overrides]]
select = "cp311-*"
before-build = "echo first"
test-command = "echo cp311-test"

[[tool.cibuildwheel.overrides]]
select = ["cp311-manylinux_x86_64", "cp312-*"]
before-build = "echo second"
inherit.environment = "append"
environment = { B = "second" }
inherit.test-requires = "prepend"
test-requires = "numpy"
"""


def test_overrides_apply_in_order_over_the_linux_table(tmp_path: Path) -> None:
    project = _project(tmp_path, PRECEDENCE)
    x86_311 = ("cp311-manylinux_x86_64", "cp311-manylinux_x86_64-torch2.13.0")
    arm_311 = ("cp311-manylinux_aarch64", "cp311-manylinux_aarch64-torch2.13.0")
    x86_310 = ("cp310-manylinux_x86_64", "cp310-manylinux_x86_64-torch2.13.0")
    assert options_from(project).before_build == "echo linux"  # no cell: the global value
    assert options_from(project, x86_310).before_build == "echo linux"
    assert options_from(project, arm_311).before_build == "echo first"
    both = options_from(project, x86_311)
    assert both.before_build == "echo second"  # the later override wins
    assert "#2" in both.origins["before-build"]
    # inherit: the second override's assignment after the global one (the shell's later wins)
    assert both.environment == (("A", "global"), ("B", "second"))
    assert "appended by" in both.origins["environment"]
    assert options_from(project, arm_311).environment == (("A", "global"),)
    test = project_test_of(project, x86_311)
    assert test.command == "echo cp311-test" and test.requires == ("numpy", "pytest")
    assert project_test_of(project, x86_310).command == "echo global-test"


def test_the_command_line_wins_over_an_override_and_plan_shows_each_cells(tmp_path: Path) -> None:
    project = _project(tmp_path, PRECEDENCE)
    doc, _ = _plan(project, "--arch", "X86", "--torch", "2.13.0", "--python", "3.10,3.11")
    cells = {c["id"]: c for c in doc["cells"]}
    c311 = cells["cp311-manylinux_x86_64-torch2.13.0"]["build_options"]
    c310 = cells["cp310-manylinux_x86_64-torch2.13.0"]["build_options"]
    assert (c311["before_build"], c310["before_build"]) == ("echo second", "echo linux")
    assert "[[tool.cibuildwheel.overrides]] #2 (select = " in c311["sources"]["before-build"]
    assert cells["cp311-manylinux_x86_64-torch2.13.0"]["test"]["command"] == "echo cp311-test"
    doc, _ = _plan(
        project,
        "--arch",
        "X86",
        "--torch",
        "2.13.0",
        "--python",
        "3.11",
        "--before-build",
        "echo cli",
    )
    (cell,) = doc["cells"]
    assert cell["build_options"]["before_build"] == "echo cli"
    assert cell["build_options"]["sources"]["before-build"] == "command line --before-build"
    assert cell["build_options"]["environment"] == [["A", "global"], ["B", "second"]]


def test_the_table_view_names_the_cells_an_override_changes(tmp_path: Path) -> None:
    project = _project(tmp_path, PRECEDENCE)
    r = run_cli(
        "plan",
        "--project",
        str(project),
        "--arch",
        "X86",
        "--torch",
        "2.13.0",
        "--python",
        "3.10,3.11",
    )
    assert r.rc == 0, r.err
    assert (
        "option:  cp311-manylinux_x86_64-torch2.13.0: before-build: 'echo second' "
        "(pyproject.toml [[tool.cibuildwheel.overrides]] #2"
    ) in r.out, r.out
    assert "option:  cp310-manylinux_x86_64-torch2.13.0" not in r.out


def test_an_inherit_on_a_single_valued_key_exits_2_naming_it(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        build-frontend = "pip"
        [[tool.cibuildwheel.overrides]]
        select = "*"
        inherit.build-frontend = "append"
        build-frontend = "build"
        """,
    )
    r = run_cli("plan", "--project", str(project))
    assert r.rc == 2, r.err
    assert "tool.cibuildwheel.overrides[0].build-frontend" in r.err, r.err


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('overrides = "cp311-*"\n', "tool.cibuildwheel.overrides"),
        (
            '[[tool.cibuildwheel.overrides]]\nbefore-build = "x"\n',
            "tool.cibuildwheel.overrides[0].select",
        ),
        (
            '[[tool.cibuildwheel.overrides]]\nselect = "*"\ninherit.environment = "merge"\n',
            "tool.cibuildwheel.overrides[0].inherit",
        ),
        ('archs = "ppc64le"\n', "tool.cibuildwheel.archs"),
        (
            '[tool.cibuildwheel.linux]\narchs = ["x86_64", "s390x"]\n',
            "tool.cibuildwheel.linux.archs",
        ),
        ('container-engine = "nerdctl"\n', "tool.cibuildwheel.container-engine"),
        ('manylinux-x86_64-image = "Not An Image"\n', "tool.cibuildwheel.manylinux-x86_64-image"),
        ('test-sources = ["missing"]\n', "test-sources"),
        ('test-sources = ["../outside"]\n', "tool.cibuildwheel.test-sources"),
        ('test-groups = "nope"\n', "test-groups"),
        ('test-extras = "not an extra!"\n', "tool.cibuildwheel.test-extras"),
    ],
)
def test_a_bad_value_exits_2_naming_the_key(tmp_path: Path, table: str, key: str) -> None:
    project = _project(tmp_path, table)
    r = run_cli(
        "plan", "--project", str(project), "--arch", "X86", "--python", "3.11", "--torch", "2.13.0"
    )
    assert r.rc == 2, r.err
    assert f": {key}: " in r.err or f" {key}:" in r.err, r.err
    assert "expected" in r.err, r.err


# -- build / skip / archs narrow the cells; plan names the key and its source --------------------


def test_build_and_skip_drop_cells_and_plan_names_key_and_source(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        build = "cp3{11,12}-*"
        [tool.cibuildwheel.linux]
        skip = ["*-manylinux_aarch64"]
        """,
    )
    doc, _ = _plan(project, "--torch", "2.13.0")
    assert {c["id"] for c in doc["cells"]} == {
        "cp311-manylinux_x86_64-torch2.13.0",
        "cp312-manylinux_x86_64-torch2.13.0",
    }
    reasons = {d["id"]: d["reason"] for d in doc["dropped"]}
    file = "pyproject.toml"  # as the project has it, not where it is checked out
    assert reasons["cp310-manylinux_x86_64-torch2.13.0"] == (
        f"not selected by the project's build = 'cp3{{11,12}}-*' ({file} [tool.cibuildwheel])"
    )
    assert reasons["cp311-manylinux_aarch64-torch2.13.0"] == (
        f"skipped by the project's skip = '*-manylinux_aarch64' ({file} [tool.cibuildwheel.linux])"
    )
    r = run_cli("plan", "--project", str(project), "--torch", "2.13.0")
    assert "not selected by the project's build = 'cp3{11,12}-*'" in r.out, r.out


def test_a_selection_the_project_leaves_empty_exits_2_naming_the_key(tmp_path: Path) -> None:
    project = _project(tmp_path, 'build = "cp312-*"\nskip = "cp313-*"\n')
    r = run_cli("plan", "--project", str(project), "--python", "3.11")
    assert r.rc == 2, r.err
    assert "build (" in r.err and "build = 'cp312-*'" in r.err and "leaves no cell" in r.err
    project = _project(tmp_path, 'skip = "*"\n')
    r = run_cli("plan", "--project", str(project))
    assert r.rc == 2 and "skip = '*'" in r.err, r.err


def test_archs_narrows_the_arch_axis_unless_an_arch_is_named(tmp_path: Path) -> None:
    project = _project(tmp_path, '[tool.cibuildwheel.linux]\narchs = "aarch64"\n')
    doc, _ = _plan(project, "--torch", "2.13.0")
    assert doc["cells"] and {c["arch"] for c in doc["cells"]} == {"ARM"}
    doc, _ = _plan(project, "--torch", "2.13.0", "--arch", "X86")  # the command line wins
    assert {c["arch"] for c in doc["cells"]} == {"X86"}
    r = run_cli("build", "--project", str(project), "--print-build-identifiers")
    assert r.rc == 0, r.err  # the default cell: this host's Python, the project's arch
    assert r.out.split() and all("-manylinux_aarch64-" in i for i in r.out.split()), r.out


def test_test_skip_keeps_the_cell_but_not_its_test(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        test-command = "python -m pytest"
        test-skip = "cp312-*"
        """,
    )
    doc, _ = _plan(project, "--arch", "X86", "--torch", "2.13.0", "--python", "3.11,3.12")
    tests = {c["id"]: c["test"] for c in doc["cells"]}
    assert tests["cp311-manylinux_x86_64-torch2.13.0"]["run"] is True
    skipped = tests["cp312-manylinux_x86_64-torch2.13.0"]
    assert skipped["run"] is False and skipped["command"] == "python -m pytest"
    assert skipped["skipped"].startswith("test-skip = 'cp312-*' (")
    r = run_cli(
        "plan",
        "--project",
        str(project),
        "--arch",
        "X86",
        "--torch",
        "2.13.0",
        "--python",
        "3.11,3.12",
    )
    assert (
        "test:    cp312-manylinux_x86_64-torch2.13.0: test-command not run (test-skip = 'cp312-*'"
    ) in r.out and "import check of its modules still runs" in r.out, r.out


# -- images, container engine, keys an override does not take ------------------------------------


def test_the_project_image_is_the_base_unless_the_command_line_names_one(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        manylinux-aarch64-image = "manylinux2014"
        [[tool.cibuildwheel.overrides]]
        select = "cp312-*"
        manylinux-x86_64-image = "registry.example/img:1"
        """,
    )
    doc, _ = _plan(project, "--torch", "2.13.0", "--python", "3.11,3.12", "--backend", "docker")
    cells = {c["id"]: c for c in doc["cells"]}
    arm = cells["cp311-manylinux_aarch64-torch2.13.0"]
    assert arm["base_image"] == "quay.io/pypa/manylinux2014_aarch64", arm["base_image"]
    assert arm["base_image_source"].endswith("[tool.cibuildwheel] manylinux-aarch64-image")
    x312 = cells["cp312-manylinux_x86_64-torch2.13.0"]
    assert x312["base_image"] == "registry.example/img:1"
    assert "overrides]] #1" in x312["base_image_source"]
    x311 = cells["cp311-manylinux_x86_64-torch2.13.0"]
    assert x311["base_image_source"] == "configs/matrix.yaml images.X86.base"
    doc, _ = _plan(
        project,
        "--torch",
        "2.13.0",
        "--python",
        "3.12",
        "--arch",
        "X86",
        "--backend",
        "docker",
        "--base-image",
        "registry.example/cli:2",
    )
    (cell,) = doc["cells"]
    assert cell["base_image"] == "registry.example/cli:2"
    assert cell["base_image_source"] == "command line --base-image"


def test_podman_selects_its_socket_and_docker_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path, 'container-engine = "podman"\n')
    # The caller's DOCKER_HOST is their podman socket: used as it is, and said.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/their-podman.sock")
    _, err = _plan(project, "--arch", "X86", "--python", "3.11", "--torch", "2.13.0")
    assert (
        f"note: engine podman (tool.cibuildwheel.container-engine in {project}"
        f"/pyproject.toml): unix://{tmp_path}/their-podman.sock, from DOCKER_HOST"
    ) in err, err
    assert "warning" not in err, err
    # No podman installed: exit 2 naming the key and what to do.
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    r = run_cli(
        "plan", "--project", str(project), "--arch", "X86", "--python", "3.11", "--torch", "2.13.0"
    )
    assert r.rc == 2, r.err
    assert (
        "tool.cibuildwheel.container-engine: is 'podman', but podman is not installed here" in r.err
    ), r.err
    assert "set container-engine = 'docker'" in r.err, r.err
    monkeypatch.undo()
    project = _project(tmp_path, 'container-engine = "docker"\n')
    _, err = _plan(project, "--arch", "X86", "--python", "3.11", "--torch", "2.13.0")
    assert "warning" not in err and "engine podman" not in err, err


def test_keys_an_override_does_not_take_are_named(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        [[tool.cibuildwheel.overrides]]
        select = "cp311-*"
        skip = "*-manylinux_aarch64"
        build-verbosity = 1
        tset-command = "typo"
        """,
    )
    _, err = _plan(project, "--arch", "X86", "--python", "3.11", "--torch", "2.13.0")
    file = project / "pyproject.toml"
    assert (
        f"warning: {file}: tool.cibuildwheel.overrides[0].skip: not read in an override" in err
    ), err
    assert f"warning: {file}: tool.cibuildwheel.overrides[0].build-verbosity: not read" in err
    assert f"warning: {file}: tool.cibuildwheel.overrides[0].tset-command is unknown" in err


# -- test-groups: PEP 735 ----------------------------------------------------------------------


def test_dependency_groups_resolve_with_includes_and_refuse_a_cycle() -> None:
    doc = {
        "dependency-groups": {
            "Test": ["pytest>=8", {"include-group": "typing"}],
            "typing": ["mypy", "pytest>=8"],
            "loop": [{"include-group": "loop"}],
        }
    }
    assert resolve_groups(doc, ["test"]) == ("pytest>=8", "mypy")
    with pytest.raises(ValueError, match="includes itself"):
        resolve_groups(doc, ["loop"])
    with pytest.raises(ValueError, match="no dependency group 'docs'"):
        resolve_groups(doc, ["docs"])


def test_test_groups_become_requirements_in_the_record(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """\
        test-command = "pytest"
        test-groups = ["test"]
        test-extras = "cuda,plot"
        """,
        extra="""\
        [dependency-groups]
        test = ["pytest", {include-group = "more"}]
        more = ["rich"]
        """,
    )
    doc, _ = _plan(project, "--arch", "X86", "--python", "3.11", "--torch", "2.13.0")
    (cell,) = doc["cells"]
    assert cell["test"]["groups"] == ["test"]
    assert cell["test"]["group_requires"] == ["pytest", "rich"]
    assert cell["test"]["extras"] == ["cuda", "plot"]
