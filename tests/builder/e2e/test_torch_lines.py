"""The Ascend torch lines (issue 33): torch 2.1.0-2.7.1 in the support table, the facts each line
needs differently (the glibc of its wheels, its C++ string ABI, the setuptools its cpp_extension
accepts) decided once in the table and shown per cell by ``plan`` and its JSON record; a bad value
in the new keys stops every command with exit 2 naming file, line and key; configs/ascend.yaml
lists every line with its reasons; and a real cross build of a tiny extension against aarch64
torch 2.1.0 (cp39), with the table's facts, imports and runs under QEMU -- and fails to import
when compiled with the other string ABI, which is what the fact is for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.builder_testlib import run_cli, write_config

from builder.config import REPO_ROOT
from builder.config.support import load_support
from builder.cross import (
    cross_build_wheel,
    ensure_target_python,
    ensure_target_torch,
    find_toolchain,
    repair_cross_wheel,
    run_wheel_under_qemu,
)
from builder.cross.target_torch import platform_args, wheel_cxx11_abi
from builder.errors import ConfigError, StepFailed
from builder.incell.steps import needs_cxx_floor
from builder.wheel.wheelcheck import check_needs_within, need_summary, tag_glibc

SUPPORT = REPO_ROOT / "configs" / "support.yaml"
ASCEND = REPO_ROOT / "configs" / "ascend.yaml"

#: What the index said on 2026-12-01 (configs/support.yaml's comments say how it was read):
#: the Pythons per line, the torch-npu pin, the string ABI and glibc per machine, setuptools.
LINES = {
    "2.1.0": (
        ("3.8", "3.11"),
        ("3.8", "3.11"),
        "2.1.0.post17",
        (False, False),
        ("2.17", "2.17"),
        "setuptools<70",
    ),
    "2.2.0": (
        ("3.8", "3.12"),
        ("3.8", "3.12"),
        "2.2.0.post2",
        (False, False),
        ("2.17", "2.17"),
        "setuptools",
    ),
    "2.3.1": (
        ("3.8", "3.12"),
        ("3.8", "3.12"),
        "2.3.1.post6",
        (False, False),
        ("2.17", "2.17"),
        "setuptools",
    ),
    "2.4.0": (
        ("3.8", "3.12"),
        ("3.8", "3.12"),
        "2.4.0.post4",
        (False, False),
        ("2.17", "2.17"),
        "setuptools",
    ),
    "2.5.1": (
        ("3.9", "3.13"),
        ("3.9", "3.12"),
        "2.5.1.post1",
        (False, False),
        ("2.17", "2.17"),
        "setuptools",
    ),
    "2.6.0": (
        ("3.9", "3.13"),
        ("3.9", "3.13"),
        "2.6.0.post5",
        (False, True),
        ("2.17", "2.28"),
        "setuptools",
    ),
    "2.7.1": (
        ("3.9", "3.13"),
        ("3.9", "3.13"),
        "2.7.1.post11",
        (True, True),
        ("2.28", "2.28"),
        "setuptools",
    ),
}
MACHINES = ("x86_64", "aarch64")


def _span(pythons: tuple[str, ...]) -> tuple[str, str]:
    ordered = sorted(pythons, key=lambda v: tuple(int(x) for x in v.split(".")))
    return ordered[0], ordered[-1]


# --------------------------------------------------------------------------- the table


def test_the_table_has_every_ascend_line_with_its_facts() -> None:
    table = load_support(SUPPORT, "configs/support.yaml")
    for torch, (x86, arm, npu, abi, glibc, setuptools) in LINES.items():
        for i, (machine, span) in enumerate(zip(MACHINES, (x86, arm))):
            assert _span(table.pythons(torch, machine)) == span, (torch, machine)
            assert table.abi(torch, machine).value is abi[i], (torch, machine)
            assert table.glibc(torch, machine).value == glibc[i], (torch, machine)
            assert table.is_cuda_build(torch, machine) is (machine == "x86_64"), (torch, machine)
        assert table.setuptools_requirement(torch).value == setuptools, torch
        assert table.torch_npu is not None and table.torch_npu[torch] is not None
        assert table.torch_npu[torch].release == npu
    # The modern lines keep the defaults: the C++11 ABI, no setuptools bound, manylinux_2_28.
    assert table.abi("2.13.0", "x86_64").value is True
    assert table.setuptools_requirement("2.13.0").value == "setuptools"
    assert table.torch_plat("2.13.0", "aarch64") == "manylinux_2_28_aarch64"


def test_plan_json_shows_each_cells_abi_setuptools_and_glibc_as_the_yaml_says() -> None:
    res = run_cli("plan", "--config", str(ASCEND), "--format", "json")
    assert res.rc == 0, res.err
    cells = json.loads(res.out)["cells"]
    # The YAML read here, not through the builder: the record must say what the file says.
    raw = yaml.safe_load(SUPPORT.read_text())

    def per_machine(key: str, torch: str, machine: str, default: object) -> object:
        entry = raw.get(key, {}).get(torch, raw.get(key, {}).get("default", default))
        return entry.get(machine) if isinstance(entry, dict) else entry

    seen = set()
    for c in cells:
        torch, machine = c["torch"], c["machine"]
        seen.add((torch, machine))
        assert c["cxx11_abi"] is per_machine("torch_cxx11_abi", torch, machine, True), c["id"]
        assert c["glibc"] == per_machine("torch_glibc", torch, machine, "2.28"), c["id"]
        assert c["plat"] == f"manylinux_{c['glibc'].replace('.', '_')}_{machine}"
        bound = raw.get("torch_setuptools", {}).get(torch, "")
        assert c["setuptools"] == f"setuptools{bound}", c["id"]
        assert "configs/support.yaml" in c["cxx11_abi_reason"], c["id"]
        assert "configs/support.yaml" in c["setuptools_reason"], c["id"]
        # Below manylinux_2_28 the build compiles the C++ floor header in.
        assert c["cxx_floor"] is (c["glibc"] == "2.17"), c["id"]
    assert seen == {(t, m) for t in LINES for m in MACHINES}
    one = next(c for c in cells if c["id"] == "cp38-manylinux_x86_64-torch2.1.0")
    assert (one["cxx11_abi"], one["setuptools"], one["glibc"], one["torch_npu"]) == (
        False,
        "setuptools<70",
        "2.17",
        "2.1.0.post17",
    )
    assert "_GLIBCXX_USE_CXX11_ABI=0" in one["cxx11_abi_reason"]


def test_ascend_config_lists_every_line_on_both_arches_with_reasons() -> None:
    res = run_cli("plan", "--config", str(ASCEND))
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("CELL"))
    assert lines[header].split()[-4:] == ["MOST)", "ABI", "SETUPTOOLS", "WHERE"]
    rows = {ln.split()[0]: ln.split() for ln in lines[header + 1 :] if ln.startswith("cp3")}
    for torch, (x86, arm, *_rest) in LINES.items():
        for machine, (low, high) in zip(MACHINES, (x86, arm)):
            for py in (low, high):
                cid = f"cp{py.replace('.', '')}-manylinux_{machine}-torch{torch}"
                assert cid in rows, cid
    assert rows["cp38-manylinux_x86_64-torch2.1.0"][-4:-2] == ["pre-cxx11", "<70"]
    assert rows["cp39-manylinux_aarch64-torch2.7.1"][-4:-2] == ["cxx11", "any"]
    text = res.out
    # The cp38 aarch64 cells need a runner, and the plan says why for each backend.
    arm38 = next(
        ln
        for ln in lines
        if ln.strip().startswith("cp38-manylinux_aarch64-torch2.1.0") and "auto:" in ln
    )
    assert "no aarch64 Python 3.8 sysroot" in arm38
    # Dropped cells say which Pythons the torch has.
    assert (
        "cp38-manylinux_x86_64-torch2.5.1    torch 2.5.1 publishes no cp38 wheel for x86_64 "
        "(it has cp39-cp313" in text
    )
    assert "torch 2.1.0 publishes no cp312 wheel for aarch64 (it has cp38-cp311" in text


def test_a_named_line_widens_the_default_matrix_and_says_so() -> None:
    res = run_cli(
        "plan", "--arch", "X86", "--python", "3.8", "--torch", "2.1.0", "--format", "json"
    )
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert [c["id"] for c in doc["cells"]] == ["cp38-manylinux_x86_64-torch2.1.0"]
    assert any("torch 2.1.0 is not on configs/matrix.yaml's matrix axis" in n for n in doc["notes"])
    # A torch the table does not know is still an error naming the matrix's.
    bad = run_cli("plan", "--torch", "2.3.0")
    assert bad.rc == 2 and "torch 2.3.0 is not in the matrix" in bad.err


def test_a_manylinux_2_28_image_is_refused_for_a_manylinux2014_torch(tmp_path: Path) -> None:
    res = run_cli(
        "plan",
        "--arch",
        "ARM",
        "--python",
        "3.8",
        "--torch",
        "2.1.0",
        "--backend",
        "emulated",
        "--format",
        "json",
    )
    assert res.rc == 0, res.err
    cell = json.loads(res.out)["cells"][0]
    assert cell["buildable_here"] is False
    assert (
        "is manylinux_2_28_aarch64, newer than torch 2.1.0's own manylinux_2_17_aarch64"
        in (cell["backend_reason"])
    )


def test_pip_is_given_every_tag_a_wheel_for_the_platform_may_carry() -> None:
    args = platform_args("manylinux_2_17_aarch64")
    assert args == ["--platform", "manylinux_2_17_aarch64", "--platform", "manylinux2014_aarch64"]
    wide = platform_args("manylinux_2_28_x86_64")[1::2]
    assert wide[0] == "manylinux_2_28_x86_64" and wide[-2:] == [
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    ]


# --------------------------------------------------------------------------- bad values

TABLE = """\
torch:
  "2.1.0":
    x86_64: ["3.8"]
    aarch64: ["3.8"]
  "2.8.0":
    x86_64: ["3.9"]
torch_glibc:
  default: "2.28"
  "2.1.0": {x86_64: "2.17", aarch64: "2.17"}
torch_cxx11_abi:
  default: true
  "2.1.0": false
torch_setuptools:
  "2.1.0": "<70"
"""

BAD = [
    (
        "abi-not-a-bool",
        ('"2.1.0": false', '"2.1.0": "no"'),
        12,
        "torch_cxx11_abi.2.1.0",
        "expected true (the C++11 string ABI) or false (the pre-C++11 one), got 'no'",
    ),
    (
        "abi-unknown-torch",
        ('"2.1.0": false', '"2.0.0": false'),
        12,
        "torch_cxx11_abi.2.0.0",
        "torch '2.0.0' is not in this table's 'torch' mapping",
    ),
    (
        "abi-unknown-machine",
        ('"2.1.0": false', '"2.1.0": {riscv64: false}'),
        12,
        "torch_cxx11_abi.2.1.0.riscv64",
        "unknown machine 'riscv64'",
    ),
    (
        "glibc-per-machine",
        ('aarch64: "2.17"}', "aarch64: 2.17}"),
        9,
        "torch_glibc.2.1.0.aarch64",
        'expected a quoted glibc version like "2.28", got 2.17',
    ),
    (
        "setuptools-not-a-specifier",
        ('"<70"', '"70"'),
        14,
        "torch_setuptools.2.1.0",
        "expected a quoted setuptools version specifier like \"<70\", got '70'",
    ),
    (
        "setuptools-unknown-torch",
        ('"2.1.0": "<70"', '"2.2.0": "<70"'),
        14,
        "torch_setuptools.2.2.0",
        "torch '2.2.0' is not in this table's 'torch' mapping",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_line_fact_names_file_line_key_and_what_was_expected(tmp_path: Path, case) -> None:
    _id, (old, new), line, key, fragment = case
    assert old in TABLE
    path = tmp_path / "support.yaml"
    path.write_text(TABLE.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_support(path, "support.yaml")
    assert info.value.message.startswith(f"support.yaml:{line}: {key}: "), info.value.message
    assert fragment in info.value.message, info.value.message


def test_a_bad_line_fact_stops_plan_with_exit_2(tmp_path: Path) -> None:
    support = tmp_path / "support.yaml"
    support.write_text(TABLE.replace('"2.1.0": false', '"2.1.0": 0', 1))
    cfg = write_config(
        tmp_path,
        f"""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.8"]
          torch: ["2.1.0"]
        """,
    )
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2, res.err
    assert "support.yaml:12: torch_cxx11_abi.2.1.0: expected true" in res.err
    assert "Traceback" not in res.err and res.out == ""


# --------------------------------------------------------------------------- applying them


def test_the_build_step_refuses_a_record_that_contradicts_the_installed_torch(
    tmp_path: Path,
) -> None:
    """The in-cell build checks torch's own string ABI against the cell's record before it
    compiles anything (this environment's torch 2.13 uses the C++11 ABI)."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "setup.py").write_text("from setuptools import setup\nsetup(name='x')\n")
    steps = REPO_ROOT / "builder" / "incell" / "steps.py"
    run = subprocess.run(
        [
            sys.executable,
            str(steps),
            "build-wheel",
            "--project",
            str(project),
            "--out",
            str(tmp_path / "out"),
            "--cxx11-abi",
            "0",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert (
        "built with _GLIBCXX_USE_CXX11_ABI=1, the cell's record says 0 (torch_cxx11_abi of "
        "the support table)"
    ) in run.stdout + run.stderr


HOOK_PROBE = r"""
import json, torch.utils.cpp_extension as ce
from setuptools import Extension
class Fake:
    extensions = [Extension("a", [], extra_compile_args={"cxx": ["-O2",
                  "-D_GLIBCXX_USE_CXX11_ABI=1"]}), Extension("b", [], extra_compile_args=[])]
try:
    ce.BuildExtension.build_extensions(Fake())
except Exception:
    pass  # the real build step has nothing to build; the flags are set before it runs
args = [e.extra_compile_args for e in Fake.extensions]
print(json.dumps([a["cxx"] if isinstance(a, dict) else a for a in args]))
"""


@pytest.mark.parametrize("abi", ["0", "1"])
def test_the_cross_hook_compiles_with_the_target_torchs_abi(tmp_path: Path, abi: str) -> None:
    import torch  # noqa: PLC0415 (torch is heavy: imported on use)

    hook = REPO_ROOT / "builder" / "cross" / "hook"
    env = {
        "PYTHONPATH": str(hook),
        "AMPFORGE_CROSS_TORCH_DIR": str(Path(torch.__file__).parent),
        "AMPFORGE_CROSS_CXX11_ABI": abi,
        "PATH": "/usr/bin:/bin",
    }
    run = subprocess.run(
        [sys.executable, "-c", HOOK_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    first, second = json.loads(run.stdout.strip().splitlines()[-1])
    define = f"-D_GLIBCXX_USE_CXX11_ABI={abi}"
    # The project's own define gives way to the target's; one without any gets it.
    assert [a for a in first if "CXX11_ABI" in a] == [define] and "-O2" in first
    assert [a for a in second if "CXX11_ABI" in a] == [define]


# --------------------------------------------------------------------------- a real old line

TORCH = "2.1.0"
TARGET_PY = "3.9"  # bullseye's arm64 CPython; the builder's own interpreter is the host's


@pytest.fixture(scope="module")
def line_target():
    table = load_support(SUPPORT, "configs/support.yaml")
    plat = table.torch_plat(TORCH, "aarch64")
    python = ensure_target_python(TARGET_PY, "aarch64")
    torch = ensure_target_torch(TORCH, python, platform=plat)
    return table, plat, python, torch, find_toolchain("aarch64")


def _tiny_build(tmp_path: Path, line_target, abi: bool):
    # Another test module, imported only by the slow tests that build with it.
    from test_cross import _make_tiny_project  # noqa: PLC0415

    table, _plat, python, torch, toolchain = line_target
    project = _make_tiny_project(tmp_path / "proj")
    # One call into torch with std::string in its symbol (c10::Device::str() returns one: its
    # name carries [abi:cxx11] under the C++11 ABI), which is where the two ABIs part.
    ext = project / "tinyext" / "ext.cpp"
    ext.write_text(
        ext.read_text().replace(
            'm.def("omp_threads", &omp_threads);',
            'm.def("omp_threads", &omp_threads);\n'
            '  m.def("device", [](torch::Tensor t) { return t.device().str(); });',
        )
    )
    built = cross_build_wheel(
        project,
        tmp_path / "raw",
        python,
        torch,
        toolchain,
        host_python=sys.executable,
        cxx11_abi=abi,
        cxx_floor=needs_cxx_floor(str(table.glibc(TORCH, "aarch64").value)),
    )
    repaired = repair_cross_wheel(
        built.wheel, tmp_path / "repaired", [*toolchain.lib_dirs, *python.lib_dirs]
    )
    return repaired


LINE_CHECK = r"""
import json, platform, torch, tinyext._C as ext
x = torch.linspace(-3, 3, 100003)
out = ext.axpy(-1.5, x, torch.cos(x))
try:  # a c10::Error through pybind11's translation: copies a std::exception_ptr
    ext.axpy(1.0, torch.ones(3, dtype=torch.int64), x)
    raised = ""
except RuntimeError as exc:
    raised = str(exc).splitlines()[0]
print("LINE " + json.dumps({"machine": platform.machine(), "torch": torch.__version__,
      "diff": float((out - (-1.5 * x + torch.cos(x))).abs().max()), "raised": raised,
      "device": ext.device(x)}))
"""


@pytest.mark.slow
def test_tiny_extension_against_aarch64_torch_2_1_runs_under_qemu_with_the_tables_facts(
    tmp_path: Path, line_target
) -> None:
    table, plat, python, torch, _toolchain = line_target
    abi = bool(table.abi(TORCH, "aarch64").value)
    assert abi is False and wheel_cxx11_abi(torch.torch_dir) is False  # table == the wheel
    assert plat == "manylinux_2_17_aarch64"
    repaired = _tiny_build(tmp_path, line_target, abi)
    # Built with GCC 12 and the C++ floor header: within manylinux2014's C++ runtime.
    needs = check_needs_within(repaired.wheel, plat, "torch 2.1.0's own tag")
    summary = need_summary(needs)
    assert tuple(int(x) for x in summary["GLIBCXX"].split(".")) <= (3, 4, 19), summary
    assert tag_glibc(repaired.tag) == ((2, 17), "aarch64"), repaired.wheel.name
    result = run_wheel_under_qemu(repaired.wheel, python, torch, LINE_CHECK)
    line = next(x for x in result.stdout.splitlines() if x.startswith("LINE "))
    got = json.loads(line[5:])
    assert got["machine"] == "aarch64" and got["torch"].startswith("2.1.0")
    assert got["diff"] < 1e-5 and got["device"] == "cpu"
    assert "expected scalar type Float but found Long" in got["raised"]


@pytest.mark.slow
def test_the_other_string_abi_fails_to_import_against_torch_2_1(
    tmp_path: Path, line_target
) -> None:
    """What the fact prevents: the host torch's own choice (2.13: the C++11 ABI) links, and the
    module then cannot be imported against the pre-C++11 torch."""
    _table, _plat, python, torch, _toolchain = line_target
    repaired = _tiny_build(tmp_path, line_target, abi=True)
    with pytest.raises(StepFailed) as info:
        run_wheel_under_qemu(repaired.wheel, python, torch, LINE_CHECK)
    assert "undefined symbol" in info.value.message, info.value.message
