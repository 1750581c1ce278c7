"""torch <-> torch-npu (issue 16): the ``torch_npu`` table of the support file, validated on load;
the pin per cell (``plan``, the resolved record); and the ``npu`` extra the version-label rewrite
writes into every cell's wheel, checked for each cell of the default matrix against the YAML read
independently (npulib). A real built wheel's METADATA is checked where the e2e tests build one
(test_wheel_e2e.py, test_pipeline_arm.py): no extra cold build here.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers.builder_testlib import run_cli, write_config
from helpers.npulib import SUPPORT, assert_npu_extra, expected_torch_npu, npu_fields, wheel_metadata
from packaging.requirements import Requirement
from packaging.version import Version

from builder.backends import registry
from builder.backends.base import CellJob, Host, PipelineOptions, Steps
from builder.config import CliOverrides, load_settings
from builder.config.support import load_support
from builder.engines.base import OutputLog
from builder.errors import ConfigError
from builder.pipeline_types import CellResult
from builder.plan.resolve import resolve
from builder.plan.resolved import ResolvedCell
from builder.redact import Redactor
from builder.wheel.localversion import add_local_version
from builder.wheel.npuextra import add_npu_extra
from builder.wheel.wheelmeta import requires_dist, target_requirements

# A small support table; the error cases edit it. Line numbers are relative to this text.
TABLE = """\
torch:
  "2.8.0":
    x86_64: ["3.9", "3.10"]
    aarch64: ["3.9"]
  "2.9.1":
    x86_64: ["3.10", "3.11"]
torch_npu:
  "2.8.0":
    release: "2.8.0.post5"
    x86_64: ["3.9"]
    aarch64: ["3.9"]
  "2.9.1": null
"""


def _table(tmp_path: Path, text: str = TABLE):
    path = tmp_path / "support.yaml"
    path.write_text(text)
    return load_support(path, "support.yaml")


# --------------------------------------------------------------------------- the table


def test_pin_is_the_release_with_a_wheel_for_the_cells_python_else_none_with_why(
    tmp_path: Path,
) -> None:
    table = _table(tmp_path)
    pin = table.npu_pin("2.8.0", "3.9", "aarch64")
    assert pin.release == "2.8.0.post5"
    assert pin.reason == (
        "the newest final torch-npu release for torch 2.8.0, with a cp39 wheel "
        "for aarch64 (per support.yaml)"
    )
    # The release has no cp310 wheel: `pip install pkg[npu]` could not install it -> no extra.
    missing = table.npu_pin("2.8.0", "3.10", "x86_64")
    assert missing.release is None
    assert missing.reason == (
        "torch-npu 2.8.0.post5 (for torch 2.8.0) publishes no cp310 wheel "
        "for x86_64 (per support.yaml)"
    )
    none = table.npu_pin("2.9.1", "3.10", "x86_64")
    assert none.release is None
    assert none.reason == "no torch-npu release requires torch 2.9.1 (per support.yaml)"
    # A support file without the table (e.g. a user's own) pins nothing, and says so.
    bare = _table(tmp_path, TABLE.split("torch_npu:")[0])
    assert bare.torch_npu is None
    assert bare.npu_pin("2.8.0", "3.9", "x86_64").reason == "support.yaml has no torch_npu table"


def test_the_repositorys_table_loads_and_follows_torch_npus_version_scheme() -> None:
    """Every pin of configs/support.yaml is a final release (``.postN`` allowed) for exactly its
    torch, every torch of the table has an entry, and the loader agrees with the raw YAML."""
    raw = yaml.safe_load(SUPPORT.read_text())
    table = load_support(SUPPORT, "configs/support.yaml")
    assert table.torch_npu is not None and set(table.torch_npu) == set(raw["torch"])
    pinned = 0
    for torch, entry in raw["torch_npu"].items():
        loaded = table.torch_npu[torch]
        if entry is None:
            assert loaded is None
            continue
        pinned += 1
        version = Version(entry["release"])
        assert version.base_version == torch and not version.is_prerelease
        assert loaded is not None and loaded.release == entry["release"]
        for machine in ("x86_64", "aarch64"):
            for python in raw["torch"][torch].get(machine, []):
                assert table.npu_pin(torch, python, machine).release == expected_torch_npu(
                    torch, python, machine
                )
    assert pinned, "the table pins no torch-npu release at all"


def _edit(old: str, new: str) -> str:
    assert old in TABLE
    return TABLE.replace(old, new)


# (case id, support text, line, key, expected fragment of the message)
BAD = [
    (
        "not-a-mapping",
        TABLE.split("torch_npu:")[0] + "torch_npu: [2.8.0]\n",
        7,
        "torch_npu",
        "expected a mapping of torch -> {release: ..., <machine>: [python, ...]} or null",
    ),
    (
        "unknown-torch",
        TABLE + '  "2.7.1": null\n',
        13,
        "torch_npu.2.7.1",
        "torch '2.7.1' is not in this table's 'torch' mapping; expected one of 2.8.0, 2.9.1",
    ),
    (
        "missing-torch",
        _edit('  "2.9.1": null\n', ""),
        7,
        "torch_npu",
        "no entry for torch 2.9.1; expected each torch of the 'torch' mapping with its torch-npu "
        "release, or null when none requires it",
    ),
    (
        "release-unquoted",
        _edit('release: "2.8.0.post5"', "release: 2.8"),
        9,
        "torch_npu.2.8.0.release",
        "expected a quoted torch-npu release for torch 2.8.0 (2.8.0 or 2.8.0.postN), got 2.8",
    ),
    (
        "release-not-a-version",
        _edit('"2.8.0.post5"', '"newest"'),
        9,
        "torch_npu.2.8.0.release",
        "'newest' is not a PEP 440 version; expected a quoted torch-npu release for torch 2.8.0",
    ),
    (
        "release-pre",
        _edit('"2.8.0.post5"', '"2.8.0rc1"'),
        9,
        "torch_npu.2.8.0.release",
        "'2.8.0rc1' is a pre-release or carries an epoch/local label; expected a quoted torch-npu "
        "release for torch 2.8.0 (2.8.0 or 2.8.0.postN): the pin is the newest final release",
    ),
    (
        "release-other-torch",
        _edit('"2.8.0.post5"', '"2.9.0.post9"'),
        9,
        "torch_npu.2.8.0.release",
        "torch-npu 2.9.0.post9 is for torch 2.9.0, not 2.8.0",
    ),
    (
        "no-release",
        _edit('    release: "2.8.0.post5"\n', ""),
        8,
        "torch_npu.2.8.0",
        "expected null or a mapping with 'release' and machines from x86_64, aarch64",
    ),
    (
        "unknown-machine",
        _edit('    aarch64: ["3.9"]\n  "2.9.1": null', '    riscv64: ["3.9"]\n  "2.9.1": null'),
        8,
        "torch_npu.2.8.0",
        "expected null or a mapping with 'release' and machines from x86_64, aarch64",
    ),
    (
        "python-unquoted",
        _edit('    x86_64: ["3.9"]\n    aarch64', "    x86_64: [3.10]\n    aarch64"),
        10,
        "torch_npu.2.8.0.x86_64[0]",
        'expected a quoted Python version like "3.10", got 3.1',
    ),
    (
        "unknown-top-key",
        TABLE + "torchnpu: {}\n",
        1,
        None,
        "expected a mapping with the key 'torch' (and optionally 'cross_host_torch', 'cuda', "
        "'cuda_builds', 'torch_cxx11_abi', 'torch_glibc', 'torch_npu', 'torch_setuptools', "
        "'unsupported')",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_a_bad_torch_npu_table_names_file_line_key_and_what_was_expected(
    tmp_path: Path, case
) -> None:
    _id, text, line, key, fragment = case
    with pytest.raises(ConfigError) as info:
        _table(tmp_path, text)
    where = f"support.yaml:{line}: " + (f"{key}: " if key else "")
    assert info.value.message.startswith(where), info.value.message
    assert fragment in info.value.message, info.value.message


def test_a_bad_table_stops_plan_with_exit_2_before_anything_runs(tmp_path: Path) -> None:
    support = tmp_path / "support.yaml"
    support.write_text(_edit('"2.8.0.post5"', '"2.8.0rc1"'))
    cfg = write_config(
        tmp_path,
        f"""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.9"]
          torch: ["2.8.0"]
        """,
    )
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2, res.err
    assert f"{support.name}:9: torch_npu.2.8.0.release: '2.8.0rc1' is a pre-release" in res.err
    assert "Traceback" not in res.err and res.out == ""


# --------------------------------------------------------------------------- the metadata


METADATA = textwrap.dedent("""\
    Metadata-Version: 2.4
    Name: demo
    Version: 1.0
    Requires-Dist: torch>=2.1
    Provides-Extra: builder
    Requires-Dist: docker>=7.1; extra == "builder"
    Description-Content-Type: text/markdown

    # demo
    Requires-Dist: torch-npu==0.0; extra == "npu"
    """)


def test_extra_is_added_once_after_the_dependencies_and_the_body_is_left_alone() -> None:
    out = add_npu_extra(METADATA, "2.13.0")
    head, body = out.split("\n\n", 1)
    assert head.splitlines()[5:9] == [
        'Requires-Dist: docker>=7.1; extra == "builder"',
        "Provides-Extra: npu",
        'Requires-Dist: torch-npu==2.13.0; extra == "npu"',
        "Description-Content-Type: text/markdown",
    ]
    assert body == METADATA.split("\n\n", 1)[1]  # the description's look-alike line untouched
    assert_npu_extra(out, "2.13.0")
    assert add_npu_extra(out, "2.13.0") == out  # a second rewrite changes nothing


def test_a_torch_npu_the_project_declared_gets_the_same_pin_with_its_marker() -> None:
    declared = METADATA.replace(
        "Provides-Extra: builder\n",
        'Provides-Extra: npu\nRequires-Dist: torch_npu>=2.1; extra == "npu"\n'
        'Requires-Dist: torch-npu; platform_machine == "aarch64"\n',
    )
    out = add_npu_extra(declared, "2.9.1")
    extras, reqs = npu_fields(out)
    assert extras.count("npu") == 1
    assert reqs == [
        'torch-npu==2.9.1; extra == "npu"',
        'torch-npu==2.9.1; platform_machine == "aarch64"',
    ]


def test_metadata_without_a_body_or_dependencies_gets_the_extra_in_its_header() -> None:
    out = add_npu_extra("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n", "2.8.0.post5")
    assert out == (
        "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nProvides-Extra: npu\n"
        'Requires-Dist: torch-npu==2.8.0.post5; extra == "npu"\n'
    )
    assert_npu_extra(out, "2.8.0.post5")


def _wheel(tmp_path: Path, version: str, metadata: str) -> Path:
    """A wheel as a build makes one: a RECORD listing every member with its sha256 (the label
    step refuses one that does not, as any wheel from a project's build)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    w = tmp_path / f"demo-{version}-cp311-cp311-linux_x86_64.whl"
    info = f"demo-{version}.dist-info"
    members = {
        "demo/__init__.py": b"x = 1\n",
        f"{info}/METADATA": metadata.replace("Version: 1.0", f"Version: {version}").encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n",
    }
    rows = [f"{name},sha256={_b64_digest(data)},{len(data)}" for name, data in members.items()]
    members[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(w, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return w


def _b64_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_the_label_step_writes_the_extra_and_a_labelled_wheel_is_rewritten_only_once(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    labelled = add_local_version(
        _wheel(tmp_path / "a", "1.0", METADATA), "torch2.13", out, torch_npu="2.13.0"
    )
    meta = wheel_metadata(labelled)
    assert_npu_extra(meta, "2.13.0")
    assert "Requires-Dist: torch==2.13.*" in meta
    with zipfile.ZipFile(labelled) as zf:
        record = zf.read("demo-1.0+torch2.13.dist-info/RECORD").decode()
    assert "demo-1.0+torch2.13.dist-info/METADATA,sha256=" in record
    assert add_local_version(labelled, "torch2.13", out, torch_npu="2.13.0") == labelled
    # A project that put the label in its version itself (the cross path): still gets the extra.
    own = _wheel(tmp_path / "b", "1.0+torch2.13", METADATA.replace("torch>=2.1", "torch==2.13.*"))
    rewritten = add_local_version(own, "torch2.13", out, torch_npu="2.13.0")
    assert rewritten != own
    assert_npu_extra(wheel_metadata(rewritten), "2.13.0")
    # No torch-npu for the cell: no extra, and an already labelled wheel is left as it is.
    assert add_local_version(own, "torch2.13", out, torch_npu=None) == own
    # Requirements on the target (offline bundles, cross site-packages, verification) never
    # include the extra: torch-npu needs CANN and is not installed to verify a wheel.
    assert all(
        not r.startswith("torch-npu") for r in target_requirements(labelled, "x86_64", "3.11")
    )


def test_a_metadata_without_description_keeps_pin_and_extra_in_its_header(tmp_path: Path) -> None:
    """setuptools writes no body for a project without a long description (the METADATA ends in
    one newline): the torch pin and the extra must still be header fields pip reads."""
    bare = "Metadata-Version: 2.4\nName: demo\nVersion: 1.0\n"
    labelled = add_local_version(
        _wheel(tmp_path, "1.0", bare), "torch2.13", tmp_path, torch_npu="2.13.0"
    )
    assert requires_dist(labelled) == ["torch==2.13.*", 'torch-npu==2.13.0; extra == "npu"']
    assert_npu_extra(wheel_metadata(labelled), "2.13.0")


# ------------------------------------------------------------- every cell of the default matrix


def _default_resolution(tmp_path: Path) -> tuple[ResolvedCell, ...]:
    settings = load_settings(CliOverrides(), {})
    return resolve(
        settings, Host(Redactor()), registry(), out=tmp_path / "dist", everything=True
    ).cells


def _job(resolved: ResolvedCell, tmp_path: Path) -> CellJob:
    """The CellJob the pipeline gives a backend, as far as its label step reads it."""
    settings = load_settings(CliOverrides(), {})
    return CellJob(
        resolved=resolved,
        config=settings.config,
        opts=PipelineOptions(project=tmp_path, out=tmp_path / "dist", work=tmp_path / "work"),
        log=OutputLog(),
        log_path=tmp_path / "log",
        stage=tmp_path / "stage",
        steps=Steps(CellResult(cell=resolved.identifier), lambda cell, step: None),
        run_id="run-1",
        engine=None,
    )


def test_every_default_cell_plans_and_writes_the_pin_the_table_gives(tmp_path: Path) -> None:
    """For each cell of the default matrix (configs/matrix.yaml, as `plan` expands it): the
    record's torch_npu is the release configs/support.yaml gives for its torch, Python and
    machine; the label step every backend runs (CellJob.label) writes exactly that extra into
    this project's own METADATA; and the extra can be installed next to the wheel's torch pin
    (torch-npu X.Y.Z[.postN] is built for torch X.Y.Z, which the pin ``torch==X.Y.*`` admits)."""
    meta = importlib.metadata.distribution("ampforge").read_text("METADATA")
    assert meta and "Name: ampforge" in meta
    raw = _wheel(
        tmp_path / "raw",
        "1.0",
        meta.replace("Version: " + importlib.metadata.version("ampforge"), "Version: 1.0").replace(
            "Name: ampforge", "Name: demo"
        ),
    )
    cells = _default_resolution(tmp_path)
    assert len(cells) == 26
    planned = {c["id"]: c for c in json.loads(run_cli("plan", "--format", "json").out)["cells"]}
    assert set(planned) == {c.identifier for c in cells}
    for resolved in cells:
        c = resolved.cell
        want = expected_torch_npu(c.torch, c.python, c.machine)
        assert resolved.torch_npu == want, c.identifier
        assert planned[c.identifier]["torch_npu"] == want, c.identifier
        assert planned[c.identifier]["torch_npu_reason"] == resolved.torch_npu_reason
        out = tmp_path / "labelled" / c.identifier
        out.mkdir(parents=True)
        labelled = _job(resolved, tmp_path).label(raw, out)
        written = wheel_metadata(labelled)
        # A stable-ABI wheel serves torch >= 2.10: the extra is that range, and pip pairs a
        # torch-npu with the torch it installs (test_stable_wheel_npu_extra_pairs_by_resolver).
        assert_npu_extra(written, want, ">=2.10" if resolved.stable else None)
        if want is not None:
            torch_pin = next(
                Requirement(r) for r in _requires(written) if Requirement(r).name == "torch"
            )
            assert Version(want).base_version == c.torch
            assert torch_pin.specifier.contains(c.torch), (torch_pin, want)


def _requires(metadata: str) -> list[str]:
    return [
        ln.split(":", 1)[1].strip()
        for ln in metadata.split("\n\n")[0].splitlines()
        if ln.startswith("Requires-Dist:")
    ]


def test_plan_shows_none_for_a_cell_whose_torch_npu_has_no_wheel(tmp_path: Path) -> None:
    """torch-npu 2.9.1 publishes no cp314 wheel; no torch-npu requires torch 2.12.1 (per the
    table): both cells build, without an `npu` extra, and every format says so."""
    for torch, python in (("2.9.1", "3.14"), ("2.12.1", "3.11")):
        assert expected_torch_npu(torch, python, "x86_64") is None  # what the test relies on
    cfg = write_config(
        tmp_path,
        f"""\
        support: {SUPPORT}
        matrix:
          arch: [X86]
          python: ["3.11", "3.14"]
          torch: ["2.9.1", "2.12.1"]
        """,
    )
    res = run_cli("plan", "--config", str(cfg), "--format", "json")
    assert res.rc == 0, res.err
    records = {c["id"]: c for c in json.loads(res.out)["cells"]}
    assert records["cp311-manylinux_x86_64-torch2.9.1"]["torch_npu"] == "2.9.1"
    gone = records["cp314-manylinux_x86_64-torch2.9.1"]
    assert gone["torch_npu"] is None
    assert gone["torch_npu_reason"] == (
        "torch-npu 2.9.1 (for torch 2.9.1) publishes no cp314 "
        "wheel for x86_64 (per configs/support.yaml)"
    )
    assert records["cp311-manylinux_x86_64-torch2.12.1"]["torch_npu"] is None
    table = run_cli("plan", "--config", str(cfg))
    rows = {ln.split()[0]: ln.split() for ln in table.out.splitlines() if ln.startswith("cp3")}
    header = next(ln for ln in table.out.splitlines() if ln.startswith("CELL")).split()
    assert header[:3] == ["CELL", "TORCH", "TORCH-NPU"]
    assert rows["cp314-manylinux_x86_64-torch2.9.1"][2] == "none"
    assert rows["cp311-manylinux_x86_64-torch2.9.1"][2] == "2.9.1"
    jobs = json.loads(run_cli("plan", "--config", str(cfg), "--format", "github").out)["include"]
    assert {j["cell"]: j["torch_npu"] for j in jobs} == {
        i: r["torch_npu"] for i, r in records.items()
    }


# ------------------------------------------------------------- other people's METADATA is theirs


@pytest.mark.promise(
    promise="the npu extra is written only into the wheels of a project that asks for it "
    "([tool.ampforge] npu-extra = true); another project's METADATA gets no torch-npu",
    fault="a third-party project without the key, the same with npu-extra = true, and with "
    'npu-extra = "yes"',
    result="plan's torch_npu is none with the reason, and no extra is written; with the key "
    "the table's pin; a non-boolean exits 2 naming tool.ampforge.npu-extra",
)
@pytest.mark.parametrize("asks", [None, True, "yes"])
def test_the_npu_extra_is_written_only_where_the_project_asks(tmp_path: Path, asks: object) -> None:
    project = tmp_path / "other"
    project.mkdir()
    table = "" if asks is None else f"\n[tool.ampforge]\nnpu-extra = {json.dumps(asks)}\n"
    (project / "pyproject.toml").write_text('[project]\nname = "other"\nversion = "1.0"\n' + table)
    r = run_cli(
        "plan",
        "--format",
        "json",
        "--project",
        str(project),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
    )
    if asks == "yes":
        assert r.rc == 2, r.err
        assert "tool.ampforge.npu-extra" in r.err and "expected true" in r.err, r.err
        return
    assert r.rc == 0, r.err
    (record,) = json.loads(r.out)["cells"]
    want = expected_torch_npu("2.13.0", "3.11", "x86_64") if asks else None
    assert record["torch_npu"] == want
    if not asks:
        assert "does not ask for it" in record["torch_npu_reason"]
    resolution = resolve(
        load_settings(CliOverrides(arch="X86", python="3.11", torch="2.13.0"), env={}),
        Host(Redactor()),
        registry(),
        out=tmp_path / "dist",
        project=project,
    )
    (resolved,) = resolution.cells
    out = tmp_path / "labelled"
    out.mkdir()
    labelled = _job(resolved, tmp_path).label(_wheel(tmp_path / "raw", "1.0", METADATA), out)
    _, reqs = npu_fields(wheel_metadata(labelled))
    assert reqs == ([f'torch-npu=={want}; extra == "npu"'] if asks else [])
