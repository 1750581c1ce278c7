"""Every path argument of every command, given something it must refuse: exit 2 with one line
naming the option, what the path is and what was expected -- never a traceback, nothing written.

The cases are made from the parser itself: every option whose metavar says it is a path must be
in builder.pathargs.PATH_ARGUMENTS (so a new option is covered the day it is added), and each
table entry is tried with the wrong things for its kind.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from builder.cli import build_parser, main
from builder.pathargs import PATH_ARGUMENTS, PATH_METAVARS


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def _path_actions() -> dict[tuple[str, str], argparse.Action]:
    found = {}
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if action.metavar in PATH_METAVARS or (name, action.dest) in PATH_ARGUMENTS:
                found[(name, action.dest)] = action
    return found


ACTIONS = _path_actions()


def test_every_path_option_of_every_command_is_checked() -> None:
    assert set(ACTIONS) == set(PATH_ARGUMENTS), (
        "path options missing from builder.pathargs.PATH_ARGUMENTS: "
        f"{sorted(set(ACTIONS) - set(PATH_ARGUMENTS))}; table entries naming no option: "
        f"{sorted(set(PATH_ARGUMENTS) - set(ACTIONS))}"
    )
    assert len(ACTIONS) >= 25


def _argv(command: str, dest: str, value: str, tmp: Path) -> tuple[list[str], str]:
    """A command line giving *value* to the option *dest* (the rest well-formed), and the
    option's spelling."""
    action = ACTIONS[(command, dest)]
    good = tmp / "good-dir"
    good.mkdir(exist_ok=True)
    if action.option_strings:
        spelled = next(o for o in action.option_strings if o.startswith("--"))
        argv = [command, spelled, value]
        if command == "merge":
            argv.insert(1, str(good))
        if command == "render" and dest == "out":
            argv += ["--ci", "github"]
    else:
        spelled = str(action.metavar)
        argv = [command, value]
    # The other arguments these commands require, well-formed.
    if command in ("index", "merge") and dest != "out":
        argv += ["--out", str(tmp / "out")]
    if (command, dest) in (("index", "out"), ("publish", "config"), ("publish", "stage")):
        argv.insert(1, str(good))  # DIST
    return argv, spelled


def _kind(command: str, dest: str) -> str:
    kind = PATH_ARGUMENTS[(command, dest)]
    return kind(argparse.Namespace(ci="github")) if callable(kind) else kind


def _bad_values(kind: str, tmp: Path, make: bool = True) -> dict[str, str]:
    a_file = tmp / "a-file"
    a_dir = tmp / "a-dir"
    if make:
        a_file.write_text("not a folder\n")
        a_dir.mkdir(exist_ok=True)
    bad = {
        "through a file": str(a_file / "below"),
        "a newline": str(tmp / "two\nlines"),
        "not UTF-8": os.fsdecode(bytes(tmp) + b"/caf\xe9"),
        "empty": "",
    }
    if kind.startswith("file"):
        bad["a folder"] = str(a_dir)
    else:
        bad["a file"] = str(a_file)
    if kind in ("file", "file-update", "dir"):
        bad["missing"] = str(tmp / "missing")
    return bad


CASES = [
    (cmd, dest, case)
    for (cmd, dest) in sorted(PATH_ARGUMENTS)
    for case in _bad_values(_kind(cmd, dest), Path("/"), make=False)
]


@pytest.mark.promise(
    promise="every path a command takes on its command line is checked before the command runs",
    fault="a folder where a file is expected or the reverse, a missing input, a path through a "
    "file, a name with a newline or bytes that are not UTF-8, an empty name -- for every "
    "path option of every command, found by walking the parser",
    result="exit 2 with one line naming the option, what the path is and what was expected; no "
    "traceback, nothing written",
)
@pytest.mark.parametrize(
    ("command", "dest", "case"), CASES, ids=[f"{c}-{d}-{k.replace(' ', '_')}" for c, d, k in CASES]
)
def test_a_wrong_path_exits_2_naming_the_option(
    tmp_path: Path, capsys, command: str, dest: str, case: str
) -> None:
    value = _bad_values(_kind(command, dest), tmp_path)[case]
    argv, spelled = _argv(command, dest, value, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(argv, env={k: v for k, v in os.environ.items() if not k.startswith("BUILDER_")})
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"command line {spelled}:" in lines[0], err
    assert "; expected " in lines[0] and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_issues_three_render_commands(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dist").mkdir()
    for argv, fragment in (
        (["render", "--out", "/etc/passwd"], "/etc/passwd is a file; expected a folder"),
        (
            ["render", "--ci", "github", "--out", "dist/"],
            "dist/ is a folder; expected a file to write",
        ),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]
    # A missing parent of the workflow file is made, as for .github/workflows/ in a project
    # that has none yet (the documented command).
    assert main(["render", "--ci", "github", "--out", "missing/dir/wheels.yml"]) == 0, (
        capsys.readouterr().err
    )
    assert (tmp_path / "missing" / "dir" / "wheels.yml").is_file()


def test_names_with_spaces_are_paths_like_any_other(tmp_path: Path, capsys) -> None:
    out = tmp_path / "docker files"
    assert main(["render", "--arch", "X86", "--python", "3.11", "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    assert list(out.glob("*/Dockerfile"))
    (tmp_path / "ci dir").mkdir()
    workflow = tmp_path / "ci dir" / "wheels.yml"
    assert main(["render", "--ci", "github", "--out", str(workflow)]) == 0, capsys.readouterr().err
    assert workflow.read_text().startswith(("#", "name:", "on:"))
