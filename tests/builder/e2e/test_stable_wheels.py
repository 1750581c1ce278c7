"""Wheels on torch's stable ABI: one per arch for every torch >= 2.10 and Python >= 3.10.

Plan level: which build serves each cell (the stable group's one builder, the cells that only
verify its wheel, the labelled per-torch cells), for this project and a ``--project`` that
declares ``[tool.ampforge.stable-abi]``, and a bad declaration is exit 2 naming file and key.

Metadata and installs, with real pip against real indexes (tiny stand-ins for torch and
torch-npu, as tests/builder/e2e/test_index.py does): the stable wheel has no label and requires
``torch>=2.10``; its ``npu`` extra is a range, and pip's resolver pairs it with the torch-npu
built for the torch it ends up with; ``publish`` puts it on a PyPI-like server (pypiserver,
``twine check --strict`` first) from which ``pip install`` takes it next to torch 2.13, while
a user of torch 2.9 gets the labelled wheel from the per-torch index and keeps their torch.

The audits of a real stable wheel (torch-abi-audit, abi3audit --strict) run inside every build
of this repository (tests/builder/e2e/test_wheel_e2e.py records them); here a non-stable module
must be refused by name.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli
from helpers.indexlib import clean_pip_env, fresh_venv, installed_version, make_wheel, pip_in
from test_publish import PASSWORD, USER, running_server

from builder.cli import main
from builder.errors import StepFailed
from builder.release.per_torch import split_by_torch
from builder.release.simple_index import write_simple_index
from builder.wheel.localversion import add_local_version
from builder.wheel.stableabi import check_stable_wheel
from builder.wheel.wheelmeta import requires_dist


def _plan(*args: str) -> dict[str, dict]:
    res = run_cli("plan", "--format", "json", *args)
    assert res.rc == 0, res.err
    return {c["id"]: c for c in json.loads(res.out)["cells"]}


def test_one_build_per_arch_serves_every_stable_cell_and_github_says_who_builds() -> None:
    cells = _plan()
    stable = {i: c for i, c in cells.items() if c["wheel"] == "stable"}
    # The default matrix's torch >= 2.10 part: 4 Pythons x 2 arches, one build per arch.
    assert sorted(stable) == sorted(
        f"cp3{p}-manylinux_{m}-torch2.13.0" for p in (10, 11, 12, 13) for m in ("x86_64", "aarch64")
    )
    builders = {c["build_group"]: c["built_by"] for c in stable.values()}
    assert builders == {
        "X86-stable": "cp311-manylinux_x86_64-torch2.13.0",
        "ARM-stable": "cp311-manylinux_aarch64-torch2.13.0",
    }
    for c in stable.values():
        assert c["local_version"] is None and c["torch_requirement"] == "torch>=2.10"
        assert "[tool.ampforge.stable-abi]" in c["build_reason"]
    per_torch = [c for c in cells.values() if c["wheel"] == "per-torch"]
    assert len(per_torch) == 18 and all(c["built_by"] == c["id"] for c in per_torch)
    assert {c["local_version"] for c in per_torch} == {"torch2.8", "torch2.9"}

    # GitHub: a build job per wheel (18 labelled + 2 stable), a verify job per served cell.
    jobs = json.loads(run_cli("plan", "--format", "github").out)["include"]
    assert len(jobs) == 26
    build = json.loads(run_cli("plan", "--format", "github", "--github-jobs", "build").out)
    verify = json.loads(run_cli("plan", "--format", "github", "--github-jobs", "verify").out)
    assert len(build["include"]) == 20 and len(verify["include"]) == 6
    assert {j["job"] for j in build["include"]} == {"build"}
    for j in verify["include"]:
        assert j["job"] == "verify" and j["built_by"] == builders[j["build_group"]]


def _project(tmp_path: Path, table: str) -> Path:
    project = tmp_path / "ext"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [project]
        name = "ext"
        version = "1.0"
        dependencies = ["torch"]
        """)
        + table
    )
    return project


def test_a_project_that_declares_the_stable_abi_gets_one_build_and_plan_says_why(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path, '[tool.ampforge.stable-abi]\ntorch = "2.9"\npython = "3.12"\n')
    cells = _plan("--project", str(project), "--arch", "X86")
    stable = sorted(i for i, c in cells.items() if c["wheel"] == "stable")
    assert stable == sorted(
        f"cp3{p}-manylinux_x86_64-torch{t}" for p in (12, 13) for t in ("2.9.1", "2.13.0")
    )
    c = cells["cp312-manylinux_x86_64-torch2.9.1"]
    assert c["built_by"] == "cp312-manylinux_x86_64-torch2.13.0"  # the newest torch builds
    assert c["build_reason"].startswith(
        "verifies the X86-stable wheel built by cp312-manylinux_x86_64-torch2.13.0 (no compile)"
    )
    assert "with torch >= 2.9 and Python >= 3.12 (" in c["build_reason"]
    own = cells["cp311-manylinux_x86_64-torch2.13.0"]
    assert own["wheel"] == "per-torch" and own["local_version"] == "torch2.13"
    assert "below the stable ABI's torch >= 2.9, Python >= 3.12" in own["build_reason"]
    # Without the declaration: every cell its own wheel, and plan says so.
    plain = _plan("--project", str(_project(tmp_path / "p", "")), "--arch", "X86")
    assert all(
        c["wheel"] == "per-torch" and "declares no stable ABI" in c["build_reason"]
        for c in plain.values()
    )


@pytest.mark.parametrize(
    "table, key",
    [
        ('[tool.ampforge.stable-abi]\ntorch = 2.10\npython = "3.10"\n', "stable-abi.torch"),
        ('[tool.ampforge.stable-abi]\ntorch = "2.10"\n', "stable-abi.python"),
        ('[tool.ampforge.stable-abi]\ntorch = "2.10"\npython = "3.10"\nabi = 3\n', "stable-abi"),
    ],
)
def test_a_bad_declaration_is_a_configuration_error_naming_file_and_key(
    tmp_path: Path, table: str, key: str
) -> None:
    res = run_cli("plan", "--project", str(_project(tmp_path, table)))
    assert res.rc == 2, res.err
    assert "pyproject.toml" in res.err and key in res.err, res.err


# ------------------------------------------------------------------ metadata and pip


def _stable(base: Path, out: Path) -> Path:
    """What CellJob.label writes for a stable record (builder/backends/base.py)."""
    return add_local_version(
        base, None, out, torch_npu="2.13.0", pin="torch>=2.10", npu_spec=">=2.10"
    )


def _stand_ins(root: Path) -> str:
    """An index with torch 2.9.1 / 2.10.0 / 2.13.0 and the torch-npu built for each of the last
    two (each requiring its own torch, as torch-npu's releases do); its URL."""
    wheels = root / "wheels"
    for version in ("2.9.1", "2.10.0", "2.13.0"):
        make_wheel(wheels, "torch", version)
    for version in ("2.10.0", "2.13.0"):
        series = ".".join(version.split(".")[:2])
        make_wheel(wheels, "torch-npu", version, requires_dist=[f"torch=={series}.*"])
    return write_simple_index(wheels, root / "index").url


def test_the_npu_extra_of_a_stable_wheel_pairs_with_the_torch_pip_ends_up_with(
    tmp_path: Path,
) -> None:
    base = make_wheel(tmp_path / "base", "tpkg", "0.1", requires_dist=["torch>=2.8"])
    (tmp_path / "dist").mkdir()
    wheel = _stable(base, tmp_path / "dist")
    assert wheel.name == "tpkg-0.1-py3-none-any.whl"  # no +torch label
    assert requires_dist(wheel) == ["torch>=2.10", 'torch-npu>=2.10; extra == "npu"']
    index = _stand_ins(tmp_path / "users")
    ours = write_simple_index(tmp_path / "dist", tmp_path / "ours").url
    for name, keep in (("named", ["torch==2.10.*"]), ("unnamed", [])):
        venv = fresh_venv(tmp_path / name)
        assert pip_in(venv, "install", "--index-url", index, "torch==2.10.0").returncode == 0
        r = pip_in(
            venv, "install", "--index-url", index, "--extra-index-url", ours, "tpkg[npu]", *keep
        )
        assert r.returncode == 0, r.stderr
        got = [installed_version(venv, d) for d in ("tpkg", "torch", "torch-npu")]
        if keep:  # the user names their torch (as docs/stable-wheels.md says): its torch-npu comes
            assert got == ["0.1", "2.10.0", "2.10.0"]
        else:  # pip may move to the newest pair, but a pair it is: the torch-npu built for
            # the torch it ends up with
            assert got == ["0.1", "2.13.0", "2.13.0"]


@pytest.mark.starts_from("fresh venv")
def test_publish_to_a_pypi_like_server_and_install_by_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stable wheel goes to a PyPI-like server (pypiserver), the labelled one for torch 2.9
    to the per-torch index: each user gets the wheel for their torch and keeps that torch."""
    base = make_wheel(tmp_path / "base", "tpkg", "0.1", requires_dist=["torch>=2.8"])
    stable_dist, labelled_dist = tmp_path / "stable-dist", tmp_path / "labelled-dist"
    stable_dist.mkdir()
    labelled_dist.mkdir()
    _stable(base, stable_dist)
    labelled = add_local_version(base, "torch2.9", labelled_dist)
    # The per-torch split lists a stable wheel only on the pages its torch range admits.
    both = [*stable_dist.glob("*.whl"), labelled]
    assert {s: [w.name for w in ws] for s, ws in split_by_torch(both).items()} == {
        "torch2.9": ["tpkg-0.1+torch2.9-py3-none-any.whl"]
    }
    index = _stand_ins(tmp_path / "users")
    with running_server(tmp_path / "pypiserver", "update") as server:
        rc = main(
            ["publish", str(stable_dist), "--repository-url", server.url],
            env=clean_pip_env(TWINE_USERNAME=USER, TWINE_PASSWORD=PASSWORD),
        )
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert "twine check --strict: 1 wheel(s) passed" in out.err
        pypi = server.url + "simple/"
        venv = fresh_venv(tmp_path / "v213")
        assert pip_in(venv, "install", "--index-url", index, "torch==2.13.0").returncode == 0
        r = pip_in(venv, "install", "--index-url", index, "--extra-index-url", pypi, "tpkg")
        assert r.returncode == 0, r.stderr
        assert [installed_version(venv, d) for d in ("tpkg", "torch")] == ["0.1", "2.13.0"]
    assert (
        main(
            ["index", str(labelled_dist), "--out", str(tmp_path / "pt"), "--per-torch"],
            env=clean_pip_env(),
        )
        == 0
    )
    page = (tmp_path / "pt" / "torch2.9" / "simple").resolve().as_uri() + "/"
    venv = fresh_venv(tmp_path / "v29")
    assert pip_in(venv, "install", "--index-url", index, "torch==2.9.1").returncode == 0
    r = pip_in(venv, "install", "--index-url", index, "--extra-index-url", page, "tpkg")
    assert r.returncode == 0, r.stderr
    assert [installed_version(venv, d) for d in ("tpkg", "torch")] == ["0.1+torch2.9", "2.9.1"]


def test_a_wheel_that_is_not_on_the_stable_abi_is_refused_by_name(tmp_path: Path) -> None:
    pure = make_wheel(tmp_path, "nothing", "1.0", tag="cp310-abi3-linux_x86_64")
    with pytest.raises(
        StepFailed,
        match=r"nothing-1.0-cp310-abi3-linux_x86_64.whl is not a "
        r"stable-ABI wheel for torch >= 2.10: no extension",
    ):
        check_stable_wheel(pure, "2.10")
    labelled = make_wheel(tmp_path, "cpwheel", "1.0", tag="cp311-cp311-linux_x86_64")
    with pytest.raises(StepFailed, match="must be tagged cpXY-abi3"):
        check_stable_wheel(labelled, "2.10")


def test_a_project_found_stable_by_its_first_build_gets_one_build_per_arch_next_time(
    tmp_path: Path,
) -> None:
    """A --project that declares nothing, whose first (abi3) wheel torch-abi-audit found on the
    stable ABI (the pipeline records that in the manifest): the next plan for that output
    folder groups its cells as if declared, and says where that came from."""
    project = _project(tmp_path, "")
    out = tmp_path / "dist"
    out.mkdir()
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "version": 1,
                "wheels": [
                    {
                        "file": "ext-1.0+torch2.13-cp311-abi3-manylinux_2_28_x86_64.whl",
                        "cell": "cp311-manylinux_x86_64-torch2.13.0",
                        "extra": {
                            "project": "ext",
                            "stable_abi": {"min_torch": "2.11.0", "detected": True},
                        },
                    }
                ],
            }
        )
    )
    cells = _plan("--project", str(project), "--arch", "X86", "--out", str(out))
    stable = sorted(i for i, c in cells.items() if c["wheel"] == "stable")
    assert stable == sorted(f"cp3{p}-manylinux_x86_64-torch2.13.0" for p in (11, 12, 13))
    c = cells["cp312-manylinux_x86_64-torch2.13.0"]
    assert c["torch_requirement"] == "torch>=2.11" and c["local_version"] is None
    assert "detected by torch-abi-audit in ext-1.0+torch2.13-cp311-abi3-" in c["build_reason"]
    # Another project's entry, or one the audit did not find stable, changes nothing.
    other = _plan(
        "--project",
        str(_project(tmp_path / "o", "")),
        "--arch",
        "X86",
        "--out",
        str(tmp_path / "elsewhere"),
    )
    assert {c["wheel"] for c in other.values()} == {"per-torch"}
