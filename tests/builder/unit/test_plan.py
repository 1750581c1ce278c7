"""`plan`: the default matrix, dropped cells with reasons, the newest-torch resolution
(the user's own `make wheel ARCH=ARM PY=3.9`), include/exclude, selectors and formats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.builder_testlib import BASE_CONFIG, run_cli, write_config

from builder.cli import build_parser
from builder.config import REPO_ROOT
from builder.plan.cells import cell_id


def _json(*argv: str, env: dict[str, str] | None = None) -> dict:
    res = run_cli("plan", "--format", "json", *argv, env=env)
    assert res.rc == 0, res.err
    return json.loads(res.out)


def test_default_plan_cells_and_dropped_reasons() -> None:
    doc = _json()
    ids = [c["id"] for c in doc["cells"]]
    # 2 arches x (cp39 with 2.8.0 only + 4 Pythons x 3 torches)
    assert len(ids) == 2 * (1 + 4 * 3) == 26
    assert len(set(ids)) == len(ids)
    assert "cp39-manylinux_aarch64-torch2.8.0" in ids
    assert "cp313-manylinux_x86_64-torch2.13.0" in ids
    dropped = {d["id"]: d["reason"] for d in doc["dropped"]}
    assert set(dropped) == {
        cell_id(a, "3.9", t) for a in ("X86", "ARM") for t in ("2.9.1", "2.13.0")
    }
    assert dropped["cp39-manylinux_x86_64-torch2.9.1"] == (
        "torch 2.9.1 publishes no cp39 wheel for x86_64 (it has cp310-cp314; per "
        "configs/support.yaml)"
    )
    cell = next(c for c in doc["cells"] if c["id"] == "cp311-manylinux_aarch64-torch2.13.0")
    assert {
        k: cell[k]
        for k in (
            "arch",
            "machine",
            "python",
            "cp",
            "torch",
            "family",
            "python_path",
            "docker_platform",
            "local_version",
        )
    } == {
        "arch": "ARM",
        "machine": "aarch64",
        "python": "3.11",
        "cp": "cp311",
        "torch": "2.13.0",
        "family": "manylinux",
        "python_path": "/opt/python/cp311-cp311/bin/python",
        "docker_platform": "linux/arm64",
        "local_version": None,
    }
    # torch 2.13 >= the project's stable ABI (pyproject.toml): no +torch label; the labelled
    # per-torch wheels stay for 2.8 and 2.9.
    assert cell["wheel"] == "stable" and cell["torch_requirement"] == "torch>=2.10"
    older = next(c for c in doc["cells"] if c["id"] == "cp311-manylinux_aarch64-torch2.9.1")
    assert older["wheel"] == "per-torch" and older["local_version"] == "torch2.9"
    # aarch64 torch 2.13.0 is a CUDA build (configs/support.yaml): no way to verify it on this
    # x86_64 host, so the record names the native runner it needs and why.
    assert cell["buildable_here"] is False and cell["runner"] == "ubuntu-24.04-arm"
    assert "torch 2.13.0 for aarch64 is a CUDA build" in cell["backend_reason"]
    # The tag the wheel must meet: never above torch's own wheel's.
    assert cell["plat"] == "manylinux_2_28_aarch64"
    assert "torch 2.13.0's own wheel is manylinux_2_28_aarch64" in cell["plat_reason"]
    assert cell["torch_reason"] == "the matrix's torch axis (configs/matrix.yaml)"
    assert cell["proxy"] == {} and cell["ca_bundle"] is None and cell["output"] == "dist"
    # Every cell of the default matrix that cannot be built here is an ARM one, with a reason.
    elsewhere = sorted(c["id"] for c in doc["cells"] if not c["buildable_here"])
    assert all("aarch64" in i for i in elsewhere), elsewhere
    assert all(c["backend_reason"] for c in doc["cells"])


def test_plan_is_what_build_executes_for_every_cell_of_the_default_matrix() -> None:
    """`build --all --dry-run` resolves through the same code path a build runs and stops before
    executing: its records are byte for byte the ones `plan` prints, for every cell of the
    default matrix on this host, the ARM ones and those that need a runner included. (The e2e
    builds check the same against the record each real build stored in its manifest entry.)"""
    planned = run_cli("plan", "--format", "json")
    dry = run_cli("build", "--all", "--dry-run")
    assert planned.rc == 0 and dry.rc == 0, (planned.err, dry.err)
    assert dry.out == planned.out
    cells = json.loads(dry.out)["cells"]
    assert len(cells) == 26 and any(c["id"] == "cp311-manylinux_aarch64-torch2.9.1" for c in cells)
    # And `make wheel ARCH=ARM PY=3.11` (no torch named) resolves alike in both.
    one = ("--arch", "ARM", "--python", "3.11")
    planned = run_cli("plan", "--format", "json", *one)
    dry = run_cli("build", "--dry-run", *one)
    assert dry.out == planned.out and json.loads(dry.out)["notes"]


def test_table_lists_cells_then_dropped_with_reasons() -> None:
    res = run_cli("plan")
    assert res.rc == 0
    lines = res.out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("CELL"))
    assert lines[header].split() == [
        "CELL",
        "TORCH",
        "TORCH-NPU",
        "BUILD",
        "BACKEND",
        "BASE",
        "IMAGE",
        "TAG",
        "(AT",
        "MOST)",
        "ABI",
        "SETUPTOOLS",
        "WHERE",
    ]
    # Which build serves each cell: the stable-ABI wheel of its arch (built by one cell,
    # verified by the others) for torch >= 2.10, else its own labelled one.
    row = {ln.split()[0]: ln for ln in lines[header + 1 : header + 27]}
    assert "X86-stable: builds it" in row["cp311-manylinux_x86_64-torch2.13.0"]
    assert (
        "X86-stable: verifies cp311-manylinux_x86_64-torch2.13.0's"
        in row["cp312-manylinux_x86_64-torch2.13.0"]
    )
    assert "own +torch2.9" in row["cp312-manylinux_x86_64-torch2.9.1"]
    assert (
        "6 wheels for 26 cells: 8 cells take the stable-ABI wheels of ARM-stable, "
        "X86-stable (torch>=2.10, abi3; built once, verified in each)."
    ) in lines
    summary = next(ln for ln in lines if "cells to build on this host;" in ln)
    here, elsewhere = int(summary.split()[0]), int(summary.split("; ")[1].split()[0])
    assert here + elsewhere == 26
    assert f"not buildable on this host ({elsewhere}):" in lines
    drop = lines.index("dropped (4):")
    assert drop > header
    assert all("publishes no cp39 wheel" in ln for ln in lines[drop + 1 : drop + 5])


def test_arm_py39_resolves_to_torch_2_8_0_and_says_so() -> None:
    """`make wheel ARCH=ARM PY=3.9` (the builder's namespaced environment) names one cell."""
    res = run_cli(
        "plan",
        "--format",
        "json",
        env={"BUILDER_ARCH": "ARM", "BUILDER_PYTHON": "3.9", "ARCH": "64"},
    )
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert [c["id"] for c in doc["cells"]] == ["cp39-manylinux_aarch64-torch2.8.0"]
    assert (
        "note: ARM / Python 3.9: no torch named: 2.8.0, the newest in the matrix with a cp39 "
        "wheel for aarch64; newer 2.9.1, 2.13.0 publish no cp39 wheel for aarch64"
    ) in res.err
    assert doc["cells"][0]["torch_reason"].startswith("no torch named: 2.8.0")
    assert {d["torch"] for d in doc["dropped"]} == {"2.9.1", "2.13.0"}


def test_named_python_without_torch_picks_newest_per_arch() -> None:
    doc = _json("--python", "3.11,3.12")
    # X86: the newest. ARM 3.11: the newest this host can verify (aarch64 2.13.0 is a CUDA
    # build); ARM 3.12: nothing can be built here, so the newest, for a native runner.
    assert sorted(c["id"] for c in doc["cells"]) == sorted(
        [cell_id("X86", p, "2.13.0") for p in ("3.11", "3.12")]
        + [cell_id("ARM", "3.11", "2.9.1"), cell_id("ARM", "3.12", "2.13.0")]
    )
    assert len(doc["notes"]) == 4


def test_arch_only_selects_every_cell_of_that_arch() -> None:
    doc = _json("--arch", "aarch64")  # alias of ARM
    assert len(doc["cells"]) == 13 and {c["arch"] for c in doc["cells"]} == {"ARM"}
    assert doc["notes"] == []


def test_explicit_torch_is_kept() -> None:
    doc = _json("--python", "3.11", "--torch", "2.8.0", "--arch", "X86")
    assert [c["id"] for c in doc["cells"]] == ["cp311-manylinux_x86_64-torch2.8.0"]


def test_selectors_are_patterns_on_identifiers() -> None:
    doc = _json("cp31?-manylinux_aarch64-torch2.9.1")
    assert sorted(c["id"] for c in doc["cells"]) == sorted(
        cell_id("ARM", p, "2.9.1") for p in ("3.10", "3.11", "3.12", "3.13")
    )
    # Several selectors: the cells matching any of them (cibuildwheel's build = "a b").
    doc = _json("cp310-manylinux_aarch64-*", "*-torch2.9.1", "--arch", "ARM")
    assert sorted(c["id"] for c in doc["cells"]) == sorted(
        {cell_id("ARM", "3.10", t) for t in ("2.8.0", "2.9.1", "2.13.0")}
        | {cell_id("ARM", p, "2.9.1") for p in ("3.10", "3.11", "3.12", "3.13")}
    )


def test_github_format_is_one_line_job_matrix() -> None:
    res = run_cli("plan", "--format", "github", "--arch", "X86")
    assert res.rc == 0
    assert res.out.count("\n") == 1
    doc = json.loads(res.out)
    assert len(doc["include"]) == 13
    first = doc["include"][0]
    assert {k: first[k] for k in ("cell", "arch", "python", "torch", "machine", "plat")} == {
        "cell": "cp39-manylinux_x86_64-torch2.8.0",
        "arch": "X86",
        "python": "3.9",
        "torch": "2.8.0",
        "machine": "x86_64",
        "plat": "manylinux_2_28_x86_64",
    }
    assert first["runs-on"] == "ubuntu-24.04" and first["backend"] in ("docker", "host")


def test_github_matrix_matches_the_resolved_records_and_every_cell_has_a_runner() -> None:
    """Each job of `plan --format github` carries its record's fields, and a runner that can
    build it: this host's kind for the cells this host can build, else the cell's native one."""
    records = {c["id"]: c for c in _json()["cells"]}
    res = run_cli("plan", "--format", "github")
    jobs = json.loads(res.out)["include"]
    assert [j["cell"] for j in jobs] == list(records)
    runners = {"x86_64": "ubuntu-24.04", "aarch64": "ubuntu-24.04-arm"}
    for job in jobs:
        record = records[job["cell"]]
        for key in ("arch", "machine", "python", "torch", "backend", "plat", "torch_npu"):
            assert job[key] == record[key], (job, key)
        expected = runners["x86_64"] if record["buildable_here"] else record["runner"]
        assert job["runs-on"] == expected
        if not record["buildable_here"]:
            assert record["runner"] == runners[record["machine"]]


def test_exclude_and_include(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        BASE_CONFIG
        + "  exclude:\n"
        + "    - {arch: ARM, torch: '2.8.0'}\n"
        + "  include:\n"
        + "    - {arch: X86, python: '3.14', torch: '2.13.0'}\n",
    )
    doc = _json("--config", str(cfg))
    ids = [c["id"] for c in doc["cells"]]
    assert "cp314-manylinux_x86_64-torch2.13.0" in ids
    assert not any(i.endswith("aarch64-torch2.8.0") for i in ids)
    dropped = {d["id"]: d["reason"] for d in doc["dropped"]}
    assert dropped["cp311-manylinux_aarch64-torch2.8.0"] == (
        "excluded by matrix.exclude[0] (arch=ARM torch=2.8.0)"
    )
    assert doc["warnings"] == []


def test_resolution_ignores_excluded_cells(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path, BASE_CONFIG + "  exclude:\n    - {python: '3.11', torch: '2.13.0'}\n"
    )
    res = run_cli("plan", "--config", str(cfg), "--python", "3.11", "--arch", "X86")
    assert res.rc == 0
    assert "no torch named: 2.8.0" in res.err
    assert "cp311-manylinux_x86_64-torch2.8.0" in res.out


def test_python_m_builder_and_help_document_every_option() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("ARCH", "PY", "TORCH")}
    for command in ("plan", "render"):
        out = subprocess.run(
            [sys.executable, "-m", "builder", command, "--help"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        for action in sub._actions:
            for opt in action.option_strings:
                assert opt in out, f"{command} --help does not mention {opt}"
            if action.help is not None and action.help != "==SUPPRESS==":
                assert action.help.split()[0] in out
    top = subprocess.run(
        [sys.executable, "-m", "builder", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "plan" in top and "render" in top and "Exit codes" in top


def test_help_says_what_each_command_selects_by_default() -> None:
    """build/fetch/doctor with nothing named select this host's one cell (``make wheel``);
    plan/render list the whole matrix. Each --help says its own default, and plan agrees."""
    env = {k: v for k, v in os.environ.items() if k not in ("ARCH", "PY", "TORCH")}

    def helptext(command: str) -> str:
        return " ".join(
            subprocess.run(
                [sys.executable, "-m", "builder", command, "--help"],
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
        )

    for command in ("build", "fetch", "doctor"):
        assert "selection (default: this host's one cell" in helptext(command), command
        assert "every buildable cell" not in helptext(command)
    for command in ("plan", "render"):
        assert "selection (default: every cell of the matrix)" in helptext(command), command


def test_no_command_is_a_usage_error() -> None:
    assert run_cli().rc == 2


@pytest.mark.parametrize("target", ["plan", "dockerfiles"])
def test_make_targets(tmp_path: Path, target: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("ARCH", "PY", "TORCH", "MAKEFLAGS")}
    # -o: treat the builder's set-up as done (this test checks the builder targets only).
    res = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            "builder-env",
            target,
            "ARCH=ARM",
            "PY=3.9",
            f"DOCKERFILES_OUT={tmp_path}",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    if target == "plan":
        assert "cp39-manylinux_aarch64-torch2.8.0" in res.stdout
    else:
        assert [p.name for p in tmp_path.iterdir()] == ["cp39-manylinux_aarch64-torch2.8.0"]
        assert (tmp_path / "cp39-manylinux_aarch64-torch2.8.0" / "Dockerfile").is_file()


def test_a_cross_cell_names_the_host_torch_that_runs_its_build_and_a_host_cell_none() -> None:
    from builder.config.support import load_support  # noqa: PLC0415

    host_torch = load_support(REPO_ROOT / "configs" / "support.yaml").cross_host_torch
    doc = _json("--arch", "ARM,X86", "--python", "3.11", "--torch", "2.9.1", "--backend", "auto")
    cells = {c["id"]: c for c in doc["cells"]}
    arm = cells["cp311-manylinux_aarch64-torch2.9.1"]
    x86 = cells["cp311-manylinux_x86_64-torch2.9.1"]
    if arm["backend"] == "cross":
        py = f"{sys.version_info[0]}.{sys.version_info[1]}"
        assert arm["build_host"]["torch"] == host_torch and arm["build_host"]["python"] == py
        assert "cross_host_torch in configs/support.yaml" in arm["build_host"]["reason"]
    else:  # no cross tools here: the record still says what a cross build would not need
        assert arm["build_host"] is None
    assert x86["build_host"] is None


@pytest.mark.parametrize("value", ['"9.9.9"', "2.13", '"2.13.0-x"'])
def test_a_bad_cross_host_torch_names_the_key_and_what_was_expected(
    tmp_path: Path, value: str
) -> None:
    from builder.config.support import load_support  # noqa: PLC0415
    from builder.errors import ConfigError  # noqa: PLC0415

    text = (REPO_ROOT / "configs" / "support.yaml").read_text()
    path = tmp_path / "support.yaml"
    path.write_text(text.replace('cross_host_torch: "2.13.0"', f"cross_host_torch: {value}"))
    with pytest.raises(ConfigError) as info:
        load_support(path, "support.yaml")
    assert info.value.key == "cross_host_torch", info.value
    assert "expected a quoted torch release of this table's 'torch' mapping" in str(info.value)
