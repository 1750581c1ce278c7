"""The composite GitHub Action at the repository root (``action.yml``): inputs in the spirit of
cibuildwheel's action (package-dir, output-dir, config-file, only), shell steps only besides the
builder's own Python, and those steps run here as a runner runs them (tests/builder/helpers/cilib.py
``run_action``): the build step's options for each input, then one cell of a tiny extension
built end to end with the host backend from the Action's own copy of the builder.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import yaml
from helpers.builder_testlib import run_cli
from helpers.cilib import OWN_TINY_CONFIG, base_env, run_action, source_repository
from helpers.enginelib import write_tiny_extension

from builder.config import REPO_ROOT

ACTION = REPO_ROOT / "action.yml"
CELL = "cp311-manylinux_x86_64-torch2.13.0"


def _action() -> dict:
    return yaml.safe_load(ACTION.read_text())


def test_the_action_has_cibuildwheels_inputs_and_passes_them_as_environment() -> None:
    action = _action()
    assert action["runs"]["using"] == "composite"
    assert {k: v.get("default") for k, v in action["inputs"].items()} == {
        "package-dir": ".",
        "output-dir": "wheelhouse",
        "config-file": "",
        "only": "",
    }
    steps = action["runs"]["steps"]
    assert [s.get("uses", "").split("@")[0] for s in steps if "uses" in s] == [
        "actions/setup-python"
    ]
    for step in steps:
        if "run" in step:
            assert step["shell"] == "bash"
            # An input's value reaches the script as an environment variable only: pasted
            # into the script text, a value such as `$(...)` would run.
            assert "${{" not in step["run"], step["name"]
    assert "builder.lockfile install" in steps[1]["run"]  # the lock's pins, as make builder-env


def _stub_build_step(tmp_path: Path, inputs: dict[str, str]) -> list[str]:
    """The action's build step with an `ampforge-build` on PATH that records its arguments."""
    action = _action()
    (step,) = [s for s in action["runs"]["steps"] if s.get("name") == "build wheels"]
    stub = tmp_path / "bin" / "ampforge-build"
    stub.parent.mkdir(parents=True, exist_ok=True)
    record = tmp_path / "argv"
    stub.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {record}\n')
    stub.chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    env = {**base_env(), "PATH": f"{stub.parent}:{base_env()['PATH']}"}
    run_action(
        {**action, "runs": {"using": "composite", "steps": [step]}},
        REPO_ROOT,
        inputs,
        workspace,
        env,
        tmp_path / "tmp",
    )
    return record.read_text().splitlines()


@pytest.mark.parametrize(
    ("inputs", "argv"),
    [
        ({}, ["build", "--project", ".", "--out", "wheelhouse", "--all"]),
        (
            {
                "package-dir": "myext",
                "config-file": "myext/ci.yaml",
                "only": "cp311-manylinux_x86_64",
                "output-dir": "out",
            },
            [
                "build",
                "--project",
                "myext",
                "--out",
                "out",
                "--config",
                "myext/ci.yaml",
                "cp311-manylinux_x86_64-*",
            ],
        ),
        ({"only": CELL}, ["build", "--project", ".", "--out", "wheelhouse", CELL]),
        (
            {"package-dir": "a dir/$(touch pwned)"},
            ["build", "--project", "a dir/$(touch pwned)", "--out", "wheelhouse", "--all"],
        ),
    ],
)
def test_the_build_step_gives_the_inputs_to_build(
    tmp_path: Path, inputs: dict[str, str], argv: list[str]
) -> None:
    assert _stub_build_step(tmp_path, inputs) == argv
    assert not (tmp_path / "ws" / "pwned").exists()


def test_a_cibuildwheel_identifier_in_only_selects_its_cells() -> None:
    """`only: cp311-manylinux_x86_64` becomes the selector `cp311-manylinux_x86_64-*`: every
    torch cell of that Python and platform, and no other."""
    res = run_cli("plan", "--format", "json", "cp311-manylinux_x86_64-*")
    assert res.rc == 0, res.err
    cells = [c["id"] for c in json.loads(res.out)["cells"]]
    assert cells and all(c.startswith("cp311-manylinux_x86_64-torch") for c in cells), cells
    res = run_cli("plan", "--format", "json", "cp311-manylinux_x86_64")
    assert res.rc == 2, "a bare cibuildwheel identifier matches no cell: the step adds -*"


@pytest.mark.slow
@pytest.mark.starts_from("installed tool")
def test_the_actions_steps_build_one_cell_of_a_tiny_extension(tmp_path: Path) -> None:
    """The action as a project's job uses it: its own checkout (a copy of this repository)
    installs the builder from builder-dist/ into a fresh venv with the lock's pins, and the
    build step builds the project's one cell on the host backend into output-dir."""
    if platform.machine() != "x86_64":
        pytest.skip("the tiny config's cell is x86_64")
    action_path = source_repository(REPO_ROOT, tmp_path / "action")
    workspace = tmp_path / "workspace"
    write_tiny_extension(workspace / "myext")
    (workspace / "myext" / "ci.yaml").write_text(OWN_TINY_CONFIG)
    env = {**base_env(), "BUILDER_BACKEND": "host"}
    ran = run_action(
        _action(),
        action_path,
        {
            "package-dir": "myext",
            "output-dir": "wheelhouse",
            "config-file": "myext/ci.yaml",
            "only": "cp311-manylinux_x86_64",
        },
        workspace,
        env,
        tmp_path / "runner-temp",
    )
    print(ran)  # where the time goes (pytest -s shows it)
    (wheel,) = (workspace / "wheelhouse").glob("*.whl")
    assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_")
    (entry,) = json.loads((workspace / "wheelhouse" / "manifest.json").read_text())["wheels"]
    assert entry["cell"] == CELL and entry["extra"]["backend"] == "host"
    assert entry["extra"]["modules"] == ["tinyext._C"]
    # The builder that ran is the wheel the action installed (its data under builder/_data),
    # not this checkout's.
    venv = tmp_path / "runner-temp" / "ampforge-build"
    assert (venv / "bin" / "ampforge-build").is_file()
    (installed,) = venv.glob("lib/python3.*/site-packages/builder/_data/configs/matrix.yaml")
    assert installed.is_file() and not (workspace / ".venv").exists()
