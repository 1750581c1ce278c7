"""CUDA wheel names (issue 34): one file name per (torch, CUDA), the torch series pin as for a cpu
wheel, and ``index --per-torch`` pages per torch x CUDA, so pip never offers a CPU torch's user
the CUDA wheel (pip installs from the pages it is given, real pip)."""

from __future__ import annotations

from pathlib import Path

from helpers.indexlib import fresh_venv, installed_version, make_wheel, pip_in

from builder.plan.cells import local_label
from builder.release.per_torch import split_by_torch, torch_series, write_per_torch_indexes
from builder.wheel.localversion import add_local_version, torch_pin
from builder.wheel.wheelmeta import requires_dist


def _wheels(tmp: Path) -> list[Path]:
    base = make_wheel(tmp / "base", "tpkg", "0.1")
    dist = tmp / "dist"
    dist.mkdir()
    return [add_local_version(base, local_label("2.14.1", cuda), dist) for cuda in ("cpu", "13.0")]


def test_a_cuda_wheel_has_its_own_name_and_the_same_torch_pin(tmp_path: Path) -> None:
    cpu, cu = _wheels(tmp_path)
    assert cpu.name.startswith("tpkg-0.1+torch2.14-") and cu.name.startswith(
        "tpkg-0.1+torch2.14.cu130-"
    )
    assert torch_pin("torch2.14.cu130") == torch_pin("torch2.14") == "torch==2.14.*"
    assert "torch==2.14.*" in requires_dist(cu) and "torch==2.14.*" in requires_dist(cpu)
    assert (torch_series(cpu), torch_series(cu)) == ("torch2.14", "torch2.14.cu130")
    assert split_by_torch([cu, cpu]) == {"torch2.14": [cpu], "torch2.14.cu130": [cu]}


def test_per_torch_pages_split_by_cuda_and_pip_takes_the_one_it_is_given(tmp_path: Path) -> None:
    cpu, cu = _wheels(tmp_path)
    out = tmp_path / "index"
    write_per_torch_indexes([cpu, cu], out)
    assert sorted(p.name for p in out.iterdir()) == ["torch2.14", "torch2.14.cu130"]
    page = (out / "torch2.14" / "simple" / "tpkg" / "index.html").read_text()
    assert "torch2.14-" in page and "cu130" not in page
    venv = fresh_venv(tmp_path / "venv")
    # the wheels' torch pin is met by no torch here: --no-deps, what pip chooses is the point
    proc = pip_in(
        venv,
        "install",
        "--no-deps",
        "--index-url",
        (out / "torch2.14.cu130" / "simple").resolve().as_uri() + "/",
        "tpkg",
    )
    assert proc.returncode == 0, proc.stderr
    assert installed_version(venv, "tpkg") == "0.1+torch2.14.cu130"
