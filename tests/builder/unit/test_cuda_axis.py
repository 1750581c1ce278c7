"""The cuda axis (issue 34): cpu cells keep today's identifiers and labels; a CUDA cell names its
CUDA in its identifier, label and record (plan --format json), with the toolkit pins, the arch
list and where each came from; unreachable CUDA builds are dropped with the reason; bad values
name file, key and value (exit 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.builder_testlib import BASE_CONFIG, SUPPORT, run_cli, write_config

from builder.config import REPO_ROOT
from builder.config.cuda import CudaTable, Toolkit, parse_arch_list
from builder.plan.cells import cell_id, local_label

CUDA_CONFIG = f"""\
support: {SUPPORT}
matrix:
  arch: [X86, ARM]
  python: ["3.11"]
  torch: ["2.13.0", "2.14.1"]
  cuda: ["cpu", "13.0"]
"""
CU_CELL = "cp311-manylinux_x86_64-torch2.14.1-cu130"


def _plan(*argv: str, env: dict[str, str] | None = None) -> dict:
    res = run_cli("plan", "--format", "json", *argv, env=env)
    assert res.rc == 0, res.err
    return json.loads(res.out)


def test_cpu_cells_keep_their_identifiers_and_labels() -> None:
    assert cell_id("X86", "3.11", "2.13.0") == "cp311-manylinux_x86_64-torch2.13.0"
    assert cell_id("X86", "3.11", "2.13.0", "cpu") == "cp311-manylinux_x86_64-torch2.13.0"
    assert cell_id("X86", "3.11", "2.14.1", "13.0") == CU_CELL
    assert local_label("2.13.0") == "torch2.13"
    assert local_label("2.14.1", "13.0") == "torch2.14.cu130"
    doc = _plan()  # the default matrix: no cuda axis, every cell cpu
    assert all(c["cuda"] == {"version": "cpu", "reason": c["cuda"]["reason"]} for c in doc["cells"])
    assert not any(c["id"].endswith("-cu130") for c in doc["cells"])


def test_a_cuda_cell_records_its_cuda_toolkit_and_arch_list(tmp_path: Path) -> None:
    doc = _plan("--config", str(write_config(tmp_path, CUDA_CONFIG)), "--cuda", "13.0")
    cells = {c["id"]: c for c in doc["cells"]}
    assert set(cells) == {
        CU_CELL,
        "cp311-manylinux_x86_64-torch2.13.0-cu130",
        "cp311-manylinux_aarch64-torch2.13.0-cu130",
        "cp311-manylinux_aarch64-torch2.14.1-cu130",
    }
    rec = cells[CU_CELL]
    assert rec["local_version"] == "torch2.14.cu130"
    assert rec["build_group"] == "X86-torch2.14.1-cu130" and rec["wheel"] == "per-torch"
    cuda = rec["cuda"]
    assert cuda["version"] == "13.0" and cuda["reason"] == "named (command line --cuda)"
    assert "default index's torch 2.14.1 for x86_64 is the CUDA 13.0 build" in cuda["torch_source"]
    names = [t.split("==")[0] for t in cuda["toolkit"]]
    assert names == [
        "nvidia-cuda-nvcc",
        "nvidia-nvvm",
        "nvidia-cuda-runtime",
        "nvidia-cuda-cccl",
        "nvidia-cuda-crt",
    ]
    assert cuda["toolkit_hashed"] and all("--hash=sha256:" in t for t in cuda["toolkit"])
    assert cuda["arch_list"] == "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" and cuda["ptx"] == ["120"]
    assert "support table's default" in cuda["arch_list_source"]
    for lib in ("libcudart.so*", "libcuda.so*", "libtorch*.so", "libc10*.so", "libcublas*.so*"):
        assert lib in rec["auditwheel_exclude"], lib
    # aarch64: its own wheels' digests (test_cuda_fatbin downloads them with --require-hashes);
    # the cross and emulated backends install no toolkit, so the cell needs a native runner
    # (docker there, else host: the backends that do).
    arm = cells["cp311-manylinux_aarch64-torch2.14.1-cu130"]
    assert arm["cuda"]["toolkit_hashed"] and arm["cuda"]["toolkit"][0] == (
        "nvidia-cuda-nvcc==13.0.88 --hash=sha256:"
        "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f"
    )
    assert arm["cuda"]["toolkit"] != cuda["toolkit"]  # another machine, other files
    assert not arm["buildable_here"] and arm["backend"] == "docker"
    assert "the cross backend does not install a CUDA toolkit yet" in arm["backend_reason"]


def test_the_table_says_each_cuda_cells_decisions(tmp_path: Path) -> None:
    res = run_cli(
        "plan",
        "--config",
        str(write_config(tmp_path, CUDA_CONFIG)),
        "--arch",
        "X86",
        "--torch",
        "2.14.1",
    )
    assert res.rc == 0, res.err
    assert f"cuda:    {CU_CELL}: CUDA 13.0 (the matrix's cuda axis" in res.out
    assert "TORCH_CUDA_ARCH_LIST=7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" in res.out
    assert "own +torch2.14.cu130" in res.out and "own +torch2.14 " not in res.out
    assert "cp311-manylinux_x86_64-torch2.14.1 " in res.out  # the cpu cell beside it


def test_selectors_and_the_environment_pick_the_cuda(tmp_path: Path) -> None:
    cfg = str(write_config(tmp_path, CUDA_CONFIG))
    by_pattern = _plan("--config", cfg, "*x86_64*-cu130")
    assert {c["id"] for c in by_pattern["cells"]} == {
        CU_CELL,
        "cp311-manylinux_x86_64-torch2.13.0-cu130",
    }
    by_env = _plan("--config", cfg, "--arch", "X86", env={"BUILDER_CUDA": "cpu"})
    assert all(c["cuda"]["version"] == "cpu" for c in by_env["cells"])
    assert by_env["cells"][0]["cuda"]["reason"] == "named (environment BUILDER_CUDA)"
    spelled = _plan("--config", cfg, "--cuda", "cu130", "--torch", "2.14.1", "--arch", "X86")
    assert [c["id"] for c in spelled["cells"]] == [CU_CELL]


def test_make_wheel_passes_cuda() -> None:
    out = subprocess.run(
        ["make", "-n", "wheel", "CUDA=13.0", "CONFIG=configs/cuda.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--cuda 13.0" in out and "--config configs/cuda.yaml" in out


def test_arch_list_layers_config_include_and_environment(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        CUDA_CONFIG
        + """\
  include:
    - {arch: X86, python: "3.11", torch: "2.13.0", cuda: "13.0", cuda_arch_list: "8.6"}
cuda:
  arch_list: {"13.0": "8.0;9.0+PTX"}
""",
    )
    cells = {c["id"]: c["cuda"] for c in _plan("--config", str(cfg), "--cuda", "13.0")["cells"]}
    assert cells[CU_CELL]["arch_list"] == "8.0;9.0+PTX"
    assert cells[CU_CELL]["arch_list_source"].startswith('cuda.arch_list."13.0" (config file')
    inc = cells["cp311-manylinux_x86_64-torch2.13.0-cu130"]
    assert inc["arch_list"] == "8.6" and inc["arch_list_source"].startswith(
        "matrix.include[0].cuda_arch_list"
    )
    env = _plan(
        "--config",
        str(cfg),
        "--cuda",
        "13.0",
        "--torch",
        "2.14.1",
        "--arch",
        "X86",
        "--environment",
        "TORCH_CUDA_ARCH_LIST=8.9",
    )["cells"][0]["cuda"]
    assert env["arch_list"] == "8.9" and env["sass"] == ["89"] and env["ptx"] == []
    assert env["arch_list_source"].startswith("environment TORCH_CUDA_ARCH_LIST")


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        (
            'cuda:\n  arch_list: {"13.0": "8.0;5.2"}\n',
            "cuda.arch_list.13.0",
            "compute capability 5.2 is not a target of CUDA 13.0",
        ),
        (
            'cuda:\n  arch_list: {"12.9": "8.0"}\n',
            "cuda.arch_list.12.9",
            "CUDA '12.9' has no toolkit",
        ),
        ('cuda:\n  index_urls: {"13.0": "ftp://mirror/x"}\n', "cuda.index_urls.13.0", "ftp"),
    ],
)
def test_bad_cuda_settings_name_file_key_and_value(
    tmp_path: Path, extra: str, key: str, words: str
) -> None:
    cfg = write_config(tmp_path, CUDA_CONFIG + extra)
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2
    assert str(cfg) in res.err and key in res.err and words in res.err, res.err


def test_a_bad_cuda_axis_value_is_refused_with_its_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + '  cuda: ["13"]\n')
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2 and "matrix.cuda[0]" in res.err and "'13'" in res.err, res.err
    res = run_cli("plan", "--cuda", "13.0")
    assert res.rc == 2 and "cuda 13.0 is not in the matrix; expected one of cpu" in res.err


def test_a_configured_per_cuda_index_is_used_only_where_the_table_lists_it(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        CUDA_CONFIG.replace('["2.13.0", "2.14.1"]', '["2.9.1"]').replace("[X86, ARM]", "[X86]")
        + 'cuda:\n  index_urls: {"13.0": "https://mirror.invalid/cu130"}\n',
    )
    res = run_cli("plan", "--config", str(cfg), "--cuda", "13.0")
    assert res.rc == 2, res.out
    assert (
        'cuda.index_urls."13.0" is configured, but configs/support.yaml records no cu130 '
        "build of torch 2.9.1 on a per-CUDA index"
    ) in res.err
    table = CudaTable(
        file="t.yaml", toolkits={"13.0": _toolkit()}, per_cuda_indexes={"2.9.1": ("13.0",)}
    )
    source, why = table.torch_source(
        "2.9.1", "x86_64", "13.0", {"13.0": "https://mirror.invalid/cu130"}, "config file c"
    )
    assert why == "" and source is not None
    assert source.index_url == "https://mirror.invalid/cu130"


def _toolkit() -> Toolkit:
    return Toolkit(
        cuda="13.0", capabilities=("7.5", "8.0", "9.0"), default_arch_list="8.0", packages=()
    )


def test_arch_lists_parse_as_torch_reads_them() -> None:
    parsed = parse_arch_list("7.5 8.0;9.0+PTX", _toolkit())
    assert (parsed.text, parsed.sass, parsed.ptx) == (
        "7.5;8.0;9.0+PTX",
        ("75", "80", "90"),
        ("90",),
    )
    with pytest.raises(ValueError, match="'sm_80' is not a compute capability"):
        parse_arch_list("sm_80", _toolkit())
    with pytest.raises(ValueError, match="empty arch list"):
        parse_arch_list(" ; ", _toolkit())


def test_the_support_tables_cuda_section_is_checked(tmp_path: Path) -> None:
    support = (REPO_ROOT / "configs" / "support.yaml").read_text()
    bad = support.replace(
        'default_arch_list: "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"', 'default_arch_list: "6.1"'
    )
    (tmp_path / "support.yaml").write_text(bad)
    cfg = write_config(tmp_path, CUDA_CONFIG.replace(str(SUPPORT), str(tmp_path / "support.yaml")))
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2
    assert "cuda.toolkits.13.0.default_arch_list" in res.err and "6.1" in res.err, res.err
