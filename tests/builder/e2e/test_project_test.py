"""A project's own tests as verification (cibuildwheel's ``test-requires``/``test-command``):
where the values come from, what the placeholders become, the exit 2 for a bad value, and a real
host build of the tiny extension whose test-command runs in the verification venv.

The failing test-command (exit 1, dist/ untouched, the output's tail shown) is with the other
cell failures in test_pipeline_failures.py; the cross path's run under QEMU in test_cross.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.indexlib import make_wheel
from helpers.pipelinelib import CELL, builder_env, manifest, run_build

from builder.config import load_settings
from builder.config.projecttest import (
    ProjectTest,
    expand,
    parse_command,
    resolve_project_test,
)
from builder.errors import ConfigError


def _project(root: Path, cibuildwheel: str = "") -> Path:
    project = write_tiny_extension(root)
    if cibuildwheel:
        with (project / "pyproject.toml").open("a") as fh:
            fh.write("\n[tool.cibuildwheel]\n" + textwrap.dedent(cibuildwheel))
    return project


def _config(tmp: Path, text: str) -> Path:
    path = tmp / "matrix.yaml"
    path.write_text(
        textwrap.dedent("""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.11"]
          torch: ["2.13.0"]
        """).format(support=Path(__file__).resolve().parents[3] / "configs" / "support.yaml")
        + textwrap.dedent(text)
    )
    return path


# -- values and layers --------------------------------------------------------------------------


def test_placeholders_become_quoted_paths_and_other_braces_stay() -> None:
    cmd = "cd {project} && python -m pytest {package}/tests -k 'a or b' && echo {} ${HOME} {a,b}"
    assert expand(cmd, project="/p/root", package="/p/root/pkg") == (
        "cd /p/root && python -m pytest /p/root/pkg/tests -k 'a or b' && echo {} ${HOME} {a,b}"
    )
    # A path with a space stays one word for sh.
    out = expand("ls {project}/x", project="/my project", package="/my project")
    assert out == "ls '/my project'/x"
    assert (
        subprocess.run(
            ["sh", "-c", "printf '%s\\n' " + expand("{package}", project="/a b", package="/a b")],
            capture_output=True,
            text=True,
        ).stdout
        == "/a b\n"
    )


def test_a_list_of_commands_runs_as_one() -> None:
    assert parse_command(["python -m a", "python -m b"]) == "python -m a && python -m b"


def test_layers_pyproject_then_config_file_then_command_line(tmp_path: Path) -> None:
    project = _project(
        tmp_path / "proj",
        """\
        test-requires = ["pytest"]
        test-command = "python -m pytest {project}/tests"
        """,
    )
    only = resolve_project_test(project, ProjectTest(), None, None)
    assert only.command == "python -m pytest {project}/tests" and only.requires == ("pytest",)
    assert only.command_origin.endswith("pyproject.toml [tool.cibuildwheel]")
    # The config file replaces the command; its requires key is absent, so pyproject's stays.
    config = load_settings(env={}).config
    assert config.test == ProjectTest()  # the repository's matrix sets neither key
    file_layer = load_settings(
        _cli(_config(tmp_path, 'test-command: "python -c pass"\n')), env={}
    ).config.test
    both = resolve_project_test(project, file_layer, None, None)
    assert both.command == "python -c pass" and both.requires == ("pytest",)
    assert both.command_origin.startswith("config file ")
    top = resolve_project_test(project, file_layer, "numpy>=1.26 rich", "true")
    assert (top.command, top.requires) == ("true", ("numpy>=1.26", "rich"))
    assert top.command_origin == "command line --test-command"
    # This repository: amp's self-test, from its pyproject.toml.
    repo = resolve_project_test(Path(__file__).resolve().parents[3], config.test, None, None)
    assert repo.command == "python -m amp.selftest"


def _cli(config: Path):
    from builder.config import CliOverrides  # noqa: PLC0415

    return CliOverrides(config=str(config))


def _dry_run(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "build",
            "--dry-run",
            "--backend",
            "host",
            "--arch",
            "X86",
            "--python",
            "3.11",
            "--torch",
            "2.13.0",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=300,
        env=builder_env(DOCKER_HOST=f"unix://{tmp}/no-engine.sock"),
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--test-command", ""), "error: --test-command: empty command; expected a shell command"),
        (("--test-command", "  "), "error: --test-command: empty command"),
        (
            ("--test-command", "python -m pytest {pkg}/tests"),
            "error: --test-command: unknown placeholder {pkg} in 'python -m pytest {pkg}/tests'; "
            "expected only {project} (the project's root) and {package} (the package built)",
        ),
        (
            ("--test-command", "true", "--test-requires", ""),
            "error: --test-requires: empty value; expected requirements",
        ),
        (
            ("--test-command", "true", "--test-requires", "pytest>>8"),
            "error: --test-requires: 'pytest>>8' is not a requirement",
        ),
    ],
)
def test_bad_command_line_values_exit_2_naming_the_flag(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    r = _dry_run(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_config_file_value_exits_2_naming_file_line_and_key(tmp_path: Path) -> None:
    config = _config(tmp_path, 'test-command: "python {tests}/run.py"\n')
    r = _dry_run(tmp_path, "--config", str(config))
    assert r.returncode == 2, r.stderr
    assert f"error: {config}:6: test-command: unknown placeholder {{tests}}" in r.stderr, r.stderr
    config.write_text(config.read_text().replace('"python {tests}/run.py"', '""'))
    r = _dry_run(tmp_path, "--config", str(config))
    assert r.returncode == 2 and f"{config}:6: test-command: empty command" in r.stderr, r.stderr
    config.write_text(config.read_text().replace('test-command: ""', "test-command: 3"))
    r = _dry_run(tmp_path, "--config", str(config))
    assert r.returncode == 2 and "test-command" in r.stderr, r.stderr


def test_bad_pyproject_value_exits_2_naming_the_file_and_key(tmp_path: Path) -> None:
    project = _project(tmp_path / "proj", 'test-command = ""\n')
    r = _dry_run(tmp_path, "--project", str(project))
    assert r.returncode == 2, r.stderr
    assert (
        f"error: {project / 'pyproject.toml'}: tool.cibuildwheel.test-command: empty command"
    ) in r.stderr, r.stderr
    with pytest.raises(
        ConfigError,
        match=r"tool\.cibuildwheel\.test-requires: 'not a req!' "
        "is not a requirement",
    ):
        resolve_project_test(
            _project(tmp_path / "p2", 'test-requires = ["not a req!"]\n'), ProjectTest(), None, None
        )


# -- for real: the tiny extension's own test in the host backend's verification venv -----------

CHECK = """\
import os, sys
from pathlib import Path
import torch  # loads libc10 & co. for the extension
import ampforge_probe, tinyext, tinyext._C
project, package = Path(sys.argv[1]), Path(sys.argv[2])
assert project == package and (project / "setup.py").is_file(), (project, package)
# The installed wheel, never the project's sources, and not run from the project.
assert project.resolve() not in Path(tinyext.__file__).resolve().parents, tinyext.__file__
assert Path.cwd().resolve() != project.resolve() and not os.listdir("."), os.getcwd()
print("project-test-sentinel", ampforge_probe.VERSION, tinyext._C.__name__, project)
"""


@pytest.mark.slow
def test_the_projects_test_command_runs_in_the_verification_venv(tmp_path: Path) -> None:
    # A test-requires that is in no wheelhouse, reached by a direct file URL.
    probe = make_wheel(tmp_path / "probe", "ampforge-probe", "4711")
    project = _project(
        tmp_path / "proj",
        f"""\
        test-requires = ["ampforge-probe @ {probe.as_uri()}"]
        test-command = "python {{project}}/checks/run.py {{project}} {{package}}"
        """,
    )
    (project / "checks").mkdir()
    (project / "checks" / "run.py").write_text(CHECK)
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    assert r.rc == 0, r.err[-4000:]
    assert (
        "test-command: 'python {project}/checks/run.py {project} {package}' "
        "(pyproject.toml [tool.cibuildwheel])"
    ) in r.err, r.err
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    # Run, with both placeholders naming the project's copy in the session (not the source).
    (line,) = [x for x in log.splitlines() if x.startswith("project-test-sentinel ")]
    _, value, module, copy = line.split()
    assert (value, module) == ("4711", "tinyext._C")
    assert Path(copy).name == "project" and Path(copy) != project
    assert f"+ test-command: python {copy}/checks/run.py {copy} {copy}" in log
    (entry,) = [w for w in manifest(tmp_path / "dist")["wheels"] if w["cell"] == CELL]
    assert "test" in entry["extra"]["inputs"]
    # A changed test-command is another input: the cell is verified again, not up to date.
    again = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        "--test-command",
        "python -c 'import torch, tinyext._C; print(\"second-test-sentinel\")'",
    )
    assert again.rc == 0, again.err[-4000:]
    assert "inputs changed since the last build: test" in again.err, again.err
    assert "second-test-sentinel" in (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    print(json.dumps(entry["extra"]["inputs"]))
